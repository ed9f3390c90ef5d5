//! The fleet's Nodes and the part each plays: `fleet-00000`.. labelled `kipvs.io/fleet=yes`,
//! `fleet-00000` the canary, every 100th tainted or NotReady, and shares of them (from their
//! name hash) silent, failing or flapping.

use crate::args::Args;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kipvs_crds::revision::node_hash;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// The name of node `i`.
pub(crate) fn name(i: usize) -> String {
    format!("fleet-{i:05}")
}

/// Skipped by the operator: tainted (99) or NotReady (98).
pub(crate) fn skipped(i: usize) -> bool {
    i % 100 >= 98
}

/// A share in [0, 1) per node, from its name hash.
pub(crate) fn share(node: &str) -> f64 {
    (node_hash(node) >> 11) as f64 / (1u64 << 53) as f64
}

/// Never answers the second revision (`--silent-share`).
pub(crate) fn silent(args: &Args, node: &str) -> bool {
    share(node) < args.silent_share
}

/// Fails every revision after the first (`--fail-share`, after the silent ones).
pub(crate) fn told_to_fail(args: &Args, node: &str) -> bool {
    let s = share(node);
    s >= args.silent_share && s < args.silent_share + args.fail_share
}

/// Blips `/livez` in the flap round (`--flap-share`, after the silent and failing ones).
pub(crate) fn flapping(args: &Args, node: &str) -> bool {
    let s = share(node);
    let from = args.silent_share + args.fail_share;
    s >= from && s < from + args.flap_share
}

/// Keeps kube-proxy in the takeover's failing round (`--stuck-share`, after the silent,
/// failing and flapping ones).
pub(crate) fn stuck(args: &Args, node: &str) -> bool {
    let s = share(node);
    let from = args.silent_share + args.fail_share + args.flap_share;
    s >= from && s < from + args.stuck_share
}

/// Creates (or keeps) the `n` Nodes, with their labels, taints and Ready condition.
pub(crate) async fn create(nodes: &Api<Node>, n: usize) -> anyhow::Result<()> {
    let created: Vec<anyhow::Result<()>> = stream::iter(0..n)
        .map(|i| create_one(nodes.clone(), i))
        .buffer_unordered(32)
        .collect()
        .await;
    created.into_iter().collect()
}

/// Node `i`: the canary label on the first, the autoscaler's taint on every 100th, Ready False
/// on the one before it.
async fn create_one(nodes: Api<Node>, i: usize) -> anyhow::Result<()> {
    let node = name(i);
    let mut labels = json!({"kipvs.io/fleet": "yes"});
    if i == 0 {
        labels["kipvs.io/canary"] = "true".into();
    }
    let taints = if i % 100 == 99 {
        json!([{"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    let object: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": labels},
        "spec": {"taints": taints},
    }))?;
    match nodes.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let ready = if i % 100 == 98 { "False" } else { "True" };
    let status = json!({"status": {"conditions": [
        {"type": "Ready", "status": ready, "reason": "Fleet", "message": "fleet harness"}
    ]}});
    nodes
        .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}
