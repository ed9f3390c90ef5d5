//! The feature gates kipvs understands.
//!
//! All three are GA (and locked on) in upstream Kubernetes; kipvs keeps them switchable so
//! that a fleet can roll a behaviour change out stage by stage. Each defaults to on.

use std::fmt;
use std::str::FromStr;

/// A kipvs feature gate, named as in Kubernetes' `featureGates` map. What each one changes is
/// told once, by [`Gate::description`] (the CRD schema and docs/configuration.md carry that text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gate {
    /// KEP-1669 `ProxyTerminatingEndpoints` ([`Gate::description`]).
    ProxyTerminatingEndpoints,
    /// KEP-1860 `LoadBalancerIPMode` ([`Gate::description`]).
    LoadBalancerIPMode,
    /// KEP-3836 `KubeProxyDrainingTerminatingNodes` ([`Gate::description`]).
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

    /// What the gate changes, on and off: the one text of it, which the CRD schema's
    /// description of the gate and docs/configuration.md ("Feature gates") carry.
    pub fn description(self) -> &'static str {
        match self {
            Gate::ProxyTerminatingEndpoints => {
                "KEP-1669: while a ready endpoint exists, serving+terminating endpoints stay as \
                 real servers at weight 0 (their connections finish, no new ones); with no ready \
                 endpoint they get weight 1. Upstream removes them instead; this is deliberate. \
                 Off: terminating endpoints are never selected. Default true."
            }
            Gate::LoadBalancerIPMode => {
                "KEP-1860: load-balancer ingress IPs with ipMode Proxy get no virtual server and \
                 are not bound, so pod traffic to them goes through the real load balancer. Off: \
                 every ingress IP is a VIP. Default true."
            }
            Gate::KubeProxyDrainingTerminatingNodes => {
                "KEP-3836: /healthz fails while the Node is being deleted or is tainted \
                 ToBeDeletedByClusterAutoscaler; /livez reports liveness only. Off: /healthz \
                 answers like /livez. Default true."
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

    /// docs/configuration.md tells each gate in the words of [`Gate::description`] (one source;
    /// edit the description and copy it there).
    #[test]
    fn the_configuration_doc_carries_each_gates_description() {
        let doc = include_str!("../../docs/configuration.md");
        let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
        for gate in Gate::ALL {
            let line = format!("- `{}`: {}", gate.name(), gate.description());
            assert!(doc.contains(&line), "docs/configuration.md lacks: {line}");
        }
    }

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
