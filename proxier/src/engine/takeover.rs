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
//!    ([`crate::plan::kube_proxy`] says which). Until then kube-proxy's rules keep masquerading
//!    and filtering as they did; after, kipvs's do.
//!
//! [`Ownership::drains`]: crate::dataplane::diff::Ownership::drains

use super::observer::{Observer, TakeoverEvent};
use super::syncer::SyncReport;
use crate::dataplane::Op;
use crate::dataplane::kube_proxy::KubeProxyNode;
use std::future::Future;
use std::time::Duration;

/// How often [`standby`] asks whether kube-proxy still runs.
pub const STANDBY_CHECK: Duration = Duration::from_secs(2);

/// Waits while kube-proxy runs on the node, telling `observer` ([`TakeoverEvent::Standby`],
/// then [`TakeoverEvent::Programming`]). Returns `false` when `shutdown` came first.
pub async fn standby(
    node: &dyn KubeProxyNode,
    observer: &dyn Observer,
    shutdown: impl Future<Output = ()>,
) -> bool {
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
            _ = &mut shutdown => return false,
            _ = tokio::time::sleep(STANDBY_CHECK) => {}
        }
    }
    if waited {
        tracing::info!("kube-proxy has stopped: taking the node over");
    }
    observer.takeover(&TakeoverEvent::Programming);
    true
}

/// The removal of kube-proxy's iptables rules and ipsets, after the first full sync that has
/// `inet kipvs` in place; tried again after each full sync until it succeeds.
pub struct Takeover {
    node: Box<dyn KubeProxyNode>,
    done: bool,
}

impl Takeover {
    /// A takeover of the node `node` describes.
    pub fn new(node: Box<dyn KubeProxyNode>) -> Self {
        Takeover { node, done: false }
    }

    /// Whether kube-proxy's leftovers were removed (or none was found).
    pub fn done(&self) -> bool {
        self.done
    }

    /// After a full sync: unless its rules could not be written (kipvs's table is not in
    /// place), read what kube-proxy left and remove it, telling `observer`.
    pub async fn after_full_sync(&mut self, report: &SyncReport, observer: &dyn Observer) {
        if self.done {
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
        let leftovers = self.node.leftovers().await;
        for why in &leftovers.unreadable {
            tracing::debug!("kube-proxy's leftovers: cannot read {why}");
        }
        if leftovers.is_empty() {
            self.done = true;
            return;
        }
        for line in leftovers.to_string().lines() {
            tracing::info!(target: super::syncer::OPS_LOG, "takeover {line}");
        }
        let (rules, chains, sets) = leftovers.counts();
        match self.node.remove(&leftovers).await {
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
                self.done = true;
            }
            Err(e) => {
                tracing::warn!(
                    "removing kube-proxy's leftovers failed (retried after the next full sync): {e}"
                );
                observer.takeover(&TakeoverEvent::RemovalFailed(e));
            }
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
    }

    impl KubeProxyNode for Arc<FakeNode> {
        fn running(&self) -> BoxFuture<'_, Option<String>> {
            *self.asked.lock().unwrap() += 1;
            let running = self.running.lock().unwrap().clone();
            Box::pin(async move { running })
        }
        fn leftovers(&self) -> BoxFuture<'_, Leftovers> {
            let leftovers = self.leftovers.lock().unwrap().clone();
            Box::pin(async move { leftovers })
        }
        fn remove<'a>(&'a self, leftovers: &'a Leftovers) -> BoxFuture<'a, Result<(), String>> {
            self.removals.lock().unwrap().push(leftovers.clone());
            *self.leftovers.lock().unwrap() = Leftovers::default();
            Box::pin(async { Ok(()) })
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
                removal: iptables_removal(&parse_save(save).unwrap()),
            }],
            ipsets: vec!["KUBE-CLUSTER-IP".into()],
            unreadable: vec![],
        }
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
        assert!(waiting.await.unwrap());
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
        assert!(!standby(&node, &Events::default(), async {}).await);
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
            .taking_over(Takeover::new(Box::new(node.clone())));
        let report = engine.sync().await.unwrap();
        assert!(matches!(report.ops[0], Op::WriteRules(_)));
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
        let mut takeover = Takeover::new(Box::new(node.clone()));
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
        takeover.after_full_sync(&failed, &*events).await;
        assert!(!takeover.done());
        assert_eq!(node.removals.lock().unwrap().len(), 1);
    }
}
