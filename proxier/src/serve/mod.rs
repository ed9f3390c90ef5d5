//! What the proxier serves and reports: health (`/livez`, `/healthz`, health-check node
//! ports, [`health`]), the gRPC health service ([`grpc`]), Prometheus metrics ([`metrics`]) and
//! the status of the node's NodeProxyConfig ([`status`]).

pub mod grpc;
pub mod health;
pub mod metrics;
pub mod status;
