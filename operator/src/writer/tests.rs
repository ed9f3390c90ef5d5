//! Unit tests of `operator/src/writer.rs`.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kipvs_crds::{NodeProxyConfigSpec, ProxierConfiguration};

fn owner(name: &str) -> OwnerReference {
    OwnerReference {
        api_version: "kipvs.io/v1alpha1".into(),
        kind: "ProxyConfig".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn assign(node: &str, revision: &str) -> Write {
    Write::Assign {
        node: node.into(),
        node_uid: None,
        revision: revision.into(),
        config: Arc::new(ProxierConfiguration::default()),
    }
}

/// No Node carries a service proxy label.
fn no_label(_: &str) -> Option<String> {
    None
}

fn stored(node: &str, revision: &str) -> NodeProxyConfig {
    NodeProxyConfig::new(
        node,
        NodeProxyConfigSpec {
            revision: revision.into(),
            assigned_at: Time(Timestamp::now()),
            config: ProxierConfiguration::default(),
        },
    )
}

/// The queue, in order: (node, revision or "delete").
fn queue(state: &WriterState) -> Vec<(String, String)> {
    state
        .order
        .values()
        .map(|key| {
            let revision = match &state.queued[key].write {
                Write::Assign { revision, .. } => revision.to_string(),
                Write::Delete { .. } => "delete".into(),
                Write::Label(label) => format!("label {}", label.proxy.as_str()),
            };
            (key.0.clone(), revision)
        })
        .collect()
}

/// A clear rejection (a 4xx).
fn rejected(message: &str) -> Failure {
    Failure {
        message: message.into(),
        ambiguous: false,
    }
}

/// A failure that may have been committed (a 504, a lost connection).
fn unknown(message: &str) -> Failure {
    Failure {
        message: message.into(),
        ambiguous: true,
    }
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[test]
fn the_latest_decision_replaces_its_unsent_writes_and_keeps_their_order() {
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(
        &fleet,
        vec![assign("a", "r1"), assign("b", "r1"), assign("c", "r1")],
    );
    // A new revision: its canary (c) keeps its place only if asked for with the same
    // write; r1's unsent writes for a and b are dropped, not sent after it.
    state.submit(&fleet, vec![assign("c", "r2"), assign("d", "r2")]);
    assert_eq!(queue(&state), pairs(&[("c", "r2"), ("d", "r2")]));
    // Asked for again (the next decision): same place, nothing added.
    assert!(!state.submit(&fleet, vec![assign("c", "r2"), assign("d", "r2")]));
    assert_eq!(queue(&state), pairs(&[("c", "r2"), ("d", "r2")]));
    // Another ProxyConfig's writes are not its business.
    state.submit(&owner("pool"), vec![assign("p", "x")]);
    state.submit(&fleet, vec![Write::Delete { node: "d".into() }]);
    assert_eq!(queue(&state), pairs(&[("p", "x"), ("d", "delete")]));
    // An empty decision (paused, invalid spec) leaves nothing of its own queued.
    state.submit(&fleet, vec![]);
    assert_eq!(queue(&state), pairs(&[("p", "x")]));
}

#[test]
fn a_write_in_flight_or_sent_is_never_queued_again_until_the_stores_show_it() {
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]);
    let a = state.take(Instant::now()).expect("a is due");
    assert_eq!(a.write.node(), "a");
    // In flight: laid over the stores, and not queued again by the next decision.
    let empty = HashMap::new();
    let overlay = state.overlay(&empty, &no_label, Timestamp::now());
    assert!(
        matches!(&overlay[..], [(node, Expected::Assigned { revision, .. })] if node == "a" && revision == "r1")
    );
    assert!(!state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]));
    assert_eq!(queue(&state), pairs(&[("b", "r1")]));
    assert!(!state.finish(a, Ok(()), Instant::now()));
    // Sent, not yet watched: still laid over, still not queued again.
    assert_eq!(state.overlay(&empty, &no_label, Timestamp::now()).len(), 1);
    assert!(!state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]));
    // The store shows it: forgotten; a decision still asking for it (it would not) would
    // queue it, and one asking for another revision does.
    let npc = stored("a", "r1");
    let shown = HashMap::from([("a", &npc)]);
    assert!(
        state
            .overlay(&shown, &no_label, Timestamp::now())
            .is_empty()
    );
    assert!(state.submit(&fleet, vec![assign("a", "r2"), assign("b", "r1")]));
    assert_eq!(queue(&state), pairs(&[("b", "r1"), ("a", "r2")]));
}

#[test]
fn a_failed_write_is_retried_with_backoff_and_the_same_assigned_at_and_reported() {
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(&fleet, vec![assign("a", "r1")]);
    let start = Instant::now();
    let first = state.take(start).expect("due");
    let assigned_at = first.assigned_at.expect("fixed by the first attempt");
    assert!(
        state.finish(first, Err(rejected("apiserver down")), start),
        "newly failing"
    );
    // Not laid over any more (it may not have happened); reported; queued again, later.
    assert!(
        state
            .overlay(&HashMap::new(), &no_label, Timestamp::now())
            .is_empty()
    );
    assert_eq!(
        state.failing("fleet"),
        BTreeMap::from([("a".to_owned(), "apiserver down".to_owned())])
    );
    let due = state
        .take(start)
        .expect_err("backing off")
        .expect("a due time");
    assert!(due >= start + FIRST_BACKOFF, "{due:?}");
    let second = state.take(due).expect("due after the backoff");
    assert_eq!(second.assigned_at, Some(assigned_at), "the same object");
    assert_eq!(second.attempts, 1);
    assert!(
        state.finish(second, Err(rejected("still down")), due),
        "every failure triggers a decision"
    );
    let due2 = state
        .take(due)
        .expect_err("backing off")
        .expect("a due time");
    assert!(due2 >= due + 2 * FIRST_BACKOFF, "the backoff doubles");
    let third = state.take(due2).expect("due");
    assert!(state.finish(third, Ok(()), due2), "no longer failing");
    assert!(state.failing("fleet").is_empty());
    assert_eq!(backoff(20), MAX_BACKOFF);
}

#[test]
fn a_failed_write_no_longer_asked_for_is_dropped_and_not_reported() {
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(&fleet, vec![assign("a", "r1")]);
    let a = state.take(Instant::now()).expect("due");
    state.finish(a, Err(rejected("conflict")), Instant::now());
    state.submit(&fleet, vec![assign("a", "r2")]);
    assert_eq!(queue(&state), pairs(&[("a", "r2")]));
    assert!(state.failing("fleet").is_empty());
    assert_eq!(
        state.queued[&("a".to_owned(), Object::NodeProxyConfig)].attempts,
        0,
        "a new write starts afresh"
    );
}

#[test]
fn a_dropped_write_is_forgotten() {
    let mut state = WriterState::default();
    state.submit(&owner("gone"), vec![assign("a", "r1")]);
    let a = state.take(Instant::now()).expect("due");
    state.drop_taken(a);
    assert!(
        state
            .overlay(&HashMap::new(), &no_label, Timestamp::now())
            .is_empty()
    );
    assert_eq!(state.queued(), 0);
    assert_eq!(state.take(Instant::now()).err(), Some(None));
}

#[test]
fn one_node_has_one_write_in_flight() {
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]);
    let a = state.take(Instant::now()).expect("due");
    // A new revision for a while r1 is in flight: queued behind it, b goes first.
    state.submit(&fleet, vec![assign("a", "r2"), assign("b", "r1")]);
    let b = state.take(Instant::now()).expect("b is due");
    assert_eq!(b.write.node(), "b");
    assert_eq!(
        state.take(Instant::now()).err(),
        Some(None),
        "a waits for a"
    );
    state.finish(a, Ok(()), Instant::now());
    let a2 = state.take(Instant::now()).expect("now a's next write");
    assert!(matches!(&a2.write, Write::Assign { revision, .. } if &**revision == "r2"));
}

/// A decision taken while a's retry is in flight does not ask for a (the overlay shows
/// it) and, submitted after the retry failed, cancels it; the failed retry triggers the
/// owner's reconcile, which asks for a again instead of waiting for the next resync.
#[test]
fn a_retry_cancelled_by_a_decision_taken_while_it_was_in_flight_is_asked_for_again() {
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(&fleet, vec![assign("a", "r1")]);
    let start = Instant::now();
    let first = state.take(start).expect("due");
    assert!(state.finish(first, Err(rejected("apiserver busy")), start));
    let due = state.take(start).expect_err("backing off").expect("due");
    let retry = state.take(due).expect("the retry");
    // The decision: a is in flight, laid over the stores, so it is not asked for.
    let overlay = state.overlay(&HashMap::new(), &no_label, Timestamp::now());
    assert_eq!(overlay.len(), 1);
    // The retry fails again: the owner is to be reconciled, although the node was failing
    // already.
    assert!(
        state.finish(retry, Err(rejected("apiserver busy")), due),
        "a failed retry triggers the owner's reconcile"
    );
    // The decision from before is submitted now and cancels the retry ...
    state.submit(&fleet, vec![]);
    assert_eq!(queue(&state), pairs(&[]));
    // ... and the triggered one, deciding from the stores without a, asks for it again.
    assert!(
        state
            .overlay(&HashMap::new(), &no_label, Timestamp::now())
            .is_empty()
    );
    assert!(state.submit(&fleet, vec![assign("a", "r1")]));
    assert_eq!(queue(&state), pairs(&[("a", "r1")]));
}

/// After an ambiguous failure (a 504 on a write that may be committed later, or is still
/// being committed) a newer revision's write waits, so that the older one cannot land
/// after it.
#[test]
fn a_node_in_doubt_gets_no_other_write_until_the_doubt_is_resolved() {
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]);
    let start = Instant::now();
    let a1 = state.take(start).expect("a");
    state.finish(a1, Err(unknown("504 Gateway Timeout")), start);
    // A new revision for a: not sent while r1 may still land.
    state.submit(&fleet, vec![assign("a", "r2"), assign("b", "r1")]);
    let now = Instant::now();
    let b = state.take(now).expect("b is not in doubt");
    assert_eq!(b.write.node(), "b");
    assert_eq!(
        state.take(now).err(),
        Some(Some(start + IN_DOUBT)),
        "a waits until the doubt expires"
    );
    // The stores show r1 on a: it landed, r2 comes after it.
    let npc = stored("a", "r1");
    state.overlay(&HashMap::from([("a", &npc)]), &no_label, Timestamp::now());
    let a2 = state.take(now).expect("resolved");
    assert!(matches!(&a2.write, Write::Assign { revision, .. } if &**revision == "r2"));

    // Never shown: the doubt expires (the apiserver no longer commits the request).
    let mut state = WriterState::default();
    state.submit(&fleet, vec![assign("c", "r1")]);
    let start = Instant::now();
    let c1 = state.take(start).expect("c");
    state.finish(c1, Err(unknown("connection reset")), start);
    state.submit(&fleet, vec![Write::Delete { node: "c".into() }]);
    assert!(
        state
            .take(start + IN_DOUBT - Duration::from_secs(1))
            .is_err()
    );
    let c2 = state.take(start + IN_DOUBT).expect("the doubt expired");
    assert_eq!(kind(&c2.write), "delete");

    // The same write again (its retry) is not held back, and its success resolves it; a
    // clear rejection (a 4xx) holds nothing.
    let mut state = WriterState::default();
    state.submit(&fleet, vec![assign("d", "r1")]);
    let start = Instant::now();
    let d1 = state.take(start).expect("d");
    state.finish(d1, Err(unknown("503")), start);
    let later = start + Duration::from_secs(1);
    let d2 = state.take(later).expect("its retry");
    state.finish(d2, Ok(()), later);
    state.submit(&fleet, vec![assign("d", "r2")]);
    assert!(state.take(later).is_ok(), "resolved");
    state.submit(&fleet, vec![assign("e", "r1")]);
    let e1 = state.take(later).expect("e");
    state.finish(e1, Err(rejected("422 Invalid")), later);
    state.submit(&fleet, vec![assign("e", "r2")]);
    assert!(state.take(later).is_ok(), "nothing in doubt");
}

/// A ProxyConfig deleted and recreated under the same name does not inherit the old one's
/// queued writes (they would be dropped as the deleted owner's when their turn came, and
/// nothing would ask for them again).
#[test]
fn a_proxyconfig_recreated_under_the_same_name_queues_its_own_writes() {
    let mut state = WriterState::default();
    let old = owner("fleet");
    state.submit(&old, vec![assign("a", "r1"), assign("b", "r1")]);
    let in_flight = state.take(Instant::now()).expect("a");
    assert_eq!(in_flight.write.node(), "a");
    let mut new = owner("fleet");
    new.uid = "uid-fleet-2".into();
    // The same writes by the new incarnation: queued as its own, not kept as the old one's;
    // a, in flight for the old one, is not the new one's.
    assert!(state.submit(&new, vec![assign("a", "r1"), assign("b", "r1")]));
    let owners: Vec<&str> = state
        .queued
        .values()
        .map(|q| q.owner.uid.as_str())
        .collect();
    assert_eq!(owners, ["uid-fleet-2", "uid-fleet-2"]);
    assert_eq!(queue(&state), pairs(&[("a", "r1"), ("b", "r1")]));
}

/// A node's NodeProxyConfig and its label are two writes with their own places, retries
/// and reports: a label that keeps failing is named apart and holds back neither its node's
/// NodeProxyConfig nor the other nodes' labels; a label sent and not yet shown is not
/// queued again.
#[test]
fn a_label_is_its_own_write_and_its_failure_blocks_nothing_else() {
    use crate::rollout::Label;
    let label = |node: &str| {
        Write::Label(Label {
            node: node.into(),
            proxy: ServiceProxy::Kipvs,
        })
    };
    let mut state = WriterState::default();
    let fleet = owner("fleet");
    state.submit(&fleet, vec![assign("a", "r1"), label("a"), label("b")]);
    assert_eq!(
        queue(&state),
        pairs(&[("a", "r1"), ("a", "label kipvs"), ("b", "label kipvs")])
    );
    let now = Instant::now();
    let npc = state.take(now).expect("a's NodeProxyConfig");
    let a_label = state
        .take(now)
        .expect("a's label, though a has a write in flight");
    assert_eq!(a_label.write, label("a"));
    let b_label = state.take(now).expect("b's label");
    assert!(state.finish(a_label, Err(rejected("403 Forbidden")), now));
    assert!(!state.finish(npc, Ok(()), now));
    assert!(!state.finish(b_label, Ok(()), now));
    assert_eq!(
        state.failing("fleet"),
        BTreeMap::from([(
            format!("a (label {SERVICE_PROXY_LABEL})"),
            "403 Forbidden".to_owned()
        )])
    );
    // The NodeProxyConfig overlay carries no label; b's label, sent and not yet shown, is
    // not queued again; once shown it is forgotten.
    let overlay = state.overlay(&HashMap::new(), &no_label, Timestamp::now());
    assert!(
        overlay
            .iter()
            .all(|(_, e)| matches!(e, Expected::Assigned { .. })),
        "{overlay:?}"
    );
    assert!(!state.submit(&fleet, vec![assign("a", "r1"), label("a"), label("b")]));
    let kipvs = |node: &str| (node == "b").then(|| "kipvs".to_owned());
    state.overlay(&HashMap::new(), &kipvs, Timestamp::now());
    assert!(!state.is_sent(&fleet, &label("b")));
}
