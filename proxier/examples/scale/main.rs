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
//! any sync), the first sync, the peak RSS after it, and the median of the rounds' plan,
//! sync and plan + sync.

use kipvs_proxier::dataplane::Ownership;
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::engine::syncer::Syncer;
use std::time::{Duration, Instant};

#[path = "cluster.rs"]
mod cluster;

/// The allocator the `kipvs-proxier` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    let at = Instant::now();
    let mut planner = cluster::planner();
    planner.replan(&mut store);
    println!("first_plan {:.1} ms", ms(at.elapsed()));
    println!(
        "virtual_servers {} count",
        planner.desired().virtual_servers.len()
    );
    println!("peak_rss_planned {} MiB", peak_rss_mib());
    let at = Instant::now();
    let mut first = syncer();
    let report = rt.block_on(first.sync(planner.desired())).expect("sync");
    assert!(report.failures.is_empty());
    println!("first_sync {:.1} ms", ms(at.elapsed()));
    println!("peak_rss_synced {} MiB", peak_rss_mib());
    drop((first, planner));

    let (mut plans, mut syncs, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (mut planner, mut syncer) = (cluster::planner(), syncer());
        let at = Instant::now();
        store.mark_all_dirty();
        planner.replan(&mut store);
        let planned = at.elapsed();
        let report = rt.block_on(syncer.sync(planner.desired())).expect("sync");
        assert!(report.failures.is_empty());
        let total = at.elapsed();
        plans.push(ms(planned));
        syncs.push(ms(total - planned));
        totals.push(ms(total));
    }
    println!("plan {:.1} ms", median(plans));
    println!("sync {:.1} ms", median(syncs));
    println!("plan_and_sync {:.1} ms", median(totals));
}
