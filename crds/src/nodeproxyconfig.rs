//! `NodeProxyConfig` (`kipvs.io/v1alpha1`, cluster-scoped): the configuration one node's proxier
//! should run, named after the node.
//!
//! Two writers, each owning its half through server-side apply:
//!
//! - **spec**: the operator (field manager [`OPERATOR_FIELD_MANAGER`]) writes `revision`,
//!   `assignedAt` and `config` when the node's desired revision changes, and sets its
//!   `ProxyConfig` as the controlling owner (deleting the ProxyConfig deletes its
//!   NodeProxyConfigs).
//! - **status**: the node's proxier (field manager [`PROXIER_FIELD_MANAGER`]) writes
//!   [`NodeProxyConfigStatus`] on the `status` subresource, e.g.
//!
//! ```text
//! PATCH /apis/kipvs.io/v1alpha1/nodeproxyconfigs/<node>/status?fieldManager=kipvs-proxier&force=true
//! Content-Type: application/apply-patch+yaml
//! {"apiVersion": "kipvs.io/v1alpha1", "kind": "NodeProxyConfig", "metadata": {"name": "<node>"},
//!  "status": {"observedRevision": "5f0c2a9e1b", "phase": "Applied", "healthy": true,
//!             "lastSyncTime": "2026-11-22T10:00:00Z", "message": "", "syncErrors": 0}}
//! ```
//!
//! ([`NodeProxyConfigStatus::apply_patch`] builds that body.) The contract the operator relies on:
//!
//! - when `spec.revision` changes, report `observedRevision` = it with phase Pending, then
//!   Applied (after the first successful sync with it) or Failed (with a message);
//! - report `healthy` whenever it flips;
//! - after a restart with an unchanged `spec.revision`, do not go back to Pending: report
//!   Applied once the first sync succeeded (the previous status stays meanwhile). A node whose
//!   target revision is not Applied and healthy once `applyTimeout` has passed since
//!   `spec.assignedAt` counts as failed and can halt a rollout;
//! - the status is not a heartbeat: the operator never reads `lastSyncTime`, `message` or
//!   `syncErrors`, and a healthy, idle proxier need not write at all (kipvs-proxier writes on a
//!   change of phase, revision or health and on a new error, and changed counters at most every
//!   5 minutes). A dead node is seen from its Node's Ready condition.
//!
//! When a node has no NodeProxyConfig, its proxier runs its local configuration (`--config`).
//!
//! ## Moving a node between kube-proxy and kipvs
//!
//! `spec.config.serviceProxy` ([`ServiceProxy`]) says which proxy should program the node; the
//! node label [`SERVICE_PROXY_LABEL`] keeps kube-proxy off the node (kube-proxy's DaemonSet is
//! patched once with a node affinity `kipvs.io/service-proxy NotIn [kipvs]`). The proxier
//! reports where the node stands in `status.serviceProxy` ([`ServiceProxyPhase`]):
//!
//! - **to kipvs** (`serviceProxy: kipvs`): the proxier reports the revision in `Standby` while
//!   kube-proxy runs; the operator labels the node `kipvs` only once that report is there (a
//!   proxier that never runs never reports, and kube-proxy stays), so kube-proxy's pod leaves;
//!   then `TakingOver` (it programs; kube-proxy's leftovers are being removed), then
//!   `Programming`. The revision is Applied once the proxier programs and a sync succeeded;
//!   a kube-proxy that never stops keeps it Pending until `applyTimeout` fails the node. A
//!   proxier silent on its revision past `applyTimeout` gets its node labelled `kube-proxy`
//!   again (the operator's `rollout/labels.rs`).
//! - **to kube-proxy** (`serviceProxy: kube-proxy`): the proxier stops programming, sets the
//!   weights kube-proxy expects and releases the health port (`HandingBack`), or stays in
//!   `Standby` where it never programmed. The operator labels the node `kube-proxy` once the
//!   status shows one of those phases for the node's revision, so kube-proxy's pod starts
//!   only after kipvs has stopped writing. When kube-proxy reports a completed sync
//!   (`kubeproxy_sync_proxy_rules_last_timestamp_seconds`), the proxier removes its nftables table (`HandedBack`) and reports Applied; `healthy` is then
//!   kube-proxy's health as the proxier reads it.
//! - a kube-proxy that comes back while kipvs programs makes the proxier stop writing
//!   (`Standby`) and report `healthy: false` with a message: two programmers never run at once.
//!   The operator then leaves the label `kipvs` (kube-proxy's DaemonSet lost its affinity; a
//!   `kube-proxy` label would keep kube-proxy there once it is patched again) and reports the
//!   nodes in its ProxyConfig's Degraded `KubeProxyReturned`.

use crate::config::{ProxierConfiguration, ServiceProxy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Field manager of the operator's server-side applies (NodeProxyConfig spec, ProxyConfig
/// status).
pub const OPERATOR_FIELD_MANAGER: &str = "kipvs-operator";

/// Field manager the proxier uses for its server-side applies of NodeProxyConfig status.
pub const PROXIER_FIELD_MANAGER: &str = "kipvs-proxier";

/// Label on a Node naming the service proxy that should run there (a [`ServiceProxy`] value:
/// `kipvs` or `kube-proxy`), written by the operator as its NodeProxyConfig moves the node
/// between the two. kube-proxy's DaemonSet avoids nodes labelled `kipvs`.
pub const SERVICE_PROXY_LABEL: &str = "kipvs.io/service-proxy";

/// The configuration one node's proxier should run.
// kube-derive takes one printcolumn(...) per column; clippy reads repeated keys as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "kipvs.io",
    version = "v1alpha1",
    kind = "NodeProxyConfig",
    plural = "nodeproxyconfigs",
    shortname = "npxc",
    category = "kipvs",
    status = "NodeProxyConfigStatus",
    derive = "PartialEq",
    doc = "The proxier configuration of one node (named after it), written by kipvs-operator from \
           a ProxyConfig; its status is written by the node's proxier.",
    printcolumn(
        name = "Revision",
        type_ = "string",
        json_path = ".spec.revision",
        description = "Revision the node should run"
    ),
    printcolumn(
        name = "Observed",
        type_ = "string",
        json_path = ".status.observedRevision",
        description = "Revision the proxier last acted on"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Healthy", type_ = "boolean", json_path = ".status.healthy"),
    printcolumn(name = "Last-Sync", type_ = "date", json_path = ".status.lastSyncTime"),
    printcolumn(
        name = "Message",
        type_ = "string",
        priority = 1,
        json_path = ".status.message"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeProxyConfigSpec {
    /// Revision of config (the owning ProxyConfig's revision scheme: a hash of its non-default
    /// settings). The proxier echoes it in status.observedRevision.
    pub revision: String,
    /// When the operator set this revision; the rollout's applyTimeout counts from here.
    pub assigned_at: Time,
    /// The configuration to run, complete (defaults filled in).
    pub config: ProxierConfiguration,
}

/// What a node's proxier reports about its NodeProxyConfig. Every field is optional so that a
/// proxier may apply only what it knows; the operator reads a missing field as "not yet".
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeProxyConfigStatus {
    /// The spec.revision this status is about: the last one the proxier started applying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<String>,
    /// Pending (observedRevision is being applied), Applied (it is in effect and a sync with it
    /// completed) or Failed (it was rejected or cannot be applied; message says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodePhase>,
    /// The proxier's liveness verdict (its /livez: the sync loop runs and its last sync
    /// succeeded recently). Not /healthz: that one also fails on draining nodes (KEP-3836),
    /// which the operator recognises from the Node itself and skips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// When the last successful IPVS sync finished, as of the last status write (not refreshed
    /// on its own: the proxier's sync metrics have the live figure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// Human-readable detail: why a revision Failed, or the last sync error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Failed syncs since observedRevision was applied (0 after a clean apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_errors: Option<u64>,
    /// Which proxy programs the node, as the proxier sees it (see the module documentation).
    /// Absent from proxiers that predate the takeover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_proxy: Option<ServiceProxyPhase>,
}

/// Where a node stands between kube-proxy and kipvs ([`NodeProxyConfigStatus::service_proxy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ServiceProxyPhase {
    /// kipvs writes nothing to the kernel: kube-proxy runs on the node, or the node should run
    /// kube-proxy and kipvs never programmed it.
    Standby,
    /// kipvs programs the node and is removing what kube-proxy left (iptables rules, ipsets,
    /// NodePort virtual servers on other local addresses, drained first).
    TakingOver,
    /// kipvs programs the node and nothing of kube-proxy is left.
    Programming,
    /// The node should run kube-proxy: kipvs has stopped writing, left every wanted real server
    /// at the weight kube-proxy expects and released the health port; it waits for kube-proxy
    /// to sync.
    HandingBack,
    /// kube-proxy has synced the node and kipvs's nftables table is removed; kipvs writes
    /// nothing.
    HandedBack,
}

impl ServiceProxyPhase {
    /// Whether kipvs writes to the kernel in this phase.
    pub fn kipvs_programs(self) -> bool {
        matches!(
            self,
            ServiceProxyPhase::TakingOver | ServiceProxyPhase::Programming
        )
    }

    /// Whether kube-proxy may start on the node: kipvs is not writing and will not write
    /// while the node's `serviceProxy` is [`ServiceProxy::KubeProxy`].
    pub fn ready_for(self, proxy: ServiceProxy) -> bool {
        match proxy {
            ServiceProxy::Kipvs => self.kipvs_programs(),
            ServiceProxy::KubeProxy => !self.kipvs_programs(),
        }
    }
}

/// The proxier's progress on `observedRevision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum NodePhase {
    /// Seen, not yet in effect.
    Pending,
    /// In effect; a sync with it completed.
    Applied,
    /// Rejected or impossible to apply.
    Failed,
}

impl NodeProxyConfigStatus {
    /// The body of a server-side apply of this status to the `status` subresource of the
    /// NodeProxyConfig named `node` (send it with field manager [`PROXIER_FIELD_MANAGER`] and
    /// `force`, as `kube::api::Patch::Apply`).
    pub fn apply_patch(&self, node: &str) -> serde_json::Value {
        use kube::Resource;
        serde_json::json!({
            "apiVersion": NodeProxyConfig::api_version(&()),
            "kind": NodeProxyConfig::kind(&()),
            "metadata": { "name": node },
            "status": self,
        })
    }
}
