//! What the proxier serves and reports: health (`/livez`, `/healthz`, health-check node
//! ports, [`health`]), the gRPC health service ([`grpc`]), Prometheus metrics ([`metrics`]),
//! the ports handed over to kube-proxy and back ([`ports`]) and the status of the node's
//! NodeProxyConfig ([`status`]).

pub mod grpc;
pub mod health;
pub mod metrics;
pub mod ports;
pub mod status;
