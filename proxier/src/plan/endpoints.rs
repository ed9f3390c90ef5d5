//! EndpointSlice endpoints of one Service: their conditions, and which of them become real
//! servers of a virtual server, with which weight.
//!
//! Sources: kube-proxy's `pkg/proxy/endpointslicecache.go` (conditions, `Addresses[0]`,
//! locality, hints) and `pkg/proxy/topology.go` `CategorizeEndpoints` (ready first, filtered
//! by topology hints, then the serving+terminating fallback of KEP-1669, which ignores
//! topology), adapted to the design brief: while a ready endpoint exists, serving+terminating
//! ones stay programmed at weight 0.

use super::context::port_number;
use super::outcome::Problem;
use crate::model::Protocol;
use crate::model::RealServers;
use crate::model::objects::{AddressType, EndpointAddress, EndpointInfo, SliceInfo, SlicePortInfo};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// One endpoint of a Service port, as kipvs sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `addresses[0]` and the slice port's number.
    pub(crate) address: SocketAddr,
    /// `conditions.ready`; nil means true (API contract, kube-proxy alike).
    pub(crate) ready: bool,
    /// `conditions.serving`; nil means the value of `ready`, as the API documents ("If nil,
    /// consumers should defer to the ready condition"). kube-proxy reads nil as true; that only
    /// differs for a not-ready endpoint with `serving` unset, which kipvs does not route to.
    pub(crate) serving: bool,
    /// `conditions.terminating`; nil means false.
    pub(crate) terminating: bool,
    /// `nodeName` is this node.
    pub(crate) local: bool,
    /// `hints.forZones`, relative to this node's zone.
    pub(crate) zone_hint: Hint,
    /// `hints.forNodes`, relative to this node.
    pub(crate) node_hint: Hint,
}

/// What an endpoint's topology hints (`hints.forZones` or `hints.forNodes`) say about this
/// node. Computed when the slices are read, so that an [`Endpoint`] stays a small `Copy` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    /// No hint of this kind (the list is unset or empty).
    Absent,
    /// Hints exist, none for this node (or zone; also when the node has no zone).
    Elsewhere,
    /// One of the hints names this node (or its zone).
    Here,
}

impl Hint {
    /// The hint for `ours` among `names`.
    fn of<'a>(names: impl IntoIterator<Item = &'a str>, ours: Option<&str>) -> Hint {
        let mut hint = Hint::Absent;
        for name in names {
            if Some(name) == ours {
                return Hint::Here;
            }
            hint = Hint::Elsewhere;
        }
        hint
    }
}

impl Endpoint {
    /// Serving and terminating, but not ready: a KEP-1669 fallback candidate.
    fn serving_terminating(&self) -> bool {
        !self.ready && self.serving && self.terminating
    }

    /// Preference when two slices list the same address and port (slices overlap while the
    /// EndpointSlice controller moves endpoints): ready, then serving+terminating, then the rest.
    fn rank(&self) -> u8 {
        if self.ready {
            2
        } else if self.serving_terminating() {
            1
        } else {
            0
        }
    }
}

/// Endpoints of one Service, by slice port `(name, protocol)`: the key a Service port is
/// matched on (kube-proxy's `ServicePortName`).
pub(crate) type EndpointsByPort = BTreeMap<SlicePort, Vec<Endpoint>>;

/// A slice port's `(name, protocol)`.
pub(crate) type SlicePort = (Arc<str>, Protocol);

/// Reads the endpoints of a Service from its slices.
///
/// FQDN slices and ports without a number are ignored, as in kube-proxy. A slice's
/// `addressType` (`IPv4` or `IPv6`) is its family, as in kube-proxy, which gives each
/// family's proxier only the slices of its type: an endpoint address of the other family is
/// reported as a [`Problem`] and left out, and a slice of another `addressType` is reported and
/// skipped. Only `addresses[0]` of an endpoint is used. An endpoint address that is not an IP,
/// or a port that is out of range or of an unknown protocol, is reported naming the slice and
/// left out. Duplicates across slices are merged, keeping the best-conditioned entry.
///
/// `node_name` and `zone` (this node's `topology.kubernetes.io/zone`) decide locality and
/// what the hints say ([`Hint`]).
pub(crate) fn collect(
    slices: &[&SliceInfo],
    node_name: &str,
    zone: Option<&str>,
    problems: &mut Vec<Problem>,
) -> EndpointsByPort {
    // Few ports: a vector searched in turn, each port's endpoints in slice order.
    let mut by_port: Vec<(SlicePort, Vec<Endpoint>)> = Vec::new();
    for slice in slices {
        let Some(ipv4) = is_ipv4(slice, problems) else {
            continue;
        };
        let addresses = addresses(slice, ipv4, problems);
        for (i, port) in slice.ports.iter().enumerate() {
            let Some((protocol, number)) = port_of(slice, i, port, problems) else {
                continue;
            };
            let at = match by_port
                .iter()
                .position(|((name, p), _)| *name == port.name && *p == protocol)
            {
                Some(at) => at,
                None => {
                    by_port.push(((port.name.clone(), protocol), Vec::new()));
                    by_port.len() - 1
                }
            };
            let entries = &mut by_port[at].1;
            entries.reserve(addresses.len());
            entries.extend(addresses.iter().map(|&(ip, endpoint)| {
                Endpoint::of(SocketAddr::new(ip, number), endpoint, node_name, zone)
            }));
        }
    }
    by_port
        .into_iter()
        .map(|(key, endpoints)| (key, merge_duplicates(endpoints)))
        .collect()
}

/// A problem with `slice`, for its report.
fn problem(slice: &SliceInfo, message: String) -> Problem {
    Problem::of("EndpointSlice", &slice.namespace, &slice.name, message)
}

/// The family of `slice` from its `addressType`: `Some(true)` for IPv4, `Some(false)` for
/// IPv6, `None` for a slice that is skipped (FQDN, or an unknown type, which is reported).
fn is_ipv4(slice: &SliceInfo, problems: &mut Vec<Problem>) -> Option<bool> {
    match &slice.address_type {
        AddressType::Ipv4 => Some(true),
        AddressType::Ipv6 => Some(false),
        AddressType::Fqdn => None,
        AddressType::Unknown(other) => {
            problems.push(problem(
                slice,
                format!(
                    "addressType {other:?} is unknown (expected IPv4, IPv6 or FQDN); slice ignored"
                ),
            ));
            None
        }
    }
}

/// The endpoints of `slice` with an address of its family, with that address; the others are
/// reported.
fn addresses<'s>(
    slice: &'s SliceInfo,
    ipv4: bool,
    problems: &mut Vec<Problem>,
) -> Vec<(IpAddr, &'s EndpointInfo)> {
    let mut addresses = Vec::new();
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        let Some(text) = &endpoint.address else {
            continue;
        };
        match text {
            EndpointAddress::Ip(ip) => addresses.push((*ip, endpoint)),
            EndpointAddress::OtherFamily(text) => problems.push(problem(
                slice,
                format!(
                    "endpoints[{i}].addresses[0] {text:?} does not match addressType {}; ignored",
                    if ipv4 { "IPv4" } else { "IPv6" }
                ),
            )),
            EndpointAddress::Invalid(text) => problems.push(problem(
                slice,
                format!("endpoints[{i}].addresses[0] {text:?} is not a valid IP address"),
            )),
        }
    }
    addresses
}

/// The protocol and number of `port`, the `i`th of `slice`; `None` without a number, or when
/// the number is out of range or the protocol unknown (both reported).
fn port_of(
    slice: &SliceInfo,
    i: usize,
    port: &SlicePortInfo,
    problems: &mut Vec<Problem>,
) -> Option<(Protocol, u16)> {
    let number = port.port?;
    let Some(number) = port_number(number) else {
        problems.push(problem(
            slice,
            format!("ports[{i}].port {number} is out of range"),
        ));
        return None;
    };
    match &port.protocol {
        Ok(protocol) => Some((*protocol, number)),
        Err(message) => {
            problems.push(problem(slice, format!("ports[{i}]: {message}")));
            None
        }
    }
}

impl Endpoint {
    /// `endpoint` at `address` as seen from the node `node_name` in `zone`.
    fn of(
        address: SocketAddr,
        endpoint: &EndpointInfo,
        node_name: &str,
        zone: Option<&str>,
    ) -> Endpoint {
        let hints = endpoint.hints.as_deref();
        let for_zones = hints.into_iter().flat_map(|h| h.for_zones.iter());
        let for_nodes = hints.into_iter().flat_map(|h| h.for_nodes.iter());
        Endpoint {
            address,
            ready: endpoint.ready,
            serving: endpoint.serving,
            terminating: endpoint.terminating,
            local: endpoint.node_name.as_deref() == Some(node_name),
            zone_hint: Hint::of(for_zones.map(|z| &**z), zone),
            node_hint: Hint::of(for_nodes.map(|n| &**n), Some(node_name)),
        }
    }
}

/// `endpoints` by address; of one address listed twice, the first with the best conditions
/// (the sort is stable: duplicates stay in slice order).
fn merge_duplicates(mut endpoints: Vec<Endpoint>) -> Vec<Endpoint> {
    endpoints.sort_by_key(|e| e.address);
    endpoints.dedup_by(|later, kept| {
        if later.address != kept.address {
            return false;
        }
        if later.rank() > kept.rank() {
            *kept = *later;
        }
        true
    });
    endpoints
}

/// The real servers chosen for one traffic scope (all endpoints, or only local ones).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selection {
    /// Real servers and weights.
    pub(crate) real_servers: RealServers,
    /// The KEP-1669 fallback is in use: no endpoint in scope is ready, and serving+terminating
    /// ones carry the traffic at weight 1.
    pub(crate) fallback: bool,
}

impl Selection {
    /// No real server at all (neither ready nor serving+terminating endpoint in scope).
    pub(crate) fn is_empty(&self) -> bool {
        self.real_servers.is_empty()
    }
}

/// Which ready endpoints of the cluster-wide set this node uses, from their topology hints
/// (kube-proxy's `topologyModeFromHints` and `availableForTopology`, `pkg/proxy/topology.go`,
/// with `PreferSameTrafficDistribution` on: GA and locked since Kubernetes 1.35).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// Every ready endpoint (no usable hints).
    All,
    /// Ready endpoints hinted for this node's zone (`hints.forZones`).
    SameZone,
    /// Ready endpoints hinted for this node (`hints.forNodes`, `trafficDistribution:
    /// PreferSameNode`).
    SameNode,
}

impl Topology {
    /// The topology of one scope's endpoints (one Service port and IP family): `SameNode` if
    /// every ready endpoint has node hints and one is hinted for this node; else `SameZone` if
    /// every ready endpoint has zone hints and one is hinted for this node's zone; else `All`.
    /// Endpoints that are not ready are not looked at; with no ready endpoint it is `All`.
    pub(crate) fn from_hints<'a>(endpoints: impl Iterator<Item = &'a Endpoint>) -> Topology {
        let mut any_ready = false;
        let (mut all_node_hints, mut node_here) = (true, false);
        let (mut all_zone_hints, mut zone_here) = (true, false);
        for e in endpoints.filter(|e| e.ready) {
            any_ready = true;
            all_node_hints &= e.node_hint != Hint::Absent;
            node_here |= e.node_hint == Hint::Here;
            all_zone_hints &= e.zone_hint != Hint::Absent;
            zone_here |= e.zone_hint == Hint::Here;
        }
        if any_ready && all_node_hints && node_here {
            Topology::SameNode
        } else if any_ready && all_zone_hints && zone_here {
            Topology::SameZone
        } else {
            Topology::All
        }
    }

    /// Whether a ready endpoint is used under this topology.
    fn admits(self, e: &Endpoint) -> bool {
        match self {
            Topology::All => true,
            Topology::SameZone => e.zone_hint == Hint::Here,
            Topology::SameNode => e.node_hint == Hint::Here,
        }
    }
}

/// Chooses real servers among `endpoints` (already restricted to one IP family and scope).
///
/// - Ready endpoints that `topology` admits get weight 1; other ready ones are left out
///   ([`Topology::from_hints`] admits at least one whenever one is ready).
/// - With `ProxyTerminatingEndpoints` on: if at least one endpoint is ready, serving+terminating
///   ones are kept at weight 0 whatever their hints (they finish their connections and get no
///   new ones; upstream drops them instead: a deliberate difference, DESIGN-BRIEF "Semantics
///   decided here"); if none is ready, serving+terminating ones get weight 1 (the KEP-1669
///   fallback, which ignores topology as upstream's does).
/// - With the gate off, terminating endpoints are never selected.
/// - Endpoints that are neither ready nor serving+terminating are never selected.
pub(crate) fn select<'a>(
    endpoints: impl Iterator<Item = &'a Endpoint> + Clone,
    terminating_gate: bool,
    topology: Topology,
) -> Selection {
    let any_ready = endpoints.clone().any(|e| e.ready);
    let real_servers: RealServers = endpoints
        .filter_map(|e| {
            let weight = if e.ready {
                if !topology.admits(e) {
                    return None;
                }
                1
            } else if terminating_gate && e.serving_terminating() {
                if any_ready { 0 } else { 1 }
            } else {
                return None;
            };
            Some((e.address, weight))
        })
        .collect();
    Selection {
        fallback: !any_ready && !real_servers.is_empty(),
        real_servers,
    }
}

#[cfg(test)]
mod tests;
