//! Reading kube-proxy's own configuration file as a [`ProxierConfiguration`], so that a
//! cluster can move from kube-proxy's IPVS mode to kipvs with its `kube-proxy` ConfigMap
//! unchanged.
//!
//! [`ProxierConfiguration::load_any`] reads, by the document's `apiVersion` and `kind` (the way
//! every Kubernetes component configuration file is told apart):
//! - `apiVersion: kipvs.io/v1alpha1`, `kind: ProxierConfiguration` (the documented form), or
//!   neither field: a kipvs [`ProxierConfiguration`] ([`ProxierConfiguration::from_yaml_str`],
//!   strict: unknown fields are errors); one of the two without the other, or another version
//!   of it, is an error naming the expected pair;
//! - `kind: KubeProxyConfiguration` (`apiVersion: kubeproxy.config.k8s.io/v1alpha1`, the
//!   `config.conf` key of the ConfigMap kubeadm writes;
//!   `staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go`): converted as below;
//! - any other `kind` is an error naming both supported kinds.
//!
//! What a `KubeProxyConfiguration` gives kipvs:
//!
//! | kube-proxy field | kipvs | zero or unset |
//! |---|---|---|
//! | `mode` | must be `ipvs` or `""` (a warning: kube-proxy's `""` means iptables); anything else is an error | |
//! | `featureGates` | the three kipvs gates map; other gates are ignored with a warning | every gate on |
//! | `ipvs.scheduler`, `ipvs.strictARP`, `ipvs.excludeCIDRs` | same field | `""` (rr), false, none |
//! | `ipvs.syncPeriod` | same field | `30s` (kube-proxy's `SetDefaults_KubeProxyConfiguration`) |
//! | `ipvs.minSyncPeriod`, `ipvs.tcpTimeout`, `ipvs.tcpFinTimeout`, `ipvs.udpTimeout` | same field | `0s` |
//! | `clusterCIDR` | same field | none |
//! | `detectLocalMode`, `detectLocal.bridgeInterface`, `detectLocal.interfaceNamePrefix` | same fields (KEP-2450) | `ClusterCIDR` |
//! | `conntrack.maxPerCore`, `conntrack.min`, `conntrack.tcpEstablishedTimeout`, `conntrack.tcpCloseWaitTimeout` | same fields | `null`: kube-proxy's default (32768, 131072, `24h`, `1h`); `0`: leave the kernel's value |
//! | `conntrack.tcpBeLiberal`, `conntrack.udpTimeout`, `conntrack.udpStreamTimeout` | same fields | false / `0s`: leave the kernel's value |
//! | `iptables.masqueradeAll` (what IPVS mode reads), `nftables.masqueradeAll` | `nftables.masqueradeAll` (true if either is) | false |
//! | `nodePortAddresses` | same field; the keywords `all` and `localhost` become their CIDRs | every node IP |
//! | `healthzBindAddress`, `metricsBindAddress` | same field; an address without a port gets 10256 / 10249 (`AppendPortIfNeeded`) | `0.0.0.0:10256` / `127.0.0.1:10249`, or `[::]:10256` / `[::1]:10249` when `bindAddress` is IPv6 |
//!
//! Every other field is accepted and ignored, as are fields kube-proxy does not know (its
//! v1alpha1 decoding is lenient too); each one that is set to something other than its zero
//! value (`null`, `false`, `0`, `""`, `"0"`, `"0s"`, empty lists and maps) is named in the
//! returned warnings, so that the caller can log what kipvs does not do. kubeadm writes every
//! field, mostly with zero values, so its default file gives only a few warnings.

use crate::config::{self, ConfigError, IpvsConfiguration, ProxierConfiguration};
use crate::duration;
use crate::gates::Gate;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// `apiVersion` of the kube-proxy configuration kipvs reads.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";

/// `kind` of the kube-proxy configuration kipvs reads.
pub const KIND: &str = "KubeProxyConfiguration";

/// Default port of `healthzBindAddress` (`ports.ProxyHealthzPort`).
const HEALTHZ_PORT: u16 = 10256;

/// Default port of `metricsBindAddress` (`ports.ProxyStatusPort`).
const METRICS_PORT: u16 = 10249;

/// Default `ipvs.syncPeriod` when the file leaves it at zero.
const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);

/// The top-level fields of `KubeProxyConfiguration` v1alpha1 that kipvs ignores (current ones,
/// and `udpIdleTimeout` and `resourceContainer` of older releases). Fields not listed here
/// nor read by kipvs are unknown to kube-proxy as well.
const IGNORED_FIELDS: [&str; 15] = [
    "bindAddressHardFail",
    "clientConnection",
    "configSyncPeriod",
    "enableProfiling",
    "hostnameOverride",
    "iptables",
    "logging",
    "nftables",
    "oomScoreAdj",
    "portRange",
    "showHiddenMetricsForVersion",
    "winkernel",
    "windowsRunAsService",
    "udpIdleTimeout",
    "resourceContainer",
];

/// The fields kipvs reads; the rest lands in `ignored`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct KubeProxyConfiguration {
    api_version: Option<String>,
    mode: Option<String>,
    bind_address: Option<String>,
    feature_gates: Option<BTreeMap<String, bool>>,
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    node_port_addresses: Option<Vec<String>>,
    ipvs: Option<KubeProxyIpvs>,
    #[serde(rename = "clusterCIDR")]
    cluster_cidr: Option<String>,
    detect_local_mode: Option<String>,
    detect_local: Option<KubeProxyDetectLocal>,
    conntrack: Option<KubeProxyConntrack>,
    #[serde(flatten)]
    ignored: Map<String, Value>,
}

/// `DetectLocalConfiguration`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct KubeProxyDetectLocal {
    bridge_interface: Option<String>,
    interface_name_prefix: Option<String>,
    #[serde(flatten)]
    ignored: Map<String, Value>,
}

/// `KubeProxyConntrackConfiguration`: `maxPerCore`, `min` and the TCP timeouts are pointers
/// (`null` takes kube-proxy's default), the UDP timeouts are not (zero leaves the kernel's).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct KubeProxyConntrack {
    max_per_core: Option<i64>,
    min: Option<i64>,
    tcp_established_timeout: Option<Value>,
    tcp_close_wait_timeout: Option<Value>,
    tcp_be_liberal: Option<bool>,
    udp_timeout: Option<Value>,
    udp_stream_timeout: Option<Value>,
    #[serde(flatten)]
    ignored: Map<String, Value>,
}

/// `KubeProxyIPVSConfiguration`; durations as Go duration strings (any YAML value is taken
/// here, so that a wrong one is reported naming its field).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct KubeProxyIpvs {
    scheduler: Option<String>,
    sync_period: Option<Value>,
    min_sync_period: Option<Value>,
    #[serde(rename = "strictARP")]
    strict_arp: Option<bool>,
    tcp_timeout: Option<Value>,
    tcp_fin_timeout: Option<Value>,
    udp_timeout: Option<Value>,
    #[serde(rename = "excludeCIDRs")]
    exclude_cidrs: Option<Vec<String>>,
    #[serde(flatten)]
    ignored: Map<String, Value>,
}

impl ProxierConfiguration {
    /// Reads a configuration file in either form (see the [module](self) docs) and validates
    /// it. Returns the configuration and, for a `KubeProxyConfiguration`, warnings naming what
    /// kipvs ignores (empty for a kipvs file).
    ///
    /// # Errors
    /// [`ConfigError::Read`] if the file cannot be read; otherwise the errors of
    /// [`from_any_yaml_str`](Self::from_any_yaml_str) wrapped in [`ConfigError::File`] with
    /// the path.
    pub fn load_any(path: impl AsRef<Path>) -> Result<(Self, Vec<String>), ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::from_any_yaml_str(&text).map_err(|e| ConfigError::File {
            path: path.to_owned(),
            error: Box::new(e),
        })
    }

    /// Parses a kipvs `ProxierConfiguration` (with the header `apiVersion: kipvs.io/v1alpha1`,
    /// `kind: ProxierConfiguration`, or without both) or a kube-proxy `KubeProxyConfiguration`,
    /// told apart by `kind` (see the [module](self) docs), and validates the result.
    ///
    /// # Errors
    /// [`ConfigError::Yaml`] for malformed YAML or a field of the wrong type;
    /// [`ConfigError::Invalid`] for an unsupported `kind`/`apiVersion` (naming the expected
    /// ones), a `mode` other than `ipvs` or `""`, or a bad duration; the errors of
    /// [`validate`](Self::validate) otherwise.
    pub fn from_any_yaml_str(text: &str) -> Result<(Self, Vec<String>), ConfigError> {
        let document: Option<Value> =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
        let Some(Value::Object(mut object)) = document else {
            return Ok((Self::from_yaml_str(text)?, Vec::new()));
        };
        let field = |object: &Map<String, Value>, name: &str| match object.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(invalid(name, format!("{other} is not a string"))),
        };
        let kind = field(&object, "kind")?;
        let api_version = field(&object, "apiVersion")?;
        match kind.as_deref() {
            Some(KIND) => {
                object.remove("kind"); // checked here; not an ignored field
                from_kube_proxy(Value::Object(object))
            }
            None | Some(config::KIND) => {
                if (kind.is_some() || api_version.is_some())
                    && (kind.as_deref(), api_version.as_deref())
                        != (Some(config::KIND), Some(config::API_VERSION))
                {
                    return Err(invalid(
                        "kind",
                        format!(
                            "{:?} with apiVersion {:?} is not supported: expected kind {} with \
                             apiVersion {} (or neither, for a kipvs file), or kind {KIND} \
                             ({API_VERSION})",
                            kind.unwrap_or_default(),
                            api_version.unwrap_or_default(),
                            config::KIND,
                            config::API_VERSION,
                        ),
                    ));
                }
                object.remove("kind");
                object.remove("apiVersion");
                let config: ProxierConfiguration = serde_json::from_value(Value::Object(object))
                    .map_err(|e| ConfigError::Yaml(e.to_string()))?;
                config.validate()?;
                Ok((config, Vec::new()))
            }
            Some(other) => Err(invalid(
                "kind",
                format!(
                    "{other:?} is not supported: expected {} ({}) or {KIND} ({API_VERSION})",
                    config::KIND,
                    config::API_VERSION
                ),
            )),
        }
    }
}

/// Converts a `KubeProxyConfiguration` document (see the module docs).
fn from_kube_proxy(document: Value) -> Result<(ProxierConfiguration, Vec<String>), ConfigError> {
    let mut file: KubeProxyConfiguration =
        serde_json::from_value(document).map_err(|e| ConfigError::Yaml(format!("{KIND}: {e}")))?;
    let api_version = file.api_version.as_deref().unwrap_or_default();
    if api_version != API_VERSION {
        return Err(invalid(
            "apiVersion",
            format!("{api_version:?} is not supported for {KIND}: expected {API_VERSION}"),
        ));
    }
    let mut warnings = Vec::new();
    check_mode(file.mode.as_deref().unwrap_or_default(), &mut warnings)?;
    let feature_gates = feature_gates(file.feature_gates.take().unwrap_or_default(), &mut warnings);
    let ipvs = ipvs_configuration(file.ipvs.take().unwrap_or_default(), &mut warnings)?;
    let masquerade_all = masquerade_all(&mut file.ignored)?;
    let (healthz_bind_address, metrics_bind_address) = bind_addresses(&mut file);
    let conntrack =
        conntrack_configuration(file.conntrack.take().unwrap_or_default(), &mut warnings)?;
    let detect_local = file.detect_local.take().unwrap_or_default();
    for (name, value) in &detect_local.ignored {
        set_leaves(&format!("detectLocal.{name}"), value, &mut |path| {
            warnings.push(format!(
                "{path} is not a {KIND} {API_VERSION} field; ignored"
            ));
        });
    }
    let config = ProxierConfiguration {
        feature_gates,
        ipvs,
        cluster_cidr: file.cluster_cidr.unwrap_or_default(),
        detect_local_mode: file.detect_local_mode.unwrap_or_default(),
        detect_local: config::DetectLocalConfiguration {
            bridge_interface: detect_local.bridge_interface.unwrap_or_default(),
            interface_name_prefix: detect_local.interface_name_prefix.unwrap_or_default(),
        },
        conntrack,
        nftables: crate::NftablesConfiguration { masquerade_all },
        node_port_addresses: file
            .node_port_addresses
            .unwrap_or_default()
            .into_iter()
            .flat_map(expand_node_port_keyword)
            .collect(),
        // KubeProxyConfiguration has no NodePort range (only kube-apiserver knows it).
        node_port_range: config::DEFAULT_NODE_PORT_RANGE.to_owned(),
        healthz_bind_address,
        metrics_bind_address,
        service_proxy: crate::ServiceProxy::Kipvs,
    };
    warn_ignored(&file.ignored, &mut warnings);
    if let Some(address) = file
        .bind_address
        .filter(|a| a.parse::<IpAddr>().is_ok_and(|ip| !ip.is_unspecified()))
    {
        warnings.push(format!(
            "bindAddress {address} is ignored (kipvs takes the node's primary IP from its Node \
             object); only its IP family picks the default health and metrics addresses"
        ));
    }
    config.validate()?;
    Ok((config, warnings))
}

/// Where `kipvs` (the configuration a proxier will run with) differs from `kube_proxy` (kube-proxy's
/// file read by [`ProxierConfiguration::load_any`]) in a field kipvs carries over (the table in the
/// [module](self) docs): one line per differing setting, `path: kube-proxy VALUE, kipvs VALUE`,
/// sorted by path. Settings kube-proxy has no field for (`nodePortRange`, `ipvs.drainTimeout`,
/// `serviceProxy`) are left out. Empty when the move keeps kube-proxy's behaviour; shown by the
/// takeover preview so that a difference is seen before the switch.
pub fn differences(kube_proxy: &ProxierConfiguration, kipvs: &ProxierConfiguration) -> Vec<String> {
    let normalised = |config: &ProxierConfiguration| {
        let mut config = config.clone();
        config.ipvs.scheduler = config.ipvs.effective_scheduler().to_owned();
        config.node_port_range = String::new();
        config.ipvs.drain_timeout = Duration::ZERO;
        config.service_proxy = crate::ServiceProxy::Kipvs;
        if config.detect_local_mode.trim().is_empty() {
            config.detect_local_mode = "ClusterCIDR".to_owned();
        }
        // Every gate is named, so that a gate at its default compares equal to an unset one.
        config.feature_gates = Gate::ALL
            .into_iter()
            .map(|gate| (gate.name().to_owned(), config.gate_enabled(gate)))
            .collect();
        serde_json::to_value(config).expect("ProxierConfiguration serializes to JSON")
    };
    let mut out = Vec::new();
    diff_leaves("", &normalised(kube_proxy), &normalised(kipvs), &mut out);
    out
}

/// Pushes `path: kube-proxy A, kipvs B` for every leaf where `a` and `b` differ (lists are
/// leaves).
fn diff_leaves(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (name, value) in a {
                let child = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                diff_leaves(&child, value, b.get(name).unwrap_or(&Value::Null), out);
            }
        }
        (a, b) if a != b => out.push(format!("{path}: kube-proxy {a}, kipvs {b}")),
        _ => {}
    }
}

/// `mode`: kipvs replaces kube-proxy's `ipvs` mode; empty (kube-proxy's default) is taken with a
/// warning.
///
/// # Errors
///
/// [`ConfigError::Invalid`] for any other mode.
fn check_mode(mode: &str, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
    match mode {
        "ipvs" => Ok(()),
        "" => {
            warnings.push(
                "mode is \"\" (kube-proxy's default, iptables on Linux); kipvs programs IPVS"
                    .to_owned(),
            );
            Ok(())
        }
        other => Err(invalid(
            "mode",
            format!(
                "{other:?}: kipvs is an IPVS service proxy and replaces kube-proxy's \
                 \"ipvs\" mode only; set mode to \"ipvs\" (or leave it empty)"
            ),
        )),
    }
}

/// `featureGates`: the kipvs gates by their canonical name; any other gate is warned about and
/// dropped.
fn feature_gates(
    gates: BTreeMap<String, bool>,
    warnings: &mut Vec<String>,
) -> BTreeMap<String, bool> {
    let mut feature_gates = BTreeMap::new();
    for (name, enabled) in gates {
        match name.parse::<Gate>() {
            Ok(gate) => {
                feature_gates.insert(gate.name().to_owned(), enabled);
            }
            Err(_) => warnings.push(format!(
                "featureGates.{name} is not a kipvs feature gate (known: {}); ignored",
                Gate::known_names()
            )),
        }
    }
    feature_gates
}

/// The `ipvs` block: scheduler, sync periods (a zero `syncPeriod` is kube-proxy's default),
/// `strictARP`, the IPVS timeouts and `excludeCIDRs`; unset fields take kipvs's defaults, unknown
/// ones are warned about.
///
/// # Errors
///
/// [`ConfigError::Invalid`] for a duration that does not parse.
fn ipvs_configuration(
    ipvs: KubeProxyIpvs,
    warnings: &mut Vec<String>,
) -> Result<IpvsConfiguration, ConfigError> {
    let defaults = IpvsConfiguration::default();
    let sync_period = duration_field("ipvs.syncPeriod", &ipvs.sync_period)?;
    let config = IpvsConfiguration {
        scheduler: ipvs.scheduler.unwrap_or_default(),
        sync_period: sync_period
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_SYNC_PERIOD),
        min_sync_period: duration_field("ipvs.minSyncPeriod", &ipvs.min_sync_period)?
            .unwrap_or(defaults.min_sync_period),
        strict_arp: ipvs.strict_arp.unwrap_or(defaults.strict_arp),
        tcp_timeout: duration_field("ipvs.tcpTimeout", &ipvs.tcp_timeout)?
            .unwrap_or(defaults.tcp_timeout),
        tcp_fin_timeout: duration_field("ipvs.tcpFinTimeout", &ipvs.tcp_fin_timeout)?
            .unwrap_or(defaults.tcp_fin_timeout),
        udp_timeout: duration_field("ipvs.udpTimeout", &ipvs.udp_timeout)?
            .unwrap_or(defaults.udp_timeout),
        exclude_cidrs: ipvs.exclude_cidrs.unwrap_or_default(),
        ..defaults
    };
    for (name, value) in &ipvs.ignored {
        set_leaves(&format!("ipvs.{name}"), value, &mut |path| {
            warnings.push(format!(
                "{path} is not a {KIND} {API_VERSION} field; ignored"
            ));
        });
    }
    Ok(config)
}

/// The `conntrack` block: a `null` (or missing) `maxPerCore`, `min`, `tcpEstablishedTimeout`
/// or `tcpCloseWaitTimeout` takes kube-proxy's default (`SetDefaults_KubeProxyConfiguration`),
/// as kubeadm's file, which spells them all `null`, expects; zero leaves the kernel's value.
///
/// # Errors
///
/// [`ConfigError::Invalid`] for a negative or too large count (kube-proxy's validation), or a
/// duration that does not parse.
fn conntrack_configuration(
    conntrack: KubeProxyConntrack,
    warnings: &mut Vec<String>,
) -> Result<config::ConntrackConfiguration, ConfigError> {
    let defaults = config::ConntrackConfiguration::default();
    let count = |field: &str, value: Option<i64>, default: u32| match value {
        None => Ok(default),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|&n| i32::try_from(n).is_ok())
            .ok_or_else(|| {
                invalid(
                    &format!("conntrack.{field}"),
                    format!("{n} must be between 0 and {}", i32::MAX),
                )
            }),
    };
    let timeout = |field: &str, value: &Option<Value>, default: Duration| {
        duration_field(&format!("conntrack.{field}"), value).map(|d| d.unwrap_or(default))
    };
    for (name, value) in &conntrack.ignored {
        set_leaves(&format!("conntrack.{name}"), value, &mut |path| {
            warnings.push(format!(
                "{path} is not a {KIND} {API_VERSION} field; ignored"
            ));
        });
    }
    Ok(config::ConntrackConfiguration {
        max_per_core: count("maxPerCore", conntrack.max_per_core, defaults.max_per_core)?,
        min: count("min", conntrack.min, defaults.min)?,
        tcp_established_timeout: timeout(
            "tcpEstablishedTimeout",
            &conntrack.tcp_established_timeout,
            defaults.tcp_established_timeout,
        )?,
        tcp_close_wait_timeout: timeout(
            "tcpCloseWaitTimeout",
            &conntrack.tcp_close_wait_timeout,
            defaults.tcp_close_wait_timeout,
        )?,
        tcp_be_liberal: conntrack.tcp_be_liberal.unwrap_or(defaults.tcp_be_liberal),
        udp_timeout: timeout("udpTimeout", &conntrack.udp_timeout, Duration::ZERO)?,
        udp_stream_timeout: timeout(
            "udpStreamTimeout",
            &conntrack.udp_stream_timeout,
            Duration::ZERO,
        )?,
    })
}

/// `masqueradeAll`, read from the `iptables` block (IPVS mode's) and the `nftables` one and
/// taken out of `ignored`; the rest of both blocks stays there and is warned about.
///
/// # Errors
///
/// [`ConfigError::Invalid`] for a value that is not a boolean.
fn masquerade_all(ignored: &mut Map<String, Value>) -> Result<bool, ConfigError> {
    let mut masquerade_all = false;
    for block in ["iptables", "nftables"] {
        if let Some(Value::Object(fields)) = ignored.get_mut(block)
            && let Some(value) = fields.remove("masqueradeAll")
        {
            masquerade_all |= value.as_bool().ok_or_else(|| {
                invalid(
                    &format!("{block}.masqueradeAll"),
                    format!("{value} is not a boolean"),
                )
            })?;
        }
    }
    Ok(masquerade_all)
}

/// `healthzBindAddress` and `metricsBindAddress` (taken out of `file`), with kube-proxy's port
/// appended when missing; unset, they default to all addresses and loopback of the family of
/// `bindAddress`.
fn bind_addresses(file: &mut KubeProxyConfiguration) -> (String, String) {
    let bind_ipv6 = file
        .bind_address
        .as_deref()
        .and_then(|a| a.parse::<IpAddr>().ok())
        .is_some_and(|ip| ip.is_ipv6());
    let (healthz_host, metrics_host) = if bind_ipv6 {
        ("[::]", "[::1]")
    } else {
        ("0.0.0.0", "127.0.0.1")
    };
    let bind_address = |value: Option<String>, host: &str, port: u16| match value {
        Some(address) if !address.is_empty() => append_port_if_needed(address, port),
        _ => format!("{host}:{port}"),
    };
    (
        bind_address(file.healthz_bind_address.take(), healthz_host, HEALTHZ_PORT),
        bind_address(file.metrics_bind_address.take(), metrics_host, METRICS_PORT),
    )
}

/// A warning for every set leaf of the fields kipvs does not read: the known kube-proxy fields
/// ([`IGNORED_FIELDS`], with what to use instead) and the unknown ones.
fn warn_ignored(ignored: &Map<String, Value>, warnings: &mut Vec<String>) {
    for (name, value) in ignored {
        let known = IGNORED_FIELDS.contains(&name.as_str());
        set_leaves(name, value, &mut |path| {
            warnings.push(if known {
                ignored_warning(&path)
            } else {
                format!("{path} is not a {KIND} {API_VERSION} field; ignored")
            });
        });
    }
}

/// The warning for a set field of [`IGNORED_FIELDS`], with what to use instead where kipvs
/// has an equivalent.
fn ignored_warning(path: &str) -> String {
    let instead = match path {
        "hostnameOverride" => "; kipvs takes the node name from --node (KIPVS_NODE_NAME)",
        "clientConnection.kubeconfig" => {
            "; kipvs uses --kubeconfig, else the in-cluster configuration"
        }
        _ => "",
    };
    format!("{path} is ignored by kipvs{instead}")
}

/// A Go duration field (`metav1.Duration`, a string), `None` when unset or `null`.
fn duration_field(field: &str, value: &Option<Value>) -> Result<Option<Duration>, ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => duration::parse(text)
            .map(Some)
            .map_err(|e| invalid(field, e.to_string())),
        Some(other) => Err(invalid(
            field,
            format!("{other} is not a duration string (such as \"30s\" or \"1m30s\")"),
        )),
    }
}

/// kube-proxy's `nodePortAddresses` keywords that kipvs's field spells as CIDRs: `all`
/// (`0.0.0.0/0`, `::/0`) and `localhost` (`127.0.0.0/8`, `::1/128`: no NodePort in IPVS mode,
/// which never serves them on loopback). Other entries, `primary` included, stay as they are.
fn expand_node_port_keyword(entry: String) -> Vec<String> {
    match entry.as_str() {
        "all" => vec!["0.0.0.0/0".to_owned(), "::/0".to_owned()],
        "localhost" => vec!["127.0.0.0/8".to_owned(), "::1/128".to_owned()],
        _ => vec![entry],
    }
}

/// kube-proxy's `AppendPortIfNeeded`: an address that is a bare IP gets `port`; anything else
/// (`ip:port`, or something invalid, left to validation) is returned as is.
fn append_port_if_needed(address: String, port: u16) -> String {
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => format!("{ip}:{port}"),
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        Err(_) => address,
    }
}

/// Calls `report` with the path of every leaf under `value` that is not a zero value (`null`,
/// `false`, `0`, `""`, `"0"`, `"0s"`, an empty list or map). Lists are leaves.
fn set_leaves(path: &str, value: &Value, report: &mut impl FnMut(String)) {
    match value {
        Value::Object(map) => {
            for (name, child) in map {
                set_leaves(&format!("{path}.{name}"), child, report);
            }
        }
        Value::Null | Value::Bool(false) => {}
        Value::Number(n) if n.as_f64() == Some(0.0) => {}
        Value::String(s) if matches!(s.as_str(), "" | "0" | "0s") => {}
        Value::Array(items) if items.is_empty() => {}
        _ => report(path.to_owned()),
    }
}

fn invalid(field: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests;
