//! What the proxier serves: health (`/livez`, `/healthz`, health-check node ports,
//! [`health`]), the gRPC health service ([`grpc`]) and Prometheus metrics ([`metrics`]).

pub mod grpc;
pub mod health;
pub mod metrics;
