//! `ProxyConfig` (`kipvs.io/v1alpha1`, cluster-scoped): one proxier configuration for a set of
//! nodes, and the plan for rolling a change of it out stage by stage.
//!
//! ```yaml
//! apiVersion: kipvs.io/v1alpha1
//! kind: ProxyConfig
//! metadata: {name: fleet}
//! spec:
//!   nodeSelector: {matchLabels: {kubernetes.io/os: linux}}
//!   config:
//!     featureGates: {ProxyTerminatingEndpoints: true}
//!   rollout:
//!     applyTimeout: 5m
//!     failureBudget: 0
//!     autoRollback: true
//!     stages:
//!     - {name: canary, nodeSelector: {matchLabels: {kipvs.io/canary: "true"}}, soakDuration: 10m}
//!     - {name: early, size: "10%", maxUnavailable: 2, soakDuration: 5m}
//!     - {name: fleet, maxUnavailable: "20%"}
//! ```
//!
//! The operator (`kipvs-operator`) turns it into one [`NodeProxyConfig`](crate::NodeProxyConfig)
//! per selected node and reports progress in [`ProxyConfigStatus`]. The rollout rules are
//! documented on each field; the operator's `rollout` module implements them.
//!
//! Validation happens in three places, from the earliest: the OpenAPI schema (patterns,
//! minimums, list-map keys: enforced by every apiserver since 1.16); CEL rules
//! (`x-kubernetes-validations`, enforced from Kubernetes 1.25, ignored by older servers); and
//! [`ProxyConfigSpec::validate`], which the operator runs on every spec and which checks the same
//! rules as the CEL ones (so a 1.20 cluster gets the same verdict, as a `Degraded` condition).

use crate::config::{ConfigError, ProxierConfiguration};
use crate::{duration, schema};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// Name of the implicit final stage that takes the selected nodes no stage matched.
pub const REST_STAGE: &str = "rest";

/// Annotation on a `ProxyConfig` that promotes a stage waiting for a person (a stage with
/// `pause: true`). Its value is `<stage>@<revision>`, e.g. `canary@5f0c2a9e1b`, so a stale
/// promotion never lets a later revision through; the exact command is printed in the
/// `Paused` condition's message.
pub const PROMOTE_ANNOTATION: &str = "kipvs.io/promote";

/// Desired configuration of a set of nodes and how to roll changes to it out.
// kube-derive takes one printcolumn(...) per column; clippy reads repeated keys as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "kipvs.io",
    version = "v1alpha1",
    kind = "ProxyConfig",
    plural = "proxyconfigs",
    shortname = "pxc",
    category = "kipvs",
    status = "ProxyConfigStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A kipvs proxier configuration for the nodes selected by spec.nodeSelector, rolled out \
           stage by stage (spec.rollout) and gated on the proxiers' health.",
    printcolumn(
        name = "Revision",
        type_ = "string",
        json_path = ".status.targetRevision",
        description = "The revision nodes are moving to (the last good one after a rollback)"
    ),
    printcolumn(
        name = "Stage",
        type_ = "string",
        json_path = ".status.stage",
        description = "The stage being rolled out, or empty when done"
    ),
    printcolumn(
        name = "Updated",
        type_ = "integer",
        json_path = ".status.updatedNodes",
        description = "Nodes whose NodeProxyConfig carries the target revision"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "integer",
        json_path = ".status.healthyNodes",
        description = "Nodes that report the target revision applied and healthy"
    ),
    printcolumn(
        name = "Total",
        type_ = "integer",
        json_path = ".status.totalNodes",
        description = "Nodes selected by this ProxyConfig"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Available")].status"#
    ),
    printcolumn(
        name = "Progressing",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Progressing")].status"#
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Degraded")].status"#
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        priority = 1,
        json_path = r#".status.conditions[?(@.type=="Paused")].status"#
    ),
    printcolumn(
        name = "Last-Good",
        type_ = "string",
        priority = 1,
        json_path = ".status.lastGoodRevision"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfigSpec {
    /// Nodes this ProxyConfig configures (a label selector on Nodes). Unset selects every node.
    /// A node selected by two ProxyConfigs is a conflict: neither writes it, both report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// The proxier configuration (kube-proxy's KubeProxyConfiguration field names). Its content
    /// hash is the revision; every change is rolled out as a new revision.
    #[serde(default)]
    #[x_kube(
        validation = Rule::new("!has(self.ipvs) || !has(self.ipvs.syncPeriod) || duration(self.ipvs.syncPeriod) > duration('0s')")
            .message("ipvs.syncPeriod must be greater than 0"),
        validation = Rule::new("!has(self.ipvs) || !has(self.ipvs.minSyncPeriod) || duration(self.ipvs.minSyncPeriod) <= duration(has(self.ipvs.syncPeriod) ? self.ipvs.syncPeriod : '30s')")
            .message("ipvs.minSyncPeriod must not be greater than ipvs.syncPeriod"),
    )]
    pub config: ProxierConfiguration,
    /// How a new revision reaches the nodes.
    #[serde(default)]
    pub rollout: RolloutSpec,
    /// Stop every write: no NodeProxyConfig is created, changed or deleted while true. Status
    /// is still reported (condition Paused).
    #[serde(default)]
    pub paused: bool,
}

/// The staged rollout of a new revision.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Stages in order (at most 20). A node belongs to the first stage that matches it (nodeSelector, then
    /// size); nodes that no stage takes form a final stage named "rest" (maxUnavailable 1, no
    /// soak). A stage starts only when every earlier stage is complete: all its nodes report
    /// the revision applied and healthy (draining, NotReady and deleted nodes are skipped), its
    /// soak has passed and, with pause, a person promoted it. Stage membership is fixed when a
    /// revision's rollout starts (see status.stages[].sizeBound), so node churn does not
    /// reshuffle it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(
        validation = Rule::new("self.all(s, self.exists_one(t, t.name == s.name))")
            .message("stage names must be unique"),
        validation = Rule::new("self.all(s, has(s.nodeSelector) || has(s.size) || s.name == self[size(self) - 1].name)")
            .message("only the last stage may take every remaining node (set nodeSelector or size on the others)"),
        validation = Rule::new("self.all(s, s.name != 'rest' || (!has(s.nodeSelector) && !has(s.size)))")
            .message("the stage name \"rest\" is reserved for the stage that takes every remaining node"),
    )]
    pub stages: Vec<Stage>,
    /// How long a node may take, from the moment its NodeProxyConfig gets a revision, to report
    /// it applied and healthy (Go duration). A node that does not is failed. Default 5m.
    #[serde(default = "default_apply_timeout", with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub apply_timeout: Duration,
    /// How many failed nodes a revision tolerates before the rollout halts and the revision is
    /// marked bad. Default 0: the first failure halts it. Failed nodes within the budget keep
    /// the new revision and count as done for their stage.
    #[serde(default)]
    pub failure_budget: u32,
    /// When a revision is marked bad, return every node it touched to the last good revision
    /// (or, if there is none, delete their NodeProxyConfigs so the proxiers use their local
    /// configuration). Default true. When false, the rollout only halts.
    #[serde(default = "default_true")]
    pub auto_rollback: bool,
}

/// One stage of a rollout.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stage {
    /// Stage name, unique within the rollout (a DNS label; "rest" is reserved for the stage that
    /// takes every remaining node).
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Which of the nodes not taken by an earlier stage this stage may take. Unset: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// How many of those nodes the stage takes: a count, or a percentage of all the nodes the
    /// ProxyConfig selects (rounded up). Unset: all of them. Nodes are taken in the order of a
    /// stable hash of their names, so a stage samples the fleet rather than one name prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_count_or_percent")]
    pub size: Option<CountOrPercent>,
    /// How many of the stage's nodes may be updating (given the revision but not yet healthy) at
    /// once: a count, or a percentage of the stage's nodes (rounded up, at least 1). Default 1.
    #[serde(default = "CountOrPercent::one")]
    #[schemars(schema_with = "schema::count_or_percent")]
    pub max_unavailable: CountOrPercent,
    /// How long the stage must stay healthy after its last node became healthy before the next
    /// stage starts (Go duration); a node that turns unhealthy meanwhile fails the revision.
    /// Default 0s. A stage with no node to wait for (empty, or only skipped nodes) neither soaks
    /// nor pauses.
    #[serde(default, with = "duration::serde_go")]
    #[schemars(schema_with = "schema::go_duration")]
    pub soak_duration: Duration,
    /// Wait for a person after the soak: the next stage starts only once the ProxyConfig is
    /// annotated kipvs.io/promote=<stage>@<revision> (the Paused condition prints the command).
    #[serde(default)]
    pub pause: bool,
    /// The fewest nodes the stage must have to run (nodes it takes that are neither skipped nor
    /// conflicting). With fewer, the rollout waits at this stage (condition Progressing, reason
    /// StageTooSmall, and a StageTooSmall Event) until nodes join or the spec changes. Set it to
    /// 1 on a canary stage so that a selector matching nothing, or a canary node taken by
    /// another ProxyConfig, stops the rollout instead of skipping the canary. Default 0: a stage
    /// with no node to wait for completes at once, reported by a StageEmpty Event.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_nodes: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Default for RolloutSpec {
    fn default() -> Self {
        RolloutSpec {
            stages: Vec::new(),
            apply_timeout: default_apply_timeout(),
            failure_budget: 0,
            auto_rollback: true,
        }
    }
}

impl Stage {
    /// The implicit final stage: every node no explicit stage took, one at a time, no soak.
    pub fn rest() -> Stage {
        Stage {
            name: REST_STAGE.to_owned(),
            node_selector: None,
            size: None,
            max_unavailable: CountOrPercent::one(),
            soak_duration: Duration::ZERO,
            pause: false,
            min_nodes: 0,
        }
    }

    /// Whether the stage takes every node that reaches it (no selector, no size).
    pub fn takes_all(&self) -> bool {
        self.node_selector.is_none() && self.size.is_none()
    }
}

impl RolloutSpec {
    /// The stages as the rollout runs them: the explicit ones, then [`Stage::rest`] unless the
    /// last explicit stage already takes every remaining node.
    pub fn effective_stages(&self) -> Vec<Stage> {
        let mut stages = self.stages.clone();
        if !stages.last().is_some_and(Stage::takes_all) {
            stages.push(Stage::rest());
        }
        stages
    }
}

fn default_apply_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_true() -> bool {
    true
}

/// A count of nodes or a percentage (`3` or `"10%"`), as Kubernetes' `IntOrString` fields such
/// as `maxUnavailable`. Counts are at least 1, percentages 1–100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountOrPercent {
    /// An absolute number of nodes.
    Count(u32),
    /// A percentage (1–100) of a total given by the field's documentation.
    Percent(u32),
}

impl CountOrPercent {
    /// One node.
    pub fn one() -> Self {
        CountOrPercent::Count(1)
    }

    /// The number of nodes out of `total`: the count itself, or the percentage rounded up.
    pub fn of(self, total: usize) -> usize {
        match self {
            CountOrPercent::Count(n) => n as usize,
            CountOrPercent::Percent(p) => (total * p as usize).div_ceil(100),
        }
    }
}

impl fmt::Display for CountOrPercent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CountOrPercent::Count(n) => write!(f, "{n}"),
            CountOrPercent::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for CountOrPercent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CountOrPercent::Count(n) => serializer.serialize_u32(*n),
            CountOrPercent::Percent(_) => serializer.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for CountOrPercent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        fn invalid<E: serde::de::Error>(what: impl fmt::Display) -> E {
            E::custom(format!(
                "{what} is neither a count of at least 1 nor a percentage from 1% to 100%"
            ))
        }
        impl serde::de::Visitor<'_> for Visitor {
            type Value = CountOrPercent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a count of at least 1 or a percentage such as \"10%\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
                match u32::try_from(n) {
                    Ok(n) if n >= 1 => Ok(CountOrPercent::Count(n)),
                    _ => Err(invalid(n)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(invalid(n)),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Self::Value, E> {
                Err(invalid(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                // Same language as schema::PERCENT_PATTERN: 1..=100 without sign or leading zero.
                match s.strip_suffix('%').and_then(|p| p.parse::<u32>().ok()) {
                    Some(p) if (1..=100).contains(&p) && !s.starts_with(['0', '+']) => {
                        Ok(CountOrPercent::Percent(p))
                    }
                    _ => Err(invalid(format_args!("{s:?}"))),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Why a [`ProxyConfigSpec`] was rejected by [`ProxyConfigSpec::validate`].
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// `spec.config` is invalid.
    #[error("spec.config: {0}")]
    Config(#[from] ConfigError),
    /// A rollout rule is broken (the message names the field).
    #[error("spec.rollout.{0}")]
    Rollout(String),
    /// A label selector cannot be parsed (e.g. an unknown operator).
    #[error("{field}: {message}")]
    Selector {
        /// The field, e.g. `spec.rollout.stages[1].nodeSelector`.
        field: String,
        /// Why.
        message: String,
    },
}

impl ProxyConfigSpec {
    /// Checks what the schema cannot: the configuration's own rules
    /// ([`ProxierConfiguration::validate`], a superset of the CEL rules on `spec.config`),
    /// the stage rules that the CEL rules on `spec.rollout.stages` express (unique names, only
    /// the last stage takes every remaining node, `rest` reserved) and that selectors parse.
    /// Kubernetes before 1.25 ignores CEL rules, so the operator runs this on every spec.
    ///
    /// # Errors
    /// The first problem found, naming the field.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.config.validate()?;
        let stages = &self.rollout.stages;
        for (i, stage) in stages.iter().enumerate() {
            if stages[..i].iter().any(|s| s.name == stage.name) {
                return Err(SpecError::Rollout(format!(
                    "stages[{i}].name: stage names must be unique ({:?} repeats)",
                    stage.name
                )));
            }
            if stage.takes_all() && i + 1 != stages.len() {
                return Err(SpecError::Rollout(format!(
                    "stages[{i}]: only the last stage may take every remaining node (set \
                     nodeSelector or size on the others)"
                )));
            }
            if stage.name == REST_STAGE && !stage.takes_all() {
                return Err(SpecError::Rollout(format!(
                    "stages[{i}].name: the stage name \"rest\" is reserved for the stage that \
                     takes every remaining node"
                )));
            }
            if let Some(selector) = &stage.node_selector {
                parse_selector(selector, &format!("spec.rollout.stages[{i}].nodeSelector"))?;
            }
        }
        if let Some(selector) = &self.node_selector {
            parse_selector(selector, "spec.nodeSelector")?;
        }
        Ok(())
    }
}

/// Parses a label selector into kube's matcher.
///
/// # Errors
/// [`SpecError::Selector`] naming `field` when an expression has an unknown operator or the
/// wrong number of values.
pub fn parse_selector(
    selector: &LabelSelector,
    field: &str,
) -> Result<kube::core::Selector, SpecError> {
    let invalid = |message: String| SpecError::Selector {
        field: field.to_owned(),
        message,
    };
    for (key, value) in selector.match_labels.iter().flatten() {
        check_label_key(key).map_err(|m| invalid(format!("matchLabels key {key:?}: {m}")))?;
        check_label_value(value)
            .map_err(|m| invalid(format!("matchLabels[{key:?}] value {value:?}: {m}")))?;
    }
    for (i, expression) in selector.match_expressions.iter().flatten().enumerate() {
        let key = &expression.key;
        check_label_key(key)
            .map_err(|m| invalid(format!("matchExpressions[{i}].key {key:?}: {m}")))?;
        for value in expression.values.iter().flatten() {
            check_label_value(value)
                .map_err(|m| invalid(format!("matchExpressions[{i}].values {value:?}: {m}")))?;
        }
    }
    kube::core::Selector::try_from(selector.clone()).map_err(|e| invalid(e.to_string()))
}

/// Why a label key or value in a selector is not one Kubernetes accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
enum LabelError {
    /// The part before `/` is not a DNS subdomain.
    #[error(
        "the prefix must be a DNS subdomain (lowercase alphanumerics, '-' and '.', at most 253 \
         characters)"
    )]
    Prefix,
    /// Nothing after the `/`.
    #[error("the name part must not be empty")]
    EmptyName,
    /// Too long, or a character Kubernetes does not allow.
    #[error(
        "must be at most 63 characters: alphanumerics, '-', '_' or '.', beginning and ending \
         with an alphanumeric"
    )]
    Value,
}

/// A label key as Kubernetes validates it (`IsQualifiedName`): an optional DNS subdomain
/// prefix of at most 253 characters and `/`, then a name of 1-63 alphanumerics, `-`, `_`, `.`,
/// beginning and ending with an alphanumeric. A selector with any other key matches no Node
/// ever, which would silently empty a stage, so it is an invalid spec.
fn check_label_key(key: &str) -> Result<(), LabelError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err(LabelError::Prefix);
        }
    }
    if name.is_empty() {
        return Err(LabelError::EmptyName);
    }
    check_label_value(name)
}

/// A label value (`IsValidLabelValue`): empty, or at most 63 alphanumerics, `-`, `_`, `.`,
/// beginning and ending with an alphanumeric.
fn check_label_value(value: &str) -> Result<(), LabelError> {
    let edge_ok = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if value.len() > 63
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || !edge_ok(value.chars().next())
        || !edge_ok(value.chars().last())
    {
        return Err(LabelError::Value);
    }
    Ok(())
}

/// What the operator reports about a `ProxyConfig`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfigStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Revision of spec.config: a hash of the settings that differ from the defaults, so equal
    /// configurations have equal revisions however they are written, and a kipvs upgrade that
    /// adds a setting (at its default) does not start a rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The revision the nodes are moving to: spec's revision while it rolls out, the last good
    /// revision once spec's revision is marked bad. Unset when there is none (a first revision
    /// rolled back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_revision: Option<String>,
    /// The last revision that reached every node healthy; rollbacks return to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_revision: Option<String>,
    /// The configuration of lastGoodRevision (what a rollback writes to the nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_config: Option<ProxierConfiguration>,
    /// Revisions marked bad (a health gate failed), most recent last, at most 10. A bad
    /// revision is not rolled out again; change spec.config to roll out a new one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bad_revisions: Vec<String>,
    /// The stage being rolled out; empty when the target revision is everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Per-stage progress of the target revision, in rollout order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageStatus>,
    /// Nodes selected by spec.nodeSelector (including skipped and conflicting ones).
    #[serde(default)]
    pub total_nodes: u32,
    /// Nodes whose NodeProxyConfig carries the target revision.
    #[serde(default)]
    pub updated_nodes: u32,
    /// Nodes that report the target revision applied and healthy.
    #[serde(default)]
    pub healthy_nodes: u32,
    /// Nodes failed on the target revision (Failed, unhealthy or silent past applyTimeout).
    #[serde(default)]
    pub failed_nodes: u32,
    /// Nodes that failed the target revision (or, after it was marked bad, the revision that
    /// failed), with why; at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<NodeFailure>,
    /// Nodes skipped because they are being deleted, tainted ToBeDeletedByClusterAutoscaler or
    /// NotReady: they neither block nor fail the rollout.
    #[serde(default)]
    pub skipped_nodes: u32,
    /// Nodes also selected by another ProxyConfig: never written, reported in the Degraded
    /// condition. Sorted; at most 20 names (conflictingNodeCount has the number).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicting_nodes: Vec<String>,
    /// Number of nodes also selected by another ProxyConfig.
    #[serde(default)]
    pub conflicting_node_count: u32,
    /// Progressing, Available, Degraded and Paused (metav1.Condition). A condition's
    /// lastTransitionTime changes only when its status does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// A node that failed a revision.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFailure {
    /// The node.
    pub node: String,
    /// The revision it failed.
    pub revision: String,
    /// What the proxier reported (phase Failed and its message), or that it was not applied
    /// and healthy within applyTimeout (with what it did report).
    pub message: String,
}

/// Progress of one stage of the target revision.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    /// Stage name (as in spec.rollout.stages, or "rest").
    pub name: String,
    /// Waiting (not started), Progressing, Soaking, AwaitingPromotion or Complete.
    pub phase: StagePhase,
    /// Nodes in the stage.
    #[serde(default)]
    pub total: u32,
    /// Nodes given the target revision.
    #[serde(default)]
    pub updated: u32,
    /// Nodes reporting the target revision applied and healthy.
    #[serde(default)]
    pub healthy: u32,
    /// Nodes failed on the target revision.
    #[serde(default)]
    pub failed: u32,
    /// Nodes skipped (draining, NotReady, being deleted).
    #[serde(default)]
    pub skipped: u32,
    /// For a stage with a size: the node-name hash (16 hex digits) of the last node it took when
    /// the revision's rollout started. Membership is then "matches and hash <= sizeBound", so
    /// nodes joining or leaving later do not move other nodes between stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bound: Option<String>,
    /// When the stage started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When every node of the stage was first healthy (the soak starts here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_at: Option<Time>,
    /// When the stage was promoted (it had pause: true and the promote annotation named it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<Time>,
}

/// Where a stage is in its rollout.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum StagePhase {
    /// An earlier stage is not complete yet.
    #[default]
    Waiting,
    /// Nodes are being given the revision.
    Progressing,
    /// Every node is healthy; the soak duration is running.
    Soaking,
    /// Soaked; waiting for the promote annotation.
    AwaitingPromotion,
    /// Done: the next stage may run.
    Complete,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_or_percent_parses_counts_and_percentages() {
        let parse = |json: &str| serde_json::from_str::<CountOrPercent>(json);
        assert_eq!(parse("3").unwrap(), CountOrPercent::Count(3));
        assert_eq!(parse("\"10%\"").unwrap(), CountOrPercent::Percent(10));
        assert_eq!(parse("\"100%\"").unwrap(), CountOrPercent::Percent(100));
        for bad in [
            "0", "-1", "\"0%\"", "\"101%\"", "\"10\"", "\"ten%\"", "\"05%\"", "1.5",
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("neither a count"), "{bad}: {err}");
        }
        assert_eq!(
            serde_json::to_string(&CountOrPercent::Count(2)).unwrap(),
            "2"
        );
        assert_eq!(
            serde_json::to_string(&CountOrPercent::Percent(25)).unwrap(),
            "\"25%\""
        );
    }

    #[test]
    fn count_or_percent_of_rounds_percentages_up() {
        assert_eq!(CountOrPercent::Count(3).of(100), 3);
        assert_eq!(CountOrPercent::Percent(10).of(6), 1);
        assert_eq!(CountOrPercent::Percent(10).of(10), 1);
        assert_eq!(CountOrPercent::Percent(10).of(11), 2);
        assert_eq!(CountOrPercent::Percent(100).of(5000), 5000);
        assert_eq!(CountOrPercent::Percent(10).of(0), 0);
    }

    #[test]
    fn defaults() {
        let spec: ProxyConfigSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec, ProxyConfigSpec::default());
        assert_eq!(spec.rollout.apply_timeout, Duration::from_secs(300));
        assert!(spec.rollout.auto_rollback);
        assert_eq!(spec.rollout.effective_stages(), vec![Stage::rest()]);
        let stage: Stage = serde_json::from_str(r#"{"name": "a", "size": 1}"#).unwrap();
        assert_eq!(stage.max_unavailable, CountOrPercent::Count(1));
        assert_eq!(stage.soak_duration, Duration::ZERO);
        assert!(!stage.pause);
    }

    #[test]
    fn effective_stages_append_rest_unless_the_last_takes_all() {
        let stage = |name: &str, size: Option<u32>| Stage {
            size: size.map(CountOrPercent::Count),
            name: name.to_owned(),
            ..Stage::rest()
        };
        let rollout = |stages| RolloutSpec {
            stages,
            ..RolloutSpec::default()
        };
        let names = |r: RolloutSpec| {
            r.effective_stages()
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(rollout(vec![stage("a", Some(1))])), ["a", "rest"]);
        assert_eq!(
            names(rollout(vec![stage("a", Some(1)), stage("all", None)])),
            ["a", "all"]
        );
    }
}
