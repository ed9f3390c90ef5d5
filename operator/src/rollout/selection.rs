//! Selection (membership before stages): the nodes a ProxyConfig decides about, and each
//! member's health against the revision its NodeProxyConfig carries.

use super::input::{Input, NodeView, NpcView};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::revision::node_hash;
use kipvs_crds::{NodePhase, ServiceProxy, ServiceProxyPhase};
use kube::core::{Selector, SelectorExt};
use std::collections::HashSet;
use std::time::Duration;

/// A node's state against the revision its NodeProxyConfig carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Health {
    Healthy,
    InFlight,
    Failed,
}

/// One selected, non-conflicting node, with what the decision derives about it.
pub(super) struct Member<'a> {
    pub(super) view: &'a NodeView<'a>,
    pub(super) hash: u64,
    pub(super) npc: Option<&'a NpcView<'a>>,
    pub(super) stage: usize,
}

impl Member<'_> {
    pub(super) fn revision(&self) -> Option<&str> {
        self.npc.map(|n| n.revision)
    }
    pub(super) fn health(&self, timeout: Duration, now: Timestamp) -> Option<Health> {
        self.npc.map(|npc| health(npc, timeout, now))
    }
}

pub(super) fn health(npc: &NpcView<'_>, timeout: Duration, now: Timestamp) -> Health {
    let status = npc
        .status
        .filter(|s| s.observed_revision.as_deref() == Some(npc.revision));
    let phase = status.and_then(|s| s.phase);
    if phase == Some(NodePhase::Applied)
        && status.and_then(|s| s.healthy) == Some(true)
        && status.is_some_and(|s| served_by(npc.service_proxy, s.service_proxy))
    {
        Health::Healthy
    } else if phase == Some(NodePhase::Failed) || now >= deadline(npc, timeout) {
        Health::Failed
    } else {
        Health::InFlight
    }
}

/// Whether a proxier reporting `phase` (`status.serviceProxy`; None from a proxier that
/// predates the takeover) shows the node served by `proxy`, the `serviceProxy` of the revision
/// it reports: [`ServiceProxyPhase::ready_for`]. A proxier without the field always programs,
/// so it serves a `kipvs` revision and never a `kube-proxy` one: such a revision stays in
/// flight on it until `applyTimeout` fails the node (and the node keeps its label `kipvs`, so
/// kube-proxy does not start next to it).
pub(super) fn served_by(proxy: ServiceProxy, phase: Option<ServiceProxyPhase>) -> bool {
    match phase {
        Some(phase) => phase.ready_for(proxy),
        None => proxy == ServiceProxy::Kipvs,
    }
}

/// Whether the proxier reports the revision its NodeProxyConfig carries as Applied (healthy or
/// not).
pub(super) fn applied(npc: &NpcView<'_>) -> bool {
    npc.status.is_some_and(|s| {
        s.observed_revision.as_deref() == Some(npc.revision) && s.phase == Some(NodePhase::Applied)
    })
}

pub(super) fn deadline(npc: &NpcView<'_>, timeout: Duration) -> Timestamp {
    npc.assigned_at
        .checked_add(timeout)
        .unwrap_or(Timestamp::MAX)
}

/// The nodes a ProxyConfig decides about, as [`select`] sorts them.
pub(super) struct Selection<'a> {
    /// Selected, not conflicting; with the NodeProxyConfig if this ProxyConfig controls it.
    pub(super) members: Vec<Member<'a>>,
    /// Selected, but also selected by another ProxyConfig or controlled by one: left alone.
    pub(super) conflicts: Vec<&'a str>,
    /// Nodes with a NodeProxyConfig of this ProxyConfig that it no longer selects, or whose
    /// Node is gone: their NodeProxyConfig is deleted.
    pub(super) unselected_owned: Vec<&'a str>,
}

/// Selection (membership before stages): which nodes `own` selects, which of them conflict
/// with another ProxyConfig, and which NodeProxyConfigs of this one have no selected node.
/// An orphan (its controlling ProxyConfig is gone) is adopted by the one that selects its node,
/// through the staged rollout.
pub(super) fn select<'a>(input: &Input<'a>, own: &Selector) -> Selection<'a> {
    let mut selection = Selection {
        members: Vec::with_capacity(input.nodes.len()),
        conflicts: Vec::new(),
        unselected_owned: Vec::new(),
    };
    for view in input.nodes {
        let npc = input.npcs.get(view.name);
        let ours = npc.is_some_and(|n| n.owner == Some(input.name));
        if !own.matches(view.labels) {
            if ours {
                selection.unselected_owned.push(view.name);
            }
            continue;
        }
        let foreign = npc.is_some_and(|n| n.owner.is_some_and(|o| o != input.name));
        if foreign || input.others.iter().any(|o| o.matches(view.labels)) {
            selection.conflicts.push(view.name);
            continue;
        }
        selection.members.push(Member {
            view,
            hash: node_hash(view.name),
            npc: npc.filter(|_| ours),
            stage: 0,
        });
    }
    let node_names: HashSet<&str> = input.nodes.iter().map(|n| n.name).collect();
    for (name, npc) in input.npcs {
        if npc.owner == Some(input.name) && !node_names.contains(name) {
            selection.unselected_owned.push(name);
        }
    }
    selection
}
