//! kipvs-proxier-contract: what the operator relies on in a proxier, shared by the proxier and
//! by what stands in for proxiers in the operator's harnesses, so that both watch alike, write
//! the same NodeProxyConfig statuses at the same moments and report health by the same rule.
//!
//! The status fields and what the operator reads from them are
//! [`kipvs_crds::nodeproxyconfig`]; this crate decides and writes them, and holds the behaviour
//! behind them:
//!
//! - [`report`]: [`StatusReport`], the reducer: what happened (a revision rejected, put in
//!   force, assigned again, a sync done) in, the status to publish and whether to publish it
//!   now out. Pure: no I/O, no clock.
//! - [`writer`]: [`report_status`], which writes the published status with `healthy` from the
//!   proxier's `/livez` verdict ([`Liveness`]) by server-side apply on the status subresource.
//! - [`liveness`]: that verdict: [`Liveness`], and the rule behind it, [`StalenessClock`].
//! - [`retry`]: [`Retry`], how every watch of the proxier (its NodeProxyConfig watch among them)
//!   waits after a failure.
//! - `simulated` (feature `harness`, for the operator's harnesses only): `SimulatedProxier`, the
//!   engine's steps on the reducer, and the stand-ins' `/livez` verdicts.

#![warn(missing_docs)]

pub mod liveness;
pub mod report;
pub mod retry;
#[cfg(feature = "harness")]
pub mod simulated;
pub mod writer;

pub use liveness::{Liveness, StalenessClock};
pub use report::{COUNTERS_REFRESH, StatusReport, SyncResult};
pub use retry::{Retry, answered_status};
#[cfg(feature = "harness")]
pub use simulated::{AlwaysLive, SimulatedLiveness, SimulatedProxier};
pub use writer::{STATUS_RETRY, report_status};
