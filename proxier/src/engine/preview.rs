//! What taking the node over from kube-proxy would change, before the switch: printed by
//! `kipvs-proxier takeover`, and the gate of `run`'s own switch (it stands by, `Failed`, while
//! the switch would touch connections, unless `--allow-connection-changes`); both build it
//! with [`Preview::of_switch`]. Pure: it reads the ops of the first full sync (the diff of the
//! desired state against the kernel's table as kube-proxy left it), that table with its
//! connection counts, and kube-proxy's leftovers.
//!
//! Every op is listed (nftables set elements as counts: they are kipvs's own table, new on
//! such a node), and the ops that touch established connections are named: deleting a virtual
//! server or real server that has connections (they break), unbinding an address one of whose
//! virtual servers has connections (they break), and re-weighting a real server that has
//! connections to 0 (a drain keeps them but takes the real server out of rotation; any other
//! weight, e.g. raising kube-proxy's wanted real servers from 0, kubernetes#92019, keeps it in).

use super::planner::Planner;
use super::takeover::kube_proxy_node_ports;
use crate::dataplane::Op;
use crate::dataplane::diff::diff;
use crate::dataplane::host::kube_proxy::Leftovers;
use crate::model::{ObservedState, VirtualServerKey};
use kipvs_crds::ConfigError;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::SocketAddr;
use tokio::time::Instant;

/// What a takeover would change on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preview {
    /// The IPVS and `kube-ipvs0` ops of the first full sync, in order, each with the
    /// connections it touches (`ip_vs` active + inactive counts; 0: none).
    pub ops: Vec<(Op, u64)>,
    /// nftables: whether kipvs's rules are written, and how many set elements are added and
    /// deleted.
    pub nft: (bool, usize, usize),
    /// kube-proxy's iptables rules, chains and ipsets that go.
    pub leftovers: Leftovers,
}

/// Connections of the virtual server `key` in `observed` (every real server's).
fn virtual_server_connections(observed: &ObservedState, key: &VirtualServerKey) -> u64 {
    observed.virtual_servers.get(key).map_or(0, |vs| {
        vs.real_servers
            .values()
            .map(|rs| u64::from(rs.active_connections) + u64::from(rs.inactive_connections))
            .sum()
    })
}

impl Preview {
    /// The preview of a switch to kipvs: the first full sync's ops for what `planner` planned
    /// against `observed`, with the ownership that sync has (kube-proxy's NodePorts on other
    /// local addresses drain when `found_kube_proxy`, [`kube_proxy_node_ports`], `drains`
    /// being those under way), and `leftovers`.
    ///
    /// # Errors
    /// The planner's configuration does not parse ([`Planner::ownership`]).
    pub fn of_switch(
        planner: &Planner,
        observed: &ObservedState,
        found_kube_proxy: bool,
        drains: &BTreeMap<(VirtualServerKey, SocketAddr), Instant>,
        leftovers: Leftovers,
    ) -> Result<Self, ConfigError> {
        let node_ports = if found_kube_proxy {
            kube_proxy_node_ports(planner.desired(), planner.node_port_ips(), drains)
        } else {
            BTreeSet::new()
        };
        let ownership = planner.ownership(node_ports)?;
        let ops = diff(planner.desired(), observed, &ownership);
        Ok(Preview::new(&ops, observed, leftovers))
    }

    /// The preview of `ops` (a full diff) against `observed`, with `leftovers`.
    pub fn new(ops: &[Op], observed: &ObservedState, leftovers: Leftovers) -> Self {
        let mut preview = Preview {
            leftovers,
            ..Preview::default()
        };
        for op in ops {
            let connections = match op {
                Op::WriteRules(_) => {
                    preview.nft.0 = true;
                    continue;
                }
                Op::AddSetElement(_) => {
                    preview.nft.1 += 1;
                    continue;
                }
                Op::DeleteSetElement(_) => {
                    preview.nft.2 += 1;
                    continue;
                }
                Op::DeleteVirtualServer(key) => virtual_server_connections(observed, key),
                // A raise (kube-proxy's wanted real servers left at weight 0, kubernetes#92019)
                // or any other weight but 0 keeps the real server in rotation.
                Op::UpdateRealServer { weight, .. } if *weight > 0 => 0,
                Op::DeleteRealServer { vs, rs } | Op::UpdateRealServer { vs, rs, .. } => observed
                    .virtual_servers
                    .get(vs)
                    .and_then(|v| v.real_servers.get(rs))
                    .map_or(0, |r| {
                        u64::from(r.active_connections) + u64::from(r.inactive_connections)
                    }),
                Op::UnbindAddress(address) => observed
                    .virtual_servers
                    .keys()
                    .filter(|key| key.address == *address)
                    .map(|key| virtual_server_connections(observed, key))
                    .sum(),
                Op::BindAddress(_)
                | Op::AddVirtualServer(..)
                | Op::UpdateVirtualServer(..)
                | Op::AddRealServer { .. } => 0,
            };
            preview.ops.push((op.clone(), connections));
        }
        preview
    }

    /// The ops that delete, unbind or re-weight something carrying connections.
    pub fn touching_connections(&self) -> impl Iterator<Item = &(Op, u64)> {
        self.ops.iter().filter(|(_, connections)| *connections > 0)
    }

    /// Why the switch does not go ahead without `--allow-connection-changes` (`None`: nothing
    /// touches connections): how many ops would, and the first three with their counts.
    pub fn refusal(&self) -> Option<String> {
        let touching: Vec<String> = self
            .touching_connections()
            .map(|(op, connections)| format!("{op} ({connections} connections)"))
            .collect();
        let first: Vec<&str> = touching.iter().take(3).map(String::as_str).collect();
        (!touching.is_empty()).then(|| {
            format!(
                "{} operations of the switch would delete, unbind or re-weight to 0 something \
                 carrying connections ({}{}); --allow-connection-changes lets it go ahead",
                touching.len(),
                first.join("; "),
                if touching.len() > 3 { "; ..." } else { "" }
            )
        })
    }

    /// The preview as text: the ops (those touching connections marked), the nftables
    /// summary, kube-proxy's leftovers, and a last line with the counts.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# IPVS and kube-ipvs0 (the first full sync)");
        for (op, connections) in &self.ops {
            let mark = if *connections > 0 {
                format!("   <- {connections} connections")
            } else {
                String::new()
            };
            let _ = writeln!(out, "{op}{mark}");
        }
        let (rules, added, deleted) = self.nft;
        let _ = writeln!(
            out,
            "# nftables table inet kipvs: rules {}, {added} set elements added, {deleted} deleted",
            if rules { "written" } else { "unchanged" }
        );
        let _ = writeln!(out, "# kube-proxy's iptables rules, chains and ipsets");
        out.push_str(&self.leftovers.to_string());
        let (r, c, s) = self.leftovers.counts();
        let _ = writeln!(
            out,
            "# {} ops, {} touching connections; kube-proxy: {r} rules, {c} chains, {s} ipsets",
            self.ops.len(),
            self.touching_connections().count()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ObservedRealServer, ObservedVirtualServer, Protocol, VirtualServerSpec};

    /// Deleting, unbinding or re-weighting something with connections is named with its
    /// count; adding, binding, and anything without connections is not.
    #[test]
    fn the_ops_touching_connections_are_named() {
        let key = |address: &str, port| VirtualServerKey {
            address: address.parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        };
        let (busy_vs, idle_vs) = (key("10.96.0.10", 80), key("172.17.0.1", 30080));
        let rs = |active, inactive| ObservedRealServer {
            weight: 1,
            active_connections: active,
            inactive_connections: inactive,
        };
        let vs = |servers: Vec<(&str, ObservedRealServer)>| ObservedVirtualServer {
            spec: VirtualServerSpec {
                scheduler: "rr".into(),
                persistence_timeout: None,
                sched_flags: 0,
            },
            real_servers: servers
                .into_iter()
                .map(|(a, r)| (a.parse().unwrap(), r))
                .collect(),
        };
        let mut observed = ObservedState::default();
        observed.virtual_servers.insert(
            busy_vs,
            vs(vec![
                ("10.244.1.2:8080", rs(2, 1)),
                ("10.244.1.3:8080", rs(0, 0)),
            ]),
        );
        observed
            .virtual_servers
            .insert(idle_vs, vs(vec![("10.244.1.3:8080", rs(0, 0))]));
        let (busy, idle) = (
            "10.244.1.2:8080".parse().unwrap(),
            "10.244.1.3:8080".parse().unwrap(),
        );
        let ops = vec![
            Op::UnbindAddress("10.96.0.10".parse().unwrap()),
            Op::DeleteRealServer {
                vs: busy_vs,
                rs: idle,
            },
            Op::DeleteVirtualServer(idle_vs),
            Op::WriteRules(Default::default()),
            Op::UpdateRealServer {
                vs: busy_vs,
                rs: busy,
                weight: 0,
            },
            Op::BindAddress("10.96.0.11".parse().unwrap()),
            Op::UpdateRealServer {
                vs: busy_vs,
                rs: busy,
                weight: 1,
            },
        ];
        let preview = Preview::new(&ops, &observed, Leftovers::default());
        let touching: Vec<&Op> = preview.touching_connections().map(|(op, _)| op).collect();
        assert_eq!(touching, [&ops[0], &ops[4]]);
        assert_eq!(
            preview.refusal().unwrap(),
            "2 operations of the switch would delete, unbind or re-weight to 0 something \
             carrying connections (op=UnbindAddress address=10.96.0.10 (3 connections); \
             op=UpdateRealServer vs=\"TCP 10.96.0.10:80\" rs=10.244.1.2:8080 weight=0 \
             (3 connections)); --allow-connection-changes lets it go ahead"
        );
        assert_eq!(Preview::default().refusal(), None);
        assert_eq!(preview.ops[0].1, 3);
        assert_eq!(preview.nft, (true, 0, 0));
        let text = preview.text();
        assert!(
            text.contains("op=UnbindAddress address=10.96.0.10   <- 3 connections"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "# 6 ops, 2 touching connections; kube-proxy: 0 rules, 0 chains, 0 ipsets\n"
            ),
            "{text}"
        );
    }
}
