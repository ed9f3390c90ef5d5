//! The controller's API calls, against a scripted API server (tower-test): what a reconcile
//! writes, in which order, with which bodies; that unconfirmed writes are not repeated; and the
//! Lease protocol of leader election.

use futures::StreamExt;
use http::{Request, Response};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{NodeProxyConfig, ProxyConfig, ProxyConfigSpec, RolloutSpec, Stage};
use kipvs_operator::controller::{Context, reconcile, reconcile_stored};
use kipvs_operator::lease::{Elector, LeaseConfig};
use kipvs_operator::metrics::Metrics;
use kipvs_operator::sim::{Fleet, node, proxy_config};
use kipvs_operator::stored::StoredProxyConfig;
use kipvs_operator::writer::Writer;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tower_test::mock::{Handle, SendResponse};

type ApiServer = Handle<Request<Body>, Response<Body>>;

fn mock() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// kube-proxy's DaemonSet, which a reconcile reads at most every 30 s.
const KUBE_PROXY_DAEMONSET: &str = "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy";

/// The next request: asserts method and path (and query parts), returns its JSON body and the
/// responder. A read of kube-proxy's DaemonSet before it is answered 404 (no kube-proxy
/// DaemonSet: the decision goes by the proxiers' reports), unless it is the one expected.
async fn expect(
    server: &mut ApiServer,
    method: &str,
    path: &str,
    query: &[&str],
) -> (Value, SendResponse<Response<Body>>) {
    let (request, send) = loop {
        let (request, send) = tokio::time::timeout(Duration::from_secs(60), server.next_request())
            .await
            .unwrap_or_else(|_| panic!("no request; expected {method} {path}"))
            .expect("client dropped");
        if request.uri().path() == KUBE_PROXY_DAEMONSET && path != KUBE_PROXY_DAEMONSET {
            assert_eq!(request.method().as_str(), "GET");
            respond(send, 404, &status(404, "NotFound"));
            continue;
        }
        break (request, send);
    };
    assert_eq!(request.method().as_str(), method, "{}", request.uri());
    assert_eq!(request.uri().path(), path);
    let uri = request.uri().to_string();
    for part in query {
        assert!(uri.contains(part), "{uri} lacks {part}");
    }
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (body, send)
}

/// The next request must be a server-side apply (forced, as the operator's field manager) to
/// `path`.
async fn expect_apply_to(
    server: &mut ApiServer,
    path: &str,
) -> (Value, SendResponse<Response<Body>>) {
    expect(
        server,
        "PATCH",
        path,
        &["fieldManager=kipvs-operator", "force=true"],
    )
    .await
}

/// The next request must be the status write of ProxyConfig `name`.
async fn expect_status(
    server: &mut ApiServer,
    name: &str,
) -> (Value, SendResponse<Response<Body>>) {
    expect_apply_to(
        server,
        &format!("/apis/kipvs.io/v1alpha1/proxyconfigs/{name}/status"),
    )
    .await
}

/// The next request must be the write of NodeProxyConfig `node`.
async fn expect_apply(server: &mut ApiServer, node: &str) -> (Value, SendResponse<Response<Body>>) {
    expect_apply_to(
        server,
        &format!("/apis/kipvs.io/v1alpha1/nodeproxyconfigs/{node}"),
    )
    .await
}

/// The next request must create an Event.
async fn expect_event(server: &mut ApiServer) -> (Value, SendResponse<Response<Body>>) {
    expect(server, "POST", "/api/v1/namespaces/default/events", &[]).await
}

fn respond(send: SendResponse<Response<Body>>, code: u16, body: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap(),
    );
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason})
}

fn ready_store<K>(objects: Vec<K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    std::mem::forget(writer); // a dropped writer would make the store "never ready"
    store
}

fn canary_spec() -> ProxyConfigSpec {
    ProxyConfigSpec {
        rollout: RolloutSpec {
            stages: vec![Stage {
                name: "canary".into(),
                node_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("canary".to_owned(), "yes".to_owned())])),
                    ..LabelSelector::default()
                }),
                ..Stage::rest()
            }],
            ..RolloutSpec::default()
        },
        ..ProxyConfigSpec::default()
    }
}

/// A context over these stores whose writer is not started (a test starts it when it expects
/// the NodeProxyConfig writes, so that they come in a known order).
fn context_over(
    client: Client,
    proxy_configs: Store<StoredProxyConfig>,
    nodes: Store<Node>,
    npcs: Store<NodeProxyConfig>,
) -> Arc<Context> {
    let (writer, _) = Writer::new(client.clone(), Metrics::new(), None);
    Arc::new(Context::new(
        client,
        "operator-0",
        proxy_configs,
        nodes,
        npcs,
        writer,
    ))
}

fn context(
    client: Client,
    pc: &ProxyConfig,
    nodes: Vec<Node>,
    npcs: Vec<NodeProxyConfig>,
) -> Arc<Context> {
    context_over(
        client,
        ready_store(vec![StoredProxyConfig::from(pc.clone())]),
        ready_store(nodes),
        ready_store(npcs),
    )
}

/// The Degraded condition of a status write's body.
fn degraded(body: &Value) -> Value {
    body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap()
        .clone()
}

/// Fails if a request comes within `wait`.
async fn no_request(server: &mut ApiServer, wait: Duration, after: &str) {
    if let Ok(Some((request, _))) = tokio::time::timeout(wait, server.next_request()).await {
        let method = request.method().clone();
        let uri = request.uri().clone();
        let body = request.into_body().collect_bytes().await.unwrap();
        panic!("{after}: {method} {uri} {}", String::from_utf8_lossy(&body));
    }
}

/// A reconcile decides, hands the canary's write to the writer, writes the status, publishes
/// the Event and returns without waiting for the write; the writer then applies it.
#[tokio::test]
async fn first_reconcile_writes_the_status_and_an_event_and_the_writer_the_canary() {
    let (client, mut server) = mock();
    let mut pc = proxy_config("fleet", canary_spec());
    pc.metadata.resource_version = Some("7".into());
    let ctx = context(
        client,
        &pc,
        vec![node("a", &[("canary", "yes")]), node("b", &[])],
        vec![],
    );
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx.clone()));

    let (body, send) = expect_status(&mut server, "fleet").await;
    let written = body["status"].clone();
    assert_eq!(written["stage"], "canary");
    let revision = written["revision"].as_str().unwrap().to_owned();
    assert_eq!(written["totalNodes"], 2);
    respond(send, 200, &serde_json::to_value(&pc).unwrap());

    let (event, send) = expect_event(&mut server).await;
    assert_eq!(event["reason"], "StageStarted");
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["involvedObject"]["kind"], "ProxyConfig");
    assert_eq!(event["involvedObject"]["name"], "fleet");
    respond(send, 201, &event);

    let action = task.await.unwrap().unwrap();
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(300)),
        "the apply timeout"
    );

    let _workers = ctx.writer().start(4);
    let (body, send) = expect_apply(&mut server, "a").await;
    assert_eq!(body["kind"], "NodeProxyConfig");
    assert_eq!(body["metadata"]["ownerReferences"][0]["name"], "fleet");
    assert_eq!(body["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-fleet");
    assert!(
        body.get("status").is_none(),
        "the operator never writes status: {body}"
    );
    assert_eq!(body["spec"]["revision"], revision.as_str());
    assert_eq!(body["spec"]["config"]["ipvs"]["syncPeriod"], "30s");
    // Also owned by its Node (the garbage collector removes it with the Node).
    assert_eq!(body["metadata"]["ownerReferences"][1]["kind"], "Node");
    assert_eq!(body["metadata"]["ownerReferences"][1]["uid"], "uid-node-a");
    // The controller and the simulation write one object: Write::node_proxy_config.
    let mut fleet = Fleet::new(
        pc.clone(),
        [node("a", &[("canary", "yes")]), node("b", &[])],
    );
    let decision = fleet.step();
    let simulated = serde_json::to_value(&fleet.npcs["a"]).unwrap();
    let shared = serde_json::to_value(
        decision.writes[0]
            .node_proxy_config(&fleet.owner_reference(), fleet.now)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(simulated, shared);
    let mut sent = body.clone();
    sent["spec"]["assignedAt"] = shared["spec"]["assignedAt"].clone();
    assert_eq!(
        sent, shared,
        "the controller applies Write::node_proxy_config"
    );
    respond(send, 200, &body);

    // The stores have not seen either write yet: a second reconcile must not repeat them.
    let again = tokio::spawn(reconcile(Arc::new(pc), ctx));
    no_request(&mut server, Duration::from_secs(2), "second reconcile").await;
    assert!(again.await.unwrap().is_ok());
}

#[tokio::test]
async fn unselected_nodes_are_deleted_and_an_already_deleted_one_is_fine() {
    let (client, mut server) = mock();
    let mut pc = proxy_config("fleet", ProxyConfigSpec::default());
    pc.spec.node_selector = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("os".to_owned(), "linux".to_owned())])),
        ..LabelSelector::default()
    });
    let mut npc = NodeProxyConfig::new(
        "gone",
        kipvs_crds::NodeProxyConfigSpec {
            revision: "r".into(),
            assigned_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
            config: Default::default(),
        },
    );
    npc.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "kipvs.io/v1alpha1".into(),
            kind: "ProxyConfig".into(),
            name: "fleet".into(),
            uid: "uid-fleet".into(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    let ctx = context(client, &pc, vec![node("gone", &[])], vec![npc]);
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx.clone()));
    // No node left: the rollout does not start (a revision is never good on no node), and
    // the ProxyConfig says so.
    let (body, send) = expect_status(&mut server, "fleet").await;
    assert_eq!(body["status"]["totalNodes"], 0);
    let progressing = body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Progressing")
        .unwrap();
    assert_eq!(progressing["reason"], "NoNodes");
    assert!(body["status"].get("lastGoodRevision").is_none());
    respond(send, 200, &serde_json::to_value(&pc).unwrap());
    for reason in ["NoNodes"] {
        let (event, send) = expect_event(&mut server).await;
        assert_eq!(event["reason"], reason);
        respond(send, 201, &event);
    }
    task.await.unwrap().unwrap();
    let _workers = ctx.writer().start(1);
    let (_, send) = expect(
        &mut server,
        "DELETE",
        "/apis/kipvs.io/v1alpha1/nodeproxyconfigs/gone",
        &[],
    )
    .await;
    respond(send, 404, &status(404, "NotFound"));
    // Already gone is done: not retried.
    no_request(&mut server, Duration::from_millis(500), "after the delete").await;
}

/// A failed write does not fail the reconcile: the writer retries the same object with
/// backoff, the ProxyConfig whose write fails is reconciled and reports it (Degraded
/// WriteFailed), and again once it succeeds.
#[tokio::test]
async fn a_failed_write_is_retried_with_the_same_object_and_reported_on_the_proxyconfig() {
    let (client, mut server) = mock();
    let pc = proxy_config("fleet", canary_spec());
    let (writer, mut triggers) = Writer::new(client.clone(), Metrics::new(), None);
    let ctx = Arc::new(Context::new(
        client,
        "operator-0",
        ready_store(vec![StoredProxyConfig::from(pc.clone())]),
        ready_store(vec![node("a", &[("canary", "yes")])]),
        ready_store(vec![]),
        writer,
    ));
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx.clone()));
    let (_, send) = expect_status(&mut server, "fleet").await;
    respond(send, 200, &serde_json::to_value(&pc).unwrap());
    let (_, send) = expect_event(&mut server).await;
    respond(send, 201, &json!({}));
    task.await.unwrap().unwrap();

    let _workers = ctx.writer().start(1);
    let (first, send) = expect_apply(&mut server, "a").await;
    respond(send, 500, &status(500, "InternalError"));
    let trigger = tokio::time::timeout(Duration::from_secs(2), triggers.next())
        .await
        .expect("the failing write triggers a reconcile")
        .unwrap();
    assert_eq!(trigger.name, "fleet");
    // The reconcile it triggers reports the failing write and does not queue it twice.
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx.clone()));
    let (body, send) = expect_status(&mut server, "fleet").await;
    let condition = degraded(&body);
    assert_eq!(condition["reason"], "WriteFailed", "{condition}");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("1 write(s) failing"),
        "{condition}"
    );
    respond(send, 200, &serde_json::to_value(&pc).unwrap());
    task.await.unwrap().unwrap();
    // The retry, after the backoff: the same object (assignedAt included).
    let (second, send) = expect_apply(&mut server, "a").await;
    assert_eq!(first, second);
    respond(send, 200, &second);
    let trigger = tokio::time::timeout(Duration::from_secs(2), triggers.next())
        .await
        .expect("a write no longer failing triggers a reconcile")
        .unwrap();
    assert_eq!(trigger.name, "fleet");
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx));
    let (body, send) = expect_status(&mut server, "fleet").await;
    assert_eq!(degraded(&body)["reason"], "AsExpected");
    respond(send, 200, &serde_json::to_value(&pc).unwrap());
    task.await.unwrap().unwrap();
    no_request(&mut server, Duration::from_millis(500), "after the retry").await;
}

/// Events are the transitions from the previous status: they are published only once the
/// status recording them is written, so a lost status write does not repeat them.
#[tokio::test]
async fn a_lost_status_write_publishes_no_event_and_the_retry_publishes_it_once() {
    let (client, mut server) = mock();
    let pc = proxy_config("fleet", canary_spec());
    let ctx = context(client, &pc, vec![node("a", &[("canary", "yes")])], vec![]);
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx.clone()));
    let (_, send) = expect_status(&mut server, "fleet").await;
    respond(send, 500, &status(500, "InternalError"));
    let error = task.await.unwrap().unwrap_err();
    assert!(error.to_string().contains("status"), "{error}");
    no_request(
        &mut server,
        Duration::from_millis(500),
        "after a lost status write",
    )
    .await;

    // The retry: the status is written, then the Event, once (the node's write is the
    // writer's, queued once).
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx.clone()));
    let (_, send) = expect_status(&mut server, "fleet").await;
    respond(send, 200, &serde_json::to_value(&pc).unwrap());
    let (event, send) = expect_event(&mut server).await;
    assert_eq!(event["reason"], "StageStarted");
    respond(send, 201, &event);
    task.await.unwrap().unwrap();
    no_request(&mut server, Duration::from_millis(500), "a second Event").await;
    let _workers = ctx.writer().start(1);
    let (body, send) = expect_apply(&mut server, "a").await;
    respond(send, 200, &body);
    no_request(&mut server, Duration::from_millis(500), "a second write").await;
}

fn lease(holder: &str, renewed: Timestamp, transitions: i32) -> Value {
    serde_json::to_value(Lease {
        metadata: ObjectMeta {
            name: Some("kipvs-operator".into()),
            namespace: Some("kipvs-system".into()),
            resource_version: Some("5".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            acquire_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    })
    .unwrap()
}

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kipvs-system/leases/kipvs-operator";

fn elector(client: Client, identity: &str) -> Elector {
    Elector::new(
        Api::namespaced(client, "kipvs-system"),
        LeaseConfig::new("kipvs-operator", identity),
    )
}

#[tokio::test]
async fn a_missing_lease_is_created() {
    let (client, mut server) = mock();
    let task = tokio::spawn(async move { elector(client, "me").try_acquire_or_renew().await });
    let (_, send) = expect(&mut server, "GET", LEASE, &[]).await;
    respond(send, 404, &status(404, "NotFound"));
    let (body, send) = expect(
        &mut server,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/kipvs-system/leases",
        &[],
    )
    .await;
    assert_eq!(body["spec"]["holderIdentity"], "me");
    assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
    respond(send, 201, &body);
    assert!(task.await.unwrap().unwrap());
}

#[tokio::test]
async fn a_live_lease_of_another_is_left_alone_and_a_race_is_lost_quietly() {
    let (client, mut server) = mock();
    let task = tokio::spawn(async move { elector(client, "me").try_acquire_or_renew().await });
    let (_, send) = expect(&mut server, "GET", LEASE, &[]).await;
    respond(send, 200, &lease("other", Timestamp::now(), 3));
    assert!(!task.await.unwrap().unwrap(), "held by another");

    // A free lease (empty holder) is taken; a concurrent taker makes the update conflict.
    let (client, mut server) = mock();
    let task = tokio::spawn(async move { elector(client, "me").try_acquire_or_renew().await });
    let (_, send) = expect(&mut server, "GET", LEASE, &[]).await;
    respond(send, 200, &lease("", Timestamp::now(), 3));
    let (body, send) = expect(&mut server, "PUT", LEASE, &[]).await;
    assert_eq!(
        body["metadata"]["resourceVersion"], "5",
        "optimistic concurrency"
    );
    assert_eq!(body["spec"]["holderIdentity"], "me");
    assert_eq!(body["spec"]["leaseTransitions"], 4);
    respond(send, 409, &status(409, "Conflict"));
    assert!(!task.await.unwrap().unwrap());
}

#[tokio::test]
async fn the_holder_renews_without_a_transition() {
    let (client, mut server) = mock();
    let before = Timestamp::now();
    let task = tokio::spawn(async move { elector(client, "me").try_acquire_or_renew().await });
    let (_, send) = expect(&mut server, "GET", LEASE, &[]).await;
    respond(send, 200, &lease("me", before, 2));
    let (body, send) = expect(&mut server, "PUT", LEASE, &[]).await;
    assert_eq!(body["spec"]["holderIdentity"], "me");
    assert_eq!(body["spec"]["leaseTransitions"], 2);
    assert_eq!(
        body["spec"]["acquireTime"],
        lease("me", before, 2)["spec"]["acquireTime"]
    );
    respond(send, 200, &body);
    assert!(task.await.unwrap().unwrap());
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_of_another_is_taken_over() {
    let (client, mut server) = mock();
    let task = tokio::spawn(async move {
        let mut elector = elector(client, "me");
        let first = elector.try_acquire_or_renew().await.unwrap();
        // Its record does not change for longer than the lease duration (on our clock).
        tokio::time::sleep(Duration::from_secs(16)).await;
        (first, elector.try_acquire_or_renew().await.unwrap())
    });
    let stale = lease("crashed", Timestamp::now(), 1);
    let (_, send) = expect(&mut server, "GET", LEASE, &[]).await;
    respond(send, 200, &stale);
    let (_, send) = expect(&mut server, "GET", LEASE, &[]).await;
    respond(send, 200, &stale);
    let (body, send) = expect(&mut server, "PUT", LEASE, &[]).await;
    assert_eq!(body["spec"]["holderIdentity"], "me");
    assert_eq!(body["spec"]["leaseTransitions"], 2);
    respond(send, 200, &body);
    assert_eq!(task.await.unwrap(), (false, true));
}

/// Issue 23: the renew deadline bounds the whole series of renewal attempts, as client-go's
/// does, not each attempt: after four quick failures an attempt that hangs ends leadership
/// `retry_period + renew_deadline` (12 s) after the last renewal, before another candidate may
/// take the Lease (15 s after it saw that renewal). Bounded per attempt, it ended at 20 s.
#[tokio::test(start_paused = true)]
async fn the_renew_deadline_bounds_the_whole_series_of_attempts() {
    let (client, mut server) = mock();
    let renewed = tokio::time::Instant::now();
    let task = tokio::spawn(async move {
        elector(client, "me").hold().await;
        renewed.elapsed()
    });
    for _ in 0..4 {
        let (_, send) = expect(&mut server, "GET", LEASE, &[]).await;
        respond(send, 500, &status(500, "InternalError"));
    }
    let (_, hung) = expect(&mut server, "GET", LEASE, &[]).await;
    let lost_after = task.await.unwrap();
    drop(hung);
    assert_eq!(lost_after, Duration::from_secs(12));
}

/// Issue 15: an object the API server stores but the operator cannot decode is reported on
/// itself (an InvalidSpec Event, Degraded InvalidSpec keeping the previous status) and nothing
/// else is written.
#[tokio::test]
async fn an_undecodable_proxyconfig_is_reported_on_itself() {
    let (client, mut server) = mock();
    let stored: StoredProxyConfig = serde_json::from_value(json!({
        "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig",
        "metadata": {"name": "huge", "uid": "uid-huge", "generation": 2, "resourceVersion": "9"},
        "spec": {"rollout": {"stages": [{"name": "canary", "size": 1, "soakDuration": "100000000h"}]}},
        "status": {"lastGoodRevision": "0123456789"}
    }))
    .unwrap();
    let good = proxy_config("fleet", canary_spec());
    let ctx = context_over(
        client,
        ready_store(vec![stored.clone(), StoredProxyConfig::from(good)]),
        ready_store(vec![node("a", &[("canary", "yes")])]),
        ready_store(vec![]),
    );
    let task = tokio::spawn(reconcile_stored(Arc::new(stored), ctx));
    let (body, send) = expect_status(&mut server, "huge").await;
    assert_eq!(degraded(&body)["reason"], "InvalidSpec");
    assert_eq!(body["status"]["lastGoodRevision"], "0123456789");
    assert_eq!(body["status"]["observedGeneration"], 2);
    respond(send, 200, &body);
    let (event, send) = expect_event(&mut server).await;
    assert_eq!(event["reason"], "InvalidSpec");
    assert_eq!(event["involvedObject"]["name"], "huge");
    assert!(
        event["message"].as_str().unwrap().contains("out of range"),
        "{event}"
    );
    respond(send, 201, &event);
    task.await.unwrap().unwrap();
}

/// Several reconciles waiting for the stores at once all go on once the stores are ready
/// (kube-runtime's `wait_until_ready` wakes only its last waiter: one ProxyConfig stayed
/// unreconciled after an apiserver outage).
#[tokio::test]
async fn every_reconcile_waiting_for_the_stores_goes_on_when_they_are_ready() {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    let (client, _server) = mock();
    let (nodes, mut node_writer) = reflector::store::<Node>();
    let (npcs, mut npc_writer) = reflector::store::<NodeProxyConfig>();
    let ctx = context_over(client, ready_store(vec![]), nodes, npcs);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let ctx = ctx.clone();
            tokio::spawn(async move { ctx.stores_ready().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await; // every waiter is waiting
    node_writer.apply_watcher_event(&Event::Init);
    node_writer.apply_watcher_event(&Event::InitDone);
    npc_writer.apply_watcher_event(&Event::Init);
    npc_writer.apply_watcher_event(&Event::InitDone);
    for waiter in waiters {
        let ready = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("a waiter was never woken");
        assert!(ready.unwrap());
    }
}

/// A ProxyConfig deleted while its writes wait: they are dropped, not sent (no later decision
/// would cancel them), and another ProxyConfig's write still goes out.
#[tokio::test]
async fn the_writes_of_a_deleted_proxyconfig_are_dropped() {
    let (client, mut server) = mock();
    let live = proxy_config("live", canary_spec());
    let (writer, _) = Writer::new(
        client,
        Metrics::new(),
        Some(ready_store(vec![StoredProxyConfig::from(live.clone())])),
    );
    let write = |node: &str| kipvs_operator::rollout::Write::Assign {
        node: node.into(),
        node_uid: None,
        revision: "r1".into(),
        config: Arc::new(Default::default()),
    };
    let gone = proxy_config("gone", canary_spec());
    {
        let mut state = writer.lock();
        use kube::Resource;
        state.submit(&gone.controller_owner_ref(&()).unwrap(), vec![write("a")]);
        state.submit(&live.controller_owner_ref(&()).unwrap(), vec![write("b")]);
    }
    let _workers = writer.start(1);
    let (body, send) = expect_apply(&mut server, "b").await;
    respond(send, 200, &body);
    no_request(
        &mut server,
        Duration::from_millis(500),
        "a deleted owner's write",
    )
    .await;
}

/// kube-proxy runs again on a node kipvs took over (its proxier stands by, Applied stays,
/// healthy false): the reconcile reads kube-proxy's DaemonSet, finds it without the affinity,
/// and the status names the node and the missing patch (Degraded `KubeProxyReturned`),
/// changing no label.
#[tokio::test]
async fn kube_proxy_back_is_reported_with_the_daemonset_patch_it_lacks() {
    use kipvs_crds::{NodePhase, NodeProxyConfigStatus, ServiceProxyPhase};
    let (client, mut server) = mock();
    let pc = proxy_config("fleet", ProxyConfigSpec::default());
    let revision = kipvs_crds::revision::config_revision(&pc.spec.config);
    // A completed takeover: revision good, node a Applied and programming.
    let mut fleet = Fleet::new(pc.clone(), [node("a", &[])]);
    for _ in 0..5 {
        fleet.step();
        let programming = Some(ServiceProxyPhase::Programming);
        fleet.report_service_proxy("a", NodePhase::Applied, true, "", programming);
    }
    let pc = fleet.pc.clone();
    let done = pc.status.clone().unwrap();
    assert_eq!(done.last_good_revision.as_ref(), Some(&revision));
    let mut npc = fleet.npcs["a"].clone();
    assert_eq!(npc.spec.revision, revision);
    npc.spec.assigned_at.0 = Timestamp::UNIX_EPOCH;
    npc.status = Some(NodeProxyConfigStatus {
        observed_revision: Some(revision),
        phase: Some(NodePhase::Applied),
        healthy: Some(false),
        service_proxy: Some(ServiceProxyPhase::Standby),
        ..NodeProxyConfigStatus::default()
    });
    let ctx = context(
        client,
        &pc,
        vec![node("a", &[("kipvs.io/service-proxy", "kipvs")])],
        vec![npc],
    );
    let task = tokio::spawn(reconcile(Arc::new(pc.clone()), ctx.clone()));
    let (_, send) = expect(&mut server, "GET", KUBE_PROXY_DAEMONSET, &[]).await;
    // As kubeadm upgrade writes it: no affinity.
    let unpatched = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
            "template": {"spec": {"containers": [{"name": "kube-proxy"}]}},
        },
    });
    respond(send, 200, &unpatched);
    let (body, send) = expect_status(&mut server, "fleet").await;
    let degraded = body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap()
        .clone();
    assert_eq!(degraded["reason"], "KubeProxyReturned", "{degraded}");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("1 node(s)") && message.contains(": a;"),
        "{message}"
    );
    assert!(message.contains("lost the node affinity"), "{message}");
    respond(send, 200, &serde_json::to_value(&pc).unwrap());
    let mut reasons = Vec::new();
    while !task.is_finished() && reasons.len() < 3 {
        let (event, send) = expect_event(&mut server).await;
        reasons.push(event["reason"].as_str().unwrap().to_owned());
        respond(send, 201, &event);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reasons.iter().any(|r| r == "KubeProxyReturned"),
        "{reasons:?}"
    );
    task.await.unwrap().unwrap();
    no_request(
        &mut server,
        Duration::from_millis(300),
        "no label, no write",
    )
    .await;
}
