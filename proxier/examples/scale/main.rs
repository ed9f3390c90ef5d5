//! Full plan + sync at cluster scale, in one process per run, for `hack/bench-engine.sh`,
//! which runs this same file on the baseline commit and on the current tree and prints both
//! side by side.
//!
//! `cargo run --release -p kipvs-proxier --example scale -- SERVICES ROUNDS` builds the
//! store of the synthetic cluster (`cluster.rs`, the one `benches/sync.rs` uses), then plans
//! every Service with the engine's [`Planner`] and syncs the result into an empty
//! [`FakeDataplane`] with the binary's [`Syncer`] (observe, diff, apply, cache), ROUNDS times
//! with a fresh planner and syncer each round. It prints one `figure value unit` line each:
//! the store build, the peak RSS holding the store, the first plan, the peak RSS after holding and planning (`VmHWM`, before
//! any sync), the first sync, the peak RSS after it, and the median of the rounds' plan, diff
//! (every op of the table against an empty kernel: [`diff`]), plan + diff (issue 12's "full
//! plan + diff"), sync and plan + sync.

use kipvs_proxier::dataplane::diff::{Ownership, diff};
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::engine::syncer::Syncer;
use kipvs_proxier::model::ObservedState;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[path = "cluster.rs"]
mod cluster;

/// The allocator the `kipvs-proxier` binary uses, counting the bytes it holds.
#[global_allocator]
static GLOBAL: Counting = Counting(mimalloc::MiMalloc);

/// Bytes allocated and not yet freed, and their peak since the last [`reset_peak`].
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// A global allocator that counts the bytes live through `inner` (requested sizes: the
/// allocator's own rounding and free pages are what RSS adds on top).
struct Counting(mimalloc::MiMalloc);

// SAFETY: every call is forwarded to `mimalloc` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(live, Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on unchanged.
        unsafe { self.0.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: `ptr` was allocated by `alloc`/`realloc` above, i.e. by mimalloc, with `layout`.
        unsafe { self.0.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Relaxed) + new_size - layout.size();
            PEAK.fetch_max(live, Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Relaxed);
        }
        // SAFETY: as for `dealloc`; the caller's contract on `new_size` is passed on unchanged.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// Live heap bytes, in MiB.
fn heap_mib() -> f64 {
    LIVE.load(Relaxed) as f64 / (1 << 20) as f64
}

/// Peak live heap bytes since the last call, in MiB.
fn take_peak_heap_mib() -> f64 {
    let peak = PEAK.swap(LIVE.load(Relaxed), Relaxed);
    peak as f64 / (1 << 20) as f64
}

/// The heap bytes `make` allocates and keeps (in MiB), and its result.
fn heap_of<T>(make: impl FnOnce() -> T) -> (f64, T) {
    let before = heap_mib();
    let value = make();
    (heap_mib() - before, value)
}

/// The process's peak resident set (`VmHWM`), in MiB.
fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median of `values` (0 for none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// With `SCALE_BREAKDOWN` set: the heap each part of the desired state holds (measured on a
/// copy of it), on stderr.
fn breakdown(desired: &kipvs_proxier::model::DesiredState) {
    let (all, copy) = heap_of(|| desired.clone());
    drop(copy);
    let (vs, copy) = heap_of(|| desired.virtual_servers.clone());
    drop(copy);
    let (real, copy) = heap_of(|| {
        let v: Vec<_> = desired
            .virtual_servers
            .values()
            .map(|vs| vs.real_servers.clone())
            .collect();
        v
    });
    let vector = (copy.capacity() * size_of_val(&copy[0])) as f64 / (1 << 20) as f64;
    drop(copy);
    let (elements, copy) = heap_of(|| desired.set_elements.clone());
    drop(copy);
    let (addresses, copy) = heap_of(|| desired.bind_addresses.clone());
    drop(copy);
    eprintln!(
        "desired state {all:.1} MiB: virtual servers {vs:.1} (of which real-server maps {:.1}), \
         set elements {elements:.1} ({} of them), bind addresses {addresses:.1}",
        real - vector,
        desired.set_elements.len()
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(50_000, |a| a.parse().expect("SERVICES"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let syncer = || {
        Syncer::new(
            FakeDataplane::default(),
            Ownership::default(),
            Duration::from_secs(900),
        )
    };

    let at = Instant::now();
    let mut store = cluster::store(n);
    println!("store_build {:.1} ms", ms(at.elapsed()));
    println!("peak_rss_store {} MiB", peak_rss_mib());
    println!("heap_store {:.0} MiB", heap_mib());
    take_peak_heap_mib();
    let at = Instant::now();
    let mut planner = cluster::planner();
    planner.replan(&mut store);
    println!("first_plan {:.1} ms", ms(at.elapsed()));
    println!(
        "virtual_servers {} count",
        planner.desired().virtual_servers.len()
    );
    println!("peak_rss_planned {} MiB", peak_rss_mib());
    println!("heap_planned {:.0} MiB", heap_mib());
    println!("peak_heap_planning {:.0} MiB", take_peak_heap_mib());
    if std::env::var_os("SCALE_BREAKDOWN").is_some() {
        breakdown(planner.desired());
    }
    let at = Instant::now();
    let mut first = syncer();
    let report = rt.block_on(first.sync(planner.desired())).expect("sync");
    assert!(report.failures.is_empty());
    println!("first_sync {:.1} ms", ms(at.elapsed()));
    println!("peak_rss_synced {} MiB", peak_rss_mib());
    println!("heap_synced {:.0} MiB", heap_mib());
    println!("peak_heap_syncing {:.0} MiB", take_peak_heap_mib());
    if std::env::var_os("SCALE_BREAKDOWN").is_some() {
        let (fake, state) = heap_of(|| first.dataplane().state.clone());
        eprintln!("  the fake dataplane's table (a copy of it): {fake:.1} MiB");
        drop(state);
    }
    drop((first, planner));

    let (mut plans, mut diffs, mut plan_diffs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut syncs, mut totals) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (mut planner, mut syncer) = (cluster::planner(), syncer());
        let at = Instant::now();
        store.mark_all_dirty();
        planner.replan(&mut store);
        let planned = at.elapsed();
        // The "full plan + diff": every op of the table against an empty kernel.
        let at = Instant::now();
        let ops = diff(
            planner.desired(),
            &ObservedState::default(),
            &Ownership::default(),
        );
        let diffed = at.elapsed();
        assert!(!std::hint::black_box(&ops).is_empty());
        drop(ops);
        let at = Instant::now();
        let report = rt.block_on(syncer.sync(planner.desired())).expect("sync");
        assert!(report.failures.is_empty());
        let synced = at.elapsed();
        plans.push(ms(planned));
        diffs.push(ms(diffed));
        plan_diffs.push(ms(planned + diffed));
        syncs.push(ms(synced));
        totals.push(ms(planned + synced));
    }
    println!("plan {:.1} ms", median(plans));
    println!("diff {:.1} ms", median(diffs));
    println!("plan_and_diff {:.1} ms", median(plan_diffs));
    println!("sync {:.1} ms", median(syncs));
    println!("plan_and_sync {:.1} ms", median(totals));
}
