//! What planning gives: a [`Plan`] (the desired state and the [`Problem`]s met on the way)
//! and the counts behind its metrics ([`NoLocalEndpoints`]).

use crate::model::DesiredState;
use std::fmt;

/// The outcome of [`plan`](super::plan): the desired IPVS state, what was wrong with the input, and the
/// counts behind two metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Virtual servers, addresses to bind and health-check node ports.
    pub desired: DesiredState,
    /// Objects (or configuration) that could not be planned fully, in a stable order.
    pub problems: Vec<Problem>,
    /// Services whose traffic policy asks for local endpoints while this node has none
    /// although the Service has endpoints elsewhere
    /// (`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy}`).
    pub no_local_endpoints: NoLocalEndpoints,
    /// Services with at least one virtual server served by the KEP-1669 fallback
    /// (serving+terminating endpoints at weight 1 because none is ready).
    pub terminating_fallback_services: usize,
}

/// Counts of Services with a Local traffic policy and no local endpoint, by policy, as
/// kube-proxy's `sync_proxy_rules_no_local_endpoints_total` counts them: each Service once, and
/// only if it has endpoints somewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    /// `internalTrafficPolicy: Local`: the ClusterIP virtual servers have no real server.
    pub internal: usize,
    /// `externalTrafficPolicy: Local`: the external virtual servers use the cluster-wide
    /// endpoints instead (quirk Q2).
    pub external: usize,
}

/// Something wrong with one object of the input (or with the configuration), and what was
/// left out because of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Kind of the object: `Service`, `EndpointSlice` or `ProxierConfiguration`.
    pub kind: &'static str,
    /// Namespace; empty for the configuration.
    pub namespace: String,
    /// Object name; empty for the configuration.
    pub name: String,
    /// What is wrong, naming the field, e.g. `spec.clusterIPs[0] "10.0.0.300" is not a valid
    /// IP address`.
    pub message: String,
}

impl Problem {
    /// A problem with the namespaced object `namespace/name`.
    pub(crate) fn of(kind: &'static str, namespace: &str, name: &str, message: String) -> Self {
        Problem {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message,
        }
    }

    pub(super) fn config(message: String) -> Self {
        Problem {
            kind: "ProxierConfiguration",
            namespace: String::new(),
            name: String::new(),
            message,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.namespace.is_empty(), self.name.is_empty()) {
            (_, true) => write!(f, "{}: {}", self.kind, self.message),
            (true, false) => write!(f, "{} {}: {}", self.kind, self.name, self.message),
            (false, false) => write!(
                f,
                "{} {}/{}: {}",
                self.kind, self.namespace, self.name, self.message
            ),
        }
    }
}
