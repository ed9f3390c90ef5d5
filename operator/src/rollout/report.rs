//! Reports: what the status and Events say about conflicts, availability, failed nodes and
//! where the rollout stands.

use super::decision::{Decider, count};
use super::input::{KUBE_PROXY_READ_INTERVAL, KubeProxyDaemonSet};
use super::labels::{kube_proxy_returned, stands_by_for_kube_proxy};
use super::selection::{Health, Member};
use super::stages::Cursor;
use crate::conditions::{self, list};
use kipvs_crds::{
    NodeFailure, NodePhase, PROMOTE_ANNOTATION, SERVICE_PROXY_LABEL, ServiceProxy, Stage,
    StagePhase, StageStatus,
};

/// How many conflicting node names and failures status keeps.
const MAX_LISTED: usize = 20;

impl<'a> Decider<'a> {
    /// Conflicting nodes in status (the count, and the first [`MAX_LISTED`] names), with an
    /// Event when the names change.
    pub(super) fn report_conflicts(&mut self, conflicts: &[&str]) {
        self.status.conflicting_node_count = count(conflicts.len());
        self.status.conflicting_nodes = conflicts
            .iter()
            .take(MAX_LISTED)
            .map(|s| s.to_string())
            .collect();
        if !conflicts.is_empty() && self.prev.conflicting_nodes != self.status.conflicting_nodes {
            self.note(
                true,
                "NodeConflict",
                format!(
                    "{} node(s) are also selected by another ProxyConfig and are left alone: {}",
                    conflicts.len(),
                    list(conflicts)
                ),
            );
        }
        self.conditions.conflicts(conflicts);
    }

    /// kube-proxy running on members labelled `kipvs` whose proxier stands by for their
    /// `kipvs` revision because of it (`labels::kube_proxy_returned`, or any such standby while
    /// kube-proxy's DaemonSet lacks its affinity), as Degraded `KubeProxyReturned` with one
    /// Event when the names change; while there are such nodes, a look again after
    /// [`KUBE_PROXY_READ_INTERVAL`] (the DaemonSet read again).
    pub(super) fn report_kube_proxy_returned(&mut self, members: &[Member<'_>]) {
        let unpatched = self.input.kube_proxy == KubeProxyDaemonSet::Unpatched;
        let kipvs = Some(ServiceProxy::Kipvs.as_str());
        let nodes: Vec<&str> = members
            .iter()
            .filter(|m| m.view.skip.is_none())
            .filter(|m| m.view.labels.get(SERVICE_PROXY_LABEL).map(String::as_str) == kipvs)
            .filter(|m| {
                m.npc.is_some_and(|npc| {
                    kube_proxy_returned(npc) || (unpatched && stands_by_for_kube_proxy(npc))
                })
            })
            .map(|m| m.view.name)
            .collect();
        let was = self
            .prev
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .map(|c| c.message.clone());
        self.conditions
            .kube_proxy_returned(&nodes, self.input.kube_proxy.cause());
        if !nodes.is_empty() {
            let again = self.input.now.checked_add(KUBE_PROXY_READ_INTERVAL);
            self.requeue_at(again.unwrap_or(self.input.now));
        }
        // Said already while the names stay (also under a Degraded reason of higher rank).
        // The names end at "; " (the cause follows), so node-1 is not found in "node-10; ".
        let said = was
            .is_some_and(|m| m.contains(&format!("{}; ", conditions::kube_proxy_returned(&nodes))));
        if !nodes.is_empty() && !said {
            self.note(
                true,
                "KubeProxyReturned",
                format!(
                    "kube-proxy runs again on {} node(s) labelled kipvs: {}",
                    nodes.len(),
                    list(&nodes)
                ),
            );
        }
    }

    /// Available: no node this ProxyConfig controls is failed on the revision it carries.
    pub(super) fn report_availability(&mut self, members: &[Member<'_>]) {
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        let mut failed = Vec::new();
        let mut healthy = 0;
        let mut eligible = 0;
        for m in members.iter().filter(|m| m.view.skip.is_none()) {
            match m.health(timeout, now) {
                Some(Health::Healthy) => healthy += 1,
                Some(Health::Failed) => failed.push(m.view.name),
                _ => {}
            }
            eligible += 1;
        }
        let was_available = self
            .prev
            .conditions
            .iter()
            .find(|c| c.type_ == "Available")
            .is_none_or(|c| c.status == "True");
        // Nodes failing the rollout have their NodeFailed Events; the others (a node unhealthy
        // after its stage completed, on a latched or good revision) get this one.
        let unhealthy: Vec<&str> = failed
            .iter()
            .copied()
            .filter(|n| self.status.failures.iter().all(|f| f.node != *n))
            .collect();
        if was_available && !unhealthy.is_empty() {
            self.note(
                true,
                "NodesUnhealthy",
                format!(
                    "{} node(s) are unhealthy on the revision they carry (not counted against \
                     a revision whose stage completed): {}",
                    unhealthy.len(),
                    list(&unhealthy)
                ),
            );
        }
        self.conditions.available(&failed, healthy, eligible);
    }

    /// Where the rollout stands: complete (the target becomes the last good revision), or the
    /// stage it waits in and why (too few nodes, a promotion).
    pub(super) fn report_cursor(
        &mut self,
        stages: &[Stage],
        stage_status: &[StageStatus],
        cursor: &Cursor,
        target: &str,
    ) {
        if cursor.at == stages.len() {
            if self.status.last_good_revision.as_deref() != Some(target) {
                self.status.last_good_revision = Some(target.to_owned());
                self.status.last_good_config = Some(self.input.spec.config.clone());
                let message = match self.status.conflicting_node_count {
                    0 => format!("revision {target} is on every node"),
                    n => format!(
                        "revision {target} is on every node this ProxyConfig controls ({n} \
                         conflicting node(s) are left alone and may run another revision)"
                    ),
                };
                self.note(false, "RolloutComplete", message);
            }
            self.status.stage = None;
            return;
        }
        let stage = &stages[cursor.at];
        self.status.stage = Some(stage.name.clone());
        if let Some(waiting) = cursor.too_small {
            let message = format!(
                "stage {} of revision {target} needs at least {} node(s) (minNodes) and has \
                 {waiting} that are neither skipped nor conflicting: the rollout waits",
                stage.name, stage.min_nodes
            );
            if self.prev.conditions.iter().all(|c| c.message != message) {
                self.note(true, "StageTooSmall", message.clone());
            }
            self.conditions.stage_too_small(&message);
        }
        if stage_status[cursor.at].phase == StagePhase::AwaitingPromotion {
            let command = format!(
                "kubectl annotate proxyconfig {} {PROMOTE_ANNOTATION}={}@{target} --overwrite",
                self.input.name, stage.name
            );
            if self.prev.stage.as_deref() != Some(stage.name.as_str())
                || self.prev.stages.get(cursor.at).map(|s| s.phase)
                    != Some(StagePhase::AwaitingPromotion)
            {
                self.note(
                    false,
                    "StageAwaitingPromotion",
                    format!("stage {} waits for promotion: {command}", stage.name),
                );
            }
            self.conditions.awaiting_promotion(&stage.name, &command);
        }
    }

    /// Failed nodes in status, and an Event for each node that newly failed.
    pub(super) fn report_failures(&mut self, target: &str, failed: &[&Member<'_>]) {
        let timeout = self.input.spec.rollout.apply_timeout;
        for m in failed.iter().take(MAX_LISTED) {
            let status = m.npc.and_then(|n| n.status);
            let message = match status.filter(|s| s.phase == Some(NodePhase::Failed)) {
                Some(s) => format!("Failed: {}", s.message.as_deref().unwrap_or("(no message)")),
                None => format!(
                    "not applied and healthy within applyTimeout {} (reported: observedRevision {}, phase {}, healthy {}{})",
                    kipvs_crds::duration::format(timeout),
                    status
                        .and_then(|s| s.observed_revision.as_deref())
                        .unwrap_or("-"),
                    status
                        .and_then(|s| s.phase)
                        .map_or_else(|| "-".to_owned(), |p| format!("{p:?}")),
                    status
                        .and_then(|s| s.healthy)
                        .map_or_else(|| "-".to_owned(), |h| h.to_string()),
                    service_proxy_note(status),
                ),
            };
            let failure = NodeFailure {
                node: m.view.name.to_owned(),
                revision: target.to_owned(),
                message,
            };
            if !self
                .prev
                .failures
                .iter()
                .any(|f| f.node == failure.node && f.revision == failure.revision)
            {
                self.note(
                    true,
                    "NodeFailed",
                    format!(
                        "node {} failed revision {target}: {}",
                        failure.node, failure.message
                    ),
                );
            }
            self.status.failures.push(failure);
        }
    }
}

/// What a timed-out node's proxier says of the move between kube-proxy and kipvs (empty from a
/// proxier that does not report `status.serviceProxy`): `, serviceProxy Standby: <message>`
/// names a takeover that waits for kube-proxy to leave.
fn service_proxy_note(status: Option<&kipvs_crds::NodeProxyConfigStatus>) -> String {
    let Some((phase, message)) = status.and_then(|s| s.service_proxy.map(|p| (p, &s.message)))
    else {
        return String::new();
    };
    match message {
        Some(message) => format!(", serviceProxy {phase:?}: {message}"),
        None => format!(", serviceProxy {phase:?}"),
    }
}
