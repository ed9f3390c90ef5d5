//! The Kubernetes boundary of planning: Services, EndpointSlices and the own Node into the
//! domain values of [`crate::model::objects`], which is all [`crate::plan`] reads. The store
//! converts every object as it arrives and keeps only the result (the Node also as it is, for
//! the health checks); whoever calls [`crate::plan::plan`] converts its input the same way.
//! Nothing is validated away here: a field that does not parse is kept as text and reported
//! when planned.

use crate::model::objects::{
    AddressType, ClusterIps, EndpointAddress, EndpointInfo, Hints, Ingress, Interner, IpMode,
    NodeInfo, Parsed, SCHEDULER_ANNOTATION, SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL,
    ServiceInfo, ServicePortInfo, ServiceTypeField, SliceInfo, SlicePortInfo, ZONE_LABEL,
};
use crate::model::{IPVS_SCHEDULERS, Protocol, UnknownProtocol};
use k8s_openapi::api::core::v1::{Node, Service, ServiceSpec, ServiceStatus};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointHints, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::net::IpAddr;
use std::sync::Arc;

/// `(namespace, name)` of an object, interned namespace (`default` when unset).
fn identity(meta: &ObjectMeta, strings: &mut Interner) -> (Arc<str>, Arc<str>) {
    (
        strings.intern(meta.namespace.as_deref().unwrap_or("default")),
        Arc::from(meta.name.as_deref().unwrap_or_default()),
    )
}

/// What planning reads of `service`.
pub fn service(service: &Service, strings: &mut Interner) -> ServiceInfo {
    let meta = &service.metadata;
    let (namespace, name) = identity(meta, strings);
    let default_spec = ServiceSpec::default();
    let spec = service.spec.as_ref().unwrap_or(&default_spec);
    ServiceInfo {
        namespace,
        name,
        created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        other_proxy: meta
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key(SERVICE_PROXY_NAME_LABEL)),
        scheduler: scheduler(meta, strings),
        type_: service_type(spec),
        cluster_ips: cluster_ips(spec),
        external_ips: spec
            .external_ips
            .iter()
            .flatten()
            .map(|text| Parsed::parse(text))
            .collect(),
        source_ranges: source_ranges(spec),
        ingress: ingress(service.status.as_ref()),
        client_ip_affinity: client_ip_affinity(spec),
        external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        ports: service_ports(spec, strings),
        health_check_node_port: spec.health_check_node_port,
    }
}

/// The `kipvs.io/scheduler` annotation of a Service.
fn scheduler(meta: &ObjectMeta, strings: &mut Interner) -> Option<Arc<str>> {
    let value = meta.annotations.as_ref()?.get(SCHEDULER_ANNOTATION)?;
    // Any text may be written there: only the schedulers there are get shared.
    Some(if IPVS_SCHEDULERS.contains(&value.as_str()) {
        strings.intern(value)
    } else {
        Arc::from(value.as_str())
    })
}

/// `spec.type` (`ClusterIP` when unset).
fn service_type(spec: &ServiceSpec) -> ServiceTypeField {
    match spec.type_.as_deref().unwrap_or("ClusterIP") {
        "ClusterIP" => ServiceTypeField::ClusterIp,
        "NodePort" => ServiceTypeField::NodePort,
        "LoadBalancer" => ServiceTypeField::LoadBalancer,
        "ExternalName" => ServiceTypeField::ExternalName,
        other => ServiceTypeField::Unknown(other.into()),
    }
}

/// `spec.clusterIPs`, else the older `spec.clusterIP`: `None` is headless, empty is unset.
fn cluster_ips(spec: &ServiceSpec) -> ClusterIps {
    let (indexed, texts): (bool, Vec<&String>) = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => (true, ips.iter().collect()),
        _ => (false, spec.cluster_ip.iter().collect()),
    };
    if texts.iter().any(|ip| *ip == "None") {
        ClusterIps::Headless
    } else if texts.iter().all(|ip| ip.is_empty()) {
        ClusterIps::Unset
    } else {
        ClusterIps::Ips {
            indexed,
            ips: texts.iter().map(|text| Parsed::parse(text)).collect(),
        }
    }
}

/// `spec.loadBalancerSourceRanges`, each a CIDR (surrounding blanks allowed, as kube-proxy).
fn source_ranges(spec: &ServiceSpec) -> Box<[Parsed<ipnet::IpNet>]> {
    spec.load_balancer_source_ranges
        .iter()
        .flatten()
        .map(|text| match text.trim().parse() {
            Ok(net) => Parsed::Ok(net),
            Err(_) => Parsed::Invalid(text.as_str().into()),
        })
        .collect()
}

/// `status.loadBalancer.ingress`: each entry's IP (an empty one is none) and `ipMode`.
fn ingress(status: Option<&ServiceStatus>) -> Box<[Ingress]> {
    status
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .map(|entry| Ingress {
            ip: entry
                .ip
                .as_deref()
                .filter(|ip| !ip.is_empty())
                .map(Parsed::parse),
            ip_mode: entry.ip_mode.as_deref().map(|mode| match mode {
                "VIP" => IpMode::Vip,
                "Proxy" => IpMode::Proxy,
                other => IpMode::Unknown(other.into()),
            }),
        })
        .collect()
}

/// `Some(timeout)` when `spec.sessionAffinity` is `ClientIP`, with
/// `sessionAffinityConfig.clientIP.timeoutSeconds` if set.
fn client_ip_affinity(spec: &ServiceSpec) -> Option<Option<i32>> {
    (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|config| config.client_ip.as_ref())
            .and_then(|client_ip| client_ip.timeout_seconds)
    })
}

/// `spec.ports`: name, protocol, port and node port of each.
fn service_ports(spec: &ServiceSpec, strings: &mut Interner) -> Box<[ServicePortInfo]> {
    spec.ports
        .iter()
        .flatten()
        .map(|port| ServicePortInfo {
            name: strings.intern(port.name.as_deref().unwrap_or_default()),
            protocol: parse_protocol(port.protocol.as_deref()),
            port: port.port,
            node_port: port.node_port,
        })
        .collect()
}

/// What planning reads of `slice`.
pub fn slice(slice: &EndpointSlice, strings: &mut Interner) -> SliceInfo {
    let meta = &slice.metadata;
    let (namespace, name) = identity(meta, strings);
    let address_type = match slice.address_type.as_str() {
        "IPv4" => AddressType::Ipv4,
        "IPv6" => AddressType::Ipv6,
        "FQDN" => AddressType::Fqdn,
        other => AddressType::Unknown(other.into()),
    };
    let endpoints = slice
        .endpoints
        .iter()
        .flatten()
        .map(|endpoint| self::endpoint(endpoint, &address_type, strings))
        .collect();
    let ports = slice
        .ports
        .iter()
        .flatten()
        .map(|port| SlicePortInfo {
            name: strings.intern(port.name.as_deref().unwrap_or_default()),
            port: port.port,
            protocol: parse_protocol(port.protocol.as_deref()),
        })
        .collect();
    SliceInfo {
        service: meta
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SERVICE_NAME_LABEL))
            .map(|service| Arc::from(service.as_str())),
        namespace,
        name,
        address_type,
        endpoints,
        ports,
    }
}

/// What planning reads of one endpoint of a slice of `address_type`.
fn endpoint(
    endpoint: &Endpoint,
    address_type: &AddressType,
    strings: &mut Interner,
) -> EndpointInfo {
    let (ready, serving, terminating) = conditions(endpoint.conditions.as_ref());
    EndpointInfo {
        address: endpoint
            .addresses
            .first()
            .map(|text| endpoint_address(text, address_type)),
        ready,
        serving,
        terminating,
        node_name: endpoint.node_name.as_deref().map(|n| strings.intern(n)),
        hints: endpoint
            .hints
            .as_ref()
            .map(|hints| self::hints(hints, strings))
            .filter(|h| !h.for_zones.is_empty() || !h.for_nodes.is_empty())
            .map(Box::new),
    }
}

/// An endpoint's first address: an IP of the slice's family, of the other one, or not an IP.
fn endpoint_address(text: &str, address_type: &AddressType) -> EndpointAddress {
    match (text.parse::<IpAddr>(), address_type) {
        (Err(_), _) => EndpointAddress::Invalid(text.into()),
        (Ok(ip), AddressType::Ipv4) if !ip.is_ipv4() => EndpointAddress::OtherFamily(text.into()),
        (Ok(ip), AddressType::Ipv6) if ip.is_ipv4() => EndpointAddress::OtherFamily(text.into()),
        (Ok(ip), _) => EndpointAddress::Ip(ip),
    }
}

/// An endpoint's topology hints: the zones (`forZones`) and nodes (`forNodes`) it serves.
fn hints(hints: &EndpointHints, strings: &mut Interner) -> Hints {
    Hints {
        for_zones: hints
            .for_zones
            .iter()
            .flatten()
            .map(|zone| strings.intern(&zone.name))
            .collect(),
        for_nodes: hints
            .for_nodes
            .iter()
            .flatten()
            .map(|node| strings.intern(&node.name))
            .collect(),
    }
}

/// `(ready, serving, terminating)` with the API's defaults for unset conditions.
fn conditions(conditions: Option<&EndpointConditions>) -> (bool, bool, bool) {
    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
    (ready, serving, terminating)
}

/// What planning reads of the own Node: its zone label, primary IPs, InternalIPs and pod
/// CIDRs.
pub fn node(node: &Node) -> NodeInfo {
    NodeInfo {
        zone: node
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(ZONE_LABEL))
            .filter(|zone| !zone.is_empty())
            .cloned(),
        primary_ips: node_primary_ips(node),
        internal_ips: node_internal_ips(node),
        pod_cidrs: node_pod_cidrs(node),
    }
}

/// A Node's `spec.podCIDRs` (else its `spec.podCIDR`), as kube-proxy's `NodeCIDR` detector
/// reads them; unparsable entries are skipped.
fn node_pod_cidrs(node: &Node) -> Vec<ipnet::IpNet> {
    let spec = node.spec.as_ref();
    let listed = spec
        .and_then(|spec| spec.pod_cidrs.clone())
        .unwrap_or_default();
    let cidrs = if listed.is_empty() {
        spec.and_then(|spec| spec.pod_cidr.clone())
            .into_iter()
            .collect()
    } else {
        listed
    };
    cidrs.iter().filter_map(|cidr| cidr.parse().ok()).collect()
}

/// The InternalIP addresses of a Node (`status.addresses[type=InternalIP]`), in order;
/// unparsable entries are skipped. The default NodePort addresses when none are given.
fn node_internal_ips(node: &Node) -> Vec<IpAddr> {
    node_addresses(node, "InternalIP").collect()
}

/// The Node's primary IPs, as kubelet and kube-proxy pick them (`GetNodeHostIPs` in
/// `component-helpers/node/util`): the first of its InternalIP addresses, else of its
/// ExternalIP addresses, then the first address of the other family in the same order, if
/// any. At most one per family; empty when the Node lists no address.
fn node_primary_ips(node: &Node) -> Vec<IpAddr> {
    let mut candidates =
        node_addresses(node, "InternalIP").chain(node_addresses(node, "ExternalIP"));
    let Some(first) = candidates.next() else {
        return Vec::new();
    };
    let other = candidates.find(|ip| ip.is_ipv4() != first.is_ipv4());
    std::iter::once(first).chain(other).collect()
}

/// The parsable `status.addresses` of a Node of one type, in order.
fn node_addresses<'a>(node: &'a Node, type_: &'a str) -> impl Iterator<Item = IpAddr> + 'a {
    node.status
        .iter()
        .flat_map(|status| status.addresses.iter().flatten())
        .filter(move |address| address.type_ == type_)
        .filter_map(|address| address.address.parse().ok())
}

/// Parses a Service or EndpointSlice port protocol; unset means TCP (the API default).
fn parse_protocol(protocol: Option<&str>) -> Result<Protocol, UnknownProtocol> {
    protocol.unwrap_or("TCP").parse()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    fn k8s_node(addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("test-node".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(type_, address)| NodeAddress {
                            type_: (*type_).into(),
                            address: (*address).into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    #[test]
    fn node_internal_and_primary_ips() {
        let listed = k8s_node(&[
            ("Hostname", "test-node"),
            ("InternalIP", "192.168.0.10"),
            ("ExternalIP", "203.0.113.10"),
            ("InternalIP", "fd00::10"),
            ("InternalIP", "bogus"),
            ("InternalIP", "192.168.0.11"),
        ]);
        assert_eq!(
            node(&listed).internal_ips,
            ips(&["192.168.0.10", "fd00::10", "192.168.0.11"])
        );
        // GetNodeHostIPs (component-helpers/node/util, TestGetNodeHostIPs): InternalIPs first,
        // then ExternalIPs; the first address, then the first of the other family.
        for (addresses, primary) in [
            (
                &[("InternalIP", "192.168.0.10"), ("InternalIP", "fd00::10")][..],
                &["192.168.0.10", "fd00::10"][..],
            ),
            (
                &[("InternalIP", "fd00::10"), ("InternalIP", "192.168.0.10")],
                &["fd00::10", "192.168.0.10"],
            ),
            (
                &[
                    ("ExternalIP", "2001:db8::10"),
                    ("InternalIP", "192.168.0.10"),
                ],
                &["192.168.0.10", "2001:db8::10"],
            ),
            (
                &[
                    ("ExternalIP", "203.0.113.10"),
                    ("ExternalIP", "2001:db8::10"),
                ],
                &["203.0.113.10", "2001:db8::10"],
            ),
            (
                &[
                    ("InternalIP", "192.168.0.10"),
                    ("InternalIP", "192.168.0.11"),
                ],
                &["192.168.0.10"],
            ),
            (&[("Hostname", "test-node")], &[]),
        ] {
            assert_eq!(
                node(&k8s_node(addresses)).primary_ips,
                ips(primary),
                "{addresses:?}"
            );
        }
    }

    #[test]
    fn zone_from_the_node_label() {
        let mut labelled = k8s_node(&[]);
        let zone = |n: &Node| node(n).zone;
        assert_eq!(zone(&labelled), None);
        labelled.metadata.labels = Some([(ZONE_LABEL.to_owned(), "zone-a".to_owned())].into());
        assert_eq!(zone(&labelled).as_deref(), Some("zone-a"));
        // TestCategorizeEndpoints "empty zone label": an empty label is no zone.
        labelled.metadata.labels = Some([(ZONE_LABEL.to_owned(), String::new())].into());
        assert_eq!(zone(&labelled), None);
    }

    /// `detectLocalMode: NodeCIDR` reads `spec.podCIDRs`, else `spec.podCIDR` (a Node of a
    /// release before dual-stack); unparsable entries are skipped.
    #[test]
    fn pod_cidrs_from_the_node_spec() {
        let mut n = k8s_node(&[]);
        assert!(node(&n).pod_cidrs.is_empty());
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            pod_cidr: Some("10.244.3.0/24".into()),
            ..Default::default()
        });
        assert_eq!(node(&n).pod_cidrs, ["10.244.3.0/24".parse().unwrap()]);
        n.spec.as_mut().unwrap().pod_cidrs = Some(vec![
            "10.244.3.0/24".into(),
            "fd00:10:244:3::/64".into(),
            "bogus".into(),
        ]);
        let expected: Vec<ipnet::IpNet> = vec![
            "10.244.3.0/24".parse().unwrap(),
            "fd00:10:244:3::/64".parse().unwrap(),
        ];
        assert_eq!(node(&n).pod_cidrs, expected);
    }

    #[test]
    fn protocols() {
        assert_eq!(parse_protocol(None), Ok(Protocol::Tcp));
        assert_eq!(parse_protocol(Some("UDP")), Ok(Protocol::Udp));
        assert_eq!(parse_protocol(Some("SCTP")), Ok(Protocol::Sctp));
        let unknown = parse_protocol(Some("tcp")).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "unknown protocol \"tcp\" (expected TCP, UDP or SCTP)"
        );
    }
}
