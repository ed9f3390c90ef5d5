//! Where Services, EndpointSlices and the own Node come from: the [`store::Store`] they are
//! written into, the manifests files ([`manifests`]) and the Kubernetes API ([`kube`]), and the
//! node's NodeProxyConfig ([`node_config`]).

pub mod kube;
pub mod manifests;
pub mod node_config;
pub mod store;
