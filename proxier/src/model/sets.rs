//! The vocabulary of kipvs's nftables table as plain data: the [`SetElement`]s planned per
//! Service and the parameters of the constant rules ([`NftRules`]). How they are encoded for
//! `nft` (and read back) is the dataplane's business ([`crate::dataplane::nftables`]).

use super::keys::VirtualServerKey;
use ipnet::IpNet;
use serde::Serialize;
use std::net::IpAddr;
use std::sync::OnceLock;

/// One element of one of kipvs's named sets (see [`crate::dataplane::nftables`] for the sets and the rules that use them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum SetElement {
    /// `cluster-ips`: a ClusterIP virtual server.
    ClusterIp(VirtualServerKey),
    /// `external`: a NodePort, externalIP or load-balancer virtual server whose traffic is
    /// masqueraded (`externalTrafficPolicy: Cluster`).
    External(VirtualServerKey),
    /// `external-local`: the same with `externalTrafficPolicy: Local` (client IP preserved).
    ExternalLocal(VirtualServerKey),
    /// `external-no-local`: an [`SetElement::ExternalLocal`] virtual server while its Service
    /// has endpoints but none on this node. It keeps the cluster-wide real servers for clients
    /// in the cluster (pods, by `clusterCIDR`, and the node itself); new connections from
    /// outside are rejected as kube-proxy's IPVS virtual server without real servers answers
    /// them (ICMP port unreachable, `ip_vs_leave`).
    ExternalNoLocal(VirtualServerKey),
    /// `service-ips`: an address bound on `kube-ipvs0`.
    ServiceIp(IpAddr),
    /// `hairpin`: a local endpoint IP (the element is `ip . ip`).
    Hairpin(IpAddr),
    /// `firewall`: a load-balancer virtual server restricted by `loadBalancerSourceRanges`.
    Firewall(VirtualServerKey),
    /// `firewall-allow`: a source range allowed to reach a [`SetElement::Firewall`] virtual
    /// server (host bits cleared).
    FirewallAllow(VirtualServerKey, IpNet),
    /// `health-check-ports`: a healthCheckNodePort (TCP).
    HealthCheckNodePort(u16),
}

impl SetElement {
    /// The virtual server the element is derived from, if any: such an element belongs to
    /// whichever Service owns that virtual server, never to one that lost it in a conflict.
    pub fn virtual_server(&self) -> Option<VirtualServerKey> {
        match self {
            SetElement::ClusterIp(k)
            | SetElement::External(k)
            | SetElement::ExternalLocal(k)
            | SetElement::ExternalNoLocal(k)
            | SetElement::Firewall(k)
            | SetElement::FirewallAllow(k, _) => Some(*k),
            SetElement::ServiceIp(_)
            | SetElement::Hairpin(_)
            | SetElement::HealthCheckNodePort(_) => None,
        }
    }

    /// Whether the element belongs to an IPv6 set (a health-check port is family-less: IPv4).
    pub fn is_ipv6(&self) -> bool {
        match self {
            SetElement::ClusterIp(k)
            | SetElement::External(k)
            | SetElement::ExternalLocal(k)
            | SetElement::ExternalNoLocal(k)
            | SetElement::Firewall(k)
            | SetElement::FirewallAllow(k, _) => k.address.is_ipv6(),
            SetElement::ServiceIp(ip) | SetElement::Hairpin(ip) => ip.is_ipv6(),
            SetElement::HealthCheckNodePort(_) => false,
        }
    }
}

/// How traffic from this node's pods is told apart (kube-proxy's `LocalTrafficDetector` for
/// `detectLocalMode`, KEP-2450), resolved for this node by the plan. ClusterIP traffic that is
/// not local is masqueraded; a family without a CIDR detects nothing (kube-proxy's no-op
/// detector), so that only the node's own traffic from a service IP is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum LocalTraffic {
    /// `ClusterCIDR`: a source inside `clusterCIDR`.
    ClusterCidrs(Vec<IpNet>),
    /// `NodeCIDR`: a source inside the Node's `spec.podCIDRs`.
    NodeCidrs(Vec<IpNet>),
    /// `BridgeInterface`: arriving on this interface.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`: arriving on an interface whose name starts with this.
    InterfaceNamePrefix(String),
}

impl Default for LocalTraffic {
    /// `ClusterCIDR` without a cluster CIDR: nothing is detected.
    fn default() -> Self {
        LocalTraffic::ClusterCidrs(Vec::new())
    }
}

/// The parameters of the constant rules (from the configuration): how local traffic is told
/// apart ([`LocalTraffic`]: ClusterIP traffic from elsewhere is masqueraded) and
/// `nftables.masqueradeAll` (all ClusterIP traffic is). Equal when the parameters are equal.
#[derive(Clone, Debug, Serialize)]
pub struct NftRules {
    local_traffic: LocalTraffic,
    masquerade_all: bool,
    /// The rules' comments as the dataplane encodes them, computed once (a sync compares them
    /// with the kernel's).
    #[serde(skip)]
    comments: OnceLock<Vec<String>>,
}

impl NftRules {
    /// The rules for `clusterCIDR` (`detectLocalMode: ClusterCIDR`) and
    /// `nftables.masqueradeAll`.
    pub fn new(cluster_cidrs: Vec<IpNet>, masquerade_all: bool) -> Self {
        Self::detecting(LocalTraffic::ClusterCidrs(cluster_cidrs), masquerade_all)
    }

    /// The rules for a local-traffic detector and `nftables.masqueradeAll`.
    pub fn detecting(local_traffic: LocalTraffic, masquerade_all: bool) -> Self {
        NftRules {
            local_traffic,
            masquerade_all,
            comments: OnceLock::new(),
        }
    }

    /// How local traffic is told apart.
    pub fn local_traffic(&self) -> &LocalTraffic {
        &self.local_traffic
    }

    /// `nftables.masqueradeAll`.
    pub fn masquerade_all(&self) -> bool {
        self.masquerade_all
    }

    /// The rules' comments, computed by `encode` the first time they are asked for
    /// ([`crate::dataplane::nftables::rules::rule_comments`] is the one encoder).
    pub fn comments_with(&self, encode: impl FnOnce(&NftRules) -> Vec<String>) -> &[String] {
        self.comments.get_or_init(|| encode(self))
    }
}

impl Default for NftRules {
    fn default() -> Self {
        NftRules::new(Vec::new(), false)
    }
}

impl PartialEq for NftRules {
    fn eq(&self, other: &Self) -> bool {
        self.local_traffic == other.local_traffic && self.masquerade_all == other.masquerade_all
    }
}

impl Eq for NftRules {}
