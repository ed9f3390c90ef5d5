//! Rollouts simulated over whole fleets, checking the invariants after every decision:
//!
//! 1. never more than a stage's maxUnavailable nodes in flight (given the target revision, not
//!    yet healthy) in that stage;
//! 2. no stage starts before every earlier stage is complete, and no node beyond the cursor
//!    gets the target revision;
//! 3. a rollback returns every touched node to the last good revision;
//! 4. draining (tainted, NotReady, being deleted) nodes never block: the rollout completes
//!    although they never report, and they are never written.
//!
//! One deterministic 5,000-node run with slow, silent and failing proxiers and node churn, and a
//! property test over random small fleets and plans.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kipvs_crds::{
    CountOrPercent, Gate, NodePhase, ProxyConfigSpec, RolloutSpec, Stage, StagePhase,
};
use kipvs_operator::rollout::{Decision, Write};
use kipvs_operator::sim::{Fleet, node, proxy_config, set_ready, taint_for_scale_down};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// xorshift64*: a tiny deterministic generator (the simulation must replay identically).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// True with probability `percent`%.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn canary_selector() -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kipvs.io/canary".to_owned(),
            "true".to_owned(),
        )])),
        ..LabelSelector::default()
    }
}

fn stage(
    name: &str,
    selector: Option<LabelSelector>,
    size: Option<CountOrPercent>,
    max: CountOrPercent,
    soak: u64,
) -> Stage {
    Stage {
        name: name.to_owned(),
        node_selector: selector,
        size,
        max_unavailable: max,
        soak_duration: Duration::from_secs(soak),
        pause: false,
        min_nodes: 0,
    }
}

/// Checks invariants 1 and 2 on one decision applied to `f` (the state after `apply`).
fn check_stages(f: &Fleet, d: &Decision) {
    let status = &d.status;
    let Some(target) = status.target_revision.as_deref() else {
        return;
    };
    if status
        .bad_revisions
        .iter()
        .any(|b| Some(b) == status.revision.as_ref())
    {
        return; // rollback/halt: checked by the caller
    }
    let stages = f.pc.spec.rollout.effective_stages();
    // Invariant 2: stages start in order.
    let cursor = status
        .stages
        .iter()
        .position(|s| s.phase != StagePhase::Complete)
        .unwrap_or(stages.len());
    for (i, s) in status.stages.iter().enumerate() {
        if i > cursor {
            assert_eq!(
                s.phase,
                StagePhase::Waiting,
                "stage {} runs before stage {} is complete: {:?}",
                s.name,
                cursor,
                status.stages
            );
            assert!(s.started_at.is_none(), "stage {} started early", s.name);
        }
    }
    // Invariant 1: in flight per stage. Writes of this decision are in flight now; reported
    // ones are counted from the NodeProxyConfigs.
    for (i, (s, spec)) in status.stages.iter().zip(&stages).enumerate() {
        let allowed = spec.max_unavailable.of(s.total as usize).max(1) as u32;
        let in_flight = s.updated - s.healthy - s.failed;
        assert!(
            in_flight <= allowed,
            "stage {i} {}: {in_flight} in flight > {allowed}",
            s.name
        );
        if i > cursor {
            assert_eq!(
                s.updated, 0,
                "stage {} beyond the cursor has target nodes",
                s.name
            );
        }
    }
    let _ = target;
}

/// Invariant 4: skipped nodes are never written.
fn check_skipped_untouched(d: &Decision, skipped: &BTreeSet<String>) {
    for w in &d.writes {
        assert!(
            !skipped.contains(w.node()),
            "skipped node {} written",
            w.node()
        );
    }
}

fn flip_gate(f: &mut Fleet) {
    let gates = &mut f.pc.spec.config.feature_gates;
    let on = gates
        .get(Gate::ProxyTerminatingEndpoints.name())
        .copied()
        .unwrap_or(true);
    gates.insert(Gate::ProxyTerminatingEndpoints.name().to_owned(), !on);
}

#[test]
fn five_thousand_nodes() {
    const NODES: usize = 5000;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let spec = ProxyConfigSpec {
        rollout: RolloutSpec {
            stages: vec![
                stage(
                    "canary",
                    Some(canary_selector()),
                    None,
                    CountOrPercent::Count(5),
                    60,
                ),
                stage(
                    "early",
                    None,
                    Some(CountOrPercent::Percent(10)),
                    CountOrPercent::Count(50),
                    60,
                ),
                stage("fleet", None, None, CountOrPercent::Percent(10), 0),
            ],
            apply_timeout: Duration::from_secs(300),
            failure_budget: 0,
            auto_rollback: true,
        },
        ..ProxyConfigSpec::default()
    };
    let nodes = (0..NODES).map(|i| {
        let name = format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250);
        if i % 100 == 0 {
            node(&name, &[("kipvs.io/canary", "true")])
        } else {
            node(&name, &[])
        }
    });
    let mut f = Fleet::new(proxy_config("fleet", spec), nodes);
    // 5% of the nodes drain or go NotReady and never report.
    let mut skipped = BTreeSet::new();
    for (i, (name, n)) in f.nodes.iter_mut().enumerate() {
        match i % 60 {
            7 => taint_for_scale_down(n),
            13 => set_ready(n, false),
            29 => {
                n.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
            }
            _ => continue,
        }
        skipped.insert(name.clone());
    }

    // Phase 1: the first revision, with proxiers that take 1-3 steps to report.
    let mut steps = 0;
    let first = loop {
        steps += 1;
        assert!(steps < 400, "first rollout did not finish");
        let d = f.step();
        check_stages(&f, &d);
        check_skipped_untouched(&d, &skipped);
        if d.status.stage.is_none() && d.writes.is_empty() {
            break d;
        }
        f.proxiers_report(|_, _| rng.chance(60).then_some((NodePhase::Applied, true)));
        f.advance(Duration::from_secs(10));
    };
    let good = first.status.last_good_revision.clone().expect("complete");
    assert_eq!(first.status.total_nodes as usize, NODES);
    assert_eq!(first.status.skipped_nodes as usize, skipped.len());
    assert_eq!(first.status.healthy_nodes as usize, NODES - skipped.len());
    assert!(
        f.nodes
            .keys()
            .filter(|n| !skipped.contains(*n))
            .all(|n| f.revision_of(n) == Some(good.as_str()))
    );

    // Phase 2: a gate flip; nodes join and leave meanwhile; one early-stage node fails.
    flip_gate(&mut f);
    let mut touched = BTreeSet::new();
    let mut victim: Option<String> = None;
    let mut rolled_back = false;
    for step in 0..400 {
        if step % 5 == 0 {
            let name = format!("new-node-{step}");
            f.nodes.insert(name.clone(), node(&name, &[]));
            let gone = f
                .nodes
                .keys()
                .filter(|n| !skipped.contains(*n))
                .nth(1000 + step)
                .cloned()
                .unwrap();
            f.nodes.remove(&gone);
            f.npcs.remove(&gone); // garbage-collected with its Node
        }
        let d = f.step();
        check_skipped_untouched(&d, &skipped);
        for w in &d.writes {
            if let Write::Assign { node, revision, .. } = w
                && Some(&**revision) == d.status.revision.as_deref()
            {
                touched.insert(node.clone());
            }
        }
        if d.status.bad_revisions.is_empty() {
            check_stages(&f, &d);
        } else if !rolled_back {
            rolled_back = true;
            // Invariant 3: every touched node (still present) is back on the good revision,
            // in this very decision.
            assert_eq!(d.status.target_revision.as_deref(), Some(good.as_str()));
            for n in touched.iter().filter(|n| f.nodes.contains_key(*n)) {
                assert_eq!(f.revision_of(n), Some(good.as_str()), "{n} not rolled back");
            }
        } else if d.writes.is_empty()
            && d.status.conditions.iter().any(|c| c.reason == "RolledBack")
        {
            assert!(f.npcs.values().all(|n| n.spec.revision == good));
            break;
        }
        let early = d.status.stage.as_deref() == Some("early");
        let bad = d.status.revision.clone().unwrap();
        f.proxiers_report(|node, revision| {
            if early && victim.is_none() && revision == bad {
                victim = Some(node.to_owned());
                return Some((NodePhase::Failed, false));
            }
            rng.chance(70).then_some((NodePhase::Applied, true))
        });
        f.advance(Duration::from_secs(10));
    }
    assert!(rolled_back, "the failure in the early stage was not caught");
    assert!(victim.is_some());
    assert!(
        touched.len() > 50,
        "the canary stage and part of early were touched ({})",
        touched.len()
    );
}

/// One random stage: (selects the canary label, size code, maxUnavailable code).
type StageCase = (bool, Option<u32>, u32);

/// A random plan over a random small fleet: (nodes, stages, failure budget, seed).
fn arb_case() -> impl Strategy<Value = (usize, Vec<StageCase>, u32, u64)> {
    (
        5usize..120,
        prop::collection::vec(
            (any::<bool>(), prop::option::of(1u32..=60), 1u32..=40),
            0..4,
        ),
        0u32..3,
        any::<u64>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any plan on any small fleet: invariants hold at every step, the rollout of a healthy
    /// revision completes, and a failure over budget returns every touched node.
    #[test]
    fn random_plans_keep_the_invariants((n, plan, budget, seed) in arb_case()) {
        let mut rng = Rng(seed | 1);
        let stages = plan
            .iter()
            .enumerate()
            .map(|(i, (canary, size, max))| stage(
                &format!("s{i}"),
                canary.then(canary_selector),
                size.map(|p| if p > 30 { CountOrPercent::Count(p - 30) } else { CountOrPercent::Percent(p * 3) })
                    .or_else(|| (!canary).then_some(CountOrPercent::Count(1))),
                if *max > 20 { CountOrPercent::Percent(*max) } else { CountOrPercent::Count(*max) },
                if rng.chance(30) { 30 } else { 0 },
            ))
            .collect();
        let spec = ProxyConfigSpec {
            rollout: RolloutSpec { stages, failure_budget: budget, ..RolloutSpec::default() },
            ..ProxyConfigSpec::default()
        };
        spec.validate().unwrap();
        let nodes = (0..n).map(|i| {
            let name = format!("n{i}");
            if rng.chance(20) { node(&name, &[("kipvs.io/canary", "true")]) } else { node(&name, &[]) }
        });
        let mut f = Fleet::new(proxy_config("p", spec), nodes);
        let mut skipped = BTreeSet::new();
        for (name, node) in f.nodes.iter_mut() {
            if rng.chance(10) {
                taint_for_scale_down(node);
                skipped.insert(name.clone());
            }
        }
        // A healthy first revision completes.
        let mut done = false;
        for _ in 0..500 {
            let d = f.step();
            check_stages(&f, &d);
            check_skipped_untouched(&d, &skipped);
            if d.status.stage.is_none() && d.writes.is_empty() { done = true; break; }
            f.proxiers_report(|_, _| rng.chance(50).then_some((NodePhase::Applied, true)));
            f.advance(Duration::from_secs(10));
        }
        prop_assert!(done, "healthy rollout did not complete");
        let good = f.pc.status.as_ref().unwrap().last_good_revision.clone().unwrap();

        // A second revision where every proxier fails with some probability.
        flip_gate(&mut f);
        let mut touched = BTreeSet::new();
        for _ in 0..500 {
            let d = f.step();
            check_skipped_untouched(&d, &skipped);
            for w in &d.writes {
                if let Write::Assign { node, revision, .. } = w && Some(&**revision) == d.status.revision.as_deref() {
                    touched.insert(node.clone());
                }
            }
            let status = &d.status;
            if status.bad_revisions.is_empty() {
                check_stages(&f, &d);
                if status.stage.is_none() && d.writes.is_empty() { break; }
            } else {
                prop_assert!(status.failed_nodes > budget);
                for n in &touched {
                    prop_assert_eq!(f.revision_of(n), Some(good.as_str()), "{} not rolled back", n);
                }
                break;
            }
            f.proxiers_report(|_, _| Some(if rng.chance(3) { (NodePhase::Failed, false) } else { (NodePhase::Applied, true) }));
            f.advance(Duration::from_secs(10));
        }
    }
}
