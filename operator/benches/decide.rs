//! One rollout decision over 5,000 nodes (target: under 100 ms of CPU), mid-rollout and
//! converged, including building the views from Node and NodeProxyConfig objects. The setup
//! also checks that the decision writes only nodes whose desired revision changes.
//!
//! `cargo bench -p kipvs-operator --bench decide` (add `--profile dev` for an unoptimised run).

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kipvs_crds::{CountOrPercent, Gate, NodePhase, ProxyConfigSpec, RolloutSpec, Stage};
use kipvs_operator::rollout::Write;
use kipvs_operator::sim::{Fleet, node, proxy_config};
use std::collections::BTreeMap;
use std::hint::black_box;

const NODES: usize = 5000;

fn fleet() -> Fleet {
    let canary = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kipvs.io/canary".to_owned(),
            "true".to_owned(),
        )])),
        ..LabelSelector::default()
    };
    let spec = ProxyConfigSpec {
        rollout: RolloutSpec {
            stages: vec![
                Stage {
                    name: "canary".into(),
                    node_selector: Some(canary),
                    ..Stage::rest()
                },
                Stage {
                    name: "early".into(),
                    size: Some(CountOrPercent::Percent(10)),
                    max_unavailable: CountOrPercent::Count(50),
                    ..Stage::rest()
                },
                Stage {
                    name: "fleet".into(),
                    max_unavailable: CountOrPercent::Percent(10),
                    ..Stage::rest()
                },
            ],
            ..RolloutSpec::default()
        },
        ..ProxyConfigSpec::default()
    };
    let nodes = (0..NODES).map(|i| {
        let name = format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250);
        let pool = if i % 2 == 0 { "a" } else { "b" };
        let mut labels = vec![("kubernetes.io/os", "linux"), ("pool", pool)];
        if i % 100 == 0 {
            labels.push(("kipvs.io/canary", "true"));
        }
        node(&name, &labels)
    });
    Fleet::new(proxy_config("fleet", spec), nodes)
}

fn healthy(_: &str, _: &str) -> Option<(NodePhase, bool)> {
    Some((NodePhase::Applied, true))
}

fn converge(f: &mut Fleet) {
    for _ in 0..200 {
        let d = f.step();
        if d.writes.is_empty() && d.status.stage.is_none() {
            return;
        }
        f.proxiers_report(healthy);
    }
    panic!("no convergence");
}

fn bench(c: &mut Criterion) {
    let mut f = fleet();
    converge(&mut f);
    let converged = f.clone();
    assert!(
        converged.decide().writes.is_empty(),
        "a converged fleet is not written"
    );

    // Mid-rollout of a gate flip: into the last stage, half of it done.
    let gates = &mut f.pc.spec.config.feature_gates;
    gates.insert(Gate::LoadBalancerIPMode.name().to_owned(), false);
    let target = f.decide().status.revision.unwrap();
    while f.pc.status.as_ref().unwrap().updated_nodes < (NODES / 2) as u32
        || f.pc.status.as_ref().unwrap().revision.as_deref() != Some(&target)
    {
        f.step();
        f.proxiers_report(healthy);
    }
    let d = f.decide();
    let changing = d
        .writes
        .iter()
        .filter(|w| matches!(w, Write::Assign { node, revision, .. } if f.revision_of(node) != Some(&**revision)))
        .count();
    assert_eq!(
        changing,
        d.writes.len(),
        "every write changes a node's desired revision"
    );
    assert_eq!(
        d.writes.len(),
        445,
        "10% of the last stage (4,450 nodes) at a time"
    );
    println!(
        "mid-rollout decision: {} writes of {NODES} nodes",
        d.writes.len()
    );

    let mut group = c.benchmark_group("decide");
    group.sample_size(20);
    group.bench_function("5000 nodes, mid-rollout", |b| {
        b.iter(|| black_box(f.decide()))
    });
    group.bench_function("5000 nodes, converged", |b| {
        b.iter(|| black_box(converged.decide()))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
