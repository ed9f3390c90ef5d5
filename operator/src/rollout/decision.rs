//! The decision: [`decide`] reads the spec, selects the nodes, chooses the target revision's
//! mode and runs it (rollout through the stages, halted, or rollback), then restores drifted
//! specs and reports availability.

use super::input::Input;
use super::outcome::{Decision, Label, Note, Write};
use super::selection::{Health, Member, Selection, deadline, select};
use super::stages::{
    Cursor, StageHealth, advance_stages, assign_stages, carried_stage_statuses, stage_health,
};
use crate::conditions::{ConditionSet, list};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kipvs_crds::proxyconfig::parse_selector;
use kipvs_crds::revision::config_revision;
use kipvs_crds::{PROMOTE_ANNOTATION, ProxyConfigStatus, RolloutSpec, Stage, StageStatus};
use kube::core::Selector;
use std::sync::Arc;
use std::time::Duration;

/// How many bad revisions status keeps.
const MAX_BAD_REVISIONS: usize = 10;

/// Decides what to do about one ProxyConfig. See the module docs for the rules.
pub fn decide(input: &Input<'_>) -> Decision {
    let prev = input.status.cloned().unwrap_or_default();
    let mut d = Decider {
        input,
        prev: &prev,
        status: ProxyConfigStatus {
            observed_generation: input.generation,
            last_good_revision: prev.last_good_revision.clone(),
            last_good_config: prev.last_good_config.clone(),
            bad_revisions: prev.bad_revisions.clone(),
            ..ProxyConfigStatus::default()
        },
        writes: Vec::new(),
        labels: Vec::new(),
        events: Vec::new(),
        requeue: None,
        conditions: ConditionSet::new(&prev.conditions, input.now, input.generation),
    };
    d.run();
    let Decider {
        mut status,
        writes,
        labels,
        events,
        requeue,
        conditions,
        ..
    } = d;
    status.conditions = conditions.finish();
    Decision {
        status,
        writes,
        labels,
        events,
        requeue_after: requeue,
    }
}

/// One decision in progress: its input, the previous status, and what it has decided so far.
/// Its steps are methods here and in the sibling modules (`writes`, `report`).
pub(super) struct Decider<'a> {
    pub(super) input: &'a Input<'a>,
    pub(super) prev: &'a ProxyConfigStatus,
    pub(super) status: ProxyConfigStatus,
    pub(super) writes: Vec<Write>,
    pub(super) labels: Vec<Label>,
    pub(super) events: Vec<Note>,
    pub(super) requeue: Option<Duration>,
    pub(super) conditions: ConditionSet,
}

/// How the target revision was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Rollout,
    Halted,
    Rollback,
}

/// The target revision's mode: spec's revision rolls out unless it is bad; a bad one is
/// rolled back (autoRollback) or halts the rollout.
fn target_mode(bad: bool, auto_rollback: bool) -> Mode {
    match (bad, auto_rollback) {
        (false, _) => Mode::Rollout,
        (true, false) => Mode::Halted,
        (true, true) => Mode::Rollback,
    }
}

/// Whether `failed` nodes exceed the failure budget (the budget is how many may fail).
fn over_budget(failed: usize, budget: u32) -> bool {
    failed > budget as usize
}

impl<'a> Decider<'a> {
    /// Records an Event to publish.
    pub(super) fn note(&mut self, warning: bool, reason: &'static str, message: String) {
        self.events.push(Note {
            warning,
            reason,
            message,
        });
    }

    /// Asks to decide again by `at` (the earliest of the times asked for wins).
    pub(super) fn requeue_at(&mut self, at: Timestamp) {
        let after = until(self.input.now, at);
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }

    /// The decision in order: the spec checked, the nodes selected, the target revision's mode
    /// run, hand edits restored, availability reported, the service proxy labels followed.
    fn run(&mut self) {
        let spec = self.input.spec;
        self.conditions.set_paused(spec.paused);
        self.conditions.write_failures(self.input.failing_writes);
        let Some(own) = self.own_selector() else {
            return;
        };
        let spec_revision = config_revision(&spec.config);
        self.status.revision = Some(spec_revision.clone());
        let mut members = self.members(&own);
        let mode = target_mode(
            self.status.bad_revisions.contains(&spec_revision),
            spec.rollout.auto_rollback,
        );
        let drifted: Vec<&str> = members
            .iter()
            .filter(|m| m.view.skip.is_none() && m.npc.is_some_and(|n| self.drifted(n)))
            .map(|m| m.view.name)
            .collect();
        match mode {
            Mode::Rollout if members.is_empty() => self.no_nodes(spec_revision.clone()),
            Mode::Rollout => self.rollout(&mut members, spec_revision.clone()),
            Mode::Halted => self.halted(&members, spec_revision.clone()),
            Mode::Rollback => self.rollback(&members, &spec_revision),
        }
        self.restore_drifted(&members, &drifted, &spec_revision);
        self.report_availability(&members);
        self.report_kube_proxy_returned(&members);
        self.label_members(&members);
    }

    /// `spec.nodeSelector`, once the spec is valid. An invalid spec is reported (Degraded
    /// `InvalidSpec`, an Event when the message is new) and decides nothing else: the revisions
    /// in status stay as they were.
    fn own_selector(&mut self) -> Option<Selector> {
        let spec = self.input.spec;
        let own = spec.validate().and_then(|()| {
            spec.node_selector
                .as_ref()
                .map(|s| parse_selector(s, "spec.nodeSelector"))
                .transpose()
        });
        let error = match own {
            Ok(selector) => return Some(selector.unwrap_or_default()),
            Err(e) => e.to_string(),
        };
        if !self
            .prev
            .conditions
            .iter()
            .any(|c| c.reason == "InvalidSpec" && c.message == error)
        {
            self.note(true, "InvalidSpec", error.clone());
        }
        self.conditions.invalid_spec(&error);
        self.status.revision = self.prev.revision.clone();
        self.status.target_revision = self.prev.target_revision.clone();
        None
    }

    /// The members `own` selects, sorted by name hash (the order sized stages take them in);
    /// NodeProxyConfigs of nodes no longer selected are deleted, conflicts reported, the node
    /// counts set.
    fn members(&mut self, own: &Selector) -> Vec<Member<'a>> {
        let Selection {
            mut members,
            mut conflicts,
            unselected_owned,
        } = select(self.input, own);
        for node in unselected_owned {
            self.write(Write::Delete {
                node: node.to_owned(),
            });
        }
        conflicts.sort_unstable();
        self.report_conflicts(&conflicts);
        self.status.total_nodes = count(members.len() + conflicts.len());
        self.status.skipped_nodes = count(members.iter().filter(|m| m.view.skip.is_some()).count());
        members.sort_unstable_by(|a, b| (a.hash, a.view.name).cmp(&(b.hash, b.view.name)));
        members
    }

    /// No node to configure: the rollout does not start (a revision is never "good" on no
    /// node, or nodes joining later would get it without a canary); the status says so and
    /// one Event tells when it starts selecting nothing.
    fn no_nodes(&mut self, target: String) {
        if self.prev.target_revision.as_deref() == Some(target.as_str()) {
            self.status.stages = self.prev.stages.clone();
            self.status.stage = self.prev.stage.clone();
        }
        self.status.target_revision = Some(target);
        let message = match self.status.conflicting_node_count {
            0 => "spec.nodeSelector selects no node: nothing to roll out".to_owned(),
            n => format!(
                "every node spec.nodeSelector selects ({n}) is also selected by another \
                 ProxyConfig: nothing to roll out"
            ),
        };
        let was = self
            .prev
            .conditions
            .iter()
            .any(|c| c.type_ == "Progressing" && c.reason == "NoNodes");
        if !was {
            self.note(true, "NoNodes", message.clone());
        }
        self.conditions.no_nodes(&message);
    }

    /// A revision rolling out, in the order of its decisions: stage membership, health
    /// (latched per revision), the failure budget, the stage cursor, the writes, then the
    /// status of where the rollout stands.
    fn rollout(&mut self, members: &mut [Member<'a>], target: String) {
        let input = self.input;
        let rollout: &RolloutSpec = &input.spec.rollout;
        let stages = rollout.effective_stages();
        let continuing = self.prev.target_revision.as_deref() == Some(target.as_str());
        let done = continuing && self.prev.last_good_revision.as_deref() == Some(target.as_str());
        self.status.target_revision = Some(target.clone());

        let mut stage_status = carried_stage_statuses(&stages, &self.prev.stages, continuing, done);
        assign_stages(&stages, &mut stage_status, members);

        let health = self.count_health(members, &target, &mut stage_status);
        let failed_names: Vec<&str> = health.failed.iter().map(|m| m.view.name).collect();

        // A revision that already reached every node is the last good one: its failures only
        // make the ProxyConfig unavailable.
        if !done && over_budget(health.failed.len(), rollout.failure_budget) {
            self.status.stages = stage_status;
            self.fail_revision(members, target, &failed_names);
            return;
        }
        self.conditions.failures_within_budget(
            &target,
            &failed_names,
            rollout.failure_budget,
            done,
        );

        let cursor = self.advance(&stages, &mut stage_status, &target);
        self.write_rollout(
            members,
            &target,
            &stages,
            &mut stage_status,
            &health,
            &cursor,
        );
        self.report_cursor(&stages, &stage_status, &cursor, &target);
        self.conditions.progress(
            &target,
            &stages,
            &stage_status,
            cursor.at,
            self.status.updated_nodes,
            self.status.healthy_nodes,
        );
        self.status.stages = stage_status;
    }

    /// Each stage's members counted against `target` ([`stage_health`]) into `stage_status` and
    /// the status's node counts; failed nodes reported; the apply deadlines of those in flight
    /// are the next looks.
    fn count_health<'m>(
        &mut self,
        members: &'m [Member<'a>],
        target: &str,
        stage_status: &mut [StageStatus],
    ) -> StageHealth<'m, 'a> {
        let timeout = self.input.spec.rollout.apply_timeout;
        let health = stage_health(members, target, stage_status, timeout, self.input.now);
        for at in &health.deadlines {
            self.requeue_at(*at);
        }
        self.status.updated_nodes = count(stage_status.iter().map(|s| s.updated as usize).sum());
        self.status.healthy_nodes = count(stage_status.iter().map(|s| s.healthy as usize).sum());
        self.status.failed_nodes = count(health.failed.len());
        self.report_failures(target, &health.failed);
        health
    }

    /// The stage cursor for `target` ([`advance_stages`], promoted by the ProxyConfig's
    /// [`PROMOTE_ANNOTATION`]), with its Events; the end of a soak is the next look.
    fn advance(
        &mut self,
        stages: &[Stage],
        stage_status: &mut [StageStatus],
        target: &str,
    ) -> Cursor {
        let input = self.input;
        let promote = input.annotations.and_then(|a| a.get(PROMOTE_ANNOTATION));
        let cursor = advance_stages(
            stages,
            stage_status,
            target,
            input.now,
            input.spec.paused,
            promote.map(String::as_str),
        );
        if let Some(at) = cursor.soak_end {
            self.requeue_at(at);
        }
        self.events.extend(cursor.notes.iter().cloned());
        cursor
    }

    /// More failures than the budget: the revision is bad; with autoRollback the nodes return
    /// to the last good revision, else the rollout halts.
    fn fail_revision(&mut self, members: &[Member<'_>], target: String, failed: &[&str]) {
        let rollout = &self.input.spec.rollout;
        self.status.bad_revisions.push(target.clone());
        let excess = self
            .status
            .bad_revisions
            .len()
            .saturating_sub(MAX_BAD_REVISIONS);
        self.status.bad_revisions.drain(..excess);
        self.note(
            true,
            "RevisionFailed",
            format!(
                "revision {target} failed on {} node(s) (failure budget {}): {}",
                failed.len(),
                rollout.failure_budget,
                list(failed)
            ),
        );
        self.conditions.revision_failed(&target, failed);
        if rollout.auto_rollback {
            self.rollback(members, &target);
        } else {
            self.halted(members, target);
        }
    }

    /// Every node this ProxyConfig controls returns to the last good revision at once.
    fn rollback(&mut self, members: &[Member<'_>], bad: &str) {
        let good = self.status.last_good_revision.clone();
        self.status.target_revision = good.clone();
        self.keep_failed_rollout();
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        let mut returning = 0;
        let (mut updated, mut healthy) = (0, 0);
        match (good, self.status.last_good_config.clone()) {
            (Some(good), Some(config)) => {
                let revision: Arc<str> = good.as_str().into();
                let config = Arc::new(config);
                for m in members.iter().filter(|m| m.view.skip.is_none()) {
                    if m.revision() == Some(&good) {
                        updated += 1;
                        match m.health(timeout, now) {
                            Some(Health::Healthy) => healthy += 1,
                            Some(Health::InFlight) => {
                                returning += 1;
                                if let Some(npc) = m.npc {
                                    self.requeue_at(deadline(npc, timeout));
                                }
                            }
                            _ => {}
                        }
                    } else {
                        returning += 1;
                        self.assign(m.view, &revision, &config);
                    }
                }
            }
            _ => {
                for m in members
                    .iter()
                    .filter(|m| m.view.skip.is_none() && m.npc.is_some())
                {
                    returning += 1;
                    self.write(Write::Delete {
                        node: m.view.name.to_owned(),
                    });
                }
            }
        }
        self.status.updated_nodes = updated;
        self.status.healthy_nodes = healthy;
        self.conditions
            .rolled_back(bad, self.status.last_good_revision.as_deref(), returning);
        if returning > 0 && self.prev.target_revision.as_deref() == Some(bad) {
            let to = self
                .status
                .last_good_revision
                .as_deref()
                .unwrap_or("the local configuration");
            self.note(
                true,
                "RollingBack",
                format!("revision {bad} is bad: returning {returning} node(s) to {to}"),
            );
        }
    }

    /// A bad revision without autoRollback: nothing moves; nodes without configuration still get
    /// the last good revision.
    fn halted(&mut self, members: &[Member<'_>], bad: String) {
        self.keep_failed_rollout();
        self.status.updated_nodes = count(
            members
                .iter()
                .filter(|m| m.revision() == Some(&bad))
                .count(),
        );
        self.status.target_revision = Some(bad.clone());
        if let (Some(good), Some(config)) = (
            self.status.last_good_revision.clone(),
            self.status.last_good_config.clone(),
        ) {
            let revision: Arc<str> = good.into();
            let config = Arc::new(config);
            for m in members
                .iter()
                .filter(|m| m.view.skip.is_none() && m.npc.is_none())
            {
                self.assign(m.view, &revision, &config);
            }
        }
        self.conditions.halted(&bad);
    }

    /// After a revision failed, status keeps its stages and failures for diagnosis (unless this
    /// decision just filled them).
    fn keep_failed_rollout(&mut self) {
        if self.status.stages.is_empty() {
            self.status.stages = self.prev.stages.clone();
        }
        if self.status.failures.is_empty() {
            self.status.failures = self.prev.failures.clone();
        }
    }
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    let d = then.duration_since(now);
    Duration::try_from(d.max(SignedDuration::ZERO)).unwrap_or(Duration::ZERO)
}

pub(super) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
