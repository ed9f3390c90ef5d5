//! Unit tests of `proxier/src/engine/mod.rs`.

use super::planner::NodeIdentity;
use super::*;
use crate::dataplane::Op;
use crate::dataplane::fake::FakeDataplane;
use crate::source::manifests::ManifestsSource;
use std::net::IpAddr;

pub(super) const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.244.1.2]
  conditions: {ready: READY}
ports: [{name: http, port: 8080, protocol: TCP}]
"#;

/// A manifests file `<tag>.yaml` holding `contents` in a fresh directory (removed on
/// drop), and the source that reads it for node `n1`.
pub(super) struct Manifests {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
    pub(super) handle: SourceHandle,
    pub(super) source: ManifestsSource,
}

impl Manifests {
    pub(super) fn new(tag: &str, contents: &str) -> Self {
        // Tests run at once in one process, some with the same tag: one directory each.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("kipvs-{tag}-{pid}-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{tag}.yaml"));
        std::fs::write(&file, contents).unwrap();
        let source = ManifestsSource {
            path: file.clone(),
            node_name: "n1".into(),
            node_configs: None,
        };
        Self {
            dir,
            file,
            handle: SourceHandle::default(),
            source,
        }
    }

    /// An engine for node `n1` with the default configuration over `dataplane`, fed by
    /// this source's handle.
    fn engine<D: Dataplane>(&self, dataplane: D) -> Engine<D> {
        let identity = NodeIdentity {
            name: "n1".into(),
            node_ips: vec![],
        };
        let planner = Planner::new(identity, ProxierConfiguration::default());
        Engine::new(self.handle.clone(), planner, dataplane)
    }
}

/// An engine running its loop (`Engine::run`) in a task of its own, until `stop`.
struct Running<D: Dataplane> {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Engine<D>>,
}

impl<D: Dataplane + Send + 'static> Running<D> {
    fn start(mut engine: Engine<D>) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            engine
                .run(async {
                    let _ = stopped.await;
                })
                .await;
            engine
        });
        Self { stop, task }
    }

    /// Ends the loop and gives the engine back, for its state to be checked.
    async fn stop(self) -> Engine<D> {
        self.stop.send(()).unwrap();
        self.task.await.unwrap()
    }
}

impl Drop for Manifests {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The engine alone tells observers the configuration: the one it starts with as soon as
/// it is observed (the health servers take their staleness timeout and node gate from it).
#[test]
fn an_observer_hears_the_configuration_the_engine_starts_with() {
    #[derive(Default)]
    struct Heard(std::sync::Mutex<Vec<ProxierConfiguration>>);
    impl crate::source::StoreObserver for Heard {}
    impl Observer for Heard {
        fn config_changed(&self, config: &ProxierConfiguration) {
            self.0.lock().unwrap().push(config.clone());
        }
    }
    let m = Manifests::new("observed", WEB);
    let mut config = ProxierConfiguration::default();
    config.ipvs.sync_period = Duration::from_secs(7);
    let identity = NodeIdentity {
        name: "n1".into(),
        node_ips: vec![],
    };
    let planner = Planner::new(identity, config.clone());
    let heard = Arc::new(Heard::default());
    let _engine =
        Engine::new(m.handle.clone(), planner, FakeDataplane::default()).observed_by(heard.clone());
    assert_eq!(*heard.0.lock().unwrap(), [config]);
}

#[tokio::test]
async fn manifest_edits_flow_to_the_dataplane() {
    let m = Manifests::new("run", &WEB.replace("READY", "true"));
    let (file, handle, source) = (&m.file, &m.handle, &m.source);
    let mut engine = m.engine(FakeDataplane::default());
    let seen = source.load_into(handle, None).unwrap();
    let names: Vec<&str> = engine
        .sync()
        .await
        .unwrap()
        .ops
        .iter()
        .map(Op::name)
        .collect();
    assert_eq!(
        names,
        [
            "WriteRules",
            "AddSetElement", // cluster-ips
            "AddSetElement", // service-ips
            "AddVirtualServer",
            "AddRealServer",
            "BindAddress"
        ]
    );
    // No change: nothing re-planned, nothing applied.
    assert!(source.load_into(handle, seen.as_ref()).unwrap().is_none());
    assert!(engine.sync().await.unwrap().ops.is_empty());
    // The endpoint stops being ready: its real server goes away.
    std::fs::write(file, WEB.replace("READY", "false")).unwrap();
    let seen = source.load_into(handle, seen.as_ref()).unwrap();
    let report = engine.sync().await.unwrap();
    assert_eq!(report.ops.len(), 1, "{:?}", report.ops);
    let vs = engine
        .dataplane()
        .state
        .virtual_servers
        .values()
        .next()
        .unwrap();
    assert!(vs.real_servers.is_empty());
    // A half-written file (not UTF-8, then not YAML) keeps its last good content: nothing
    // is deleted.
    let programmed = engine.dataplane().state.clone();
    let garbage: [&[u8]; 2] = [
        b"\xff\xfe garbage",
        b"apiVersion: v1\nkind: Service\nspec: [",
    ];
    for bytes in garbage {
        std::fs::write(file, bytes).unwrap();
        source.load_into(handle, seen.as_ref()).unwrap().unwrap();
        let report = engine.sync().await.unwrap();
        assert!(report.ops.is_empty(), "{:?}", report.ops);
        assert_eq!(engine.dataplane().state, programmed);
    }
}

/// Issue 32: a change made while the periodic full sync reads the kernel (slowly, as
/// `nft -j list table` and the IPVS dump at 10k Services) reaches the dataplane without
/// waiting for that read, and the full sync that ends after the read neither undoes nor
/// repeats it: its observation, taken before the change, is reconciled with it.
#[tokio::test(start_paused = true)]
async fn a_change_does_not_wait_for_the_full_syncs_read() {
    use crate::dataplane::fake::FakeEvent;
    const READ: Duration = Duration::from_secs(5);
    let m = Manifests::new("beside", &WEB.replace("READY", "true"));
    let (events, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let fake = FakeDataplane {
        observe_delay: READ,
        events: Some(events),
        ..Default::default()
    };
    let engine = m.engine(fake);
    let period = engine.planner().config().ipvs.sync_period;
    let seen = m.source.load_into(&m.handle, None).unwrap();
    let running = Running::start(engine);
    let mut next = async || heard.recv().await.expect("the engine runs");
    // The first full sync reads inline (there is nothing to sync beside it yet).
    assert_eq!(next().await.1, FakeEvent::ObserveStarted);
    assert_eq!(next().await.1, FakeEvent::ObserveEnded);
    let (first_done, _) = next().await; // its first op
    // The periodic one: its read starts a syncPeriod later and takes READ.
    let read_started = loop {
        match next().await {
            (at, FakeEvent::ObserveStarted) => break at,
            (_, FakeEvent::Applied(_)) => {}
            other => panic!("{other:?}"),
        }
    };
    assert!(read_started - first_done >= period);
    // Within that read, the endpoint stops being ready.
    tokio::time::sleep(READ / 5).await;
    std::fs::write(&m.file, WEB.replace("READY", "false")).unwrap();
    let written = Instant::now();
    m.source.load_into(&m.handle, seen.as_ref()).unwrap();
    let (applied, event) = next().await;
    let FakeEvent::Applied(op) = event else {
        panic!("the change waited for the read: {event:?}");
    };
    assert_eq!(op.name(), "DeleteRealServer", "{op}");
    assert!(applied < read_started + READ);
    assert!(
        applied - written < Duration::from_millis(10),
        "{:?}",
        applied - written
    );
    let (read_ended, event) = next().await;
    assert_eq!(event, FakeEvent::ObserveEnded);
    assert_eq!(read_ended, read_started + READ);
    // The full sync ends with that read, and applies nothing: no op is repeated (the read
    // saw the real server still there) nor undone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let engine = running.stop().await;
    assert!(heard.try_recv().is_err(), "the full sync wrote again");
    assert!(engine.last_full_sync.is_some_and(|t| t >= read_ended));
    assert_eq!(engine.dataplane().full_observes, 2);
    assert_eq!(engine.syncer().in_doubt().count(), 0);
    let vs = engine.dataplane().state.virtual_servers.values().next();
    assert!(vs.unwrap().real_servers.is_empty());
    assert_eq!(
        engine.syncer().cached(),
        Some(&engine.dataplane().state),
        "the cache follows the kernel"
    );
}

/// Issue 32: a change made while a periodic full sync finishes (reconciles its observation
/// with the cache, diffs and applies the whole table) reaches the dataplane before that
/// finish ends: the finish goes in slices of `FINISH_SLICE` entries, and what the store took
/// meanwhile is synced between two of them. Here someone flushed the kernel's virtual servers
/// (the cache still has them), so the full sync re-adds them all, slice after slice; the
/// change comes once the first of them is in, and is applied before the last.
#[tokio::test(start_paused = true)]
async fn a_change_does_not_wait_for_the_full_syncs_finish() {
    use crate::dataplane::fake::FakeEvent;
    const SERVICES: usize = FINISH_SLICE + 100;
    // Service i: ClusterIP 10.96.x.y, one endpoint 10.244.x.y; service 0 has the lowest
    // virtual server, in the first slice.
    let web = |i: usize, ready: bool| {
        let (x, y) = (i / 200, i % 200 + 10);
        WEB.replace("web", &format!("web{i}"))
            .replace("10.96.0.20", &format!("10.96.{x}.{y}"))
            .replace("10.244.1.2", &format!("10.244.{x}.{y}"))
            .replace("READY", if ready { "true" } else { "false" })
            + "---\n"
    };
    let cluster = |first_ready: bool| -> String {
        (0..SERVICES)
            .map(|i| web(i, i > 0 || first_ready))
            .collect()
    };
    let m = Manifests::new("finish", &cluster(true));
    let mut engine = m.engine(FakeDataplane::default());
    let seen = m.source.load_into(&m.handle, None).unwrap();
    engine.sync().await.unwrap();
    assert_eq!(engine.dataplane().state.virtual_servers.len(), SERVICES);
    // Someone flushes the virtual servers; the next full sync finds out.
    let (events, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let fake = engine.syncer.dataplane_mut();
    fake.state.virtual_servers.clear();
    fake.events = Some(events);
    let running = Running::start(engine);
    let mut next = async || heard.recv().await.expect("the engine runs").1;
    assert_eq!(next().await, FakeEvent::ObserveStarted);
    assert_eq!(next().await, FakeEvent::ObserveEnded);
    let first = next().await;
    assert!(
        matches!(&first, FakeEvent::Applied(Op::AddVirtualServer(..))),
        "{first:?}"
    );
    // The finish is under way: service 0's endpoint stops being ready.
    std::fs::write(&m.file, cluster(false)).unwrap();
    m.source.load_into(&m.handle, seen.as_ref()).unwrap();
    let mut added = 1;
    loop {
        match next().await {
            FakeEvent::Applied(Op::AddVirtualServer(..)) => added += 1,
            FakeEvent::Applied(Op::AddRealServer { .. }) => {}
            FakeEvent::Applied(op @ Op::DeleteRealServer { .. }) => {
                assert_eq!(
                    op.virtual_server().unwrap().address.to_string(),
                    "10.96.0.10"
                );
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        added < SERVICES,
        "the change waited for the whole finish: {added} virtual servers added before it"
    );
    // The rest of the finish follows, and leaves the kernel as desired.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let engine = running.stop().await;
    while let Ok((_, event)) = heard.try_recv() {
        if let FakeEvent::Applied(Op::AddVirtualServer(..)) = event {
            added += 1;
        }
    }
    assert_eq!(added, SERVICES);
    let kernel = &engine.dataplane().state;
    assert_eq!(kernel.virtual_servers.len(), SERVICES);
    let real_servers = |vs: &crate::model::ObservedVirtualServer| vs.real_servers.len();
    let empty = kernel
        .virtual_servers
        .values()
        .filter(|vs| real_servers(vs) == 0);
    assert_eq!(empty.count(), 1, "service 0 alone lost its endpoint");
    assert_eq!(
        engine.syncer().cached(),
        Some(kernel),
        "the cache follows the kernel"
    );
    assert_eq!(engine.syncer().in_doubt().count(), 0);
    assert!(!engine.syncer().finishing());
}

/// A periodic full sync whose background read fails changes nothing by itself and is
/// retried at the next call; what the call that found the failure took from the store
/// still reaches the kernel at once (`Syncer::finish_full`'s error path in
/// [`Engine::sync`]), and the failure is the call's result.
#[tokio::test(start_paused = true)]
async fn a_failed_background_read_is_retried_and_the_change_taken_meanwhile_is_applied() {
    const READ: Duration = Duration::from_secs(5);
    let m = Manifests::new("read-fails", &WEB.replace("READY", "true"));
    let fake = FakeDataplane {
        observe_delay: READ,
        ..Default::default()
    };
    let mut engine = m.engine(fake);
    engine.reads_beside = true;
    let seen = m.source.load_into(&m.handle, None).unwrap();
    // The first full sync reads inline.
    engine.sync().await.unwrap();
    let first_full = engine.last_full_sync.unwrap();
    let period = engine.planner().config().ipvs.sync_period;
    // The periodic one reads beside, and that read fails.
    engine.syncer.dataplane_mut().observe_failures = 1;
    tokio::time::advance(period).await;
    assert!(engine.sync().await.unwrap().ops.is_empty());
    assert_eq!(engine.dataplane().full_observes, 2);
    // Meanwhile the endpoint stops being ready; the call that takes the change finds the
    // read ended (failed).
    tokio::time::sleep(READ + Duration::from_millis(1)).await;
    std::fs::write(&m.file, WEB.replace("READY", "false")).unwrap();
    m.source.load_into(&m.handle, seen.as_ref()).unwrap();
    let error = engine.sync().await.unwrap_err();
    assert!(
        error.to_string().contains("the observation fails"),
        "{error}"
    );
    let vs = engine.dataplane().state.virtual_servers.values().next();
    assert!(
        vs.unwrap().real_servers.is_empty(),
        "the change waits for the next full sync"
    );
    assert_eq!(engine.syncer().cached(), Some(&engine.dataplane().state));
    assert_eq!(engine.last_full_sync, Some(first_full), "not a full sync");
    // The period is still over, but the next read waits for its backoff
    // (`a_failing_background_read_backs_off_under_steady_changes`); after it, the next call
    // starts it, and it succeeds.
    assert!(engine.sync().await.unwrap().ops.is_empty());
    assert_eq!(engine.dataplane().full_observes, 2);
    tokio::time::advance(RETRY_INTERVAL).await;
    assert!(engine.sync().await.unwrap().ops.is_empty());
    assert_eq!(engine.dataplane().full_observes, 3);
    tokio::time::sleep(READ + Duration::from_millis(1)).await;
    assert!(engine.sync().await.unwrap().ops.is_empty());
    assert!(engine.last_full_sync.unwrap() > first_full + period);
}

/// Finding 5 of this stop's review: a background read that keeps failing (`nft` cannot list
/// the table) is started again no sooner than [`RETRY_INTERVAL`] after the last failure,
/// doubling up to `ipvs.syncPeriod`, however often changes come (a sync each 100 ms here):
/// 5 reads in 20 s (at 30 s, 31 s, 33 s, 37 s, 45 s), where the next call after each failure
/// started one (100 without the backoff). Once the reads succeed again, the full sync ends.
#[tokio::test(start_paused = true)]
async fn a_failing_background_read_backs_off_under_steady_changes() {
    let m = Manifests::new("read-backs-off", &WEB.replace("READY", "true"));
    let mut engine = m.engine(FakeDataplane::default());
    engine.reads_beside = true;
    m.source.load_into(&m.handle, None).unwrap();
    engine.sync().await.unwrap();
    let first_full = engine.last_full_sync.unwrap();
    let period = engine.planner().config().ipvs.sync_period;
    engine.syncer.dataplane_mut().observe_failures = usize::MAX;
    tokio::time::advance(period).await;
    for _ in 0..200 {
        let _ = engine.sync().await;
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let reads = engine.dataplane().full_observes - 1;
    assert_eq!(reads, 5, "reads beside the syncs in 20 s of failures");
    assert_eq!(engine.read_retry, Duration::from_secs(16));
    // The kernel can be read again: the next read, when due, ends the full sync.
    engine.syncer.dataplane_mut().observe_failures = 0;
    tokio::time::advance(engine.read_retry).await;
    engine.sync().await.unwrap();
    tokio::task::yield_now().await;
    engine.sync().await.unwrap();
    assert!(engine.last_full_sync.unwrap() > first_full + period);
    assert_eq!(engine.read_retry, Duration::ZERO);
    // A read beside fails again, then a full sync that reads inline (kube-ipvs0 made again)
    // succeeds: nothing waits for the backoff any more, and the next sync is a period away
    // (not due at once, again and again).
    engine.syncer.dataplane_mut().observe_failures = 1;
    tokio::time::advance(period).await;
    engine.sync().await.unwrap();
    tokio::task::yield_now().await;
    assert!(engine.sync().await.is_err());
    assert!(engine.next_read.is_some());
    engine.last_full_sync = None;
    engine.sync().await.unwrap();
    assert_eq!(engine.next_read, None);
    let mut retry = Duration::ZERO;
    assert_eq!(engine.next_sync_in(false, &mut retry), period);
}

/// Log lines, every level, of this thread's spans and events while the guard lives.
fn capture_logs() -> (
    Arc<std::sync::Mutex<Vec<u8>>>,
    tracing::subscriber::DefaultGuard,
) {
    #[derive(Clone)]
    struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Capture {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = Capture(logs.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// An invalid `kipvs.io/scheduler` value that changes in a loop costs one WARN line in all,
/// each of its lines shows the value truncated, and a change from one invalid value to
/// another is logged at debug only.
#[tokio::test]
async fn an_invalid_scheduler_annotation_is_warned_about_once_and_truncated() {
    let annotated = |value: &str| {
        WEB.replace("READY", "true").replace(
                "metadata: {name: web, namespace: default}",
                &format!(
                    "metadata: {{name: web, namespace: default, annotations: {{kipvs.io/scheduler: {value}}}}}"
                ),
            )
    };
    let m = Manifests::new("long-scheduler", &annotated("rr"));
    let (file, handle, source) = (&m.file, &m.handle, &m.source);
    let mut engine = m.engine(FakeDataplane::default());
    let mut seen = source.load_into(handle, None).unwrap();
    engine.sync().await.unwrap();
    let (logs, guard) = capture_logs();
    for round in 0..5 {
        let value = format!("x{round}{}", "y".repeat(1_000));
        std::fs::write(file, annotated(&value)).unwrap();
        seen = source.load_into(handle, seen.as_ref()).unwrap();
        engine.sync().await.unwrap();
    }
    drop(guard);
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("kipvs.io/scheduler"))
        .collect();
    // The debug lines are not counted: tracing's global level hint, which other tests'
    // thread-local subscribers change concurrently, can drop them from this capture.
    assert!((1..=5).contains(&lines.len()), "{logs}");
    assert_eq!(
        lines.iter().filter(|l| l.contains(" WARN ")).count(),
        1,
        "{logs}"
    );
    for line in lines {
        assert!(line.len() < 400, "{line}");
        assert!(
            line.contains("\"x") && line.contains("... (938 more bytes)"),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_service_scheduler_the_kernel_lacks_is_probed_once_and_replaced() {
    let annotated = WEB.replace("READY", "true").replace(
        "metadata: {name: web, namespace: default}",
        "metadata: {name: web, namespace: default, annotations: {kipvs.io/scheduler: twos}}",
    );
    let other = WEB
        .replace("READY", "true")
        .replace("name: web,", "name: api,")
        .replace("10.96.0.20", "10.96.0.21")
        .replace("web-1", "api-1")
        .replace("service-name: web", "service-name: api");
    let m = Manifests::new("twos", &format!("{annotated}\n---\n{other}"));
    let (file, handle, source) = (&m.file, &m.handle, &m.source);
    let fake = FakeDataplane {
        missing_schedulers: ["twos".to_string()].into(),
        ..Default::default()
    };
    let mut engine = m.engine(fake);
    let seen = source.load_into(handle, None).unwrap();
    // The first sync finds the annotated virtual server refused; the scheduler is probed.
    let report = engine.sync().await.unwrap();
    assert!(!report.failures.is_empty());
    assert!(engine.planner().replan_pending());
    // Re-planned with the configured scheduler: programmed, nothing left in doubt.
    let report = engine.sync().await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let schedulers: Vec<&str> = engine
        .dataplane()
        .state
        .virtual_servers
        .values()
        .map(|vs| &*vs.spec.scheduler)
        .collect();
    assert_eq!(schedulers, ["rr", "rr"]);
    assert_eq!(engine.syncer().in_doubt().count(), 0);
    assert_eq!(
        engine
            .planner()
            .unavailable_schedulers()
            .iter()
            .collect::<Vec<_>>(),
        ["twos"]
    );
    let problems = engine.planner().plan().problems;
    assert!(
        problems
            .iter()
            .any(|p| p.to_string().contains("lacks that IPVS scheduler")),
        "{problems:?}"
    );
    // Other changes stay incremental: no full observe of the kernel.
    let observes = engine.dataplane().full_observes;
    std::fs::write(
        file,
        format!("{annotated}\n---\n{}", other.replace("true", "false")),
    )
    .unwrap();
    source.load_into(handle, seen.as_ref()).unwrap();
    let report = engine.sync().await.unwrap();
    assert_eq!(report.ops.len(), 1, "{:?}", report.ops);
    assert!(report.failures.is_empty());
    assert_eq!(engine.dataplane().full_observes, observes);
    // The annotated Service's endpoint changes: re-planned with the configured scheduler
    // again, and the kernel was asked about `twos` once in all.
    let moved = annotated.replace("10.244.1.2", "10.244.1.9");
    let not_ready = other.replace("true", "false");
    std::fs::write(file, format!("{moved}\n---\n{not_ready}")).unwrap();
    source.load_into(handle, seen.as_ref()).unwrap();
    let report = engine.sync().await.unwrap();
    assert_eq!(report.ops.len(), 2, "{:?}", report.ops);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(engine.dataplane().scheduler_checks, ["twos"]);
}

/// Start-up as `run()` does it on a real node: the first sync reads the node's other
/// addresses (never none: `lo`, `eth0`), which asks the planner for a full re-plan, and
/// its store is all-dirty. The first change after that is incremental, not a full
/// re-plan and a full observe of the kernel (both "everything" flags are taken), also
/// after a NodeProxyConfig revision put in force before the first sync.
#[tokio::test]
async fn the_first_change_after_start_up_is_incremental() {
    let m = Manifests::new("first", &WEB.replace("READY", "true"));
    let (file, handle, source) = (&m.file, &m.handle, &m.source);
    let (_, assigned) = watch::channel(Assigned::Unknown);
    let (report, _) = watch::channel(None);
    let follower = ConfigFollower {
        assigned,
        local: ProxierConfiguration::default(),
        kernel: Box::new(crate::dataplane::kernel::settings::FakeKernel),
        report,
    };
    let node = FakeDataplane {
        other_addresses: watch::Sender::new(["192.168.0.10".parse().unwrap()].into()),
        ..Default::default()
    };
    let mut engine = m.engine(node).following(follower);
    engine.apply_assigned(Assigned::Local).await;
    let seen = source.load_into(handle, None).unwrap();
    assert!(!engine.sync().await.unwrap().ops.is_empty());
    assert_eq!(engine.dataplane().full_observes, 1);
    assert!(!engine.planner().replan_pending());
    // The endpoint stops being ready: one op, from the cache, no full observe.
    std::fs::write(file, WEB.replace("READY", "false")).unwrap();
    source.load_into(handle, seen.as_ref()).unwrap();
    let report = engine.sync().await.unwrap();
    assert_eq!(report.ops.len(), 1, "{:?}", report.ops);
    assert_eq!(engine.dataplane().full_observes, 1);
}

/// kubernetes#133773: the first sync programs the API server's Service before any other,
/// so a node reaches the API server through its ClusterIP before the rest of a large table
/// is programmed.
#[tokio::test]
async fn the_first_sync_programs_default_kubernetes_first() {
    // Its ClusterIP sorts after web's: without the rule it would come last.
    let kubernetes = r#"
apiVersion: v1
kind: Service
metadata: {name: kubernetes, namespace: default}
spec:
  clusterIP: 10.96.0.200
  ports: [{name: https, port: 443, protocol: TCP, targetPort: 6443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes}
addressType: IPv4
endpoints:
- addresses: [192.168.0.2]
  conditions: {ready: true}
ports: [{name: https, port: 6443, protocol: TCP}]
"#;
    let m = Manifests::new(
        "apiserver",
        &format!("{}\n---\n{kubernetes}", WEB.replace("READY", "true")),
    );
    let (handle, source) = (&m.handle, &m.source);
    let mut engine = m.engine(FakeDataplane::default());
    source.load_into(handle, None).unwrap();
    engine.sync().await.unwrap();
    let applied: Vec<String> = engine
        .dataplane()
        .applied
        .iter()
        .map(|op| op.to_string())
        .collect();
    let api_server = |op: &String| op.contains("10.96.0.200") || op.contains("WriteRules");
    let first_other = applied.iter().position(|op| !api_server(op)).unwrap();
    assert_eq!(first_other, 6, "{applied:#?}");
    assert!(applied[first_other..].iter().all(|op| !api_server(op)));
    let names: Vec<&str> = engine.dataplane().applied[..6]
        .iter()
        .map(Op::name)
        .collect();
    assert_eq!(
        names,
        [
            "WriteRules",
            "AddSetElement", // cluster-ips
            "AddSetElement", // service-ips
            "AddVirtualServer",
            "AddRealServer",
            "BindAddress"
        ]
    );
}

/// Issue 33 item 6 and review finding 2: the engine learns of the node's addresses from the
/// dataplane's notifications ([`Dataplane::interfaces_changed`]), not from a read every few
/// seconds: under steady source changes (one every 500 ms) a VIP that comes up gets its
/// NodePort at once, and loses it at once when it goes; between those changes and the syncs,
/// no address is read.
#[tokio::test(start_paused = true)]
async fn an_address_change_is_served_at_once_under_steady_changes() {
    use crate::dataplane::fake::FakeEvent;
    const CHANGE: Duration = Duration::from_millis(500);
    let web = WEB
        .replace(
            "clusterIP: 10.96.0.20",
            "clusterIP: 10.96.0.20\n  type: NodePort",
        )
        .replace("targetPort: 8080}", "targetPort: 8080, nodePort: 30080}");
    let m = Manifests::new("addresses", &web.replace("READY", "true"));
    let (heard, mut events) = tokio::sync::mpsc::unbounded_channel();
    let fake = FakeDataplane {
        events: Some(heard),
        ..Default::default()
    };
    let addresses = fake.other_addresses.clone();
    addresses.send_replace(["192.168.0.10".parse().unwrap()].into());
    let vip: IpAddr = "192.168.0.100".parse().unwrap();
    let engine = m.engine(fake);
    let period = engine.planner().config().ipvs.sync_period;
    let mut seen = m.source.load_into(&m.handle, None).unwrap();
    let running = Running::start(engine);
    let mut came = None;
    let mut went = None;
    for i in 0..24 {
        tokio::time::sleep(CHANGE).await;
        let ready = if i % 2 == 0 { "false" } else { "true" };
        std::fs::write(&m.file, web.replace("READY", ready)).unwrap();
        seen = m.source.load_into(&m.handle, seen.as_ref()).unwrap();
        // Half-way between two changes, the VIP comes, and later goes.
        tokio::time::sleep(CHANGE / 2).await;
        if i == 8 {
            addresses.send_modify(|a| {
                a.insert(vip);
            });
            came = Some(Instant::now());
        }
        if i == 16 {
            addresses.send_modify(|a| {
                a.remove(&vip);
            });
            went = Some(Instant::now());
        }
    }
    let engine = running.stop().await;
    assert!(
        Instant::now() < engine.last_full_sync.unwrap() + period,
        "no periodic full sync"
    );
    let mut added = None;
    let mut deleted = None;
    while let Ok((at, event)) = events.try_recv() {
        match event {
            FakeEvent::Applied(Op::AddVirtualServer(key, _)) if key.address == vip => {
                added.get_or_insert(at);
            }
            FakeEvent::Applied(Op::DeleteVirtualServer(key)) if key.address == vip => {
                deleted.get_or_insert(at);
            }
            _ => {}
        }
    }
    let (added, deleted) = (
        added.expect("a NodePort on the VIP"),
        deleted.expect("gone"),
    );
    assert!(
        added - came.unwrap() < Duration::from_millis(10),
        "{:?}",
        added - came.unwrap()
    );
    assert!(
        deleted - went.unwrap() < Duration::from_millis(10),
        "{:?}",
        deleted - went.unwrap()
    );
    // Read at the first sync and at each of the two changes, never on a timer.
    assert_eq!(engine.dataplane().address_reads, 3);
}

/// Review finding 4: `kube-ipvs0` deleted while the proxier runs (with it, every address it
/// held) is made again ([`Dataplane::kube_ipvs0_recreated`]), and the next sync is a full one
/// that binds its addresses again, not one that trusts the cache of the kernel's state.
#[tokio::test(start_paused = true)]
async fn a_deleted_kube_ipvs0_gets_its_addresses_back_at_the_next_sync() {
    let m = Manifests::new("kube-ipvs0", &WEB.replace("READY", "true"));
    let mut engine = m.engine(FakeDataplane::default());
    engine.reads_beside = true;
    m.source.load_into(&m.handle, None).unwrap();
    engine.sync().await.unwrap();
    let bound = engine.dataplane().state.bound_addresses.clone();
    assert!(bound.contains(&"10.96.0.20".parse().unwrap()));
    let fake = engine.syncer.dataplane_mut();
    fake.state.bound_addresses.clear();
    fake.kube_ipvs0_deleted = true;
    tokio::time::advance(Duration::from_secs(1)).await;
    let report = engine.sync().await.unwrap();
    assert_eq!(engine.dataplane().state.bound_addresses, bound);
    assert!(
        report.ops.iter().all(|op| matches!(op, Op::BindAddress(_))),
        "{:?}",
        report.ops
    );
    assert!(!engine.dataplane().kube_ipvs0_deleted);
}
