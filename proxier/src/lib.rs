//! kipvs proxier: Kubernetes Services and EndpointSlices in, a kernel IPVS table out.
//!
//! Data flows one way (see `ARCHITECTURE.md`):
//! `source` → [`source::store::Store`] (API objects converted by [`source::convert`] into
//! [`model::objects`]) → [`plan::plan_service`] → [`model::DesiredState`] →
//! [`dataplane::diff::diff`] → [`dataplane::Op`]s → [`dataplane::Dataplane`].

#![warn(missing_docs)]

pub mod dataplane;
pub mod engine;
pub mod format;
pub mod inspect;
pub mod model;
pub mod plan;
pub mod serve;
pub mod source;
