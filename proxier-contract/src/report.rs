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
mod tests;
