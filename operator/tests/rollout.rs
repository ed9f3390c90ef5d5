//! The rollout decision, scenario by scenario, on small fleets (see `simulation.rs` for the
//! 5,000-node invariants).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kipvs_crds::{
    CountOrPercent, Gate, NodePhase, ProxyConfigSpec, RolloutSpec, Stage, StagePhase,
};
use kipvs_operator::rollout::{Decision, Write};
use kipvs_operator::sim::{Fleet, node, proxy_config, set_ready, taint_for_scale_down};
use std::collections::BTreeMap;
use std::time::Duration;

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
        ..LabelSelector::default()
    }
}

/// The sample's plan: a labelled canary, then 10% of the fleet, then the rest (20% at a time).
fn staged_spec() -> ProxyConfigSpec {
    ProxyConfigSpec {
        rollout: RolloutSpec {
            stages: vec![
                Stage {
                    name: "canary".into(),
                    node_selector: Some(selector("kipvs.io/canary", "true")),
                    ..Stage::rest()
                },
                Stage {
                    name: "early".into(),
                    size: Some(CountOrPercent::Percent(10)),
                    ..Stage::rest()
                },
                Stage {
                    name: "fleet".into(),
                    max_unavailable: CountOrPercent::Percent(20),
                    ..Stage::rest()
                },
            ],
            ..RolloutSpec::default()
        },
        ..ProxyConfigSpec::default()
    }
}

/// `n` nodes `node-00..`, the first one labelled canary.
fn fleet(n: usize, spec: ProxyConfigSpec) -> Fleet {
    let nodes = (0..n).map(|i| {
        let name = format!("node-{i:02}");
        if i == 0 {
            node(&name, &[("kipvs.io/canary", "true")])
        } else {
            node(&name, &[])
        }
    });
    Fleet::new(proxy_config("fleet", spec), nodes)
}

fn assigned(d: &Decision) -> Vec<String> {
    let mut nodes: Vec<String> = d
        .writes
        .iter()
        .filter(|w| matches!(w, Write::Assign { .. }))
        .map(|w| w.node().to_owned())
        .collect();
    nodes.sort();
    nodes
}

fn reasons(d: &Decision) -> Vec<&'static str> {
    d.events.iter().map(|e| e.reason).collect()
}

fn condition<'a>(d: &'a Decision, type_: &str) -> (&'a str, &'a str) {
    let c = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .expect(type_);
    (c.status.as_str(), c.reason.as_str())
}

fn healthy(_: &str, _: &str) -> Option<(NodePhase, bool)> {
    Some((NodePhase::Applied, true))
}

/// Runs the rollout to completion with healthy proxiers; returns the decisions.
fn run_to_completion(f: &mut Fleet) -> Vec<Decision> {
    let mut decisions = Vec::new();
    for _ in 0..100 {
        let d = f.step();
        let done = d.writes.is_empty() && d.status.stage.is_none();
        decisions.push(d);
        if done {
            return decisions;
        }
        f.proxiers_report(healthy);
        f.advance(Duration::from_secs(1));
    }
    panic!("rollout did not complete");
}

/// Changes spec.config (a gate flip): a new revision.
fn flip_gate(f: &mut Fleet) {
    let gates = &mut f.pc.spec.config.feature_gates;
    let on = gates
        .get(Gate::LoadBalancerIPMode.name())
        .copied()
        .unwrap_or(true);
    gates.insert(Gate::LoadBalancerIPMode.name().to_owned(), !on);
    f.pc.metadata.generation = f.pc.metadata.generation.map(|g| g + 1);
}

#[test]
fn canary_then_ten_percent_then_the_rest() {
    let mut f = fleet(10, staged_spec());
    let d = f.step();
    let revision = d.status.revision.clone().unwrap();
    assert_eq!(assigned(&d), ["node-00"], "only the canary first");
    assert_eq!(d.status.stage.as_deref(), Some("canary"));
    assert_eq!(reasons(&d), ["StageStarted"]);
    assert_eq!(condition(&d, "Progressing"), ("True", "RollingOut"));
    // Nothing moves until the canary reports.
    assert!(f.step().writes.is_empty());

    f.proxiers_report(healthy);
    let d = f.step();
    assert_eq!(reasons(&d), ["StageComplete", "StageStarted"]);
    assert_eq!(d.status.stage.as_deref(), Some("early"));
    let early = assigned(&d);
    assert_eq!(early.len(), 1, "10% of 10 nodes");

    f.proxiers_report(healthy);
    let d = f.step();
    assert_eq!(d.status.stage.as_deref(), Some("fleet"));
    assert_eq!(
        assigned(&d).len(),
        2,
        "20% of the 8 remaining nodes at a time"
    );
    assert_eq!(d.status.stages[2].total, 8);

    let rest = run_to_completion(&mut f);
    let last = rest.last().unwrap();
    assert_eq!(
        last.status.last_good_revision.as_deref(),
        Some(revision.as_str())
    );
    assert_eq!(last.status.healthy_nodes, 10);
    assert_eq!(condition(last, "Progressing"), ("False", "RolloutComplete"));
    assert_eq!(condition(last, "Available"), ("True", "AllHealthy"));
    assert_eq!(condition(last, "Degraded"), ("False", "AsExpected"));
    assert!(
        rest.iter()
            .flat_map(|d| &d.events)
            .any(|e| e.reason == "RolloutComplete")
    );
    assert!(
        f.nodes
            .keys()
            .all(|n| f.revision_of(n) == Some(revision.as_str()))
    );
    // Converged: nothing to write, nothing to wait for.
    let d = f.step();
    assert!(d.writes.is_empty() && d.events.is_empty() && d.requeue_after.is_none());
}

/// Issue 23: a node whose NodeProxyConfig write keeps failing (the API server refuses it) has
/// no NodeProxyConfig of the target; the status counted it as updated. It is written again
/// (retried) and not counted.
#[test]
fn a_node_whose_write_keeps_failing_is_not_counted_as_updated() {
    let mut f = fleet(10, staged_spec());
    let d = f.decide();
    assert_eq!(assigned(&d), ["node-00"]);
    assert_eq!(d.status.updated_nodes, 1);
    f.failing_writes
        .insert("node-00".into(), "NodeProxyConfig is invalid".into());
    let d = f.decide();
    assert_eq!(assigned(&d), ["node-00"], "written again");
    assert_eq!(d.status.updated_nodes, 0);
    assert_eq!(d.status.stages[0].updated, 0);
    assert_eq!(condition(&d, "Degraded"), ("True", "WriteFailed"));
}

#[test]
fn soak_then_pause_then_promotion() {
    let mut spec = staged_spec();
    spec.rollout.stages[0].soak_duration = Duration::from_secs(600);
    spec.rollout.stages[0].pause = true;
    let mut f = fleet(5, spec);
    let revision = f.step().status.revision.unwrap();
    f.proxiers_report(healthy);
    let d = f.step();
    assert_eq!(d.status.stages[0].phase, StagePhase::Soaking);
    assert_eq!(condition(&d, "Progressing"), ("True", "Soaking"));
    assert_eq!(d.requeue_after, Some(Duration::from_secs(600)));
    assert!(d.writes.is_empty());

    f.advance(Duration::from_secs(600));
    let d = f.step();
    assert_eq!(d.status.stages[0].phase, StagePhase::AwaitingPromotion);
    assert_eq!(condition(&d, "Paused"), ("True", "AwaitingPromotion"));
    let command = format!(
        "kubectl annotate proxyconfig fleet kipvs.io/promote=canary@{revision} --overwrite"
    );
    assert!(
        d.events.iter().any(|e| e.message.contains(&command)),
        "{:?}",
        d.events
    );
    assert!(d.writes.is_empty());
    // A promotion of another revision does not count.
    f.pc.metadata.annotations = Some(BTreeMap::from([(
        "kipvs.io/promote".to_owned(),
        "canary@0000000000".to_owned(),
    )]));
    assert!(f.step().writes.is_empty());
    f.pc.metadata.annotations = Some(BTreeMap::from([(
        "kipvs.io/promote".to_owned(),
        format!("canary@{revision}"),
    )]));
    let d = f.step();
    assert_eq!(
        reasons(&d),
        ["StagePromoted", "StageComplete", "StageStarted"]
    );
    assert_eq!(assigned(&d).len(), 1);
    assert_eq!(condition(&d, "Paused"), ("False", "Running"));
}

#[test]
fn a_failed_canary_halts_and_rolls_back_every_touched_node() {
    let mut f = fleet(10, staged_spec());
    run_to_completion(&mut f);
    let good =
        f.pc.status
            .as_ref()
            .unwrap()
            .last_good_revision
            .clone()
            .unwrap();

    flip_gate(&mut f);
    let d = f.step();
    let bad = d.status.revision.clone().unwrap();
    assert_ne!(bad, good);
    assert_eq!(assigned(&d), ["node-00"]);
    f.proxiers_report(|_, _| Some((NodePhase::Failed, true)));
    let d = f.step();
    assert_eq!(d.status.bad_revisions, std::slice::from_ref(&bad));
    assert_eq!(d.status.target_revision.as_deref(), Some(good.as_str()));
    assert_eq!(assigned(&d), ["node-00"], "the canary goes back");
    assert_eq!(reasons(&d), ["NodeFailed", "RevisionFailed", "RollingBack"]);
    assert_eq!(condition(&d, "Degraded"), ("True", "RevisionFailed"));
    assert_eq!(condition(&d, "Progressing"), ("True", "RollingBack"));
    assert_eq!(d.status.failures[0].node, "node-00");
    assert_eq!(d.status.failures[0].message, "Failed: simulated failure");
    assert!(
        f.nodes
            .keys()
            .all(|n| f.revision_of(n) == Some(good.as_str()))
    );

    f.proxiers_report(healthy);
    let d = f.step();
    assert_eq!(condition(&d, "Progressing"), ("False", "RolledBack"));
    assert_eq!(condition(&d, "Degraded"), ("True", "RevisionFailed"));
    assert!(d.writes.is_empty());
    // The bad revision is not retried; a new one is.
    assert!(f.step().writes.is_empty());
    flip_gate(&mut f);
    flip_gate(&mut f);
    f.pc.spec.config.ipvs.scheduler = "lc".into();
    let d = f.step();
    assert_eq!(assigned(&d), ["node-00"]);
    assert_eq!(condition(&d, "Degraded"), ("False", "AsExpected"));
}

#[test]
fn a_silent_node_fails_after_the_apply_timeout() {
    let mut f = fleet(4, staged_spec());
    let d = f.step();
    assert_eq!(d.requeue_after, Some(Duration::from_secs(300)));
    f.advance(Duration::from_secs(299));
    assert!(f.step().status.bad_revisions.is_empty());
    f.advance(Duration::from_secs(1));
    let d = f.step();
    assert_eq!(d.status.bad_revisions.len(), 1);
    assert!(
        d.status.failures[0]
            .message
            .contains("within applyTimeout 5m0s"),
        "{:?}",
        d.status.failures
    );
    // No last good revision: the rollback deletes what it created.
    assert_eq!(
        d.writes,
        [Write::Delete {
            node: "node-00".into()
        }]
    );
    assert_eq!(condition(&d, "Progressing"), ("True", "RollingBack"));
    f.step();
    let d = f.step();
    assert_eq!(condition(&d, "Progressing"), ("False", "RolledBack"));
}

#[test]
fn unhealthy_during_soak_fails_the_revision() {
    let mut spec = staged_spec();
    spec.rollout.stages[0].soak_duration = Duration::from_secs(3600);
    spec.rollout.apply_timeout = Duration::from_secs(60);
    let mut f = fleet(4, spec);
    f.step();
    f.proxiers_report(healthy);
    f.advance(Duration::from_secs(120));
    assert_eq!(f.step().status.stages[0].phase, StagePhase::Soaking);
    f.report("node-00", NodePhase::Applied, false, "sync failed");
    let d = f.step();
    assert_eq!(d.status.bad_revisions.len(), 1, "{:?}", d.status);
}

#[test]
fn draining_and_not_ready_nodes_are_skipped_not_waited_for() {
    let mut f = fleet(6, staged_spec());
    taint_for_scale_down(f.nodes.get_mut("node-00").unwrap());
    set_ready(f.nodes.get_mut("node-01").unwrap(), false);
    f.nodes
        .get_mut("node-02")
        .unwrap()
        .metadata
        .deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(f.now));
    let decisions = run_to_completion(&mut f);
    let last = decisions.last().unwrap();
    assert_eq!(last.status.skipped_nodes, 3);
    assert_eq!(last.status.healthy_nodes, 3);
    assert!(
        last.status.last_good_revision.is_some(),
        "the rollout completed"
    );
    assert_eq!(
        decisions[0].status.stages[0].skipped, 1,
        "the canary stage had only a draining node"
    );
    for skipped in ["node-00", "node-01", "node-02"] {
        assert_eq!(f.revision_of(skipped), None, "{skipped} was written");
    }
    // Back to Ready: it gets the (now good) revision.
    set_ready(f.nodes.get_mut("node-01").unwrap(), true);
    assert_eq!(assigned(&f.step()), ["node-01"]);
}

/// No proxier heartbeat (issue 15): a node that dies mid-rollout is seen from its Node's Ready
/// condition (the node lifecycle controller sets it Unknown once the kubelet stops renewing its
/// Lease), not from a proxier status going stale: its silence after the apply timeout does not
/// fail the revision, it is skipped and the rollout completes without it.
#[test]
fn a_node_that_dies_mid_rollout_is_skipped_from_its_ready_condition_not_failed() {
    let mut f = fleet(10, staged_spec());
    let mut dead: Option<String> = None;
    for _ in 0..100 {
        let d = f.step();
        if d.writes.is_empty() && d.status.stage.is_none() {
            break;
        }
        if dead.is_none()
            && let Some(victim) = assigned(&d).into_iter().find(|n| n != "node-00")
        {
            // Written, then its kubelet (and proxier) stop: Ready goes Unknown, nothing answers.
            let status = f.nodes.get_mut(&victim).unwrap().status.as_mut().unwrap();
            status.conditions.as_mut().unwrap()[0].status = "Unknown".into();
            dead = Some(victim);
        }
        let silent = dead.clone();
        f.proxiers_report(|node, _| {
            (Some(node) != silent.as_deref()).then_some((NodePhase::Applied, true))
        });
        // Past the apply timeout at once: a silent node that counted would fail the revision.
        f.advance(Duration::from_secs(301));
    }
    let dead = dead.expect("a non-canary node was written");
    let d = f.step();
    assert!(d.status.bad_revisions.is_empty(), "{:?}", d.status.failures);
    assert!(d.status.failures.is_empty(), "{:?}", d.status.failures);
    assert!(
        d.status.last_good_revision.is_some(),
        "the rollout completed"
    );
    assert_eq!((d.status.skipped_nodes, d.status.healthy_nodes), (1, 9));
    assert_eq!(f.npcs[&dead].status, None, "it never answered");
}

#[test]
fn nodes_selected_by_two_proxy_configs_are_reported_not_written() {
    let mut f = fleet(4, ProxyConfigSpec::default());
    f.nodes
        .get_mut("node-03")
        .unwrap()
        .metadata
        .labels
        .get_or_insert_default()
        .insert("pool".into(), "b".into());
    f.others = vec![kipvs_crds::proxyconfig::parse_selector(&selector("pool", "b"), "").unwrap()];
    let decisions = run_to_completion(&mut f);
    let last = decisions.last().unwrap();
    assert_eq!(last.status.conflicting_nodes, ["node-03"]);
    assert_eq!(last.status.total_nodes, 4);
    assert_eq!(f.revision_of("node-03"), None);
    assert_eq!(condition(last, "Degraded"), ("True", "NodeConflict"));
    assert_eq!(reasons(&decisions[0])[0], "NodeConflict");
}

#[test]
fn paused_writes_nothing() {
    let mut spec = staged_spec();
    spec.paused = true;
    let mut f = fleet(4, spec);
    let d = f.step();
    assert!(d.writes.is_empty());
    assert_eq!(condition(&d, "Paused"), ("True", "SpecPaused"));
    assert_eq!(d.status.stages[0].phase, StagePhase::Waiting);
    f.pc.spec.paused = false;
    assert_eq!(assigned(&f.step()), ["node-00"]);
}

#[test]
fn an_invalid_spec_writes_nothing_and_says_why() {
    let mut spec = staged_spec();
    spec.config.ipvs.min_sync_period = Duration::from_secs(60);
    spec.config.ipvs.sync_period = Duration::from_secs(10);
    let mut f = fleet(4, spec);
    let d = f.step();
    assert!(d.writes.is_empty());
    assert_eq!(condition(&d, "Degraded"), ("True", "InvalidSpec"));
    assert_eq!(reasons(&d), ["InvalidSpec"]);
    assert!(
        f.step().events.is_empty(),
        "the same problem is reported once"
    );
}

#[test]
fn unselected_nodes_lose_their_node_proxy_config() {
    let spec = ProxyConfigSpec {
        node_selector: Some(selector("kipvs", "on")),
        ..ProxyConfigSpec::default()
    };
    let nodes = (0..3).map(|i| node(&format!("n{i}"), &[("kipvs", "on")]));
    let mut f = Fleet::new(proxy_config("fleet", spec), nodes);
    run_to_completion(&mut f);
    assert_eq!(f.npcs.len(), 3);
    f.nodes.get_mut("n1").unwrap().metadata.labels = None;
    f.nodes.remove("n2");
    let d = f.step();
    let mut deleted: Vec<_> = d.writes.iter().map(Write::node).collect();
    deleted.sort();
    assert_eq!(deleted, ["n1", "n2"]);
    assert!(d.writes.iter().all(|w| matches!(w, Write::Delete { .. })));
}

#[test]
fn a_failure_budget_tolerates_failures() {
    let mut spec = staged_spec();
    spec.rollout.failure_budget = 1;
    let mut f = fleet(10, spec);
    let mut failed_one = false;
    for _ in 0..60 {
        let d = f.step();
        if d.status.stage.is_none() && d.writes.is_empty() {
            break;
        }
        f.proxiers_report(|node, _| {
            if node == "node-00" && !failed_one {
                failed_one = true;
                Some((NodePhase::Failed, false))
            } else {
                Some((NodePhase::Applied, true))
            }
        });
    }
    let status = f.pc.status.clone().unwrap();
    assert!(status.bad_revisions.is_empty());
    assert_eq!(status.failed_nodes, 1);
    assert_eq!(status.last_good_revision, status.revision);
    let d = f.step();
    assert_eq!(condition(&d, "Degraded"), ("True", "NodesFailed"));
    assert_eq!(condition(&d, "Available"), ("False", "NodesFailed"));
}

#[test]
fn without_auto_rollback_the_rollout_halts() {
    let mut spec = staged_spec();
    spec.rollout.auto_rollback = false;
    let mut f = fleet(10, spec);
    run_to_completion(&mut f);
    flip_gate(&mut f);
    let bad = f.step().status.revision.unwrap();
    f.proxiers_report(|_, _| Some((NodePhase::Failed, false)));
    let d = f.step();
    assert!(d.writes.is_empty());
    assert_eq!(condition(&d, "Progressing"), ("False", "Halted"));
    assert_eq!(
        f.revision_of("node-00"),
        Some(bad.as_str()),
        "the canary keeps it"
    );
}

#[test]
fn stage_membership_is_fixed_when_the_rollout_starts() {
    let mut spec = staged_spec();
    spec.rollout.stages[1].size = Some(CountOrPercent::Percent(50));
    let mut f = fleet(10, spec);
    let d = f.step();
    assert_eq!(d.status.stages[1].total, 5);
    let bound = d.status.stages[1].size_bound.clone();
    assert!(bound.is_some());
    // Ten more nodes join: the sized stage keeps its bound and so its old members; newcomers
    // join it only if their hash falls below the bound.
    for i in 10..20 {
        f.nodes
            .insert(format!("node-{i:02}"), node(&format!("node-{i:02}"), &[]));
    }
    let d = f.step();
    assert_eq!(d.status.stages[1].size_bound, bound);
    assert!(d.status.stages[1].total >= 5);
    // A new revision recomputes the plan over the current fleet.
    f.proxiers_report(healthy);
    run_to_completion(&mut f);
    flip_gate(&mut f);
    let d = f.step();
    assert_eq!(d.status.stages[1].total, 10);
}

// ---- Hostile input (issue 15) ----

fn degraded_message(d: &Decision) -> String {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

#[test]
fn an_invalid_stage_label_key_is_an_invalid_spec_not_an_empty_canary() {
    let mut spec = staged_spec();
    spec.rollout.stages[0].node_selector = Some(selector("kipvs.io/ca nary", "true"));
    let mut f = fleet(10, spec);
    let d = f.step();
    assert!(d.writes.is_empty(), "{:?}", d.writes);
    assert_eq!(condition(&d, "Degraded"), ("True", "InvalidSpec"));
    assert!(
        degraded_message(&d).contains("spec.rollout.stages[0].nodeSelector"),
        "{}",
        degraded_message(&d)
    );
    assert_eq!(reasons(&d), ["InvalidSpec"]);
}

#[test]
fn an_empty_stage_is_reported_and_min_nodes_makes_the_rollout_wait() {
    // No node is labelled canary: without minNodes the stage completes with a StageEmpty Event.
    let mut spec = staged_spec();
    spec.rollout.stages[0].node_selector = Some(selector("kipvs.io/canary", "nobody"));
    let mut f = fleet(10, spec.clone());
    let d = f.step();
    assert!(reasons(&d).contains(&"StageEmpty"), "{:?}", reasons(&d));
    assert_eq!(d.status.stage.as_deref(), Some("early"));

    // With minNodes 1 the rollout waits at the canary, writes nothing and says why.
    spec.rollout.stages[0].min_nodes = 1;
    let mut f = fleet(10, spec);
    let d = f.step();
    assert!(d.writes.is_empty(), "{:?}", d.writes);
    assert_eq!(d.status.stage.as_deref(), Some("canary"));
    assert_eq!(condition(&d, "Progressing"), ("True", "StageTooSmall"));
    assert_eq!(condition(&d, "Degraded"), ("True", "StageTooSmall"));
    assert_eq!(reasons(&d), ["StageTooSmall"]);
    assert!(f.step().events.is_empty(), "the Event is not repeated");
    // A canary node appears: the rollout starts with it.
    f.nodes.insert(
        "node-99".into(),
        node("node-99", &[("kipvs.io/canary", "nobody")]),
    );
    let d = f.step();
    assert_eq!(assigned(&d), ["node-99"]);
    assert_eq!(reasons(&d), ["StageStarted"]);
}

#[test]
fn a_canary_taken_by_another_proxyconfig_with_min_nodes_stops_the_rollout() {
    let mut spec = staged_spec();
    spec.rollout.stages[0].min_nodes = 1;
    let mut f = fleet(10, spec);
    // Another ProxyConfig selects the canary node: it is a conflict, not a member.
    f.others = vec![kube::core::Selector::try_from(selector("kipvs.io/canary", "true")).unwrap()];
    let d = f.step();
    assert!(d.writes.is_empty(), "{:?}", d.writes);
    assert_eq!(condition(&d, "Progressing"), ("True", "StageTooSmall"));
    assert!(reasons(&d).contains(&"NodeConflict"));
}

#[test]
fn rollout_complete_names_the_conflicting_nodes_it_left_alone() {
    let mut f = fleet(4, staged_spec());
    f.others = vec![kube::core::Selector::try_from(selector("kipvs.io/canary", "true")).unwrap()];
    let decisions = run_to_completion(&mut f);
    let complete = decisions
        .iter()
        .flat_map(|d| &d.events)
        .find(|e| e.reason == "RolloutComplete")
        .unwrap();
    assert!(
        complete
            .message
            .contains("1 conflicting node(s) are left alone"),
        "{}",
        complete.message
    );
}

#[test]
fn a_proxyconfig_selecting_no_node_says_so_and_marks_nothing_good() {
    let mut spec = staged_spec();
    spec.node_selector = Some(selector("pool", "none"));
    let mut f = fleet(3, spec);
    let d = f.step();
    assert_eq!(condition(&d, "Progressing"), ("False", "NoNodes"));
    assert_eq!(reasons(&d), ["NoNodes"]);
    assert_eq!(d.status.last_good_revision, None);
    assert!(f.step().events.is_empty(), "the Event is not repeated");
    // Nodes join: the rollout starts at the canary, not directly everywhere.
    for name in ["node-00", "node-01", "node-02"] {
        let n = f.nodes.get_mut(name).unwrap();
        n.metadata
            .labels
            .get_or_insert_default()
            .insert("pool".into(), "none".into());
    }
    let d = f.step();
    assert_eq!(assigned(&d), ["node-00"]);
}

#[test]
fn a_hand_edited_node_proxy_config_is_restored() {
    let mut f = fleet(3, staged_spec());
    run_to_completion(&mut f);
    let revision = f.revision_of("node-01").unwrap().to_owned();
    // A person edits node-01's configuration, keeping spec.revision.
    f.npcs
        .get_mut("node-01")
        .unwrap()
        .spec
        .config
        .ipvs
        .scheduler = "sed".into();
    let d = f.step();
    assert_eq!(assigned(&d), ["node-01"]);
    assert_eq!(reasons(&d), ["DriftRestored"]);
    let Write::Assign {
        revision: written,
        config,
        ..
    } = &d.writes[0]
    else {
        panic!("{:?}", d.writes)
    };
    assert_eq!(&**written, revision.as_str());
    assert_eq!(**config, f.pc.spec.config);
    assert_eq!(f.npcs["node-01"].spec.config, f.pc.spec.config);
    assert!(f.step().writes.is_empty());
}

#[test]
fn an_empty_scheduler_and_rr_are_one_revision() {
    let mut f = fleet(3, staged_spec());
    run_to_completion(&mut f);
    f.pc.spec.config.ipvs.scheduler = "rr".into();
    f.pc.metadata.generation = Some(2);
    let d = f.step();
    assert!(d.writes.is_empty(), "no re-roll: {:?}", d.writes);
    assert_eq!(condition(&d, "Progressing"), ("False", "RolloutComplete"));
}

#[test]
fn failures_of_a_finished_revision_do_not_claim_a_failure_budget() {
    let mut f = fleet(3, staged_spec());
    run_to_completion(&mut f);
    let after = f.now.checked_add(Duration::from_secs(3600)).unwrap();
    f.now = after;
    f.report("node-02", NodePhase::Failed, true, "boom");
    let d = f.step();
    let message = degraded_message(&d);
    assert!(
        message.contains("after it reached every node") && !message.contains("budget"),
        "{message}"
    );
}

#[test]
fn health_is_latched_once_a_stage_completed() {
    // Canary, soak 10 min, then the rest; failure budget 0.
    let mut spec = staged_spec();
    spec.rollout.stages[0].soak_duration = Duration::from_secs(600);
    spec.rollout.stages[1].soak_duration = Duration::from_secs(600);
    let mut f = fleet(10, spec);
    let d = f.step();
    let revision = d.status.revision.clone().unwrap();
    f.proxiers_report(healthy);
    f.step();
    f.advance(Duration::from_secs(600));
    let d = f.step();
    assert_eq!(d.status.stages[0].phase, StagePhase::Complete);
    assert_eq!(d.status.stage.as_deref(), Some("early"));
    // The canary's /livez blips after the apply timeout (5 min) while early soaks.
    f.proxiers_report(healthy);
    f.step();
    f.advance(Duration::from_secs(400));
    f.report("node-00", NodePhase::Applied, false, "");
    let d = f.step();
    assert!(
        d.status.bad_revisions.is_empty(),
        "a blip after its stage completed failed the revision"
    );
    assert_eq!(d.status.target_revision.as_deref(), Some(revision.as_str()));
    assert_eq!(condition(&d, "Available"), ("False", "NodesFailed"));
    assert!(reasons(&d).contains(&"NodesUnhealthy"), "{:?}", reasons(&d));
    // A blip of a node whose stage is still soaking does fail it (the soak is the gate).
    f.report("node-00", NodePhase::Applied, true, "");
    let d = f.step();
    assert_eq!(d.status.stages[1].phase, StagePhase::Soaking);
    let early: Vec<String> = f
        .npcs
        .keys()
        .filter(|n| *n != "node-00" && f.revision_of(n) == Some(revision.as_str()))
        .cloned()
        .collect();
    assert_eq!(early.len(), 1);
    f.report(&early[0], NodePhase::Applied, false, "");
    let d = f.step();
    assert_eq!(d.status.bad_revisions, [revision]);
}
