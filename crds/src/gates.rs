//! The feature gates kipvs understands.
//!
//! All three are GA (and locked on) in upstream Kubernetes; kipvs keeps them switchable so
//! that a fleet can roll a behaviour change out stage by stage. Each defaults to on.

use std::fmt;
use std::str::FromStr;

/// A kipvs feature gate, named as in Kubernetes' `featureGates` map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gate {
    /// KEP-1669 `ProxyTerminatingEndpoints`: route to serving+terminating endpoints when no
    /// ready one exists (and, in kipvs, keep them at weight 0 while a ready one exists).
    /// Off: terminating endpoints are never selected.
    ProxyTerminatingEndpoints,
    /// KEP-1860 `LoadBalancerIPMode`: a load-balancer ingress IP with `ipMode: Proxy` gets no
    /// virtual server and is not bound on the node. Off: every ingress IP is a VIP.
    LoadBalancerIPMode,
    /// KEP-3836 `KubeProxyDrainingTerminatingNodes`: `/healthz` fails while the node is being
    /// deleted or tainted `ToBeDeletedByClusterAutoscaler`. Off: `/healthz` answers like `/livez`.
    KubeProxyDrainingTerminatingNodes,
}

impl Gate {
    /// Every gate, in documentation order.
    pub const ALL: [Gate; 3] = [
        Gate::ProxyTerminatingEndpoints,
        Gate::LoadBalancerIPMode,
        Gate::KubeProxyDrainingTerminatingNodes,
    ];

    /// The gate's name as written in `featureGates`.
    pub fn name(self) -> &'static str {
        match self {
            Gate::ProxyTerminatingEndpoints => "ProxyTerminatingEndpoints",
            Gate::LoadBalancerIPMode => "LoadBalancerIPMode",
            Gate::KubeProxyDrainingTerminatingNodes => "KubeProxyDrainingTerminatingNodes",
        }
    }

    /// One sentence on what the gate changes (the CRD schema's description of it).
    pub fn description(self) -> &'static str {
        match self {
            Gate::ProxyTerminatingEndpoints => {
                "KEP-1669: route to serving+terminating endpoints when no ready one exists \
                 (kept at weight 0 while a ready one exists). Default true."
            }
            Gate::LoadBalancerIPMode => {
                "KEP-1860: a load-balancer ingress IP with ipMode Proxy gets no virtual server \
                 and is not bound on the node. Default true."
            }
            Gate::KubeProxyDrainingTerminatingNodes => {
                "KEP-3836: /healthz fails while the node is being deleted or tainted \
                 ToBeDeletedByClusterAutoscaler. Default true."
            }
        }
    }

    /// Whether the gate is on when `featureGates` does not mention it (all are GA upstream).
    pub fn default_enabled(self) -> bool {
        true
    }

    /// The known gate names, comma-separated, for error messages.
    pub fn known_names() -> String {
        Gate::ALL.map(Gate::name).join(", ")
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A feature gate name kipvs does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown feature gate {name:?} (known gates: {known})", known = Gate::known_names())]
pub struct UnknownGate {
    /// The unknown name, as written.
    pub name: String,
}

impl FromStr for Gate {
    type Err = UnknownGate;

    /// Parses a gate name (case-sensitive, as Kubernetes does).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Gate::ALL
            .into_iter()
            .find(|gate| gate.name() == name)
            .ok_or_else(|| UnknownGate {
                name: name.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for gate in Gate::ALL {
            assert_eq!(gate.name().parse::<Gate>(), Ok(gate));
            assert!(gate.default_enabled());
        }
    }

    #[test]
    fn unknown_gate_lists_known_ones() {
        let err = "proxyTerminatingEndpoints".parse::<Gate>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown feature gate \"proxyTerminatingEndpoints\" (known gates: \
             ProxyTerminatingEndpoints, LoadBalancerIPMode, KubeProxyDrainingTerminatingNodes)"
        );
    }
}
