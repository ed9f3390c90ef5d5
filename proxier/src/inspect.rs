//! `kipvs-proxier inspect`: the desired IPVS state against the kernel's, by Service
//! (the view users asked kube-proxy for, kubernetes#74677).
//!
//! For each Service port (`namespace/name:port`, as [`VirtualServer::service`] names it):
//! its virtual servers, each with its real servers, the desired weight, the kernel's weight
//! and connection counts, and a verdict; then what the kernel has that no Service wants
//! (virtual servers and `kube-ipvs0` addresses). Pure: [`inspect`] compares two states.

use crate::model::{
    DesiredState, ObservedRealServer, ObservedState, VirtualServer, VirtualServerKey,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};
use std::net::{IpAddr, SocketAddr};

/// How a desired entry compares with the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// The kernel has it as desired.
    Ok,
    /// The kernel does not have it.
    Missing,
    /// The kernel has it with other attributes (scheduler, persistence, flags, weight).
    Differs,
    /// The kernel has it but kipvs does not want it: a real server draining (weight 0) or
    /// about to be deleted, a virtual server or address left behind or not kipvs'.
    NotDesired,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Ok => "ok",
            Verdict::Missing => "MISSING in the kernel",
            Verdict::Differs => "DIFFERS",
            Verdict::NotDesired => "not desired",
        })
    }
}

/// One real server of a virtual server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RealServerView {
    /// `ip:port`.
    pub address: SocketAddr,
    /// Desired weight, if desired.
    pub desired_weight: Option<u32>,
    /// What the kernel reports, if it has it.
    pub kernel: Option<ObservedRealServer>,
    /// The comparison.
    pub verdict: Verdict,
}

/// One virtual server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServerView {
    /// Address, port, protocol.
    pub key: VirtualServerKey,
    /// Desired scheduler (the kernel's when not desired).
    pub scheduler: String,
    /// The kernel's scheduler, if it has the virtual server.
    pub kernel_scheduler: Option<String>,
    /// The comparison of the virtual server's own attributes.
    pub verdict: Verdict,
    /// Desired real servers first (in address order), then the kernel's others.
    pub real_servers: Vec<RealServerView>,
}

/// The whole comparison.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    /// Virtual servers by the Service port they implement (`namespace/name:port`).
    pub services: BTreeMap<String, Vec<VirtualServerView>>,
    /// Virtual servers in the kernel that no Service wants.
    pub kernel_only: Vec<VirtualServerView>,
    /// Desired `kube-ipvs0` addresses the kernel does not have.
    pub unbound: BTreeSet<IpAddr>,
    /// `kube-ipvs0` addresses no Service wants.
    pub extra_bound: BTreeSet<IpAddr>,
}

impl Inspection {
    /// Whether the kernel matches the desired state (draining real servers aside).
    pub fn converged(&self) -> bool {
        let vs_ok = |vs: &VirtualServerView| {
            vs.verdict == Verdict::Ok
                && vs.real_servers.iter().all(|rs| {
                    rs.verdict == Verdict::Ok
                        || (rs.verdict == Verdict::NotDesired
                            && rs.kernel.is_some_and(|k| k.weight == 0))
                })
        };
        self.services.values().flatten().all(vs_ok)
            && self.kernel_only.is_empty()
            && self.unbound.is_empty()
            && self.extra_bound.is_empty()
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (service, vss) in &self.services {
            let _ = writeln!(out, "{service}");
            for vs in vss {
                write_vs(&mut out, vs);
            }
        }
        if !self.kernel_only.is_empty() {
            let _ = writeln!(out, "kernel only (no Service wants these):");
            for vs in &self.kernel_only {
                write_vs(&mut out, vs);
            }
        }
        for ip in &self.unbound {
            let _ = writeln!(out, "address {ip}: MISSING on kube-ipvs0");
        }
        for ip in &self.extra_bound {
            let _ = writeln!(out, "address {ip}: on kube-ipvs0, not desired");
        }
        let _ = writeln!(
            out,
            "{}",
            if self.converged() {
                "converged"
            } else {
                "NOT converged"
            }
        );
        out
    }
}

fn write_vs(out: &mut String, vs: &VirtualServerView) {
    let scheduler = match &vs.kernel_scheduler {
        Some(k) if *k != vs.scheduler => format!("{} (kernel: {k})", vs.scheduler),
        _ => vs.scheduler.clone(),
    };
    let _ = writeln!(out, "  {} {scheduler}  [{}]", vs.key, vs.verdict);
    for rs in &vs.real_servers {
        let desired = rs
            .desired_weight
            .map_or_else(|| "-".to_owned(), |w| w.to_string());
        let kernel = rs.kernel.map_or_else(
            || "-".to_owned(),
            |k| {
                format!(
                    "{} active {} inactive {}",
                    k.weight, k.active_connections, k.inactive_connections
                )
            },
        );
        let draining =
            rs.verdict == Verdict::NotDesired && rs.kernel.is_some_and(|k| k.weight == 0);
        let verdict = if draining {
            "draining".to_owned()
        } else {
            rs.verdict.to_string()
        };
        let _ = writeln!(
            out,
            "    -> {:<22} weight {desired:<3} kernel {kernel}  [{verdict}]",
            rs.address
        );
    }
}

/// Compare `desired` with `observed`, by Service.
pub fn inspect(desired: &DesiredState, observed: &ObservedState) -> Inspection {
    let mut inspection = Inspection::default();
    for (key, vs) in &desired.virtual_servers {
        let view = desired_view(key, vs, observed);
        inspection
            .services
            .entry(vs.service.to_string())
            .or_default()
            .push(view);
    }
    for (key, ovs) in &observed.virtual_servers {
        if desired.virtual_servers.contains_key(key) {
            continue;
        }
        inspection.kernel_only.push(VirtualServerView {
            key: *key,
            scheduler: ovs.spec.scheduler.to_string(),
            kernel_scheduler: Some(ovs.spec.scheduler.to_string()),
            verdict: Verdict::NotDesired,
            real_servers: ovs
                .real_servers
                .iter()
                .map(|(address, kernel)| RealServerView {
                    address: *address,
                    desired_weight: None,
                    kernel: Some(*kernel),
                    verdict: Verdict::NotDesired,
                })
                .collect(),
        });
    }
    inspection.unbound = desired
        .bind_addresses
        .difference(&observed.bound_addresses)
        .copied()
        .collect();
    inspection.extra_bound = observed
        .bound_addresses
        .difference(&desired.bind_addresses)
        .copied()
        .collect();
    inspection
}

fn desired_view(
    key: &VirtualServerKey,
    vs: &VirtualServer,
    observed: &ObservedState,
) -> VirtualServerView {
    let ovs = observed.virtual_servers.get(key);
    let verdict = match ovs {
        None => Verdict::Missing,
        Some(o) if o.spec != vs.spec => Verdict::Differs,
        Some(_) => Verdict::Ok,
    };
    let mut real_servers: Vec<RealServerView> = vs
        .real_servers
        .iter()
        .map(|(address, &weight)| {
            let kernel = ovs.and_then(|o| o.real_servers.get(&address)).copied();
            let verdict = match kernel {
                None => Verdict::Missing,
                Some(k) if k.weight != weight => Verdict::Differs,
                Some(_) => Verdict::Ok,
            };
            RealServerView {
                address,
                desired_weight: Some(weight),
                kernel,
                verdict,
            }
        })
        .collect();
    real_servers.extend(
        ovs.iter()
            .flat_map(|o| &o.real_servers)
            .filter(|(address, _)| !vs.real_servers.contains_key(address))
            .map(|(address, kernel)| RealServerView {
                address: *address,
                desired_weight: None,
                kernel: Some(*kernel),
                verdict: Verdict::NotDesired,
            }),
    );
    VirtualServerView {
        key: *key,
        scheduler: vs.spec.scheduler.to_string(),
        kernel_scheduler: ovs.map(|o| o.spec.scheduler.to_string()),
        verdict,
        real_servers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ObservedVirtualServer, Protocol, RealServers, VirtualServerSpec};

    fn key(ip: &str, port: u16) -> VirtualServerKey {
        VirtualServerKey {
            address: ip.parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn spec(scheduler: &str) -> VirtualServerSpec {
        VirtualServerSpec {
            scheduler: scheduler.into(),
            persistence_timeout: None,
            sched_flags: 0,
        }
    }

    fn rs(weight: u32, active: u32) -> ObservedRealServer {
        ObservedRealServer {
            weight,
            active_connections: active,
            inactive_connections: 0,
        }
    }

    #[test]
    fn converged_state_with_a_draining_real_server() {
        let desired = DesiredState {
            virtual_servers: [(
                key("10.96.0.10", 80),
                VirtualServer {
                    spec: spec("rr"),
                    real_servers: [("10.244.1.2:8080".parse().unwrap(), 1)].into(),
                    service: "default/web:http".into(),
                },
            )]
            .into(),
            bind_addresses: ["10.96.0.10".parse().unwrap()].into(),
            ..Default::default()
        };
        let mut observed = ObservedState::from(&desired);
        let vs = observed
            .virtual_servers
            .get_mut(&key("10.96.0.10", 80))
            .unwrap();
        vs.real_servers
            .insert("10.244.1.2:8080".parse().unwrap(), rs(1, 4));
        vs.real_servers
            .insert("10.244.1.9:8080".parse().unwrap(), rs(0, 2));
        let inspection = inspect(&desired, &observed);
        assert!(inspection.converged());
        assert_eq!(
            inspection.text(),
            "default/web:http\n  TCP 10.96.0.10:80 rr  [ok]\n    \
             -> 10.244.1.2:8080        weight 1   kernel 1 active 4 inactive 0  [ok]\n    \
             -> 10.244.1.9:8080        weight -   kernel 0 active 2 inactive 0  [draining]\n\
             converged\n"
        );
    }

    #[test]
    fn differences_are_named() {
        let desired = DesiredState {
            virtual_servers: [
                (
                    key("10.96.0.10", 80),
                    VirtualServer {
                        spec: spec("rr"),
                        real_servers: [
                            ("10.244.1.2:8080".parse().unwrap(), 1),
                            ("10.244.1.3:8080".parse().unwrap(), 1),
                        ]
                        .into(),
                        service: "default/web:http".into(),
                    },
                ),
                (
                    key("10.96.0.11", 53),
                    VirtualServer {
                        spec: spec("rr"),
                        real_servers: RealServers::default(),
                        service: "kube-system/dns:dns-tcp".into(),
                    },
                ),
            ]
            .into(),
            bind_addresses: ["10.96.0.10".parse().unwrap(), "10.96.0.11".parse().unwrap()].into(),
            ..Default::default()
        };
        let observed = ObservedState {
            virtual_servers: [
                (
                    key("10.96.0.10", 80),
                    ObservedVirtualServer {
                        spec: spec("wrr"),
                        real_servers: [("10.244.1.2:8080".parse().unwrap(), rs(0, 0))].into(),
                    },
                ),
                (
                    key("10.96.0.99", 80),
                    ObservedVirtualServer {
                        spec: spec("rr"),
                        real_servers: BTreeMap::new(),
                    },
                ),
            ]
            .into(),
            bound_addresses: ["10.96.0.10".parse().unwrap(), "10.96.0.99".parse().unwrap()].into(),
            ..Default::default()
        };
        let inspection = inspect(&desired, &observed);
        assert!(!inspection.converged());
        let web = &inspection.services["default/web:http"][0];
        assert_eq!(web.verdict, Verdict::Differs);
        assert_eq!(web.real_servers[0].verdict, Verdict::Differs);
        assert_eq!(web.real_servers[1].verdict, Verdict::Missing);
        assert_eq!(
            inspection.services["kube-system/dns:dns-tcp"][0].verdict,
            Verdict::Missing
        );
        assert_eq!(inspection.kernel_only.len(), 1);
        assert_eq!(inspection.unbound, ["10.96.0.11".parse().unwrap()].into());
        assert_eq!(
            inspection.extra_bound,
            ["10.96.0.99".parse().unwrap()].into()
        );
        let text = inspection.text();
        assert!(
            text.contains("TCP 10.96.0.10:80 rr (kernel: wrr)  [DIFFERS]"),
            "{text}"
        );
        assert!(
            text.contains(
                "kernel only (no Service wants these):\n  TCP 10.96.0.99:80 rr  [not desired]"
            ),
            "{text}"
        );
        assert!(
            text.contains("address 10.96.0.11: MISSING on kube-ipvs0"),
            "{text}"
        );
        assert!(text.ends_with("NOT converged\n"), "{text}");
    }
}
