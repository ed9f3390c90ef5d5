//! Planning one Service: its virtual servers, bind addresses and health-check node port.

use super::context::{PlanContext, port_number, scheduler_spec};
use super::endpoints::{self, Endpoint, EndpointsByPort, Selection, Topology};
use super::outcome::Problem;
use crate::model::objects::{
    ClusterIps, Ingress, IpMode, Parsed, SCHEDULER_ANNOTATION, ServiceInfo, ServicePortInfo,
    ServiceTypeField, SliceInfo,
};
use crate::model::{
    HealthCheckNodePort, Protocol, VirtualServer, VirtualServerKey, VirtualServerSpec,
};
use crate::model::{IPVS_SCHEDULERS, SetElement};
use ipnet::IpNet;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// `sessionAffinityConfig.clientIP.timeoutSeconds` when unset (the API default, 3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

/// Largest `timeoutSeconds` the API accepts (one day).
const MAX_AFFINITY_TIMEOUT_SECONDS: i32 = 86_400;

/// What one Service contributes to the desired state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicePlan {
    /// Service namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// `metadata.creationTimestamp` in seconds since the Unix epoch (`None` when unset): of two
    /// Services claiming one virtual server the same way, the older keeps it.
    pub created: Option<i64>,
    /// The Service's virtual servers.
    pub virtual_servers: BTreeMap<VirtualServerKey, VirtualServer>,
    /// Those of its virtual servers that only `spec.externalIPs` asks for (not its ClusterIP or
    /// load-balancer ingress): they yield to any Service that has the address as ClusterIP or
    /// load-balancer ingress, so an externalIP cannot take over another Service's traffic
    /// (CVE-2020-8554).
    pub external_ip_virtual_servers: BTreeSet<VirtualServerKey>,
    /// Addresses of its virtual servers to bind on `kube-ipvs0` (cluster IPs, and the external
    /// IPs and VIP-mode load-balancer IPs that are not on another interface).
    pub bind_addresses: BTreeSet<IpAddr>,
    /// Its health-check node port, for LoadBalancer Services with
    /// `externalTrafficPolicy: Local` and `spec.healthCheckNodePort` set.
    pub health_check_node_port: Option<(u16, HealthCheckNodePort)>,
    /// `internalTrafficPolicy: Local`, endpoints exist, none on this node (for some port).
    pub no_local_endpoints_internal: bool,
    /// `externalTrafficPolicy: Local` applies, endpoints exist, none on this node (for some
    /// port), so the external virtual servers use the cluster-wide endpoints.
    pub no_local_endpoints_external: bool,
    /// Some virtual server is served by the KEP-1669 fallback (serving+terminating endpoints
    /// at weight 1).
    pub terminating_fallback: bool,
    /// Its elements of the nftables sets (masquerade, hairpin, filtering; see
    /// [`crate::dataplane::nftables`]).
    pub set_elements: BTreeSet<SetElement>,
    /// Problems with the Service or its EndpointSlices.
    pub problems: Vec<Problem>,
}

/// The Service types kipvs programs (ExternalName is skipped before this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// Plans one Service from its own EndpointSlices (those labelled with its name, in its
/// namespace).
///
/// Returns `None` for Services kipvs does not handle: headless (`clusterIP: None`),
/// `type: ExternalName`, and those labelled `service.kubernetes.io/service-proxy-name`.
/// Invalid fields become problems in the returned plan; the rest of the Service is planned.
pub fn plan_service(
    service: &ServiceInfo,
    slices: &[&SliceInfo],
    context: &PlanContext,
) -> Option<ServicePlan> {
    if service.other_proxy || matches!(service.cluster_ips, ClusterIps::Headless) {
        return None;
    }
    let mut plan = ServicePlan {
        namespace: service.namespace.to_string(),
        name: service.name.to_string(),
        created: service.created,
        ..ServicePlan::default()
    };
    let service_type = service_type(service, &mut plan)?;
    let Some(addresses) = Addresses::of(service, service_type, context, &mut plan) else {
        return Some(plan);
    };
    let spec = virtual_server_spec(service, context, &mut plan);
    let endpoints = endpoints::collect(
        slices,
        &context.node_name,
        context.zone(),
        &mut plan.problems,
    );
    let has_node_ports = service_type != ServiceType::ClusterIp;
    // externalTrafficPolicy only applies to externally reachable Services (kube-proxy's
    // `ExternallyAccessible`: NodePort, LoadBalancer, or any externalIPs).
    let externally_accessible = has_node_ports || !service.external_ips.is_empty();
    let policy = Policy {
        external_local: externally_accessible && service.external_local,
        internal_local: service.internal_local,
    };
    for (i, port) in service.ports.iter().enumerate() {
        let Some(port) = PortPlan::of(i, port, has_node_ports, spec.clone(), &mut plan) else {
            continue;
        };
        let port_endpoints = endpoints
            .get(&(port.name.clone(), port.protocol))
            .map_or(&[][..], Vec::as_slice);
        for ipv4 in [true, false] {
            port.plan_family(&mut plan, &addresses, port_endpoints, policy, context, ipv4);
        }
    }
    if service_type == ServiceType::LoadBalancer && policy.external_local {
        health_check(service, &addresses.cluster_ips, &endpoints, &mut plan);
    }
    // The addresses on kube-ipvs0: new connections to their other ports are rejected.
    let service_ips: Vec<SetElement> = plan
        .bind_addresses
        .iter()
        .map(|&ip| SetElement::ServiceIp(ip))
        .collect();
    plan.set_elements.extend(service_ips);
    Some(plan)
}

impl ServicePlan {
    /// Reports `message` as a problem of this Service.
    fn report(&mut self, message: String) {
        let problem = Problem::of("Service", &self.namespace, &self.name, message);
        self.problems.push(problem);
    }
}

/// `spec.type`: `None` for ExternalName; an unknown type is reported and planned as ClusterIP.
fn service_type(service: &ServiceInfo, plan: &mut ServicePlan) -> Option<ServiceType> {
    Some(match &service.type_ {
        ServiceTypeField::ExternalName => return None,
        ServiceTypeField::ClusterIp => ServiceType::ClusterIp,
        ServiceTypeField::NodePort => ServiceType::NodePort,
        ServiceTypeField::LoadBalancer => ServiceType::LoadBalancer,
        ServiceTypeField::Unknown(other) => {
            plan.report(format!("unknown spec.type {other:?}; treated as ClusterIP"));
            ServiceType::ClusterIp
        }
    })
}

/// The traffic policies that apply to a Service.
#[derive(Clone, Copy, Debug)]
struct Policy {
    /// `externalTrafficPolicy: Local`, on an externally reachable Service.
    external_local: bool,
    /// `internalTrafficPolicy: Local`.
    internal_local: bool,
}

impl Policy {
    /// The set element of an externally reachable virtual server `key`: `external-local` under
    /// `externalTrafficPolicy: Local`, else `external`.
    fn external_element(self, key: VirtualServerKey) -> SetElement {
        if self.external_local {
            SetElement::ExternalLocal(key)
        } else {
            SetElement::External(key)
        }
    }
}

/// The real servers one IP family of a port can have: the cluster-wide selection and the
/// local one (this node's endpoints).
struct Scopes {
    cluster: Selection,
    local: Selection,
}

impl Scopes {
    /// The scopes of the endpoints of one family. Topology hints narrow the cluster-wide set
    /// only (kube-proxy's CategorizeEndpoints: "topology ignored for Local endpoints").
    fn of(in_family: &[&Endpoint], terminating_endpoints: bool) -> Scopes {
        Scopes {
            cluster: endpoints::select(
                in_family.iter().copied(),
                terminating_endpoints,
                Topology::from_hints(in_family.iter().copied()),
            ),
            local: endpoints::select(
                in_family.iter().copied().filter(|e| e.local),
                terminating_endpoints,
                Topology::All,
            ),
        }
    }

    /// Endpoints exist, none of them on this node.
    fn no_local(&self) -> bool {
        self.local.is_empty() && !self.cluster.is_empty()
    }

    /// The real servers of cluster IPs: the local ones under `internalTrafficPolicy: Local`.
    fn internal(&self, policy: Policy) -> &Selection {
        if policy.internal_local {
            &self.local
        } else {
            &self.cluster
        }
    }

    /// The real servers of externally reachable addresses: the local ones under
    /// `externalTrafficPolicy: Local` when there are any, else the cluster-wide ones.
    fn external(&self, policy: Policy) -> &Selection {
        if policy.external_local && !self.local.is_empty() {
            &self.local
        } else {
            &self.cluster
        }
    }
}

/// The addresses of a Service, each valid and of one of its IP families (those of its cluster
/// IPs: kube-proxy runs one proxier per family).
struct Addresses {
    /// `spec.clusterIPs` (dual-stack aware), or the legacy `spec.clusterIP`.
    cluster_ips: Vec<IpAddr>,
    /// `spec.externalIPs`.
    external_ips: Vec<IpAddr>,
    /// The VIP-mode load-balancer ingress IPs (LoadBalancer Services only).
    load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` (LoadBalancer Services only).
    source_ranges: SourceRanges,
}

impl Addresses {
    /// The addresses of `service`, every invalid or other-family one reported and left out;
    /// `None` when it has no valid cluster IP (nothing is planned then).
    fn of(
        service: &ServiceInfo,
        service_type: ServiceType,
        context: &PlanContext,
        plan: &mut ServicePlan,
    ) -> Option<Self> {
        let cluster_ips = Self::cluster_ips(service, plan)?;
        let external_ips = parse_ips(
            &service.external_ips,
            |i| indexed_field("spec.externalIPs", Some(i)),
            |m| plan.report(m),
        );
        let external_ips = in_families(&cluster_ips, "spec.externalIPs", external_ips, plan);
        if service_type != ServiceType::LoadBalancer {
            return Some(Addresses {
                cluster_ips,
                external_ips,
                load_balancer_ips: Vec::new(),
                source_ranges: SourceRanges::default(),
            });
        }
        let vips = load_balancer_vips(&service.ingress, context, |m| plan.report(m));
        let load_balancer_ips =
            in_families(&cluster_ips, "status.loadBalancer.ingress", vips, plan);
        let source_ranges = Self::source_ranges(service, &load_balancer_ips, plan);
        Some(Addresses {
            cluster_ips,
            external_ips,
            load_balancer_ips,
            source_ranges,
        })
    }

    /// The valid cluster IPs of `service`; `None` when it is headless, has none set (reported)
    /// or none valid.
    fn cluster_ips(service: &ServiceInfo, plan: &mut ServicePlan) -> Option<Vec<IpAddr>> {
        let (indexed, texts) = match &service.cluster_ips {
            ClusterIps::Headless => return None,
            ClusterIps::Unset => {
                plan.report(
                    "spec.clusterIP is not set; the Service is skipped (as kube-proxy does)"
                        .to_owned(),
                );
                return None;
            }
            ClusterIps::Ips { indexed, ips } => (*indexed, ips),
        };
        let field = if indexed {
            "spec.clusterIPs"
        } else {
            "spec.clusterIP"
        };
        let cluster_ips = parse_ips(
            texts,
            |i| indexed_field(field, indexed.then_some(i)),
            |m| plan.report(m),
        );
        (!cluster_ips.is_empty()).then_some(cluster_ips)
    }

    /// `spec.loadBalancerSourceRanges` of a LoadBalancer `service` by family; a family of its
    /// `load_balancer_ips` without a range is reported (those IPs are not filtered).
    fn source_ranges(
        service: &ServiceInfo,
        load_balancer_ips: &[IpAddr],
        plan: &mut ServicePlan,
    ) -> SourceRanges {
        let ranges = source_ranges(&service.source_ranges, |m| plan.report(m));
        for (family, name) in [(IpFamily::V4, "IPv4"), (IpFamily::V6, "IPv6")] {
            if ranges.none_of(family) && load_balancer_ips.iter().any(|ip| family.has(ip)) {
                plan.report(format!(
                    "spec.loadBalancerSourceRanges has no {name} range: the {name} \
                     load-balancer IPs are not filtered (as kube-proxy)"
                ));
            }
        }
        ranges
    }
}

/// The addresses `ips` of `field` that are of one of the Service's families (those of its
/// `cluster_ips`). Every dropped address is reported: a single-stack IPv4 Service with an IPv6
/// externalIP must not lose it without a word.
fn in_families(
    cluster_ips: &[IpAddr],
    field: &str,
    ips: Vec<IpAddr>,
    plan: &mut ServicePlan,
) -> Vec<IpAddr> {
    let (kept, dropped): (Vec<IpAddr>, Vec<IpAddr>) = ips
        .into_iter()
        .partition(|ip| cluster_ips.iter().any(|c| c.is_ipv4() == ip.is_ipv4()));
    for ip in dropped {
        plan.report(format!(
            "{field} {ip} is not of the Service's IP families (spec.clusterIPs); ignored"
        ));
    }
    kept
}

/// The scheduler and persistence of a Service's virtual servers: `ipvs.scheduler`, or the
/// `kipvs.io/scheduler` annotation when it names a scheduler this node's kernel has, and
/// `sessionAffinity: ClientIP` as persistence (its timeout, or the API default).
fn virtual_server_spec(
    service: &ServiceInfo,
    context: &PlanContext,
    plan: &mut ServicePlan,
) -> VirtualServerSpec {
    let mut spec = context.vs_spec.clone();
    if let Some(value) = &service.scheduler {
        let shown = ShortText(value);
        if context.scheduler_unavailable(value) {
            plan.report(format!(
                "metadata.annotations[{SCHEDULER_ANNOTATION}] {shown}: this node's kernel lacks \
                 that IPVS scheduler (ip_vs_{value}); using {:?}",
                spec.scheduler
            ));
        } else if IPVS_SCHEDULERS.contains(&&**value) {
            spec = scheduler_spec(value);
        } else {
            plan.report(format!(
                "metadata.annotations[{SCHEDULER_ANNOTATION}] {shown} is not an IPVS scheduler \
                 (expected one of {}); using {:?}",
                IPVS_SCHEDULERS.join(", "),
                spec.scheduler
            ));
        }
    }
    if let Some(timeout) = service.client_ip_affinity {
        spec.persistence_timeout = Some(match timeout {
            None => DEFAULT_AFFINITY_TIMEOUT_SECONDS,
            Some(t) if (1..=MAX_AFFINITY_TIMEOUT_SECONDS).contains(&t) => t.unsigned_abs(),
            Some(t) => {
                plan.report(format!(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds {t} is out of range \
                     (1..{MAX_AFFINITY_TIMEOUT_SECONDS}); using {DEFAULT_AFFINITY_TIMEOUT_SECONDS}"
                ));
                DEFAULT_AFFINITY_TIMEOUT_SECONDS
            }
        });
    }
    spec
}

/// One port of a Service (`spec.ports[index]`), valid, and what its virtual servers share.
struct PortPlan {
    index: usize,
    name: Arc<str>,
    protocol: Protocol,
    number: u16,
    node_port: Option<u16>,
    spec: VirtualServerSpec,
    /// `namespace/name[:port]`, as kube-proxy names a service port.
    service_port: Arc<str>,
}

impl PortPlan {
    /// `spec.ports[index]`, or `None` (reported) when its protocol or port is invalid; an
    /// invalid `nodePort` is reported and the port has no NodePort virtual servers.
    fn of(
        index: usize,
        port: &ServicePortInfo,
        has_node_ports: bool,
        spec: VirtualServerSpec,
        plan: &mut ServicePlan,
    ) -> Option<Self> {
        let protocol = match &port.protocol {
            Ok(protocol) => *protocol,
            Err(message) => {
                plan.report(format!("spec.ports[{index}]: {message}; port skipped"));
                return None;
            }
        };
        let Some(number) = port_number(port.port) else {
            plan.report(format!(
                "spec.ports[{index}].port {} is out of range; port skipped",
                port.port
            ));
            return None;
        };
        let node_port = match port.node_port.filter(|_| has_node_ports) {
            None | Some(0) => None,
            Some(value) => {
                let parsed = port_number(value);
                if parsed.is_none() {
                    plan.report(format!(
                        "spec.ports[{index}].nodePort {value} is out of range; no NodePort virtual servers"
                    ));
                }
                parsed
            }
        };
        let service_port: Arc<str> = if port.name.is_empty() {
            format!("{}/{}", plan.namespace, plan.name).into()
        } else {
            format!("{}/{}:{}", plan.namespace, plan.name, port.name).into()
        };
        Some(PortPlan {
            index,
            name: port.name.clone(),
            protocol,
            number,
            node_port,
            spec,
            service_port,
        })
    }

    fn key(&self, address: IpAddr, port: u16) -> VirtualServerKey {
        VirtualServerKey {
            address,
            port,
            protocol: self.protocol,
        }
    }

    /// Adds the virtual server `address:port` with `selection`'s real servers; a second
    /// definition of one virtual server (two ports of the Service on one port number) is
    /// reported and the first kept.
    fn add(&self, plan: &mut ServicePlan, address: IpAddr, port: u16, selection: &Selection) {
        let key = self.key(address, port);
        let virtual_server = VirtualServer {
            spec: self.spec.clone(),
            real_servers: selection.real_servers.clone(),
            service: self.service_port.clone(),
        };
        plan.terminating_fallback |= selection.fallback;
        match plan.virtual_servers.entry(key) {
            Entry::Vacant(entry) => {
                entry.insert(virtual_server);
            }
            Entry::Occupied(entry) if *entry.get() == virtual_server => {}
            Entry::Occupied(entry) => {
                let message = format!(
                    "virtual server {key} is defined twice (for {} and spec.ports[{}]); \
                     the first definition is used",
                    entry.get().service,
                    self.index
                );
                plan.report(message);
            }
        }
    }

    /// The virtual servers, bind addresses and set elements of this port in one IP family:
    /// ClusterIPs with the internal endpoints, externalIPs, load-balancer IPs and NodePorts
    /// with the external ones, the firewall of the load-balancer IPs and the hairpin elements
    /// of the local endpoints.
    fn plan_family(
        &self,
        plan: &mut ServicePlan,
        addresses: &Addresses,
        endpoints: &[Endpoint],
        policy: Policy,
        context: &PlanContext,
        ipv4: bool,
    ) {
        let family = |ip: &&IpAddr| ip.is_ipv4() == ipv4;
        if !addresses.cluster_ips.iter().any(|ip| family(&ip)) {
            return;
        }
        let in_family: Vec<&Endpoint> = endpoints
            .iter()
            .filter(|e| e.address.is_ipv4() == ipv4)
            .collect();
        let scopes = Scopes::of(&in_family, context.terminating_endpoints);
        plan.no_local_endpoints_internal |= policy.internal_local && scopes.no_local();
        plan.no_local_endpoints_external |= policy.external_local && scopes.no_local();
        let (internal, external) = (scopes.internal(policy), scopes.external(policy));
        // kube-proxy's IPVS mode leaves these virtual servers without real servers (outside
        // clients get ICMP port unreachable); kipvs keeps the cluster-wide ones for clients in
        // the cluster and has nftables reject the others (`external-no-local`).
        let outside_rejected = policy.external_local && scopes.no_local();
        for &ip in addresses.cluster_ips.iter().filter(family) {
            self.add(plan, ip, self.number, internal);
            plan.bind_addresses.insert(ip);
            plan.set_elements
                .insert(SetElement::ClusterIp(self.key(ip, self.number)));
        }
        let outside = addresses
            .external_ips
            .iter()
            .chain(&addresses.load_balancer_ips);
        for &ip in outside.filter(family) {
            self.plan_outside_ip(plan, ip, addresses, external, policy, context);
            if outside_rejected {
                plan.set_elements
                    .insert(SetElement::ExternalNoLocal(self.key(ip, self.number)));
            }
        }
        self.firewall(plan, addresses, context, ipv4);
        if let Some(node_port) = self.node_port {
            for &ip in context.node_port_ips.iter().filter(family) {
                self.add(plan, ip, node_port, external);
                plan.set_elements
                    .insert(policy.external_element(self.key(ip, node_port)));
                if outside_rejected {
                    plan.set_elements
                        .insert(SetElement::ExternalNoLocal(self.key(ip, node_port)));
                }
            }
        }
        // Hairpin: a local endpoint that reaches itself through the Service.
        for e in in_family
            .iter()
            .filter(|e| e.local && (e.ready || e.serving))
        {
            plan.set_elements
                .insert(SetElement::Hairpin(e.address.ip()));
        }
    }

    /// The virtual server of an externalIP or load-balancer IP `ip`, with the `external` real
    /// servers: its address is bound unless it is on another interface of the node, and its
    /// element names the external policy.
    fn plan_outside_ip(
        &self,
        plan: &mut ServicePlan,
        ip: IpAddr,
        addresses: &Addresses,
        external: &Selection,
        policy: Policy,
        context: &PlanContext,
    ) {
        self.add(plan, ip, self.number, external);
        if !context.other_interface_addresses.contains(&ip) {
            plan.bind_addresses.insert(ip);
        }
        let key = self.key(ip, self.number);
        plan.set_elements.insert(policy.external_element(key));
        if !addresses.load_balancer_ips.contains(&ip) && !addresses.cluster_ips.contains(&ip) {
            plan.external_ip_virtual_servers.insert(key);
        }
    }

    /// `loadBalancerSourceRanges` restrict the load-balancer IPs only (kube-proxy's
    /// KUBE-LOAD-BALANCER-FW); when a node IP is inside a range, the node's own traffic, which
    /// leaves from the load-balancer IP itself, is allowed too (kubernetes#119656), unless a
    /// range holds that IP already (one interval inside another is refused).
    fn firewall(
        &self,
        plan: &mut ServicePlan,
        addresses: &Addresses,
        context: &PlanContext,
        ipv4: bool,
    ) {
        let Some(allowed) = addresses.source_ranges.family(IpFamily::of(ipv4)) else {
            return;
        };
        let node_inside = context
            .node_port_ips
            .iter()
            .any(|ip| allowed.iter().any(|net| net.contains(ip)));
        let family = |ip: &&IpAddr| ip.is_ipv4() == ipv4;
        for &ip in addresses.load_balancer_ips.iter().filter(family) {
            let k = self.key(ip, self.number);
            plan.set_elements.insert(SetElement::Firewall(k));
            for &net in allowed {
                plan.set_elements.insert(SetElement::FirewallAllow(k, net));
            }
            if node_inside && !allowed.iter().any(|net| net.contains(&ip)) {
                plan.set_elements
                    .insert(SetElement::FirewallAllow(k, IpNet::from(ip)));
            }
        }
    }
}

/// The health-check node port of a LoadBalancer Service with `externalTrafficPolicy: Local`
/// (`spec.healthCheckNodePort`; an out-of-range one is reported), counting its local ready
/// endpoints.
fn health_check(
    service: &ServiceInfo,
    cluster_ips: &[IpAddr],
    endpoints: &EndpointsByPort,
    plan: &mut ServicePlan,
) {
    let value = match service.health_check_node_port {
        None | Some(0) => return,
        Some(value) => value,
    };
    let Some(port) = port_number(value) else {
        plan.report(format!(
            "spec.healthCheckNodePort {value} is out of range; no health check"
        ));
        return;
    };
    // Distinct local ready endpoint IPs over all ports, as kube-proxy's `LocalReadyEndpoints`
    // (terminating ones do not count: 503 when only terminating endpoints are left, per the
    // design brief). Each of kube-proxy's single-stack proxiers counts its own family; kipvs
    // has one health check per port and reports the larger count of the Service's families
    // (equal for dual-stack pods).
    let local_ready = |ipv4: bool| {
        endpoints
            .values()
            .flatten()
            .filter(|e| e.local && e.ready && e.address.is_ipv4() == ipv4)
            .map(|e| e.address.ip())
            .collect::<BTreeSet<IpAddr>>()
            .len()
    };
    let count = [true, false]
        .into_iter()
        .filter(|&ipv4| cluster_ips.iter().any(|ip| ip.is_ipv4() == ipv4))
        .map(local_ready)
        .max()
        .unwrap_or(0);
    plan.set_elements
        .insert(SetElement::HealthCheckNodePort(port));
    plan.health_check_node_port = Some((
        port,
        HealthCheckNodePort {
            namespace: plan.namespace.clone(),
            name: plan.name.clone(),
            local_ready_endpoints: count,
        },
    ));
}

/// Text from the API shown in a problem: quoted, at most [`ShortText::MAX_CHARS`] characters
/// and the length of the rest (an annotation can hold 256 KiB, and each change of it is
/// logged).
struct ShortText<'a>(&'a str);

impl ShortText<'_> {
    const MAX_CHARS: usize = 64;
}

impl std::fmt::Display for ShortText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(Self::MAX_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => {
                let (shown, rest) = self.0.split_at(end);
                write!(f, "{shown:?}... ({} more bytes)", rest.len())
            }
        }
    }
}

/// `field[i]` or `field`.
fn indexed_field(field: &str, index: Option<usize>) -> String {
    match index {
        Some(i) => format!("{field}[{i}]"),
        None => field.to_owned(),
    }
}

/// Parses IP address strings, reporting each invalid one (named by `field(index)`) and
/// skipping it.
fn parse_ips(
    texts: &[Parsed<IpAddr>],
    field: impl Fn(usize) -> String,
    mut report: impl FnMut(String),
) -> Vec<IpAddr> {
    texts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| match text {
            Parsed::Ok(ip) => Some(*ip),
            Parsed::Invalid(text) => {
                report(format!(
                    "{} {text:?} is not a valid IP address; ignored",
                    field(i)
                ));
                None
            }
        })
        .collect()
}

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    fn of(ipv4: bool) -> Self {
        if ipv4 { IpFamily::V4 } else { IpFamily::V6 }
    }

    fn has(self, ip: &IpAddr) -> bool {
        ip.is_ipv4() == (self == IpFamily::V4)
    }
}

/// `spec.loadBalancerSourceRanges` split by IP family, as kube-proxy's `MapCIDRsByIPFamily`
/// splits them: each family's load-balancer IPs are filtered by that family's ranges only.
#[derive(Clone, Debug, Default)]
struct SourceRanges {
    /// Whether the Service lists any valid range.
    any: bool,
    /// Whether it lists a valid IPv4 range (`[ipv4, ipv6]`), zero-length ones included.
    listed: [bool; 2],
    /// The IPv4 ranges, normalised; `None`: not filtered.
    ipv4: Option<Vec<IpNet>>,
    /// The IPv6 ranges, normalised; `None`: not filtered.
    ipv6: Option<Vec<IpNet>>,
}

impl SourceRanges {
    /// The allowed ranges of `family`, or `None` when its load-balancer IPs are not filtered.
    fn family(&self, family: IpFamily) -> Option<&[IpNet]> {
        match family {
            IpFamily::V4 => self.ipv4.as_deref(),
            IpFamily::V6 => self.ipv6.as_deref(),
        }
    }

    /// Whether the Service lists ranges, but none of `family`: its load-balancer IPs are not
    /// filtered although the Service asks for filtering (reported).
    fn none_of(&self, family: IpFamily) -> bool {
        self.any && !self.listed[usize::from(family == IpFamily::V6)]
    }
}

/// `spec.loadBalancerSourceRanges`, parsed as kube-proxy's `serviceport.go` does (entries
/// trimmed, host bits cleared; an invalid entry is reported and skipped) and split by family
/// (`MapCIDRsByIPFamily`). A family is not filtered when it has no range, or a zero-length one
/// (`0.0.0.0/0`, `::/0`: "allow any", for its own family only). A filtered family's ranges are
/// normalised ([`IpNet::aggregate`]): duplicates, nested and overlapping ranges merged, because
/// the kernel refuses an element of the interval set `firewall-allow` that overlaps another of
/// the same load-balancer IP and port (`EEXIST`), and with it the whole transaction.
fn source_ranges(texts: &[Parsed<IpNet>], mut report: impl FnMut(String)) -> SourceRanges {
    let mut ranges = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        match text {
            Parsed::Ok(net) => ranges.push(net.trunc()),
            Parsed::Invalid(text) => report(format!(
                "spec.loadBalancerSourceRanges[{i}] {text:?} is not a CIDR; ignored"
            )),
        }
    }
    let family = |family: IpFamily| {
        let of_family: Vec<IpNet> = ranges
            .iter()
            .copied()
            .filter(|net| family.has(&net.addr()))
            .collect();
        let allows_any = of_family.iter().any(|net| net.prefix_len() == 0);
        (!of_family.is_empty() && !allows_any).then(|| IpNet::aggregate(&of_family))
    };
    let listed = |family: IpFamily| ranges.iter().any(|net| family.has(&net.addr()));
    SourceRanges {
        any: !ranges.is_empty(),
        listed: [listed(IpFamily::V4), listed(IpFamily::V6)],
        ipv4: family(IpFamily::V4),
        ipv6: family(IpFamily::V6),
    }
}

/// The VIP-mode load-balancer ingress IPs of a LoadBalancer Service (KEP-1860).
///
/// Hostname-only entries are ignored. With `LoadBalancerIPMode` on, `ipMode: Proxy` entries
/// are left out (no virtual server, no binding) and `ipMode` unset or `VIP` is a VIP; an
/// unknown mode is reported and left out, as kube-proxy's `IsVIPMode` does. With the gate off
/// every ingress IP is a VIP.
fn load_balancer_vips(
    ingress: &[Ingress],
    context: &PlanContext,
    mut report: impl FnMut(String),
) -> Vec<IpAddr> {
    let mut vips = Vec::new();
    for (i, entry) in ingress.iter().enumerate() {
        let ip = match &entry.ip {
            None => continue,
            Some(Parsed::Ok(ip)) => *ip,
            Some(Parsed::Invalid(text)) => {
                report(format!(
                    "status.loadBalancer.ingress[{i}].ip {text:?} is not a valid IP address; ignored"
                ));
                continue;
            }
        };
        if context.load_balancer_ip_mode {
            match &entry.ip_mode {
                None | Some(IpMode::Vip) => {}
                Some(IpMode::Proxy) => continue,
                Some(IpMode::Unknown(other)) => {
                    report(format!(
                        "status.loadBalancer.ingress[{i}].ipMode {other:?} is unknown (expected VIP \
                         or Proxy); {ip} is not treated as a VIP"
                    ));
                    continue;
                }
            }
        }
        vips.push(ip);
    }
    vips
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::Interner;
    use crate::source::convert;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kipvs_crds::ProxierConfiguration;
    use std::net::IpAddr;

    /// [`plan_service`] of API objects, converted as the store does.
    fn plan_api(
        service: &Service,
        slices: &[&EndpointSlice],
        context: &PlanContext,
    ) -> Option<ServicePlan> {
        let mut strings = Interner::default();
        let slices: Vec<SliceInfo> = slices
            .iter()
            .map(|slice| convert::slice(slice, &mut strings))
            .collect();
        let slices: Vec<&SliceInfo> = slices.iter().collect();
        plan_service(&convert::service(service, &mut strings), &slices, context)
    }

    fn context() -> PlanContext {
        let node_ips = ["192.168.0.10".parse().unwrap()];
        PlanContext::new(
            "test-node",
            None,
            &node_ips,
            &ProxierConfiguration::default(),
        )
        .0
    }

    fn service(yaml: &str) -> Service {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn skipped_services_have_no_plan() {
        for yaml in [
            "metadata: {name: a}\nspec: {clusterIP: None, ports: [{port: 80}]}",
            "metadata: {name: a}\nspec: {clusterIPs: [None], ports: [{port: 80}]}",
            "metadata: {name: a}\nspec: {type: ExternalName, externalName: x.example}",
            "metadata: {name: a, labels: {service.kubernetes.io/service-proxy-name: x}}\n\
             spec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}",
        ] {
            assert_eq!(plan_api(&service(yaml), &[], &context()), None, "{yaml}");
        }
    }

    #[test]
    fn service_without_cluster_ip_is_reported() {
        let plan = plan_api(
            &service("metadata: {name: a}\nspec: {ports: [{port: 80}]}"),
            &[],
            &context(),
        )
        .unwrap();
        assert!(plan.virtual_servers.is_empty());
        assert_eq!(
            plan.problems[0].to_string(),
            "Service default/a: spec.clusterIP is not set; the Service is skipped (as kube-proxy does)"
        );
    }

    #[test]
    fn conflicting_ports_keep_the_first_definition() {
        let yaml = "metadata: {name: a, namespace: ns}\n\
                    spec: {clusterIP: 10.0.0.1, type: Fancy, ports: [{name: x, port: 80}, {name: y, port: 80}]}";
        let slice: EndpointSlice = serde_saphyr::from_str(
            "metadata: {name: a-1, namespace: ns}\naddressType: IPv4\n\
             endpoints: [{addresses: [10.1.0.1]}]\nports: [{name: y, port: 8080}]",
        )
        .unwrap();
        let plan = plan_api(&service(yaml), &[&slice], &context()).unwrap();
        let messages: Vec<String> = plan.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "Service ns/a: unknown spec.type \"Fancy\"; treated as ClusterIP",
                "Service ns/a: virtual server TCP 10.0.0.1:80 is defined twice (for ns/a:x and \
                 spec.ports[1]); the first definition is used",
            ]
        );
        let only = plan.virtual_servers.values().next().unwrap();
        assert_eq!(&*only.service, "ns/a:x");
        assert!(only.real_servers.is_empty());
        assert_eq!(plan.virtual_servers.len(), 1);
        assert_eq!(plan.bind_addresses.len(), 1);
    }

    proptest::proptest! {
        /// Whatever the source ranges (nested, overlapping, duplicated, of both families, with
        /// zero-length ones) and wherever the node and ingress IPs lie: the `firewall-allow`
        /// elements of one virtual server never overlap (the kernel refuses that), every range
        /// of a filtered family is covered, and a family is filtered exactly when it has ranges
        /// and none of zero length.
        #[test]
        fn firewall_elements_never_overlap_and_lose_no_range(
            ranges in proptest::collection::vec((proptest::bool::ANY, 0u8..=32, 0u8..=3), 0..6),
            ingress_host in 0u8..=3,
            node_host in 0u8..=3,
        ) {
            let net = |(v4, len, host): (bool, u8, u8)| -> IpNet {
                if v4 {
                    format!("10.{host}.5.100/{len}").parse().unwrap()
                } else {
                    format!("fd00:{host}::5:100/{}", len * 4).parse().unwrap()
                }
            };
            let ranges: Vec<IpNet> = ranges.into_iter().map(net).collect();
            let list: Vec<String> = ranges.iter().map(|r| format!("\"{r}\"")).collect();
            let yaml = format!(
                "metadata: {{name: lb, namespace: ns}}\n\
                 spec: {{type: LoadBalancer, clusterIPs: [10.96.0.1, \"fd00:96::1\"], \
                 loadBalancerSourceRanges: [{}], ports: [{{port: 80, nodePort: 30080}}]}}\n\
                 status: {{loadBalancer: {{ingress: [{{ip: 10.{ingress_host}.5.100}}, \
                 {{ip: \"fd00:{ingress_host}::5:100\"}}]}}}}",
                list.join(", ")
            );
            let node_ips: [IpAddr; 2] = [
                format!("10.{node_host}.0.5").parse().unwrap(),
                format!("fd00:{node_host}::5").parse().unwrap(),
            ];
            let context =
                PlanContext::new("test-node", None, &node_ips, &ProxierConfiguration::default()).0;
            let plan = plan_api(&service(&yaml), &[], &context).unwrap();
            for ipv4 in [true, false] {
                let of_family: Vec<IpNet> =
                    ranges.iter().copied().filter(|r| r.addr().is_ipv4() == ipv4).collect();
                let filtered =
                    !of_family.is_empty() && of_family.iter().all(|r| r.prefix_len() > 0);
                let firewalls: Vec<VirtualServerKey> = plan
                    .set_elements
                    .iter()
                    .filter_map(|e| match e {
                        SetElement::Firewall(k) if k.address.is_ipv4() == ipv4 => Some(*k),
                        _ => None,
                    })
                    .collect();
                proptest::prop_assert_eq!(firewalls.len(), usize::from(filtered));
                for k in firewalls {
                    let allowed: Vec<IpNet> = plan
                        .set_elements
                        .iter()
                        .filter_map(|e| match e {
                            SetElement::FirewallAllow(key, net) if *key == k => Some(*net),
                            _ => None,
                        })
                        .collect();
                    for (i, a) in allowed.iter().enumerate() {
                        for b in &allowed[i + 1..] {
                            proptest::prop_assert!(
                                !a.contains(b) && !b.contains(a),
                                "{} and {} overlap", a, b
                            );
                        }
                    }
                    for r in &of_family {
                        proptest::prop_assert!(
                            allowed.iter().any(|a| a.contains(&r.trunc())),
                            "{} is not covered by {:?}", r, allowed
                        );
                    }
                }
            }
        }
    }
}
