//! An in-memory fleet for [`decide`]: Nodes, NodeProxyConfigs and one ProxyConfig, with
//! [`Fleet::step`] applying a decision's writes and status the way the API server would. Unit
//! tests, the 5,000-node simulation and the benchmark drive the decision through it, and it
//! answers "what would this ProxyConfig do to this fleet" without a cluster.

use crate::rollout::{Decision, Input, NodeView, NpcView, Write, decide};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{NodePhase, NodeProxyConfig, NodeProxyConfigStatus, ProxyConfig, ProxyConfigSpec};
use kube::Resource;
use kube::core::Selector;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A Ready Node with these labels.
pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            uid: Some(format!("uid-node-{name}")),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    }
}

/// Marks a Node as being scaled down (taint `ToBeDeletedByClusterAutoscaler`).
pub fn taint_for_scale_down(node: &mut Node) {
    node.spec.get_or_insert_default().taints = Some(vec![Taint {
        key: crate::rollout::TO_BE_DELETED_TAINT.to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Taint::default()
    }]);
}

/// Sets a Node's Ready condition.
pub fn set_ready(node: &mut Node, ready: bool) {
    let status = node.status.get_or_insert_default();
    status.conditions = Some(vec![NodeCondition {
        type_: "Ready".to_owned(),
        status: if ready { "True" } else { "False" }.to_owned(),
        ..NodeCondition::default()
    }]);
}

/// A ProxyConfig as the API server would hold it.
pub fn proxy_config(name: &str, spec: ProxyConfigSpec) -> ProxyConfig {
    let mut pc = ProxyConfig::new(name, spec);
    pc.metadata.generation = Some(1);
    pc.metadata.uid = Some(format!("uid-{name}"));
    pc
}

/// Nodes, NodeProxyConfigs and one ProxyConfig, at a point in time.
#[derive(Clone, Debug)]
pub struct Fleet {
    /// The ProxyConfig being rolled out.
    pub pc: ProxyConfig,
    /// Selectors of other ProxyConfigs (for conflicts).
    pub others: Vec<Selector>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Node>,
    /// NodeProxyConfigs by name.
    pub npcs: BTreeMap<String, NodeProxyConfig>,
    /// Nodes whose NodeProxyConfig write keeps failing, with the error (as the writer reports).
    pub failing_writes: BTreeMap<String, String>,
    /// The current time.
    pub now: Timestamp,
}

impl Fleet {
    /// A fleet of `nodes` at a fixed start time.
    pub fn new(pc: ProxyConfig, nodes: impl IntoIterator<Item = Node>) -> Self {
        Fleet {
            pc,
            others: Vec::new(),
            nodes: nodes
                .into_iter()
                .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
                .collect(),
            npcs: BTreeMap::new(),
            failing_writes: BTreeMap::new(),
            now: Timestamp::from_second(1_800_000_000).expect("valid time"),
        }
    }

    /// The decision for the current state.
    pub fn decide(&self) -> Decision {
        let views: Vec<NodeView<'_>> = self.nodes.values().map(NodeView::from_node).collect();
        let npcs: HashMap<&str, NpcView<'_>> = self
            .npcs
            .iter()
            .map(|(name, npc)| (name.as_str(), NpcView::from_npc(npc)))
            .collect();
        decide(&Input {
            name: self.pc.metadata.name.as_deref().unwrap_or_default(),
            generation: self.pc.metadata.generation,
            spec: &self.pc.spec,
            status: self.pc.status.as_ref(),
            annotations: self.pc.metadata.annotations.as_ref(),
            others: &self.others,
            nodes: &views,
            npcs: &npcs,
            failing_writes: &self.failing_writes,
            now: self.now,
        })
    }

    /// Applies a decision as the controller and the API server would: writes (keeping each
    /// NodeProxyConfig's status, as server-side apply of the spec does) and the status.
    pub fn apply(&mut self, decision: &Decision) {
        for write in &decision.writes {
            match write {
                Write::Assign { node, .. } => {
                    let npc = write
                        .node_proxy_config(&self.owner_reference(), self.now)
                        .expect("an Assign is a NodeProxyConfig");
                    // Server-side apply of the spec and the ownerReferences: the status stays.
                    let stored = self.npcs.entry(node.clone()).or_insert_with(|| npc.clone());
                    stored.spec = npc.spec;
                    stored.metadata.owner_references = npc.metadata.owner_references;
                }
                Write::Delete { node } => {
                    self.npcs.remove(node);
                }
            }
        }
        self.pc.status = Some(decision.status.clone());
    }

    /// Decides and applies; returns the decision.
    pub fn step(&mut self) -> Decision {
        let decision = self.decide();
        self.apply(&decision);
        decision
    }

    /// The controller ownerReference the operator sets on its NodeProxyConfigs.
    pub fn owner_reference(&self) -> OwnerReference {
        self.pc
            .controller_owner_ref(&())
            .expect("sim ProxyConfigs have a name and a uid")
    }

    /// A proxier's report: its NodeProxyConfig's current spec revision with this phase and
    /// health.
    pub fn report(&mut self, node: &str, phase: NodePhase, healthy: bool, message: &str) {
        if let Some(npc) = self.npcs.get_mut(node) {
            npc.status = Some(NodeProxyConfigStatus {
                observed_revision: Some(npc.spec.revision.clone()),
                phase: Some(phase),
                healthy: Some(healthy),
                last_sync_time: Some(Time(self.now)),
                message: (!message.is_empty()).then(|| message.to_owned()),
                sync_errors: Some(u64::from(phase == NodePhase::Failed)),
                ..Default::default()
            });
        }
    }

    /// Every proxier whose NodeProxyConfig's revision is not yet observed reports it; `outcome`
    /// says how each (node, revision) goes (`None`: stays silent).
    pub fn proxiers_report(
        &mut self,
        mut outcome: impl FnMut(&str, &str) -> Option<(NodePhase, bool)>,
    ) {
        let pending: Vec<(String, String)> = self
            .npcs
            .iter()
            .filter(|(_, npc)| {
                npc.status
                    .as_ref()
                    .and_then(|s| s.observed_revision.as_deref())
                    != Some(npc.spec.revision.as_str())
            })
            .map(|(name, npc)| (name.clone(), npc.spec.revision.clone()))
            .collect();
        for (node, revision) in pending {
            if let Some((phase, healthy)) = outcome(&node, &revision) {
                let message = if phase == NodePhase::Failed {
                    "simulated failure"
                } else {
                    ""
                };
                self.report(&node, phase, healthy, message);
            }
        }
    }

    /// Moves the clock forward.
    pub fn advance(&mut self, by: Duration) {
        self.now = self.now.checked_add(by).expect("time in range");
    }

    /// The revision each node's NodeProxyConfig carries (None: no NodeProxyConfig).
    pub fn revision_of(&self, node: &str) -> Option<&str> {
        self.npcs.get(node).map(|n| n.spec.revision.as_str())
    }
}
