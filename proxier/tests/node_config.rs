//! Live configuration changes (issue 6) on the Engine with the in-memory dataplane: each gate
//! flip emits exactly the ops it concerns, a configuration that cannot be applied leaves the
//! previous one in force and is reported Failed, and the reported status follows the syncs.

use kipvs_crds::config::ProxierConfiguration;
use kipvs_crds::nodeproxyconfig::{NodePhase, NodeProxyConfigStatus};
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::dataplane::kernel::settings::FakeKernel;
use kipvs_proxier::engine::observer::Observer;
use kipvs_proxier::engine::planner::{NodeIdentity, Planner};
use kipvs_proxier::engine::{ConfigFollower, Engine};
use kipvs_proxier::serve::health::{Probe, ProxyHealth};
use kipvs_proxier::source::SourceHandle;
use kipvs_proxier::source::manifests::ManifestsSource;
use kipvs_proxier::source::node_config::Assigned;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A LoadBalancer Service with a VIP-mode and a Proxy-mode ingress IP, one ready and one
/// serving+terminating endpoint, on a Node the Cluster Autoscaler is about to delete.
const OBJECTS: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
spec:
  taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]
status:
  addresses: [{type: InternalIP, address: 10.0.0.1}]
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.30
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 192.0.2.10, ipMode: VIP}, {ip: 192.0.2.11, ipMode: Proxy}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: default
  labels: {kubernetes.io/service-name: lb}
addressType: IPv4
endpoints:
- addresses: [10.244.1.2]
  conditions: {ready: true, serving: true, terminating: false}
- addresses: [10.244.1.3]
  conditions: {ready: false, serving: true, terminating: true}
ports: [{name: http, port: 8080, protocol: TCP}]
"#;

/// A configuration with `gates` set.
fn config(gates: &[(&str, bool)]) -> ProxierConfiguration {
    let mut config = ProxierConfiguration::default();
    for (gate, on) in gates {
        config.feature_gates.insert((*gate).to_owned(), *on);
    }
    config
}

fn revision(name: &str, config: ProxierConfiguration) -> Assigned {
    Assigned::Revision {
        revision: name.to_owned(),
        config: Box::new(config),
        ignored: Vec::new(),
    }
}

/// An engine following a NodeProxyConfig, with `local` as its local configuration and
/// `initial` applied before its first sync with [`OBJECTS`]; its health, and the status it
/// reports.
struct Fixture {
    engine: Engine<FakeDataplane>,
    health: ProxyHealth,
    report: watch::Receiver<Option<NodeProxyConfigStatus>>,
    _assigned: watch::Sender<Assigned>,
}

async fn fixture(local: ProxierConfiguration, initial: Assigned) -> Fixture {
    let dir = std::env::temp_dir().join(format!(
        "kipvs-node-config-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("objects.yaml");
    std::fs::write(&path, OBJECTS).unwrap();
    let health = ProxyHealth::new(
        2 * local.ipvs.sync_period,
        local.gate_enabled(kipvs_crds::Gate::KubeProxyDrainingTerminatingNodes),
    );
    let observer: Arc<dyn Observer> = Arc::new(vec![Arc::new(health.clone()) as Arc<dyn Observer>]);
    let handle = SourceHandle::default().with_observer(observer.clone());
    let source = ManifestsSource {
        path,
        node_name: "n1".into(),
        node_configs: None,
    };
    source.load_into(&handle, None).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
    let identity = NodeIdentity {
        name: "n1".into(),
        node_ips: vec![],
    };
    let (assigned_tx, assigned) = watch::channel(Assigned::Unknown);
    let (report, report_rx) = watch::channel(None);
    let follower = ConfigFollower {
        assigned,
        local: local.clone(),
        kernel: Box::new(FakeKernel),
        report,
    };
    let planner = Planner::new(identity, local);
    let mut engine = Engine::new(handle, planner, FakeDataplane::default())
        .observed_by(observer)
        .following(follower);
    engine.apply_assigned(initial).await;
    engine.sync().await.unwrap();
    Fixture {
        engine,
        health,
        report: report_rx,
        _assigned: assigned_tx,
    }
}

impl Fixture {
    /// Apply `assigned` and sync; the ops of that sync, as text, sorted.
    async fn apply(&mut self, assigned: Assigned) -> Vec<String> {
        self.engine.apply_assigned(assigned).await;
        let report = self.engine.sync().await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let mut ops: Vec<String> = report.ops.iter().map(ToString::to_string).collect();
        ops.sort();
        ops
    }

    fn status(&self) -> Option<NodeProxyConfigStatus> {
        self.report.borrow().clone()
    }
}

#[tokio::test]
async fn load_balancer_ip_mode_on_removes_only_proxy_mode_ingress_ips() {
    let mut f = fixture(config(&[("LoadBalancerIPMode", false)]), Assigned::Local).await;
    assert!(
        f.engine
            .dataplane()
            .state
            .bound_addresses
            .contains(&"192.0.2.11".parse().unwrap())
    );
    let ops = f.apply(revision("r1", config(&[]))).await;
    assert_eq!(
        ops,
        [
            "op=DeleteSetElement element=\"external { 192.0.2.11 . tcp . 80 }\"",
            "op=DeleteSetElement element=\"service-ips { 192.0.2.11 }\"",
            "op=DeleteVirtualServer vs=\"TCP 192.0.2.11:80\"",
            "op=UnbindAddress address=192.0.2.11",
        ],
    );
    let status = f.status().unwrap();
    assert_eq!(status.observed_revision.as_deref(), Some("r1"));
    assert_eq!(status.phase, Some(NodePhase::Applied));
    assert_eq!(status.sync_errors, Some(0));
    assert!(status.last_sync_time.is_some());
}

#[tokio::test]
async fn proxy_terminating_endpoints_off_removes_only_terminating_real_servers() {
    let mut f = fixture(config(&[]), Assigned::Local).await;
    let ops = f
        .apply(revision(
            "r1",
            config(&[("ProxyTerminatingEndpoints", false)]),
        ))
        .await;
    assert!(!ops.is_empty());
    for op in &ops {
        assert!(
            op.starts_with("op=DeleteRealServer") && op.ends_with("rs=10.244.1.3:8080"),
            "{ops:?}"
        );
    }
    // One per virtual server: cluster IP, VIP and Proxy ingress IPs, node port.
    assert_eq!(ops.len(), f.engine.dataplane().state.virtual_servers.len());
}

#[tokio::test]
async fn draining_terminating_nodes_gate_changes_only_healthz() {
    let mut f = fixture(
        config(&[("KubeProxyDrainingTerminatingNodes", false)]),
        Assigned::Local,
    )
    .await;
    assert!(f.health.check(Probe::Healthz).healthy);
    let ops = f.apply(revision("r1", config(&[]))).await;
    assert!(ops.is_empty(), "{ops:?}");
    assert!(!f.health.check(Probe::Healthz).healthy);
    assert!(f.health.check(Probe::Livez).healthy);
}

#[tokio::test]
async fn unappliable_configuration_keeps_the_previous_one_and_is_reported_failed() {
    let mut f = fixture(config(&[]), Assigned::Local).await;
    f.apply(revision("r1", config(&[]))).await;
    let mut unknown_scheduler = config(&[("LoadBalancerIPMode", false)]);
    unknown_scheduler.ipvs.scheduler = "nope".into();
    let ops = f.apply(revision("r2", unknown_scheduler)).await;
    assert!(ops.is_empty(), "{ops:?}");
    assert_eq!(f.engine.planner().config(), &config(&[]));
    let status = f.status().unwrap();
    assert_eq!(status.observed_revision.as_deref(), Some("r2"));
    assert_eq!(status.phase, Some(NodePhase::Failed));
    assert!(status.message.unwrap().contains("nope"));
    // Rolled back to the revision in force: reported Applied again.
    let ops = f.apply(revision("r1", config(&[]))).await;
    assert!(ops.is_empty(), "{ops:?}");
    let status = f.status().unwrap();
    assert_eq!(
        (status.observed_revision.as_deref(), status.phase),
        (Some("r1"), Some(NodePhase::Applied))
    );

    // An invalid one (validate()) as well; a good revision after it is applied.
    let mut invalid = config(&[]);
    invalid.ipvs.sync_period = Duration::ZERO;
    f.apply(revision("r3", invalid)).await;
    assert_eq!(f.status().unwrap().phase, Some(NodePhase::Failed));
    let mut wrr = config(&[]);
    wrr.ipvs.scheduler = "wrr".into();
    let ops = f.apply(revision("r4", wrr)).await;
    assert!(
        ops.iter()
            .all(|op| op.starts_with("op=UpdateVirtualServer")),
        "{ops:?}"
    );
    let status = f.status().unwrap();
    assert_eq!(
        (status.observed_revision.as_deref(), status.phase),
        (Some("r4"), Some(NodePhase::Applied))
    );
}

#[tokio::test]
async fn live_change_is_pending_until_synced_and_deletion_returns_to_local() {
    let mut short_drain = config(&[]);
    short_drain.ipvs.drain_timeout = Duration::from_secs(5);
    // The revision in force at start is reported Applied after the first sync, never
    // Pending (a restart does not go back to Pending) ...
    let mut f = fixture(config(&[]), revision("r1", short_drain.clone())).await;
    let status = f.status().unwrap();
    assert_eq!(
        (status.observed_revision.as_deref(), status.phase),
        (Some("r1"), Some(NodePhase::Applied))
    );
    assert_eq!(f.engine.syncer().max_drain, Duration::from_secs(5));
    // ... a later one is Pending until a sync with it completed.
    let mut r2 = short_drain;
    r2.ipvs.sync_period = Duration::from_secs(10);
    f.engine.apply_assigned(revision("r2", r2)).await;
    let status = f.status().unwrap();
    assert_eq!(
        (status.observed_revision.as_deref(), status.phase),
        (Some("r2"), Some(NodePhase::Pending))
    );
    f.engine.sync().await.unwrap();
    assert_eq!(f.status().unwrap().phase, Some(NodePhase::Applied));
    // The NodeProxyConfig is deleted: the local configuration, nothing to report.
    f.engine.apply_assigned(Assigned::Local).await;
    assert_eq!(f.status(), None);
    assert_eq!(f.engine.planner().config(), &config(&[]));
}

/// A NodeProxyConfig that cannot be read (403, 5xx, undecodable: the assignment stays
/// Unknown) does not keep the node from programming: after `ASSIGNMENT_WAIT` the engine syncs
/// with the local configuration, reports it in `kipvs_api_resource_unavailable`, and applies
/// the NodeProxyConfig once it is read.
#[tokio::test(start_paused = true)]
async fn an_unreadable_node_proxy_config_falls_back_to_the_local_configuration() {
    use kipvs_proxier::engine::ASSIGNMENT_WAIT;
    use kipvs_proxier::serve::metrics::{self, Metrics};
    let dir = std::env::temp_dir().join(format!("kipvs-unreadable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("objects.yaml"), OBJECTS).unwrap();
    let local = config(&[]);
    let health = ProxyHealth::new(2 * local.ipvs.sync_period, false);
    let metrics = Metrics::new();
    let observers: Vec<Arc<dyn Observer>> =
        vec![Arc::new(health.clone()), Arc::new(metrics.clone())];
    let observer: Arc<dyn Observer> = Arc::new(observers);
    let handle = SourceHandle::default().with_observer(observer.clone());
    let source = ManifestsSource {
        path: dir.join("objects.yaml"),
        node_name: "n1".into(),
        node_configs: None,
    };
    source.load_into(&handle, None).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
    let (assigned_tx, assigned) = watch::channel(Assigned::Unknown);
    let (report, report_rx) = watch::channel(None);
    let follower = ConfigFollower {
        assigned,
        local: local.clone(),
        kernel: Box::new(FakeKernel),
        report,
    };
    let identity = NodeIdentity {
        name: "n1".into(),
        node_ips: vec![],
    };
    let mut engine = Engine::new(
        handle,
        Planner::new(identity, local),
        FakeDataplane::default(),
    )
    .observed_by(observer)
    .following(follower);
    let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        engine
            .run(async {
                let _ = done.await;
            })
            .await;
        engine
    });
    let unavailable = || {
        let name =
            "kipvs_api_resource_unavailable{resource=\"nodeproxyconfigs.kipvs.io/v1alpha1\"}";
        metrics::sample(&metrics.encode(), name)
    };
    let synced = || !health.check(Probe::Livez).status.is_empty();
    tokio::time::sleep(ASSIGNMENT_WAIT - Duration::from_millis(100)).await;
    assert!(
        !synced(),
        "nothing programmed while the NodeProxyConfig may still come"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(synced(), "programmed with the local configuration");
    assert_eq!(unavailable(), Some(1.0));
    // The NodeProxyConfig becomes readable: applied live and reported.
    let mut r1 = config(&[]);
    r1.ipvs.scheduler = "wrr".into();
    assigned_tx.send_replace(revision("r1", r1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(unavailable(), Some(0.0));
    let status = report_rx.borrow().clone().expect("a status");
    assert_eq!(status.observed_revision.as_deref(), Some("r1"));
    assert_eq!(status.phase, Some(NodePhase::Applied));
    done_tx.send(()).unwrap();
    let engine = run.await.unwrap();
    let vs = engine
        .dataplane()
        .state
        .virtual_servers
        .values()
        .next()
        .unwrap();
    assert_eq!(&*vs.spec.scheduler, "wrr");
}

/// The NodeProxyConfig path end to end against a scripted API server (tower-test): the
/// watch assigns a revision, the engine applies it, the status writer reports it by
/// server-side apply on the status subresource; then a revision with a scheduler the kernel
/// lacks is reported Failed while the engine keeps running.
mod api {
    use super::*;
    use http::{Request, Response};
    use kipvs_proxier::source::node_config::watch_assigned;
    use kipvs_proxier_contract::report_status;
    use kube::client::Body;
    use serde_json::{Value, json};
    use tokio::sync::mpsc;

    const NODE: &str = "test-node";
    const PATH: &str = "/apis/kipvs.io/v1alpha1/nodeproxyconfigs";

    fn npc(revision: &str, scheduler: &str, rv: &str) -> Value {
        json!({"apiVersion": "kipvs.io/v1alpha1", "kind": "NodeProxyConfig",
               "metadata": {"name": NODE, "resourceVersion": rv},
               "spec": {"revision": revision, "assignedAt": "2026-11-22T10:00:00Z",
                        "config": {"ipvs": {"scheduler": scheduler}}}})
    }

    fn reply(body: Value) -> Response<Body> {
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body.to_string().into_bytes()))
            .unwrap()
    }

    /// A status patch as received: query, content type, body.
    type Patch = (String, String, Value);

    /// Serve: one list of `listed`, watches answered from `watches` (quiet when none is
    /// queued), status patches recorded on the returned channel.
    fn api_server(
        listed: Value,
        watches: mpsc::UnboundedReceiver<Value>,
    ) -> (kube::Client, mpsc::UnboundedReceiver<Patch>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (patches_tx, patches) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let watches = Arc::new(tokio::sync::Mutex::new(watches));
            while let Some((request, send)) = handle.next_request().await {
                let path = request.uri().path().to_owned();
                let query = request.uri().query().unwrap_or_default().to_owned();
                if path == format!("{PATH}/{NODE}/status") {
                    let content_type = request.headers()["content-type"].to_str().unwrap();
                    let content_type = content_type.to_owned();
                    let body = request.into_body().collect_bytes().await.unwrap();
                    let body: Value = serde_json::from_slice(&body).unwrap();
                    let mut object = npc("r1", "wrr", "1");
                    object["status"] = body["status"].clone();
                    patches_tx.send((query, content_type, body)).unwrap();
                    send.send_response(reply(object));
                } else if path == PATH && query.contains("watch=true") {
                    assert!(query.contains(&format!("fieldSelector=metadata.name%3D{NODE}")));
                    let watches = watches.clone();
                    tokio::spawn(async move {
                        if let Some(event) = watches.lock().await.recv().await {
                            send.send_response(reply(event));
                        }
                    });
                } else if path == PATH {
                    let list = json!({"kind": "NodeProxyConfigList", "apiVersion": "kipvs.io/v1alpha1",
                                      "metadata": {"resourceVersion": "1"}, "items": [listed]});
                    send.send_response(reply(list));
                } else {
                    panic!("unexpected request {path}?{query}");
                }
            }
        });
        (kube::Client::new(service, "default"), patches)
    }

    /// The next status patch, waiting longer than a `/livez` timeout (virtual time in paused
    /// tests).
    async fn next(patches: &mut mpsc::UnboundedReceiver<Patch>) -> Patch {
        tokio::time::timeout(Duration::from_secs(120), patches.recv())
            .await
            .expect("a status patch")
            .unwrap()
    }

    #[tokio::test]
    async fn watch_apply_and_report_status() {
        let (watch_tx, watches) = mpsc::unbounded_channel();
        let (client, mut patches) = api_server(npc("r1", "wrr", "1"), watches);
        let local = config(&[]);
        let health = ProxyHealth::new(2 * local.ipvs.sync_period, true);
        let observer: Arc<dyn Observer> =
            Arc::new(vec![Arc::new(health.clone()) as Arc<dyn Observer>]);
        let handle = SourceHandle::default().with_observer(observer.clone());
        let (assigned_tx, assigned) = watch::channel(Assigned::Unknown);
        let (report, report_rx) = watch::channel(None);
        tokio::spawn(watch_assigned(client.clone(), NODE.into(), assigned_tx));
        tokio::spawn(report_status(client, NODE.into(), report_rx, health));
        let identity = NodeIdentity {
            name: NODE.into(),
            node_ips: vec![],
        };
        let follower = ConfigFollower {
            assigned,
            local: local.clone(),
            kernel: Box::new(FakeKernel),
            report,
        };
        let planner = Planner::new(identity, local);
        let mut engine = Engine::new(handle, planner, FakeDataplane::default())
            .observed_by(observer)
            .following(follower);
        tokio::spawn(async move { engine.run(std::future::pending()).await });

        let (query, content_type, body) = next(&mut patches).await;
        assert_eq!(query, "&force=true&fieldManager=kipvs-proxier");
        assert_eq!(content_type, "application/apply-patch+yaml");
        assert_eq!(body["kind"], "NodeProxyConfig");
        assert_eq!(body["metadata"], json!({"name": NODE}));
        let status = &body["status"];
        assert_eq!(
            (
                &status["observedRevision"],
                &status["phase"],
                &status["healthy"]
            ),
            (&json!("r1"), &json!("Applied"), &json!(true)),
            "{body}"
        );
        assert_eq!(status["syncErrors"], 0);
        assert!(status["lastSyncTime"].is_string());

        watch_tx
            .send(json!({"type": "MODIFIED", "object": npc("r2", "nope", "2")}))
            .unwrap();
        let (_, _, body) = next(&mut patches).await;
        let status = &body["status"];
        assert_eq!(
            (
                &status["observedRevision"],
                &status["phase"],
                &status["healthy"]
            ),
            (&json!("r2"), &json!("Failed"), &json!(true)),
            "{body}"
        );
        assert!(status["message"].as_str().unwrap().contains("\"nope\""));
    }

    /// The status is written again when `/livez` flips, and only then.
    #[tokio::test(start_paused = true)]
    async fn health_flips_are_reported() {
        let (_watch_tx, watches) = mpsc::unbounded_channel();
        let (client, mut patches) = api_server(npc("r1", "rr", "1"), watches);
        let timeout = Duration::from_secs(60);
        let health = ProxyHealth::new(timeout, true);
        let applied = NodeProxyConfigStatus {
            observed_revision: Some("r1".into()),
            phase: Some(NodePhase::Applied),
            sync_errors: Some(0),
            ..Default::default()
        };
        let (_report, report_rx) = watch::channel(Some(applied));
        tokio::spawn(report_status(
            client,
            NODE.into(),
            report_rx,
            health.clone(),
        ));
        let healthy = |patch: Patch| patch.2["status"]["healthy"].clone();
        assert_eq!(healthy(next(&mut patches).await), json!(true));
        // A change waits longer than the timeout: unhealthy, reported without any other event.
        health.queued_update();
        assert_eq!(healthy(next(&mut patches).await), json!(false));
        // Synced: healthy again.
        health.updated();
        assert_eq!(healthy(next(&mut patches).await), json!(true));
        // Further syncs change nothing to report.
        health.updated();
        tokio::time::sleep(timeout).await;
        assert!(patches.try_recv().is_err());
    }
}
