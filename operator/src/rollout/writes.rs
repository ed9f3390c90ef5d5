//! Writes: which member gets which revision during a rollout (`maxUnavailable` per stage, the
//! last good revision beyond the cursor), and hand-edited NodeProxyConfig specs restored.

use super::decision::Decider;
use super::input::{NodeView, NpcView};
use super::outcome::Write;
use super::selection::Member;
use super::stages::{Cursor, StageHealth};
use crate::conditions::list;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::revision::config_revision;
use kipvs_crds::{ProxierConfiguration, Stage, StageStatus};
use std::collections::HashSet;
use std::sync::Arc;

/// Which revision a rollout writes to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Assignment {
    /// The revision rolling out.
    Target,
    /// The last good revision (a node beyond the cursor without a NodeProxyConfig).
    LastGood,
}

/// The rollout's writes: members of stages up to the cursor that are not skipped and not on
/// the target get it, at most `maxUnavailable` of a stage in flight at once (at least one;
/// the cursor's stage gets none while it is too small); members beyond the cursor without a
/// NodeProxyConfig get the last good revision.
fn rollout_writes<'m, 'a>(
    members: &'m [Member<'a>],
    target: &str,
    stages: &[Stage],
    stage_status: &[StageStatus],
    in_flight: &[usize],
    cursor: &Cursor,
) -> Vec<(&'m Member<'a>, Assignment)> {
    let mut slots: Vec<usize> = stages
        .iter()
        .zip(stage_status)
        .zip(in_flight)
        .map(|((stage, st), &busy)| {
            stage
                .max_unavailable
                .of(st.total as usize)
                .max(1)
                .saturating_sub(busy)
        })
        .collect();
    let mut writes = Vec::new();
    for m in members {
        if m.view.skip.is_some() || m.revision() == Some(target) {
            continue;
        }
        if m.stage < cursor.at || (m.stage == cursor.at && cursor.too_small.is_none()) {
            if slots[m.stage] > 0 {
                slots[m.stage] -= 1;
                writes.push((m, Assignment::Target));
            }
        } else if m.npc.is_none() {
            writes.push((m, Assignment::LastGood));
        }
    }
    writes
}

impl<'a> Decider<'a> {
    /// Records a write, unless spec.paused (then nothing is written).
    pub(super) fn write(&mut self, write: Write) {
        if !self.input.spec.paused {
            self.writes.push(write);
        }
    }

    /// Records a write giving `node` this revision and configuration.
    pub(super) fn assign(
        &mut self,
        node: &NodeView<'_>,
        revision: &Arc<str>,
        config: &Arc<ProxierConfiguration>,
    ) {
        self.write(Write::Assign {
            node: node.name.to_owned(),
            node_uid: node.uid.map(str::to_owned),
            revision: revision.clone(),
            config: config.clone(),
        });
    }

    /// The writes of a rollout ([`rollout_writes`]): the target revision to the chosen nodes
    /// (counted as updated unless their write keeps failing; their apply deadline is the next
    /// look), the last good revision to unconfigured nodes beyond the cursor.
    pub(super) fn write_rollout(
        &mut self,
        members: &[Member<'_>],
        target: &str,
        stages: &[Stage],
        stage_status: &mut [StageStatus],
        health: &StageHealth<'_, '_>,
        cursor: &Cursor,
    ) {
        let revision: Arc<str> = target.into();
        let config = Arc::new(self.input.spec.config.clone());
        let good: Option<(Arc<str>, Arc<ProxierConfiguration>)> = self
            .status
            .last_good_revision
            .clone()
            .zip(self.status.last_good_config.clone())
            .map(|(r, c)| (r.into(), Arc::new(c)));
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        for (m, assignment) in rollout_writes(
            members,
            target,
            stages,
            stage_status,
            &health.in_flight,
            cursor,
        ) {
            match assignment {
                Assignment::Target => {
                    self.assign(m.view, &revision, &config);
                    // A node whose write keeps failing has no NodeProxyConfig of the target.
                    if !self.input.failing_writes.contains_key(m.view.name) {
                        stage_status[m.stage].updated += 1;
                        self.status.updated_nodes += 1;
                    }
                    self.requeue_at(now.checked_add(timeout).unwrap_or(Timestamp::MAX));
                }
                Assignment::LastGood => {
                    if let Some((good_revision, good_config)) = &good {
                        self.assign(m.view, good_revision, good_config);
                    }
                }
            }
        }
    }

    /// The configuration this ProxyConfig wrote for `revision`, if it still knows it.
    pub(super) fn config_of(
        &self,
        revision: &str,
        spec_revision: &str,
    ) -> Option<&'a ProxierConfiguration> {
        if revision == spec_revision {
            Some(&self.input.spec.config)
        } else if self
            .input
            .status
            .and_then(|s| s.last_good_revision.as_deref())
            == Some(revision)
        {
            self.input.status.and_then(|s| s.last_good_config.as_ref())
        } else {
            None
        }
    }

    /// Whether a NodeProxyConfig's `spec.config` was edited by hand: it is not what this
    /// ProxyConfig wrote for its revision, and its content hashes to another revision.
    pub(super) fn drifted(&self, npc: &NpcView<'_>) -> bool {
        let Some(config) = npc.config else {
            return false;
        };
        let spec_revision = self.status.revision.as_deref().unwrap_or_default();
        if self.config_of(npc.revision, spec_revision) == Some(config) {
            return false;
        }
        config_revision(config) != npc.revision
    }

    /// Drift is corrected: the operator owns NodeProxyConfig specs, so a node whose spec was
    /// edited by hand gets the configuration of its revision back (unless this decision writes
    /// it anyway), with a warning Event naming it.
    pub(super) fn restore_drifted(
        &mut self,
        members: &[Member<'a>],
        drifted: &[&str],
        spec_revision: &str,
    ) {
        if drifted.is_empty() {
            return;
        }
        let written: HashSet<String> = self.writes.iter().map(|w| w.node().to_owned()).collect();
        let mut restored = Vec::new();
        for m in members.iter().filter(|m| drifted.contains(&m.view.name)) {
            let Some(npc) = m.npc else { continue };
            if written.contains(m.view.name) {
                continue;
            }
            if let Some(config) = self.config_of(npc.revision, spec_revision) {
                let revision: Arc<str> = npc.revision.into();
                self.assign(m.view, &revision, &Arc::new(config.clone()));
                restored.push(m.view.name);
            }
        }
        if !restored.is_empty() {
            self.note(
                true,
                "DriftRestored",
                format!(
                    "{} NodeProxyConfig spec(s) edited by hand were restored to the \
                     configuration of their revision: {}",
                    restored.len(),
                    list(&restored)
                ),
            );
        }
    }
}
