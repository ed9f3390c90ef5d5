//! What planning reads of a Service and an EndpointSlice, as compact domain values: no
//! Kubernetes type, every field parsed once when the object enters the store
//! ([`crate::source::convert`]), strings that repeat across objects (namespaces, node names,
//! port names, zones) shared through an [`Interner`].
//!
//! A field that does not parse keeps its text ([`Parsed::Invalid`]), so that planning reports
//! it as a [`Problem`](crate::plan::Problem) with the same words and in the same order as when it
//! read the API objects itself; everything else about an object that planning does not read
//! (other metadata, labels, annotations, status) is dropped.

use super::keys::{Protocol, UnknownProtocol};
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

/// Label linking an EndpointSlice to its Service (`discovery.k8s.io/v1`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Label that hands a Service to another proxy; kipvs skips every Service carrying it
/// (kube-proxy skips it unless it equals its `--service-proxy-name`, which kipvs does not have).
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// Service annotation choosing the IPVS scheduler of that Service's virtual servers, overriding
/// `ipvs.scheduler` (the idea of kube-router's `kube-router.io/service.scheduler`). The value
/// must be one of [`IPVS_SCHEDULERS`](crate::model::IPVS_SCHEDULERS); anything else (including `""`) is a [`Problem`](crate::plan::Problem) and
/// the configured scheduler is used.
pub const SCHEDULER_ANNOTATION: &str = "kipvs.io/scheduler";

/// Node label naming the node's zone, matched against `hints.forZones` (`v1.LabelTopologyZone`).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// What planning reads of the own Node (`v1.Node`), converted by
/// [`crate::source::convert::node`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its [`ZONE_LABEL`] label, matched against `hints.forZones`; `None` when unset or empty
    /// (`TestCategorizeEndpoints` "empty zone label").
    pub zone: Option<String>,
    /// Its primary IPs, as kubelet and kube-proxy pick them (`GetNodeHostIPs` in
    /// `component-helpers/node/util`): at most one per family (`nodePortAddresses: [primary]`).
    pub primary_ips: Vec<IpAddr>,
    /// Its InternalIP addresses (`status.addresses[type=InternalIP]`), in order: the node IPs
    /// when none are given.
    pub internal_ips: Vec<IpAddr>,
    /// Its pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`): this node's pods with
    /// `detectLocalMode: NodeCIDR`.
    pub pod_cidrs: Vec<ipnet::IpNet>,
}

/// Shares equal strings: one allocation per distinct namespace, node name, port name, zone
/// or known scheduler, however many objects name it.
///
/// Memory follows the live objects: a string no object holds any more is dropped when the
/// interner has doubled since it last dropped them ([`Interner::intern`]), so churning values
/// (a port renamed in a loop) cost amortised O(1) per string and never more than about twice
/// what the live objects name. Text that is not validated first (an annotation's value) is not
/// interned: the converter keeps its own copy, which goes with its object.
#[derive(Debug)]
pub struct Interner {
    strings: HashSet<Arc<str>>,
    /// Size at which the next [`Interner::intern`] of a new string drops the unused ones.
    shrink_at: usize,
}

/// The smallest [`Interner::shrink_at`]: below it an interner never scans.
const INTERNER_MIN_SHRINK: usize = 1024;

impl Default for Interner {
    fn default() -> Self {
        Interner {
            strings: HashSet::new(),
            shrink_at: INTERNER_MIN_SHRINK,
        }
    }
}

impl Interner {
    /// The shared copy of `text`.
    pub fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(text) {
            return shared.clone();
        }
        if self.strings.len() >= self.shrink_at {
            // Only the interner holds these: no object names them any more.
            self.strings.retain(|s| Arc::strong_count(s) > 1);
            self.strings.shrink_to_fit();
            self.shrink_at = (2 * self.strings.len()).max(INTERNER_MIN_SHRINK);
        }
        let shared: Arc<str> = Arc::from(text);
        self.strings.insert(shared.clone());
        shared
    }

    /// How many distinct strings it holds (live or not yet dropped).
    pub fn len(&self) -> usize {
        self.strings.len()
    }

    /// Whether it holds no string.
    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }
}

/// A field parsed from its API text: the value, or the text that is not one (reported when
/// planned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed<T> {
    /// The parsed value.
    Ok(T),
    /// The text as the API object carried it.
    Invalid(Box<str>),
}

impl<T: std::str::FromStr> Parsed<T> {
    /// `text` parsed as a `T`.
    pub fn parse(text: &str) -> Self {
        text.parse()
            .map_or_else(|_| Parsed::Invalid(text.into()), Parsed::Ok)
    }
}

/// `spec.type`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceTypeField {
    /// `ClusterIP` or unset.
    ClusterIp,
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// `ExternalName` (not programmed).
    ExternalName,
    /// Anything else, as written.
    Unknown(Box<str>),
}

/// The cluster IPs: `spec.clusterIPs` when set and non-empty, else `spec.clusterIP`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterIps {
    /// One of them is `None`: a headless Service.
    Headless,
    /// Unset or empty.
    Unset,
    /// The addresses; `indexed` when read from `spec.clusterIPs` (problems name the index).
    Ips {
        /// Read from `spec.clusterIPs`.
        indexed: bool,
        /// Each entry, in order.
        ips: Box<[Parsed<IpAddr>]>,
    },
}

/// `status.loadBalancer.ingress[].ipMode` (KEP-1860).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpMode {
    /// `VIP`.
    Vip,
    /// `Proxy`.
    Proxy,
    /// Anything else, as written.
    Unknown(Box<str>),
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ingress {
    /// `ip`; `None` when unset or empty (a hostname-only entry).
    pub ip: Option<Parsed<IpAddr>>,
    /// `ipMode`, if set.
    pub ip_mode: Option<IpMode>,
}

/// One `spec.ports[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortInfo {
    /// `name` (`""` when unset).
    pub name: Arc<str>,
    /// `protocol` (unset is TCP), or the unknown one.
    pub protocol: Result<Protocol, UnknownProtocol>,
    /// `port`, as the API's `int32`.
    pub port: i32,
    /// `nodePort`, as the API's `int32`.
    pub node_port: Option<i32>,
}

/// What planning reads of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    /// `metadata.namespace` (`default` when unset).
    pub namespace: Arc<str>,
    /// `metadata.name` (`""` when unset).
    pub name: Arc<str>,
    /// `metadata.creationTimestamp`, in seconds since the Unix epoch (`None` when unset, as in
    /// hand-written manifests): the older Service wins a contested virtual server.
    pub created: Option<i64>,
    /// Labelled `service.kubernetes.io/service-proxy-name` (handed to another proxy).
    pub other_proxy: bool,
    /// The `kipvs.io/scheduler` annotation, if set.
    pub scheduler: Option<Arc<str>>,
    /// `spec.type`.
    pub type_: ServiceTypeField,
    /// `spec.clusterIPs` / `spec.clusterIP`.
    pub cluster_ips: ClusterIps,
    /// `spec.externalIPs`, in order.
    pub external_ips: Box<[Parsed<IpAddr>]>,
    /// `spec.loadBalancerSourceRanges`, trimmed and parsed (host bits not yet cleared).
    pub source_ranges: Box<[Parsed<ipnet::IpNet>]>,
    /// `status.loadBalancer.ingress`, in order.
    pub ingress: Box<[Ingress]>,
    /// `spec.sessionAffinity: ClientIP`: `Some(timeoutSeconds)`.
    pub client_ip_affinity: Option<Option<i32>>,
    /// `spec.externalTrafficPolicy: Local`.
    pub external_local: bool,
    /// `spec.internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `spec.ports`, in order.
    pub ports: Box<[ServicePortInfo]>,
    /// `spec.healthCheckNodePort`.
    pub health_check_node_port: Option<i32>,
}

/// `addressType` of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressType {
    /// `IPv4`.
    Ipv4,
    /// `IPv6`.
    Ipv6,
    /// `FQDN` (ignored, as kube-proxy does).
    Fqdn,
    /// Anything else, as written.
    Unknown(Box<str>),
}

/// `hints` of an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hints {
    /// `forZones[].name`.
    pub for_zones: Box<[Arc<str>]>,
    /// `forNodes[].name`.
    pub for_nodes: Box<[Arc<str>]>,
}

/// `addresses[0]` of an endpoint, checked against the slice's `addressType`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointAddress {
    /// An IP address of the slice's family (any IP for a slice that is not IPv4 or IPv6).
    Ip(IpAddr),
    /// An IP address of the other family, as written.
    OtherFamily(Box<str>),
    /// Not an IP address, as written.
    Invalid(Box<str>),
}

/// One `endpoints[]` entry of a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// `addresses[0]`, if any.
    pub address: Option<EndpointAddress>,
    /// `conditions.ready`, with the API's default (unset is true).
    pub ready: bool,
    /// `conditions.serving` (unset is the value of `ready`, as the API documents).
    pub serving: bool,
    /// `conditions.terminating` (unset is false).
    pub terminating: bool,
    /// `nodeName`.
    pub node_name: Option<Arc<str>>,
    /// `hints`, when some list is non-empty.
    pub hints: Option<Box<Hints>>,
}

/// One `ports[]` entry of a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePortInfo {
    /// `name` (`""` when unset).
    pub name: Arc<str>,
    /// `port`, as the API's `int32`.
    pub port: Option<i32>,
    /// `protocol` (unset is TCP), or the unknown one.
    pub protocol: Result<Protocol, UnknownProtocol>,
}

/// What planning reads of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceInfo {
    /// `metadata.namespace` (`default` when unset).
    pub namespace: Arc<str>,
    /// `metadata.name` (`""` when unset).
    pub name: Arc<str>,
    /// The Service it belongs to (`kubernetes.io/service-name` label, same namespace).
    pub service: Option<Arc<str>>,
    /// `addressType`.
    pub address_type: AddressType,
    /// `endpoints`, in order.
    pub endpoints: Box<[EndpointInfo]>,
    /// `ports`, in order.
    pub ports: Box<[SlicePortInfo]>,
}
