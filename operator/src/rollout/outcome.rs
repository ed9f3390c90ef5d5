//! What a decision returns: the status, the NodeProxyConfig writes, the Events and the next look.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{NodeProxyConfig, NodeProxyConfigSpec, ProxierConfiguration, ProxyConfigStatus};
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
}

impl Write {
    /// The node written.
    pub fn node(&self) -> &str {
        match self {
            Write::Assign { node, .. } | Write::Delete { node } => node,
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
    /// NodeProxyConfig writes, at most one per node.
    pub writes: Vec<Write>,
    /// Events to publish.
    pub events: Vec<Note>,
    /// When to decide again even if nothing changes (a soak ends, an apply timeout expires).
    pub requeue_after: Option<Duration>,
}
