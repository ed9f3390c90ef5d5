//! The IPVS table kipvs wants and the one the kernel has: the contract between
//! [`crate::plan`] (which produces a [`DesiredState`]) and [`crate::dataplane`]
//! (which observes an [`ObservedState`] and converges it with [`crate::dataplane::diff::diff`]).
//!
//! Everything here is plain data, ordered (`BTreeMap`/`BTreeSet`) so that output and
//! operation lists are deterministic.

mod keys;
pub mod objects;
mod sets;

pub use keys::{Protocol, UnknownProtocol, VirtualServerKey};
pub use sets::{LocalTraffic, NftRules, SetElement};

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Scheduler flag bits kipvs may set (kernel `IP_VS_SVC_F_SCHED1..3`); the persistence
/// flag and the kernel-owned `HASHED` bit are not part of this value.
pub type SchedFlags = u32;

/// The schedulers of Linux IPVS (`net/netfilter/ipvs/Kconfig`, one `ip_vs_<name>` module
/// each), the values [`objects::SCHEDULER_ANNOTATION`] and `ipvs.scheduler` accept. A kernel built without one of them
/// refuses virtual servers that use it.
pub const IPVS_SCHEDULERS: [&str; 14] = [
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos",
];

/// Serializes a shared string as the string (serde's `Arc` support needs its `rc` feature).
fn shared_str<S: serde::Serializer>(text: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(text)
}

/// The attributes of a virtual server that kipvs programs (besides its real servers).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VirtualServerSpec {
    /// IPVS scheduler name (`rr`, `wrr`, `lc`, `sh`, `mh`, ...), from `ipvs.scheduler`; shared
    /// by the virtual servers planned with it.
    #[serde(serialize_with = "shared_str")]
    pub scheduler: Arc<str>,
    /// Persistence timeout in seconds: `Some` for `sessionAffinity: ClientIP`
    /// (`sessionAffinityConfig.clientIP.timeoutSeconds`, default 10800), which sets
    /// `IP_VS_SVC_F_PERSISTENT`.
    pub persistence_timeout: Option<u32>,
    /// Scheduler flags (`IP_VS_SVC_F_SCHED1..3`), e.g. `0x10` for `mh` source-port hashing and
    /// `0x08` for the `mh`/`sh` fallback past weight-0 real servers.
    pub sched_flags: SchedFlags,
}

/// A virtual server kipvs wants: its spec and its real servers with their weights.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VirtualServer {
    /// Scheduler, persistence and flags.
    pub spec: VirtualServerSpec,
    /// Real servers (`endpoint IP:targetPort`) and their weights: 1 for selected endpoints,
    /// 0 for serving+terminating endpoints kept while a ready one exists (DESIGN-BRIEF,
    /// "Semantics decided here"). Forwarding is always masquerade (NAT).
    pub real_servers: RealServers,
    /// The Service ports this virtual server implements, as `namespace/name:portName`; shared
    /// by the virtual servers of that Service port.
    #[serde(serialize_with = "shared_str")]
    pub service: Arc<str>,
}

/// One real server of a [`RealServers`]: 24 bytes (a `SocketAddr` alone takes 32).
///
/// Private: [`RealServers`] hands out addresses and weights, never this layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RealServer {
    ip: IpAddr,
    port: u16,
    weight: u32,
}

impl RealServer {
    fn address(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

/// The real servers of a desired virtual server and their weights, by address: a map with
/// the read API of a `BTreeMap<SocketAddr, u32>` (same order, same serialized form), held as
/// one exact-size sorted slice of 24-byte entries. Planning holds one per virtual server
/// (112k at 50k Services): a `BTreeMap` of 10 takes a 408-byte node, this 240 bytes.
/// Built whole ([`FromIterator`], `From<[_; N]>`); never changed in place.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RealServers(Box<[RealServer]>);

impl RealServers {
    /// The position of `address`, or where it would go.
    fn find(&self, address: &SocketAddr) -> Result<usize, usize> {
        self.0.binary_search_by(|rs| rs.address().cmp(address))
    }

    /// The weight of the real server at `address`, if there is one.
    pub fn get(&self, address: &SocketAddr) -> Option<&u32> {
        self.find(address).ok().map(|at| &self.0[at].weight)
    }

    /// Whether there is a real server at `address`.
    pub fn contains_key(&self, address: &SocketAddr) -> bool {
        self.find(address).is_ok()
    }

    /// Real servers and their weights, by address.
    pub fn iter(&self) -> RealServersIter<'_> {
        RealServersIter(self.0.iter())
    }

    /// The addresses, in order.
    pub fn keys(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.0.iter().map(RealServer::address)
    }

    /// The weights, in address order.
    pub fn values(&self) -> impl Iterator<Item = &u32> + '_ {
        self.0.iter().map(|rs| &rs.weight)
    }

    /// The number of real servers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// As `BTreeMap::from_iter`: sorted by address; of one address given twice, the last weight.
/// Entries that come sorted (as planning gives them) are taken as they are, in one allocation
/// of the iterator's upper size bound.
impl FromIterator<(SocketAddr, u32)> for RealServers {
    fn from_iter<I: IntoIterator<Item = (SocketAddr, u32)>>(entries: I) -> Self {
        let entries = entries.into_iter();
        let (lower, upper) = entries.size_hint();
        let mut servers: Vec<RealServer> = Vec::with_capacity(upper.unwrap_or(lower));
        servers.extend(entries.map(|(address, weight)| RealServer {
            ip: address.ip(),
            port: address.port(),
            weight,
        }));
        if !servers.is_sorted_by(|a, b| a.address() < b.address()) {
            // Stable: the last of equal addresses is the last given; `dedup_by` keeps the
            // first of a run, so carry the later weight into it.
            servers.sort_by_key(RealServer::address);
            servers.dedup_by(|later, kept| {
                let same = later.address() == kept.address();
                if same {
                    kept.weight = later.weight;
                }
                same
            });
        }
        RealServers(servers.into_boxed_slice())
    }
}

impl<const N: usize> From<[(SocketAddr, u32); N]> for RealServers {
    fn from(entries: [(SocketAddr, u32); N]) -> Self {
        entries.into_iter().collect()
    }
}

/// The real servers of a [`RealServers`] and their weights, by address.
#[derive(Clone, Debug)]
pub struct RealServersIter<'a>(std::slice::Iter<'a, RealServer>);

impl<'a> Iterator for RealServersIter<'a> {
    type Item = (SocketAddr, &'a u32);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|rs| (rs.address(), &rs.weight))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for RealServersIter<'_> {}

impl<'a> IntoIterator for &'a RealServers {
    type Item = (SocketAddr, &'a u32);
    type IntoIter = RealServersIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl fmt::Debug for RealServers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for RealServers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

/// The Service a health-check node port answers for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HealthCheckNodePort {
    /// Service namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// Number of distinct local endpoint IPs that are ready (terminating ones do not count,
    /// as in kube-proxy's `LocalReadyEndpoints`).
    pub local_ready_endpoints: usize,
}

/// Everything the proxier wants programmed on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DesiredState {
    /// Virtual servers and their real servers.
    pub virtual_servers: BTreeMap<VirtualServerKey, VirtualServer>,
    /// Addresses to bind on the dummy interface `kube-ipvs0` (as /32 or /128): ClusterIPs,
    /// externalIPs and VIP-mode load-balancer ingress IPs.
    pub bind_addresses: BTreeSet<IpAddr>,
    /// healthCheckNodePort → the Service it reports on (LoadBalancer + externalTrafficPolicy Local).
    pub health_check_node_ports: BTreeMap<u16, HealthCheckNodePort>,
    /// Elements of the nftables sets (masquerade, hairpin, filtering; see [`crate::dataplane::nftables`]).
    pub set_elements: BTreeSet<SetElement>,
    /// The parameters of the constant nftables rules.
    pub nft_rules: NftRules,
}

/// A real server as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ObservedRealServer {
    /// Current weight.
    pub weight: u32,
    /// Active connections (`IPVS_DEST_ATTR_ACTIVE_CONNS`).
    pub active_connections: u32,
    /// Inactive connections (`IPVS_DEST_ATTR_INACT_CONNS`).
    pub inactive_connections: u32,
}

/// A virtual server as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ObservedVirtualServer {
    /// Scheduler, persistence and flags (the `HASHED` bit already stripped).
    pub spec: VirtualServerSpec,
    /// Real servers by address.
    pub real_servers: BTreeMap<SocketAddr, ObservedRealServer>,
}

/// What the kernel holds: every inet virtual server (fwmark ones are not ours and are not
/// reported) and the addresses bound on `kube-ipvs0`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ObservedState {
    /// All TCP/UDP/SCTP virtual servers in the network namespace, owned or not.
    pub virtual_servers: BTreeMap<VirtualServerKey, ObservedVirtualServer>,
    /// Addresses currently on `kube-ipvs0`.
    pub bound_addresses: BTreeSet<IpAddr>,
    /// Elements of kipvs's nftables sets.
    pub set_elements: BTreeSet<SetElement>,
    /// Comments of the rules in kipvs's nftables table, in order ([`crate::dataplane::nftables::rules::rule_comments`]):
    /// empty without the table.
    pub nft_rule_comments: Vec<String>,
}

/// What a scoped diff ([`crate::dataplane::diff::diff_scoped`]) looks at, and what a plan update
/// touched ([`crate::plan::Touched`]): virtual servers, bind addresses and nftables set elements
/// (and, for the health-check servers, health-check node ports).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Virtual servers.
    pub virtual_servers: BTreeSet<VirtualServerKey>,
    /// Addresses on `kube-ipvs0`.
    pub addresses: BTreeSet<IpAddr>,
    /// nftables set elements.
    pub set_elements: BTreeSet<SetElement>,
    /// Health-check node ports whose entry may have changed (no dataplane op: the health-check
    /// servers follow them, [`DesiredState::health_check_node_ports`]).
    pub health_check_node_ports: BTreeSet<u16>,
}

/// Every virtual server, address and set element of either state: the scope of a full
/// [`diff`](crate::dataplane::diff::diff).
pub fn full_scope(desired: &DesiredState, observed: &ObservedState) -> Scope {
    let virtual_servers = desired
        .virtual_servers
        .keys()
        .chain(observed.virtual_servers.keys())
        .copied()
        .collect();
    let addresses = desired
        .bind_addresses
        .union(&observed.bound_addresses)
        .copied()
        .collect();
    let set_elements = desired
        .set_elements
        .union(&observed.set_elements)
        .copied()
        .collect();
    Scope {
        virtual_servers,
        addresses,
        set_elements,
        health_check_node_ports: desired.health_check_node_ports.keys().copied().collect(),
    }
}

impl Scope {
    /// Whether it names nothing.
    pub fn is_empty(&self) -> bool {
        self.virtual_servers.is_empty()
            && self.addresses.is_empty()
            && self.set_elements.is_empty()
            && self.health_check_node_ports.is_empty()
    }

    /// Add another update's changes.
    pub fn extend(&mut self, other: Scope) {
        self.virtual_servers.extend(other.virtual_servers);
        self.addresses.extend(other.addresses);
        self.set_elements.extend(other.set_elements);
        self.health_check_node_ports
            .extend(other.health_check_node_ports);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RealServers` reads as the `BTreeMap` it replaces: the same order (IPv4 before IPv6,
    /// then address and port), the last weight of an address given twice, the same lookups,
    /// `Debug` and serialized form.
    #[test]
    fn real_servers_read_as_the_map_they_replace() {
        let entries: Vec<(SocketAddr, u32)> = [
            ("[fd00::1]:80", 1),
            ("10.0.0.2:8080", 1),
            ("10.0.0.2:80", 0),
            ("10.0.0.1:9000", 1),
            ("10.0.0.2:80", 1),
        ]
        .iter()
        .map(|(a, w)| (a.parse().unwrap(), *w))
        .collect();
        let map: BTreeMap<SocketAddr, u32> = entries.iter().copied().collect();
        let servers: RealServers = entries.iter().copied().collect();
        assert_eq!(servers.len(), map.len());
        assert!(!servers.is_empty() && RealServers::default().is_empty());
        let listed: Vec<(SocketAddr, u32)> = servers.iter().map(|(a, &w)| (a, w)).collect();
        let expected: Vec<(SocketAddr, u32)> = map.iter().map(|(&a, &w)| (a, w)).collect();
        assert_eq!(listed, expected);
        assert!(servers.keys().eq(map.keys().copied()));
        assert!(servers.values().eq(map.values()));
        for (address, weight) in &map {
            assert_eq!(servers.get(address), Some(weight));
            assert!(servers.contains_key(address));
        }
        let absent: SocketAddr = "10.0.0.2:81".parse().unwrap();
        assert_eq!(servers.get(&absent), None);
        assert!(!servers.contains_key(&absent));
        assert_eq!(format!("{servers:?}"), format!("{map:?}"));
        assert_eq!(
            serde_json::to_string(&servers).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        assert_eq!(size_of::<RealServer>(), 24);
    }
}
