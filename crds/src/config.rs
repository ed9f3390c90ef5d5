//! [`ProxierConfiguration`]: the proxier's one configuration type.
//!
//! The same type is read from a local file (`kipvs-proxier --config`, with the header
//! `apiVersion: kipvs.io/v1alpha1` + `kind: ProxierConfiguration` like every Kubernetes
//! component configuration, or without both; see [`crate::kubeproxy`]), and sits, without the
//! header, in `NodeProxyConfig.spec.config` and `ProxyConfig.spec.config`. Field names and defaults follow kube-proxy's
//! `KubeProxyConfiguration` (`kubeproxy.config.k8s.io/v1alpha1`, see
//! `staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go` and
//! `pkg/proxy/apis/config/v1alpha1/defaults.go`), restricted to what an IPVS proxier uses, so
//! that the relevant part of a kube-proxy configuration file moves over unchanged:
//!
//! ```yaml
//! apiVersion: kipvs.io/v1alpha1
//! kind: ProxierConfiguration
//! featureGates:
//!   ProxyTerminatingEndpoints: true
//! ipvs:
//!   scheduler: rr
//!   syncPeriod: 30s
//!   minSyncPeriod: 0s
//!   strictARP: false
//!   tcpTimeout: 0s
//!   tcpFinTimeout: 0s
//!   udpTimeout: 0s
//!   excludeCIDRs: []
//! nodePortAddresses: []
//! nodePortRange: 30000-32767
//! clusterCIDR: 10.244.0.0/16
//! detectLocalMode: ClusterCIDR
//! detectLocal:
//!   bridgeInterface: ""
//!   interfaceNamePrefix: ""
//! conntrack:
//!   maxPerCore: 32768
//!   min: 131072
//!   tcpEstablishedTimeout: 24h0m0s
//!   tcpCloseWaitTimeout: 1h0m0s
//!   tcpBeLiberal: false
//!   udpTimeout: 0s
//!   udpStreamTimeout: 0s
//! nftables:
//!   masqueradeAll: false
//! healthzBindAddress: 0.0.0.0:10256
//! metricsBindAddress: 127.0.0.1:10249
//! ```
//!
//! Every field is optional. Unknown fields and unknown feature gates are errors, not
//! silently ignored. The shape stays friendly to a structural CRD schema: addresses and
//! CIDRs are strings (validated by [`ProxierConfiguration::validate`]), durations are Go
//! duration strings (`"30s"`, `"1m30s"`), and no field is a `oneOf`.

use crate::gates::{Gate, UnknownGate};
use crate::{duration, schema};
use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

/// `apiVersion` of a kipvs configuration file (`--config`); the embedded form
/// (`ProxyConfig.spec.config`, `NodeProxyConfig.spec.config`) has no header.
pub const API_VERSION: &str = "kipvs.io/v1alpha1";

/// `kind` of a kipvs configuration file (`--config`).
pub const KIND: &str = "ProxierConfiguration";

/// Configuration of a kipvs proxier (a subset of kube-proxy's `KubeProxyConfiguration`).
///
/// `Default` gives kube-proxy's defaults for IPVS mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProxierConfiguration {
    /// Feature gates by name (`ProxyTerminatingEndpoints`, `LoadBalancerIPMode`,
    /// `KubeProxyDrainingTerminatingNodes`); a gate that is not listed is on. Unknown names
    /// are rejected.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::feature_gates")]
    pub feature_gates: BTreeMap<String, bool>,
    /// IPVS settings (`KubeProxyIPVSConfiguration`).
    pub ipvs: IpvsConfiguration,
    /// Which node addresses NodePort virtual servers listen on: CIDRs (each node IP inside
    /// one of them), or the single value `"primary"` (the Node object's primary IP of each
    /// family). Empty: every node IP.
    pub node_port_addresses: Vec<String>,
    /// The NodePort range of the cluster, `FIRST-LAST` (kube-apiserver's
    /// `--service-node-port-range`; a kipvs extension: kube-proxy does not need it). A virtual
    /// server on a node IP with a port in this range is a NodePort the proxier owns: it is
    /// deleted when no Service wants it. Default `30000-32767`; `FIRST` ≥ 1, `FIRST` ≤ `LAST`.
    pub node_port_range: String,
    /// The pod network: CIDRs separated by commas (one per IP family), as kube-proxy's
    /// `clusterCIDR`. Traffic to a ClusterIP from a source outside it is masqueraded (kube-proxy's
    /// `ClusterCIDR` local-traffic detector). Empty: only traffic the node itself sends from a
    /// service IP is masqueraded (kube-proxy's rule without a detector).
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    /// How ClusterIP traffic from this node's pods is told from other traffic, which is
    /// masqueraded (kube-proxy's `detectLocalMode`, KEP-2450): `ClusterCIDR` (the default, also
    /// when empty: a source inside `clusterCIDR`), `NodeCIDR` (inside the Node's
    /// `spec.podCIDRs`), `BridgeInterface` (arriving on `detectLocal.bridgeInterface`) or
    /// `InterfaceNamePrefix` (arriving on an interface whose name starts with
    /// `detectLocal.interfaceNamePrefix`). See [`LocalMode`].
    pub detect_local_mode: String,
    /// The interface of the `BridgeInterface` and `InterfaceNamePrefix` modes (kube-proxy's
    /// `detectLocal`).
    pub detect_local: DetectLocalConfiguration,
    /// The node's conntrack table size and timeouts, as kube-proxy sets them (kube-proxy's
    /// `conntrack`). Each is written where the kernel's value differs, the hash size where it is lower.
    pub conntrack: ConntrackConfiguration,
    /// The nftables rules that complete IPVS (masquerade, hairpin, filtering).
    pub nftables: NftablesConfiguration,
    /// `ip:port` of the `/healthz` and `/livez` HTTP server. Default `0.0.0.0:10256`.
    pub healthz_bind_address: String,
    /// `ip:port` of the `/metrics` HTTP server. Default `127.0.0.1:10249`.
    pub metrics_bind_address: String,
    /// Which service proxy programs the node: `kipvs` (default) or `kube-proxy` (kipvs stands
    /// by, writing nothing, and hands a node it programmed back to kube-proxy). A kipvs
    /// extension for moving from kube-proxy's IPVS mode; see [`ServiceProxy`]. Not written when
    /// `kipvs`, so that proxiers that predate the field read configurations that keep the
    /// default.
    #[serde(skip_serializing_if = "ServiceProxy::is_kipvs")]
    #[schemars(schema_with = "schema::service_proxy")]
    pub service_proxy: ServiceProxy,
}

/// The service proxy that programs a node's IPVS table: the value of
/// [`ProxierConfiguration::service_proxy`] and of the node label
/// [`crate::nodeproxyconfig::SERVICE_PROXY_LABEL`]. Serialised as `kipvs` / `kube-proxy`.
///
/// - `kipvs`: kipvs programs the node; where kube-proxy ran, kipvs waits until it has stopped,
///   then takes its table over and removes its iptables rules and ipsets.
/// - `kube-proxy`: kube-proxy programs the node; kipvs writes nothing, and hands back a node it
///   programmed (weights as kube-proxy expects them, health port released, its nftables table
///   removed once kube-proxy has synced).
///
/// kube-proxy 1.24 and kipvs program the same kernel objects (virtual servers, `kube-ipvs0`,
/// mark `0x4000`), so the switch adopts the table in place in either direction instead of
/// flushing it (`kube-proxy --cleanup` breaks every established connection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceProxy {
    /// kipvs programs the node.
    #[default]
    Kipvs,
    /// kube-proxy programs the node.
    KubeProxy,
}

impl ServiceProxy {
    /// Whether this is the default, [`ServiceProxy::Kipvs`].
    pub fn is_kipvs(&self) -> bool {
        *self == ServiceProxy::Kipvs
    }

    /// The serialised name: `kipvs` or `kube-proxy` (also the node label's value).
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceProxy::Kipvs => "kipvs",
            ServiceProxy::KubeProxy => "kube-proxy",
        }
    }
}

/// `detectLocalMode` values (kube-proxy's `LocalMode`, KEP-2450).
pub const LOCAL_MODES: [&str; 4] = [
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
];

/// A parsed `detectLocalMode` with the `detectLocal` field it uses (kube-proxy's
/// `getDetectLocalMode` and `getLocalDetector`, `cmd/kube-proxy/app/server_linux.go`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalMode {
    /// `ClusterCIDR` (or empty): a source inside `clusterCIDR` is local; without a
    /// `clusterCIDR` of a family nothing is detected for it.
    ClusterCidr,
    /// `NodeCIDR`: a source inside the Node's `spec.podCIDRs` is local.
    NodeCidr,
    /// `BridgeInterface`: traffic arriving on this interface is local.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`: traffic arriving on an interface whose name starts with this is
    /// local.
    InterfaceNamePrefix(String),
}

/// kube-proxy's `detectLocal` block (`DetectLocalConfiguration`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DetectLocalConfiguration {
    /// The bridge the node's pods are on (`detectLocalMode: BridgeInterface`), e.g. `cbr0`.
    pub bridge_interface: String,
    /// The prefix of the node's pod interfaces (`detectLocalMode: InterfaceNamePrefix`), e.g.
    /// `veth`.
    pub interface_name_prefix: String,
}

/// kube-proxy's `conntrack` block (`KubeProxyConntrackConfiguration`) with its defaults
/// (`pkg/proxy/apis/config/v1alpha1/defaults.go`). The proxier writes each value where the
/// kernel's differs (kube-proxy's `setIntSysCtl`; the hash size only where it is lower), with
/// each configuration it puts in force and at each start; a value it cannot write is reported
/// and never stops it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConntrackConfiguration {
    /// Conntrack entries per CPU: `net/netfilter/nf_conntrack_max` becomes
    /// `maxPerCore` × CPUs, at least `min`, and the hash table
    /// (`/sys/module/nf_conntrack/parameters/hashsize`) a quarter of it. Default 32768; `0`
    /// leaves both alone (and ignores `min`).
    pub max_per_core: u32,
    /// The smallest `nf_conntrack_max` `maxPerCore` may give. Default 131072.
    pub min: u32,
    /// `nf_conntrack_tcp_timeout_established`, as a Go duration. Default `24h`; `0s` leaves
    /// it alone.
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub tcp_established_timeout: Duration,
    /// `nf_conntrack_tcp_timeout_close_wait`, as a Go duration. Default `1h`; `0s` leaves it
    /// alone.
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub tcp_close_wait_timeout: Duration,
    /// Set `nf_conntrack_tcp_be_liberal=1` (out-of-window TCP packets are not marked
    /// INVALID). Default false (left alone).
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_udp_timeout`, as a Go duration. Default `0s` (left alone).
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub udp_timeout: Duration,
    /// `nf_conntrack_udp_timeout_stream`, as a Go duration. Default `0s` (left alone).
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackConfiguration {
    fn default() -> Self {
        ConntrackConfiguration {
            max_per_core: 32 * 1024,
            min: 128 * 1024,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

impl ConntrackConfiguration {
    /// The `nf_conntrack_max` to ensure on a node with `cpus` CPUs (kube-proxy's
    /// `getConntrackMax`): `maxPerCore` × `cpus`, at least `min`; `None` when `maxPerCore` is
    /// 0 (leave it alone).
    pub fn max(&self, cpus: u32) -> Option<u64> {
        (self.max_per_core > 0)
            .then(|| (u64::from(self.max_per_core) * u64::from(cpus)).max(u64::from(self.min)))
    }
}

/// nftables settings, as kube-proxy's `nftables` block (`KubeProxyNFTablesConfiguration`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NftablesConfiguration {
    /// Masquerade all traffic to ClusterIPs, whatever its source (kube-proxy's
    /// `masqueradeAll`; its IPVS mode reads `iptables.masqueradeAll`). Default false.
    pub masquerade_all: bool,
}

/// IPVS settings, as kube-proxy's `ipvs` block (`KubeProxyIPVSConfiguration`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IpvsConfiguration {
    /// IPVS scheduler of every virtual server (`rr`, `wrr`, `lc`, `wlc`, `sh`, `mh`, ...).
    /// Empty means `rr`, as in kube-proxy.
    pub scheduler: String,
    /// Longest time between two full resynchronisations, as a Go duration. Default `30s`;
    /// must be greater than zero.
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub sync_period: Duration,
    /// Shortest time between two synchronisations, as a Go duration. Default `0s` (sync on
    /// every change); must not exceed `syncPeriod`.
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub min_sync_period: Duration,
    /// Set `arp_ignore=1` and `arp_announce=2` so the node does not answer ARP for the
    /// addresses on `kube-ipvs0` (needed by MetalLB in L2 mode). Default false.
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    /// IPVS idle timeout of TCP connections, as a Go duration; `0s` keeps the kernel's value
    /// (900 s).
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub tcp_timeout: Duration,
    /// IPVS timeout of TCP connections after a FIN, as a Go duration; `0s` keeps the kernel's
    /// value (120 s).
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub tcp_fin_timeout: Duration,
    /// IPVS timeout of UDP flows, as a Go duration; `0s` keeps the kernel's value (300 s).
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub udp_timeout: Duration,
    /// kipvs extension: the longest a TCP real server that left its Service's endpoints keeps
    /// draining at weight 0 before it is deleted with whatever connections remain, as a Go
    /// duration. Default `15m` (kube-proxy's historical `rsGracefulDeletePeriod`); `0s`
    /// deletes at once.
    #[serde(with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub drain_timeout: Duration,
    /// CIDRs whose virtual servers kipvs never deletes (virtual servers owned by something
    /// else on the node).
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Vec<String>,
}

impl Default for ProxierConfiguration {
    fn default() -> Self {
        ProxierConfiguration {
            feature_gates: BTreeMap::new(),
            ipvs: IpvsConfiguration::default(),
            node_port_addresses: Vec::new(),
            node_port_range: DEFAULT_NODE_PORT_RANGE.to_owned(),
            cluster_cidr: String::new(),
            detect_local_mode: String::new(),
            detect_local: DetectLocalConfiguration::default(),
            conntrack: ConntrackConfiguration::default(),
            nftables: NftablesConfiguration::default(),
            healthz_bind_address: "0.0.0.0:10256".to_owned(),
            metrics_bind_address: "127.0.0.1:10249".to_owned(),
            service_proxy: ServiceProxy::Kipvs,
        }
    }
}

impl Default for IpvsConfiguration {
    fn default() -> Self {
        IpvsConfiguration {
            scheduler: String::new(),
            sync_period: Duration::from_secs(30),
            min_sync_period: Duration::ZERO,
            strict_arp: false,
            tcp_timeout: Duration::ZERO,
            tcp_fin_timeout: Duration::ZERO,
            udp_timeout: Duration::ZERO,
            drain_timeout: Duration::from_secs(15 * 60),
            exclude_cidrs: Vec::new(),
        }
    }
}

/// The IPVS timeouts in whole seconds, as the kernel takes them (`IPVS_CMD_SET_CONFIG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeoutSeconds {
    /// `tcpTimeout`.
    pub tcp: u32,
    /// `tcpFinTimeout`.
    pub tcp_fin: u32,
    /// `udpTimeout`.
    pub udp: u32,
}

impl IpvsConfiguration {
    /// `tcpTimeout`, `tcpFinTimeout` and `udpTimeout` in seconds (`0`: keep the kernel's).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming a timeout longer than the kernel's 32-bit seconds
    /// (about 136 years), never a wrapped value.
    pub fn timeout_seconds(&self) -> Result<TimeoutSeconds, ConfigError> {
        let secs = |field: &str, d: Duration| {
            u32::try_from(d.as_secs()).map_err(|_| {
                invalid(
                    format!("ipvs.{field}"),
                    format!(
                        "{} is longer than {} seconds",
                        duration::format(d),
                        u32::MAX
                    ),
                )
            })
        };
        Ok(TimeoutSeconds {
            tcp: secs("tcpTimeout", self.tcp_timeout)?,
            tcp_fin: secs("tcpFinTimeout", self.tcp_fin_timeout)?,
            udp: secs("udpTimeout", self.udp_timeout)?,
        })
    }

    /// The scheduler to program: `scheduler`, or `rr` when it is empty (kube-proxy's rule).
    pub fn effective_scheduler(&self) -> &str {
        if self.scheduler.is_empty() {
            "rr"
        } else {
            &self.scheduler
        }
    }

    /// `excludeCIDRs`, parsed.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first entry that is not a CIDR.
    pub fn parsed_exclude_cidrs(&self) -> Result<Vec<IpNet>, ConfigError> {
        self.exclude_cidrs
            .iter()
            .enumerate()
            .map(|(i, cidr)| parse_cidr(cidr, || format!("ipvs.excludeCIDRs[{i}]")))
            .collect()
    }
}

/// One entry of `nodePortAddresses`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodePortAddress {
    /// `"primary"`: the Node object's primary address of each IP family.
    Primary,
    /// Node IPs inside this CIDR.
    Cidr(IpNet),
}

/// `nodePortAddresses` value that selects the node's primary IPs (kube-proxy's
/// `NodePortAddressesPrimary`).
pub const NODE_PORT_ADDRESSES_PRIMARY: &str = "primary";

/// The default `nodePortRange`: kube-apiserver's default `--service-node-port-range`.
pub const DEFAULT_NODE_PORT_RANGE: &str = "30000-32767";

/// Removes from the object `value` (at `path`) the members `known` (the defaults, which
/// spell out every field but `featureGates`) does not have, recursively, pushing their paths
/// onto `ignored`.
fn keep_known(
    value: &mut serde_json::Value,
    known: &serde_json::Value,
    path: &str,
    ignored: &mut Vec<String>,
) {
    let (serde_json::Value::Object(map), serde_json::Value::Object(known)) = (value, known) else {
        return;
    };
    map.retain(|name, v| {
        let member = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        match known.get(name) {
            Some(k) => {
                keep_known(v, k, &member, ignored);
                true
            }
            None if path.is_empty() && name == "featureGates" => true,
            None => {
                ignored.push(member);
                false
            }
        }
    });
}

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error (part of the message, so not also a `source()`).
        error: std::io::Error,
    },
    /// The YAML is malformed or does not fit the schema: an unknown field (named in the
    /// message), a wrong type, or a bad duration.
    #[error("invalid configuration: {0}")]
    Yaml(String),
    /// `featureGates` names a gate kipvs does not know.
    #[error("featureGates: {0}")]
    UnknownGate(UnknownGate),
    /// A field has a value that parses but is not allowed.
    #[error("{field}: {message}")]
    Invalid {
        /// Path of the field, e.g. `ipvs.minSyncPeriod` or `ipvs.excludeCIDRs[1]`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An error in a configuration file, with the file's path.
    #[error("{}: {error}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The error in it (part of the message, so not also a `source()`).
        error: Box<ConfigError>,
    },
}

impl From<UnknownGate> for ConfigError {
    fn from(e: UnknownGate) -> Self {
        ConfigError::UnknownGate(e)
    }
}

impl ProxierConfiguration {
    /// Parses a YAML (or JSON) document and [validates](Self::validate) it. An empty document
    /// gives the defaults.
    ///
    /// # Errors
    /// [`ConfigError::Yaml`] for syntax errors, unknown fields and bad durations; the errors
    /// of [`validate`](Self::validate) otherwise.
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        let config: Option<ProxierConfiguration> =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
        let config = config.unwrap_or_default();
        config.validate()?;
        Ok(config)
    }

    /// Decodes the embedded form (`NodeProxyConfig.spec.config`, which a newer kipvs may have
    /// written) and [validates](Self::validate) it, leaving out what this version does not
    /// know instead of rejecting it: object members that are not fields here and
    /// `featureGates` entries that are not gates here (version skew between the operator and
    /// the proxiers is normal during an upgrade). Returns the configuration and the paths left
    /// out (`ipvs.newSetting`, `featureGates.NewGate`), sorted; `null` is the
    /// defaults.
    ///
    /// # Errors
    /// [`ConfigError::Yaml`] when a known field has the wrong type or a bad duration; the
    /// errors of [`validate`](Self::validate) otherwise.
    pub fn from_value_ignoring_unknown(
        value: &serde_json::Value,
    ) -> Result<(Self, Vec<String>), ConfigError> {
        // Every field, also those not written at their default (serviceProxy).
        let every_field = ProxierConfiguration {
            service_proxy: ServiceProxy::KubeProxy,
            ..Self::default()
        };
        let known = serde_json::to_value(every_field).expect("the defaults serialize");
        let mut value = value.clone();
        let mut ignored = Vec::new();
        if let serde_json::Value::Object(map) = &mut value
            && let Some(serde_json::Value::Object(gates)) = map.get_mut("featureGates")
        {
            gates.retain(|name, _| {
                let known = name.parse::<Gate>().is_ok();
                if !known {
                    ignored.push(format!("featureGates.{name}"));
                }
                known
            });
        }
        keep_known(&mut value, &known, "", &mut ignored);
        ignored.sort();
        let config: Option<Self> =
            serde_json::from_value(value).map_err(|e| ConfigError::Yaml(e.to_string()))?;
        let config = config.unwrap_or_default();
        config.validate()?;
        Ok((config, ignored))
    }

    /// Checks what the types alone cannot: gate names are known, `ipvs.syncPeriod > 0`,
    /// `ipvs.minSyncPeriod <= ipvs.syncPeriod` (kube-proxy's validation), CIDRs and bind
    /// addresses parse, and `"primary"` is the only entry of `nodePortAddresses` when present.
    ///
    /// # Errors
    /// The first problem found, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for name in self.feature_gates.keys() {
            name.parse::<Gate>()?;
        }
        if self.ipvs.sync_period.is_zero() {
            return Err(invalid("ipvs.syncPeriod", "must be greater than 0"));
        }
        if self.ipvs.min_sync_period > self.ipvs.sync_period {
            return Err(invalid(
                "ipvs.minSyncPeriod",
                format!(
                    "{} must not be greater than ipvs.syncPeriod ({})",
                    duration::format(self.ipvs.min_sync_period),
                    duration::format(self.ipvs.sync_period)
                ),
            ));
        }
        self.ipvs.parsed_exclude_cidrs()?;
        self.ipvs.timeout_seconds()?;
        self.parsed_node_port_addresses()?;
        self.parsed_node_port_range()?;
        self.parsed_cluster_cidrs()?;
        self.parsed_local_mode()?;
        self.healthz_socket_addr()?;
        self.metrics_socket_addr()?;
        Ok(())
    }

    /// `clusterCIDR`, parsed: its comma-separated entries, blanks trimmed and empty ones
    /// skipped (kube-proxy splits the field the same way). Empty means no cluster CIDR.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first entry that is not a CIDR.
    pub fn parsed_cluster_cidrs(&self) -> Result<Vec<IpNet>, ConfigError> {
        self.cluster_cidr
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .enumerate()
            .map(|(i, cidr)| parse_cidr(cidr, || format!("clusterCIDR[{i}]")))
            .collect()
    }

    /// `detectLocalMode` with its `detectLocal` field (kube-proxy's `getDetectLocalMode` and
    /// the validation of `detectLocal`, `pkg/proxy/apis/config/validation`): empty is
    /// `ClusterCIDR`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a mode not in [`LOCAL_MODES`], or for `BridgeInterface` /
    /// `InterfaceNamePrefix` without a valid interface name (or prefix) in `detectLocal`.
    pub fn parsed_local_mode(&self) -> Result<LocalMode, ConfigError> {
        let interface = |field: &str, name: &str| {
            // The kernel's dev_valid_name: 1-15 bytes, not "." or "..", no '/', ':' or blank.
            let valid = !name.is_empty()
                && name.len() < 16
                && name != "."
                && name != ".."
                && !name.contains(['/', ':'])
                && !name.contains(char::is_whitespace);
            if valid {
                Ok(name.to_owned())
            } else {
                Err(invalid(
                    format!("detectLocal.{field}"),
                    format!(
                        "{name:?} is not an interface name (1-15 characters, none of '/', ':' \
                         or blanks); detectLocalMode {} needs one",
                        self.detect_local_mode
                    ),
                ))
            }
        };
        match self.detect_local_mode.trim() {
            "" | "ClusterCIDR" => Ok(LocalMode::ClusterCidr),
            "NodeCIDR" => Ok(LocalMode::NodeCidr),
            "BridgeInterface" => interface("bridgeInterface", &self.detect_local.bridge_interface)
                .map(LocalMode::BridgeInterface),
            "InterfaceNamePrefix" => interface(
                "interfaceNamePrefix",
                &self.detect_local.interface_name_prefix,
            )
            .map(LocalMode::InterfaceNamePrefix),
            other => Err(invalid(
                "detectLocalMode",
                format!("{other:?} is not one of {}", LOCAL_MODES.join(", ")),
            )),
        }
    }

    /// Whether `gate` is on: its `featureGates` entry, or the gate's default (on).
    pub fn gate_enabled(&self, gate: Gate) -> bool {
        self.feature_gates
            .get(gate.name())
            .copied()
            .unwrap_or_else(|| gate.default_enabled())
    }

    /// `nodePortAddresses`, parsed. Empty means every node IP.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for an entry that is neither a CIDR nor `"primary"`, or for
    /// `"primary"` next to other entries.
    pub fn parsed_node_port_addresses(&self) -> Result<Vec<NodePortAddress>, ConfigError> {
        let entries = &self.node_port_addresses;
        entries
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let field = || format!("nodePortAddresses[{i}]");
                if entry == NODE_PORT_ADDRESSES_PRIMARY {
                    if entries.len() > 1 {
                        return Err(invalid(
                            field(),
                            "\"primary\" must be the only entry (it cannot be combined with CIDRs)",
                        ));
                    }
                    Ok(NodePortAddress::Primary)
                } else {
                    parse_cidr(entry, field).map(NodePortAddress::Cidr)
                }
            })
            .collect()
    }

    /// `nodePortRange`, parsed (`"30000-32767"` → `30000..=32767`; blanks around the numbers
    /// are allowed, as kube-apiserver's `net.ParsePortRange`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] when it is not `FIRST-LAST` with 1 ≤ `FIRST` ≤ `LAST` ≤ 65535.
    pub fn parsed_node_port_range(&self) -> Result<RangeInclusive<u16>, ConfigError> {
        let bad = || {
            invalid(
                "nodePortRange",
                format!(
                    "{:?} is not FIRST-LAST with 1 <= FIRST <= LAST <= 65535 (e.g. {DEFAULT_NODE_PORT_RANGE})",
                    self.node_port_range
                ),
            )
        };
        let (first, last) = self.node_port_range.split_once('-').ok_or_else(bad)?;
        let first: u16 = first.trim().parse().map_err(|_| bad())?;
        let last: u16 = last.trim().parse().map_err(|_| bad())?;
        if first == 0 || first > last {
            return Err(bad());
        }
        Ok(first..=last)
    }

    /// `healthzBindAddress`, parsed.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] if it is not `ip:port`.
    pub fn healthz_socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_socket_addr(&self.healthz_bind_address, "healthzBindAddress")
    }

    /// `metricsBindAddress`, parsed.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] if it is not `ip:port`.
    pub fn metrics_socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_socket_addr(&self.metrics_bind_address, "metricsBindAddress")
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

fn parse_cidr(text: &str, field: impl FnOnce() -> String) -> Result<IpNet, ConfigError> {
    text.parse().map_err(|_| {
        invalid(
            field(),
            format!("{text:?} is not a CIDR (such as 10.0.0.0/8 or fd00::/64)"),
        )
    })
}

fn parse_socket_addr(text: &str, field: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| {
        invalid(
            field,
            format!("{text:?} is not an ip:port address (such as 0.0.0.0:10256 or [::]:10256)"),
        )
    })
}

#[cfg(test)]
mod tests;
