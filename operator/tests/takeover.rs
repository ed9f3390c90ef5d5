//! The fleet-wide move between kube-proxy and kipvs (`serviceProxy`), decision by decision, on
//! a small modelled cluster: kube-proxy's DaemonSet (patched to avoid nodes labelled
//! `kipvs.io/service-proxy=kipvs`) and each node's proxier as the contract in
//! `kipvs_crds::nodeproxyconfig` describes it. After every step the model checks that kipvs and
//! kube-proxy never program a node at the same time and that kube-proxy starts only on a node
//! where kipvs has stopped ("never two"), and counts the seconds each node has no serving proxy
//! ("never none": kube-proxy serves only [`KUBE_PROXY_START_UP`] after its pod started).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kipvs_crds::{NodePhase, ProxyConfigSpec, RolloutSpec, ServiceProxy, ServiceProxyPhase, Stage};
use kipvs_operator::rollout::{Decision, KubeProxyDaemonSet};
use kipvs_operator::sim::{Fleet, NodeStandIn, node, proxy_config};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long a node has to take a revision: short, so that a stuck takeover fails soon.
const APPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// kube-proxy's start-up time: from its pod's start to its first sync (a real one takes a few
/// seconds: image, iptables/ipset restore, the first full sync).
const KUBE_PROXY_START_UP: u64 = 5;

/// How a node's proxier or kube-proxy misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// kube-proxy's pod does not leave the node (a DaemonSet that was not patched there).
    KubeProxyStays,
    /// The proxier refuses every `kipvs` revision (keeps its `kube-proxy` one in force).
    Refuses,
    /// The proxier predates `status.serviceProxy`: it programs whatever it is given and
    /// reports Applied.
    Old,
    /// The proxier's pod never runs (crashlooping, Pending, ImagePullBackOff): it never
    /// follows its NodeProxyConfig and never reports.
    Silent,
}

/// The fleet, kube-proxy's DaemonSet and the proxiers.
struct Cluster {
    fleet: Fleet,
    nodes: BTreeMap<String, NodeStandIn>,
    faults: BTreeMap<String, Fault>,
    /// Nodes in the order their label first became `kipvs`.
    labelled_kipvs: Vec<String>,
    /// kube-proxy's DaemonSet lost its affinity: its pod runs on every node.
    unpatched: bool,
    /// The time, in ticks.
    clock: u64,
    /// When kube-proxy's pod last started on each node.
    kube_proxy_started: BTreeMap<String, u64>,
    /// Seconds each node had no serving proxy (nodes that always had one are absent).
    none: BTreeMap<String, u64>,
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
        ..LabelSelector::default()
    }
}

/// A canary, then the rest two at a time; `serviceProxy` as given.
fn spec(proxy: ServiceProxy, failure_budget: u32) -> ProxyConfigSpec {
    let mut spec = ProxyConfigSpec {
        rollout: RolloutSpec {
            stages: vec![
                Stage {
                    name: "canary".into(),
                    node_selector: Some(selector("kipvs.io/canary", "true")),
                    ..Stage::rest()
                },
                Stage {
                    name: "fleet".into(),
                    max_unavailable: kipvs_crds::CountOrPercent::Count(2),
                    ..Stage::rest()
                },
            ],
            apply_timeout: APPLY_TIMEOUT,
            failure_budget,
            ..RolloutSpec::default()
        },
        ..ProxyConfigSpec::default()
    };
    spec.config.service_proxy = proxy;
    spec
}

impl Cluster {
    /// `n` nodes `node-0..` (the first the canary) where kube-proxy runs and kipvs stands by,
    /// with `faults`; the ProxyConfig `spec`.
    fn new(n: usize, spec: ProxyConfigSpec, faults: &[(&str, Fault)]) -> Self {
        let nodes = (0..n).map(|i| {
            let name = format!("node-{i}");
            let canary = [("kipvs.io/canary", "true")];
            node(&name, if i == 0 { &canary[..] } else { &[] })
        });
        let fleet = Fleet::new(proxy_config("fleet", spec), nodes);
        let nodes = fleet
            .nodes
            .keys()
            .map(|name| (name.clone(), NodeStandIn::default()))
            .collect();
        Cluster {
            fleet,
            nodes,
            faults: faults
                .iter()
                .map(|(node, fault)| ((*node).to_owned(), *fault))
                .collect(),
            labelled_kipvs: Vec::new(),
            unpatched: false,
            clock: 0,
            kube_proxy_started: BTreeMap::new(),
            none: BTreeMap::new(),
        }
    }

    /// One second: the operator decides (writes and labels applied), kube-proxy's DaemonSet
    /// follows the labels, the proxiers follow their NodeProxyConfigs and report. Checks that
    /// no node has two programmers at any point, and counts the nodes with none.
    fn tick(&mut self) -> Decision {
        let decision = self.fleet.step();
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in &names {
            let label = self.fleet.label_of(name).map(str::to_owned);
            if label.as_deref() == Some("kipvs") && !self.labelled_kipvs.contains(name) {
                self.labelled_kipvs.push(name.clone());
            }
            let fault = self.faults.get(name).copied();
            let stays = fault == Some(Fault::KubeProxyStays) || self.unpatched;
            let alive = fault != Some(Fault::Silent);
            let model = self.nodes.get_mut(name).expect("modelled");
            match model.label(label.as_deref(), stays) {
                Ok(Some(true)) => {
                    self.kube_proxy_started.insert(name.clone(), self.clock);
                }
                Ok(_) => {}
                Err(e) => panic!("{name}: {e}"),
            }
            self.start_up(name);
            if alive {
                self.proxier(name);
            }
            let model = &self.nodes[name];
            assert!(
                !(model.kube_proxy() && model.kipvs_programs()),
                "{name}: kube-proxy and kipvs program at once"
            );
            if !model.serves(alive) {
                *self.none.entry(name.clone()).or_default() += 1;
            }
        }
        self.clock += 1;
        self.fleet.advance(Duration::from_secs(1));
        decision
    }

    /// kube-proxy has synced `node` once [`KUBE_PROXY_START_UP`] passed since its pod started.
    fn start_up(&mut self, node: &str) {
        let started = self.kube_proxy_started.get(node).copied();
        if started.is_some_and(|at| self.clock >= at + KUBE_PROXY_START_UP) {
            self.nodes
                .get_mut(node)
                .expect("modelled")
                .kube_proxy_synced();
        }
    }

    /// kube-proxy's DaemonSet is re-applied without its affinity (`kubeadm upgrade`, an addon
    /// manager): its pod starts on every node; the operator sees the DaemonSet as `seen`.
    fn unpatch(&mut self, seen: KubeProxyDaemonSet) {
        self.unpatched = true;
        self.fleet.kube_proxy = seen;
        for (name, model) in &mut self.nodes {
            if model.kube_proxy_returns() {
                self.kube_proxy_started.insert(name.clone(), self.clock);
            }
        }
    }

    /// The proxier of `node` starts crashlooping: it dies and never reports again.
    fn crashloop(&mut self, node: &str) {
        self.faults.insert(node.to_owned(), Fault::Silent);
        self.nodes.get_mut(node).expect("modelled").proxier_dies();
    }

    /// `node`'s proxier follows its NodeProxyConfig and reports (the contract in
    /// `kipvs_crds::nodeproxyconfig`).
    fn proxier(&mut self, node: &str) {
        let Some(npc) = self.fleet.npcs.get(node) else {
            return;
        };
        let want = npc.spec.config.service_proxy;
        let fault = self.faults.get(node).copied();
        let model = self.nodes.get_mut(node).expect("modelled");
        // What the reducer makes of it: a revision is Applied once kipvs programs it (one clean
        // sync, here within the step) or kube-proxy has it back, Pending while kipvs waits.
        let applied = |phase: ServiceProxyPhase| {
            if phase == ServiceProxyPhase::Standby || phase == ServiceProxyPhase::HandingBack {
                NodePhase::Pending
            } else {
                NodePhase::Applied
            }
        };
        let (phase, healthy, reported) = match (fault, want) {
            // It knows no serviceProxy: it takes over once kube-proxy has gone, as kipvs did
            // before the field, and reports Applied.
            (Some(Fault::Old), _) => {
                model.follow(ServiceProxy::Kipvs);
                (NodePhase::Applied, true, None)
            }
            // It keeps its kube-proxy revision in force.
            (Some(Fault::Refuses), ServiceProxy::Kipvs) => {
                let standing = model.follow(ServiceProxy::KubeProxy);
                (NodePhase::Failed, true, Some(standing.phase))
            }
            (_, want) => {
                let standing = model.follow(want);
                let healthy = standing.healthy.unwrap_or(true);
                (applied(standing.phase), healthy, Some(standing.phase))
            }
        };
        self.fleet
            .report_service_proxy(node, phase, healthy, "", reported);
    }

    /// Ticks until the rollout stands still (no write, no label, no stage in progress);
    /// returns the decisions. Panics after `limit` ticks.
    fn settle(&mut self, limit: usize) -> Vec<Decision> {
        let mut decisions = Vec::new();
        for _ in 0..limit {
            let d = self.tick();
            let still = d.writes.is_empty() && d.labels.is_empty() && d.status.stage.is_none();
            decisions.push(d);
            if still {
                return decisions;
            }
        }
        panic!("the rollout did not settle in {limit} ticks");
    }

    /// Changes `spec.config.serviceProxy` (a new revision).
    fn switch_to(&mut self, proxy: ServiceProxy) {
        self.fleet.pc.spec.config.service_proxy = proxy;
        self.fleet.pc.metadata.generation = self.fleet.pc.metadata.generation.map(|g| g + 1);
        self.labelled_kipvs.clear();
    }

    /// Who programs each node: "kipvs", "kube-proxy", "none" or "both".
    fn programmers(&self) -> BTreeMap<&str, &'static str> {
        self.nodes
            .iter()
            .map(|(name, m)| {
                let who = match (m.kipvs_programs(), m.kube_proxy()) {
                    (true, false) => "kipvs",
                    (false, true) => "kube-proxy",
                    (false, false) => "none",
                    (true, true) => "both",
                };
                (name.as_str(), who)
            })
            .collect()
    }

    fn labels(&self) -> BTreeSet<Option<&str>> {
        self.nodes.keys().map(|n| self.fleet.label_of(n)).collect()
    }
}

fn reasons(decisions: &[Decision]) -> Vec<&'static str> {
    decisions
        .iter()
        .flat_map(|d| d.events.iter().map(|e| e.reason))
        .collect()
}

/// The ProxyConfig's Degraded condition.
fn degraded_of(
    status: &kipvs_crds::ProxyConfigStatus,
) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    status
        .conditions
        .iter()
        .find(|cond| cond.type_ == "Degraded")
        .expect("a Degraded condition")
}

fn everyone(who: &str, cluster: &Cluster) {
    let programmers = cluster.programmers();
    assert!(
        programmers.values().all(|p| *p == who),
        "want {who} everywhere: {programmers:?}"
    );
}

/// kipvs installed with `serviceProxy: kube-proxy` stands by on every node (labelled
/// `kube-proxy`); the switch to `kipvs` then rolls in stages: the canary is labelled (kube-proxy
/// leaves) and taken over before any other node, the rest at most two at a time; the way back
/// hands every node back, each labelled `kube-proxy` only once kipvs has stopped writing there.
#[test]
fn the_takeover_and_the_way_back_roll_out_in_stages() {
    let mut c = Cluster::new(8, spec(ServiceProxy::KubeProxy, 0), &[]);
    c.settle(100);
    everyone("kube-proxy", &c);
    assert_eq!(c.labels(), BTreeSet::from([Some("kube-proxy")]));
    let standby = c.fleet.pc.status.clone().unwrap();
    assert_eq!(
        standby.last_good_revision, standby.revision,
        "standby is good"
    );

    c.switch_to(ServiceProxy::Kipvs);
    let mut in_flight_max = 0;
    let mut decisions = Vec::new();
    for _ in 0..200 {
        let d = c.tick();
        let labels_in_flight = c
            .nodes
            .values()
            .filter(|m| !m.kipvs_programs() && !m.kube_proxy())
            .count();
        in_flight_max = in_flight_max.max(labels_in_flight);
        let still = d.writes.is_empty() && d.labels.is_empty() && d.status.stage.is_none();
        decisions.push(d);
        if still {
            break;
        }
    }
    everyone("kipvs", &c);
    assert_eq!(c.labels(), BTreeSet::from([Some("kipvs")]));
    assert_eq!(c.labelled_kipvs[0], "node-0", "the canary first");
    let status = c.fleet.pc.status.clone().unwrap();
    assert_eq!(status.last_good_revision, status.revision);
    assert_ne!(status.last_good_revision, standby.last_good_revision);
    assert!(
        reasons(&decisions).contains(&"StageStarted"),
        "{:?}",
        reasons(&decisions)
    );
    // At most maxUnavailable (2) nodes between kube-proxy and kipvs at once.
    assert!(
        in_flight_max <= 2,
        "{in_flight_max} nodes without a proxy at once"
    );
    // No label was asked for twice: each node's label changed once.
    let label_writes: usize = decisions.iter().map(|d| d.labels.len()).sum();
    assert_eq!(label_writes, 8);

    c.switch_to(ServiceProxy::KubeProxy);
    c.settle(200);
    everyone("kube-proxy", &c);
    assert_eq!(c.labels(), BTreeSet::from([Some("kube-proxy")]));
    assert_eq!(c.none, BTreeMap::new(), "never none");
    let back = c.fleet.pc.status.clone().unwrap();
    assert_eq!(
        back.revision, standby.revision,
        "the standby revision again"
    );
    assert_eq!(back.last_good_revision, back.revision);
}

/// A node where kube-proxy does not leave stays in standby on the `kipvs` revision until
/// `applyTimeout` fails it; with no failure budget the revision is bad and every node goes back
/// to the last good one (`kube-proxy`): those that took over hand back, and every label ends
/// `kube-proxy`.
#[test]
fn a_takeover_that_never_completes_rolls_the_fleet_back_to_kube_proxy() {
    let stuck = [("node-5", Fault::KubeProxyStays)];
    let mut c = Cluster::new(8, spec(ServiceProxy::KubeProxy, 0), &stuck);
    c.settle(100);
    c.switch_to(ServiceProxy::Kipvs);
    let decisions = c.settle(400);
    let reasons = reasons(&decisions);
    assert!(reasons.contains(&"RevisionFailed"), "{reasons:?}");
    assert!(reasons.contains(&"RollingBack"), "{reasons:?}");
    everyone("kube-proxy", &c);
    assert_eq!(c.labels(), BTreeSet::from([Some("kube-proxy")]));
    assert_eq!(c.none, BTreeMap::new(), "never none");
    assert!(
        c.labelled_kipvs.len() > 1,
        "others had taken over before node-5 failed: {:?}",
        c.labelled_kipvs
    );
    let status = c.fleet.pc.status.clone().unwrap();
    let kipvs_revision = status.revision.clone().unwrap();
    assert!(status.bad_revisions.contains(&kipvs_revision));
    assert_ne!(status.last_good_revision.as_deref(), Some(&*kipvs_revision));
    assert!(
        c.fleet
            .npcs
            .values()
            .all(|n| n.spec.config.service_proxy == ServiceProxy::KubeProxy)
    );
}

/// A proxier that refuses the takeover (Failed, kipvs standing by) within the failure budget:
/// no rollback, the others take over, and the failed node's label goes back to `kube-proxy` so
/// that kube-proxy serves it instead of no proxy.
#[test]
fn a_refused_takeover_within_the_budget_gives_that_node_back_to_kube_proxy() {
    let refuses = [("node-3", Fault::Refuses)];
    let mut c = Cluster::new(6, spec(ServiceProxy::KubeProxy, 1), &refuses);
    c.settle(100);
    c.switch_to(ServiceProxy::Kipvs);
    let decisions = c.settle(200);
    assert!(!reasons(&decisions).contains(&"RollingBack"));
    let programmers = c.programmers();
    assert_eq!(programmers["node-3"], "kube-proxy");
    assert!(
        programmers
            .iter()
            .all(|(n, p)| *n == "node-3" || *p == "kipvs"),
        "{programmers:?}"
    );
    assert_eq!(c.fleet.label_of("node-3"), Some("kube-proxy"));
    assert_eq!(c.fleet.pc.status.as_ref().unwrap().failed_nodes, 1);
    assert_eq!(c.none, BTreeMap::new(), "never none");
}

/// Version skew: a proxier that predates `status.serviceProxy` serves a `kipvs` revision
/// (as it always did) but never reports handing a node back, so a `kube-proxy` revision fails
/// there by `applyTimeout` and is rolled back; its node is never labelled `kube-proxy`, so
/// kube-proxy never starts next to it.
#[test]
fn a_proxier_without_status_service_proxy_is_never_handed_to_kube_proxy() {
    let old = [("node-0", Fault::Old)];
    let mut c = Cluster::new(4, spec(ServiceProxy::Kipvs, 0), &old);
    // Unlabelled nodes run kube-proxy: the old proxier's canary programs only once its label
    // makes kube-proxy leave; the others take over as usual.
    c.settle(100);
    everyone("kipvs", &c);
    let good = c.fleet.pc.status.clone().unwrap().last_good_revision;

    c.switch_to(ServiceProxy::KubeProxy);
    let decisions = c.settle(400);
    assert!(reasons(&decisions).contains(&"RevisionFailed"));
    assert_eq!(
        c.fleet.label_of("node-0"),
        Some("kipvs"),
        "never kube-proxy"
    );
    assert!(
        decisions
            .iter()
            .flat_map(|d| &d.labels)
            .all(|l| l.node != "node-0")
    );
    everyone("kipvs", &c);
    let status = c.fleet.pc.status.clone().unwrap();
    assert_eq!(status.last_good_revision, good);
    assert_eq!(status.target_revision, good);
}

/// Labels follow the stored NodeProxyConfig and the proxier's report on it, not the decision:
/// a node is labelled `kipvs` only once its proxier has reported for the revision that makes
/// it take over (alive, standing by), and a label owed to a revision already assigned is
/// written while `spec.paused` holds NodeProxyConfig writes back.
#[test]
fn labels_follow_the_stored_node_proxy_config_even_while_paused() {
    let mut c = Cluster::new(3, spec(ServiceProxy::Kipvs, 0), &[]);
    let first = c.fleet.step();
    assert!(!first.writes.is_empty());
    assert!(first.labels.is_empty(), "nothing stored yet");
    let stored = c.fleet.step();
    assert!(
        stored.labels.is_empty(),
        "stored, but the proxier has not reported"
    );
    for node in c.fleet.npcs.keys().cloned().collect::<Vec<_>>() {
        let standby = Some(ServiceProxyPhase::Standby);
        c.fleet
            .report_service_proxy(&node, NodePhase::Pending, true, "", standby);
    }
    c.fleet.pc.spec.paused = true;
    let paused = c.fleet.step();
    assert!(paused.writes.is_empty(), "paused writes no NodeProxyConfig");
    let labelled: Vec<&str> = paused.labels.iter().map(|l| l.node.as_str()).collect();
    let assigned: Vec<&str> = c.fleet.npcs.keys().map(String::as_str).collect();
    assert_eq!(labelled, assigned, "the canary's label is owed");
    assert!(paused.labels.iter().all(|l| l.proxy == ServiceProxy::Kipvs));
}

/// The new kipvs pod on the canary crashloops (it never reports) when the fleet moves from
/// kube-proxy: the canary is never labelled `kipvs`, so kube-proxy stays and serves it; the
/// revision fails there by `applyTimeout` and rolls back. No node is ever without a serving
/// proxy. (Before issue 33 the canary was labelled `kipvs` as soon as its NodeProxyConfig was
/// stored: kube-proxy left and nothing took over.)
#[test]
fn a_crashlooping_proxier_on_the_canary_never_leaves_it_without_a_proxy() {
    let mut c = Cluster::new(6, spec(ServiceProxy::KubeProxy, 0), &[]);
    c.settle(100);
    c.crashloop("node-0");
    c.switch_to(ServiceProxy::Kipvs);
    let decisions = c.settle(400);
    let reasons = reasons(&decisions);
    assert!(reasons.contains(&"RevisionFailed"), "{reasons:?}");
    assert!(c.labelled_kipvs.is_empty(), "{:?}", c.labelled_kipvs);
    assert_eq!(c.none, BTreeMap::new(), "never none");
    everyone("kube-proxy", &c);
    assert_eq!(c.labels(), BTreeSet::from([Some("kube-proxy")]));
}

/// A fleet kipvs took over gets a new revision, and the canary's kipvs pod crashloops from
/// then on (its kipvs rules no longer kept): silent on the revision past `applyTimeout`, it is
/// labelled `kube-proxy` and kube-proxy serves it after its start-up; the revision fails and
/// rolls back, and the stale report of the revision it programmed before it died does not move
/// kube-proxy away again. The canary is without a proxy for at most applyTimeout + kube-proxy's
/// start-up (+ a decision); no other node ever. (Before issue 33 its label stayed `kipvs`: no
/// proxy for ever.)
#[test]
fn a_proxier_that_dies_on_a_migrated_canary_is_replaced_by_kube_proxy_within_apply_timeout() {
    let mut c = Cluster::new(6, spec(ServiceProxy::Kipvs, 0), &[]);
    c.settle(100);
    everyone("kipvs", &c);
    let good = c.fleet.pc.status.clone().unwrap().last_good_revision;
    c.crashloop("node-0");
    c.fleet.pc.spec.config.ipvs.scheduler = "lc".into();
    c.fleet.pc.metadata.generation = c.fleet.pc.metadata.generation.map(|g| g + 1);
    let decisions = c.settle(400);
    assert!(reasons(&decisions).contains(&"RevisionFailed"));
    assert_eq!(c.fleet.label_of("node-0"), Some("kube-proxy"));
    // Rolled back: the stale Applied report of the good revision leaves the label alone.
    for _ in 0..120 {
        c.tick();
    }
    assert_eq!(c.fleet.label_of("node-0"), Some("kube-proxy"));
    let without = c.none.get("node-0").copied().unwrap_or_default();
    let bound = APPLY_TIMEOUT.as_secs() + KUBE_PROXY_START_UP + 2;
    assert!(
        without <= bound,
        "node-0 without a proxy for {without} s (bound {bound})"
    );
    assert_eq!(c.none.len(), 1, "only the canary: {:?}", c.none);
    assert_eq!(c.fleet.pc.status.clone().unwrap().last_good_revision, good);
}

/// kube-proxy's DaemonSet re-applied without its affinity after a completed takeover
/// (`kubeadm upgrade`, an addon manager): kube-proxy starts on every node and kipvs stands by
/// (its rules kept until kube-proxy has synced). The operator changes no label (a `kube-proxy`
/// label would keep kube-proxy there after the DaemonSet is patched again) and says so in
/// Degraded `KubeProxyReturned`, naming the nodes and the missing patch; once the DaemonSet is
/// patched again kube-proxy leaves and kipvs takes every node back. Never none, never two.
/// (Before issue 33 the operator relabelled every node `kube-proxy` by `applyTimeout`.)
#[test]
fn kube_proxy_back_after_a_completed_takeover_is_reported_and_no_node_is_relabelled() {
    let mut c = Cluster::new(6, spec(ServiceProxy::Kipvs, 0), &[]);
    c.settle(100);
    everyone("kipvs", &c);
    c.unpatch(KubeProxyDaemonSet::Unpatched);
    let mut decisions = Vec::new();
    for _ in 0..(APPLY_TIMEOUT.as_secs() * 3) {
        decisions.push(c.tick());
    }
    everyone("kube-proxy", &c);
    assert!(
        decisions.iter().all(|d| d.labels.is_empty()),
        "no label written"
    );
    assert_eq!(c.labels(), BTreeSet::from([Some("kipvs")]));
    let status = c.fleet.pc.status.clone().unwrap();
    let degraded = degraded_of(&status);
    assert_eq!(degraded.reason, "KubeProxyReturned", "{degraded:?}");
    assert!(degraded.message.contains("node-0"), "{}", degraded.message);
    assert!(
        degraded.message.contains("lost the node affinity"),
        "{}",
        degraded.message
    );
    assert_eq!(
        reasons(&decisions)
            .iter()
            .filter(|r| **r == "KubeProxyReturned")
            .count(),
        1,
        "one Event"
    );

    // Without the DaemonSet in sight, the proxiers' reports (Standby after they programmed)
    // say the same.
    c.fleet.kube_proxy = KubeProxyDaemonSet::Unknown;
    let d = c.tick();
    assert!(d.labels.is_empty());
    let degraded = degraded_of(&d.status);
    assert_eq!(degraded.reason, "KubeProxyReturned");

    c.unpatched = false;
    c.fleet.kube_proxy = KubeProxyDaemonSet::Patched;
    c.settle(100);
    for _ in 0..5 {
        c.tick();
    }
    everyone("kipvs", &c);
    assert_eq!(c.none, BTreeMap::new(), "never none");
    let status = c.fleet.pc.status.clone().unwrap();
    let degraded = degraded_of(&status);
    assert_eq!(degraded.status, "False", "{degraded:?}");
}
