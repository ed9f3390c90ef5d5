//! What one decision reads: the ProxyConfig, and views of the Nodes and NodeProxyConfigs that
//! keep only what the rules look at.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{
    NodeProxyConfig, NodeProxyConfigStatus, ProxierConfiguration, ProxyConfigSpec,
    ProxyConfigStatus, SERVICE_PROXY_LABEL, ServiceProxy,
};
use kube::core::Selector;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Taint the cluster autoscaler puts on a node it is about to delete (KEP-3836).
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Why a node is skipped (neither written nor waited for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `metadata.deletionTimestamp` is set.
    Deleting,
    /// Tainted `ToBeDeletedByClusterAutoscaler`.
    ScaleDown,
    /// The Ready condition is not True.
    NotReady,
}

/// What the decision needs of a Node.
#[derive(Clone, Debug)]
pub struct NodeView<'a> {
    /// Node name (= NodeProxyConfig name).
    pub name: &'a str,
    /// Node uid.
    pub uid: Option<&'a str>,
    /// Node labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Set when the node is skipped.
    pub skip: Option<SkipReason>,
}

impl<'a> NodeView<'a> {
    /// Reads name, labels, deletion, the autoscaler taint and the Ready condition of `node`.
    pub fn from_node(node: &'a Node) -> Self {
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let skip = if node.metadata.deletion_timestamp.is_some() {
            Some(SkipReason::Deleting)
        } else if tainted {
            Some(SkipReason::ScaleDown)
        } else if !ready {
            Some(SkipReason::NotReady)
        } else {
            None
        };
        NodeView {
            name: node.metadata.name.as_deref().unwrap_or_default(),
            uid: node.metadata.uid.as_deref(),
            labels: node.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            skip,
        }
    }
}

/// How long a reading of kube-proxy's DaemonSet ([`KubeProxyDaemonSet`]) is used before a
/// reconcile reads it again: one GET per 30 s at most, whatever the fleet's size. A DaemonSet
/// re-applied without its affinity makes kube-proxy start and the proxiers report standing by,
/// and those reports reconcile; while nodes are reported `KubeProxyReturned` the decision asks
/// to look again after this long, so the reading (and the advice in Degraded) follows the
/// DaemonSet.
pub const KUBE_PROXY_READ_INTERVAL: Duration = Duration::from_secs(30);

/// What the operator sees of kube-proxy's DaemonSet (`kube-system/kube-proxy`, the name
/// kubeadm, kubespray and the addon manager give it): whether its pod template still keeps
/// kube-proxy off nodes labelled [`SERVICE_PROXY_LABEL`]`=kipvs`
/// (`config/samples/kube-proxy-daemonset-patch.yaml`). `kubeadm upgrade`, kubespray and addon
/// managers re-apply the DaemonSet without that affinity, and kube-proxy then starts on every
/// node kipvs took over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KubeProxyDaemonSet {
    /// Not read: not found, not listed yet, or the operator may not read it.
    #[default]
    Unknown,
    /// Every node selector term of its required node affinity has
    /// `kipvs.io/service-proxy NotIn [kipvs]`.
    Patched,
    /// It exists without that affinity: its pods run on nodes labelled `kipvs`.
    Unpatched,
}

impl KubeProxyDaemonSet {
    /// Reads the required node affinity of `ds`'s pod template: [`Self::Patched`] when every
    /// node selector term (they are ORed) keeps nodes labelled `kipvs` out through a `NotIn`
    /// expression on [`SERVICE_PROXY_LABEL`], else [`Self::Unpatched`] (a `DoesNotExist` keeps
    /// kube-proxy off nodes labelled `kube-proxy` too, so a handback would find no kube-proxy).
    pub fn of(ds: &DaemonSet) -> Self {
        let terms = ds
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|r| r.node_selector_terms.as_slice())
            .unwrap_or_default();
        let keeps_out = |term: &k8s_openapi::api::core::v1::NodeSelectorTerm| {
            term.match_expressions.iter().flatten().any(|e| {
                e.key == SERVICE_PROXY_LABEL
                    && match e.operator.as_str() {
                        "NotIn" => e
                            .values
                            .iter()
                            .flatten()
                            .any(|v| v == ServiceProxy::Kipvs.as_str()),
                        _ => false,
                    }
            })
        };
        if !terms.is_empty() && terms.iter().all(keeps_out) {
            KubeProxyDaemonSet::Patched
        } else {
            KubeProxyDaemonSet::Unpatched
        }
    }

    /// What it means for nodes where kube-proxy runs although they are labelled `kipvs`, and
    /// what to do (for Degraded `KubeProxyReturned`).
    pub fn cause(self) -> &'static str {
        match self {
            KubeProxyDaemonSet::Unpatched => {
                "kube-proxy's DaemonSet kube-system/kube-proxy has lost the node affinity \
                 kipvs.io/service-proxy NotIn [kipvs] (re-applied by kubeadm upgrade, kubespray \
                 or an addon manager?): patch it again \
                 (config/samples/kube-proxy-daemonset-patch.yaml) and kipvs takes these nodes \
                 back"
            }
            KubeProxyDaemonSet::Patched => {
                "kube-proxy's DaemonSet kube-system/kube-proxy keeps the affinity: another \
                 kube-proxy (a static pod, another DaemonSet?) runs there"
            }
            KubeProxyDaemonSet::Unknown => {
                "check that kube-proxy's DaemonSet still has the node affinity \
                 kipvs.io/service-proxy NotIn [kipvs] \
                 (config/samples/kube-proxy-daemonset-patch.yaml)"
            }
        }
    }
}

/// What the decision needs of a NodeProxyConfig.
#[derive(Clone, Debug)]
pub struct NpcView<'a> {
    /// Name of the ProxyConfig that controls it (its controller ownerReference); None when it
    /// has none or that ProxyConfig no longer exists (an orphan, adopted by the ProxyConfig
    /// that selects the node).
    pub owner: Option<&'a str>,
    /// `spec.revision`.
    pub revision: &'a str,
    /// `spec.assignedAt`.
    pub assigned_at: Timestamp,
    /// `spec.config.serviceProxy`: the proxy that should program the node on this revision.
    pub service_proxy: ServiceProxy,
    /// What the proxier reported.
    pub status: Option<&'a NodeProxyConfigStatus>,
    /// `spec.config`, to notice hand edits (None: not known, e.g. a write the stores have not
    /// shown yet; the node's label then waits for the stores).
    pub config: Option<&'a ProxierConfiguration>,
}

impl<'a> NpcView<'a> {
    /// Reads the controller owner, the spec and the status of `npc`.
    pub fn from_npc(npc: &'a NodeProxyConfig) -> Self {
        let owner = npc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "ProxyConfig")
            .map(|o| o.name.as_str());
        NpcView {
            owner,
            revision: &npc.spec.revision,
            assigned_at: npc.spec.assigned_at.0,
            service_proxy: npc.spec.config.service_proxy,
            status: npc.status.as_ref(),
            config: Some(&npc.spec.config),
        }
    }
}

/// Everything one decision looks at.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// The ProxyConfig's name.
    pub name: &'a str,
    /// Its `metadata.generation`.
    pub generation: Option<i64>,
    /// Its spec.
    pub spec: &'a ProxyConfigSpec,
    /// Its status as last written (the rollout's memory: cursor, timestamps, last good).
    pub status: Option<&'a ProxyConfigStatus>,
    /// Its annotations (for [`PROMOTE_ANNOTATION`](kipvs_crds::PROMOTE_ANNOTATION)).
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// Selectors of the other ProxyConfigs, for conflict detection.
    pub others: &'a [Selector],
    /// Every Node.
    pub nodes: &'a [NodeView<'a>],
    /// Every NodeProxyConfig, by name.
    pub npcs: &'a HashMap<&'a str, NpcView<'a>>,
    /// Nodes whose NodeProxyConfig write for this ProxyConfig keeps failing (being retried),
    /// with the last error ([`crate::writer`]); reported as Degraded `WriteFailed`.
    pub failing_writes: &'a BTreeMap<String, String>,
    /// kube-proxy's DaemonSet as last seen, for the nodes where kube-proxy runs although they
    /// are labelled `kipvs` (Degraded `KubeProxyReturned`, and their labels left as they are
    /// when it is [`KubeProxyDaemonSet::Unpatched`]).
    pub kube_proxy: KubeProxyDaemonSet,
    /// The time of the decision.
    pub now: Timestamp,
}
