//! The Kubernetes API source against a scripted API server (tower-test): recorded list and
//! watch answers, including a relist after `410 Gone`, an outage during which nothing is
//! deleted, the backoff while the API server is away and the resumption once it is back, and
//! the EndpointSlice version discovery finds: v1, v1beta1 (Kubernetes 1.20), or neither.

use http::{Request, Response, StatusCode};
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::dataplane::Op;
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::engine::Engine;
use kipvs_proxier::engine::planner::{NodeIdentity, Planner};
use kipvs_proxier::model::objects::EndpointAddress;
use kipvs_proxier::serve::metrics::{self, Metrics};
use kipvs_proxier::source::SourceHandle;
use kipvs_proxier::source::kube::{KubeSource, LIST_BATCH, SliceVersion};
use kipvs_proxier::source::store::Store;
use kube::client::Body;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

const NODE: &str = "test-node";

/// One scripted answer of the API server.
enum Reply {
    /// A list of `kind` (the item kind) at resource version `rv`.
    List(&'static str, Vec<Value>, &'static str),
    /// A page of a list of `kind` at `rv`, with the `continue` token of the next page.
    Page(&'static str, Vec<Value>, &'static str, &'static str),
    /// A watch stream: these events, then the end of the stream.
    Watch(Vec<Value>),
    /// An error status.
    Status(u16, &'static str),
    /// Discovery's resource list of a group version (`APIResourceList`) with these resources.
    Resources(&'static str, &'static [&'static str]),
}

/// A connection that fails (the API server is not there), as the HTTP stack reports it.
#[derive(Debug)]
struct Unreachable;

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("client error (Connect): connection refused")
    }
}

impl std::error::Error for Unreachable {}

/// The resources the source watches and the discovery documents it reads, by URL path.
const RESOURCES: [(&str, &str); 6] = [
    ("services", "/api/v1/services"),
    ("endpointslices", "/apis/discovery.k8s.io/v1/endpointslices"),
    (
        "endpointslices-v1beta1",
        "/apis/discovery.k8s.io/v1beta1/endpointslices",
    ),
    ("nodes", "/api/v1/nodes"),
    ("discovery-v1", "/apis/discovery.k8s.io/v1"),
    ("discovery-v1beta1", "/apis/discovery.k8s.io/v1beta1"),
];

/// A scripted API server: each resource answers its requests in order with the replies
/// pushed for it, waiting (like a quiet watch) while none is queued.
struct ApiServer {
    scripts: BTreeMap<&'static str, mpsc::UnboundedSender<Reply>>,
    /// Every request as `resource list|watch query`, in arrival order.
    log: Arc<Mutex<Vec<String>>>,
    /// When each request of `log` arrived.
    times: Arc<Mutex<Vec<Instant>>>,
    /// Until then every request fails to connect (nothing queued is consumed).
    down_until: Arc<Mutex<Option<Instant>>>,
}

impl ApiServer {
    fn start() -> (ApiServer, kube::Client) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut scripts = BTreeMap::new();
        let mut queues = BTreeMap::new();
        for (name, path) in RESOURCES {
            let (tx, rx) = mpsc::unbounded_channel();
            scripts.insert(name, tx);
            queues.insert(path, Arc::new(tokio::sync::Mutex::new(rx)));
        }
        let requests = log.clone();
        let times = Arc::new(Mutex::new(Vec::new()));
        let down_until: Arc<Mutex<Option<Instant>>> = Arc::default();
        let (arrivals, down) = (times.clone(), down_until.clone());
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let path = request.uri().path().to_owned();
                let query = request.uri().query().unwrap_or_default().to_owned();
                let (name, _) = RESOURCES
                    .iter()
                    .find(|(_, p)| *p == path)
                    .unwrap_or_else(|| panic!("unexpected request {path}"));
                let verb = if query.contains("watch=true") {
                    "watch"
                } else {
                    "list"
                };
                requests
                    .lock()
                    .unwrap()
                    .push(format!("{name} {verb} {query}"));
                arrivals.lock().unwrap().push(Instant::now());
                if down
                    .lock()
                    .unwrap()
                    .is_some_and(|until| Instant::now() < until)
                {
                    send.send_error(Unreachable);
                    continue;
                }
                let queue = queues[path.as_str()].clone();
                tokio::spawn(async move {
                    let Some(reply) = queue.lock().await.recv().await else {
                        return;
                    };
                    send.send_response(answer(reply));
                });
            }
        });
        let client = kube::Client::new(service, "default");
        let api = ApiServer {
            scripts,
            log,
            times,
            down_until,
        };
        (api, client)
    }

    fn push(&self, resource: &str, reply: Reply) {
        self.scripts[resource].send(reply).unwrap();
    }

    fn requests(&self, resource: &str) -> Vec<String> {
        self.timed_requests(resource)
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// The requests for `resource` with their arrival times.
    fn timed_requests(&self, resource: &str) -> Vec<(Instant, String)> {
        let log = self.log.lock().unwrap();
        let times = self.times.lock().unwrap();
        times
            .iter()
            .zip(log.iter())
            .filter(|(_, r)| r.split(' ').next() == Some(resource))
            .map(|(t, r)| (*t, r.clone()))
            .collect()
    }

    /// Every request fails to connect for `outage`.
    fn go_away(&self, outage: Duration) {
        *self.down_until.lock().unwrap() = Some(Instant::now() + outage);
    }
}

fn answer(reply: Reply) -> Response<Body> {
    let (code, body) = match reply {
        Reply::List(kind, items, rv) => {
            let list = json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items});
            (200, list.to_string())
        }
        Reply::Page(kind, items, rv, next) => {
            let metadata = json!({"resourceVersion": rv, "continue": next});
            let list =
                json!({"kind": kind, "apiVersion": "v1", "metadata": metadata, "items": items});
            (200, list.to_string())
        }
        Reply::Watch(events) => {
            let lines: Vec<String> = events.iter().map(|e| e.to_string() + "\n").collect();
            (200, lines.concat())
        }
        Reply::Status(code, reason) => (code, status(code, reason).to_string()),
        Reply::Resources(group_version, names) => {
            let resources: Vec<Value> = names
                .iter()
                .map(|name| {
                    json!({"name": name, "singularName": "", "namespaced": true,
                                   "kind": "EndpointSlice", "verbs": ["list", "watch"]})
                })
                .collect();
            let list = json!({"kind": "APIResourceList", "apiVersion": "v1",
                              "groupVersion": group_version, "resources": resources});
            (200, list.to_string())
        }
    };
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body.into_bytes()))
        .unwrap()
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("test: {reason}"), "reason": reason, "code": code})
}

fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

fn service(name: &str, ip: &str, rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
           "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

fn slice(service: &str, ip: &str, rv: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-1"), "namespace": "default", "resourceVersion": rv,
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

/// `slice` as a 1.20 API server returns it in `discovery.k8s.io/v1beta1`: the node in
/// `topology`, no `nodeName`.
fn slice_v1beta1(service: &str, ip: &str, node: &str, rv: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-1"), "namespace": "default", "resourceVersion": rv,
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [ip], "conditions": {"ready": true},
                          "topology": {"kubernetes.io/hostname": node,
                                       "topology.kubernetes.io/zone": "zone-a"}}],
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

fn node(rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "resourceVersion": rv}})
}

/// The source, its handle, the API double and an engine over the fake dataplane.
struct Fixture {
    api: ApiServer,
    handle: SourceHandle,
    metrics: Metrics,
    engine: Engine<FakeDataplane>,
}

/// The fixture of an API server that serves `discovery.k8s.io/v1` EndpointSlices.
fn fixture() -> Fixture {
    let f = fixture_without_discovery();
    f.api.push(
        "discovery-v1",
        Reply::Resources("discovery.k8s.io/v1", &["endpointslices"]),
    );
    f
}

/// The fixture, with no discovery answer queued: the EndpointSlice watch waits for one.
fn fixture_without_discovery() -> Fixture {
    let (api, client) = ApiServer::start();
    let metrics = Metrics::new();
    let handle = SourceHandle::gated().with_observer(Arc::new(metrics.clone()));
    let source = KubeSource {
        client,
        node_name: NODE.into(),
    };
    tokio::spawn(source.run(handle.clone()));
    let identity = NodeIdentity {
        name: NODE.into(),
        node_ips: vec![],
    };
    let planner = Planner::new(identity, ProxierConfiguration::default());
    let engine = Engine::new(handle.clone(), planner, FakeDataplane::default());
    Fixture {
        api,
        handle,
        metrics,
        engine,
    }
}

impl Fixture {
    fn services(&self) -> Vec<String> {
        let store = self.handle.read();
        store
            .services()
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    /// Wait (in virtual time, up to two minutes) until `check` holds for the store.
    async fn until(&self, what: &str, check: impl Fn(&Store) -> bool) {
        for _ in 0..12_000 {
            if check(&self.handle.read()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "timed out waiting for {what}; requests: {:?}",
            self.api.log.lock().unwrap()
        );
    }

    /// Wait until `resource` has received `n` requests (up to two minutes of virtual time:
    /// the watcher backs off up to 60 s between retries after errors the server answers).
    async fn requests(&self, resource: &str, n: usize) {
        for _ in 0..12_000 {
            if self.api.requests(resource).len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "{resource} got fewer than {n} requests: {:?}",
            self.api.requests(resource)
        );
    }

    /// Answer the next Service list with `web` (unchanged) and `cache` (new, at `rv`), and wait
    /// until that list replaced the Services.
    async fn relist_web_and_cache(&self, rv: &'static str) {
        let listed = vec![
            service("web", "10.96.0.10", "1"),
            service("cache", "10.96.0.13", rv),
        ];
        self.api
            .push("services", Reply::List("ServiceList", listed, rv));
        self.until("the relist", |s| {
            s.service(&("default".into(), "cache".into())).is_some()
        })
        .await;
        assert_eq!(self.services(), ["cache", "web"]);
    }

    fn virtual_servers(&self) -> usize {
        self.engine.dataplane().state.virtual_servers.len()
    }
}

#[tokio::test(start_paused = true)]
async fn relist_after_410_replaces_and_an_outage_deletes_nothing() {
    let f = fixture();
    f.api.push(
        "services",
        Reply::List(
            "ServiceList",
            vec![
                service("web", "10.96.0.10", "1"),
                service("db", "10.96.0.11", "1"),
            ],
            "1",
        ),
    );
    f.api.push(
        "endpointslices",
        Reply::List(
            "EndpointSliceList",
            vec![slice("web", "10.244.1.2", "1")],
            "1",
        ),
    );
    f.until("the first Service list", |s| s.service_count() == 2)
        .await;
    f.requests("endpointslices", 2).await; // listed, now watching
    assert!(!f.handle.is_ready(), "ready before the Node was listed");
    f.api
        .push("nodes", Reply::List("NodeList", vec![node("1")], "1"));
    f.until("the Node", |s| s.node().is_some()).await;
    let mut f = f;
    tokio::time::timeout(Duration::from_secs(5), f.handle.wait_ready())
        .await
        .expect("ready");

    // kube-proxy's selectors, and the own Node only.
    let first = &f.api.requests("services")[0];
    assert!(first.contains("labelSelector=%21service.kubernetes.io%2Fservice-proxy-name%2C%21service.kubernetes.io%2Fheadless"), "{first}");
    let first = &f.api.requests("nodes")[0];
    assert!(
        first.contains("fieldSelector=metadata.name%3Dtest-node"),
        "{first}"
    );

    f.engine.sync().await.unwrap();
    assert_eq!(f.virtual_servers(), 2);

    // Watch events, then 410 Gone: the watcher lists again, and the relist replaces the
    // Services (api, added then, is gone; cache is new; web unchanged).
    f.api.push(
        "services",
        Reply::Watch(vec![
            event("ADDED", service("api", "10.96.0.12", "2")),
            event("DELETED", service("db", "10.96.0.11", "3")),
            json!({"type": "ERROR", "object": status(410, "Expired")}),
        ]),
    );
    f.until("the watch events", |s| {
        s.service_count() == 2 && s.service(&("default".into(), "api".into())).is_some()
    })
    .await;
    assert_eq!(f.services(), ["api", "web"]);
    f.relist_web_and_cache("5").await;
    let verbs: Vec<String> = f
        .api
        .requests("services")
        .iter()
        .map(|r| r.split(' ').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(verbs, ["list", "watch", "list", "watch"]);
    let report = f.engine.sync().await.unwrap();
    assert!(report.ops.iter().any(
        |op| matches!(op, Op::AddVirtualServer(k, _) if k.address.to_string() == "10.96.0.13")
    ));
    assert_eq!(f.virtual_servers(), 2);

    // An outage: every request fails for a while. The store keeps everything and syncs
    // during the outage delete nothing.
    for resource in ["services", "endpointslices", "nodes"] {
        for _ in 0..3 {
            f.api
                .push(resource, Reply::Status(503, "ServiceUnavailable"));
        }
    }
    let before = f.api.requests("services").len();
    f.requests("services", before + 3).await;
    f.requests("endpointslices", 5).await;
    f.requests("nodes", 5).await;
    let applied = f.engine.dataplane().applied.len();
    let report = f.engine.sync().await.unwrap();
    assert!(report.ops.is_empty(), "{:?}", report.ops);
    assert_eq!(f.engine.dataplane().applied.len(), applied);
    assert_eq!(f.services(), ["cache", "web"]);
    {
        let store = f.handle.read();
        assert_eq!(store.slices_of(&("default".into(), "web".into())).len(), 1);
        assert!(store.node().is_some());
    }

    // Back: the watch resumes from the last resource version.
    f.api.push(
        "services",
        Reply::Watch(vec![event("DELETED", service("cache", "10.96.0.13", "6"))]),
    );
    f.until("the resumed watch", |s| s.service_count() == 1)
        .await;
    let last = f.api.requests("services");
    assert!(
        last.iter()
            .rev()
            .nth(1)
            .unwrap()
            .contains("resourceVersion=5"),
        "{last:?}"
    );
    f.engine.sync().await.unwrap();
    assert_eq!(f.virtual_servers(), 1);
}

/// A relist whose second page fails changes nothing: no sync sees half a list (its first page,
/// more Services than the source converts at a time, is not in the store, and nothing the page
/// lacked is deleted); the next complete list replaces the Services at once. client-go's
/// informers do the same (a relist is one `Replace`).
#[tokio::test(start_paused = true)]
async fn a_relist_that_breaks_off_changes_nothing() {
    let f = fixture();
    let listed = vec![
        service("web", "10.96.0.10", "1"),
        service("db", "10.96.0.11", "1"),
    ];
    f.api
        .push("services", Reply::List("ServiceList", listed, "1"));
    f.api.push(
        "endpointslices",
        Reply::List("EndpointSliceList", vec![], "1"),
    );
    f.api
        .push("nodes", Reply::List("NodeList", vec![node("1")], "1"));
    tokio::time::timeout(Duration::from_secs(5), f.handle.wait_ready())
        .await
        .expect("ready");
    assert_eq!(f.services(), ["db", "web"]);
    let changes = f.handle.read().change_totals();

    // The watch expires; the relist's first page holds more Services than the source converts
    // at a time, its second page fails.
    f.api.push(
        "services",
        Reply::Watch(vec![
            json!({"type": "ERROR", "object": status(410, "Expired")}),
        ]),
    );
    let page: Vec<Value> = (0..LIST_BATCH + 100)
        .map(|i| {
            service(
                &format!("svc-{i:03}"),
                &format!("10.96.{}.{}", 1 + i / 200, i % 200),
                "7",
            )
        })
        .collect();
    f.api
        .push("services", Reply::Page("ServiceList", page, "7", "next"));
    f.api.push("services", Reply::Status(500, "InternalError"));
    f.requests("services", 4).await; // list, watch, the relist's two pages
    let second = &f.api.requests("services")[3];
    assert!(second.contains("continue=next"), "{second}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(f.services(), ["db", "web"], "half a list reached the store");
    assert_eq!(f.handle.read().change_totals(), changes);

    // The list again, complete: it replaces the Services at once.
    f.relist_web_and_cache("9").await;
}

/// `kipvs_api_resource_unavailable` of the EndpointSlices in `version`.
fn unavailable(metrics: &Metrics, version: SliceVersion) -> Option<f64> {
    let resource = version.resource();
    let name = format!("kipvs_api_resource_unavailable{{resource=\"{resource}\"}}");
    metrics::sample(&metrics.encode(), &name)
}

/// The address of each endpoint of Service `web`'s slices, and its node.
fn web_endpoints(store: &Store) -> Vec<(Option<EndpointAddress>, Option<String>)> {
    let slices = store.slices_of(&("default".into(), "web".into()));
    let endpoints = slices.iter().flat_map(|slice| slice.endpoints.iter());
    endpoints
        .map(|e| (e.address.clone(), e.node_name.as_deref().map(str::to_owned)))
        .collect()
}

fn ip(text: &str) -> Option<EndpointAddress> {
    Some(EndpointAddress::Ip(text.parse().unwrap()))
}

/// Kubernetes 1.20: discovery has EndpointSlices in `discovery.k8s.io/v1beta1` only. They are
/// listed and watched there and reach the store as their v1 equivalents (the node from
/// `topology`); nothing is reported missing. When that watch answers 404 (the API server was
/// upgraded past 1.24), it is reported, discovery is asked again, and the v1 EndpointSlices
/// replace them.
#[tokio::test(start_paused = true)]
async fn endpoint_slices_from_v1beta1_where_v1_is_not_served() {
    let mut f = fixture_without_discovery();
    f.api.push("discovery-v1", Reply::Status(404, "NotFound"));
    f.api.push(
        "discovery-v1beta1",
        Reply::Resources("discovery.k8s.io/v1beta1", &["endpointslices"]),
    );
    f.api.push(
        "services",
        Reply::List("ServiceList", vec![service("web", "10.96.0.10", "1")], "1"),
    );
    f.api
        .push("nodes", Reply::List("NodeList", vec![node("1")], "1"));
    f.api.push(
        "endpointslices-v1beta1",
        Reply::List(
            "EndpointSliceList",
            vec![slice_v1beta1("web", "10.244.1.2", NODE, "1")],
            "1",
        ),
    );
    tokio::time::timeout(Duration::from_secs(5), f.handle.wait_ready())
        .await
        .expect("ready");
    assert_eq!(
        web_endpoints(&f.handle.read()),
        [(ip("10.244.1.2"), Some(NODE.to_owned()))]
    );
    let first = &f.api.requests("endpointslices-v1beta1")[0];
    assert!(first.contains("labelSelector=%21service.kubernetes.io%2Fservice-proxy-name%2C%21service.kubernetes.io%2Fheadless"), "{first}");
    assert_eq!(f.api.requests("endpointslices"), Vec::<String>::new());
    for version in SliceVersion::ALL {
        assert_ne!(unavailable(&f.metrics, version), Some(1.0), "{version:?}");
    }
    f.engine.sync().await.unwrap();
    let vs = &f.engine.dataplane().state.virtual_servers;
    assert_eq!(
        vs.values().map(|vs| vs.real_servers.len()).sum::<usize>(),
        1
    );

    // Watch events arrive in v1beta1 too.
    f.api.push(
        "endpointslices-v1beta1",
        Reply::Watch(vec![event(
            "MODIFIED",
            slice_v1beta1("web", "10.244.1.3", "other-node", "2"),
        )]),
    );
    f.until("the v1beta1 watch event", |s| {
        web_endpoints(s) == [(ip("10.244.1.3"), Some("other-node".to_owned()))]
    })
    .await;

    // Upgraded past 1.24: v1beta1 is gone, v1 is there.
    f.api
        .push("endpointslices-v1beta1", Reply::Status(404, "NotFound"));
    f.requests("discovery-v1", 2).await;
    assert_eq!(unavailable(&f.metrics, SliceVersion::V1beta1), Some(1.0));
    assert_eq!(
        web_endpoints(&f.handle.read()),
        [(ip("10.244.1.3"), Some("other-node".to_owned()))],
        "the last EndpointSlices listed stay"
    );
    f.api.push(
        "discovery-v1",
        Reply::Resources("discovery.k8s.io/v1", &["endpointslices"]),
    );
    f.api.push(
        "endpointslices",
        Reply::List(
            "EndpointSliceList",
            vec![slice("web", "10.244.1.4", "3")],
            "3",
        ),
    );
    f.until("the v1 EndpointSlices", |s| {
        web_endpoints(s) == [(ip("10.244.1.4"), None)]
    })
    .await;
    assert_eq!(unavailable(&f.metrics, SliceVersion::V1beta1), Some(0.0));
    assert_ne!(unavailable(&f.metrics, SliceVersion::V1), Some(1.0));
}

/// An API server that serves EndpointSlices in neither version (discovery answers 404 for
/// both): reported under v1's name, Services program without endpoints, and discovery is asked
/// again until a version is served, whose EndpointSlices are then listed.
#[tokio::test(start_paused = true)]
async fn endpoint_slices_served_in_neither_version_are_reported_and_services_still_program() {
    let mut f = fixture_without_discovery();
    f.api.push(
        "services",
        Reply::List("ServiceList", vec![service("web", "10.96.0.10", "1")], "1"),
    );
    f.api
        .push("nodes", Reply::List("NodeList", vec![node("1")], "1"));
    for _ in 0..3 {
        f.api.push("discovery-v1", Reply::Status(404, "NotFound"));
        f.api
            .push("discovery-v1beta1", Reply::Status(404, "NotFound"));
    }
    tokio::time::timeout(Duration::from_secs(5), f.handle.wait_ready())
        .await
        .expect("ready without EndpointSlices");
    assert_eq!(unavailable(&f.metrics, SliceVersion::V1), Some(1.0));
    f.engine.sync().await.unwrap();
    let vs = &f.engine.dataplane().state.virtual_servers;
    assert_eq!(vs.len(), 1);
    assert!(vs.values().all(|vs| vs.real_servers.is_empty()));

    // It keeps asking, and picks the EndpointSlices up once they are served.
    f.requests("discovery-v1beta1", 3).await;
    assert_eq!(unavailable(&f.metrics, SliceVersion::V1), Some(1.0));
    assert_eq!(f.api.requests("endpointslices"), Vec::<String>::new());
    f.api.push(
        "discovery-v1",
        Reply::Resources("discovery.k8s.io/v1", &["endpointslices"]),
    );
    f.api.push(
        "endpointslices",
        Reply::List(
            "EndpointSliceList",
            vec![slice("web", "10.244.1.2", "2")],
            "2",
        ),
    );
    f.until("the EndpointSlices", |s| {
        s.slices_of(&("default".into(), "web".into())).len() == 1
    })
    .await;
    assert_eq!(unavailable(&f.metrics, SliceVersion::V1), Some(0.0));
    f.engine.sync().await.unwrap();
    let vs = &f.engine.dataplane().state.virtual_servers;
    assert_eq!(
        vs.values().map(|vs| vs.real_servers.len()).sum::<usize>(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn watches_back_off_while_the_api_server_is_away_and_resume_within_seconds() {
    let mut f = fixture();
    f.api.push(
        "services",
        Reply::List("ServiceList", vec![service("web", "10.96.0.10", "1")], "1"),
    );
    f.api.push(
        "endpointslices",
        Reply::List(
            "EndpointSliceList",
            vec![slice("web", "10.244.1.2", "1")],
            "1",
        ),
    );
    f.api
        .push("nodes", Reply::List("NodeList", vec![node("1")], "1"));
    tokio::time::timeout(Duration::from_secs(5), f.handle.wait_ready())
        .await
        .expect("ready");
    f.engine.sync().await.unwrap();
    f.requests("services", 2).await; // listed, now watching

    // The API server goes away for 40 s: the Service watch ends, and every attempt to watch
    // again fails to connect.
    let outage = Duration::from_secs(40);
    f.api.go_away(outage);
    let down = Instant::now();
    f.api.push("services", Reply::Watch(vec![]));
    // Once back, it answers the watch from the old resource version with 410 Gone (as a
    // restarted API server does), then the relist with a changed Service.
    f.api.push(
        "services",
        Reply::Watch(vec![
            json!({"type": "ERROR", "object": status(410, "Expired")}),
        ]),
    );
    f.api.push(
        "services",
        Reply::List("ServiceList", vec![service("api", "10.96.0.12", "7")], "7"),
    );
    f.until("the relist after the outage", |s| {
        s.service(&("default".into(), "api".into())).is_some()
    })
    .await;
    let back = down + outage;

    let services = f.api.timed_requests("services");
    // Resumed within a few seconds of the API server's return: the first attempt after it
    // (at most 6 s later) gets the 410, and the relist follows at once (at most 1.6 s).
    let relist = services
        .iter()
        .rev()
        .find(|(_, r)| r.contains(" list "))
        .unwrap()
        .0;
    assert!(
        relist > back && relist - back <= Duration::from_secs(8),
        "relisted {:?} after the API server came back: {services:?}",
        relist - back
    );
    let during: Vec<Instant> = services
        .iter()
        .filter(|(t, _)| *t > down && *t < back)
        .map(|(t, _)| *t)
        .collect();
    // Backoff: not an attempt a second (nor a busy loop), but still trying every few seconds.
    assert!(
        (6..=20).contains(&during.len()),
        "{} attempts in a 40 s outage: {services:?}",
        during.len()
    );
    let longest = during.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(longest <= Duration::from_secs(6), "a wait of {longest:?}");
    // Nothing was deleted meanwhile; the relist replaced the Services.
    let report = f.engine.sync().await.unwrap();
    assert!(report.ops.iter().any(
        |op| matches!(op, Op::AddVirtualServer(k, _) if k.address.to_string() == "10.96.0.12")
    ));
    assert_eq!(f.services(), ["api"]);
}
