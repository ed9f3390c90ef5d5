//! A stand-in for a proxier's side of the contract, for harnesses that run the operator without
//! real proxiers (the operator's `fake_proxier` and `fleet` examples): the steps the proxier's
//! engine takes on the reducer when a NodeProxyConfig assigns a revision and when a sync ends,
//! published on the channel [`crate::report_status`] writes from; and the stand-ins' `/livez`
//! verdicts ([`SimulatedLiveness`], [`AlwaysLive`]). Built with the feature `harness` only: the
//! proxier never links it.

use crate::liveness::{Liveness, StalenessClock};
use crate::report::{StatusReport, SyncResult};
use kipvs_crds::nodeproxyconfig::{NodePhase, NodeProxyConfigStatus, ServiceProxyPhase};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;

/// One simulated proxier's status: the reducer, and the channel its status is published on.
#[derive(Debug)]
pub struct SimulatedProxier {
    report: Mutex<StatusReport>,
    publish: watch::Sender<Option<NodeProxyConfigStatus>>,
}

impl SimulatedProxier {
    /// A proxier with no revision in force, and the receiver to hand to
    /// [`report_status`](crate::report_status).
    pub fn new() -> (Self, watch::Receiver<Option<NodeProxyConfigStatus>>) {
        let (publish, receiver) = watch::channel(None);
        let proxier = SimulatedProxier {
            report: Mutex::default(),
            publish,
        };
        (proxier, receiver)
    }

    /// Its NodeProxyConfig assigns `revision`, as the engine takes it: the revision in force
    /// assigned again (a rollback) is reported `Applied` after the next sync; one that cannot be
    /// put in force (`rejection` says why) is reported `Failed` while the previous one stays in
    /// force; any other is put in force (`Pending`).
    pub fn assigned(&self, revision: &str, rejection: Option<String>) {
        let mut report = self.report.lock().expect("status report");
        let changed = if report.revision() == Some(revision) {
            report.reassigned();
            false
        } else if let Some(message) = rejection {
            report.rejected(Some(revision.to_owned()), message)
        } else {
            report.in_force(Some(revision.to_owned()), false, &[])
        };
        self.publish(&report, changed);
    }

    /// A sync ended at `now` with `result`. Returns whether the status was published (the
    /// reducer's rule: a change of phase or a new error at once, never a heartbeat).
    pub fn synced(&self, result: &SyncResult, now: SystemTime) -> bool {
        let mut report = self.report.lock().expect("status report");
        let changed = report.synced(result, now);
        self.publish(&report, changed);
        changed
    }

    /// The node stands at `phase` between kube-proxy and kipvs, as the proxier's engine tells
    /// it ([`StatusReport::service_proxy`]: `message` while kipvs does not program, `healthy`
    /// in place of the `/livez` verdict). Returns whether the status was published (a change
    /// is published at once).
    pub fn service_proxy(
        &self,
        phase: ServiceProxyPhase,
        message: Option<String>,
        healthy: Option<bool>,
    ) -> bool {
        let mut report = self.report.lock().expect("status report");
        let changed = report.service_proxy(phase, message, healthy);
        self.publish(&report, changed);
        changed
    }

    /// The switch to kipvs is refused (`message` says why): [`StatusReport::refused`].
    /// Returns whether the status was published.
    pub fn refused(&self, message: String) -> bool {
        let mut report = self.report.lock().expect("status report");
        let changed = report.refused(message);
        self.publish(&report, changed);
        changed
    }

    /// The revision in force (`None`: none assigned yet).
    pub fn revision(&self) -> Option<String> {
        let report = self.report.lock().expect("status report");
        report.revision().map(str::to_owned)
    }

    /// Whether its status reports `revision` `Applied`.
    pub fn applied(&self, revision: &str) -> bool {
        let report = self.report.lock().expect("status report");
        report.status().is_some_and(|s| {
            s.observed_revision.as_deref() == Some(revision) && s.phase == Some(NodePhase::Applied)
        })
    }

    fn publish(&self, report: &StatusReport, changed: bool) {
        if changed {
            self.publish.send_replace(report.status().cloned());
        }
    }
}

/// The `/livez` verdict of a stand-in proxier: a [`StalenessClock`] its simulated syncs drive.
/// Cheap to clone (shared state): one clone goes to [`report_status`](crate::report_status).
#[derive(Clone, Debug)]
pub struct SimulatedLiveness {
    clock: Arc<Mutex<StalenessClock>>,
    changed: Arc<watch::Sender<()>>,
}

impl SimulatedLiveness {
    /// A stand-in with nothing queued whose verdict goes stale after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        SimulatedLiveness {
            clock: Arc::new(Mutex::new(StalenessClock::new(timeout))),
            changed: Arc::new(watch::Sender::new(())),
        }
    }

    fn modify(&self, f: impl FnOnce(&mut StalenessClock)) {
        f(&mut self.clock.lock().expect("liveness lock"));
        self.changed.send_replace(());
    }

    /// A change is waiting to be synced ([`StalenessClock::queued`]).
    pub fn queued(&self) {
        self.modify(StalenessClock::queued);
    }

    /// A sync ended ([`StalenessClock::synced`]).
    pub fn synced(&self) {
        self.modify(StalenessClock::synced);
    }

    /// Changes how long a queued change may wait ([`StalenessClock::set_timeout`]).
    pub fn set_timeout(&self, timeout: Duration) {
        self.modify(|clock| clock.set_timeout(timeout));
    }
}

impl Liveness for SimulatedLiveness {
    fn live(&self) -> bool {
        self.clock.lock().expect("liveness lock").live()
    }

    fn stale_at(&self) -> Option<Instant> {
        self.clock.lock().expect("liveness lock").stale_at()
    }

    fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }
}

/// The verdict of a stand-in whose `/livez` always answers 200.
#[derive(Debug, Default)]
pub struct AlwaysLive {
    changed: watch::Sender<()>,
}

impl Liveness for AlwaysLive {
    fn live(&self) -> bool {
        true
    }

    fn stale_at(&self) -> Option<Instant> {
        None
    }

    fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_goes_pending_then_applied_and_a_rejected_one_leaves_the_old_in_force() {
        let (proxier, receiver) = SimulatedProxier::new();
        let phase = || {
            let status = receiver.borrow().clone().expect("a status");
            (status.observed_revision.unwrap(), status.phase.unwrap())
        };
        proxier.assigned("r1", None);
        assert_eq!(phase(), ("r1".to_owned(), NodePhase::Pending));
        assert!(proxier.synced(&SyncResult::Clean, SystemTime::now()));
        assert_eq!(phase(), ("r1".to_owned(), NodePhase::Applied));
        assert!(proxier.applied("r1"));
        assert!(
            !proxier.synced(&SyncResult::Clean, SystemTime::now()),
            "no heartbeat"
        );

        proxier.assigned("r2", Some("scheduler \"sed\" is not available".to_owned()));
        assert_eq!(phase(), ("r2".to_owned(), NodePhase::Failed));
        assert_eq!(proxier.revision().as_deref(), Some("r1"));
        proxier.assigned("r1", None);
        assert!(proxier.synced(&SyncResult::Clean, SystemTime::now()));
        assert_eq!(
            phase(),
            ("r1".to_owned(), NodePhase::Applied),
            "rolled back"
        );
    }

    #[test]
    fn service_proxy_phases_are_published_at_once() {
        let (proxier, receiver) = SimulatedProxier::new();
        let standing = || {
            let status = receiver.borrow().clone().expect("a status");
            (status.phase.unwrap(), status.service_proxy, status.healthy)
        };
        proxier.assigned("r1", None);
        assert!(proxier.service_proxy(
            ServiceProxyPhase::Standby,
            Some("kube-proxy runs".into()),
            None
        ));
        assert_eq!(
            standing(),
            (NodePhase::Pending, Some(ServiceProxyPhase::Standby), None)
        );
        assert!(proxier.refused("would touch connections".into()));
        assert_eq!(
            standing(),
            (NodePhase::Failed, Some(ServiceProxyPhase::Standby), None)
        );
        assert!(proxier.service_proxy(ServiceProxyPhase::TakingOver, None, None));
        assert!(proxier.synced(&SyncResult::Clean, SystemTime::now()));
        assert!(proxier.applied("r1"));
        proxier.assigned("r2", None);
        assert!(proxier.service_proxy(ServiceProxyPhase::HandedBack, None, Some(false)));
        assert_eq!(
            standing(),
            (
                NodePhase::Applied,
                Some(ServiceProxyPhase::HandedBack),
                Some(false)
            )
        );
    }
}
