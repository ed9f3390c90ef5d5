//! kipvs proxier: Kubernetes Services and EndpointSlices in, a kernel IPVS table out.
//!
//! Data flows one way (see `ARCHITECTURE.md`):
//! `source` → [`manifests::Snapshot`] → [`plan::plan`] → [`model::DesiredState`] →
//! [`dataplane::diff`] → [`dataplane::Op`]s → [`dataplane::Dataplane`].

pub mod conntrack;
pub mod dataplane;
pub mod format;
pub mod grpc_health;
pub mod health;
pub mod inspect;
pub mod kube_source;
pub mod manifests;
pub mod metrics;
pub mod model;
pub mod nft;
pub mod node_config;
pub mod plan;
pub mod run;
pub mod store;
pub mod sync;
pub mod sysctl;
