//! kipvs-node-status: the proxier's side of the NodeProxyConfig status contract, shared by the
//! proxier and by what stands in for proxiers in the operator's harnesses, so that both write
//! the same statuses at the same moments.
//!
//! The contract itself (the fields and what the operator reads from them) is
//! [`kipvs_crds::nodeproxyconfig`]; this crate decides and writes them:
//!
//! - [`report`]: [`StatusReport`], the reducer: what happened (a revision rejected, put in
//!   force, assigned again, a sync done) in, the status to publish and whether to publish it
//!   now out. Pure: no I/O, no clock.
//! - [`writer`]: [`report_status`], which writes the published status with `healthy` from the
//!   proxier's `/livez` verdict ([`Liveness`]) by server-side apply on the status subresource.
//! - [`simulated`]: [`SimulatedProxier`], the engine's steps on the reducer for a harness that
//!   stands in for proxiers.

#![warn(missing_docs)]

pub mod report;
pub mod simulated;
pub mod writer;

pub use report::{COUNTERS_REFRESH, StatusReport, SyncResult};
pub use simulated::{AlwaysLive, SimulatedProxier};
pub use writer::{Liveness, STATUS_RETRY, report_status};
