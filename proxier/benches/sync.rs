//! Planning and syncing cost at cluster scale (issue 3, "Benchmarks"), through the code the
//! binary runs: the Store, the engine's Planner and its Syncer ([`Syncer::sync`] and
//! [`Syncer::sync_touched`]: observe, diff, apply, cache and drain bookkeeping) on the in-memory
//! [`FakeDataplane`] instead of the kernel. A full plan + sync of N Services into an empty
//! table, and one endpoint change (store → re-plan → incremental sync), for N = 1k, 10k and 50k
//! Services (10 endpoints each, 2 ports, mixed ClusterIP / NodePort / LoadBalancer). Not
//! included: the engine's metrics and status steps. The kernel side (netlink round trips) is
//! measured in the VM (`hack/bench-vm.sh`).
//!
//! Run: `cargo bench -p kipvs-proxier --bench sync`. Peak memory (VmHWM) after building each
//! size is printed before the timings.
//!
//! The `nftables` group (issue 7) measures one sync's nftables transaction against the real
//! kernel's nf_tables through `nft`, in a private network namespace (root and the `nft`
//! executable needed; skipped otherwise): the whole table for N Services into an empty kernel,
//! and the transaction of one Service added or removed at N Services (plan + diff + JSON +
//! `nft`). The rule count at each N is printed: it does not grow with N.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use kipvs_proxier::dataplane::diff::{Ownership, diff, diff_scoped};
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::dataplane::nft_transaction;
use kipvs_proxier::dataplane::nftables::codec::transaction;
use kipvs_proxier::dataplane::nftables::rules::rule_comments;
use kipvs_proxier::dataplane::nftables::runner::Nft;
use kipvs_proxier::engine::planner::Replanned;
use kipvs_proxier::engine::syncer::Syncer;
use kipvs_proxier::model::ObservedState;
use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::Duration;

/// `ipvs.drainTimeout`'s default; no real server drains in these benchmarks.
const MAX_DRAIN: Duration = Duration::from_secs(900);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The binary's syncer over an empty in-memory dataplane.
fn syncer() -> Syncer<FakeDataplane> {
    Syncer::new(FakeDataplane::default(), Ownership::default(), MAX_DRAIN)
}

/// The allocator the `kipvs-proxier` binary uses (planning allocates many small maps).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../examples/scale/cluster.rs"]
mod cluster;
use cluster::{planner, service, slice, store};

const SIZES: [usize; 3] = [1_000, 10_000, 50_000];

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn full(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("full plan+sync");
    group.sample_size(10);
    for n in SIZES {
        let base = peak_rss_kib();
        let mut s = store(n);
        let mut p = planner();
        p.replan(&mut s);
        let vs = p.desired().virtual_servers.len();
        println!(
            "{n} Services: {vs} virtual servers; peak RSS {} MiB (+{} MiB for store and plan)",
            peak_rss_kib() / 1024,
            peak_rss_kib().saturating_sub(base) / 1024
        );
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter_batched(
                || (planner(), syncer()),
                |(mut p, mut syncer)| {
                    s.mark_all_dirty();
                    p.replan(&mut s);
                    let report = rt.block_on(syncer.sync(p.desired())).unwrap();
                    assert!(report.failures.is_empty());
                    black_box(report.ops.len())
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn incremental(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("one endpoint change");
    for n in SIZES {
        let mut s = store(n);
        let mut p = planner();
        p.replan(&mut s);
        let mut syncer = syncer();
        rt.block_on(syncer.sync(p.desired())).unwrap();
        let mut ready = true;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                ready = !ready;
                s.upsert_slice(slice(n / 2, ready));
                let Replanned::Touched(t) = p.replan(&mut s) else {
                    panic!("an endpoint change must not re-plan everything")
                };
                let report = rt.block_on(syncer.sync_touched(p.desired(), &t)).unwrap();
                assert!(!report.ops.is_empty() && report.failures.is_empty());
                black_box(report.ops.len())
            })
        });
    }
    group.finish();
}

fn nftables(c: &mut Criterion) {
    // SAFETY: unshare only changes this thread's namespace membership; `nft` inherits it.
    let netns = unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0;
    let nft_ok = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(netns && nft_ok) {
        eprintln!("nftables: skipped (needs root for a private netns and the nft executable)");
        return;
    }
    let rt = runtime();
    let nft = Nft::default();
    let mut group = c.benchmark_group("nftables transaction");
    group.sample_size(10);
    for n in [1_000, 10_000] {
        let mut s = store(n);
        let mut p = planner();
        p.replan(&mut s);
        let empty = ObservedState::default();
        let ownership = Ownership::default();
        let all = diff(p.desired(), &empty, &ownership);
        let rules = rule_comments(&p.desired().nft_rules).len();
        let elements = p.desired().set_elements.len();
        println!("nftables: {n} Services: {rules} rules, {elements} set elements");
        group.bench_with_input(BenchmarkId::new("whole table", n), &n, |b, _| {
            b.iter_batched(
                || rt.block_on(nft.delete_table()).unwrap(),
                |()| rt.block_on(nft.apply(&transaction(&nft_transaction(&all)))),
                BatchSize::PerIteration,
            )
        });
        rt.block_on(nft.apply(&transaction(&nft_transaction(&all))))
            .unwrap();
        let mut kernel = ObservedState::from(p.desired());
        let mut present = false;
        group.bench_with_input(
            BenchmarkId::new("one Service added or removed", n),
            &n,
            |b, _| {
                b.iter(|| {
                    present = !present;
                    if present {
                        s.upsert_service(service(n));
                    } else {
                        let meta = service(n).metadata;
                        s.delete_service(&(meta.namespace.unwrap(), meta.name.unwrap()));
                    }
                    let Replanned::Touched(t) = p.replan(&mut s) else {
                        panic!("one Service must not re-plan everything")
                    };
                    let ops = diff_scoped(p.desired(), &kernel, &ownership, &t, &BTreeSet::new());
                    let tx = nft_transaction(&ops);
                    assert!(!tx.add.is_empty() || !tx.delete.is_empty());
                    rt.block_on(nft.apply(&transaction(&tx))).unwrap();
                    for op in &ops {
                        kernel.apply(op).unwrap();
                    }
                })
            },
        );
        let observed = rt.block_on(nft.observe()).unwrap();
        assert_eq!(
            observed.elements, kernel.set_elements,
            "kernel table drifted"
        );
        assert_eq!(observed.rule_comments.len(), rules);
        rt.block_on(nft.delete_table()).unwrap();
    }
    group.finish();
}

criterion_group!(benches, full, incremental, nftables);
criterion_main!(benches);
