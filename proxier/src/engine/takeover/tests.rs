//! Unit tests of `proxier/src/engine/takeover.rs`.

use super::*;
use crate::dataplane::fake::FakeDataplane;
use crate::dataplane::host::kube_proxy::{Leftovers, Mode, Ruleset, Signals};
use crate::dataplane::kernel::settings::{FakeKernel, SchedulerError, SettingsError};
use crate::dataplane::{DataplaneError, OpFailure};
use crate::engine::Engine;
use crate::engine::planner::{NodeIdentity, Planner};
use crate::engine::switch::KIPVS_RULES_DELETED;
use crate::plan::kube_proxy::{iptables_removal, parse_save};
use crate::serve::health::ProxyHealth;
use crate::source::{SourceHandle, StoreObserver};
use futures::future::BoxFuture;
use kipvs_crds::config::{ProxierConfiguration, ServiceProxy};
use std::sync::{Arc, Mutex};

/// kube-proxy on a fake node: running while `running` says so; its leftovers until
/// removed; every removal recorded.
#[derive(Default)]
struct FakeNode {
    running: Mutex<Option<String>>,
    leftovers: Mutex<Leftovers>,
    removals: Mutex<Vec<Leftovers>>,
    /// How many times `running` was asked.
    asked: Mutex<usize>,
    /// A removal waits for this, when set.
    hold: Mutex<Option<Arc<tokio::sync::Notify>>>,
    /// The `kubelet_chains` of every reading.
    kubelet_chains: Mutex<Vec<bool>>,
    /// Why kube-proxy is back (besides running).
    back: Mutex<Option<String>>,
    /// kube-proxy's health once synced.
    synced: Mutex<Option<bool>>,
    /// kube-proxy's mode and where it is read (its `/proxyMode`, its state's form).
    mode: Mutex<Option<(Mode, String)>>,
}

impl KubeProxyNode for Arc<FakeNode> {
    fn signals(&self, state: bool) -> BoxFuture<'_, Signals> {
        *self.asked.lock().unwrap() += 1;
        let signals = Signals {
            process: self.running.lock().unwrap().clone(),
            state: self.back.lock().unwrap().clone().filter(|_| state),
            mode: self.mode.lock().unwrap().clone(),
            ..Signals::default()
        };
        Box::pin(async move { signals })
    }
    fn synced(&self) -> BoxFuture<'_, Option<bool>> {
        let synced = *self.synced.lock().unwrap();
        Box::pin(async move { synced })
    }
    fn leftovers(&self, kubelet_chains: bool) -> BoxFuture<'_, Leftovers> {
        self.kubelet_chains.lock().unwrap().push(kubelet_chains);
        let leftovers = self.leftovers.lock().unwrap().clone();
        Box::pin(async move { leftovers })
    }
    fn remove<'a>(&'a self, leftovers: &'a Leftovers) -> BoxFuture<'a, Result<(), String>> {
        self.removals.lock().unwrap().push(leftovers.clone());
        *self.leftovers.lock().unwrap() = Leftovers::default();
        let hold = self.hold.lock().unwrap().clone();
        Box::pin(async move {
            if let Some(hold) = hold {
                hold.notified().await;
            }
            Ok(())
        })
    }
}

/// The events an observer heard.
#[derive(Default)]
struct Events(Mutex<Vec<TakeoverEvent>>);
impl StoreObserver for Events {}
impl Observer for Events {
    fn takeover(&self, event: &TakeoverEvent) {
        self.0.lock().unwrap().push(event.clone());
    }
}

/// A takeover of `node` (`found`: kube-proxy's state was found) with the fake kernel's
/// settings.
fn fake_takeover(node: &Arc<FakeNode>, found: bool) -> Takeover {
    let mut takeover = Takeover::new(Arc::new(node.clone()), Box::new(FakeKernel), false);
    takeover.found = found;
    takeover
}

fn kube_proxy_leftovers() -> Leftovers {
    let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
            -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n";
    Leftovers {
        rulesets: vec![Ruleset {
            backend: "legacy",
            family: "iptables",
            removal: iptables_removal(&parse_save(save).unwrap(), true),
        }],
        ipsets: vec!["KUBE-CLUSTER-IP".into()],
        unreadable: vec![],
    }
}

/// kube-proxy's NodePort virtual servers on other local addresses than the node IPs drain
/// only during a takeover of a node where kube-proxy's state was found, and only for the
/// NodePorts kipvs programs; another program's virtual server on a local address with a
/// port in the NodePort range is never touched.
#[tokio::test]
async fn only_kube_proxys_node_ports_on_other_local_addresses_drain() {
    use crate::engine::tests::{Manifests, WEB};
    use crate::model::{ObservedRealServer, ObservedState, ObservedVirtualServer, Protocol};
    let node_port = WEB
        .replace("READY", "true")
        .replace(
            "clusterIP: 10.96.0.20",
            "type: NodePort\n  clusterIP: 10.96.0.20",
        )
        .replace("targetPort: 8080}", "targetPort: 8080, nodePort: 30080}");
    let m = Manifests::new("kp-node-ports", &node_port);
    let node_ip: IpAddr = "192.168.1.5".parse().unwrap();
    let other: IpAddr = "172.17.0.1".parse().unwrap();
    let vs = |address, port| VirtualServerKey {
        address,
        port,
        protocol: Protocol::Tcp,
    };
    // On docker0's address: kube-proxy's (or keepalived's) 30080, keepalived's 30081.
    let mut kernel = ObservedState::default();
    for port in [30080, 30081] {
        let rs = ObservedRealServer {
            weight: 1,
            active_connections: 0,
            inactive_connections: 0,
        };
        let ovs = ObservedVirtualServer {
            spec: crate::model::VirtualServerSpec {
                scheduler: "rr".into(),
                persistence_timeout: None,
                sched_flags: Default::default(),
            },
            real_servers: [("10.0.0.9:80".parse().unwrap(), rs)].into(),
        };
        kernel.virtual_servers.insert(vs(other, port), ovs);
    }
    // The ops on docker0's address of the first sync of an engine taking over (`Some`:
    // whether kube-proxy ran) or not.
    let first_sync = async |takeover: Option<bool>| {
        let identity = NodeIdentity {
            name: "n1".into(),
            node_ips: vec![node_ip],
        };
        let planner = Planner::new(identity, ProxierConfiguration::default());
        let dataplane = FakeDataplane::new(kernel.clone());
        dataplane
            .other_addresses
            .send_replace([node_ip, other].into());
        let mut engine = Engine::new(m.handle.clone(), planner, dataplane);
        if let Some(ran) = takeover {
            let node = Arc::new(FakeNode::default());
            engine = engine.taking_over(fake_takeover(&node, ran));
        }
        m.source.load_into(&m.handle, None).unwrap();
        let report = engine.sync().await.unwrap();
        let node_port = vs(node_ip, 30080);
        assert!(
            report
                .ops
                .iter()
                .any(|op| matches!(op, Op::AddVirtualServer(k, _) if *k == node_port))
        );
        report
            .ops
            .into_iter()
            .filter(|op| op.to_string().contains("172.17.0.1"))
            .collect::<Vec<_>>()
    };
    assert_eq!(first_sync(None).await, [], "no takeover");
    assert_eq!(
        first_sync(Some(false)).await,
        [],
        "kube-proxy never ran here"
    );
    assert_eq!(
        first_sync(Some(true)).await,
        [
            Op::DeleteRealServer {
                vs: vs(other, 30080),
                rs: "10.0.0.9:80".parse().unwrap()
            },
            Op::DeleteVirtualServer(vs(other, 30080))
        ],
        "kube-proxy ran: its NodePort drains, keepalived's 30081 stays"
    );
}

/// Without `--node-ip`, NodePorts are served on every local address, as kube-proxy IPVS
/// serves them: a takeover adopts kube-proxy's NodePort virtual servers on a second address
/// (no delete, no drain: they keep answering), drains only those on loopback (which kipvs
/// does not serve), and an address that appears later (a keepalived VIP) gets the NodePorts
/// at the next full sync.
#[tokio::test(start_paused = true)]
async fn a_takeover_keeps_kube_proxys_node_ports_on_every_local_address() {
    use crate::engine::tests::{Manifests, WEB};
    use crate::model::{ObservedRealServer, ObservedState, ObservedVirtualServer, Protocol};
    let node_port = WEB
        .replace("READY", "true")
        .replace(
            "clusterIP: 10.96.0.20",
            "type: NodePort\n  clusterIP: 10.96.0.20",
        )
        .replace("targetPort: 8080}", "targetPort: 8080, nodePort: 30080}")
        + "---\napiVersion: v1\nkind: Node\nmetadata: {name: n1}\n\
               status: {addresses: [{type: InternalIP, address: 192.168.1.5}]}\n";
    let m = Manifests::new("kp-every-address", &node_port);
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let (node_ip, second, loopback, vip) = (
        ip("192.168.1.5"),
        ip("10.10.0.5"),
        ip("127.0.0.1"),
        ip("192.168.1.50"),
    );
    let vs = |address| VirtualServerKey {
        address,
        port: 30080,
        protocol: Protocol::Tcp,
    };
    // kube-proxy's table: the NodePort on every local address, lo's included (1.20).
    let mut kernel = ObservedState::default();
    for address in [node_ip, second, loopback] {
        let rs = ObservedRealServer {
            weight: 1,
            active_connections: 0,
            inactive_connections: 0,
        };
        let ovs = ObservedVirtualServer {
            spec: crate::model::VirtualServerSpec {
                scheduler: "rr".into(),
                persistence_timeout: None,
                sched_flags: Default::default(),
            },
            real_servers: [("10.244.1.2:8080".parse().unwrap(), rs)].into(),
        };
        kernel.virtual_servers.insert(vs(address), ovs);
    }
    let identity = NodeIdentity {
        name: "n1".into(),
        node_ips: vec![],
    };
    let planner = Planner::new(identity, ProxierConfiguration::default());
    let dataplane = FakeDataplane::new(kernel);
    dataplane
        .other_addresses
        .send_replace([node_ip, second, loopback].into());
    let node = Arc::new(FakeNode::default());
    let mut engine =
        Engine::new(m.handle.clone(), planner, dataplane).taking_over(fake_takeover(&node, true));
    m.source.load_into(&m.handle, None).unwrap();
    let report = engine.sync().await.unwrap();
    // The IPVS ops on `address` (not the nftables elements: kipvs records its own).
    let on = |ops: &[Op], address: IpAddr| -> Vec<Op> {
        let address = address.to_string();
        (ops.iter())
            .filter(|op| !matches!(op, Op::AddSetElement(_) | Op::DeleteSetElement(_)))
            .filter(|op| op.to_string().contains(&address))
            .cloned()
            .collect()
    };
    assert_eq!(on(&report.ops, node_ip), [], "adopted as it is");
    assert_eq!(on(&report.ops, second), [], "adopted as it is: no drain");
    assert_eq!(
        on(&report.ops, loopback),
        [
            Op::DeleteRealServer {
                vs: vs(loopback),
                rs: "10.244.1.2:8080".parse().unwrap()
            },
            Op::DeleteVirtualServer(vs(loopback))
        ],
        "loopback is not served: kube-proxy's NodePort there drains"
    );
    assert_eq!(
        engine.planner().node_port_ips(),
        &[node_ip, second].into(),
        "every local address but loopback"
    );
    // A VIP comes up on an interface: served from the next full sync on.
    engine
        .syncer
        .dataplane_mut()
        .other_addresses
        .send_modify(|addresses| {
            addresses.insert(vip);
        });
    tokio::time::advance(engine.planner().config().ipvs.sync_period).await;
    let mut added = Vec::new();
    for _ in 0..3 {
        added.extend(on(&engine.sync().await.unwrap().ops, vip));
    }
    assert!(
        added
            .iter()
            .any(|op| matches!(op, Op::AddVirtualServer(k, _) if *k == vs(vip))),
        "{added:?}"
    );
}

/// A full sync of an engine taking over, with `node`'s leftovers; the engine and the events.
async fn engine_taking_over(
    node: &Arc<FakeNode>,
) -> (Engine<FakeDataplane>, Arc<Events>, SyncReport) {
    let events = Arc::new(Events::default());
    let identity = NodeIdentity {
        name: "n1".into(),
        node_ips: vec![],
    };
    let planner = Planner::new(identity, ProxierConfiguration::default());
    let mut engine = Engine::new(SourceHandle::default(), planner, FakeDataplane::default())
        .observed_by(events.clone())
        .taking_over(fake_takeover(node, false));
    let report = engine.sync().await.unwrap();
    (engine, events, report)
}

/// The engine reads the leftovers with the kubelet version of its Node: unknown (no Node
/// yet) and before 1.28 kubelet owns the shared nat chains, from 1.28 not.
#[tokio::test(start_paused = true)]
async fn the_nodes_kubelet_version_says_who_owns_the_shared_chains() {
    use k8s_openapi::api::core::v1::{Node, NodeStatus, NodeSystemInfo};
    let node = Arc::new(FakeNode::default());
    // Never done: something cannot be read, so every full sync reads again.
    node.leftovers.lock().unwrap().unreadable = vec!["x".into()];
    let (mut engine, _, _) = engine_taking_over(&node).await;
    engine.takeover.as_mut().unwrap().removed().await;
    for version in ["v1.27.3", "v1.28.2"] {
        let mut object = Node::default();
        object.metadata.name = Some("n1".into());
        object.status = Some(NodeStatus {
            node_info: Some(NodeSystemInfo {
                kubelet_version: version.into(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        });
        engine
            .source
            .with_store(|store| store.set_node(Some(object)));
        let period = ProxierConfiguration::default().ipvs.sync_period;
        tokio::time::sleep(period).await;
        engine.sync().await.unwrap();
        engine.takeover.as_mut().unwrap().removed().await;
    }
    assert_eq!(*node.kubelet_chains.lock().unwrap(), [true, true, false]);
}

/// A ruleset that cannot be read leaves the takeover not done, told as a failure (and
/// retried after the next full sync), even when nothing else of kube-proxy's is found;
/// what could be read is removed.
#[tokio::test]
async fn an_unreadable_ruleset_leaves_the_takeover_not_done() {
    let node = Arc::new(FakeNode::default());
    let why = "iptables-legacy-save: exit status 1: Permission denied".to_string();
    node.leftovers.lock().unwrap().unreadable = vec![why.clone()];
    let (mut engine, events, report) = engine_taking_over(&node).await;
    let takeover = engine.takeover.as_mut().unwrap();
    takeover.removed().await;
    assert!(!takeover.done());
    assert_eq!(
        *events.0.lock().unwrap(),
        [TakeoverEvent::RemovalFailed(format!("cannot read {why}"))]
    );
    assert!(node.removals.lock().unwrap().is_empty());
    // Readable again, with kube-proxy's rules: removed, done.
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    let observer: Arc<dyn Observer> = events.clone();
    takeover.after_full_sync(&report, &observer).await;
    takeover.removed().await;
    assert!(takeover.done());
    assert_eq!(*node.removals.lock().unwrap(), [kube_proxy_leftovers()]);
}

/// The removal runs beside the syncs: a sync does not wait for it, a second one is not
/// started while it runs, and one that outlasts [`REMOVAL_DEADLINE`] is a failure, tried
/// again after the next full sync.
#[tokio::test(start_paused = true)]
async fn the_removal_runs_beside_the_syncs_within_a_deadline() {
    let node = Arc::new(FakeNode::default());
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    let hold = Arc::new(tokio::sync::Notify::new());
    *node.hold.lock().unwrap() = Some(hold.clone());
    let (mut engine, events, report) = engine_taking_over(&node).await;
    let observer: Arc<dyn Observer> = events.clone();
    tokio::task::yield_now().await;
    assert_eq!(node.removals.lock().unwrap().len(), 1, "started");
    let takeover = engine.takeover.as_mut().unwrap();
    takeover.after_full_sync(&report, &observer).await;
    tokio::task::yield_now().await;
    assert_eq!(node.removals.lock().unwrap().len(), 1, "one at a time");
    tokio::time::sleep(REMOVAL_DEADLINE + Duration::from_secs(1)).await;
    assert_eq!(
        *events.0.lock().unwrap(),
        [TakeoverEvent::RemovalFailed(
            "not done within 120s (retried after the next full sync)".into()
        )]
    );
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    *node.hold.lock().unwrap() = None;
    takeover.after_full_sync(&report, &observer).await;
    takeover.removed().await;
    assert!(takeover.done());
    assert_eq!(node.removals.lock().unwrap().len(), 2);
}

/// The node-wide kernel settings of a fake kernel that lacks the schedulers in `missing`,
/// recording each write to the kernel: `probe <scheduler>` (the scheduler check adds and
/// deletes a virtual server) and `settings` (sysctls, IPVS timeouts).
#[derive(Clone, Default)]
struct KernelWrites {
    writes: Arc<Mutex<Vec<String>>>,
    missing: Arc<Mutex<BTreeSet<String>>>,
    /// How many settings writes fail (a sysctl error) before they succeed.
    failing: Arc<Mutex<usize>>,
}

impl KernelSettings for KernelWrites {
    fn check<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        let scheduler = config.ipvs.effective_scheduler().to_owned();
        self.writes
            .lock()
            .unwrap()
            .push(format!("probe {scheduler}"));
        if self.missing.lock().unwrap().contains(&scheduler) {
            return Box::pin(async move { Err(SchedulerError::Missing { scheduler }) });
        }
        FakeKernel.check(config)
    }

    fn apply<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SettingsError>> {
        self.writes.lock().unwrap().push("settings".into());
        let mut failing = self.failing.lock().unwrap();
        if *failing > 0 {
            *failing -= 1;
            let e = std::io::Error::other("read-only file system");
            return Box::pin(async move { Err(SettingsError::Sysctl(e)) });
        }
        FakeKernel.apply(config)
    }
}

impl KernelWrites {
    /// The writes so far.
    fn writes(&self) -> Vec<String> {
        self.writes.lock().unwrap().clone()
    }
}

/// An engine following revision `r1` (`service_proxy`) over `kernel`, with the WEB
/// Service's manifests, taking over `node`; the status it publishes, the observers' events,
/// `/livez` and the writes of its kernel settings.
struct Switching {
    engine: Engine<FakeDataplane>,
    status: watch::Receiver<Option<kipvs_crds::NodeProxyConfigStatus>>,
    events: Arc<Events>,
    health: ProxyHealth,
    settings: KernelWrites,
    _manifests: crate::engine::tests::Manifests,
}

impl Switching {
    async fn new(node: &Arc<FakeNode>, kernel: ObservedState, allow: bool) -> Self {
        let r1 = Switching::revision("r1", ServiceProxy::Kipvs);
        let tag = format!("switch-{allow}");
        Switching::starting(&tag, node, kernel, allow, r1, KernelWrites::default()).await
    }

    /// An engine as [`Switching::new`]'s, in manifests named by `tag`, starting on `r1`
    /// with the kernel settings `settings` (the follower's and the takeover's).
    async fn starting(
        tag: &str,
        node: &Arc<FakeNode>,
        kernel: ObservedState,
        allow: bool,
        r1: crate::source::node_config::Assigned,
        settings: KernelWrites,
    ) -> Self {
        use crate::engine::ConfigFollower;
        let m = crate::engine::tests::Manifests::new(
            tag,
            &crate::engine::tests::WEB.replace("READY", "true"),
        );
        m.source.load_into(&m.handle, None).unwrap();
        // What `run` finds assigned: `r1` (nothing assigned after it).
        let (_, assigned) = watch::channel(r1.clone());
        let (report, status) = watch::channel(None);
        let follower = ConfigFollower {
            assigned,
            local: ProxierConfiguration::default(),
            kernel: Box::new(settings.clone()),
            report,
        };
        let identity = NodeIdentity {
            name: "n1".into(),
            node_ips: vec![],
        };
        let health = ProxyHealth::new(Duration::from_secs(60), false);
        let events = Arc::new(Events::default());
        let observers: Vec<Arc<dyn Observer>> = vec![Arc::new(health.clone()), events.clone()];
        let planner = Planner::new(identity, ProxierConfiguration::default());
        let mut takeover = fake_takeover(node, false);
        takeover.allow_connection_changes = allow;
        takeover.settings = Box::new(settings.clone());
        let mut engine = Engine::new(m.handle.clone(), planner, FakeDataplane::new(kernel))
            .observed_by(Arc::new(observers))
            .taking_over(takeover)
            .following(follower);
        engine.apply_assigned(r1).await;
        Switching {
            engine,
            status,
            events,
            health,
            settings,
            _manifests: m,
        }
    }

    fn revision(name: &str, proxy: ServiceProxy) -> crate::source::node_config::Assigned {
        let config = ProxierConfiguration {
            service_proxy: proxy,
            ..ProxierConfiguration::default()
        };
        Switching::assigned(name, config)
    }

    /// Revision `name` of `config`.
    fn assigned(name: &str, config: ProxierConfiguration) -> crate::source::node_config::Assigned {
        crate::source::node_config::Assigned::Revision {
            revision: name.into(),
            config: Box::new(config),
            ignored: vec![],
        }
    }

    /// Revision `name`: `serviceProxy: kipvs` with the IPVS scheduler `scheduler`.
    fn scheduling(name: &str, scheduler: &str) -> crate::source::node_config::Assigned {
        let mut config = ProxierConfiguration::default();
        config.ipvs.scheduler = scheduler.into();
        Switching::assigned(name, config)
    }

    /// The published status's revision.
    fn observed_revision(&self) -> String {
        let status = self.status.borrow().clone().expect("a status");
        status.observed_revision.unwrap_or_default()
    }

    /// The schedulers of the programmed virtual servers.
    fn schedulers(&self) -> Vec<String> {
        let table = &self.engine.dataplane().state.virtual_servers;
        table
            .values()
            .map(|vs| vs.spec.scheduler.to_string())
            .collect()
    }

    /// One turn of [`Engine::run`]'s loop: the switch, then a sync if it programs.
    /// Whether it synced.
    /// kube-proxy stops on `node`: the switch sees it gone (a debounce begins) and the
    /// clock goes [`state::DEBOUNCE`] on, so that the next decision takes the node over.
    async fn stop_kube_proxy(&mut self, node: &FakeNode) {
        *node.running.lock().unwrap() = None;
        let debounce = self.engine.switch().await;
        assert_eq!(
            debounce,
            Some(STANDBY_CHECK),
            "kube-proxy gone: the debounce"
        );
        let (_, proxy, _, message) = self.standing();
        assert_eq!(proxy, Some(ServiceProxyPhase::Standby));
        assert!(
            message.contains("gone from this node since 0s"),
            "{message}"
        );
        tokio::time::advance(state::DEBOUNCE).await;
    }

    async fn turn(&mut self) -> bool {
        if self.engine.switch().await.is_some() {
            return false;
        }
        self.engine.sync().await.unwrap();
        true
    }

    /// (phase, serviceProxy, healthy, message) of the published status.
    fn standing(&self) -> (NodePhase, Option<ServiceProxyPhase>, Option<bool>, String) {
        let s = self.status.borrow().clone().expect("a status");
        (
            s.phase.unwrap(),
            s.service_proxy,
            s.healthy,
            s.message.unwrap_or_default(),
        )
    }

    fn applied(&self) -> usize {
        self.engine.dataplane().applied.len()
    }

    fn ports(&self) -> bool {
        *self.engine.takeover.as_ref().unwrap().ports.borrow()
    }
}

use crate::model::ObservedState;
use kipvs_crds::nodeproxyconfig::NodePhase;

/// Standby while kube-proxy runs: nothing written, the ports left to kube-proxy, `/livez`
/// healthy, the revision Pending with why; then TakingOver (first sync, Applied), then
/// Programming once kube-proxy's leftovers are gone. kube-proxy coming back stops every
/// write within [`BACK_CHECK`], reported unhealthy with why, and once it has stopped again
/// the node is taken over again.
#[tokio::test(start_paused = true)]
async fn standby_takeover_and_kube_proxy_coming_back() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    *node.running.lock().unwrap() = Some("process kube-proxy (pid [7])".into());
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    let mut s = Switching::new(&node, ObservedState::default(), false).await;
    s.health.queued_update();
    for _ in 0..100 {
        assert!(!s.turn().await);
        tokio::time::advance(STANDBY_CHECK).await;
    }
    assert_eq!(s.applied(), 0, "nothing written in standby");
    assert!(!s.ports());
    assert!(s.health.live(), "standby is not stale");
    let (phase, proxy, healthy, message) = s.standing();
    assert_eq!(
        (phase, proxy, healthy),
        (NodePhase::Pending, Some(Standby), None)
    );
    assert!(message.contains("pid [7]"), "{message}");

    s.stop_kube_proxy(&node).await;
    assert!(s.turn().await, "kube-proxy stopped: the switch syncs");
    assert!(s.ports());
    assert_eq!(s.standing().0, NodePhase::Applied);
    assert_eq!(s.standing().1, Some(TakingOver));
    s.engine.takeover.as_mut().unwrap().removed().await;
    assert!(s.turn().await);
    assert_eq!(s.standing().1, Some(Programming));
    assert_eq!(*node.removals.lock().unwrap(), [kube_proxy_leftovers()]);

    // kube-proxy is back (its KUBE-SERVICES chain): no write after the next check.
    *node.back.lock().unwrap() = Some("its KUBE-SERVICES chain is in iptables-legacy nat".into());
    tokio::time::advance(BACK_CHECK).await;
    let written = s.applied();
    assert!(!s.turn().await);
    let (phase, proxy, healthy, message) = s.standing();
    assert_eq!(
        (phase, proxy, healthy),
        (NodePhase::Applied, Some(Standby), Some(false))
    );
    assert!(message.contains("kube-proxy is back") && message.contains("KUBE-SERVICES"));
    assert!(!s.ports(), "kube-proxy's ports released");
    assert!(
        s.events
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, TakeoverEvent::KubeProxyBack(_)))
    );
    // While it runs: still nothing written, still unhealthy.
    *node.running.lock().unwrap() = Some("kube-proxy's /healthz answers".into());
    for _ in 0..10 {
        assert!(!s.turn().await);
        tokio::time::advance(STANDBY_CHECK).await;
    }
    assert_eq!(s.applied(), written);
    assert_eq!(s.standing().2, Some(false));
    assert!(
        !s.engine.takeover.as_ref().unwrap().cleared,
        "not before it synced"
    );
    // It has synced: inet kipvs is deleted (once), which the status says.
    *node.synced.lock().unwrap() = Some(true);
    assert!(!s.turn().await);
    assert!(s.engine.takeover.as_ref().unwrap().cleared);
    let (_, proxy, healthy, message) = s.standing();
    assert_eq!((proxy, healthy), (Some(Standby), Some(false)));
    assert!(message.ends_with(KIPVS_RULES_DELETED), "{message}");
    assert!(!s.turn().await);
    assert_eq!(s.standing().3.matches(KIPVS_RULES_DELETED).count(), 1);
    // It stops again: taken over again after the debounce (its rules removed again).
    *node.back.lock().unwrap() = None;
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    s.stop_kube_proxy(&node).await;
    assert!(s.turn().await);
    assert_eq!(s.standing().1, Some(TakingOver));
    assert_eq!(s.standing().2, None, "the proxier's own verdict again");
    s.engine.takeover.as_mut().unwrap().removed().await;
    assert_eq!(node.removals.lock().unwrap().len(), 2);
}

/// Drives `run` ([`Engine::run`]'s loop, which ends only on shutdown) until `status` reports
/// `serviceProxy` `proxy`, for at most `limit`: how long it took (`None`: not within `limit`).
async fn run_until(
    run: &mut std::pin::Pin<Box<impl Future<Output = ()>>>,
    status: &mut watch::Receiver<Option<kipvs_crds::NodeProxyConfigStatus>>,
    proxy: ServiceProxyPhase,
    limit: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let reached = status.wait_for(|s| s.as_ref().and_then(|s| s.service_proxy) == Some(proxy));
    tokio::select! {
        _ = run => unreachable!("run ends only on shutdown"),
        reached = tokio::time::timeout(limit, reached) => reached.ok().map(|_| start.elapsed()),
    }
}

/// On a quiet node (no source change, no drain) `run` moves from TakingOver to Programming
/// as soon as the removal of kube-proxy's leftovers ends, not at the next periodic sync
/// (`ipvs.syncPeriod` later).
#[tokio::test(start_paused = true)]
async fn a_quiet_takeover_is_done_when_the_removal_ends() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    *node.running.lock().unwrap() = Some("process kube-proxy (pid [7])".into());
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    let hold = Arc::new(tokio::sync::Notify::new());
    *node.hold.lock().unwrap() = Some(hold.clone());
    let mut s = Switching::new(&node, ObservedState::default(), false).await;
    let Switching { engine, status, .. } = &mut s;
    let mut run = Box::pin(engine.run(std::future::pending()));
    let second = Duration::from_secs(1);
    let sync_period = ProxierConfiguration::default().ipvs.sync_period;
    assert!(
        STANDBY_CHECK + 4 * second < sync_period,
        "no periodic sync in this test"
    );
    assert!(run_until(&mut run, status, Standby, second).await.is_some());
    *node.running.lock().unwrap() = None;
    let debounce = state::DEBOUNCE + STANDBY_CHECK + second;
    let taking_over = run_until(&mut run, status, TakingOver, debounce).await;
    assert!(taking_over.is_some(), "kube-proxy stopped: taken over");
    // The removal runs (held): TakingOver meanwhile.
    assert_eq!(
        run_until(&mut run, status, Programming, 3 * second).await,
        None
    );
    assert_eq!(node.removals.lock().unwrap().len(), 1);
    hold.notify_one();
    let done = run_until(&mut run, status, Programming, second / 10).await;
    assert_eq!(
        done,
        Some(Duration::ZERO),
        "Programming once the removal ends"
    );
}

/// On a quiet node `run` looks for kube-proxy every [`BACK_CHECK`] between syncs: one that
/// comes back is seen within [`BACK_CHECK`], not at the next periodic sync; the looks force
/// no full sync.
#[tokio::test(start_paused = true)]
async fn kube_proxy_back_on_a_quiet_node_is_seen_within_back_check() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    let mut s = Switching::new(&node, ObservedState::default(), false).await;
    let Switching { engine, status, .. } = &mut s;
    let mut run = Box::pin(engine.run(std::future::pending()));
    let second = Duration::from_secs(1);
    let sync_period = ProxierConfiguration::default().ipvs.sync_period;
    assert!(
        2 * second + BACK_CHECK < sync_period,
        "no periodic sync in this test"
    );
    let programming = run_until(&mut run, status, Programming, second).await;
    assert_eq!(
        programming,
        Some(Duration::ZERO),
        "kube-proxy never ran here"
    );
    assert_eq!(run_until(&mut run, status, Standby, 2 * second).await, None);
    *node.running.lock().unwrap() = Some("kube-proxy's /healthz answers".into());
    let seen = run_until(&mut run, status, Standby, BACK_CHECK).await;
    assert!(seen.is_some(), "seen within BACK_CHECK");
    drop(run);
    let (_, _, healthy, message) = s.standing();
    assert_eq!(healthy, Some(false));
    assert!(message.contains("kube-proxy is back"), "{message}");
    assert_eq!(
        s.engine.dataplane().full_observes,
        1,
        "the first sync's alone"
    );
}

/// A kernel table as kube-proxy left it: the WEB Service's ClusterIP virtual server with
/// a real server kipvs does not want, carrying connections.
fn kube_proxys_table() -> ObservedState {
    use crate::model::{ObservedRealServer, ObservedVirtualServer, VirtualServerSpec};
    let mut kernel = ObservedState::default();
    let rs = |active| ObservedRealServer {
        weight: 1,
        active_connections: active,
        inactive_connections: 0,
    };
    let vs = ObservedVirtualServer {
        spec: VirtualServerSpec {
            scheduler: "rr".into(),
            persistence_timeout: None,
            sched_flags: Default::default(),
        },
        real_servers: [
            ("10.244.1.2:8080".parse().unwrap(), rs(1)),
            ("10.244.9.9:8080".parse().unwrap(), rs(4)),
        ]
        .into(),
    };
    let key = VirtualServerKey {
        address: "10.96.0.20".parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    kernel.virtual_servers.insert(key, vs);
    kernel.bound_addresses.insert(key.address);
    kernel
}

/// `run`'s own switch is gated by the preview: a switch that would take a real server
/// carrying connections out stays in standby, Failed with the preview's reason, and
/// writes nothing; with --allow-connection-changes it goes ahead.
#[tokio::test(start_paused = true)]
async fn a_switch_touching_connections_is_refused_unless_allowed() {
    use ServiceProxyPhase::*;
    for allow in [false, true] {
        let node = Arc::new(FakeNode::default());
        *node.running.lock().unwrap() = Some("process kube-proxy".into());
        let mut s = Switching::new(&node, kube_proxys_table(), allow).await;
        assert!(!s.turn().await);
        s.stop_kube_proxy(&node).await;
        if allow {
            assert!(s.turn().await);
            assert_eq!(s.standing().1, Some(TakingOver));
            continue;
        }
        for _ in 0..20 {
            assert!(!s.turn().await);
            tokio::time::advance(STANDBY_CHECK).await;
        }
        assert_eq!(s.applied(), 0);
        let (phase, proxy, _, message) = s.standing();
        assert_eq!((phase, proxy), (NodePhase::Failed, Some(Standby)));
        assert!(
            message.starts_with("1 operations of the switch would"),
            "{message}"
        );
        assert!(message.contains("10.244.9.9:8080"), "{message}");
        // Its connections end: the switch goes ahead at the next look.
        let key = *s
            .engine
            .dataplane()
            .state
            .virtual_servers
            .keys()
            .next()
            .unwrap();
        let vs = s
            .engine
            .syncer
            .dataplane_mut()
            .state
            .virtual_servers
            .get_mut(&key)
            .unwrap();
        for rs in vs.real_servers.values_mut() {
            rs.active_connections = 0;
        }
        tokio::time::advance(GATE_CHECK).await;
        assert!(s.turn().await);
        assert_eq!(s.standing().0, NodePhase::Applied);
    }
}

/// An iptables-mode kube-proxy: the switch is refused (`Failed`, standby) while it runs (its
/// `/proxyMode`), after it stopped (its chains), and still once its chains are gone too
/// (`kube-proxy --cleanup`, a reboot of iptables): nothing of kube-proxy is left to read its
/// mode from, and without the mode seen earlier the switch went ahead past the debounce,
/// although its `Failed` status had told the operator to keep kube-proxy there. Another
/// revision is judged afresh.
#[tokio::test(start_paused = true)]
async fn a_switch_refused_for_kube_proxys_mode_stays_refused_once_its_state_is_gone() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    let set = |running: Option<&str>, state: Option<&str>, mode: Option<&str>| {
        *node.running.lock().unwrap() = running.map(str::to_owned);
        *node.back.lock().unwrap() = state.map(str::to_owned);
        *node.mode.lock().unwrap() = mode.map(|m| (Mode::Iptables, m.to_owned()));
    };
    let proxy_mode = "its /proxyMode on 127.0.0.1:10249";
    set(Some("process kube-proxy"), None, Some(proxy_mode));
    let mut s = Switching::new(&node, ObservedState::default(), false).await;
    let refused = |s: &Switching, from: &str| {
        let (phase, proxy, _, message) = s.standing();
        assert_eq!((phase, proxy), (NodePhase::Failed, Some(Standby)), "{from}");
        assert!(
            message.contains("runs in iptables mode here") && message.contains(from),
            "{message}"
        );
        assert_eq!(s.applied(), 0, "{from}: nothing written");
    };
    assert!(!s.turn().await);
    refused(&s, proxy_mode);
    let chains = "its KUBE-NODEPORTS chain";
    set(None, Some(chains), Some(chains));
    for _ in 0..10 {
        assert!(!s.turn().await);
        tokio::time::advance(STANDBY_CHECK).await;
    }
    refused(&s, chains);
    set(None, None, None);
    for _ in 0..10 {
        assert!(
            !s.turn().await,
            "past the debounce, nothing of kube-proxy left"
        );
        tokio::time::advance(STANDBY_CHECK).await;
    }
    refused(&s, "seen earlier; nothing of it is left now");
    s.engine
        .apply_assigned(Switching::revision("r2", ServiceProxy::Kipvs))
        .await;
    assert!(
        s.turn().await,
        "another revision: nothing says iptables mode"
    );
    assert_eq!(s.standing().1, Some(TakingOver));
}

/// `serviceProxy: kube-proxy`: one last sync, then nothing written and the ports released
/// (HandingBack, Pending); once kube-proxy's metrics say it synced, `inet kipvs` goes and the
/// revision is Applied with kube-proxy's health (HandedBack). Back to `kipvs`: standby while
/// kube-proxy runs, then a takeover again.
#[tokio::test(start_paused = true)]
async fn a_handback_then_a_takeover_again() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    let mut s = Switching::new(&node, ObservedState::default(), false).await;
    assert!(s.turn().await);
    s.engine.takeover.as_mut().unwrap().removed().await;
    assert!(s.turn().await);
    assert_eq!(s.standing().1, Some(Programming));
    let weights = s.engine.dataplane().state.virtual_servers.clone();
    assert!(!s.engine.dataplane().state.set_elements.is_empty());

    s.engine
        .apply_assigned(Switching::revision("r2", ServiceProxy::KubeProxy))
        .await;
    assert!(!s.turn().await);
    assert_eq!(s.standing().1, Some(HandingBack));
    assert_eq!(s.standing().0, NodePhase::Pending);
    assert!(!s.ports(), "healthz and metrics released for kube-proxy");
    let written = s.applied();
    assert_eq!(
        s.engine.dataplane().state.virtual_servers,
        weights,
        "weights as planned"
    );
    for _ in 0..10 {
        assert!(!s.turn().await);
        tokio::time::advance(STANDBY_CHECK).await;
    }
    assert_eq!(s.applied(), written, "nothing written while handing back");
    // kube-proxy runs and has synced.
    *node.running.lock().unwrap() = Some("kube-proxy's /healthz answers".into());
    *node.synced.lock().unwrap() = Some(true);
    assert!(!s.turn().await);
    let (phase, proxy, healthy, _) = s.standing();
    assert_eq!(
        (phase, proxy, healthy),
        (NodePhase::Applied, Some(HandedBack), Some(true))
    );
    assert!(
        s.engine.dataplane().state.set_elements.is_empty(),
        "inet kipvs deleted"
    );
    assert_eq!(
        s.engine.dataplane().state.virtual_servers,
        weights,
        "kube-proxy's now"
    );
    *node.synced.lock().unwrap() = Some(false);
    assert!(!s.turn().await);
    assert_eq!(s.standing().2, Some(false), "kube-proxy's health");

    s.engine
        .apply_assigned(Switching::revision("r3", ServiceProxy::Kipvs))
        .await;
    assert!(!s.turn().await);
    assert_eq!(s.standing().1, Some(Standby));
    s.stop_kube_proxy(&node).await;
    assert!(
        s.turn().await,
        "kube-proxy left: the same table is adopted again"
    );
    let (phase, proxy, _, _) = s.standing();
    assert_eq!((phase, proxy), (NodePhase::Applied, Some(TakingOver)));
}

/// Issue 26 item 2: in standby nothing is written to the kernel, also when revisions are
/// assigned meanwhile: no scheduler probe, no sysctl, no IPVS timeout. A revision that is
/// not valid is still rejected with the reason; a valid one is put in force (Pending), and
/// the kernel admits it when kube-proxy has stopped, before the first sync. A revision
/// assigned while the proxier programs is admitted at once, as always.
#[tokio::test(start_paused = true)]
async fn nothing_is_written_to_the_kernel_in_standby() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    *node.running.lock().unwrap() = Some("process kube-proxy (pid [7])".into());
    let r1 = Switching::revision("r1", ServiceProxy::Kipvs);
    let kernel = ObservedState::default();
    let settings = KernelWrites::default();
    let mut s = Switching::starting("standby-writes", &node, kernel, false, r1, settings).await;
    for _ in 0..5 {
        assert!(!s.turn().await);
        tokio::time::advance(STANDBY_CHECK).await;
    }
    let mut invalid = ProxierConfiguration::default();
    invalid.ipvs.sync_period = Duration::ZERO;
    s.engine
        .apply_assigned(Switching::assigned("r2", invalid))
        .await;
    let (phase, proxy, _, message) = s.standing();
    assert_eq!((phase, proxy), (NodePhase::Failed, Some(Standby)));
    assert_eq!(s.observed_revision(), "r2");
    assert!(message.contains("ipvs.syncPeriod"), "{message}");
    s.engine
        .apply_assigned(Switching::scheduling("r3", "wrr"))
        .await;
    for _ in 0..5 {
        assert!(!s.turn().await);
        tokio::time::advance(STANDBY_CHECK).await;
    }
    let writes = s.settings.writes();
    assert!(writes.is_empty(), "no kernel write in standby: {writes:?}");
    assert_eq!(
        s.applied(),
        0,
        "no IPVS, address or nftables write in standby"
    );
    let (phase, proxy, _, _) = s.standing();
    assert_eq!((phase, proxy), (NodePhase::Pending, Some(Standby)));
    assert_eq!(s.observed_revision(), "r3");

    // kube-proxy stops: the switch probes r3's scheduler and makes its settings, then the
    // first sync programs with it.
    s.stop_kube_proxy(&node).await;
    assert_eq!(s.engine.switch().await, None);
    assert_eq!(s.settings.writes(), ["probe wrr", "settings"]);
    assert_eq!(s.applied(), 0, "the kernel admits r3 before the first sync");
    s.engine.sync().await.unwrap();
    assert_eq!(s.schedulers(), ["wrr"]);
    let (phase, proxy, _, _) = s.standing();
    assert_eq!((phase, proxy), (NodePhase::Applied, Some(TakingOver)));
    assert_eq!(s.observed_revision(), "r3");

    // Programming: a new revision is admitted at once.
    s.engine
        .apply_assigned(Switching::scheduling("r4", "lc"))
        .await;
    let writes = s.settings.writes();
    assert_eq!(writes[2..], ["probe lc", "settings"]);
}

/// A revision put in force in standby whose scheduler the kernel lacks is found at the
/// switch: reported `Failed` with the reason, never programmed; the revision in force
/// before it is put back in force and programmed, as when such a revision is assigned to
/// a proxier that programs. The operator's rollback to it is `Applied`.
#[tokio::test(start_paused = true)]
async fn a_scheduler_the_kernel_lacks_at_the_switch_is_reported_not_programmed() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    *node.running.lock().unwrap() = Some("process kube-proxy (pid [7])".into());
    let r1 = Switching::revision("r1", ServiceProxy::Kipvs);
    let kernel = ObservedState::default();
    let settings = KernelWrites::default();
    settings.missing.lock().unwrap().insert("mh".into());
    let mut s = Switching::starting("switch-mh", &node, kernel, false, r1, settings).await;
    assert!(!s.turn().await);
    s.engine
        .apply_assigned(Switching::scheduling("r2", "mh"))
        .await;
    assert!(!s.turn().await);
    let writes = s.settings.writes();
    assert!(writes.is_empty(), "no kernel write in standby: {writes:?}");
    assert_eq!(
        (s.standing().0, s.observed_revision()),
        (NodePhase::Pending, "r2".into())
    );

    s.stop_kube_proxy(&node).await;
    assert_eq!(
        s.engine.switch().await,
        Some(Duration::ZERO),
        "decided again"
    );
    assert_eq!(s.settings.writes(), ["probe mh"]);
    assert_eq!(s.applied(), 0);
    let (phase, _, _, message) = s.standing();
    assert_eq!(
        (phase, s.observed_revision()),
        (NodePhase::Failed, "r2".into())
    );
    assert_eq!(
        message,
        "IPVS scheduler \"mh\" is not available: the kernel lacks ip_vs_mh"
    );
    assert_eq!(
        s.engine.planner().config().ipvs.scheduler,
        "",
        "r1 in force"
    );
    assert!(s.turn().await, "the switch goes ahead with r1");
    assert_eq!(s.settings.writes(), ["probe mh", "settings"]);
    assert_eq!(s.schedulers(), ["rr"]);
    assert_eq!(s.standing().0, NodePhase::Failed, "r2 stays reported");
    assert_eq!(s.standing().1, None, "the status is r2's, not r1's");

    s.engine
        .apply_assigned(Switching::revision("r1", ServiceProxy::Kipvs))
        .await;
    s.engine.takeover.as_mut().unwrap().removed().await;
    assert!(s.turn().await);
    assert_eq!(s.observed_revision(), "r1");
    let (phase, proxy, _, _) = s.standing();
    assert_eq!((phase, proxy), (NodePhase::Applied, Some(Programming)));
}

/// A kernel error at the switch that a later attempt may not meet (a sysctl write fails)
/// is not a refusal: the revision admitted in standby stays in force and `Pending`, the
/// switch is tried again at the next look and goes ahead with it once the kernel takes it.
#[tokio::test(start_paused = true)]
async fn a_passing_kernel_error_at_the_switch_is_tried_again_not_refused() {
    use ServiceProxyPhase::*;
    let node = Arc::new(FakeNode::default());
    *node.running.lock().unwrap() = Some("process kube-proxy (pid [7])".into());
    let r1 = Switching::revision("r1", ServiceProxy::Kipvs);
    let settings = KernelWrites::default();
    *settings.failing.lock().unwrap() = 1;
    let kernel = ObservedState::default();
    let mut s = Switching::starting("switch-sysctl", &node, kernel, false, r1, settings).await;
    assert!(!s.turn().await);
    s.engine
        .apply_assigned(Switching::scheduling("r2", "wrr"))
        .await;
    assert!(!s.turn().await);
    assert!(s.settings.writes().is_empty(), "no kernel write in standby");

    s.stop_kube_proxy(&node).await;
    assert_eq!(s.engine.switch().await, Some(STANDBY_CHECK), "tried again");
    assert_eq!(s.settings.writes(), ["probe wrr", "settings"]);
    assert_eq!(s.applied(), 0, "nothing programmed");
    assert_eq!(
        (s.standing().0, s.observed_revision()),
        (NodePhase::Pending, "r2".into()),
        "not Failed"
    );
    assert_eq!(
        s.engine.planner().config().ipvs.scheduler,
        "wrr",
        "r2 in force"
    );

    tokio::time::advance(STANDBY_CHECK).await;
    assert!(s.turn().await, "the switch goes ahead with r2");
    assert_eq!(
        s.settings.writes(),
        ["probe wrr", "settings", "probe wrr", "settings"]
    );
    assert_eq!(s.schedulers(), ["wrr"]);
    s.engine.takeover.as_mut().unwrap().removed().await;
    assert!(s.turn().await);
    let (phase, proxy, _, _) = s.standing();
    assert_eq!((phase, proxy), (NodePhase::Applied, Some(Programming)));
    assert_eq!(s.observed_revision(), "r2");
}

/// A proxier that restarts where kube-proxy does not run admits its revision before it
/// writes anything else, as without a takeover: the scheduler is probed and the settings
/// made; a scheduler the kernel lacks leaves the previous (local) configuration in force and
/// the revision `Failed`. Without a takeover (`--kube-proxy-takeover=false`) the revision is
/// admitted as it is assigned.
#[tokio::test(start_paused = true)]
async fn a_restart_that_programs_admits_its_revision_as_before() {
    use ServiceProxyPhase::*;
    for (scheduler, lacks) in [("wrr", false), ("mh", true)] {
        let node = Arc::new(FakeNode::default());
        let r1 = Switching::scheduling("r1", scheduler);
        let settings = KernelWrites::default();
        if lacks {
            settings.missing.lock().unwrap().insert(scheduler.into());
        }
        let tag = format!("restart-{scheduler}");
        let kernel = ObservedState::default();
        let mut s = Switching::starting(&tag, &node, kernel, false, r1, settings).await;
        assert_eq!(s.engine.switch().await.is_some(), lacks);
        let probe = format!("probe {scheduler}");
        let admitted = match lacks {
            false => vec![probe, "settings".into()],
            true => vec![probe],
        };
        assert_eq!(s.settings.writes(), admitted);
        assert_eq!(s.applied(), 0);
        if lacks {
            assert_eq!(s.standing().0, NodePhase::Failed);
            assert!(s.turn().await);
            assert_eq!(s.schedulers(), ["rr"], "the local configuration");
            assert_eq!(s.settings.writes()[1..], ["settings"]);
            assert_eq!(s.standing().0, NodePhase::Failed);
        } else {
            s.engine.sync().await.unwrap();
            assert_eq!(s.schedulers(), [scheduler]);
            let (phase, proxy, _, _) = s.standing();
            assert_eq!((phase, proxy), (NodePhase::Applied, Some(Programming)));
        }
    }

    // Without a takeover: admitted as assigned, a refusal reported at once.
    use crate::engine::ConfigFollower;
    use crate::source::node_config::Assigned;
    let m = crate::engine::tests::Manifests::new(
        "no-takeover-admission",
        &crate::engine::tests::WEB.replace("READY", "true"),
    );
    let settings = KernelWrites::default();
    settings.missing.lock().unwrap().insert("mh".into());
    let (_, assigned) = watch::channel(Assigned::Unknown);
    let (report, status) = watch::channel(None);
    let follower = ConfigFollower {
        assigned,
        local: ProxierConfiguration::default(),
        kernel: Box::new(settings.clone()),
        report,
    };
    let identity = NodeIdentity {
        name: "n1".into(),
        node_ips: vec![],
    };
    let planner = Planner::new(identity, ProxierConfiguration::default());
    let mut engine =
        Engine::new(m.handle.clone(), planner, FakeDataplane::default()).following(follower);
    engine
        .apply_assigned(Switching::scheduling("r1", "mh"))
        .await;
    assert_eq!(settings.writes(), ["probe mh"]);
    let failed = status.borrow().clone().unwrap();
    assert_eq!(failed.phase, Some(NodePhase::Failed));
    engine
        .apply_assigned(Switching::scheduling("r2", "wrr"))
        .await;
    assert_eq!(settings.writes(), ["probe mh", "probe wrr", "settings"]);
    assert_eq!(engine.planner().config().ipvs.scheduler, "wrr");
}

/// A restart after a takeover whose drain of kube-proxy's NodePorts on other local
/// addresses was under way: the drain goes on (the virtual server goes once idle) instead of
/// staying at weight 0 for good; a virtual server there at weight 1 (another program's) is
/// left alone.
#[tokio::test]
async fn a_drain_of_kube_proxys_node_ports_goes_on_after_a_restart() {
    use crate::engine::tests::{Manifests, WEB};
    use crate::model::{ObservedRealServer, ObservedVirtualServer, VirtualServerSpec};
    let node_port = WEB
        .replace("READY", "true")
        .replace(
            "clusterIP: 10.96.0.20",
            "type: NodePort\n  clusterIP: 10.96.0.20",
        )
        .replace("targetPort: 8080}", "targetPort: 8080, nodePort: 30080}");
    let node_ip: IpAddr = "192.168.1.5".parse().unwrap();
    let other: IpAddr = "172.17.0.1".parse().unwrap();
    let key = VirtualServerKey {
        address: other,
        port: 30080,
        protocol: Protocol::Tcp,
    };
    for (weight, drained) in [(0, true), (1, false)] {
        let m = Manifests::new(&format!("kp-restart-{weight}"), &node_port);
        m.source.load_into(&m.handle, None).unwrap();
        let mut kernel = ObservedState::default();
        let rs = ObservedRealServer {
            weight,
            active_connections: 1,
            inactive_connections: 0,
        };
        let vs = ObservedVirtualServer {
            spec: VirtualServerSpec {
                scheduler: "rr".into(),
                persistence_timeout: None,
                sched_flags: Default::default(),
            },
            real_servers: [("10.244.1.2:8080".parse().unwrap(), rs)].into(),
        };
        kernel.virtual_servers.insert(key, vs);
        let dataplane = FakeDataplane::new(kernel);
        dataplane
            .other_addresses
            .send_replace([node_ip, other].into());
        let identity = NodeIdentity {
            name: "n1".into(),
            node_ips: vec![node_ip],
        };
        let planner = Planner::new(identity, ProxierConfiguration::default());
        let node = Arc::new(FakeNode::default());
        let mut engine = Engine::new(m.handle.clone(), planner, dataplane)
            .taking_over(fake_takeover(&node, false));
        assert_eq!(engine.switch().await, None);
        engine.sync().await.unwrap();
        // The first sync waits for nothing; the one after it is full when a drain was
        // interrupted.
        assert_eq!(engine.switch().await, None);
        engine.sync().await.unwrap();
        assert_eq!(engine.takeover.as_ref().unwrap().found, drained);
        let draining = engine.syncer().drains().keys().any(|(vs, _)| *vs == key);
        assert_eq!(draining, drained, "weight {weight}");
        // Its last connection ends: the drained virtual server goes.
        let state = &mut engine.syncer.dataplane_mut().state;
        for rs in state
            .virtual_servers
            .get_mut(&key)
            .unwrap()
            .real_servers
            .values_mut()
        {
            rs.active_connections = 0;
        }
        engine.check_drains().await.unwrap();
        let present = engine.dataplane().state.virtual_servers.contains_key(&key);
        assert_eq!(present, !drained, "weight {weight}");
    }
}

/// The engine removes kube-proxy's leftovers after its first full sync (kipvs's rules are
/// written in it), once; not after a sync whose rules could not be written.
#[tokio::test]
async fn the_first_full_sync_with_kipvs_rules_in_place_removes_kube_proxys_rules() {
    let node = Arc::new(FakeNode::default());
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    let events = Arc::new(Events::default());
    let identity = NodeIdentity {
        name: "n1".into(),
        node_ips: vec![],
    };
    let handle = SourceHandle::default();
    let planner = Planner::new(identity, ProxierConfiguration::default());
    let mut engine = Engine::new(handle, planner, FakeDataplane::default())
        .observed_by(events.clone())
        .taking_over(fake_takeover(&node, false));
    let report = engine.sync().await.unwrap();
    assert!(matches!(report.ops[0], Op::WriteRules(_)));
    engine.takeover.as_mut().unwrap().removed().await;
    assert_eq!(*node.removals.lock().unwrap(), [kube_proxy_leftovers()]);
    assert_eq!(
        *events.0.lock().unwrap(),
        [TakeoverEvent::Removed {
            rules: 1,
            chains: 1,
            sets: 1
        }]
    );
    assert!(engine.takeover.as_ref().unwrap().done());

    // A sync whose rules failed leaves kube-proxy's rules in place.
    let mut takeover = fake_takeover(&node, false);
    *node.leftovers.lock().unwrap() = kube_proxy_leftovers();
    let failed = SyncReport {
        ops: vec![],
        failures: vec![OpFailure {
            op: Op::WriteRules(Default::default()),
            error: DataplaneError::NftTransaction("refused".into()),
        }],
        duration: Duration::ZERO,
        conntrack: Default::default(),
    };
    let observer: Arc<dyn Observer> = events.clone();
    takeover.after_full_sync(&failed, &observer).await;
    assert!(!takeover.done());
    assert_eq!(node.removals.lock().unwrap().len(), 1);
}
