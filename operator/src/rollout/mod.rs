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
//! - **Stages** ([`RolloutSpec::effective_stages`](kipvs_crds::RolloutSpec::effective_stages)):
//!   a node belongs to the first stage whose selector matches and, for a sized stage, whose
//!   size bound (fixed when the revision's rollout starts) its name hash does not exceed. The *cursor* is the first stage not yet
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
//! - **`spec.paused`**: the decision is computed and reported, but no NodeProxyConfig is
//!   written and no stage advances.
//! - **Service proxy label.** Each member's Node label
//!   [`SERVICE_PROXY_LABEL`](kipvs_crds::SERVICE_PROXY_LABEL) follows its NodeProxyConfig and
//!   its proxier's reports (`labels::wanted_label`), so that a node is never left without a
//!   proxy, nor given two: `kipvs` only once the proxier has reported for a revision whose
//!   `serviceProxy` is `kipvs` (alive: standing by while kube-proxy runs, or programming);
//!   `kube-proxy` once the proxier reports, for a `kube-proxy` revision (or a `kipvs` one the
//!   node failed), a phase in which kipvs does not write, and also where the proxier is silent
//!   (no report for the revision by `applyTimeout`: crashlooping, Pending, ImagePullBackOff),
//!   or reported a takeover it never completed by then, or loses its NodeProxyConfig in a
//!   rollback without reporting that it programs. Where kube-proxy runs again on a node kipvs
//!   took over (its DaemonSet re-applied without the affinity: [`KubeProxyDaemonSet`]), the
//!   label stays `kipvs` and Degraded `KubeProxyReturned` names the nodes and the missing
//!   patch. A revision with `serviceProxy: kube-proxy` counts as healthy on a node only when
//!   the proxier reports such a phase (`status.serviceProxy`): a proxier that predates the
//!   field keeps programming, so the revision fails there by `applyTimeout` and the rollout's
//!   failure budget and rollback apply as for any revision.
//!
//! # Layout
//!
//! - `input`: what one decision reads ([`Input`], the views of Nodes and NodeProxyConfigs).
//! - `selection`: which nodes are the ProxyConfig's (members, conflicts, nodes to release)
//!   and each member's health against the revision it carries.
//! - `stages`: stage membership, per-stage counts, and the stage cursor.
//! - `writes`: which member gets which revision, and hand-edited specs restored.
//! - `report`: the status and Events that say where the rollout stands.
//! - `labels`: the service proxy label each member's NodeProxyConfig asks for.
//! - `decision`: [`decide`], which runs the above in order for the target revision's mode
//!   (rollout, halted, rollback).
//! - `outcome`: what a decision returns ([`Decision`], [`Write`], [`Note`]).

mod decision;
mod input;
mod labels;
mod outcome;
mod report;
mod selection;
mod stages;
mod writes;

pub use decision::decide;
pub use input::{
    Input, KUBE_PROXY_READ_INTERVAL, KubeProxyDaemonSet, NodeView, NpcView, SkipReason,
    TO_BE_DELETED_TAINT,
};
pub use outcome::{Decision, Label, Note, Object, Write};
