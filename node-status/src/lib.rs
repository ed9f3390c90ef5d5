//! kipvs-node-status: the proxier's side of the NodeProxyConfig status contract, shared by the
//! proxier and by what stands in for proxiers in the operator's harnesses, so that both watch
//! their NodeProxyConfig alike and write the same statuses at the same moments.
//!
//! The contract itself (the fields and what the operator reads from them) is
//! [`kipvs_crds::nodeproxyconfig`]; this crate decides and writes them:
//!
//! - [`report`]: [`StatusReport`], the reducer: what happened (a revision rejected, put in
//!   force, assigned again, a sync done) in, the status to publish and whether to publish it
//!   now out. Pure: no I/O, no clock.
//! - [`writer`]: [`report_status`], which writes the published status with `healthy` from the
//!   proxier's `/livez` verdict ([`Liveness`]) by server-side apply on the status subresource.
//! - [`liveness`]: that verdict: [`Liveness`], and the rule behind it, [`StalenessClock`].
//! - [`retry`]: [`Retry`], how the proxier's watches, its NodeProxyConfig watch among them, wait
//!   after a failure.
//! - [`simulated`]: [`SimulatedProxier`], the engine's steps on the reducer for a harness that
//!   stands in for proxiers.

#![warn(missing_docs)]

pub mod liveness;
pub mod report;
pub mod retry;
pub mod simulated;
pub mod writer;

pub use liveness::{AlwaysLive, Liveness, SimulatedLiveness, StalenessClock};
pub use report::{COUNTERS_REFRESH, StatusReport, SyncResult};
pub use retry::{Retry, answered_status};
pub use simulated::SimulatedProxier;
pub use writer::{STATUS_RETRY, report_status};
