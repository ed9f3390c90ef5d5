//! What every Service plan shares, derived once per full plan from the node and the
//! configuration ([`PlanContext`]), and the conversions of API values planning shares.

use super::outcome::Problem;
use crate::model::objects::NodeInfo;
use crate::model::{LocalTraffic, NftRules};
use crate::model::{SchedFlags, VirtualServerSpec};
use ipnet::IpNet;
use kipvs_crds::{Gate, LocalMode, NodePortAddress, ProxierConfiguration};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// `IP_VS_SVC_F_SCHED_MH_PORT` (= `IP_VS_SVC_F_SCHED2`, 0x10): the `mh` scheduler hashes the
/// source port too. kube-proxy sets it (`FlagSourceHash`) whenever the scheduler is `mh`.
pub const SCHED_FLAG_MH_PORT: SchedFlags = 0x10;

/// `IP_VS_SVC_F_SCHED_MH_FALLBACK` / `IP_VS_SVC_F_SCHED_SH_FALLBACK` (= `IP_VS_SVC_F_SCHED1`,
/// 0x08, `include/uapi/linux/ip_vs.h`): when the real server `mh` or `sh` hashes a connection
/// to has weight 0 (or is overloaded), pick another one instead of answering "no destination
/// available". kipvs keeps serving+terminating endpoints at weight 0 for their grace period,
/// so without it a client hashed to one of them is refused (kubernetes#139497, PR#138688;
/// kube-router's `flag-1`). kube-proxy 1.20 sets no scheduler flag; kipvs sets this one for
/// both schedulers (and `sh-port` never, as kube-proxy never does).
pub const SCHED_FLAG_FALLBACK: SchedFlags = 0x08;

/// The node's addresses, the candidates for NodePort virtual servers before
/// `nodePortAddresses` selects among them ([`PlanContext::new`]): `explicit` (`--node-ip`)
/// alone when given; else the Node's InternalIPs and every address on the node's interfaces but
/// `kube-ipvs0` (`local`), sorted and without duplicates.
///
/// This is kube-proxy IPVS's default: with `nodePortAddresses` unset (a zero CIDR) it serves
/// NodePorts on every LOCAL route of the local routing table but `kube-ipvs0`'s
/// (`pkg/proxy/ipvs/proxier.go` `realIPGetter.NodeIPs`, `netlink_linux.go`
/// `GetLocalAddresses`: second NICs, keepalived or kube-vip VIPs, `docker0`, `cni0`), and with
/// CIDRs the interface addresses inside them (`pkg/proxy/util/utils.go` `GetNodeAddresses`).
/// Of those, [`PlanContext::new`] then skips what kube-proxy skips (IPv6 link-local) and
/// loopback, which kube-proxy 1.20 serves too (`127.0.0.1`: a deviation, see
/// `tests/kube-proxy/deviations.yaml`). The InternalIPs are kept for a node whose addresses
/// are not known (the `plan` command without `--local-address`).
pub fn node_addresses(
    explicit: &[IpAddr],
    node: Option<&NodeInfo>,
    local: &BTreeSet<IpAddr>,
) -> Vec<IpAddr> {
    if !explicit.is_empty() {
        return explicit.to_vec();
    }
    let internal = node.map_or(&[][..], |node| &node.internal_ips);
    let all: BTreeSet<IpAddr> = internal.iter().chain(local).copied().collect();
    all.into_iter().collect()
}

/// What every Service plan shares: derived once per [`plan`](super::plan) from the node and configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanContext {
    /// This node's name (endpoints with this `nodeName` are local).
    pub(super) node_name: String,
    /// This node's `topology.kubernetes.io/zone` label, if any.
    zone: Option<String>,
    /// The addresses NodePorts are served on (`nodePortAddresses` applied to the node's
    /// addresses, [`node_addresses`]), also the node IPs whose own traffic a
    /// `loadBalancerSourceRanges` range may admit.
    pub(super) node_port_ips: Vec<IpAddr>,
    /// Addresses on the node's other interfaces: an externalIP or load-balancer IP among them
    /// is not bound on `kube-ipvs0`.
    pub(super) other_interface_addresses: BTreeSet<IpAddr>,
    /// The virtual-server spec of `ipvs.scheduler` (a Service's annotation may replace it).
    pub(super) vs_spec: VirtualServerSpec,
    /// The `ProxyTerminatingEndpoints` gate.
    pub(super) terminating_endpoints: bool,
    /// The `LoadBalancerIPMode` gate.
    pub(super) load_balancer_ip_mode: bool,
    /// The constant nftables rules' parameters.
    nft_rules: NftRules,
    /// Schedulers this node's kernel lacks (a Service naming one gets `vs_spec`'s).
    unavailable_schedulers: BTreeSet<String>,
}

impl PlanContext {
    /// Derives the shared settings, reporting configuration problems.
    ///
    /// NodePort addresses are the `node_ips` (the node's addresses, [`node_addresses`]) that
    /// `nodePortAddresses` selects, per IP family as kube-proxy's `NewNodePortAddresses` and
    /// IPVS `syncProxyRules` do (`pkg/proxy/util/nodeport_addresses.go`,
    /// `TestGetNodeAddresses`):
    /// - `"primary"` stands for the Node's primary IPs ([`NodeInfo::primary_ips`]) as `/32` and
    ///   `/128` CIDRs (`cmd/kube-proxy/app/server.go`); with the Node unknown it is a problem
    ///   and no NodePort virtual server is planned;
    /// - a family with no CIDR of its own, or with a zero-length one (`0.0.0.0/0`, `::/0`),
    ///   matches every node IP of that family except loopback and IPv6 link-local ones
    ///   (kube-proxy's `isValidForSet`; `TestGetNodeIPs`, `TestIpIsValidForSet`);
    /// - otherwise a node IP is used if one of its family's CIDRs contains it and it is not
    ///   loopback.
    ///
    /// The node's zone is [`NodeInfo::zone`].
    /// Addresses on other interfaces start empty (see
    /// [`with_other_interface_addresses`](Self::with_other_interface_addresses)).
    pub fn new(
        node_name: &str,
        node: Option<&NodeInfo>,
        node_ips: &[IpAddr],
        config: &ProxierConfiguration,
    ) -> (Self, Vec<Problem>) {
        let mut problems = Vec::new();
        let node_port_ips = node_port_ips(node_name, node, node_ips, config, &mut problems);
        let local_traffic = local_traffic(node_name, node, config, &mut problems);
        let zone = node.and_then(|node| node.zone.clone());
        let context = PlanContext {
            node_name: node_name.to_owned(),
            zone,
            node_port_ips,
            other_interface_addresses: BTreeSet::new(),
            vs_spec: scheduler_spec(config.ipvs.effective_scheduler()),
            terminating_endpoints: config.gate_enabled(Gate::ProxyTerminatingEndpoints),
            load_balancer_ip_mode: config.gate_enabled(Gate::LoadBalancerIPMode),
            nft_rules: NftRules::detecting(local_traffic, config.nftables.masquerade_all),
            unavailable_schedulers: BTreeSet::new(),
        };
        (context, problems)
    }

    /// Sets the addresses found on the node's interfaces other than `kube-ipvs0`. An externalIP
    /// or VIP-mode load-balancer IP among them still gets its virtual servers but is not bound
    /// on `kube-ipvs0` (kube-proxy's IPVS `syncProxyRules`: `syncService(..., bindAddr =
    /// !nodeAddressSet.Has(ip))`), so that an address the node already owns is not taken over
    /// and later removed by kipvs. Cluster IPs are always bound.
    pub fn with_other_interface_addresses(
        mut self,
        addresses: impl IntoIterator<Item = IpAddr>,
    ) -> Self {
        self.other_interface_addresses = addresses.into_iter().collect();
        self
    }

    /// The same context on a node whose kernel lacks these IPVS schedulers (probed): a
    /// Service annotated with one of them is a [`Problem`] and gets `ipvs.scheduler`.
    pub fn with_unavailable_schedulers(mut self, schedulers: &BTreeSet<String>) -> Self {
        self.unavailable_schedulers = schedulers.clone();
        self
    }

    /// Whether this node lacks the IPVS scheduler `scheduler` (see
    /// [`with_unavailable_schedulers`](Self::with_unavailable_schedulers)).
    pub fn scheduler_unavailable(&self, scheduler: &str) -> bool {
        self.unavailable_schedulers.contains(scheduler)
    }

    /// The addresses NodePort virtual servers are created on, sorted.
    pub fn node_port_ips(&self) -> &[IpAddr] {
        &self.node_port_ips
    }

    /// The parameters of the nftables rules (`detectLocalMode`, `nftables.masqueradeAll`).
    pub fn nft_rules(&self) -> &NftRules {
        &self.nft_rules
    }

    /// The node's zone (`topology.kubernetes.io/zone`), if it has one.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }
}

/// How this node's pod traffic is told apart (`detectLocalMode`, kube-proxy's
/// `getLocalDetector` and `getDualStackLocalDetectorTuple`): `ClusterCIDR` by `clusterCIDR`,
/// `NodeCIDR` by the Node's pod CIDRs, the interface modes by `detectLocal`. What cannot be
/// resolved (a bad `clusterCIDR` or mode, `NodeCIDR` without the Node or its pod CIDRs) is a
/// problem and detects nothing, so that only the node's own traffic from a service IP is
/// masqueraded (kube-proxy's no-op detector).
fn local_traffic(
    node_name: &str,
    node: Option<&NodeInfo>,
    config: &ProxierConfiguration,
    problems: &mut Vec<Problem>,
) -> LocalTraffic {
    let undetected = "no ClusterIP traffic is masqueraded for coming from outside the cluster";
    let mode = match config.parsed_local_mode() {
        Ok(mode) => mode,
        Err(e) => {
            problems.push(Problem::config(format!("{e}; {undetected}")));
            return LocalTraffic::default();
        }
    };
    match mode {
        LocalMode::ClusterCidr => match config.parsed_cluster_cidrs() {
            Ok(cidrs) => LocalTraffic::ClusterCidrs(cidrs),
            Err(e) => {
                problems.push(Problem::config(format!("{e}; {undetected}")));
                LocalTraffic::default()
            }
        },
        LocalMode::NodeCidr => match node.map(|node| &node.pod_cidrs) {
            Some(cidrs) if !cidrs.is_empty() => LocalTraffic::NodeCidrs(cidrs.clone()),
            _ => {
                problems.push(Problem::config(format!(
                    "detectLocalMode NodeCIDR: the Node {node_name:?} is not known or has no \
                     spec.podCIDRs; {undetected}"
                )));
                LocalTraffic::NodeCidrs(Vec::new())
            }
        },
        LocalMode::BridgeInterface(name) => LocalTraffic::BridgeInterface(name),
        LocalMode::InterfaceNamePrefix(prefix) => LocalTraffic::InterfaceNamePrefix(prefix),
    }
}

/// The `node_ips` NodePorts are served on, as [`PlanContext::new`] describes; configuration
/// problems go to `problems`.
fn node_port_ips(
    node_name: &str,
    node: Option<&NodeInfo>,
    node_ips: &[IpAddr],
    config: &ProxierConfiguration,
    problems: &mut Vec<Problem>,
) -> Vec<IpAddr> {
    let selectors = config.parsed_node_port_addresses().unwrap_or_else(|e| {
        problems.push(Problem::config(format!("{e}; using every node IP")));
        Vec::new()
    });
    let Some(cidrs) = node_port_cidrs(&selectors, node_name, node, problems) else {
        return Vec::new();
    };
    let selected: BTreeSet<IpAddr> = node_ips
        .iter()
        .copied()
        .filter(|ip| node_port_address_selected(ip, &cidrs))
        .collect();
    selected.into_iter().collect()
}

/// The CIDRs `nodePortAddresses` (`selectors`) stands for: `"primary"` is the Node's primary
/// IPs, `None` when the Node is not known (a problem: no NodePort virtual servers).
fn node_port_cidrs(
    selectors: &[NodePortAddress],
    node_name: &str,
    node: Option<&NodeInfo>,
    problems: &mut Vec<Problem>,
) -> Option<Vec<IpNet>> {
    match selectors {
        [NodePortAddress::Primary] => match node {
            Some(node) => Some(
                node.primary_ips
                    .iter()
                    .copied()
                    .filter(|ip| !ip.is_loopback())
                    .map(IpNet::from)
                    .collect(),
            ),
            None => {
                problems.push(Problem::config(format!(
                    "nodePortAddresses: \"primary\" needs the Node object {node_name:?}, which is \
                     not known; no NodePort virtual servers"
                )));
                None
            }
        },
        selectors => Some(
            selectors
                .iter()
                .filter_map(|selector| match selector {
                    NodePortAddress::Cidr(net) => Some(*net),
                    NodePortAddress::Primary => None,
                })
                .collect(),
        ),
    }
}

/// Whether `ip` takes NodePort virtual servers under the `nodePortAddresses` CIDRs (see
/// [`PlanContext::new`]).
fn node_port_address_selected(ip: &IpAddr, cidrs: &[IpNet]) -> bool {
    let own_family: Vec<&IpNet> = cidrs
        .iter()
        .filter(|net| net.addr().is_ipv4() == ip.is_ipv4())
        .collect();
    let match_all = own_family.is_empty() || own_family.iter().any(|net| net.prefix_len() == 0);
    if ip.is_loopback() {
        false
    } else if match_all {
        !is_ipv6_link_local(ip)
    } else {
        own_family.iter().any(|net| net.contains(ip))
    }
}

/// Whether a change of the node's address `ip` (one on an interface other than `kube-ipvs0`)
/// can change a plan under `config`: every address but an IPv6 link-local one, which counts
/// only when a `nodePortAddresses` CIDR selects it ([`PlanContext::new`]: kube-proxy skips
/// link-local addresses otherwise, and the API server refuses a link-local externalIP). The
/// `fe80::` addresses of the veths a CNI plugin makes and deletes with each pod therefore
/// re-plan nothing.
pub fn address_plans(ip: &IpAddr, config: &ProxierConfiguration) -> bool {
    if !is_ipv6_link_local(ip) {
        return true;
    }
    let cidrs: Vec<IpNet> = config
        .parsed_node_port_addresses()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|selector| match selector {
            NodePortAddress::Cidr(net) => Some(net),
            NodePortAddress::Primary => None,
        })
        .collect();
    node_port_address_selected(ip, &cidrs)
}

/// `fe80::/10`.
fn is_ipv6_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// The virtual-server settings of a scheduler: its name, no persistence, and its flags: for
/// `mh` the source-port hashing flag (kube-proxy's `FlagSourceHash`) and the fallback
/// ([`SCHED_FLAG_FALLBACK`]), for `sh` the fallback.
pub(super) fn scheduler_spec(scheduler: &str) -> VirtualServerSpec {
    VirtualServerSpec {
        scheduler: scheduler.into(),
        persistence_timeout: None,
        sched_flags: match scheduler {
            "mh" => SCHED_FLAG_MH_PORT | SCHED_FLAG_FALLBACK,
            "sh" => SCHED_FLAG_FALLBACK,
            _ => 0,
        },
    }
}

/// A port number from the API's `int32`, if it is in 1..=65535.
pub(super) fn port_number(value: i32) -> Option<u16> {
    u16::try_from(value).ok().filter(|&port| port != 0)
}

#[cfg(test)]
mod local_traffic_tests {
    use super::*;

    fn rules(yaml: &str, node: Option<&NodeInfo>) -> (LocalTraffic, Vec<String>) {
        let config = ProxierConfiguration::from_yaml_str(yaml).unwrap();
        let (context, problems) = PlanContext::new("test-node", node, &[], &config);
        let messages = problems.into_iter().map(|p| p.message).collect();
        (context.nft_rules().local_traffic().clone(), messages)
    }

    /// Issue 34: `detectLocalMode` was ignored, only `clusterCIDR` decided what is local. Each
    /// mode resolves as kube-proxy's `getLocalDetector` does; NodeCIDR takes the Node's pod
    /// CIDRs (both families).
    #[test]
    fn each_detect_local_mode_resolves_for_this_node() {
        let node = NodeInfo {
            pod_cidrs: vec![
                "10.244.3.0/24".parse().unwrap(),
                "fd00:10:244:3::/64".parse().unwrap(),
            ],
            ..Default::default()
        };
        let cluster = "clusterCIDR: 10.244.0.0/16\n";
        for (yaml, expected) in [
            (
                cluster.to_owned(),
                LocalTraffic::ClusterCidrs(vec!["10.244.0.0/16".parse().unwrap()]),
            ),
            (
                format!("{cluster}detectLocalMode: NodeCIDR\n"),
                LocalTraffic::NodeCidrs(node.pod_cidrs.clone()),
            ),
            (
                format!(
                    "{cluster}detectLocalMode: BridgeInterface\ndetectLocal: {{bridgeInterface: cbr0}}\n"
                ),
                LocalTraffic::BridgeInterface("cbr0".into()),
            ),
            (
                format!(
                    "{cluster}detectLocalMode: InterfaceNamePrefix\n\
                     detectLocal: {{interfaceNamePrefix: veth}}\n"
                ),
                LocalTraffic::InterfaceNamePrefix("veth".into()),
            ),
        ] {
            let (local, problems) = rules(&yaml, Some(&node));
            assert_eq!(local, expected, "{yaml}");
            assert!(problems.is_empty(), "{yaml}: {problems:?}");
        }
    }

    /// NodeCIDR before the Node (or its pod CIDRs) is known detects nothing and says why, as
    /// kube-proxy's no-op detector with its warning.
    #[test]
    fn node_cidr_without_pod_cidrs_is_a_problem_and_detects_nothing() {
        for node in [None, Some(NodeInfo::default())] {
            let (local, problems) = rules("detectLocalMode: NodeCIDR\n", node.as_ref());
            assert_eq!(local, LocalTraffic::NodeCidrs(Vec::new()));
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0].starts_with("detectLocalMode NodeCIDR: the Node \"test-node\""),
                "{problems:?}"
            );
        }
    }
}
