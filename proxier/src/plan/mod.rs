//! `plan()`: Services, EndpointSlices, the own Node and the configuration in; the IPVS table
//! kipvs wants ([`DesiredState`]) out.
//!
//! Pure and total: no I/O, no clock, and no input makes it fail. Whatever is wrong with an
//! object becomes a [`Problem`] naming the object, and everything else is still planned (one
//! bad Service never stops the others).
//!
//! The rules are kube-proxy's IPVS mode (`pkg/proxy/ipvs/proxier.go`, `syncService` and
//! `syncEndpoint`; `pkg/proxy/serviceport.go`; `pkg/proxy/topology.go`) with the
//! differences the design brief decides:
//!
//! | Service part | Virtual servers | Bound on `kube-ipvs0` | Real servers |
//! |---|---|---|---|
//! | `spec.clusterIPs` | each cluster IP × port | yes | local if `internalTrafficPolicy: Local` (never remote: upstream quirk Q1 is *not* copied), else all |
//! | `spec.externalIPs` | each IP of a service family × port | yes | external set (below) |
//! | `status.loadBalancer.ingress[].ip` (type LoadBalancer) | each VIP-mode IP of a service family × port; `ipMode: Proxy` gets none while `LoadBalancerIPMode` is on (KEP-1860) | VIP-mode ones | external set |
//! | `spec.ports[].nodePort` (type NodePort/LoadBalancer) | each node IP of a service family × nodePort | never | external set |
//! | `spec.healthCheckNodePort` (LoadBalancer + `externalTrafficPolicy: Local`) | none: a health-check listener counting local **ready** endpoints | — | — |
//!
//! The *external set* is the local endpoints when `externalTrafficPolicy: Local` applies (the
//! Service is NodePort, LoadBalancer or has externalIPs), except that when no local endpoint
//! is selectable at all the cluster-wide set is used (upstream quirk Q2, kept on purpose: an
//! IPVS virtual server cannot tell local pods from outside clients, and the
//! healthCheckNodePort's 503 keeps load balancers away). Such Services are counted in
//! [`Plan::no_local_endpoints`].
//!
//! Which endpoints are selected, and with which weight, is decided per scope (all endpoints,
//! or only this node's) and IP family by the KEP-1669 rules in `endpoints::select`:
//! ready → weight 1; serving+terminating → weight 0 while a ready one exists, weight 1 when
//! none does (the fallback, counted in [`Plan::terminating_fallback_services`]); never with
//! `ProxyTerminatingEndpoints` off; not-serving never.
//!
//! Other rules: `sessionAffinity: ClientIP` makes every virtual server of the Service
//! persistent for `timeoutSeconds` (default 10800); the scheduler comes from `ipvs.scheduler`
//! (`""` → `rr`), and `mh` also sets the source-port hashing flag as kube-proxy does; headless
//! (`clusterIP: None`) and ExternalName Services, and Services labelled
//! `service.kubernetes.io/service-proxy-name`, are skipped; a Service port takes the
//! endpoints of the slice port with the same name and protocol; a real server is
//! `addresses[0]:port` of an endpoint of the virtual server's IP family. Topology hints are
//! not applied yet.
//!
//! Structure: [`plan_service`] plans one Service from its own slices into a [`ServicePlan`];
//! [`merge`] combines Service plans (in namespace/name order, the first claim of a virtual
//! server or health-check port wins); [`plan`] does both for a whole snapshot. An incremental
//! sync can keep the [`ServicePlan`]s and re-plan only the Services that changed.

mod endpoints;
mod index;
mod service;

pub use index::{DesiredIndex, ServiceKey, Touched};
pub use service::{ServicePlan, plan_service};

use crate::model::{DesiredState, Protocol, SchedFlags, VirtualServerSpec};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kipvs_crds::{Gate, NodePortAddress, ProxierConfiguration};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

/// Label linking an EndpointSlice to its Service (`discovery.k8s.io/v1`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Label that hands a Service to another proxy; kipvs skips every Service carrying it
/// (kube-proxy skips it unless it equals its `--service-proxy-name`, which kipvs does not have).
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// `IP_VS_SVC_F_SCHED_MH_PORT` (= `IP_VS_SVC_F_SCHED2`, 0x10): the `mh` scheduler hashes the
/// source port too. kube-proxy sets it (`FlagSourceHash`) whenever the scheduler is `mh`.
pub const SCHED_FLAG_MH_PORT: SchedFlags = 0x10;

/// Everything [`plan`] reads.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    /// All Services (any order; duplicates by namespace/name are reported and ignored).
    pub services: &'a [Service],
    /// All EndpointSlices; each belongs to the Service named by its
    /// `kubernetes.io/service-name` label in its namespace.
    pub endpoint_slices: &'a [EndpointSlice],
    /// This node's name: endpoints whose `nodeName` equals it are local.
    pub node_name: &'a str,
    /// This node's Node object, if known (used for `nodePortAddresses: [primary]`).
    pub node: Option<&'a Node>,
    /// This node's IP addresses, the candidates for NodePort virtual servers (filtered by
    /// `nodePortAddresses`). The caller excludes loopback and `kube-ipvs0` addresses.
    pub node_ips: &'a [IpAddr],
    /// The proxier configuration (scheduler, feature gates, `nodePortAddresses`).
    pub config: &'a ProxierConfiguration,
}

/// The outcome of [`plan`]: the desired IPVS state, what was wrong with the input, and the
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
    /// A problem with a namespaced object (namespace defaults to `default`).
    pub(crate) fn new(kind: &'static str, meta: &ObjectMeta, message: String) -> Self {
        Problem {
            kind,
            namespace: namespace_of(meta).to_owned(),
            name: meta.name.clone().unwrap_or_default(),
            message,
        }
    }

    fn config(message: String) -> Self {
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

/// What every Service plan shares: derived once per [`plan`] from the node and configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanContext {
    node_name: String,
    node_port_ips: Vec<IpAddr>,
    vs_spec: VirtualServerSpec,
    terminating_endpoints: bool,
    load_balancer_ip_mode: bool,
}

impl PlanContext {
    /// Derives the shared settings, reporting configuration problems.
    ///
    /// NodePort addresses are the `node_ips` selected by `nodePortAddresses`: all of them when
    /// it is empty, those inside one of its CIDRs, or for `["primary"]` the Node's first
    /// InternalIP of each family (a problem if the Node is unknown).
    pub fn new(
        node_name: &str,
        node: Option<&Node>,
        node_ips: &[IpAddr],
        config: &ProxierConfiguration,
    ) -> (Self, Vec<Problem>) {
        let mut problems = Vec::new();
        let selectors = config.parsed_node_port_addresses().unwrap_or_else(|e| {
            problems.push(Problem::config(format!("{e}; using every node IP")));
            Vec::new()
        });
        let node_port_ips: BTreeSet<IpAddr> = match selectors.as_slice() {
            [] => node_ips.iter().copied().collect(),
            [NodePortAddress::Primary] => match node {
                Some(node) => primary_ips(node).collect(),
                None => {
                    problems.push(Problem::config(format!(
                        "nodePortAddresses: \"primary\" needs the Node object {node_name:?}, which is \
                         not known; no NodePort virtual servers"
                    )));
                    BTreeSet::new()
                }
            },
            cidrs => node_ips
                .iter()
                .copied()
                .filter(|ip| {
                    cidrs.iter().any(|selector| match selector {
                        NodePortAddress::Cidr(net) => net.contains(ip),
                        NodePortAddress::Primary => false,
                    })
                })
                .collect(),
        };
        let scheduler = config.ipvs.effective_scheduler().to_owned();
        let sched_flags = if scheduler == "mh" {
            SCHED_FLAG_MH_PORT
        } else {
            0
        };
        let context = PlanContext {
            node_name: node_name.to_owned(),
            node_port_ips: node_port_ips.into_iter().collect(),
            vs_spec: VirtualServerSpec {
                scheduler,
                persistence_timeout: None,
                sched_flags,
            },
            terminating_endpoints: config.gate_enabled(Gate::ProxyTerminatingEndpoints),
            load_balancer_ip_mode: config.gate_enabled(Gate::LoadBalancerIPMode),
        };
        (context, problems)
    }

    /// The addresses NodePort virtual servers are created on, sorted.
    pub fn node_port_ips(&self) -> &[IpAddr] {
        &self.node_port_ips
    }
}

/// The InternalIP addresses of a Node (`status.addresses[type=InternalIP]`), in order;
/// unparsable entries are skipped. The default NodePort addresses when none are given.
pub fn node_internal_ips(node: &Node) -> Vec<IpAddr> {
    node.status
        .iter()
        .flat_map(|status| status.addresses.iter().flatten())
        .filter(|address| address.type_ == "InternalIP")
        .filter_map(|address| address.address.parse().ok())
        .collect()
}

/// The Node's primary IPs: its first InternalIP of each family.
fn primary_ips(node: &Node) -> impl Iterator<Item = IpAddr> {
    let ips = node_internal_ips(node);
    let first_v4 = ips.iter().copied().find(IpAddr::is_ipv4);
    let first_v6 = ips.iter().copied().find(IpAddr::is_ipv6);
    first_v4.into_iter().chain(first_v6)
}

/// Plans every Service of a snapshot: [`plan_service`] for each (in namespace/name order, with
/// its slices) and [`merge`] of the results. Configuration problems come first.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let (context, mut problems) =
        PlanContext::new(input.node_name, input.node, input.node_ips, input.config);

    let mut slices: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in input.endpoint_slices {
        let service_name = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SERVICE_NAME_LABEL));
        if let Some(service_name) = service_name {
            slices
                .entry((namespace_of(&slice.metadata), service_name))
                .or_default()
                .push(slice);
        }
    }
    for group in slices.values_mut() {
        group.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }

    let mut services: BTreeMap<(&str, &str), &Service> = BTreeMap::new();
    for service in input.services {
        let key = (
            namespace_of(&service.metadata),
            service.metadata.name.as_deref().unwrap_or_default(),
        );
        if key.1.is_empty() {
            problems.push(Problem::new(
                "Service",
                &service.metadata,
                "metadata.name is not set; the Service is skipped".to_owned(),
            ));
        } else if services.insert(key, service).is_some() {
            problems.push(Problem::new(
                "Service",
                &service.metadata,
                "listed more than once; only the last copy is used".to_owned(),
            ));
        }
    }

    let service_plans: Vec<ServicePlan> = services
        .iter()
        .filter_map(|(key, service)| {
            let own_slices = slices.get(key).map_or(&[][..], Vec::as_slice);
            plan_service(service, own_slices, &context)
        })
        .collect();
    let mut plan = merge(&service_plans);
    problems.append(&mut plan.problems);
    plan.problems = problems;
    plan
}

/// Combines Service plans into one [`Plan`]. A virtual server or health-check node port
/// claimed by several Services stays with the first in namespace/name order; the others get a
/// [`Problem`]. Bind addresses are united; the no-local-endpoints and fallback flags are
/// counted. (The same rules as [`DesiredIndex`], which keeps the union up to date.)
pub fn merge<'a>(service_plans: impl IntoIterator<Item = &'a ServicePlan>) -> Plan {
    let mut index = DesiredIndex::default();
    for service_plan in service_plans {
        let key = (service_plan.namespace.clone(), service_plan.name.clone());
        index.update(key, Some(service_plan.clone()));
    }
    index.to_plan()
}

/// Namespace of a namespaced object; `default` when unset (as `kubectl apply` would).
fn namespace_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("default")
}

/// Parses a Service or EndpointSlice port protocol; unset means TCP (the API default).
fn parse_protocol(protocol: Option<&str>) -> Result<Protocol, String> {
    match protocol.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(format!(
            "unknown protocol {other:?} (expected TCP, UDP or SCTP)"
        )),
    }
}

/// A port number from the API's `int32`, if it is in 1..=65535.
fn port_number(value: i32) -> Option<u16> {
    u16::try_from(value).ok().filter(|&port| port != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    fn node(addresses: &[(&str, &str)]) -> Node {
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
    fn node_internal_ips_in_order() {
        let node = node(&[
            ("Hostname", "test-node"),
            ("InternalIP", "192.168.0.10"),
            ("ExternalIP", "203.0.113.10"),
            ("InternalIP", "fd00::10"),
            ("InternalIP", "bogus"),
            ("InternalIP", "192.168.0.11"),
        ]);
        assert_eq!(
            node_internal_ips(&node),
            ips(&["192.168.0.10", "fd00::10", "192.168.0.11"])
        );
        assert_eq!(
            primary_ips(&node).collect::<Vec<_>>(),
            ips(&["192.168.0.10", "fd00::10"])
        );
    }

    #[test]
    fn node_port_addresses_select_node_ips() {
        let node_ips = ips(&["100.101.102.103", "10.0.0.5", "fd00::5"]);
        let context = |yaml: &str, node: Option<&Node>| {
            let config = ProxierConfiguration::from_yaml_str(yaml).unwrap();
            PlanContext::new("test-node", node, &node_ips, &config)
        };

        let (all, problems) = context("{}", None);
        assert_eq!(
            all.node_port_ips(),
            ips(&["10.0.0.5", "100.101.102.103", "fd00::5"])
        );
        assert!(problems.is_empty());

        let (cidr, _) = context("nodePortAddresses: [100.101.102.0/24, fd00::/64]", None);
        assert_eq!(cidr.node_port_ips(), ips(&["100.101.102.103", "fd00::5"]));

        let the_node = node(&[("InternalIP", "10.0.0.5"), ("InternalIP", "10.0.0.6")]);
        let (primary, problems) = context("nodePortAddresses: [primary]", Some(&the_node));
        assert_eq!(primary.node_port_ips(), ips(&["10.0.0.5"]));
        assert!(problems.is_empty());

        let (unknown, problems) = context("nodePortAddresses: [primary]", None);
        assert!(unknown.node_port_ips().is_empty());
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0]
                .to_string()
                .starts_with("ProxierConfiguration: nodePortAddresses: \"primary\" needs the Node"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn invalid_configuration_is_a_problem_not_a_failure() {
        let config = ProxierConfiguration {
            node_port_addresses: vec!["not-a-cidr".into()],
            ..Default::default()
        };
        let node_ips = ips(&["10.0.0.5"]);
        let (context, problems) = PlanContext::new("test-node", None, &node_ips, &config);
        assert_eq!(context.node_port_ips(), node_ips);
        assert_eq!(
            problems[0].to_string(),
            "ProxierConfiguration: nodePortAddresses[0]: \"not-a-cidr\" is not a CIDR (such as \
             10.0.0.0/8 or fd00::/64); using every node IP"
        );
    }

    #[test]
    fn scheduler_and_flags() {
        let node_ips = [];
        for (scheduler, expected, flags) in [("", "rr", 0), ("wlc", "wlc", 0), ("mh", "mh", 0x10)] {
            let mut config = ProxierConfiguration::default();
            config.ipvs.scheduler = scheduler.into();
            let (context, _) = PlanContext::new("n", None, &node_ips, &config);
            assert_eq!(context.vs_spec.scheduler, expected);
            assert_eq!(context.vs_spec.sched_flags, flags);
            assert_eq!(context.vs_spec.persistence_timeout, None);
        }
    }

    #[test]
    fn problem_display() {
        let meta = ObjectMeta {
            name: Some("web".into()),
            ..Default::default()
        };
        let problem = Problem::new("Service", &meta, "broken".into());
        assert_eq!(problem.to_string(), "Service default/web: broken");
        assert_eq!(
            Problem::config("bad".into()).to_string(),
            "ProxierConfiguration: bad"
        );
    }

    #[test]
    fn protocols_and_ports() {
        assert_eq!(parse_protocol(None), Ok(Protocol::Tcp));
        assert_eq!(parse_protocol(Some("UDP")), Ok(Protocol::Udp));
        assert_eq!(parse_protocol(Some("SCTP")), Ok(Protocol::Sctp));
        assert_eq!(
            parse_protocol(Some("tcp")),
            Err("unknown protocol \"tcp\" (expected TCP, UDP or SCTP)".into())
        );
        assert_eq!(port_number(1), Some(1));
        assert_eq!(port_number(65535), Some(65535));
        assert_eq!(port_number(0), None);
        assert_eq!(port_number(-1), None);
        assert_eq!(port_number(65536), None);
    }
}
