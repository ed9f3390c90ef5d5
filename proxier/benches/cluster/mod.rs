//! The cluster the engine benchmark plans and syncs: N Services (mixed ClusterIP / NodePort /
//! LoadBalancer, 2 ports each; every 20th one a LoadBalancer with
//! `externalTrafficPolicy: Local` and a health-check node port) with one EndpointSlice of 10
//! endpoints each, spread over 5 nodes.

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The cluster sizes measured.
pub const SIZES: [usize; 3] = [1_000, 10_000, 50_000];

/// This node's name (endpoints on it are local).
pub const NODE: &str = "node-0";

fn ip(base: u32, i: usize) -> String {
    std::net::Ipv4Addr::from(base + i as u32).to_string()
}

/// Service `i`.
pub fn service(i: usize) -> Service {
    let kind = match i % 10 {
        0 => "LoadBalancer",
        1..=3 => "NodePort",
        _ => "ClusterIP",
    };
    let local = i.is_multiple_of(20);
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
            external_traffic_policy: local.then(|| "Local".into()),
            health_check_node_port: local.then_some(32000 + (i / 20 % 700) as i32),
            ..Default::default()
        }),
        status: lb,
    }
}

/// The EndpointSlice of Service `i`; its first endpoint is ready when `ready_first`.
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
