//! One endpoint change through the whole engine (issue 12), at cluster scale: the binary's own
//! step, [`Engine::sync`] (what `Engine::run` calls on every wake-up), on the in-memory
//! [`FakeDataplane`]:
//! the source writes the EndpointSlice through its [`SourceHandle`] (store + the store
//! observers: change counters, health) → the Planner re-plans that Service → the Syncer diffs
//! the touched virtual servers against its cache and applies → the observers the binary
//! installs (metrics, health, health-check node ports) hear of the sync → the NodeProxyConfig
//! status reducer decides whether to publish. A NodeProxyConfig revision is in force, so the
//! status step runs.
//!
//! Sizes: 1k, 10k and 50k Services of the scale example's cluster (`examples/scale/cluster.rs`;
//! here every 20th Service, a LoadBalancer, is `externalTrafficPolicy: Local` with a
//! health-check node port); targets (issue 12): at most
//! 100 µs per change, and the 50k/1k ratio at most 2, printed after the timings.
//!
//! Run: `cargo bench -p kipvs-proxier --bench engine`.

#[allow(dead_code)] // the scale example's `store` and `planner` are not used here
#[path = "../examples/scale/cluster.rs"]
mod cluster;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::dataplane::kernel::settings::FakeKernel;
use kipvs_proxier::engine::observer::Observer;
use kipvs_proxier::engine::planner::{NodeIdentity, Planner};
use kipvs_proxier::engine::{ConfigFollower, Engine};
use kipvs_proxier::serve::health::{ProxyHealth, ServiceHealthServers};
use kipvs_proxier::serve::metrics::Metrics;
use kipvs_proxier::source::SourceHandle;
use kipvs_proxier::source::node_config::Assigned;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The allocator the `kipvs-proxier` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The configuration in force: the defaults, with a `syncPeriod` longer than the benchmark so
/// that every measured sync is the incremental one a change causes.
fn config() -> ProxierConfiguration {
    let mut config = ProxierConfiguration::default();
    config.ipvs.sync_period = Duration::from_secs(24 * 3600);
    config
}

/// An engine as `kipvs-proxier run` builds it (observers, NodeProxyConfig follower), over `n`
/// Services, after its first (full) sync with a revision in force.
/// The cluster sizes measured.
const SIZES: [usize; 3] = [1_000, 10_000, 50_000];

/// This node's name (endpoints on it are local).
const NODE: &str = "node-0";

/// Service `i` of the scale cluster; every 20th (a LoadBalancer) is `externalTrafficPolicy:
/// Local` with a health-check node port, so the health-check observers have work.
fn service(i: usize) -> k8s_openapi::api::core::v1::Service {
    let mut service = cluster::service(i);
    if i.is_multiple_of(20) {
        let spec = service.spec.as_mut().expect("spec");
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32000 + (i / 20 % 700) as i32);
    }
    service
}

fn engine(rt: &tokio::runtime::Runtime, n: usize) -> (SourceHandle, Engine<FakeDataplane>) {
    let metrics = Metrics::new();
    let health = ProxyHealth::new(Duration::from_secs(60), true);
    // No bind address: health-check node ports are tracked, no socket is opened.
    let health_check_ports = ServiceHealthServers::new(health.clone(), Vec::new());
    let observers: Vec<Arc<dyn Observer>> = vec![
        Arc::new(health),
        Arc::new(metrics),
        Arc::new(health_check_ports),
    ];
    let observer: Arc<dyn Observer> = Arc::new(observers);
    let handle = SourceHandle::default().with_observer(observer.clone());
    handle.update(|store| {
        for i in 0..n {
            store.upsert_service(service(i));
            store.upsert_slice(cluster::slice(i, true));
        }
    });
    let identity = NodeIdentity {
        name: NODE.into(),
        node_ips: vec!["192.168.0.10".parse().unwrap()],
    };
    let (_, assigned) = watch::channel(Assigned::Unknown);
    let (report, _) = watch::channel(None);
    let follower = ConfigFollower {
        assigned,
        local: config(),
        kernel: Box::new(FakeKernel),
        report,
    };
    let planner = Planner::new(identity, config());
    let mut engine = Engine::new(handle.clone(), planner, FakeDataplane::default())
        .observed_by(observer)
        .following(follower);
    rt.block_on(async {
        engine
            .apply_assigned(Assigned::Revision {
                revision: "r1".into(),
                config: Box::new(config()),
                ignored: Vec::new(),
            })
            .await;
        let report = engine.sync().await.unwrap();
        assert!(report.failures.is_empty());
    });
    (handle, engine)
}

/// Changes timed after criterion's run at each size, for the 50k/1k ratio.
const RATIO_CHANGES: u32 = 2_000;

fn one_endpoint_change(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("engine: one endpoint change");
    let mut means = Vec::new();
    for n in SIZES {
        let (handle, mut engine) = engine(&rt, n);
        let vs = engine.planner().desired().virtual_servers.len();
        println!("{n} Services: {vs} virtual servers");
        let full_observes = engine.dataplane().full_observes;
        let mut ready = true;
        let mut change = |engine: &mut Engine<FakeDataplane>| {
            ready = !ready;
            handle.update(|store| store.upsert_slice(cluster::slice(n / 2, ready)));
            let report = rt.block_on(engine.sync()).unwrap();
            assert!(!report.ops.is_empty() && report.failures.is_empty());
            assert_eq!(
                engine.dataplane().full_observes,
                full_observes,
                "a full sync in the measured loop ({} ops, ready {ready})",
                report.ops.len()
            );
            black_box(report.ops.len());
        };
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| change(&mut engine))
        });
        // The same step again, timed here for the ratio between sizes.
        let started = std::time::Instant::now();
        for _ in 0..RATIO_CHANGES {
            change(&mut engine);
        }
        means.push((n, started.elapsed() / RATIO_CHANGES));
    }
    group.finish();
    for (n, mean) in &means {
        println!(
            "engine: one endpoint change at {n} Services: mean {mean:?} over {RATIO_CHANGES} changes"
        );
    }
    if let (Some((_, first)), Some((_, last))) = (means.first(), means.last()) {
        println!(
            "engine: 50k/1k ratio {:.2} (target <= 2)",
            last.as_secs_f64() / first.as_secs_f64()
        );
    }
}

criterion_group!(benches, one_endpoint_change);
criterion_main!(benches);
