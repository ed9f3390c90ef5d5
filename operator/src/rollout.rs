//! The rollout decision, as a pure function: one `ProxyConfig`, the Nodes, the
//! `NodeProxyConfig`s and the time in; the writes to make, the status to report, the Events to
//! publish and when to look again out. No I/O and no clock, so it is unit-tested, simulated over
//! thousands of nodes (`tests/simulation.rs`) and benchmarked (`benches/decide.rs`) directly; the
//! controller is the I/O around it.
//!
//! # The rules (the field docs of [`kipvs_crds::ProxyConfigSpec`] are the user-facing version)
//!
//! - **Selection.** A node is the ProxyConfig's if `spec.nodeSelector` matches it. If another
//!   ProxyConfig also selects it, or its NodeProxyConfig is controlled by another ProxyConfig,
//!   it is a *conflict*: never written, counted and named in status, `Degraded`.
//! - **Skipped nodes**: being deleted, tainted `ToBeDeletedByClusterAutoscaler`, or NotReady.
//!   They get no writes and neither block a stage nor count as failures.
//! - **Revisions.** The target is spec's revision unless it is bad; then, with autoRollback,
//!   the last good revision (mode *rollback*), else spec's revision with no further writes (mode
//!   *halted*).
//! - **Node state** against the revision its NodeProxyConfig carries: *healthy* (status reports
//!   it Applied and healthy), *failed* (Failed, or not healthy once `applyTimeout` has passed
//!   since `spec.assignedAt`), otherwise *in flight*.
//! - **Stages** ([`RolloutSpec::effective_stages`]): a node belongs to the first stage whose
//!   selector matches and, for a sized stage, whose size bound (fixed when the revision's
//!   rollout starts) its name hash does not exceed. The *cursor* is the first stage not yet
//!   complete. Stages up to the cursor get the target revision, at most `maxUnavailable` of a
//!   stage's nodes in flight at once; stages after it keep the last good revision (nodes without
//!   a NodeProxyConfig get it; with no last good revision they get nothing and keep their local
//!   configuration). A stage is complete when every node that is not skipped is healthy or
//!   failed within the budget, its soak has passed since then, and (with `pause`) it has been
//!   promoted. A stage with no node to wait for is complete at once. When the last stage is
//!   complete, the target becomes the last good revision.
//! - **Failure.** More failed nodes on the target revision than `failureBudget` mark the
//!   revision bad; with autoRollback every node the ProxyConfig controls that is not on the last
//!   good revision gets it back at once (or loses its NodeProxyConfig if there is none).
//! - **Nodes no longer selected** lose the NodeProxyConfig this ProxyConfig controls.
//! - **`spec.paused`**: the decision is computed and reported, but nothing is written and no
//!   stage advances.

use crate::conditions::ConditionSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kipvs_crds::proxyconfig::parse_selector;
use kipvs_crds::revision::{config_revision, node_hash};
use kipvs_crds::{
    NodeFailure, NodePhase, NodeProxyConfig, NodeProxyConfigSpec, NodeProxyConfigStatus,
    PROMOTE_ANNOTATION, ProxierConfiguration, ProxyConfigSpec, ProxyConfigStatus, RolloutSpec,
    Stage, StagePhase, StageStatus,
};
use kube::core::{Selector, SelectorExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Taint the cluster autoscaler puts on a node it is about to delete (KEP-3836).
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// How many bad revisions, conflicting node names and failures status keeps.
const MAX_BAD_REVISIONS: usize = 10;
const MAX_LISTED: usize = 20;

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Why a node is skipped (neither written nor waited for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `metadata.deletionTimestamp` is set.
    Deleting,
    /// Tainted `ToBeDeletedByClusterAutoscaler`.
    ScaleDown,
    /// The Ready condition is not True.
    NotReady,
}

/// What the decision needs of a Node.
#[derive(Clone, Debug)]
pub struct NodeView<'a> {
    /// Node name (= NodeProxyConfig name).
    pub name: &'a str,
    /// Node uid.
    pub uid: Option<&'a str>,
    /// Node labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Set when the node is skipped.
    pub skip: Option<SkipReason>,
}

impl<'a> NodeView<'a> {
    /// Reads name, labels, deletion, the autoscaler taint and the Ready condition of `node`.
    pub fn from_node(node: &'a Node) -> Self {
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let skip = if node.metadata.deletion_timestamp.is_some() {
            Some(SkipReason::Deleting)
        } else if tainted {
            Some(SkipReason::ScaleDown)
        } else if !ready {
            Some(SkipReason::NotReady)
        } else {
            None
        };
        NodeView {
            name: node.metadata.name.as_deref().unwrap_or_default(),
            uid: node.metadata.uid.as_deref(),
            labels: node.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            skip,
        }
    }
}

/// What the decision needs of a NodeProxyConfig.
#[derive(Clone, Debug)]
pub struct NpcView<'a> {
    /// Name of the ProxyConfig that controls it (its controller ownerReference); None when it
    /// has none or that ProxyConfig no longer exists (an orphan, adopted by the ProxyConfig
    /// that selects the node).
    pub owner: Option<&'a str>,
    /// `spec.revision`.
    pub revision: &'a str,
    /// `spec.assignedAt`.
    pub assigned_at: Timestamp,
    /// What the proxier reported.
    pub status: Option<&'a NodeProxyConfigStatus>,
    /// `spec.config`, to notice hand edits (None: not known, e.g. a write the stores have not
    /// shown yet).
    pub config: Option<&'a ProxierConfiguration>,
}

impl<'a> NpcView<'a> {
    /// Reads the controller owner, the spec and the status of `npc`.
    pub fn from_npc(npc: &'a NodeProxyConfig) -> Self {
        let owner = npc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "ProxyConfig")
            .map(|o| o.name.as_str());
        NpcView {
            owner,
            revision: &npc.spec.revision,
            assigned_at: npc.spec.assigned_at.0,
            status: npc.status.as_ref(),
            config: Some(&npc.spec.config),
        }
    }
}

/// Everything one decision looks at.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// The ProxyConfig's name.
    pub name: &'a str,
    /// Its `metadata.generation`.
    pub generation: Option<i64>,
    /// Its spec.
    pub spec: &'a ProxyConfigSpec,
    /// Its status as last written (the rollout's memory: cursor, timestamps, last good).
    pub status: Option<&'a ProxyConfigStatus>,
    /// Its annotations (for [`PROMOTE_ANNOTATION`]).
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// Selectors of the other ProxyConfigs, for conflict detection.
    pub others: &'a [Selector],
    /// Every Node.
    pub nodes: &'a [NodeView<'a>],
    /// Every NodeProxyConfig, by name.
    pub npcs: &'a HashMap<&'a str, NpcView<'a>>,
    /// Nodes whose NodeProxyConfig write for this ProxyConfig keeps failing (being retried),
    /// with the last error ([`crate::writer`]); reported as Degraded `WriteFailed`.
    pub failing_writes: &'a BTreeMap<String, String>,
    /// The time of the decision.
    pub now: Timestamp,
}

/// A write to a NodeProxyConfig.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Create or update the node's NodeProxyConfig with this revision (and `assignedAt` = now).
    Assign {
        /// The node.
        node: String,
        /// The Node's uid (for the NodeProxyConfig's ownerReference to it), if known.
        node_uid: Option<String>,
        /// The revision.
        revision: Arc<str>,
        /// Its configuration.
        config: Arc<ProxierConfiguration>,
    },
    /// Delete the node's NodeProxyConfig (it is this ProxyConfig's and should not exist).
    Delete {
        /// The node.
        node: String,
    },
}

impl Write {
    /// The node written.
    pub fn node(&self) -> &str {
        match self {
            Write::Assign { node, .. } | Write::Delete { node } => node,
        }
    }

    /// The NodeProxyConfig an [`Write::Assign`] writes (None for a delete): named after the
    /// node, `spec.assignedAt` = `now`, controlled by `owner` (the ProxyConfig) and also owned
    /// by its Node, so that the garbage collector removes it with the Node. The one conversion
    /// from a decision to an object: the controller applies it, the simulation ([`crate::sim`])
    /// stores it.
    pub fn node_proxy_config(
        &self,
        owner: &OwnerReference,
        now: Timestamp,
    ) -> Option<NodeProxyConfig> {
        let Write::Assign {
            node,
            node_uid,
            revision,
            config,
        } = self
        else {
            return None;
        };
        let mut owners = vec![OwnerReference {
            controller: Some(true),
            ..owner.clone()
        }];
        if let Some(uid) = node_uid {
            owners.push(OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: node.clone(),
                uid: uid.clone(),
                controller: None,
                block_owner_deletion: None,
            });
        }
        let mut npc = NodeProxyConfig::new(
            node,
            NodeProxyConfigSpec {
                revision: revision.to_string(),
                assigned_at: Time(now),
                config: (**config).clone(),
            },
        );
        npc.metadata.owner_references = Some(owners);
        Some(npc)
    }
}

/// An Event to publish about the ProxyConfig.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// CamelCase reason, e.g. `StageStarted`.
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The status to report.
    pub status: ProxyConfigStatus,
    /// NodeProxyConfig writes, at most one per node.
    pub writes: Vec<Write>,
    /// Events to publish.
    pub events: Vec<Note>,
    /// When to decide again even if nothing changes (a soak ends, an apply timeout expires).
    pub requeue_after: Option<Duration>,
}

/// A node's state against the revision its NodeProxyConfig carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Healthy,
    InFlight,
    Failed,
}

/// One selected, non-conflicting node, with what the decision derives about it.
struct Member<'a> {
    view: &'a NodeView<'a>,
    hash: u64,
    npc: Option<&'a NpcView<'a>>,
    stage: usize,
}

impl Member<'_> {
    fn revision(&self) -> Option<&str> {
        self.npc.map(|n| n.revision)
    }
    fn health(&self, timeout: Duration, now: Timestamp) -> Option<Health> {
        self.npc.map(|npc| health(npc, timeout, now))
    }
}

fn health(npc: &NpcView<'_>, timeout: Duration, now: Timestamp) -> Health {
    let status = npc
        .status
        .filter(|s| s.observed_revision.as_deref() == Some(npc.revision));
    let phase = status.and_then(|s| s.phase);
    if phase == Some(NodePhase::Applied) && status.and_then(|s| s.healthy) == Some(true) {
        Health::Healthy
    } else if phase == Some(NodePhase::Failed) || now >= deadline(npc, timeout) {
        Health::Failed
    } else {
        Health::InFlight
    }
}

/// Whether the proxier reports the revision its NodeProxyConfig carries as Applied (healthy or
/// not).
fn applied(npc: &NpcView<'_>) -> bool {
    npc.status.is_some_and(|s| {
        s.observed_revision.as_deref() == Some(npc.revision) && s.phase == Some(NodePhase::Applied)
    })
}

fn deadline(npc: &NpcView<'_>, timeout: Duration) -> Timestamp {
    npc.assigned_at
        .checked_add(timeout)
        .unwrap_or(Timestamp::MAX)
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    let d = then.duration_since(now);
    Duration::try_from(d.max(SignedDuration::ZERO)).unwrap_or(Duration::ZERO)
}

/// Decides what to do about one ProxyConfig. See the module docs for the rules.
pub fn decide(input: &Input<'_>) -> Decision {
    let prev = input.status.cloned().unwrap_or_default();
    let mut d = Decider {
        input,
        prev: &prev,
        status: ProxyConfigStatus {
            observed_generation: input.generation,
            last_good_revision: prev.last_good_revision.clone(),
            last_good_config: prev.last_good_config.clone(),
            bad_revisions: prev.bad_revisions.clone(),
            ..ProxyConfigStatus::default()
        },
        writes: Vec::new(),
        events: Vec::new(),
        requeue: None,
        conditions: ConditionSet::new(&prev.conditions, input.now, input.generation),
    };
    d.run();
    let Decider {
        mut status,
        writes,
        events,
        requeue,
        conditions,
        ..
    } = d;
    status.conditions = conditions.finish();
    Decision {
        status,
        writes,
        events,
        requeue_after: requeue,
    }
}

struct Decider<'a> {
    input: &'a Input<'a>,
    prev: &'a ProxyConfigStatus,
    status: ProxyConfigStatus,
    writes: Vec<Write>,
    events: Vec<Note>,
    requeue: Option<Duration>,
    conditions: ConditionSet,
}

/// How the target revision was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Rollout,
    Halted,
    Rollback,
}

impl<'a> Decider<'a> {
    fn note(&mut self, warning: bool, reason: &'static str, message: String) {
        self.events.push(Note {
            warning,
            reason,
            message,
        });
    }

    fn requeue_at(&mut self, at: Timestamp) {
        let after = until(self.input.now, at);
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }

    fn run(&mut self) {
        let input = self.input;
        let spec = input.spec;
        self.conditions.set_paused(spec.paused);
        self.conditions.write_failures(input.failing_writes);
        let own = match spec.validate().and_then(|()| {
            spec.node_selector
                .as_ref()
                .map(|s| parse_selector(s, "spec.nodeSelector"))
                .transpose()
        }) {
            Ok(selector) => selector.unwrap_or_default(),
            Err(e) => {
                let message = e.to_string();
                if !self
                    .prev
                    .conditions
                    .iter()
                    .any(|c| c.reason == "InvalidSpec" && c.message == message)
                {
                    self.note(true, "InvalidSpec", message.clone());
                }
                self.conditions.invalid_spec(&message);
                self.status.revision = self.prev.revision.clone();
                self.status.target_revision = self.prev.target_revision.clone();
                return;
            }
        };
        let spec_revision = config_revision(&spec.config);
        self.status.revision = Some(spec_revision.clone());

        let Selection {
            mut members,
            mut conflicts,
            unselected_owned,
        } = select(input, &own);
        for node in unselected_owned {
            self.write(Write::Delete {
                node: node.to_owned(),
            });
        }
        conflicts.sort_unstable();
        self.report_conflicts(&conflicts);
        self.status.total_nodes = count(members.len() + conflicts.len());
        self.status.skipped_nodes = count(members.iter().filter(|m| m.view.skip.is_some()).count());
        members.sort_unstable_by(|a, b| (a.hash, a.view.name).cmp(&(b.hash, b.view.name)));

        let mode = target_mode(
            self.status.bad_revisions.contains(&spec_revision),
            spec.rollout.auto_rollback,
        );
        let drifted: Vec<&str> = members
            .iter()
            .filter(|m| m.view.skip.is_none() && m.npc.is_some_and(|n| self.drifted(n)))
            .map(|m| m.view.name)
            .collect();
        match mode {
            Mode::Rollout if members.is_empty() => self.no_nodes(spec_revision.clone()),
            Mode::Rollout => self.rollout(&mut members, spec_revision.clone()),
            Mode::Halted => self.halted(&members, spec_revision.clone()),
            Mode::Rollback => self.rollback(&members, &spec_revision),
        }
        self.restore_drifted(&members, &drifted, &spec_revision);
        self.report_availability(&members);
    }

    /// No node to configure: the rollout does not start (a revision is never "good" on no
    /// node, or nodes joining later would get it without a canary); the status says so and
    /// one Event tells when it starts selecting nothing.
    fn no_nodes(&mut self, target: String) {
        if self.prev.target_revision.as_deref() == Some(target.as_str()) {
            self.status.stages = self.prev.stages.clone();
            self.status.stage = self.prev.stage.clone();
        }
        self.status.target_revision = Some(target);
        let message = match self.status.conflicting_node_count {
            0 => "spec.nodeSelector selects no node: nothing to roll out".to_owned(),
            n => format!(
                "every node spec.nodeSelector selects ({n}) is also selected by another \
                 ProxyConfig: nothing to roll out"
            ),
        };
        let was = self
            .prev
            .conditions
            .iter()
            .any(|c| c.type_ == "Progressing" && c.reason == "NoNodes");
        if !was {
            self.note(true, "NoNodes", message.clone());
        }
        self.conditions.no_nodes(&message);
    }

    /// The configuration this ProxyConfig wrote for `revision`, if it still knows it.
    fn config_of(&self, revision: &str, spec_revision: &str) -> Option<&'a ProxierConfiguration> {
        if revision == spec_revision {
            Some(&self.input.spec.config)
        } else if self
            .input
            .status
            .and_then(|s| s.last_good_revision.as_deref())
            == Some(revision)
        {
            self.input.status.and_then(|s| s.last_good_config.as_ref())
        } else {
            None
        }
    }

    /// Whether a NodeProxyConfig's `spec.config` was edited by hand: it is not what this
    /// ProxyConfig wrote for its revision, and its content hashes to another revision.
    fn drifted(&self, npc: &NpcView<'_>) -> bool {
        let Some(config) = npc.config else {
            return false;
        };
        let spec_revision = self.status.revision.as_deref().unwrap_or_default();
        if self.config_of(npc.revision, spec_revision) == Some(config) {
            return false;
        }
        config_revision(config) != npc.revision
    }

    /// Drift is corrected: the operator owns NodeProxyConfig specs, so a node whose spec was
    /// edited by hand gets the configuration of its revision back (unless this decision writes
    /// it anyway), with a warning Event naming it.
    fn restore_drifted(&mut self, members: &[Member<'a>], drifted: &[&str], spec_revision: &str) {
        if drifted.is_empty() {
            return;
        }
        let written: HashSet<String> = self.writes.iter().map(|w| w.node().to_owned()).collect();
        let mut restored = Vec::new();
        for m in members.iter().filter(|m| drifted.contains(&m.view.name)) {
            let Some(npc) = m.npc else { continue };
            if written.contains(m.view.name) {
                continue;
            }
            if let Some(config) = self.config_of(npc.revision, spec_revision) {
                let revision: Arc<str> = npc.revision.into();
                self.assign(m.view, &revision, &Arc::new(config.clone()));
                restored.push(m.view.name);
            }
        }
        if !restored.is_empty() {
            self.note(
                true,
                "DriftRestored",
                format!(
                    "{} NodeProxyConfig spec(s) edited by hand were restored to the \
                     configuration of their revision: {}",
                    restored.len(),
                    list(&restored)
                ),
            );
        }
    }

    fn report_conflicts(&mut self, conflicts: &[&str]) {
        self.status.conflicting_node_count = count(conflicts.len());
        self.status.conflicting_nodes = conflicts
            .iter()
            .take(MAX_LISTED)
            .map(|s| s.to_string())
            .collect();
        if !conflicts.is_empty() && self.prev.conflicting_nodes != self.status.conflicting_nodes {
            self.note(
                true,
                "NodeConflict",
                format!(
                    "{} node(s) are also selected by another ProxyConfig and are left alone: {}",
                    conflicts.len(),
                    list(conflicts)
                ),
            );
        }
        self.conditions.conflicts(conflicts);
    }

    /// Available: no node this ProxyConfig controls is failed on the revision it carries.
    fn report_availability(&mut self, members: &[Member<'_>]) {
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        let mut failed = Vec::new();
        let mut healthy = 0;
        let mut eligible = 0;
        for m in members.iter().filter(|m| m.view.skip.is_none()) {
            match m.health(timeout, now) {
                Some(Health::Healthy) => healthy += 1,
                Some(Health::Failed) => failed.push(m.view.name),
                _ => {}
            }
            eligible += 1;
        }
        let was_available = self
            .prev
            .conditions
            .iter()
            .find(|c| c.type_ == "Available")
            .is_none_or(|c| c.status == "True");
        // Nodes failing the rollout have their NodeFailed Events; the others (a node unhealthy
        // after its stage completed, on a latched or good revision) get this one.
        let unhealthy: Vec<&str> = failed
            .iter()
            .copied()
            .filter(|n| self.status.failures.iter().all(|f| f.node != *n))
            .collect();
        if was_available && !unhealthy.is_empty() {
            self.note(
                true,
                "NodesUnhealthy",
                format!(
                    "{} node(s) are unhealthy on the revision they carry (not counted against \
                     a revision whose stage completed): {}",
                    unhealthy.len(),
                    list(&unhealthy)
                ),
            );
        }
        self.conditions.available(&failed, healthy, eligible);
    }

    /// Records a write, unless spec.paused (then nothing is written).
    fn write(&mut self, write: Write) {
        if !self.input.spec.paused {
            self.writes.push(write);
        }
    }

    fn assign(
        &mut self,
        node: &NodeView<'_>,
        revision: &Arc<str>,
        config: &Arc<ProxierConfiguration>,
    ) {
        self.write(Write::Assign {
            node: node.name.to_owned(),
            node_uid: node.uid.map(str::to_owned),
            revision: revision.clone(),
            config: config.clone(),
        });
    }

    /// After a revision failed, status keeps its stages and failures for diagnosis (unless this
    /// decision just filled them).
    fn keep_failed_rollout(&mut self) {
        if self.status.stages.is_empty() {
            self.status.stages = self.prev.stages.clone();
        }
        if self.status.failures.is_empty() {
            self.status.failures = self.prev.failures.clone();
        }
    }

    /// Every node this ProxyConfig controls returns to the last good revision at once.
    fn rollback(&mut self, members: &[Member<'_>], bad: &str) {
        let good = self.status.last_good_revision.clone();
        self.status.target_revision = good.clone();
        self.keep_failed_rollout();
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        let mut returning = 0;
        let (mut updated, mut healthy) = (0, 0);
        match (good, self.status.last_good_config.clone()) {
            (Some(good), Some(config)) => {
                let revision: Arc<str> = good.as_str().into();
                let config = Arc::new(config);
                for m in members.iter().filter(|m| m.view.skip.is_none()) {
                    if m.revision() == Some(&good) {
                        updated += 1;
                        match m.health(timeout, now) {
                            Some(Health::Healthy) => healthy += 1,
                            Some(Health::InFlight) => {
                                returning += 1;
                                if let Some(npc) = m.npc {
                                    self.requeue_at(deadline(npc, timeout));
                                }
                            }
                            _ => {}
                        }
                    } else {
                        returning += 1;
                        self.assign(m.view, &revision, &config);
                    }
                }
            }
            _ => {
                for m in members
                    .iter()
                    .filter(|m| m.view.skip.is_none() && m.npc.is_some())
                {
                    returning += 1;
                    self.write(Write::Delete {
                        node: m.view.name.to_owned(),
                    });
                }
            }
        }
        self.status.updated_nodes = updated;
        self.status.healthy_nodes = healthy;
        self.conditions
            .rolled_back(bad, self.status.last_good_revision.as_deref(), returning);
        if returning > 0 && self.prev.target_revision.as_deref() == Some(bad) {
            let to = self
                .status
                .last_good_revision
                .as_deref()
                .unwrap_or("the local configuration");
            self.note(
                true,
                "RollingBack",
                format!("revision {bad} is bad: returning {returning} node(s) to {to}"),
            );
        }
    }

    /// A bad revision without autoRollback: nothing moves; nodes without configuration still get
    /// the last good revision.
    fn halted(&mut self, members: &[Member<'_>], bad: String) {
        self.keep_failed_rollout();
        self.status.updated_nodes = count(
            members
                .iter()
                .filter(|m| m.revision() == Some(&bad))
                .count(),
        );
        self.status.target_revision = Some(bad.clone());
        if let (Some(good), Some(config)) = (
            self.status.last_good_revision.clone(),
            self.status.last_good_config.clone(),
        ) {
            let revision: Arc<str> = good.into();
            let config = Arc::new(config);
            for m in members
                .iter()
                .filter(|m| m.view.skip.is_none() && m.npc.is_none())
            {
                self.assign(m.view, &revision, &config);
            }
        }
        self.conditions.halted(&bad);
    }

    /// A revision rolling out, in the order of its decisions: stage membership, health
    /// (latched per revision), the failure budget, the stage cursor, the writes, then the
    /// status of where the rollout stands.
    fn rollout(&mut self, members: &mut [Member<'a>], target: String) {
        let input = self.input;
        let rollout: &RolloutSpec = &input.spec.rollout;
        let stages = rollout.effective_stages();
        let now = input.now;
        let continuing = self.prev.target_revision.as_deref() == Some(target.as_str());
        let done = continuing && self.prev.last_good_revision.as_deref() == Some(target.as_str());
        self.status.target_revision = Some(target.clone());

        let mut stage_status = carried_stage_statuses(&stages, &self.prev.stages, continuing, done);
        assign_stages(&stages, &mut stage_status, members);

        let timeout = rollout.apply_timeout;
        let health = stage_health(members, &target, &mut stage_status, timeout, now);
        for at in &health.deadlines {
            self.requeue_at(*at);
        }
        self.status.updated_nodes = count(stage_status.iter().map(|s| s.updated as usize).sum());
        self.status.healthy_nodes = count(stage_status.iter().map(|s| s.healthy as usize).sum());
        self.status.failed_nodes = count(health.failed.len());
        let failed_names: Vec<&str> = health.failed.iter().map(|m| m.view.name).collect();
        self.report_failures(&target, &health.failed);

        // A revision that already reached every node is the last good one: its failures only
        // make the ProxyConfig unavailable.
        if !done && over_budget(health.failed.len(), rollout.failure_budget) {
            self.status.stages = stage_status;
            self.fail_revision(members, target, &failed_names);
            return;
        }
        self.conditions.failures_within_budget(
            &target,
            &failed_names,
            rollout.failure_budget,
            done,
        );

        let promote = input.annotations.and_then(|a| a.get(PROMOTE_ANNOTATION));
        let cursor = advance_stages(
            &stages,
            &mut stage_status,
            &target,
            now,
            input.spec.paused,
            promote.map(String::as_str),
        );
        if let Some(at) = cursor.soak_end {
            self.requeue_at(at);
        }
        self.events.extend(cursor.notes.iter().cloned());

        self.write_rollout(
            members,
            &target,
            &stages,
            &mut stage_status,
            &health,
            &cursor,
        );
        self.report_cursor(&stages, &stage_status, &cursor, &target);
        self.conditions.progress(
            &target,
            &stages,
            &stage_status,
            cursor.at,
            self.status.updated_nodes,
            self.status.healthy_nodes,
        );
        self.status.stages = stage_status;
    }

    /// More failures than the budget: the revision is bad; with autoRollback the nodes return
    /// to the last good revision, else the rollout halts.
    fn fail_revision(&mut self, members: &[Member<'_>], target: String, failed: &[&str]) {
        let rollout = &self.input.spec.rollout;
        self.status.bad_revisions.push(target.clone());
        let excess = self
            .status
            .bad_revisions
            .len()
            .saturating_sub(MAX_BAD_REVISIONS);
        self.status.bad_revisions.drain(..excess);
        self.note(
            true,
            "RevisionFailed",
            format!(
                "revision {target} failed on {} node(s) (failure budget {}): {}",
                failed.len(),
                rollout.failure_budget,
                list(failed)
            ),
        );
        self.conditions.revision_failed(&target, failed);
        if rollout.auto_rollback {
            self.rollback(members, &target);
        } else {
            self.halted(members, target);
        }
    }

    /// The writes of a rollout ([`rollout_writes`]): the target revision to the chosen nodes
    /// (counted as updated; their apply deadline is the next look), the last good revision to
    /// unconfigured nodes beyond the cursor.
    fn write_rollout(
        &mut self,
        members: &[Member<'_>],
        target: &str,
        stages: &[Stage],
        stage_status: &mut [StageStatus],
        health: &StageHealth<'_, '_>,
        cursor: &Cursor,
    ) {
        let revision: Arc<str> = target.into();
        let config = Arc::new(self.input.spec.config.clone());
        let good: Option<(Arc<str>, Arc<ProxierConfiguration>)> = self
            .status
            .last_good_revision
            .clone()
            .zip(self.status.last_good_config.clone())
            .map(|(r, c)| (r.into(), Arc::new(c)));
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        for (m, assignment) in rollout_writes(
            members,
            target,
            stages,
            stage_status,
            &health.in_flight,
            cursor,
        ) {
            match assignment {
                Assignment::Target => {
                    self.assign(m.view, &revision, &config);
                    stage_status[m.stage].updated += 1;
                    self.status.updated_nodes += 1;
                    self.requeue_at(now.checked_add(timeout).unwrap_or(Timestamp::MAX));
                }
                Assignment::LastGood => {
                    if let Some((good_revision, good_config)) = &good {
                        self.assign(m.view, good_revision, good_config);
                    }
                }
            }
        }
    }

    /// Where the rollout stands: complete (the target becomes the last good revision), or the
    /// stage it waits in and why (too few nodes, a promotion).
    fn report_cursor(
        &mut self,
        stages: &[Stage],
        stage_status: &[StageStatus],
        cursor: &Cursor,
        target: &str,
    ) {
        if cursor.at == stages.len() {
            if self.status.last_good_revision.as_deref() != Some(target) {
                self.status.last_good_revision = Some(target.to_owned());
                self.status.last_good_config = Some(self.input.spec.config.clone());
                let message = match self.status.conflicting_node_count {
                    0 => format!("revision {target} is on every node"),
                    n => format!(
                        "revision {target} is on every node this ProxyConfig controls ({n} \
                         conflicting node(s) are left alone and may run another revision)"
                    ),
                };
                self.note(false, "RolloutComplete", message);
            }
            self.status.stage = None;
            return;
        }
        let stage = &stages[cursor.at];
        self.status.stage = Some(stage.name.clone());
        if let Some(waiting) = cursor.too_small {
            let message = format!(
                "stage {} of revision {target} needs at least {} node(s) (minNodes) and has \
                 {waiting} that are neither skipped nor conflicting: the rollout waits",
                stage.name, stage.min_nodes
            );
            if self.prev.conditions.iter().all(|c| c.message != message) {
                self.note(true, "StageTooSmall", message.clone());
            }
            self.conditions.stage_too_small(&message);
        }
        if stage_status[cursor.at].phase == StagePhase::AwaitingPromotion {
            let command = format!(
                "kubectl annotate proxyconfig {} {PROMOTE_ANNOTATION}={}@{target} --overwrite",
                self.input.name, stage.name
            );
            if self.prev.stage.as_deref() != Some(stage.name.as_str())
                || self.prev.stages.get(cursor.at).map(|s| s.phase)
                    != Some(StagePhase::AwaitingPromotion)
            {
                self.note(
                    false,
                    "StageAwaitingPromotion",
                    format!("stage {} waits for promotion: {command}", stage.name),
                );
            }
            self.conditions.awaiting_promotion(&stage.name, &command);
        }
    }

    /// Failed nodes in status, and an Event for each node that newly failed.
    fn report_failures(&mut self, target: &str, failed: &[&Member<'_>]) {
        let timeout = self.input.spec.rollout.apply_timeout;
        for m in failed.iter().take(MAX_LISTED) {
            let status = m.npc.and_then(|n| n.status);
            let message = match status.filter(|s| s.phase == Some(NodePhase::Failed)) {
                Some(s) => format!("Failed: {}", s.message.as_deref().unwrap_or("(no message)")),
                None => format!(
                    "not applied and healthy within applyTimeout {} (reported: observedRevision {}, phase {}, healthy {})",
                    kipvs_crds::duration::format(timeout),
                    status
                        .and_then(|s| s.observed_revision.as_deref())
                        .unwrap_or("-"),
                    status
                        .and_then(|s| s.phase)
                        .map_or_else(|| "-".to_owned(), |p| format!("{p:?}")),
                    status
                        .and_then(|s| s.healthy)
                        .map_or_else(|| "-".to_owned(), |h| h.to_string()),
                ),
            };
            let failure = NodeFailure {
                node: m.view.name.to_owned(),
                revision: target.to_owned(),
                message,
            };
            if !self
                .prev
                .failures
                .iter()
                .any(|f| f.node == failure.node && f.revision == failure.revision)
            {
                self.note(
                    true,
                    "NodeFailed",
                    format!(
                        "node {} failed revision {target}: {}",
                        failure.node, failure.message
                    ),
                );
            }
            self.status.failures.push(failure);
        }
    }
}

/// The nodes a ProxyConfig decides about, as [`select`] sorts them.
struct Selection<'a> {
    /// Selected, not conflicting; with the NodeProxyConfig if this ProxyConfig controls it.
    members: Vec<Member<'a>>,
    /// Selected, but also selected by another ProxyConfig or controlled by one: left alone.
    conflicts: Vec<&'a str>,
    /// Nodes with a NodeProxyConfig of this ProxyConfig that it no longer selects, or whose
    /// Node is gone: their NodeProxyConfig is deleted.
    unselected_owned: Vec<&'a str>,
}

/// Selection (membership before stages): which nodes `own` selects, which of them conflict
/// with another ProxyConfig, and which NodeProxyConfigs of this one have no selected node.
/// An orphan (its controlling ProxyConfig is gone) is adopted by the one that selects its node,
/// through the staged rollout.
fn select<'a>(input: &Input<'a>, own: &Selector) -> Selection<'a> {
    let mut selection = Selection {
        members: Vec::with_capacity(input.nodes.len()),
        conflicts: Vec::new(),
        unselected_owned: Vec::new(),
    };
    for view in input.nodes {
        let npc = input.npcs.get(view.name);
        let ours = npc.is_some_and(|n| n.owner == Some(input.name));
        if !own.matches(view.labels) {
            if ours {
                selection.unselected_owned.push(view.name);
            }
            continue;
        }
        let foreign = npc.is_some_and(|n| n.owner.is_some_and(|o| o != input.name));
        if foreign || input.others.iter().any(|o| o.matches(view.labels)) {
            selection.conflicts.push(view.name);
            continue;
        }
        selection.members.push(Member {
            view,
            hash: node_hash(view.name),
            npc: npc.filter(|_| ours),
            stage: 0,
        });
    }
    let node_names: HashSet<&str> = input.nodes.iter().map(|n| n.name).collect();
    for (name, npc) in input.npcs {
        if npc.owner == Some(input.name) && !node_names.contains(name) {
            selection.unselected_owned.push(name);
        }
    }
    selection
}

/// The target revision's mode: spec's revision rolls out unless it is bad; a bad one is
/// rolled back (autoRollback) or halts the rollout.
fn target_mode(bad: bool, auto_rollback: bool) -> Mode {
    match (bad, auto_rollback) {
        (false, _) => Mode::Rollout,
        (true, false) => Mode::Halted,
        (true, true) => Mode::Rollback,
    }
}

/// Whether `failed` nodes exceed the failure budget (the budget is how many may fail).
fn over_budget(failed: usize, budget: u32) -> bool {
    failed > budget as usize
}

/// Where [`advance_stages`] stopped.
struct Cursor {
    /// The first stage not complete (`stages.len()`: every stage is).
    at: usize,
    /// The cursor's stage has fewer than `minNodes` nodes to wait for (how many it has).
    too_small: Option<u32>,
    /// When the cursor's stage ends its soak (the decision's next look).
    soak_end: Option<Timestamp>,
    /// StageStarted, StageEmpty, StagePromoted and StageComplete Events, in order.
    notes: Vec<Note>,
}

/// The stage cursor: walks the stages in order, completing each one that is done (every node
/// that is not skipped settled, soak passed, promoted if it pauses) and stopping at the first
/// that is not. Sets each stage's phase and timestamps (`startedAt`, `healthyAt`, `promotedAt`)
/// in `stage_status`. With `paused`, no stage advances.
fn advance_stages(
    stages: &[Stage],
    stage_status: &mut [StageStatus],
    target: &str,
    now: Timestamp,
    paused: bool,
    promote: Option<&str>,
) -> Cursor {
    let mut cursor = Cursor {
        at: stages.len(),
        too_small: None,
        soak_end: None,
        notes: Vec::new(),
    };
    let mut note = |warning: bool, reason: &'static str, message: String| {
        cursor.notes.push(Note {
            warning,
            reason,
            message,
        });
    };
    for (i, stage) in stages.iter().enumerate() {
        let st = &mut stage_status[i];
        if st.phase == StagePhase::Complete {
            continue;
        }
        cursor.at = i;
        if paused {
            return cursor;
        }
        let waiting = st.total - st.skipped;
        if waiting < stage.min_nodes {
            st.phase = StagePhase::Waiting;
            st.healthy_at = None;
            cursor.too_small = Some(waiting);
            return cursor;
        }
        if st.started_at.is_none() {
            st.started_at = Some(Time(now));
            let message = format!(
                "stage {} started for revision {target}: {} node(s), maxUnavailable {}",
                stage.name, st.total, stage.max_unavailable
            );
            note(false, "StageStarted", message);
        }
        if st.healthy + st.failed < waiting {
            st.phase = StagePhase::Progressing;
            st.healthy_at = None;
            return cursor;
        }
        let empty = waiting == 0;
        let healthy_at = st.healthy_at.get_or_insert(Time(now)).0;
        let soak_end = healthy_at
            .checked_add(stage.soak_duration)
            .unwrap_or(Timestamp::MAX);
        if !empty && now < soak_end {
            st.phase = StagePhase::Soaking;
            cursor.soak_end = Some(soak_end);
            return cursor;
        }
        if !empty && stage.pause && st.promoted_at.is_none() {
            if promote == Some(format!("{}@{target}", stage.name).as_str()) {
                st.promoted_at = Some(Time(now));
                let message = format!("stage {} of revision {target} promoted", stage.name);
                note(false, "StagePromoted", message);
            } else {
                st.phase = StagePhase::AwaitingPromotion;
                return cursor;
            }
        }
        st.phase = StagePhase::Complete;
        if empty {
            let message = format!(
                "stage {} of revision {target} has no node to wait for ({} node(s), {} \
                 skipped): it completes without running; set minNodes on the stage to make \
                 the rollout wait instead",
                stage.name, st.total, st.skipped
            );
            note(true, "StageEmpty", message);
        }
        let message = format!(
            "stage {} complete for revision {target}: {} healthy, {} failed, {} skipped",
            stage.name, st.healthy, st.failed, st.skipped
        );
        note(false, "StageComplete", message);
    }
    cursor.at = stages.len();
    cursor
}

/// Which revision a rollout writes to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Assignment {
    /// The revision rolling out.
    Target,
    /// The last good revision (a node beyond the cursor without a NodeProxyConfig).
    LastGood,
}

/// The rollout's writes: members of stages up to the cursor that are not skipped and not on
/// the target get it, at most `maxUnavailable` of a stage in flight at once (at least one;
/// the cursor's stage gets none while it is too small); members beyond the cursor without a
/// NodeProxyConfig get the last good revision.
fn rollout_writes<'m, 'a>(
    members: &'m [Member<'a>],
    target: &str,
    stages: &[Stage],
    stage_status: &[StageStatus],
    in_flight: &[usize],
    cursor: &Cursor,
) -> Vec<(&'m Member<'a>, Assignment)> {
    let mut slots: Vec<usize> = stages
        .iter()
        .zip(stage_status)
        .zip(in_flight)
        .map(|((stage, st), &busy)| {
            stage
                .max_unavailable
                .of(st.total as usize)
                .max(1)
                .saturating_sub(busy)
        })
        .collect();
    let mut writes = Vec::new();
    for m in members {
        if m.view.skip.is_some() || m.revision() == Some(target) {
            continue;
        }
        if m.stage < cursor.at || (m.stage == cursor.at && cursor.too_small.is_none()) {
            if slots[m.stage] > 0 {
                slots[m.stage] -= 1;
                writes.push((m, Assignment::Target));
            }
        } else if m.npc.is_none() {
            writes.push((m, Assignment::LastGood));
        }
    }
    writes
}

/// What [`stage_health`] finds.
struct StageHealth<'m, 'a> {
    /// Members failed on the target revision (counted against the failure budget).
    failed: Vec<&'m Member<'a>>,
    /// Per stage: members given the target that are neither healthy nor failed yet.
    in_flight: Vec<usize>,
    /// Apply deadlines of the members in flight (when to look again).
    deadlines: Vec<Timestamp>,
}

/// Counts each stage's members against the target revision into `stage_status` (total,
/// skipped, updated, healthy, failed) and returns the failed ones and those in flight.
///
/// Health is latched per revision: a member that applied the target and whose stage is already
/// Complete (soak included) is done; a later `/livez` blip is not a failure of the revision (the
/// Available condition reports it).
fn stage_health<'m, 'a>(
    members: &'m [Member<'a>],
    target: &str,
    stage_status: &mut [StageStatus],
    timeout: Duration,
    now: Timestamp,
) -> StageHealth<'m, 'a> {
    let mut found = StageHealth {
        failed: Vec::new(),
        in_flight: vec![0; stage_status.len()],
        deadlines: Vec::new(),
    };
    for m in members {
        let st = &mut stage_status[m.stage];
        st.total += 1;
        if m.view.skip.is_some() {
            st.skipped += 1;
            continue;
        }
        if m.revision() != Some(target) {
            continue;
        }
        st.updated += 1;
        let latched = st.phase == StagePhase::Complete && m.npc.is_some_and(applied);
        match m.health(timeout, now) {
            Some(Health::Healthy) => st.healthy += 1,
            Some(Health::Failed) if latched => {}
            Some(Health::Failed) => {
                st.failed += 1;
                found.failed.push(m);
            }
            Some(Health::InFlight) | None => {
                found.in_flight[m.stage] += 1;
                if let Some(npc) = m.npc {
                    found.deadlines.push(deadline(npc, timeout));
                }
            }
        }
    }
    found
}

/// The stage statuses a decision starts from: carried over by name while the same revision
/// rolls out (`continuing`), else fresh (Waiting, or Complete when the revision is already the
/// last good one).
fn carried_stage_statuses(
    stages: &[Stage],
    previous: &[StageStatus],
    continuing: bool,
    done: bool,
) -> Vec<StageStatus> {
    let carried: HashMap<&str, &StageStatus> = if continuing {
        previous.iter().map(|s| (s.name.as_str(), s)).collect()
    } else {
        HashMap::new()
    };
    stages
        .iter()
        .map(|stage| match carried.get(stage.name.as_str()) {
            Some(s) => StageStatus {
                name: stage.name.clone(),
                phase: s.phase,
                size_bound: s.size_bound.clone(),
                started_at: s.started_at.clone(),
                healthy_at: s.healthy_at.clone(),
                promoted_at: s.promoted_at.clone(),
                ..StageStatus::default()
            },
            None => StageStatus {
                name: stage.name.clone(),
                phase: if done {
                    StagePhase::Complete
                } else {
                    StagePhase::Waiting
                },
                ..StageStatus::default()
            },
        })
        .collect()
}

/// Stage membership: each member goes to the first stage whose selector matches it and, for a
/// sized stage, whose size bound its hash does not exceed (a bound is fixed, in
/// `stage_status[].sizeBound`, by the first decision of the revision: the hash of the last
/// member the stage took). `members` must be sorted by hash, the order sized stages take them in.
fn assign_stages(stages: &[Stage], stage_status: &mut [StageStatus], members: &mut [Member<'_>]) {
    let selectors: Vec<Selector> = stages
        .iter()
        .map(|s| {
            s.node_selector
                .as_ref()
                .map(|sel| parse_selector(sel, "").expect("validated"))
                .unwrap_or_default()
        })
        .collect();
    let pool = members.len();
    let mut taken = vec![0usize; stages.len()];
    let mut bounds: Vec<Option<u64>> = stage_status
        .iter()
        .map(|s| {
            s.size_bound
                .as_deref()
                .and_then(|b| u64::from_str_radix(b, 16).ok())
        })
        .collect();
    let fresh_bound: Vec<bool> = stages
        .iter()
        .zip(&bounds)
        .map(|(s, b)| s.size.is_some() && b.is_none())
        .collect();
    for m in members.iter_mut() {
        let mut stage = stages.len() - 1;
        for (i, s) in stages.iter().enumerate() {
            if !selectors[i].matches(m.view.labels) {
                continue;
            }
            let fits = match s.size {
                None => true,
                Some(size) if fresh_bound[i] => taken[i] < size.of(pool),
                Some(_) => bounds[i].is_some_and(|b| m.hash <= b),
            };
            if fits {
                stage = i;
                break;
            }
        }
        m.stage = stage;
        taken[stage] += 1;
        if fresh_bound[stage] {
            bounds[stage] = Some(m.hash);
        }
    }
    for (i, status) in stage_status.iter_mut().enumerate() {
        if stages[i].size.is_some() {
            status.size_bound = bounds[i].map(|b| format!("{b:016x}"));
        }
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The first names of a list, for messages.
pub(crate) fn list(names: &[&str]) -> String {
    let mut text = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        text.push_str(&format!(" and {} more", names.len() - 5));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, soak: u64, min_nodes: u32) -> Stage {
        Stage {
            name: name.to_owned(),
            soak_duration: Duration::from_secs(soak),
            min_nodes,
            ..Stage::rest()
        }
    }

    fn status(name: &str, total: u32, skipped: u32, healthy: u32) -> StageStatus {
        StageStatus {
            name: name.to_owned(),
            total,
            skipped,
            healthy,
            ..StageStatus::default()
        }
    }

    fn reasons(cursor: &Cursor) -> Vec<&'static str> {
        cursor.notes.iter().map(|n| n.reason).collect()
    }

    #[test]
    fn the_cursor_stops_at_a_soaking_stage_until_its_soak_ends() {
        let stages = [stage("canary", 10, 1), stage("rest", 0, 0)];
        let mut st = vec![status("canary", 1, 0, 1), status("rest", 3, 0, 0)];
        let t0 = Timestamp::UNIX_EPOCH;
        let cursor = advance_stages(&stages, &mut st, "r1", t0, false, None);
        assert_eq!(cursor.at, 0);
        assert_eq!(st[0].phase, StagePhase::Soaking);
        assert_eq!(
            cursor.soak_end,
            Some(t0.checked_add(Duration::from_secs(10)).unwrap())
        );
        assert_eq!(reasons(&cursor), ["StageStarted"]);

        let t1 = t0.checked_add(Duration::from_secs(10)).unwrap();
        let cursor = advance_stages(&stages, &mut st, "r1", t1, false, None);
        assert_eq!(cursor.at, 1, "soaked: the next stage");
        assert_eq!(st[0].phase, StagePhase::Complete);
        assert_eq!(st[1].phase, StagePhase::Progressing);
        assert_eq!(reasons(&cursor), ["StageComplete", "StageStarted"]);
        assert_eq!(st[0].started_at, Some(Time(t0)), "kept from the first look");
    }

    #[test]
    fn an_empty_stage_completes_with_a_warning_unless_min_nodes_makes_it_wait() {
        let t0 = Timestamp::UNIX_EPOCH;
        let stages = [stage("canary", 0, 0), stage("rest", 0, 0)];
        let mut st = vec![status("canary", 1, 1, 0), status("rest", 2, 0, 0)];
        let cursor = advance_stages(&stages, &mut st, "r1", t0, false, None);
        assert_eq!(cursor.at, 1);
        assert_eq!(
            reasons(&cursor),
            [
                "StageStarted",
                "StageEmpty",
                "StageComplete",
                "StageStarted"
            ]
        );

        let stages = [stage("canary", 0, 1), stage("rest", 0, 0)];
        let mut st = vec![status("canary", 1, 1, 0), status("rest", 2, 0, 0)];
        let cursor = advance_stages(&stages, &mut st, "r1", t0, false, None);
        assert_eq!((cursor.at, cursor.too_small), (0, Some(0)));
        assert_eq!(st[0].phase, StagePhase::Waiting);
        assert!(cursor.notes.is_empty());
    }

    #[test]
    fn paused_advances_nothing() {
        let stages = [stage("canary", 0, 0)];
        let mut st = vec![status("canary", 1, 0, 1)];
        let cursor = advance_stages(&stages, &mut st, "r1", Timestamp::UNIX_EPOCH, true, None);
        assert_eq!(cursor.at, 0);
        assert!(cursor.notes.is_empty());
        assert_eq!(st[0].started_at, None);
    }
}
