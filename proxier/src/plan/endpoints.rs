//! EndpointSlice endpoints of one Service: their conditions, and which of them become real
//! servers of a virtual server, with which weight.
//!
//! Sources: kube-proxy's `pkg/proxy/endpointslicecache.go` (conditions, `Addresses[0]`,
//! locality) and `pkg/proxy/topology.go` `CategorizeEndpoints` (ready first, then the
//! serving+terminating fallback of KEP-1669), adapted to the design brief: while a ready
//! endpoint exists, serving+terminating ones stay programmed at weight 0.

use super::{Problem, Protocol, parse_protocol, port_number};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

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
pub(crate) type EndpointsByPort = BTreeMap<(String, Protocol), Vec<Endpoint>>;

/// Reads the endpoints of a Service from its slices.
///
/// FQDN slices and ports without a number are ignored, as in kube-proxy. Only `addresses[0]`
/// of an endpoint is used. An endpoint address that is not an IP, or a port that is out of
/// range or of an unknown protocol, is reported as a [`Problem`] naming the slice and left
/// out. Duplicates across slices are merged, keeping the best-conditioned entry.
pub(crate) fn collect(
    slices: &[&EndpointSlice],
    node_name: &str,
    problems: &mut Vec<Problem>,
) -> EndpointsByPort {
    let mut by_port: BTreeMap<(String, Protocol), BTreeMap<SocketAddr, Endpoint>> = BTreeMap::new();
    for slice in slices {
        if slice.address_type == "FQDN" {
            continue;
        }
        let problem = |message: String| Problem::new("EndpointSlice", &slice.metadata, message);
        let mut addresses = Vec::new();
        for (i, endpoint) in slice.endpoints.iter().flatten().enumerate() {
            let Some(text) = endpoint.addresses.first() else {
                continue;
            };
            match text.parse::<IpAddr>() {
                Ok(ip) => addresses.push((ip, endpoint)),
                Err(_) => problems.push(problem(format!(
                    "endpoints[{i}].addresses[0] {text:?} is not a valid IP address"
                ))),
            }
        }
        for (i, port) in slice.ports.iter().flatten().enumerate() {
            let Some(number) = port.port else {
                continue;
            };
            let Some(number) = port_number(number) else {
                problems.push(problem(format!("ports[{i}].port {number} is out of range")));
                continue;
            };
            let protocol = match parse_protocol(port.protocol.as_deref()) {
                Ok(protocol) => protocol,
                Err(message) => {
                    problems.push(problem(format!("ports[{i}]: {message}")));
                    continue;
                }
            };
            let name = port.name.clone().unwrap_or_default();
            let entries = by_port.entry((name, protocol)).or_default();
            for &(ip, endpoint) in &addresses {
                let (ready, serving, terminating) = conditions(endpoint.conditions.as_ref());
                let candidate = Endpoint {
                    address: SocketAddr::new(ip, number),
                    ready,
                    serving,
                    terminating,
                    local: endpoint.node_name.as_deref() == Some(node_name),
                };
                entries
                    .entry(candidate.address)
                    .and_modify(|kept| {
                        if candidate.rank() > kept.rank() {
                            *kept = candidate;
                        }
                    })
                    .or_insert(candidate);
            }
        }
    }
    by_port
        .into_iter()
        .map(|(key, endpoints)| (key, endpoints.into_values().collect()))
        .collect()
}

/// `(ready, serving, terminating)` with the API's defaults for unset conditions.
fn conditions(conditions: Option<&EndpointConditions>) -> (bool, bool, bool) {
    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
    (ready, serving, terminating)
}

/// The real servers chosen for one traffic scope (all endpoints, or only local ones).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selection {
    /// Real servers and weights.
    pub(crate) real_servers: BTreeMap<SocketAddr, u32>,
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

/// Chooses real servers among `endpoints` (already restricted to one IP family and scope).
///
/// - Ready endpoints get weight 1.
/// - With `ProxyTerminatingEndpoints` on: if at least one endpoint is ready, serving+terminating
///   ones are kept at weight 0 (they finish their connections and get no new ones; upstream
///   drops them instead: a deliberate difference, DESIGN-BRIEF "Semantics decided here"); if
///   none is ready, serving+terminating ones get weight 1 (the KEP-1669 fallback).
/// - With the gate off, terminating endpoints are never selected.
/// - Endpoints that are neither ready nor serving+terminating are never selected.
pub(crate) fn select<'a>(
    endpoints: impl Iterator<Item = &'a Endpoint> + Clone,
    terminating_gate: bool,
) -> Selection {
    let any_ready = endpoints.clone().any(|e| e.ready);
    let real_servers: BTreeMap<SocketAddr, u32> = endpoints
        .filter_map(|e| {
            let weight = if e.ready {
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
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint as ApiEndpoint, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ep(last: u8, ready: bool, serving: bool, terminating: bool, local: bool) -> Endpoint {
        Endpoint {
            address: SocketAddr::from(([10, 0, 1, last], 80)),
            ready,
            serving,
            terminating,
            local,
        }
    }

    fn weights(selection: &Selection) -> Vec<(u8, u32)> {
        selection
            .real_servers
            .iter()
            .map(|(addr, &w)| match addr.ip() {
                IpAddr::V4(v4) => (v4.octets()[3], w),
                IpAddr::V6(_) => unreachable!(),
            })
            .collect()
    }

    /// The categorization matrix: every combination of the three conditions, alone and next to
    /// a ready endpoint, with the gate on and off.
    #[test]
    fn condition_matrix() {
        // (ready, serving, terminating) → weight alone (gate on), weight next to a ready one
        // (gate on), weight with the gate off. None: not a real server.
        type Weight = Option<u32>;
        type Row = ((bool, bool, bool), Weight, Weight, Weight);
        let matrix: [Row; 8] = [
            ((true, true, false), Some(1), Some(1), Some(1)),
            // ready+terminating cannot come from the API server, but nil `ready` defaults to
            // true: kube-proxy treats such an endpoint as ready, so does kipvs.
            ((true, true, true), Some(1), Some(1), Some(1)),
            ((true, false, false), Some(1), Some(1), Some(1)),
            ((true, false, true), Some(1), Some(1), Some(1)),
            ((false, true, true), Some(1), Some(0), None),
            ((false, true, false), None, None, None),
            ((false, false, true), None, None, None),
            ((false, false, false), None, None, None),
        ];
        for ((ready, serving, terminating), alone, with_ready, gate_off) in matrix {
            let case = format!("ready={ready} serving={serving} terminating={terminating}");
            let subject = ep(2, ready, serving, terminating, false);
            let other_ready = ep(1, true, true, false, false);

            let only = select([subject].iter(), true);
            assert_eq!(
                only.real_servers.get(&subject.address).copied(),
                alone,
                "{case} alone"
            );
            assert_eq!(only.fallback, alone.is_some() && !ready, "{case} fallback");

            let both = select([other_ready, subject].iter(), true);
            assert_eq!(
                both.real_servers.get(&subject.address).copied(),
                with_ready,
                "{case}"
            );
            assert_eq!(
                both.real_servers.get(&other_ready.address),
                Some(&1),
                "{case}"
            );
            assert!(!both.fallback, "{case}");

            for neighbours in [vec![subject], vec![other_ready, subject]] {
                let off = select(neighbours.iter(), false);
                assert_eq!(
                    off.real_servers.get(&subject.address).copied(),
                    gate_off,
                    "{case}"
                );
                assert!(!off.fallback, "{case} gate off");
            }
        }
    }

    #[test]
    fn empty_scope_selects_nothing() {
        let selection = select([].iter(), true);
        assert!(selection.is_empty());
        assert!(!selection.fallback);
        let not_serving = [ep(1, false, false, true, true)];
        assert_eq!(select(not_serving.iter(), true), Selection::default());
    }

    #[test]
    fn fallback_selects_all_serving_terminating() {
        let endpoints = [
            ep(1, false, true, true, true),
            ep(2, false, true, true, false),
            ep(3, false, false, true, true),
            ep(4, false, false, false, false),
        ];
        let selection = select(endpoints.iter(), true);
        assert_eq!(weights(&selection), vec![(1, 1), (2, 1)]);
        assert!(selection.fallback);
    }

    fn slice(name: &str, endpoints: Vec<ApiEndpoint>, ports: Vec<EndpointPort>) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ports: Some(ports),
        }
    }

    fn api_endpoint(address: &str, conditions: EndpointConditions, node: &str) -> ApiEndpoint {
        ApiEndpoint {
            addresses: vec![address.into()],
            conditions: Some(conditions),
            node_name: Some(node.into()),
            ..Default::default()
        }
    }

    fn port(name: Option<&str>, number: i32, protocol: Option<&str>) -> EndpointPort {
        EndpointPort {
            name: name.map(Into::into),
            port: Some(number),
            protocol: protocol.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn collect_reads_conditions_ports_and_locality() {
        let unset = EndpointConditions::default();
        let terminating = EndpointConditions {
            ready: Some(false),
            serving: Some(true),
            terminating: Some(true),
        };
        let not_ready_serving_unset = EndpointConditions {
            ready: Some(false),
            ..Default::default()
        };
        let a = slice(
            "a",
            vec![
                api_endpoint("10.0.1.1", unset.clone(), "test-node"),
                api_endpoint("10.0.1.2", terminating.clone(), "other"),
                api_endpoint("10.0.1.3", not_ready_serving_unset, "other"),
                api_endpoint("not-an-ip", unset.clone(), "other"),
            ],
            vec![port(Some("http"), 8080, None), port(None, 53, Some("UDP"))],
        );
        // The same address in a second slice, ready there: the ready entry wins.
        let b = slice(
            "b",
            vec![api_endpoint("10.0.1.2", unset, "other")],
            vec![
                port(Some("http"), 8080, Some("TCP")),
                port(Some("x"), 70000, None),
            ],
        );
        let mut problems = Vec::new();
        let by_port = collect(&[&a, &b], "test-node", &mut problems);
        let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "EndpointSlice ns/a: endpoints[3].addresses[0] \"not-an-ip\" is not a valid IP address",
                "EndpointSlice ns/b: ports[1].port 70000 is out of range",
            ]
        );
        let http = &by_port[&("http".to_owned(), Protocol::Tcp)];
        assert_eq!(
            http,
            &[
                Endpoint {
                    address: "10.0.1.1:8080".parse().unwrap(),
                    ready: true,
                    serving: true,
                    terminating: false,
                    local: true,
                },
                Endpoint {
                    address: "10.0.1.2:8080".parse().unwrap(),
                    ready: true,
                    serving: true,
                    terminating: false,
                    local: false,
                },
                Endpoint {
                    address: "10.0.1.3:8080".parse().unwrap(),
                    ready: false,
                    serving: false,
                    terminating: false,
                    local: false,
                },
            ]
        );
        let dns = &by_port[&(String::new(), Protocol::Udp)];
        assert_eq!(dns.len(), 3);
        assert!(dns[1].terminating && dns[1].serving && !dns[1].ready);
        assert_eq!(by_port.len(), 2);
    }
}
