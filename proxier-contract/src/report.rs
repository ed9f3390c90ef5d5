//! The status the proxier reports on its own NodeProxyConfig, as a pure reducer: the engine
//! tells [`StatusReport`] what happened (a revision rejected, put in force, assigned again, a
//! sync done) and publishes [`StatusReport::status`] when a step says it changed;
//! [`crate::report_status`] writes it to the API server.
//!
//! The phases (the NodeProxyConfig contract, `crds/src/nodeproxyconfig.rs`):
//! - `Pending` when a revision is put in force live, `Applied` after the first successful sync
//!   with it; a proxier that (re)starts on a revision goes straight to `Applied` after its
//!   first sync (a restart does not go back to `Pending`).
//! - `Failed` (with the reason) when a revision cannot be put in force; the previous
//!   configuration stays in force, and the revision in force assigned again (a rollback) is
//!   reported `Applied` again after the next sync.
//! - After `Applied`, failed syncs are counted in `syncErrors` (the last error in `message`) and
//!   `lastSyncTime` follows the syncs. What the status publishes, and when (the status is for
//!   people and the operator's decisions, never a heartbeat: 5,000 proxiers refreshing
//!   `lastSyncTime` once a minute would be ~83 writes a second that nothing acts on):
//!   - a change of phase or revision: at once;
//!   - a new error (the first failed sync after a status that reported none): at once;
//!   - the counters (`syncErrors`, `message`) when they changed, at most once per
//!     [`COUNTERS_REFRESH`] (one failing Service retried every second is one status write every
//!     5 minutes, not one per retry);
//!   - `lastSyncTime` never on its own: it is the last sync as of the last write (the live
//!     figure is the `kubeproxy_sync_proxy_rules_last_timestamp_seconds` metric). A healthy,
//!     idle proxier writes nothing. A dead node is seen by the operator from its Node's Ready
//!     condition (the kubelet's own heartbeat), a dead proxier by its liveness probe.
//! - Without a NodeProxyConfig (the local configuration) there is nothing to report.
//!
//! `serviceProxy` (where the node stands between kube-proxy and kipvs, the contract's
//! "Moving a node between kube-proxy and kipvs") is told with
//! [`StatusReport::service_proxy`] and [`StatusReport::refused`]; a change of it is published at
//! once and rides along in every later status:
//! - `TakingOver` and `Programming`: kipvs programs; `Applied` follows the first successful
//!   sync as above.
//! - `Standby` and `HandingBack`: kipvs writes nothing, so no sync makes the revision `Applied`:
//!   a revision not yet `Applied` is reported `Pending` (a proxier that restarts in standby
//!   reports `Pending`, not nothing), one `Applied` stays so (kube-proxy came back while kipvs
//!   programmed: `healthy: false` says so). `message` says why.
//! - `HandedBack`: kube-proxy has synced the node: the revision is `Applied`, `healthy` is
//!   kube-proxy's health.
//! - a refused switch ([`StatusReport::refused`]): `Standby`, `Failed`, the reason in
//!   `message`; the revision stays in force and is `Applied` after the first successful sync
//!   once the switch goes ahead.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::nodeproxyconfig::{NodePhase, NodeProxyConfigStatus, ServiceProxyPhase};
use std::time::{Duration, SystemTime};

/// How often changed counters of the status (`syncErrors`, `message`) are published at most
/// (the NodeProxyConfig contract: they are for people, not a heartbeat; `lastSyncTime` alone is
/// never published).
pub const COUNTERS_REFRESH: Duration = Duration::from_secs(300);

/// What a sync did, as the status sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncResult {
    /// Every op succeeded.
    Clean,
    /// The sync ran, and this error is reported (e.g. "3 IPVS operations failed").
    Failed(String),
    /// The dataplane could not be observed: nothing was changed (never counts as the first
    /// successful sync of a revision).
    NotObserved(String),
}

/// The counters of a status: `syncErrors` and `message`.
type Counters = (Option<u64>, Option<String>);

/// The reducer's state: the revision in force and the status to publish.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusReport {
    /// The revision in force (`None`: the local configuration).
    revision: Option<String>,
    /// A configuration was put in force and no sync with it succeeded yet.
    awaiting_sync: bool,
    /// The status to write (`None`: nothing to report).
    status: Option<NodeProxyConfigStatus>,
    /// When a sync last published the status, and the counters (`syncErrors`, `message`) it
    /// published.
    published: Option<(SystemTime, Counters)>,
    /// The `message` of an `Applied` status without sync errors: the settings of the revision
    /// this version ignored, if any.
    note: Option<String>,
    /// Where the node stands between kube-proxy and kipvs (`None`: not told; proxiers that
    /// do not take over never tell it).
    standing: Option<Standing>,
}

/// What [`StatusReport::service_proxy`] was last told.
#[derive(Clone, Debug, PartialEq)]
struct Standing {
    phase: ServiceProxyPhase,
    /// `message` while kipvs does not program.
    message: Option<String>,
    /// `healthy` in place of the proxier's own `/livez` verdict.
    healthy: Option<bool>,
}

impl StatusReport {
    /// The revision in force (`None`: the local configuration).
    pub fn revision(&self) -> Option<&str> {
        self.revision.as_deref()
    }

    /// The status to write (`None`: nothing to report).
    pub fn status(&self) -> Option<&NodeProxyConfigStatus> {
        self.status.as_ref()
    }

    /// The revision in force was assigned again with the same configuration (e.g. the
    /// operator rolled back after a Failed revision, or a hand edit of `spec.config` that
    /// failed was reverted under the same `spec.revision`): if the status reports another
    /// revision, or this one `Failed`, report this one `Applied` again after the next
    /// successful sync. Changes no status.
    pub fn reassigned(&mut self) {
        let status = self.status.as_ref();
        let reported = status.and_then(|s| s.observed_revision.as_ref());
        let failed = status.and_then(|s| s.phase) == Some(NodePhase::Failed);
        self.awaiting_sync |=
            self.revision.is_some() && (failed || reported != self.revision.as_ref());
    }

    /// `revision` could not be put in force (`message` says why); the previous configuration
    /// stays in force and is no longer reported `Applied` after a sync. Returns whether the
    /// status changed.
    pub fn rejected(&mut self, revision: Option<String>, message: String) -> bool {
        self.awaiting_sync = false;
        let before = self.status.clone();
        match revision {
            None => self.status = None,
            Some(revision) => {
                let status = self.status.get_or_insert_default();
                status.observed_revision = Some(revision);
                status.phase = Some(NodePhase::Failed);
                status.message = Some(message);
                status.sync_errors = None;
            }
        }
        before != self.status
    }

    /// `revision` is in force from now on, without the settings `ignored` (those of a newer
    /// kipvs this version does not know: named in the `Applied` status's message);
    /// `restarting`: no sync succeeded yet in this process (the status then stays as it is
    /// until the first sync). Returns whether the status changed.
    pub fn in_force(
        &mut self,
        revision: Option<String>,
        restarting: bool,
        ignored: &[String],
    ) -> bool {
        self.awaiting_sync = true;
        self.note = (!ignored.is_empty()).then(|| {
            format!(
                "ignored settings this kipvs version does not know: {}",
                ignored.join(", ")
            )
        });
        let before = self.status.clone();
        match &revision {
            None => self.status = None,
            Some(_) if restarting => {}
            Some(_) => {
                self.status = Some(NodeProxyConfigStatus {
                    observed_revision: revision.clone(),
                    phase: Some(NodePhase::Pending),
                    ..Default::default()
                })
            }
        }
        self.revision = revision;
        self.stand();
        before != self.status
    }

    /// A sync finished at `now` with `result`. Returns whether the status is to be published:
    /// at once for `Applied` and for a new error (the first failed sync after a published status
    /// without errors); for other changes of the counters only once [`COUNTERS_REFRESH`]
    /// passed since a sync last published them; never for `lastSyncTime` alone.
    pub fn synced(&mut self, result: &SyncResult, now: SystemTime) -> bool {
        let Some(revision) = self.revision.clone() else {
            return false;
        };
        let error = match result {
            SyncResult::Clean => None,
            SyncResult::Failed(e) | SyncResult::NotObserved(e) => Some(e.clone()),
        };
        if self.awaiting_sync {
            let programs = self
                .standing
                .as_ref()
                .is_none_or(|s| s.phase.kipvs_programs());
            if matches!(result, SyncResult::NotObserved(_)) || !programs {
                return false;
            }
            self.awaiting_sync = false;
            self.status = Some(NodeProxyConfigStatus {
                observed_revision: Some(revision),
                phase: Some(NodePhase::Applied),
                last_sync_time: Some(time(now)),
                sync_errors: Some(u64::from(error.is_some())),
                message: error.or_else(|| self.note.clone()),
                healthy: None,
                ..Default::default()
            });
            self.stand();
            self.published = Some((now, counters(self.status.as_ref())));
            return true;
        }
        let Some(status) = self.status.as_mut() else {
            return false;
        };
        // Syncs with the revision in force do not touch a report that it Failed (a hand edit
        // of its configuration under the same revision was rejected).
        if status.observed_revision.as_deref() != Some(&revision)
            || status.phase != Some(NodePhase::Applied)
        {
            return false;
        }
        match error {
            Some(error) => {
                *status.sync_errors.get_or_insert(0) += 1;
                status.message = Some(error);
            }
            None => status.last_sync_time = Some(time(now)),
        }
        let now_counters = counters(Some(status));
        let due = match &self.published {
            None => true,
            Some((_, was)) if *was == now_counters => false,
            Some((_, (None | Some(0), _))) if now_counters.0 > Some(0) => true, // a new error
            Some((at, _)) => *at + COUNTERS_REFRESH <= now,
        };
        if due {
            self.published = Some((now, now_counters));
        }
        due
    }

    /// The node stands at `phase` between kube-proxy and kipvs (`status.serviceProxy`, see the
    /// module documentation); `message`: why, reported while kipvs does not program (`Standby`,
    /// `HandingBack`, `HandedBack`); `healthy`: reported in place of the proxier's own `/livez`
    /// verdict (`Some(false)`: kube-proxy came back while kipvs programmed; kube-proxy's
    /// health once `HandedBack`; `None`: the proxier's verdict). `HandedBack` makes the
    /// revision in force `Applied`. Returns whether the status changed (publish it at once).
    pub fn service_proxy(
        &mut self,
        phase: ServiceProxyPhase,
        message: Option<String>,
        healthy: Option<bool>,
    ) -> bool {
        let before = self.status.clone();
        let stood_by = self
            .standing
            .as_ref()
            .is_some_and(|s| !s.phase.kipvs_programs());
        self.standing = Some(Standing {
            phase,
            message,
            healthy,
        });
        let ours = self
            .status
            .as_ref()
            .is_some_and(|s| s.observed_revision == self.revision);
        let reported = ours
            .then(|| self.status.as_ref().and_then(|s| s.phase))
            .flatten();
        match (&self.revision, phase) {
            (None, _) => {}
            (Some(_), ServiceProxyPhase::HandedBack) => {
                self.awaiting_sync = false;
                self.status = Some(self.fresh(NodePhase::Applied));
                self.status.get_or_insert_default().sync_errors = Some(0);
            }
            (Some(_), _) if phase.kipvs_programs() => {
                if let Some(status) = self.status.as_mut().filter(|_| ours && stood_by) {
                    // The switch goes ahead (a refused one too): Pending until its first
                    // successful sync; the standby's message goes.
                    if reported == Some(NodePhase::Failed) && self.awaiting_sync {
                        status.phase = Some(NodePhase::Pending);
                    }
                    status.message = match status.phase {
                        Some(NodePhase::Applied) => self.note.clone(),
                        _ => None,
                    };
                }
            }
            // Standing by: a revision not reported yet is Pending; Pending, Failed and Applied
            // stay.
            (Some(_), _) if reported.is_none() => {
                self.status = Some(self.fresh(NodePhase::Pending))
            }
            (Some(_), _) => {}
        }
        self.stand();
        before != self.status
    }

    /// The switch to kipvs is refused (`message` says why, e.g. what it would delete that
    /// carries connections): kipvs stays in `Standby`, the revision in force is reported
    /// `Failed` with `message` until the switch goes ahead
    /// ([`service_proxy`](Self::service_proxy) with a phase where kipvs programs). Returns
    /// whether the status changed.
    pub fn refused(&mut self, message: String) -> bool {
        let before = self.status.clone();
        self.standing = Some(Standing {
            phase: ServiceProxyPhase::Standby,
            message: Some(message),
            healthy: None,
        });
        if self.revision.is_some() {
            self.awaiting_sync = true;
            self.status = Some(self.fresh(NodePhase::Failed));
        }
        self.stand();
        before != self.status
    }

    /// A status of the revision in force at `phase`, nothing else set.
    fn fresh(&self, phase: NodePhase) -> NodeProxyConfigStatus {
        NodeProxyConfigStatus {
            observed_revision: self.revision.clone(),
            phase: Some(phase),
            ..Default::default()
        }
    }

    /// Writes what [`service_proxy`](Self::service_proxy) was told into the status of the
    /// revision in force.
    fn stand(&mut self) {
        let (Some(standing), Some(status)) = (&self.standing, self.status.as_mut()) else {
            return;
        };
        if status.observed_revision != self.revision {
            return;
        }
        status.service_proxy = Some(standing.phase);
        status.healthy = standing.healthy;
        if !standing.phase.kipvs_programs() {
            status.message = standing.message.clone();
        }
    }
}

/// The counters of `status`.
fn counters(status: Option<&NodeProxyConfigStatus>) -> Counters {
    status.map_or((None, None), |s| (s.sync_errors, s.message.clone()))
}

/// A `metav1.Time` at `at`.
fn time(at: SystemTime) -> Time {
    Time(Timestamp::try_from(at).expect("the clock is within jiff's range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(r: &StatusReport) -> (Option<&str>, Option<NodePhase>) {
        let s = r.status().expect("a status");
        (s.observed_revision.as_deref(), s.phase)
    }

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        T0 + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn pending_then_applied_after_the_first_successful_sync() {
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &[]);
        assert!(r.synced(&SyncResult::Clean, at(0)));
        assert!(r.in_force(Some("r2".into()), false, &[]));
        assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Pending)));
        // A sync that could not observe the dataplane is not the first sync with r2.
        assert!(!r.synced(&SyncResult::NotObserved("netlink".into()), at(1)));
        assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Pending)));
        assert!(r.synced(&SyncResult::Clean, at(2)));
        assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Applied)));
        assert_eq!(r.status().unwrap().sync_errors, Some(0));
        assert_eq!(r.revision(), Some("r2"));
    }

    #[test]
    fn restart_on_the_same_revision_reports_applied_without_pending() {
        let mut r = StatusReport::default();
        // Restarting: the status stays unknown (None here) until the first sync.
        assert!(!r.in_force(Some("r1".into()), true, &[]));
        assert_eq!(r.status(), None);
        assert!(r.synced(&SyncResult::Clean, at(0)));
        assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
    }

    #[test]
    fn failed_keeps_the_old_revision_in_force_and_a_rollback_is_applied_again() {
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &[]);
        r.synced(&SyncResult::Clean, at(0));
        assert!(r.rejected(
            Some("r2".into()),
            "scheduler \"twos\" is not available".into()
        ));
        assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Failed)));
        assert_eq!(r.revision(), Some("r1"), "r1 stays in force");
        // Syncs with r1 do not overwrite the Failed report about r2.
        assert!(!r.synced(&SyncResult::Clean, at(100)));
        assert!(!r.synced(
            &SyncResult::Failed("1 IPVS operations failed".into()),
            at(101)
        ));
        assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Failed)));
        // The operator rolls back to r1: Applied again after the next sync.
        r.reassigned();
        assert!(r.synced(&SyncResult::Clean, at(102)));
        assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
    }

    /// A hand edit of spec.config to a scheduler the node lacks, under the same spec.revision,
    /// then back to the exact original: the node is `Applied` again after the next sync, not
    /// `Failed` until a restart.
    #[test]
    fn a_failed_edit_reverted_under_the_same_revision_is_applied_again() {
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &[]);
        assert!(r.synced(&SyncResult::Clean, at(0)));
        // The edit: same revision name, a configuration that cannot be put in force.
        assert!(r.rejected(
            Some("r1".into()),
            "IPVS scheduler \"nope\" is not available".into()
        ));
        assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Failed)));
        assert!(!r.synced(&SyncResult::Clean, at(1)), "still Failed");
        // Reverted: the configuration in force is assigned again.
        r.reassigned();
        assert!(r.synced(&SyncResult::Clean, at(2)));
        assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
        assert_eq!(r.status().unwrap().message, None);
        // Assigned again while Applied: nothing to publish.
        r.reassigned();
        assert!(!r.synced(&SyncResult::Clean, at(3)));
    }

    #[test]
    fn an_idle_healthy_proxier_writes_nothing_after_applied() {
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &[]);
        assert!(r.synced(&SyncResult::Clean, at(0)));
        // A day of clean syncs every 30 s: lastSyncTime follows them, nothing is published.
        let published = (1..=2880).filter(|i| r.synced(&SyncResult::Clean, at(30 * i)));
        assert_eq!(published.count(), 0, "no heartbeat");
        let s = r.status().unwrap();
        assert_eq!(s.last_sync_time, Some(time(at(30 * 2880))), "rides along");
        assert_eq!(
            (s.phase, s.sync_errors),
            (Some(NodePhase::Applied), Some(0))
        );
    }

    #[test]
    fn a_new_error_is_published_at_once_then_counters_every_five_minutes_if_changed() {
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &[]);
        assert!(r.synced(&SyncResult::Clean, at(0)));
        assert!(!r.synced(&SyncResult::Clean, at(30)));
        // The first failed sync after a clean status: at once.
        let failed = SyncResult::Failed("1 IPVS operations failed".into());
        assert!(r.synced(&failed, at(31)));
        assert_eq!(r.status().unwrap().sync_errors, Some(1));
        // One Service failing on every retry for 20 minutes: counted each time, published
        // once per COUNTERS_REFRESH.
        let published: Vec<u64> = (32..=1231).filter(|&t| r.synced(&failed, at(t))).collect();
        assert_eq!(published, [331, 631, 931, 1231]);
        let s = r.status().unwrap();
        assert_eq!(s.sync_errors, Some(1201));
        assert_eq!(s.message.as_deref(), Some("1 IPVS operations failed"));
        assert_eq!(s.phase, Some(NodePhase::Applied));
        // Fixed: the counters no longer change, so nothing more is published, however long.
        assert!(!r.synced(&SyncResult::Clean, at(1232)));
        assert!(!r.synced(&SyncResult::Clean, at(1232 + 3600)));
        // A later failure is not new (the status reports errors already): it waits its turn.
        assert!(r.synced(&failed, at(1232 + 3601)), "5 minutes passed");
        assert!(!r.synced(&failed, at(1232 + 3602)));
        // A change of phase is published at once, and its counters start from zero.
        assert!(r.in_force(Some("r2".into()), false, &[]));
        assert!(r.synced(&SyncResult::Clean, at(1232 + 3603)));
        assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Applied)));
        assert_eq!(r.status().unwrap().sync_errors, Some(0));
        // ... and the first error with r2 is new again.
        assert!(r.synced(&failed, at(1232 + 3604)));
    }

    #[test]
    fn settings_of_a_newer_version_are_named_in_the_applied_message() {
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &["ipvs.newSetting".into()]);
        assert!(r.synced(&SyncResult::Clean, at(0)));
        assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
        assert_eq!(
            r.status().unwrap().message.as_deref(),
            Some("ignored settings this kipvs version does not know: ipvs.newSetting")
        );
        r.in_force(Some("r2".into()), false, &[]);
        assert!(r.synced(&SyncResult::Clean, at(1)));
        assert_eq!(r.status().unwrap().message, None);
    }

    fn standing(
        r: &StatusReport,
    ) -> (
        NodePhase,
        Option<ServiceProxyPhase>,
        Option<&str>,
        Option<bool>,
    ) {
        let s = r.status().expect("a status");
        (
            s.phase.unwrap(),
            s.service_proxy,
            s.message.as_deref(),
            s.healthy,
        )
    }

    /// A proxier that restarts in standby reports its revision Pending at once; the takeover
    /// publishes each phase at once, Applied after the first successful sync; a kube-proxy
    /// that comes back is reported unhealthy with why, and the way back clears it.
    #[test]
    fn standby_is_reported_pending_and_each_phase_is_published_at_once() {
        use ServiceProxyPhase::*;
        let mut r = StatusReport::default();
        assert!(!r.in_force(Some("r1".into()), true, &[]));
        let why = "kube-proxy runs on this node (process kube-proxy, pid 7)";
        assert!(r.service_proxy(Standby, Some(why.into()), None));
        assert_eq!(
            standing(&r),
            (NodePhase::Pending, Some(Standby), Some(why), None)
        );
        assert!(
            !r.service_proxy(Standby, Some(why.into()), None),
            "nothing new"
        );
        // No sync makes a revision Applied while kipvs writes nothing.
        assert!(!r.synced(&SyncResult::Clean, at(0)));
        assert!(r.service_proxy(TakingOver, None, None));
        assert_eq!(
            standing(&r),
            (NodePhase::Pending, Some(TakingOver), None, None)
        );
        assert!(r.synced(&SyncResult::Clean, at(1)));
        assert_eq!(
            standing(&r),
            (NodePhase::Applied, Some(TakingOver), None, None)
        );
        assert!(r.service_proxy(Programming, None, None));
        assert_eq!(
            standing(&r),
            (NodePhase::Applied, Some(Programming), None, None)
        );
        // kube-proxy is back: stays Applied, unhealthy, with why.
        let back = "kube-proxy is back (KUBE-SERVICES in nat): kipvs stopped writing";
        assert!(r.service_proxy(Standby, Some(back.into()), Some(false)));
        assert_eq!(
            standing(&r),
            (NodePhase::Applied, Some(Standby), Some(back), Some(false))
        );
        assert!(r.service_proxy(Programming, None, None));
        assert_eq!(
            standing(&r),
            (NodePhase::Applied, Some(Programming), None, None)
        );
        // A new revision keeps the phase told.
        assert!(r.in_force(Some("r2".into()), false, &[]));
        assert_eq!(
            standing(&r),
            (NodePhase::Pending, Some(Programming), None, None)
        );
    }

    /// The way back: HandingBack keeps the revision Pending, HandedBack makes it Applied with
    /// kube-proxy's health; back to kipvs is a takeover again.
    #[test]
    fn a_handback_is_applied_once_kube_proxy_synced_with_its_health() {
        use ServiceProxyPhase::*;
        let mut r = StatusReport::default();
        r.service_proxy(Programming, None, None);
        r.in_force(Some("r1".into()), true, &[]);
        assert!(r.synced(&SyncResult::Clean, at(0)));
        assert!(r.in_force(Some("r2".into()), false, &[]));
        let waiting = "waiting for kube-proxy's /healthz to report a sync";
        assert!(r.service_proxy(HandingBack, Some(waiting.into()), None));
        assert_eq!(
            standing(&r),
            (NodePhase::Pending, Some(HandingBack), Some(waiting), None)
        );
        assert!(r.service_proxy(HandedBack, None, Some(true)));
        assert_eq!(
            standing(&r),
            (NodePhase::Applied, Some(HandedBack), None, Some(true))
        );
        assert!(
            r.service_proxy(HandedBack, None, Some(false)),
            "kube-proxy's health"
        );
        assert_eq!(r.status().unwrap().healthy, Some(false));
        assert!(!r.synced(&SyncResult::Clean, at(1)));
        // Back to kipvs.
        assert!(r.in_force(Some("r3".into()), false, &[]));
        assert!(r.service_proxy(Standby, Some("kube-proxy runs".into()), None));
        assert!(r.service_proxy(TakingOver, None, None));
        assert!(r.synced(&SyncResult::Clean, at(2)));
        assert_eq!(
            standing(&r),
            (NodePhase::Applied, Some(TakingOver), None, None)
        );
    }

    /// A refused switch is Failed with why and stays in force: once it goes ahead it is
    /// Pending, then Applied after the first successful sync.
    #[test]
    fn a_refused_switch_is_failed_until_it_goes_ahead() {
        use ServiceProxyPhase::*;
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &[]);
        let why = "2 operations would delete or re-weight to 0 something carrying connections";
        assert!(r.refused(why.into()));
        assert_eq!(
            standing(&r),
            (NodePhase::Failed, Some(Standby), Some(why), None)
        );
        assert!(!r.refused(why.into()));
        assert!(
            !r.service_proxy(Standby, Some(why.into()), None),
            "stays Failed"
        );
        assert_eq!(r.revision(), Some("r1"));
        assert!(r.service_proxy(TakingOver, None, None));
        assert_eq!(
            standing(&r),
            (NodePhase::Pending, Some(TakingOver), None, None)
        );
        assert!(r.synced(&SyncResult::Clean, at(0)));
        assert_eq!(
            standing(&r),
            (NodePhase::Applied, Some(TakingOver), None, None)
        );
    }

    #[test]
    fn the_local_configuration_reports_nothing() {
        let mut r = StatusReport::default();
        r.in_force(Some("r1".into()), true, &[]);
        r.synced(&SyncResult::Clean, at(0));
        assert!(r.in_force(None, false, &[]));
        assert_eq!(r.status(), None);
        assert!(!r.synced(&SyncResult::Clean, at(1)));
        assert!(!r.rejected(None, "bad local configuration".into()));
        assert!(!r.service_proxy(ServiceProxyPhase::Standby, Some("x".into()), None));
        assert!(!r.refused("x".into()));
        assert_eq!(r.status(), None);
    }
}
