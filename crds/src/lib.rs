//! kipvs API types.
//!
//! - [`ProxierConfiguration`]: the proxier's configuration, with kube-proxy's
//!   `KubeProxyConfiguration` field names (see [`config`]).
//! - [`Gate`]: the feature gates kipvs understands.
//! - [`duration`]: Go-style duration strings (`"30s"`, `"1m30s"`).

pub mod config;
pub mod duration;
pub mod gates;

pub use config::{ConfigError, IpvsConfiguration, NodePortAddress, ProxierConfiguration};
pub use gates::{Gate, UnknownGate};
