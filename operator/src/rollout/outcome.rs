//! What a decision returns: the status, the NodeProxyConfig writes, the Events and the next look.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{
    NodeProxyConfig, NodeProxyConfigSpec, ProxierConfiguration, ProxyConfigStatus,
    SERVICE_PROXY_LABEL, ServiceProxy,
};
use std::sync::Arc;
use std::time::Duration;

/// A write to a NodeProxyConfig.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Create or update the node's NodeProxyConfig with this revision (and `assignedAt` = now).
    Assign {
        /// The node.
        node: String,
        /// The Node's uid (for the NodeProxyConfig's ownerReference to it), if known.
        node_uid: Option<String>,
        /// The revision.
        revision: Arc<str>,
        /// Its configuration.
        config: Arc<ProxierConfiguration>,
    },
    /// Delete the node's NodeProxyConfig (it is this ProxyConfig's and should not exist).
    Delete {
        /// The node.
        node: String,
    },
    /// Set the Node's [`SERVICE_PROXY_LABEL`] (a [`Decision::labels`] entry, sent by the
    /// writer next to the NodeProxyConfig writes).
    Label(Label),
}

/// The value of a Node's [`SERVICE_PROXY_LABEL`] that a decision asks for: the service proxy
/// that should run on the node (kube-proxy's DaemonSet, patched once, avoids nodes labelled
/// `kipvs`). The rule is in [`crate::rollout`]'s module docs ("Service proxy label").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// The node.
    pub node: String,
    /// The label's value.
    pub proxy: ServiceProxy,
}

impl Label {
    /// The server-side apply body that sets only this label on the Node (the operator's field
    /// manager then owns that one field of the Node, nothing else).
    pub fn node_patch(&self) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": { SERVICE_PROXY_LABEL: self.proxy.as_str() },
            },
        })
    }
}

impl Write {
    /// The node written.
    pub fn node(&self) -> &str {
        match self {
            Write::Assign { node, .. }
            | Write::Delete { node }
            | Write::Label(Label { node, .. }) => node,
        }
    }

    /// What the write changes: the node's NodeProxyConfig, or its [`SERVICE_PROXY_LABEL`]. The
    /// writer keeps one write per node and object.
    pub fn object(&self) -> Object {
        match self {
            Write::Assign { .. } | Write::Delete { .. } => Object::NodeProxyConfig,
            Write::Label(_) => Object::Label,
        }
    }

    /// The NodeProxyConfig an [`Write::Assign`] writes (None for a delete): named after the
    /// node, `spec.assignedAt` = `now`, controlled by `owner` (the ProxyConfig) and also owned
    /// by its Node, so that the garbage collector removes it with the Node. The one conversion
    /// from a decision to an object: the controller applies it, the simulation ([`crate::sim`])
    /// stores it.
    pub fn node_proxy_config(
        &self,
        owner: &OwnerReference,
        now: Timestamp,
    ) -> Option<NodeProxyConfig> {
        let Write::Assign {
            node,
            node_uid,
            revision,
            config,
        } = self
        else {
            return None;
        };
        let mut owners = vec![OwnerReference {
            controller: Some(true),
            ..owner.clone()
        }];
        if let Some(uid) = node_uid {
            owners.push(OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: node.clone(),
                uid: uid.clone(),
                controller: None,
                block_owner_deletion: None,
            });
        }
        let mut npc = NodeProxyConfig::new(
            node,
            NodeProxyConfigSpec {
                revision: revision.to_string(),
                assigned_at: Time(now),
                config: (**config).clone(),
            },
        );
        npc.metadata.owner_references = Some(owners);
        Some(npc)
    }
}

/// The object of a node that a [`Write`] changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Object {
    /// The NodeProxyConfig named after the node.
    NodeProxyConfig,
    /// The Node's [`SERVICE_PROXY_LABEL`].
    Label,
}

/// An Event to publish about the ProxyConfig.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// CamelCase reason, e.g. `StageStarted`.
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The status to report.
    pub status: ProxyConfigStatus,
    /// NodeProxyConfig writes ([`Write::Assign`], [`Write::Delete`]), at most one per node.
    pub writes: Vec<Write>,
    /// Nodes whose [`SERVICE_PROXY_LABEL`] is to change, at most one per node. Asked for even
    /// while `spec.paused`: a label follows the NodeProxyConfig the node already has.
    pub labels: Vec<Label>,
    /// Events to publish.
    pub events: Vec<Note>,
    /// When to decide again even if nothing changes (a soak ends, an apply timeout expires).
    pub requeue_after: Option<Duration>,
}
