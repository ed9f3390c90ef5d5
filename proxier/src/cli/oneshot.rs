//! The commands that look once and exit: `plan`, `inspect`, `takeover` (a preview) and
//! `cleanup`.

use super::args::{
    ApiArgs, DataplaneKind, Format, InspectFormat, SourceArgs, connect_kernel, identity,
    kube_client, load_config, manifests_source,
};
use anyhow::Context;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::dataplane::Dataplane;
use kipvs_proxier::dataplane::host::kube_proxy::{HostKubeProxy, KubeProxyNode};
use kipvs_proxier::engine::planner::Planner;
use kipvs_proxier::engine::preview::Preview;
use kipvs_proxier::plan::kube_proxy::kubelet_creates_shared_chains;
use kipvs_proxier::source::SourceHandle;
use kipvs_proxier::source::kube::KubeSource;
use kipvs_proxier::source::manifests::ManifestsSource;
use kipvs_proxier::source::node_config::Assigned;
use kipvs_proxier::{format, inspect};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;
use tracing::Instrument;

/// How long `inspect` waits for the API server's lists.
const INSPECT_LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// The desired state for `args` (from the manifests, or listed from the Kubernetes API) on a
/// node with these addresses on other interfaces than `kube-ipvs0`.
async fn desired_state(
    args: &SourceArgs,
    api: &ApiArgs,
    other_interface_addresses: BTreeSet<IpAddr>,
) -> anyhow::Result<kipvs_proxier::model::DesiredState> {
    Ok(planned(args, api, other_interface_addresses)
        .await?
        .0
        .desired()
        .clone())
}

/// A planner that planned every Service of `args` (from the manifests, or listed from the
/// Kubernetes API) on a node with these addresses on other interfaces than `kube-ipvs0`, and
/// the own Node's kubelet version (`None`: no Node, or none listed).
async fn planned(
    args: &SourceArgs,
    api: &ApiArgs,
    other_interface_addresses: BTreeSet<IpAddr>,
) -> anyhow::Result<(Planner, Option<String>)> {
    let config = load_config(args.config.as_deref())?;
    let handle = SourceHandle::gated();
    if args.manifests.is_some() {
        let source = manifests_source(args)?;
        source
            .load_into(&handle, None)
            .with_context(|| format!("reading {}", source.path.display()))?;
    } else {
        let source = KubeSource {
            client: kube_client(api).await?.0,
            node_name: args.node.clone(),
        };
        let span = tracing::info_span!("source", api = "list");
        let listing = tokio::spawn(source.run(handle.clone()).instrument(span));
        tokio::time::timeout(INSPECT_LIST_TIMEOUT, handle.wait_ready())
            .await
            .context("the API server's lists did not complete in 30 s")?;
        listing.abort();
    }
    let mut planner = Planner::new(identity(args), config);
    planner.set_other_interface_addresses(other_interface_addresses);
    let kubelet_version = handle.with_store(|store| {
        planner.replan(store);
        store.kubelet_version().map(str::to_owned)
    });
    Ok((planner, kubelet_version))
}

/// `plan`: the desired state of the manifests on a node with `local_addresses` on its
/// interfaces but `kube-ipvs0`, printed in `format`.
pub fn plan(
    args: &SourceArgs,
    format: Format,
    local_addresses: BTreeSet<IpAddr>,
) -> anyhow::Result<()> {
    let local = load_config(args.config.as_deref())?;
    let handle = SourceHandle::default();
    let (assigned_tx, assigned) = watch::channel(Assigned::Unknown);
    let source = ManifestsSource {
        node_configs: Some(assigned_tx),
        ..manifests_source(args)?
    };
    source
        .load_into(&handle, None)
        .with_context(|| format!("reading {}", source.path.display()))?;
    // The same precedence as `run`: the node's NodeProxyConfig, else the local config.
    let config = match &*assigned.borrow() {
        Assigned::Revision { config, .. } => (**config).clone(),
        _ => local,
    };
    let mut planner = Planner::new(identity(args), config);
    planner.set_other_interface_addresses(local_addresses);
    handle.with_store(|store| planner.replan(store));
    let plan = planner.plan();
    let text = match format {
        Format::Ipvsadm => format::ipvsadm(&plan.desired),
        Format::Nft => format::nft(&plan.desired),
        Format::Json => format::json(&plan.desired),
    };
    print!("{text}");
    Ok(())
}

/// `inspect`: the desired state against the kernel's, by Service.
pub async fn inspect(
    args: &SourceArgs,
    api: &ApiArgs,
    format: InspectFormat,
    dataplane: DataplaneKind,
) -> anyhow::Result<()> {
    let (desired, observed) = match dataplane {
        DataplaneKind::Kernel => {
            let mut kernel = connect_kernel().await?;
            let local = kernel.other_interface_addresses().await?;
            (
                desired_state(args, api, local).await?,
                kernel.observe().await?,
            )
        }
        DataplaneKind::Fake => (
            desired_state(args, api, BTreeSet::new()).await?,
            Default::default(),
        ),
    };
    let inspection = inspect::inspect(&desired, &observed);
    match format {
        InspectFormat::Text => print!("{}", inspection.text()),
        InspectFormat::Json => println!("{}", serde_json::to_string_pretty(&inspection)?),
    }
    Ok(())
}

/// `takeover`: what taking this node over from kube-proxy would change ([`preview`]), after
/// the settings of `kube_proxy_config` (kube-proxy's file) the planned configuration does not
/// carry over ([`kipvs_crds::kubeproxy::differences`]).
///
/// # Errors
/// The sources, kube-proxy's file or the kernel cannot be read; or (exit status 3) operations touch established
/// connections and `allow_connection_changes` is false.
pub async fn takeover(
    args: &SourceArgs,
    api: &ApiArgs,
    allow_connection_changes: bool,
    kube_proxy_config: Option<&Path>,
) -> anyhow::Result<()> {
    let mut kernel = connect_kernel().await?;
    let local = kernel.other_interface_addresses().await?;
    let (planner, kubelet_version) = planned(args, api, local).await?;
    if let Some(path) = kube_proxy_config {
        let (kube_proxy, _) = ProxierConfiguration::load_any(path)?;
        let differences = kipvs_crds::kubeproxy::differences(&kube_proxy, planner.config());
        println!(
            "configuration: {} setting(s) differ from kube-proxy's {}",
            differences.len(),
            path.display()
        );
        for difference in differences {
            println!("  {difference}");
        }
    }
    let kube_proxy = HostKubeProxy::default();
    let kubelet_chains = kubelet_creates_shared_chains(kubelet_version.as_deref());
    let leftovers = kube_proxy.leftovers(kubelet_chains).await;
    // As `run` would after its standby: kube-proxy's NodePorts drain on a node that has its state.
    let found = kube_proxy.signals(false).await.runs().is_some() || !leftovers.is_empty();
    let observed = kernel.observe().await?;
    let preview = Preview::of_switch(&planner, &observed, found, &BTreeMap::new(), leftovers)?;
    print!("{}", preview.text());
    if let Some(refusal) = preview.refusal().filter(|_| !allow_connection_changes) {
        eprintln!("error: {refusal} (marked above)");
        std::process::exit(3);
    }
    Ok(())
}

/// `cleanup`: removes what kipvs or kube-proxy's IPVS mode programmed, keeping
/// `ipvs.excludeCIDRs`.
///
/// # Errors
/// An unreadable configuration, a kernel that cannot be reached, or any failed operation.
pub async fn cleanup(config: Option<&Path>) -> anyhow::Result<()> {
    let config = load_config(config)?;
    let exclude = config.ipvs.parsed_exclude_cidrs()?;
    let node_ports = config.parsed_node_port_range()?;
    let (ops, failures) = connect_kernel().await?.cleanup(exclude, node_ports).await?;
    for op in &ops {
        tracing::info!("{op}");
    }
    for f in &failures {
        tracing::error!(error = %f.error, "failed {}", f.op);
    }
    tracing::info!(
        "cleanup: {} ops, {} failed, kube-ipvs0 deleted",
        ops.len(),
        failures.len()
    );
    anyhow::ensure!(
        failures.is_empty(),
        "{} cleanup operations failed",
        failures.len()
    );
    Ok(())
}
