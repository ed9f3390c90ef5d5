//! `plan()`: Services, EndpointSlices, the own Node and the configuration in; the IPVS table
//! kipvs wants ([`DesiredState`](crate::model::DesiredState)) out.
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
//! | `spec.externalIPs` | each IP of a service family × port | unless on another interface | external set (below) |
//! | `status.loadBalancer.ingress[].ip` (type LoadBalancer) | each VIP-mode IP of a service family × port; `ipMode: Proxy` gets none while `LoadBalancerIPMode` is on (KEP-1860) | VIP-mode ones, unless on another interface | external set |
//! | `spec.ports[].nodePort` (type NodePort/LoadBalancer) | each node IP of a service family × nodePort | never | external set |
//! | `spec.healthCheckNodePort` (LoadBalancer + `externalTrafficPolicy: Local`) | none: a health-check listener counting local **ready** endpoints (per IP family, the larger count) | — | — |
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
//! The cluster-wide set follows topology hints as kube-proxy's `topologyModeFromHints` does
//! (`pkg/proxy/topology.go`; KEP-2433 topology-aware routing, KEP-4444/KEP-3015
//! `trafficDistribution`): when every ready endpoint carries `hints.forNodes` and one names this
//! node, only the ready endpoints hinted for this node are used; else when every ready endpoint
//! carries `hints.forZones` and one names this node's zone (the Node's
//! `topology.kubernetes.io/zone` label), only those hinted for the zone; else all. kipvs reads
//! neither `spec.trafficDistribution` nor the `service.kubernetes.io/topology-mode`
//! annotation: the EndpointSlice controller turns them into hints (`PreferClose` and
//! `PreferSameZone` into zone hints, `PreferSameNode` into node and zone hints), and current
//! kube-proxy follows the hints alone. Local sets and the KEP-1669 fallback ignore topology.
//!
//! Dual-stack: a Service's IP families are those of its cluster IPs (`spec.clusterIPs`). Each
//! family gets its own virtual servers (cluster IP, externalIPs, load-balancer IPs and node
//! IPs of that family) with the endpoints of that family only: kube-proxy runs one proxier per
//! family over the slices of its `addressType`; kipvs plans both families into one table and
//! one `kube-ipvs0`.
//!
//! Other rules: `sessionAffinity: ClientIP` makes every virtual server of the Service
//! persistent for `timeoutSeconds` (default 10800); the scheduler comes from `ipvs.scheduler`
//! (`""` → `rr`) or, per Service, from the annotation `kipvs.io/scheduler` (kube-router's
//! idea; an invalid value is a [`Problem`] and the configured scheduler is used), and `mh`
//! also sets the source-port hashing flag as kube-proxy does; an externalIP or VIP-mode
//! load-balancer IP already on another interface of the node gets its virtual servers but is
//! not bound on `kube-ipvs0` (kube-proxy's `nodeAddressSet` check in `syncService`); headless
//! (`clusterIP: None`) and ExternalName Services, and Services labelled
//! `service.kubernetes.io/service-proxy-name`, are skipped; a Service port takes the
//! endpoints of the slice port with the same name and protocol; a real server is
//! `addresses[0]:port` of an endpoint of the virtual server's IP family.
//!
//! Structure: [`plan_service`] plans one Service from its own slices into a [`ServicePlan`];
//! [`merge`] combines Service plans (in namespace/name order, the first claim of a virtual
//! server or health-check port wins); [`plan`] does both for a whole snapshot. An incremental
//! sync can keep the [`ServicePlan`]s and re-plan only the Services that changed.

mod context;
mod endpoints;
mod index;
pub mod kube_proxy;
mod outcome;
mod service;

pub use context::{
    PlanContext, SCHED_FLAG_FALLBACK, SCHED_FLAG_MH_PORT, address_plans, node_addresses,
};
pub use index::{DesiredIndex, IndexBuilder, ServiceKey, Touched};
pub use outcome::{NoLocalEndpoints, Plan, Problem};
pub use service::{ServicePlan, plan_service};

use crate::model::objects::{NodeInfo, ServiceInfo, SliceInfo};
use kipvs_crds::ProxierConfiguration;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Everything [`plan`] reads.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    /// All Services (any order; duplicates by namespace/name are reported and ignored), as
    /// [`crate::source::convert::service`] gives them.
    pub services: &'a [ServiceInfo],
    /// All EndpointSlices ([`crate::source::convert::slice`]); each belongs to the Service
    /// named by its `kubernetes.io/service-name` label in its namespace.
    pub endpoint_slices: &'a [SliceInfo],
    /// This node's name: endpoints whose `nodeName` equals it are local.
    pub node_name: &'a str,
    /// What planning reads of this node's Node object, if known (its zone, and its primary
    /// IPs for `nodePortAddresses: [primary]`).
    pub node: Option<&'a NodeInfo>,
    /// This node's IP addresses, the candidates for NodePort virtual servers (filtered by
    /// `nodePortAddresses`; see [`PlanContext::new`]), as [`node_addresses`] gives them.
    pub node_ips: &'a [IpAddr],
    /// Addresses on this node's interfaces other than `kube-ipvs0` (kube-proxy's
    /// `nodeAddressSet`, `GetAllLocalAddressesExcept("kube-ipvs0")`): externalIPs and VIP-mode
    /// load-balancer IPs among them are not bound (see
    /// [`PlanContext::with_other_interface_addresses`]). Empty: bind them all.
    pub other_interface_addresses: &'a [IpAddr],
    /// The proxier configuration (scheduler, feature gates, `nodePortAddresses`).
    pub config: &'a ProxierConfiguration,
}

/// Plans every Service of a snapshot: [`plan_service`] for each (in namespace/name order, with
/// its slices) and [`merge`] of the results. Configuration problems come first.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let (context, mut problems) =
        PlanContext::new(input.node_name, input.node, input.node_ips, input.config);
    let context =
        context.with_other_interface_addresses(input.other_interface_addresses.iter().copied());

    let mut slices: BTreeMap<(&str, &str), Vec<&SliceInfo>> = BTreeMap::new();
    for slice in input.endpoint_slices {
        if let Some(service_name) = &slice.service {
            slices
                .entry((&slice.namespace, service_name))
                .or_default()
                .push(slice);
        }
    }
    for group in slices.values_mut() {
        group.sort_by(|a, b| a.name.cmp(&b.name));
    }

    let mut services: BTreeMap<(&str, &str), &ServiceInfo> = BTreeMap::new();
    for service in input.services {
        let key = (&*service.namespace, &*service.name);
        let problem = |message: &str| Problem::of("Service", key.0, key.1, message.to_owned());
        if key.1.is_empty() {
            problems.push(problem("metadata.name is not set; the Service is skipped"));
        } else if services.insert(key, service).is_some() {
            problems.push(problem("listed more than once; only the last copy is used"));
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
    plan.desired.nft_rules = context.nft_rules().clone();
    problems.append(&mut plan.problems);
    plan.problems = problems;
    plan
}

/// Combines Service plans into one [`Plan`]. A virtual server or health-check node port
/// claimed by several Services goes by [`DesiredIndex`]'s precedence (a claim through
/// `spec.externalIPs` yields to any other, then the older Service, then namespace/name order);
/// the others get a [`Problem`]. Bind addresses are united; the no-local-endpoints and fallback flags are
/// counted. (The same rules as [`DesiredIndex`], which keeps the union up to date.)
pub fn merge<'a>(service_plans: impl IntoIterator<Item = &'a ServicePlan>) -> Plan {
    let mut index = DesiredIndex::default();
    for service_plan in service_plans {
        let key = (service_plan.namespace.clone(), service_plan.name.clone());
        index.update(key, Some(service_plan.clone()));
    }
    index.to_plan()
}

#[cfg(test)]
mod tests {
    use super::context::port_number;
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    /// kube-proxy's `TestGetNodeAddresses` (`pkg/proxy/util/nodeport_addresses_test.go`) and
    /// `TestGetNodeIPs`/`TestIpIsValidForSet` (`pkg/proxy/ipvs`), as NodePort addresses: CIDRs
    /// apply per family, a family without CIDRs (or with a zero CIDR) matches all its
    /// addresses but loopback and IPv6 link-local, and loopback is never used.
    #[test]
    fn node_port_addresses_select_node_ips() {
        let node_ips = ips(&[
            "10.20.30.51",
            "100.200.201.1",
            "127.0.0.1",
            "172.17.0.1",
            "2001:db8::1",
            "::1",
            "fe80::200:ff:fe01:1",
        ]);
        let context = |yaml: &str, node: Option<&NodeInfo>| {
            let config = ProxierConfiguration::from_yaml_str(yaml).unwrap();
            PlanContext::new("test-node", node, &node_ips, &config)
        };
        for (case, yaml, expected) in [
            (
                "empty list",
                "{}",
                &["10.20.30.51", "100.200.201.1", "172.17.0.1", "2001:db8::1"][..],
            ),
            (
                "IPv4 single (IPv6 matches all)",
                "nodePortAddresses: [10.20.30.0/24]",
                &["10.20.30.51", "2001:db8::1"],
            ),
            (
                "IPv4 zero CIDR",
                "nodePortAddresses: [0.0.0.0/0, 2001:db8::/64]",
                &["10.20.30.51", "100.200.201.1", "172.17.0.1", "2001:db8::1"],
            ),
            (
                "IPv6 multiple (loopback never)",
                "nodePortAddresses: [\"2001:db8::/64\", \"::1/128\"]",
                &["10.20.30.51", "100.200.201.1", "172.17.0.1", "2001:db8::1"],
            ),
            (
                "IPv4 localhost exact (loopback never)",
                "nodePortAddresses: [127.0.0.1/32]",
                &["2001:db8::1"],
            ),
            (
                "IPv4 multiple",
                "nodePortAddresses: [10.20.30.0/24, 100.200.201.0/24]",
                &["10.20.30.51", "100.200.201.1", "2001:db8::1"],
            ),
            (
                "IPv4 multiple, no match",
                "nodePortAddresses: [10.99.0.0/24, 100.99.0.0/24]",
                &["2001:db8::1"],
            ),
            (
                "dual-stack, redundant IPv4",
                "nodePortAddresses: [0.0.0.0/0, 10.20.30.0/24, \"2001:db8::1/128\"]",
                &["10.20.30.51", "100.200.201.1", "172.17.0.1", "2001:db8::1"],
            ),
            (
                "explicit IPv6 link-local CIDR",
                "nodePortAddresses: [10.20.30.0/24, \"fe80::/10\"]",
                &["10.20.30.51", "fe80::200:ff:fe01:1"],
            ),
        ] {
            let (selected, problems) = context(yaml, None);
            assert_eq!(selected.node_port_ips(), ips(expected), "{case}");
            assert!(problems.is_empty(), "{case}");
        }

        let node = |primary: &[&str]| NodeInfo {
            primary_ips: ips(primary),
            ..Default::default()
        };
        let dual = node(&["10.20.30.51", "2001:db8::1"]);
        let (primary, problems) = context("nodePortAddresses: [primary]", Some(&dual));
        assert_eq!(
            primary.node_port_ips(),
            ips(&["10.20.30.51", "2001:db8::1"])
        );
        assert!(problems.is_empty());
        // A Node without an IPv6 address gives no IPv6 CIDR: IPv6 matches all (kube-proxy).
        let v4 = node(&["100.200.201.1"]);
        let (primary, _) = context("nodePortAddresses: [primary]", Some(&v4));
        assert_eq!(
            primary.node_port_ips(),
            ips(&["100.200.201.1", "2001:db8::1"])
        );

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

    /// The node's addresses: `--node-ip` alone when given, else the InternalIPs and every local
    /// address (kube-proxy IPVS's `realIPGetter.NodeIPs`); with `nodePortAddresses` unset
    /// NodePorts go on all of them but loopback and IPv6 link-local, with `primary` on the
    /// Node's primary IPs only, with a CIDR on the local addresses inside it (a keepalived VIP).
    #[test]
    fn node_port_addresses_are_every_local_address_by_default() {
        let node = NodeInfo {
            internal_ips: ips(&["10.20.30.51"]),
            primary_ips: ips(&["10.20.30.51"]),
            ..Default::default()
        };
        let local: std::collections::BTreeSet<IpAddr> = ips(&[
            "10.20.30.51",
            "10.20.30.100", // a keepalived VIP on eth0
            "127.0.0.1",
            "172.17.0.1",  // docker0
            "192.168.7.4", // a second NIC
            "2001:db8::1",
            "::1",
            "fe80::200:ff:fe01:1",
        ])
        .into_iter()
        .collect();
        let explicit = ips(&["10.20.30.51"]);
        assert_eq!(node_addresses(&explicit, Some(&node), &local), explicit);
        let all = node_addresses(&[], Some(&node), &local);
        assert_eq!(all, local.iter().copied().collect::<Vec<_>>());
        assert_eq!(
            node_addresses(&[], Some(&node), &Default::default()),
            ips(&["10.20.30.51"]),
            "addresses unknown: the InternalIPs"
        );
        let selected = |yaml: &str| {
            let config = ProxierConfiguration::from_yaml_str(yaml).unwrap();
            PlanContext::new("test-node", Some(&node), &all, &config)
                .0
                .node_port_ips()
                .to_vec()
        };
        assert_eq!(
            selected("{}"),
            ips(&[
                "10.20.30.51",
                "10.20.30.100",
                "172.17.0.1",
                "192.168.7.4",
                "2001:db8::1"
            ])
        );
        assert_eq!(
            selected("nodePortAddresses: [primary]"),
            ips(&["10.20.30.51", "2001:db8::1"])
        );
        assert_eq!(
            selected("nodePortAddresses: [10.20.30.100/32, \"::/0\"]"),
            ips(&["10.20.30.100", "2001:db8::1"])
        );
    }

    #[test]
    fn zone_from_the_node() {
        let config = ProxierConfiguration::default();
        let zone = |node: Option<&NodeInfo>| {
            let (context, _) = PlanContext::new("test-node", node, &[], &config);
            context.zone().map(str::to_owned)
        };
        assert_eq!(zone(None), None);
        assert_eq!(zone(Some(&NodeInfo::default())), None);
        let zoned = NodeInfo {
            zone: Some("zone-a".into()),
            ..Default::default()
        };
        assert_eq!(zone(Some(&zoned)).as_deref(), Some("zone-a"));
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
        for (scheduler, expected, flags) in [
            ("", "rr", 0),
            ("wlc", "wlc", 0),
            ("mh", "mh", 0x18),
            ("sh", "sh", 0x08),
        ] {
            let mut config = ProxierConfiguration::default();
            config.ipvs.scheduler = scheduler.into();
            let (context, _) = PlanContext::new("n", None, &node_ips, &config);
            assert_eq!(&*context.vs_spec.scheduler, expected);
            assert_eq!(context.vs_spec.sched_flags, flags);
            assert_eq!(context.vs_spec.persistence_timeout, None);
        }
    }

    #[test]
    fn problem_display() {
        let problem = Problem::of("Service", "default", "web", "broken".into());
        assert_eq!(problem.to_string(), "Service default/web: broken");
        assert_eq!(
            Problem::config("bad".into()).to_string(),
            "ProxierConfiguration: bad"
        );
    }

    #[test]
    fn port_numbers() {
        assert_eq!(port_number(1), Some(1));
        assert_eq!(port_number(65535), Some(65535));
        assert_eq!(port_number(0), None);
        assert_eq!(port_number(-1), None);
        assert_eq!(port_number(65536), None);
    }
}
