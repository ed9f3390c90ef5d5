//! Taking a node over from kube-proxy's IPVS mode (see README, "Moving from kube-proxy"):
//!
//! 1. [`standby`]: while kube-proxy runs on the node ([`KubeProxyNode::running`]), the proxier
//!    waits with its sources listing and watching, its servers up and nothing written to the
//!    kernel; it says so in the log, `kipvs_standby` and `/livez` (healthy: waiting is not a
//!    fault, and the kubelet must not restart it).
//! 2. The first full sync adopts kube-proxy's table as a restart adopts kipvs's own: what is
//!    wanted is kept or edited in place (`dataplane::diff`), kube-proxy's NodePort virtual
//!    servers on addresses that are not node IPs drain ([`Ownership::drains`]).
//! 3. [`Takeover::after_full_sync`]: once a full sync has put `inet kipvs` in place (its rules
//!    written or already there), kube-proxy's iptables jumps, chains and ipsets are removed
//!    ([`crate::plan::kube_proxy`] says which), in a task of its own. Until then kube-proxy's
//!    rules keep masquerading and filtering as they did; after, kipvs's do.
//!
//! [`Ownership::drains`]: crate::dataplane::diff::Ownership::drains

use super::observer::{Observer, TakeoverEvent};
use super::syncer::SyncReport;
use crate::dataplane::Op;
use crate::dataplane::kube_proxy::KubeProxyNode;
use crate::model::{DesiredState, Protocol, VirtualServerKey};
use crate::plan::kube_proxy::kubelet_creates_shared_chains;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often [`standby`] asks whether kube-proxy still runs.
pub const STANDBY_CHECK: Duration = Duration::from_secs(2);

/// Waits while kube-proxy runs on the node, telling `observer` ([`TakeoverEvent::Standby`],
/// then [`TakeoverEvent::Programming`]). Returns whether kube-proxy ran (it was waited for),
/// `None` when `shutdown` came first.
pub async fn standby(
    node: &dyn KubeProxyNode,
    observer: &dyn Observer,
    shutdown: impl Future<Output = ()>,
) -> Option<bool> {
    tokio::pin!(shutdown);
    let mut waited = false;
    while let Some(why) = node.running().await {
        if !waited {
            tracing::info!(
                "standby: kube-proxy runs on this node ({why}); nothing is programmed until it \
                 has stopped"
            );
            observer.takeover(&TakeoverEvent::Standby(why));
            waited = true;
        }
        tokio::select! {
            _ = &mut shutdown => return None,
            _ = tokio::time::sleep(STANDBY_CHECK) => {}
        }
    }
    if waited {
        tracing::info!("kube-proxy has stopped: taking the node over");
    }
    observer.takeover(&TakeoverEvent::Programming);
    Some(waited)
}

/// The NodePorts (port, protocol) whose virtual servers on other local addresses than the node
/// IPs are kube-proxy's and drain ([`Ownership::kube_proxy_node_ports`]): those of the desired
/// virtual servers on `node_ips` (kube-proxy programmed each NodePort on every local address),
/// and those of the virtual servers that already drain on other addresses (so that a drain
/// begun goes on after its Service is deleted). Cost: O(desired virtual servers).
///
/// [`Ownership::kube_proxy_node_ports`]: crate::dataplane::diff::Ownership::kube_proxy_node_ports
pub fn kube_proxy_node_ports(
    desired: &DesiredState,
    node_ips: &[IpAddr],
    drains: &BTreeMap<(VirtualServerKey, SocketAddr), Instant>,
) -> BTreeSet<(u16, Protocol)> {
    let wanted = desired
        .virtual_servers
        .keys()
        .filter(|key| node_ips.contains(&key.address));
    let draining = drains
        .keys()
        .map(|(key, _)| key)
        .filter(|key| !node_ips.contains(&key.address));
    wanted
        .chain(draining)
        .map(|key| (key.port, key.protocol))
        .collect()
}

/// How long one reading and removal of kube-proxy's leftovers may take in all (each tool has
/// its own timeout too); past it the attempt counts as failed and is tried again after the
/// next full sync.
pub const REMOVAL_DEADLINE: Duration = Duration::from_secs(120);

/// The removal of kube-proxy's iptables rules and ipsets, after the first full sync that has
/// `inet kipvs` in place; tried again after each full sync until it succeeds. It runs in a
/// task of its own, so that syncs (endpoint changes) go on while the tools run.
pub struct Takeover {
    node: Arc<dyn KubeProxyNode>,
    /// kube-proxy's state was found on the node: it ran, or a removal found its leftovers.
    found: bool,
    done: bool,
    /// The removal in progress: whether it succeeded, whether it found kube-proxy's leftovers.
    removal: Option<JoinHandle<(bool, bool)>>,
    /// The node's kubelet version, when its Node is known.
    kubelet_version: Option<String>,
}

impl Takeover {
    /// A takeover of the node `node` describes; `kube_proxy_ran`: [`standby`] waited for it.
    pub fn new(node: Arc<dyn KubeProxyNode>, kube_proxy_ran: bool) -> Self {
        Takeover {
            node,
            found: kube_proxy_ran,
            done: false,
            removal: None,
            kubelet_version: None,
        }
    }

    /// Sets the node's kubelet version (`status.nodeInfo.kubeletVersion`; `None`: unknown),
    /// which says who owns the shared nat chains ([`kubelet_creates_shared_chains`]).
    pub fn set_kubelet_version(&mut self, kubelet_version: Option<&str>) {
        self.kubelet_version = kubelet_version.map(str::to_owned);
    }

    fn kubelet_chains(&self) -> bool {
        kubelet_creates_shared_chains(self.kubelet_version.as_deref())
    }

    /// Whether kube-proxy's state was found on the node (it ran, or a removal found its
    /// iptables rules or ipsets): only then do its NodePort virtual servers on other local
    /// addresses drain ([`kube_proxy_node_ports`]). Nothing is read for it before the first
    /// full sync, which so never waits for the tools: on a node where kube-proxy had stopped
    /// before the proxier started, the drains begin with the first full sync after the
    /// removal.
    pub fn found_kube_proxy(&self) -> bool {
        self.found
    }

    /// Takes the outcome of a removal that has ended.
    pub async fn take_outcome(&mut self) {
        if let Some(removal) = self.removal.take_if(|r| r.is_finished()) {
            let (done, found) = removal.await.unwrap_or((false, false));
            self.done = done;
            self.found |= found;
        }
    }

    /// Whether kube-proxy's leftovers were removed (or none was found, every ruleset read).
    pub fn done(&self) -> bool {
        self.done
    }

    /// After a full sync: unless a removal is still running or the sync's rules could not be
    /// written (kipvs's table is not in place), start one ([`remove_leftovers`]), telling
    /// `observer`; the outcome of the last one is taken here too.
    pub async fn after_full_sync(&mut self, report: &SyncReport, observer: &Arc<dyn Observer>) {
        self.take_outcome().await;
        if self.done || self.removal.is_some() {
            return;
        }
        if report
            .failures
            .iter()
            .any(|f| matches!(f.op, Op::WriteRules(_)))
        {
            tracing::warn!("kube-proxy's rules stay until kipvs's nftables rules are in place");
            return;
        }
        let (node, observer) = (self.node.clone(), observer.clone());
        let kubelet_chains = self.kubelet_chains();
        self.removal = Some(tokio::spawn(async move {
            let removal = remove_leftovers(&*node, kubelet_chains, &*observer);
            match tokio::time::timeout(REMOVAL_DEADLINE, removal).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    let e = format!(
                        "not done within {}s (retried after the next full sync)",
                        REMOVAL_DEADLINE.as_secs()
                    );
                    tracing::warn!("removing kube-proxy's leftovers: {e}");
                    observer.takeover(&TakeoverEvent::RemovalFailed(e));
                    (false, false)
                }
            }
        }));
    }

    /// Waits for the removal in progress, and takes its outcome.
    #[cfg(test)]
    async fn removed(&mut self) {
        if let Some(removal) = self.removal.take() {
            let (done, found) = removal.await.unwrap();
            self.done = done;
            self.found |= found;
        }
    }
}

/// Reads what kube-proxy left on `node` (`kubelet_chains`: whether kubelet creates the shared
/// nat chains, [`kubelet_creates_shared_chains`]) and removes it, telling `observer`. Returns whether
/// nothing of kube-proxy's is left: a ruleset or ipset list that could not be read (other than
/// a backend that is not installed) leaves it not done, logged and told as a failure; and
/// whether kube-proxy's leftovers were found.
async fn remove_leftovers(
    node: &dyn KubeProxyNode,
    kubelet_chains: bool,
    observer: &dyn Observer,
) -> (bool, bool) {
    let leftovers = node.leftovers(kubelet_chains).await;
    let unreadable = leftovers.unreadable.join("; ");
    if !unreadable.is_empty() {
        tracing::warn!(
            "kube-proxy's leftovers: cannot read {unreadable} (retried after the next full sync)"
        );
        observer.takeover(&TakeoverEvent::RemovalFailed(format!(
            "cannot read {unreadable}"
        )));
    }
    for ruleset in &leftovers.rulesets {
        for (chain, why) in &ruleset.removal.kept_for_policy {
            tracing::warn!(
                "kube-proxy's {}-{} filter {chain} stays, with the jumps to it and the sets it \
                 matches: the {why} would drop what it accepts",
                ruleset.family,
                ruleset.backend
            );
        }
    }
    if leftovers.is_empty() {
        return (unreadable.is_empty(), false);
    }
    for line in leftovers.to_string().lines() {
        tracing::info!(target: super::syncer::OPS_LOG, "takeover {line}");
    }
    let (rules, chains, sets) = leftovers.counts();
    match node.remove(&leftovers).await {
        Ok(()) => {
            tracing::info!(
                rules,
                chains,
                sets,
                "removed kube-proxy's iptables rules, chains and ipsets"
            );
            observer.takeover(&TakeoverEvent::Removed {
                rules,
                chains,
                sets,
            });
            (unreadable.is_empty(), true)
        }
        Err(e) => {
            tracing::warn!(
                "removing kube-proxy's leftovers failed (retried after the next full sync): {e}"
            );
            observer.takeover(&TakeoverEvent::RemovalFailed(e));
            (false, true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::fake::FakeDataplane;
    use crate::dataplane::kube_proxy::{Leftovers, Ruleset};
    use crate::dataplane::{DataplaneError, OpFailure};
    use crate::engine::Engine;
    use crate::engine::planner::{NodeIdentity, Planner};
    use crate::plan::kube_proxy::{iptables_removal, parse_save};
    use crate::serve::health::ProxyHealth;
    use crate::source::{SourceHandle, StoreObserver};
    use futures::future::BoxFuture;
    use kipvs_crds::config::ProxierConfiguration;
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
    }

    impl KubeProxyNode for Arc<FakeNode> {
        fn running(&self) -> BoxFuture<'_, Option<String>> {
            *self.asked.lock().unwrap() += 1;
            let running = self.running.lock().unwrap().clone();
            Box::pin(async move { running })
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
            let mut dataplane = FakeDataplane::new(kernel.clone());
            dataplane.other_addresses = [node_ip, other].into();
            let mut engine = Engine::new(m.handle.clone(), planner, dataplane);
            if let Some(ran) = takeover {
                engine =
                    engine.taking_over(Takeover::new(Arc::new(Arc::new(FakeNode::default())), ran));
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
            .taking_over(Takeover::new(Arc::new(node.clone()), false));
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

    /// While kube-proxy runs nothing goes on and `/livez` stays healthy whatever waits; once it
    /// has stopped the standby ends, and queued changes get a whole timeout from then.
    #[tokio::test(start_paused = true)]
    async fn standby_lasts_while_kube_proxy_runs_and_keeps_the_proxier_live() {
        let node = Arc::new(FakeNode::default());
        *node.running.lock().unwrap() = Some("process kube-proxy (pid [7])".into());
        let health = ProxyHealth::new(Duration::from_secs(60), false);
        let events = Arc::new(Events::default());
        let observers: Vec<Arc<dyn Observer>> = vec![Arc::new(health.clone()), events.clone()];
        health.queued_update();
        let waiting = {
            let node = node.clone();
            tokio::spawn(async move { standby(&node, &observers, std::future::pending()).await })
        };
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(!waiting.is_finished());
        assert!(*node.asked.lock().unwrap() > 100);
        assert!(health.live(), "standby is not stale");
        *node.running.lock().unwrap() = None;
        assert_eq!(waiting.await.unwrap(), Some(true));
        assert_eq!(
            *events.0.lock().unwrap(),
            [
                TakeoverEvent::Standby("process kube-proxy (pid [7])".into()),
                TakeoverEvent::Programming
            ]
        );
        assert!(health.live());
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert!(
            !health.live(),
            "a change still not synced after the timeout is stale"
        );
        // A shutdown ends a standby.
        *node.running.lock().unwrap() = Some("x".into());
        assert_eq!(standby(&node, &Events::default(), async {}).await, None);
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
            .taking_over(Takeover::new(Arc::new(node.clone()), false));
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
        let mut takeover = Takeover::new(Arc::new(node.clone()), false);
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
}
