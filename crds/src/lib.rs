//! kipvs API types.
//!
//! - [`ProxierConfiguration`]: the proxier's configuration, with kube-proxy's
//!   `KubeProxyConfiguration` field names (see [`config`]).
//! - [`ProxyConfig`]: a configuration for a set of nodes and its staged rollout (see
//!   [`proxyconfig`]).
//! - [`NodeProxyConfig`]: one node's configuration, written by the operator, with a status
//!   written by the node's proxier (see [`nodeproxyconfig`]).
//! - [`kubeproxy`]: kube-proxy's `KubeProxyConfiguration` read as a [`ProxierConfiguration`]
//!   ([`ProxierConfiguration::load_any`]), for clusters moving from kube-proxy.
//! - [`Gate`]: the feature gates kipvs understands.
//! - [`duration`]: Go-style duration strings (`"30s"`, `"1m30s"`).
//! - [`revision`]: the revision of a configuration (a content hash, shared by the operator,
//!   which writes it, and the proxier, which reports the revision of what it applied).
//! - [`crd`]: the CustomResourceDefinitions as the `crdgen` binary writes them.

#![warn(missing_docs)]

pub mod config;
pub mod crd;
pub mod duration;
pub mod gates;
pub mod kubeproxy;
pub mod nodeproxyconfig;
pub mod proxyconfig;
pub mod revision;
pub mod schema;

pub use config::{
    ConfigError, ConntrackConfiguration, DetectLocalConfiguration, IpvsConfiguration, LocalMode,
    NftablesConfiguration, NodePortAddress, ProxierConfiguration, ServiceProxy,
};
pub use gates::{Gate, UnknownGate};
pub use nodeproxyconfig::{
    NodePhase, NodeProxyConfig, NodeProxyConfigSpec, NodeProxyConfigStatus, OPERATOR_FIELD_MANAGER,
    PROXIER_FIELD_MANAGER, SERVICE_PROXY_LABEL, ServiceProxyPhase,
};
pub use proxyconfig::{
    CountOrPercent, NodeFailure, PROMOTE_ANNOTATION, ProxyConfig, ProxyConfigSpec,
    ProxyConfigStatus, REST_STAGE, RolloutSpec, SpecError, Stage, StagePhase, StageStatus,
};
