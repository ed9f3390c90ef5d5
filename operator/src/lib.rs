//! kipvs-operator: turns each `ProxyConfig` into one `NodeProxyConfig` per selected node and
//! rolls changes out stage by stage, gated on the health the proxiers report.
//!
//! - [`rollout`]: the decision, a pure function (no I/O, no clock), with its rules.
//! - [`controller`]: the kube-runtime controller around it (reflectors, writes, Events, status).
//! - [`events`]: Events about ProxyConfigs.
//! - [`metrics`]: Prometheus metrics, `/metrics`, `/healthz`, `/readyz`.
//! - [`lease`]: leader election through a Lease.
//! - [`conditions`]: the status conditions and their transition times.
//! - [`stored`]: ProxyConfigs read without failing (an undecodable one is reported, not fatal).
//! - [`triggers`]: which Node and NodeProxyConfig changes reconcile which ProxyConfigs.
//! - [`writer`]: the NodeProxyConfig writes, sent apart from the decisions (queue, retries).
//! - [`sim`]: an in-memory fleet to drive the decision (tests, benchmarks, what-if runs).

#![warn(missing_docs)]

pub mod conditions;
pub mod controller;
pub mod events;
pub mod lease;
pub mod metrics;
pub mod rollout;
pub mod sim;
pub mod stored;
pub mod triggers;
pub mod writer;
