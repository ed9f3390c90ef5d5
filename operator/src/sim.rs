//! An in-memory fleet for [`decide`]: Nodes, NodeProxyConfigs and one ProxyConfig, with
//! [`Fleet::step`] applying a decision's writes and status the way the API server would. Unit
//! tests, the 5,000-node simulation and the benchmark drive the decision through it, and it
//! answers "what would this ProxyConfig do to this fleet" without a cluster.
//!
//! [`NodeStandIn`] plays one node's kube-proxy and kipvs through a move between them, for the
//! takeover tests (`tests/takeover.rs`) and the harnesses that run the operator without real
//! nodes (`examples/fake_proxier.rs`, `examples/fleet`).

use crate::rollout::{
    Decision, Input, KubeProxyDaemonSet, Label, NodeView, NpcView, Write, decide,
};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{
    NodePhase, NodeProxyConfig, NodeProxyConfigStatus, ProxyConfig, ProxyConfigSpec,
    SERVICE_PROXY_LABEL, ServiceProxy, ServiceProxyPhase,
};
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
    /// kube-proxy's DaemonSet as the operator sees it (`Input::kube_proxy`).
    pub kube_proxy: KubeProxyDaemonSet,
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
            kube_proxy: KubeProxyDaemonSet::Unknown,
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
            kube_proxy: self.kube_proxy,
            now: self.now,
        })
    }

    /// Applies a decision as the controller and the API server would: writes (keeping each
    /// NodeProxyConfig's status, as server-side apply of the spec does), labels and the status.
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
                Write::Label(label) => self.label(label),
            }
        }
        for label in &decision.labels {
            self.label(label);
        }
        self.pc.status = Some(decision.status.clone());
    }

    /// Sets a Node's service proxy label as the operator's server-side apply does.
    fn label(&mut self, label: &Label) {
        if let Some(node) = self.nodes.get_mut(&label.node) {
            node.metadata.labels.get_or_insert_default().insert(
                SERVICE_PROXY_LABEL.to_owned(),
                label.proxy.as_str().to_owned(),
            );
        }
    }

    /// The service proxy label of a node (None: unlabelled or no such node).
    pub fn label_of(&self, node: &str) -> Option<&str> {
        self.nodes
            .get(node)
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(SERVICE_PROXY_LABEL))
            .map(String::as_str)
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
    /// health (a proxier that predates `status.serviceProxy`).
    pub fn report(&mut self, node: &str, phase: NodePhase, healthy: bool, message: &str) {
        self.report_service_proxy(node, phase, healthy, message, None);
    }

    /// A proxier's report, as [`Fleet::report`], with `status.serviceProxy`.
    pub fn report_service_proxy(
        &mut self,
        node: &str,
        phase: NodePhase,
        healthy: bool,
        message: &str,
        service_proxy: Option<ServiceProxyPhase>,
    ) {
        if let Some(npc) = self.npcs.get_mut(node) {
            npc.status = Some(NodeProxyConfigStatus {
                observed_revision: Some(npc.spec.revision.clone()),
                phase: Some(phase),
                healthy: Some(healthy),
                last_sync_time: Some(Time(self.now)),
                message: (!message.is_empty()).then(|| message.to_owned()),
                sync_errors: Some(u64::from(phase == NodePhase::Failed)),
                service_proxy,
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

/// One node's kube-proxy (its DaemonSet patched once to avoid nodes labelled
/// `kipvs.io/service-proxy=kipvs`) and kipvs proxier, through a move between them as the contract
/// in `kipvs_crds::nodeproxyconfig` describes it. A node starts with kube-proxy running and kipvs
/// standing by. What the proxier reports of a revision (Pending, Applied) is left to the
/// caller's status reducer; [`NodeStandIn::follow`] says where the node stands.
///
/// kube-proxy has a start-up time: its pod runs as soon as its DaemonSet puts it on the node,
/// and programs (has synced) only once the caller says its start-up time has passed
/// ([`NodeStandIn::kube_proxy_synced`]). [`NodeStandIn::serves`] says whether anything serves
/// the node's Services at an instant ("never none").
#[derive(Clone, Debug)]
pub struct NodeStandIn {
    kube_proxy: bool,
    kube_proxy_synced: bool,
    programs: bool,
    took_over: bool,
}

impl Default for NodeStandIn {
    fn default() -> Self {
        NodeStandIn {
            kube_proxy: true,
            kube_proxy_synced: true,
            programs: false,
            took_over: false,
        }
    }
}

/// Where a [`NodeStandIn`] stands after following its revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    /// `status.serviceProxy`.
    pub phase: ServiceProxyPhase,
    /// kipvs has just started programming (it took the node over in this step).
    pub took_over: bool,
    /// kipvs has just stopped programming a node it took over.
    pub handing_back: bool,
    /// Why kipvs does not program, for `status.message` (None while it programs).
    pub message: Option<&'static str>,
    /// `status.healthy` in place of the proxier's `/livez` (kube-proxy's health once handed
    /// back; false when kube-proxy runs again on a node kipvs took over), or None.
    pub healthy: Option<bool>,
}

impl NodeStandIn {
    /// kube-proxy's DaemonSet follows the node's `label` (its [`SERVICE_PROXY_LABEL`]): its pod
    /// runs unless the label is `kipvs`, or always where it `stays` (a DaemonSet that was not
    /// patched there). Returns whether kube-proxy started (Some(true)) or left (Some(false)).
    ///
    /// # Errors
    /// kube-proxy would start while kipvs programs the node (two programmers).
    pub fn label(&mut self, label: Option<&str>, stays: bool) -> Result<Option<bool>, String> {
        let runs = stays || label != Some(ServiceProxy::Kipvs.as_str());
        if runs == self.kube_proxy {
            return Ok(None);
        }
        if runs && self.programs {
            return Err("kube-proxy would start while kipvs programs the node".to_owned());
        }
        self.kube_proxy = runs;
        self.kube_proxy_synced = false;
        Ok(Some(runs))
    }

    /// kube-proxy's DaemonSet is re-applied without the affinity (`kubeadm upgrade`, an addon
    /// manager): its pod starts whatever the label; a kipvs that programs sees it at once, stops
    /// writing and keeps its rules in the kernel (they serve until kube-proxy has synced).
    /// Returns whether kube-proxy started. Call [`NodeStandIn::label`] with `stays` from then
    /// on.
    pub fn kube_proxy_returns(&mut self) -> bool {
        let started = !self.kube_proxy;
        if started {
            self.kube_proxy = true;
            self.kube_proxy_synced = false;
        }
        self.programs = false;
        started
    }

    /// The proxier's process dies (a crashloop): it writes nothing from now on, and what it
    /// wrote is no longer kept up to date ([`NodeStandIn::serves`] with `alive` false).
    pub fn proxier_dies(&mut self) {
        self.programs = false;
        self.took_over = false;
    }

    /// kube-proxy's start-up time has passed since its pod started: it has synced the node.
    /// Nothing without its pod.
    pub fn kube_proxy_synced(&mut self) {
        self.kube_proxy_synced = self.kube_proxy;
    }

    /// Whether something serves the node's Services now: kipvs programs, kipvs's rules are kept
    /// in the kernel by a live proxier that took the node over and stopped writing (handing
    /// back, or standing by for a kube-proxy that came back) until kube-proxy has synced, or
    /// kube-proxy has synced. A node whose proxier is dead (`alive` false) is served only by a
    /// synced kube-proxy.
    pub fn serves(&self, alive: bool) -> bool {
        (alive && (self.programs || self.took_over)) || (self.kube_proxy && self.kube_proxy_synced)
    }

    /// The proxier follows its revision's `serviceProxy`: for `kipvs` it stands by while
    /// kube-proxy runs, else programs; for `kube-proxy` it stops writing at once and waits for
    /// kube-proxy (`HandingBack` where it programmed, else `Standby`), `HandedBack` once
    /// kube-proxy runs.
    pub fn follow(&mut self, proxy: ServiceProxy) -> Standing {
        let was_programming = self.programs;
        let mut standing = Standing {
            phase: ServiceProxyPhase::Standby,
            took_over: false,
            handing_back: false,
            message: None,
            healthy: None,
        };
        match proxy {
            ServiceProxy::Kipvs if self.kube_proxy => {
                self.programs = false;
                standing.message = Some("kube-proxy runs on the node");
                standing.healthy = self.took_over.then_some(false);
            }
            ServiceProxy::Kipvs => {
                self.programs = true;
                self.took_over = true;
                standing.took_over = !was_programming;
                standing.phase = if was_programming {
                    ServiceProxyPhase::Programming
                } else {
                    ServiceProxyPhase::TakingOver
                };
            }
            ServiceProxy::KubeProxy => {
                self.programs = false;
                standing.handing_back = was_programming;
                if self.kube_proxy && self.kube_proxy_synced {
                    self.took_over = false;
                    standing.phase = ServiceProxyPhase::HandedBack;
                    standing.healthy = Some(true);
                } else if self.took_over {
                    standing.phase = ServiceProxyPhase::HandingBack;
                    standing.message = Some("waiting for kube-proxy");
                } else {
                    standing.message = Some("the node runs kube-proxy");
                }
            }
        }
        standing
    }

    /// Whether kube-proxy's pod runs on the node.
    pub fn kube_proxy(&self) -> bool {
        self.kube_proxy
    }

    /// Whether kipvs writes to the kernel.
    pub fn kipvs_programs(&self) -> bool {
        self.programs
    }
}
