//! The Kubernetes boundary of planning: Services and EndpointSlices into the domain values of
//! [`objects`](super::objects). The store converts every object as it arrives and keeps only
//! the result; [`plan`](super::plan) converts its input the same way. Nothing is validated
//! away here: a field that does not parse is kept as text and reported when planned.

use super::objects::{
    AddressType, ClusterIps, EndpointAddress, EndpointInfo, Hints, Ingress, Interner, IpMode,
    Parsed, ServiceInfo, ServicePortInfo, ServiceTypeField, SliceInfo, SlicePortInfo,
};
use super::{SCHEDULER_ANNOTATION, SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL, parse_protocol};
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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
    let type_ = match spec.type_.as_deref().unwrap_or("ClusterIP") {
        "ClusterIP" => ServiceTypeField::ClusterIp,
        "NodePort" => ServiceTypeField::NodePort,
        "LoadBalancer" => ServiceTypeField::LoadBalancer,
        "ExternalName" => ServiceTypeField::ExternalName,
        other => ServiceTypeField::Unknown(other.into()),
    };
    let (indexed, texts): (bool, Vec<&String>) = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => (true, ips.iter().collect()),
        _ => (false, spec.cluster_ip.iter().collect()),
    };
    let cluster_ips = if texts.iter().any(|ip| *ip == "None") {
        ClusterIps::Headless
    } else if texts.iter().all(|ip| ip.is_empty()) {
        ClusterIps::Unset
    } else {
        ClusterIps::Ips {
            indexed,
            ips: texts.iter().map(|text| Parsed::parse(text)).collect(),
        }
    };
    let ingress = service
        .status
        .as_ref()
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
        .collect();
    let client_ip_affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|config| config.client_ip.as_ref())
            .and_then(|client_ip| client_ip.timeout_seconds)
    });
    ServiceInfo {
        namespace,
        name,
        other_proxy: meta
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key(SERVICE_PROXY_NAME_LABEL)),
        scheduler: meta
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(SCHEDULER_ANNOTATION))
            .map(|value| strings.intern(value)),
        type_,
        cluster_ips,
        external_ips: spec
            .external_ips
            .iter()
            .flatten()
            .map(|text| Parsed::parse(text))
            .collect(),
        source_ranges: spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .map(|text| match text.trim().parse() {
                Ok(net) => Parsed::Ok(net),
                Err(_) => Parsed::Invalid(text.as_str().into()),
            })
            .collect(),
        ingress,
        client_ip_affinity,
        external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        ports: spec
            .ports
            .iter()
            .flatten()
            .map(|port| ServicePortInfo {
                name: strings.intern(port.name.as_deref().unwrap_or_default()),
                protocol: parse_protocol(port.protocol.as_deref()),
                port: port.port,
                node_port: port.node_port,
            })
            .collect(),
        health_check_node_port: spec.health_check_node_port,
    }
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
        .map(|endpoint| {
            let (ready, serving, terminating) = conditions(endpoint.conditions.as_ref());
            let mut names = |list: Option<Vec<&str>>| -> Box<[Arc<str>]> {
                list.into_iter()
                    .flatten()
                    .map(|name| strings.intern(name))
                    .collect()
            };
            let hints = endpoint.hints.as_ref().map(|hints| Hints {
                for_zones: names(
                    hints
                        .for_zones
                        .as_ref()
                        .map(|zones| zones.iter().map(|z| z.name.as_str()).collect()),
                ),
                for_nodes: names(
                    hints
                        .for_nodes
                        .as_ref()
                        .map(|nodes| nodes.iter().map(|n| n.name.as_str()).collect()),
                ),
            });
            EndpointInfo {
                address: endpoint.addresses.first().map(|text| {
                    match (text.parse::<std::net::IpAddr>(), &address_type) {
                        (Err(_), _) => EndpointAddress::Invalid(text.as_str().into()),
                        (Ok(ip), AddressType::Ipv4) if !ip.is_ipv4() => {
                            EndpointAddress::OtherFamily(text.as_str().into())
                        }
                        (Ok(ip), AddressType::Ipv6) if ip.is_ipv4() => {
                            EndpointAddress::OtherFamily(text.as_str().into())
                        }
                        (Ok(ip), _) => EndpointAddress::Ip(ip),
                    }
                }),
                ready,
                serving,
                terminating,
                node_name: endpoint.node_name.as_deref().map(|n| strings.intern(n)),
                hints: hints
                    .filter(|h| !h.for_zones.is_empty() || !h.for_nodes.is_empty())
                    .map(Box::new),
            }
        })
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

/// `(ready, serving, terminating)` with the API's defaults for unset conditions.
fn conditions(conditions: Option<&EndpointConditions>) -> (bool, bool, bool) {
    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
    (ready, serving, terminating)
}
