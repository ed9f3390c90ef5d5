//! The synthetic cluster of the scale benchmarks (`benches/sync.rs` and the `scale` example,
//! which `hack/bench-engine.sh` runs on two commits): N Services (mixed ClusterIP / NodePort /
//! LoadBalancer, 2 ports each) with one EndpointSlice of 10 endpoints each, on five nodes.
//! Only public APIs that the baseline commit of `hack/bench-engine.sh` has too.

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::engine::planner::{NodeIdentity, Planner};
use kipvs_proxier::source::store::Store;

/// The IPv4 address `base + i`.
pub fn ip(base: u32, i: usize) -> String {
    std::net::Ipv4Addr::from(base + i as u32).to_string()
}

/// Service `i`: LoadBalancer for i % 10 == 0, NodePort for 1..=3, else ClusterIP.
pub fn service(i: usize) -> Service {
    let kind = match i % 10 {
        0 => "LoadBalancer",
        1..=3 => "NodePort",
        _ => "ClusterIP",
    };
    let ports = (0..2)
        .map(|p| ServicePort {
            name: Some(format!("p{p}")),
            port: 80 + p,
            protocol: Some("TCP".into()),
            node_port: (kind != "ClusterIP")
                .then_some(30000 + ((i * 2 + p as usize) % 2768) as i32),
            ..Default::default()
        })
        .collect();
    let lb = (kind == "LoadBalancer").then(|| ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ip(0xCB00_7100, i)),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    });
    Service {
        metadata: ObjectMeta {
            namespace: Some(format!("ns{}", i % 100)),
            name: Some(format!("svc{i}")),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(kind.into()),
            cluster_ip: Some(ip(0x0A60_0000, i)),
            ports: Some(ports),
            ..Default::default()
        }),
        status: lb,
    }
}

/// The EndpointSlice of Service `i`: 10 endpoints on nodes `node-0`..`node-4`; the first is
/// ready only if `ready_first`.
pub fn slice(i: usize, ready_first: bool) -> EndpointSlice {
    let endpoints = (0..10)
        .map(|e| Endpoint {
            addresses: vec![ip(0x0AF4_0000, i * 10 + e)],
            conditions: Some(EndpointConditions {
                ready: Some(e != 0 || ready_first),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: Some(format!("node-{}", e % 5)),
            ..Default::default()
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some(format!("ns{}", i % 100)),
            name: Some(format!("svc{i}-abc")),
            labels: Some([("kubernetes.io/service-name".to_string(), format!("svc{i}"))].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        ports: Some(
            (0..2)
                .map(|p| EndpointPort {
                    name: Some(format!("p{p}")),
                    port: Some(8080 + p),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// A store holding Services `0..n` and their slices.
pub fn store(n: usize) -> Store {
    let mut store = Store::default();
    for i in 0..n {
        store.upsert_service(service(i));
        store.upsert_slice(slice(i, true));
    }
    store
}

/// The planner of `node-0` (node IP 192.168.0.10) with the default configuration.
pub fn planner() -> Planner {
    let identity = NodeIdentity {
        name: "node-0".into(),
        node_ips: vec!["192.168.0.10".parse().unwrap()],
    };
    Planner::new(identity, ProxierConfiguration::default())
}
