//! The four status conditions of a ProxyConfig, with stable transition times.
//!
//! | type | True when | reasons |
//! |---|---|---|
//! | `Progressing` | nodes are moving to the target revision | `RollingOut`, `Soaking`, `AwaitingPromotion`, `StageTooSmall`, `RollingBack` / False: `RolloutComplete`, `NoNodes`, `RolledBack`, `Halted`, `InvalidSpec` |
//! | `Available` | no node is failed on the revision its NodeProxyConfig carries | `AllHealthy` / False: `NodesFailed` |
//! | `Degraded` | something needs a person | `InvalidSpec`, `RevisionFailed`, `NodeConflict`, `StageTooSmall`, `WriteFailed` (NodeProxyConfig or label writes being retried), `KubeProxyReturned` (kube-proxy runs on nodes labelled `kipvs`), `NodesFailed` (within the failure budget) / False: `AsExpected` |
//! | `Paused` | nothing moves until a person acts | `SpecPaused`, `AwaitingPromotion` / False: `Running` |
//!
//! A condition keeps its `lastTransitionTime` unless its status changes (Kubernetes API
//! conventions), so reasons and messages can be refined without faking a transition. Messages
//! are never empty.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{Stage, StagePhase, StageStatus};
use std::collections::BTreeMap;

/// Condition types, in the order status lists them.
pub const TYPES: [&str; 4] = ["Progressing", "Available", "Degraded", "Paused"];

#[derive(Clone, Debug)]
struct Verdict {
    status: bool,
    reason: &'static str,
    message: String,
}

/// The conditions being decided, seeded with the previous ones for their transition times.
#[derive(Debug)]
pub struct ConditionSet {
    previous: Vec<Condition>,
    now: Timestamp,
    generation: Option<i64>,
    progressing: Option<Verdict>,
    available: Option<Verdict>,
    /// Degraded verdicts with their priority (highest wins; messages of the others are kept).
    degraded: Vec<(u8, Verdict)>,
    paused: Option<Verdict>,
    /// Set by [`Self::stage_too_small`]: the reason the rollout waits.
    too_small: Option<String>,
}

fn verdict(status: bool, reason: &'static str, message: impl Into<String>) -> Option<Verdict> {
    Some(Verdict {
        status,
        reason,
        message: message.into(),
    })
}

impl ConditionSet {
    /// Starts from the previous conditions (only their transition times are reused).
    pub fn new(previous: &[Condition], now: Timestamp, generation: Option<i64>) -> Self {
        ConditionSet {
            previous: previous.to_vec(),
            now,
            generation,
            progressing: None,
            available: None,
            degraded: Vec::new(),
            paused: None,
            too_small: None,
        }
    }

    /// `spec.paused`.
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = if paused {
            verdict(
                true,
                "SpecPaused",
                "spec.paused is true: no NodeProxyConfig is written",
            )
        } else {
            verdict(
                false,
                "Running",
                "spec.paused is false and no stage waits for promotion",
            )
        };
    }

    /// The spec failed validation: nothing else is decided.
    pub fn invalid_spec(&mut self, message: &str) {
        self.degraded.push((
            4,
            Verdict {
                status: true,
                reason: "InvalidSpec",
                message: message.to_owned(),
            },
        ));
        self.progressing = verdict(false, "InvalidSpec", "the spec is invalid; see Degraded");
    }

    /// Nodes selected by another ProxyConfig too.
    pub fn conflicts(&mut self, nodes: &[&str]) {
        if !nodes.is_empty() {
            let message = format!(
                "{} node(s) are also selected by another ProxyConfig and are left alone: {}",
                nodes.len(),
                list(nodes)
            );
            self.degraded.push((
                2,
                Verdict {
                    status: true,
                    reason: "NodeConflict",
                    message,
                },
            ));
        }
    }

    /// NodeProxyConfig writes that failed and are being retried (`failing`: node → last error).
    pub fn write_failures(&mut self, failing: &BTreeMap<String, String>) {
        if let Some((node, error)) = failing.iter().next() {
            let nodes: Vec<&str> = failing.keys().map(String::as_str).collect();
            let message = format!(
                "{} write(s) failing, retried with backoff: {} (first: {node}: {error})",
                nodes.len(),
                list(&nodes)
            );
            self.degraded.push((
                2,
                Verdict {
                    status: true,
                    reason: "WriteFailed",
                    message,
                },
            ));
        }
    }

    /// kube-proxy runs on `nodes`, labelled `kipvs` and carrying a `kipvs` revision, and kipvs
    /// stands by there (kube-proxy's DaemonSet re-applied by `kubeadm upgrade`, kubespray or an
    /// addon manager without the affinity that keeps it off them); `cause`: what the operator
    /// sees of that DaemonSet and what to do.
    pub fn kube_proxy_returned(&mut self, nodes: &[&str], cause: &str) {
        if nodes.is_empty() {
            return;
        }
        let message = format!("{}; {cause}", kube_proxy_returned(nodes));
        self.degraded.push((
            3,
            Verdict {
                status: true,
                reason: "KubeProxyReturned",
                message,
            },
        ));
    }

    /// Availability of the nodes this ProxyConfig configures (`eligible`: selected, not
    /// skipped, not conflicting).
    pub fn available(&mut self, failed: &[&str], healthy: usize, eligible: usize) {
        self.available = if failed.is_empty() {
            verdict(
                true,
                "AllHealthy",
                format!("no node failed; {healthy} of {eligible} node(s) report healthy"),
            )
        } else {
            verdict(
                false,
                "NodesFailed",
                format!("{} node(s) failed: {}", failed.len(), list(failed)),
            )
        };
    }

    /// The target revision failed more nodes than the budget allows.
    pub fn revision_failed(&mut self, revision: &str, failed: &[&str]) {
        let message = format!(
            "revision {revision} failed on {} node(s): {}",
            failed.len(),
            list(failed)
        );
        self.degraded.push((
            3,
            Verdict {
                status: true,
                reason: "RevisionFailed",
                message,
            },
        ));
    }

    /// Failed nodes that do not fail `revision`: within the failure budget, or (`done`) on a
    /// revision that already reached every node.
    pub fn failures_within_budget(
        &mut self,
        revision: &str,
        failed: &[&str],
        budget: u32,
        done: bool,
    ) {
        if !failed.is_empty() {
            let message = if done {
                format!(
                    "{} node(s) failed on revision {revision} after it reached every node: {}",
                    failed.len(),
                    list(failed)
                )
            } else {
                format!(
                    "{} node(s) failed revision {revision}, within the failure budget of {budget}: {}",
                    failed.len(),
                    list(failed)
                )
            };
            self.degraded.push((
                1,
                Verdict {
                    status: true,
                    reason: "NodesFailed",
                    message,
                },
            ));
        }
    }

    /// Rollback mode: `returning` nodes are not yet back on the last good revision.
    pub fn rolled_back(&mut self, bad: &str, good: Option<&str>, returning: usize) {
        let to = good.map_or_else(
            || "the proxiers' local configuration".to_owned(),
            |g| format!("revision {g}"),
        );
        self.progressing = if returning > 0 {
            verdict(
                true,
                "RollingBack",
                format!("{returning} node(s) returning to {to}"),
            )
        } else {
            verdict(false, "RolledBack", format!("every node is back on {to}"))
        };
        let message = format!(
            "revision {bad} is bad and was rolled back to {to}; change spec.config to roll out a new revision"
        );
        self.degraded.push((
            3,
            Verdict {
                status: true,
                reason: "RevisionFailed",
                message,
            },
        ));
    }

    /// Halted mode: a bad revision, no autoRollback.
    pub fn halted(&mut self, bad: &str) {
        self.progressing = verdict(
            false,
            "Halted",
            format!("revision {bad} is bad and autoRollback is off: the rollout is halted"),
        );
        let message =
            format!("revision {bad} is bad; nodes that have it keep it (autoRollback is off)");
        self.degraded.push((
            3,
            Verdict {
                status: true,
                reason: "RevisionFailed",
                message,
            },
        ));
    }

    /// The ProxyConfig selects no node it can configure.
    pub fn no_nodes(&mut self, message: &str) {
        self.progressing = verdict(false, "NoNodes", message);
    }

    /// The stage at the cursor has fewer nodes than its `minNodes`.
    pub fn stage_too_small(&mut self, message: &str) {
        self.too_small = Some(message.to_owned());
        self.degraded.push((
            2,
            Verdict {
                status: true,
                reason: "StageTooSmall",
                message: message.to_owned(),
            },
        ));
    }

    /// A stage waits for the promote annotation.
    pub fn awaiting_promotion(&mut self, stage: &str, command: &str) {
        if !self.paused.as_ref().is_some_and(|p| p.status) {
            self.paused = verdict(
                true,
                "AwaitingPromotion",
                format!("stage {stage} waits for a person: {command}"),
            );
        }
    }

    /// Rollout mode: where the cursor is.
    pub fn progress(
        &mut self,
        revision: &str,
        stages: &[Stage],
        status: &[StageStatus],
        cursor: usize,
        updated: u32,
        healthy: u32,
    ) {
        self.progressing = match (stages.get(cursor), status.get(cursor)) {
            (Some(_), Some(_)) if self.too_small.is_some() => verdict(
                true,
                "StageTooSmall",
                self.too_small.clone().unwrap_or_default(),
            ),
            (Some(stage), Some(st)) => {
                let reason = match st.phase {
                    StagePhase::Soaking => "Soaking",
                    StagePhase::AwaitingPromotion => "AwaitingPromotion",
                    _ => "RollingOut",
                };
                verdict(
                    true,
                    reason,
                    format!(
                        "revision {revision}: stage {} ({}/{}) {:?}: {} of {} node(s) healthy; {updated} updated, {healthy} healthy in all",
                        stage.name,
                        cursor + 1,
                        stages.len(),
                        st.phase,
                        st.healthy,
                        st.total - st.skipped,
                    ),
                )
            }
            _ => verdict(
                false,
                "RolloutComplete",
                format!("revision {revision} is on every node"),
            ),
        };
    }

    /// The conditions, in [`TYPES`] order; undecided ones keep their previous value.
    pub fn finish(self) -> Vec<Condition> {
        let mut degraded = self.degraded;
        degraded.sort_by_key(|(priority, _)| std::cmp::Reverse(*priority));
        let degraded = match degraded.split_first() {
            Some(((_, top), rest)) => {
                let mut message = top.message.clone();
                for (_, other) in rest {
                    message.push_str("; ");
                    message.push_str(&other.message);
                }
                verdict(true, top.reason, message)
            }
            None => verdict(
                false,
                "AsExpected",
                "no invalid spec, failed revision, failed node, failing write, conflict or returned kube-proxy",
            ),
        };
        let verdicts = [self.progressing, self.available, degraded, self.paused];
        TYPES
            .iter()
            .zip(verdicts)
            .filter_map(|(type_, verdict)| {
                let previous = self.previous.iter().find(|c| c.type_ == *type_);
                match verdict {
                    None => previous.cloned(),
                    Some(v) => {
                        let status = if v.status { "True" } else { "False" };
                        let last_transition_time = previous
                            .filter(|p| p.status == status)
                            .map_or(Time(self.now), |p| p.last_transition_time.clone());
                        Some(Condition {
                            type_: (*type_).to_owned(),
                            status: status.to_owned(),
                            reason: v.reason.to_owned(),
                            message: v.message,
                            observed_generation: self.generation,
                            last_transition_time,
                        })
                    }
                }
            })
            .collect()
    }
}

/// The part of Degraded `KubeProxyReturned`'s message that names `nodes` (also how a decision
/// tells that it reported them already).
pub(crate) fn kube_proxy_returned(nodes: &[&str]) -> String {
    format!(
        "kube-proxy runs on {} node(s) labelled kipvs.io/service-proxy=kipvs, where kipvs stands \
         by: {}",
        nodes.len(),
        list(nodes)
    )
}

/// The first five names of a list, then how many more, for condition and Event messages.
pub(crate) fn list(names: &[&str]) -> String {
    let mut text = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        text.push_str(&format!(" and {} more", names.len() - 5));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn transition_time_changes_only_with_the_status() {
        let mut first = ConditionSet::new(&[], at(100), Some(1));
        first.set_paused(false);
        first.available(&[], 3, 3);
        let first = first.finish();
        let times = |conditions: &[Condition]| -> Vec<i64> {
            conditions
                .iter()
                .map(|c| c.last_transition_time.0.as_second())
                .collect()
        };
        assert_eq!(times(&first), [100, 100, 100]);

        // Same statuses, new message: times kept.
        let mut second = ConditionSet::new(&first, at(200), Some(2));
        second.set_paused(false);
        second.available(&[], 2, 3);
        let second = second.finish();
        assert_eq!(times(&second), [100, 100, 100]);
        assert_eq!(
            second[0].message,
            "no node failed; 2 of 3 node(s) report healthy"
        );
        assert_eq!(second[0].observed_generation, Some(2));

        // Available flips: only its time moves.
        let mut third = ConditionSet::new(&second, at(300), Some(2));
        third.set_paused(false);
        third.available(&["n1"], 2, 3);
        let third = third.finish();
        assert_eq!(times(&third), [300, 100, 100]);
        assert_eq!(third[0].reason, "NodesFailed");
    }

    #[test]
    fn degraded_reports_the_most_serious_reason_first() {
        let mut set = ConditionSet::new(&[], at(1), None);
        set.conflicts(&["a"]);
        set.revision_failed("r1", &["b"]);
        let conditions = set.finish();
        let degraded = conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert_eq!(degraded.status, "True");
        assert_eq!(degraded.reason, "RevisionFailed");
        assert_eq!(
            degraded.message,
            "revision r1 failed on 1 node(s): b; 1 node(s) are also selected by another \
             ProxyConfig and are left alone: a"
        );
    }
}
