//! `/healthz`, `/livez`, health-check node ports, `/metrics` and gRPC health, over real
//! sockets on 127.0.0.1, fed by a [`SourceHandle`] and an [`Engine`] over the fake dataplane.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::engine::Engine;
use kipvs_proxier::engine::observer::Observer;
use kipvs_proxier::engine::planner::{NodeIdentity, Planner};
use kipvs_proxier::serve::grpc::{self, HEALTHZ_SERVICE};
use kipvs_proxier::serve::health::{
    self, ENDPOINT_WEIGHT_HEADER, ProxyHealth, ServiceHealthServers,
};
use kipvs_proxier::serve::metrics::{self, Metrics};
use kipvs_proxier::source::SourceHandle;
use kipvs_proxier::source::store::LAST_CHANGE_TRIGGER_TIME;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const NODE: &str = "test-node";

/// The health timeout (kube-proxy: 2 × syncPeriod) of the tests that let a change go stale:
/// long enough for a loaded machine to answer a request before it, short for the suite.
const STALE_AFTER: Duration = Duration::from_secs(1);

/// Everything a running proxier has, minus the source and the kernel.
struct Proxier {
    handle: SourceHandle,
    engine: Engine<FakeDataplane>,
    health: ProxyHealth,
    metrics: Metrics,
    /// `/healthz`, `/livez` and `/metrics`, on one ephemeral port.
    addr: SocketAddr,
}

/// A proxier whose configuration has `timeout` as its health timeout (`ipvs.syncPeriod` is half
/// of it) and `KubeProxyDrainingTerminatingNodes` set to `gate`; the health learns both from the
/// engine, as in `kipvs-proxier run`.
fn proxier(timeout: Duration, gate: bool) -> Proxier {
    let metrics = Metrics::new();
    let health = ProxyHealth::default();
    let ports = ServiceHealthServers::new(health.clone(), vec!["127.0.0.1".parse().unwrap()]);
    let observers: Vec<Arc<dyn Observer>> = vec![
        Arc::new(health.clone()),
        Arc::new(metrics.clone()),
        Arc::new(ports),
    ];
    let observer: Arc<dyn Observer> = Arc::new(observers);
    let handle = SourceHandle::default().with_observer(observer.clone());
    let listener = health::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = warp::Filter::or(health.routes(&metrics), metrics.routes());
    let routes = warp::Filter::unify(routes);
    tokio::spawn(health::serve(listener, routes, std::future::pending()));
    let identity = NodeIdentity {
        name: NODE.into(),
        node_ips: vec![],
    };
    let mut config = ProxierConfiguration::default();
    config.ipvs.sync_period = timeout / 2;
    config.feature_gates.insert(
        kipvs_crds::Gate::KubeProxyDrainingTerminatingNodes
            .name()
            .into(),
        gate,
    );
    let planner = Planner::new(identity, config);
    let engine =
        Engine::new(handle.clone(), planner, FakeDataplane::default()).observed_by(observer);
    Proxier {
        handle,
        engine,
        health,
        metrics,
        addr,
    }
}

/// An HTTP/1.1 answer: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Answer> {
    exchange(addr, path, false).await
}

/// `GET path` on a new connection; with `half_close`, an HTTP/1.0 request after which the
/// client shuts its write side down, as `printf ... | nc` and some load-balancer health
/// checkers do.
async fn exchange(addr: SocketAddr, path: &str, half_close: bool) -> std::io::Result<Answer> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = if half_close {
        format!("GET {path} HTTP/1.0\r\n\r\n")
    } else {
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
    };
    stream.write_all(request.as_bytes()).await?;
    if half_close {
        stream.shutdown().await?;
    }
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

fn node(taint: Option<&str>, deleting: bool) -> Node {
    let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}});
    if let Some(key) = taint {
        node["spec"] = json!({"taints": [{"key": key, "effect": "NoSchedule"}]});
    }
    if deleting {
        node["metadata"]["deletionTimestamp"] = json!("2026-11-22T10:00:00Z");
    }
    serde_json::from_value(node).unwrap()
}

/// A LoadBalancer Service with `externalTrafficPolicy: Local` and a healthCheckNodePort.
fn lb_service(health_check_node_port: u16) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "type": "LoadBalancer", "clusterIP": "10.96.0.30", "externalTrafficPolicy": "Local",
            "healthCheckNodePort": health_check_node_port,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}
    }))
    .unwrap()
}

/// The Service's slice with one endpoint on this node, ready or only serving+terminating.
fn local_slice(ready: bool) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": "web-1", "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "web"},
            "annotations": {LAST_CHANGE_TRIGGER_TIME: "2026-01-01T00:00:00Z"}
        },
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": ["10.244.1.2"], "nodeName": NODE,
            "conditions": {"ready": ready, "serving": true, "terminating": !ready}
        }],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn livez_goes_stale_when_a_queued_change_waits_too_long() {
    let mut p = proxier(STALE_AFTER, true);
    // Starting: nothing queued, nothing synced yet — healthy, as kube-proxy.
    let livez = get(p.addr, "/livez").await.unwrap();
    assert_eq!(livez.status, 200);
    assert_eq!(livez.headers["content-type"], "application/json");
    assert_eq!(livez.headers["x-content-type-options"], "nosniff");
    let body = livez.json();
    assert_eq!(body["healthy"], true);
    assert!(body.get("nodeEligible").is_none(), "{body}");
    assert!(body.get("status").is_none(), "{body}");
    assert_eq!(body["lastUpdated"], body["currentTime"]);

    // A change is queued and not synced within the timeout: both fail.
    p.handle.update(|s| s.set_node(Some(node(None, false))));
    assert_eq!(get(p.addr, "/livez").await.unwrap().status, 200);
    tokio::time::sleep(STALE_AFTER + Duration::from_millis(200)).await;
    let livez = get(p.addr, "/livez").await.unwrap();
    assert_eq!(livez.status, 503);
    assert_eq!(livez.json()["lastUpdated"], "0001-01-01T00:00:00Z");
    assert_eq!(livez.json()["healthy"], false);
    let healthz = get(p.addr, "/healthz").await.unwrap();
    assert_eq!(healthz.status, 503);
    assert_eq!(healthz.json()["nodeEligible"], true);

    // The sync catches up: healthy again, with a per-family status.
    p.engine.sync().await.unwrap();
    let livez = get(p.addr, "/livez").await.unwrap();
    assert_eq!(livez.status, 200);
    let body = livez.json();
    assert_eq!(body["status"]["IPv4"]["healthy"], true);
    assert_eq!(body["status"]["IPv6"]["healthy"], true);
    assert_eq!(get(p.addr, "/healthz").await.unwrap().status, 200);
    assert_eq!(get(p.addr, "/other").await.unwrap().status, 404);

    let text = p.metrics.encode();
    assert_eq!(
        metrics::sample(&text, r#"kubeproxy_proxy_livez_total{code="200"}"#),
        Some(3.0)
    );
    assert_eq!(
        metrics::sample(&text, r#"kubeproxy_proxy_livez_total{code="503"}"#),
        Some(1.0)
    );
    assert_eq!(
        metrics::sample(&text, r#"kubeproxy_proxy_healthz_total{code="503"}"#),
        Some(1.0)
    );
    assert_eq!(
        metrics::sample(&text, r#"kubeproxy_proxy_healthz_total{code="200"}"#),
        Some(1.0)
    );
}

#[tokio::test]
async fn healthz_fails_for_a_node_being_removed_only_with_the_gate_on() {
    for gate in [true, false] {
        let mut p = proxier(Duration::from_secs(60), gate);
        let cases = [
            ("eligible", Some(node(None, false)), true),
            (
                "tainted",
                Some(node(Some(health::TO_BE_DELETED_TAINT), false)),
                false,
            ),
            (
                "other taint",
                Some(node(Some("example.com/maintenance"), false)),
                true,
            ),
            ("deleting", Some(node(None, true)), false),
            ("unknown", None, false),
        ];
        for (case, the_node, eligible) in cases {
            p.handle.update(|s| s.set_node(the_node));
            p.engine.sync().await.unwrap();
            let healthz = get(p.addr, "/healthz").await.unwrap();
            let expected = if eligible || !gate { 200 } else { 503 };
            assert_eq!(
                healthz.status, expected,
                "gate {gate}, {case}: {}",
                healthz.body
            );
            let body = healthz.json();
            if gate {
                assert_eq!(body["nodeEligible"], eligible, "{case}");
            } else {
                assert!(body.get("nodeEligible").is_none(), "{case}: {body}");
            }
            // /livez is about the proxier only.
            assert_eq!(get(p.addr, "/livez").await.unwrap().status, 200, "{case}");
        }
    }
}

#[tokio::test]
async fn health_check_node_port_counts_only_local_ready_endpoints() {
    let mut p = proxier(Duration::from_secs(60), true);
    let port = free_port();
    let hc: SocketAddr = ([127, 0, 0, 1], port).into();
    assert!(
        get(hc, "/").await.is_err(),
        "nothing listens before the plan says so"
    );

    p.handle.update(|s| {
        s.set_node(Some(node(None, false)));
        s.upsert_service(lb_service(port));
        s.upsert_slice(local_slice(true));
    });
    p.engine.sync().await.unwrap();
    let answer = get(hc, "/any/path").await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.headers[&ENDPOINT_WEIGHT_HEADER.to_ascii_lowercase()],
        "1"
    );
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(
        answer.json(),
        json!({"service": {"namespace": "shop", "name": "web"}, "localEndpoints": 1, "serviceProxyHealthy": true})
    );

    // Only a serving+terminating local endpoint: still forwarded to, but the load balancer
    // is told to go elsewhere.
    p.handle.update(|s| s.upsert_slice(local_slice(false)));
    p.engine.sync().await.unwrap();
    let answer = get(hc, "/").await.unwrap();
    assert_eq!(answer.status, 503);
    assert_eq!(
        answer.headers[&ENDPOINT_WEIGHT_HEADER.to_ascii_lowercase()],
        "0"
    );
    assert_eq!(answer.json()["localEndpoints"], 0);
    let vs = p.engine.dataplane().state.virtual_servers.values();
    assert!(
        vs.flat_map(|vs| vs.real_servers.values())
            .any(|rs| rs.weight == 1),
        "the terminating endpoint still serves (KEP-1669 fallback)"
    );

    // The Service goes away: so does the listener.
    p.handle
        .update(|s| s.delete_service(&("shop".into(), "web".into())));
    p.engine.sync().await.unwrap();
    let mut closed = false;
    for _ in 0..50 {
        if get(hc, "/").await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(closed, "the health-check node port was not closed");
}

/// kube-proxy's Go server answers a client that half-closed after its request; so must these
/// servers (a guard: on loopback hyper has answered every such request so far).
#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let mut p = proxier(Duration::from_secs(60), true);
    let port = free_port();
    p.handle.update(|s| {
        s.set_node(Some(node(None, false)));
        s.upsert_service(lb_service(port));
        s.upsert_slice(local_slice(true));
    });
    p.engine.sync().await.unwrap();
    let health_check: SocketAddr = ([127, 0, 0, 1], port).into();
    for _ in 0..200 {
        let answer = exchange(p.addr, "/livez", true).await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
        let answer = exchange(health_check, "/", true).await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
}

#[tokio::test]
async fn proxy_mode_answers_ipvs_as_kube_proxy_in_ipvs_mode() {
    let p = proxier(Duration::from_secs(60), true);
    let answer = get(p.addr, "/proxyMode").await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, "ipvs");
}

#[tokio::test]
async fn metrics_text_has_kube_proxy_and_kipvs_names() {
    let mut p = proxier(Duration::from_secs(60), true);
    p.handle.update(|s| {
        s.set_node(Some(node(None, false)));
        s.upsert_service(lb_service(free_port()));
        s.upsert_slice(local_slice(false));
    });
    let pending = p.metrics.encode();
    assert_eq!(
        metrics::sample(
            &pending,
            "kubeproxy_sync_proxy_rules_service_changes_pending"
        ),
        Some(1.0)
    );
    assert_eq!(
        metrics::sample(
            &pending,
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
        ),
        Some(1.0)
    );
    p.engine.sync().await.unwrap();

    let answer = get(p.addr, "/metrics").await.unwrap();
    assert_eq!(answer.status, 200);
    assert!(answer.headers["content-type"].starts_with("text/plain; version=0.0.4"));
    let text = answer.body;
    let value = |name: &str| {
        metrics::sample(&text, name).unwrap_or_else(|| panic!("{name} missing in\n{text}"))
    };
    assert_eq!(
        value("kubeproxy_sync_proxy_rules_duration_seconds_count"),
        1.0
    );
    assert!(value("kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 1.7e9);
    assert!(value("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds") > 1.7e9);
    assert_eq!(
        value("kubeproxy_sync_proxy_rules_service_changes_total"),
        1.0
    );
    assert_eq!(
        value("kubeproxy_sync_proxy_rules_endpoint_changes_total"),
        1.0
    );
    assert_eq!(
        value("kubeproxy_sync_proxy_rules_service_changes_pending"),
        0.0
    );
    assert_eq!(
        value("kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        0.0
    );
    // The slice's trigger time is in the past: one network programming sample, in +Inf.
    assert_eq!(
        value("kubeproxy_network_programming_duration_seconds_count"),
        1.0
    );
    assert_eq!(
        value(r#"kubeproxy_network_programming_duration_seconds_bucket{le="300"}"#),
        0.0
    );
    assert_eq!(
        value(r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="external"}"#),
        0.0
    );
    // ClusterIP, LB IP (node IPs unknown: no NodePort virtual server).
    assert_eq!(value("kipvs_virtual_servers"), 2.0);
    assert_eq!(value("kipvs_real_servers"), 2.0);
    assert_eq!(value("kipvs_services_terminating_fallback"), 1.0);
    assert_eq!(value("kipvs_real_servers_draining"), 0.0);
    assert!(text.contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram"));
    assert!(text.contains(r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"}"#));
}

async fn grpc_status(
    client: &mut HealthClient<tonic::transport::Channel>,
    service: &str,
) -> ServingStatus {
    let request = HealthCheckRequest {
        service: service.into(),
    };
    let response = client.check(request).await.unwrap().into_inner();
    ServingStatus::try_from(response.status).unwrap()
}

/// A gRPC health client of `p`'s health state, served on a port of its own.
async fn grpc_client(p: &Proxier) -> HealthClient<tonic::transport::Channel> {
    let listener = health::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(grpc::serve(
        listener,
        p.health.clone(),
        std::future::pending(),
    ));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

#[tokio::test]
async fn grpc_health_mirrors_livez_and_healthz_as_the_kubelet_asks() {
    let mut p = proxier(STALE_AFTER, true);
    let mut client = grpc_client(&p).await;

    // The kubelet's grpc probe: grpc.health.v1.Health/Check with service "".
    assert_eq!(grpc_status(&mut client, "").await, ServingStatus::Serving);
    assert_eq!(
        grpc_status(&mut client, HEALTHZ_SERVICE).await,
        ServingStatus::Serving
    );
    let unknown = client
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let mut watch = client
        .watch(HealthCheckRequest {
            service: HEALTHZ_SERVICE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let next = async |watch: &mut tonic::Streaming<_>| {
        let message: tonic_health::pb::HealthCheckResponse =
            tokio::time::timeout(Duration::from_secs(5), watch.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        ServingStatus::try_from(message.status).unwrap()
    };
    assert_eq!(next(&mut watch).await, ServingStatus::Serving);

    // The Node is tainted for deletion: healthz (and its watchers) fail, livez stays.
    p.handle
        .update(|s| s.set_node(Some(node(Some(health::TO_BE_DELETED_TAINT), false))));
    p.engine.sync().await.unwrap();
    assert_eq!(next(&mut watch).await, ServingStatus::NotServing);
    assert_eq!(
        grpc_status(&mut client, HEALTHZ_SERVICE).await,
        ServingStatus::NotServing
    );
    assert_eq!(grpc_status(&mut client, "").await, ServingStatus::Serving);

    // A queued change (an EndpointSlice update) goes stale: livez fails too, at the deadline,
    // without another event. (A taint alone queues no sync: it changes nothing planned.)
    p.handle.update(|s| {
        s.set_node(Some(node(None, false)));
        s.upsert_slice(local_slice(false));
    });
    tokio::time::sleep(STALE_AFTER + Duration::from_millis(200)).await;
    assert_eq!(
        grpc_status(&mut client, "").await,
        ServingStatus::NotServing
    );
    assert_eq!(get(p.addr, "/livez").await.unwrap().status, 503);
    p.engine.sync().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(grpc_status(&mut client, "").await, ServingStatus::Serving);
    assert_eq!(
        grpc_status(&mut client, HEALTHZ_SERVICE).await,
        ServingStatus::Serving
    );
}

/// Readiness means programmed (issue 33): `/readyz` and gRPC `kipvs.io/readyz` fail before the
/// first sync and pass after it, while `/livez` and gRPC `""` pass all along; the API watches
/// failing beyond [`health::SOURCES_LOST_READY`] turn readiness off again, never liveness.
#[tokio::test]
async fn readiness_waits_for_the_first_sync_and_the_sources() {
    let mut p = proxier(STALE_AFTER, true);
    let mut client = grpc_client(&p).await;
    let ready = grpc::READYZ_SERVICE;

    assert_eq!(get(p.addr, "/readyz").await.unwrap().status, 503);
    assert_eq!(
        get(p.addr, "/readyz").await.unwrap().json()["programmed"],
        false
    );
    assert_eq!(
        grpc_status(&mut client, ready).await,
        ServingStatus::NotServing
    );
    assert_eq!(get(p.addr, "/livez").await.unwrap().status, 200);
    assert_eq!(grpc_status(&mut client, "").await, ServingStatus::Serving);

    p.engine.sync().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(get(p.addr, "/readyz").await.unwrap().status, 200);
    assert_eq!(
        grpc_status(&mut client, ready).await,
        ServingStatus::Serving
    );

    // The API watches failing since longer than the bound.
    let since = tokio::time::Instant::now() - health::SOURCES_LOST_READY - Duration::from_secs(1);
    p.health.set_sources_lost(Some(since));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let answer = get(p.addr, "/readyz").await.unwrap();
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(
        grpc_status(&mut client, ready).await,
        ServingStatus::NotServing
    );
    assert_eq!(get(p.addr, "/livez").await.unwrap().status, 200);
    assert_eq!(grpc_status(&mut client, "").await, ServingStatus::Serving);
    p.health.set_sources_lost(None);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        grpc_status(&mut client, ready).await,
        ServingStatus::Serving
    );
}
