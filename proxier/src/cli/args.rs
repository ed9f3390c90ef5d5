//! The command line ([`Cli`]) and what its arguments open: the configuration file, the
//! manifests, the Kubernetes API client, the kernel dataplane.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::dataplane::kernel::KernelDataplane;
use kipvs_proxier::engine::planner::NodeIdentity;
use kipvs_proxier::source::apiserver::{self, ApiPath, Memory};
use kipvs_proxier::source::manifests::ManifestsSource;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use tokio::sync::watch;

/// kipvs proxier: programs kernel IPVS from Kubernetes Services and EndpointSlices.
#[derive(Parser)]
#[command(version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Where the objects come from and which node this is.
#[derive(clap::Args)]
pub struct SourceArgs {
    /// This node's name (endpoints with this nodeName are local).
    #[arg(long = "node", env = "KIPVS_NODE_NAME")]
    pub node: String,
    /// YAML/JSON file (multi-document or a List) or directory of Services, EndpointSlices and
    /// Nodes. Without it, `run` watches the Kubernetes API.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Configuration file: `apiVersion: kipvs.io/v1alpha1`, `kind: ProxierConfiguration`
    /// (kube-proxy field names; the header may be left out), or kube-proxy's own
    /// KubeProxyConfiguration (its ConfigMap's config.conf). Defaults apply without it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Node IP for NodePort virtual servers (repeatable); default: the Node's InternalIPs and
    /// every address on the node's interfaces but kube-ipvs0.
    #[arg(long = "node-ip")]
    pub node_ips: Vec<IpAddr>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// The lines `ipvsadm -Sn` prints for the table.
    Ipvsadm,
    /// The nftables set elements as `nft` commands (`add element inet kipvs SET { ... }`).
    Nft,
    /// Virtual servers, bound addresses, health-check node ports and set elements as JSON.
    Json,
}

/// Output of `inspect`.
#[derive(Clone, Copy, ValueEnum)]
pub enum InspectFormat {
    /// One block per Service port: virtual servers, real servers, verdicts.
    Text,
    /// The same as JSON.
    Json,
}

/// Which dataplane `run` programs (or `inspect` reads).
#[derive(Clone, Copy, ValueEnum)]
pub enum DataplaneKind {
    /// Kernel IPVS, rtnetlink and sysctls.
    Kernel,
    /// An in-memory table (tests on hosts without IPVS).
    Fake,
}

/// How to reach the Kubernetes API server (ignored with --manifests).
///
/// The server, first given first: `--master` (`KIPVS_MASTER`: the DaemonSet in `config/` sets
/// it from the optional ConfigMap `kipvs-apiserver`); the server of `--kubeconfig`; an address
/// remembered on the node (`--remember-apiserver`: the first that accepts a connection, else
/// the default's if it does, else the first); the default configuration ($KUBECONFIG,
/// ~/.kube/config, else in-cluster: the `kubernetes` Service's ClusterIP, which on a node where
/// kipvs is the only service proxy only kipvs programs, so a takeover waits until an address is
/// remembered).
#[derive(clap::Args)]
pub struct ApiArgs {
    /// kubeconfig for the Kubernetes API; default: $KUBECONFIG or ~/.kube/config, then the
    /// in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's address, `https://host:port` or `host:port` (kube-proxy's `--master`;
    /// `http://` is refused): replaces the server of the kubeconfig or of the in-cluster
    /// configuration, whose credentials and CA stay in use.
    #[arg(long, env = "KIPVS_MASTER", value_parser = apiserver::parse_master)]
    pub master: Option<http::Uri>,
    /// File of the API server's addresses remembered on the node: read at start when neither
    /// --master nor --kubeconfig is given; `run` writes the ready endpoints of the `kubernetes`
    /// EndpointSlices into it whenever they change (the DaemonSet: /var/lib/kipvs/apiserver on a
    /// hostPath, so that a reboot finds the API server without the ClusterIP).
    #[arg(long, env = "KIPVS_REMEMBER_APISERVER")]
    pub remember_apiserver: Option<PathBuf>,
}

/// The Kubernetes API and the proxier's own servers (`run` only).
#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// `ip:port` of /healthz and /livez (overrides healthzBindAddress).
    #[arg(long)]
    pub healthz_bind_address: Option<String>,
    /// `ip:port` of /metrics (overrides metricsBindAddress).
    #[arg(long)]
    pub metrics_bind_address: Option<String>,
    /// `ip:port` of the gRPC health service (grpc.health.v1.Health: "" mirrors /livez,
    /// "kipvs.io/healthz" mirrors /healthz); off when not given.
    #[arg(long)]
    pub grpc_health_bind_address: Option<SocketAddr>,
    /// `ip:port` of a second HTTP server of /livez, /readyz and /healthz for the kubelet's HTTP
    /// probes (kubelets before 1.24: `config-http-probes/`), held all along: the healthz port
    /// is left to kube-proxy while the proxier stands by, where its answers would be
    /// kube-proxy's; off when not given.
    #[arg(long)]
    pub probe_bind_address: Option<SocketAddr>,
    /// Address health-check node ports listen on; default: every address (`::`, else
    /// `0.0.0.0`).
    #[arg(long)]
    pub health_check_bind_ip: Option<IpAddr>,
    /// The dataplane to program (`fake`: in memory, for tests without kernel IPVS).
    #[arg(long, value_enum, default_value = "kernel", hide = true)]
    pub dataplane: DataplaneKind,
    /// Take the node over from kube-proxy's IPVS mode and hand it back (README, "Moving from
    /// kube-proxy"): wait in standby while kube-proxy runs, then adopt its table and remove its
    /// iptables rules and ipsets once kipvs's nftables table is in place; stop writing when
    /// kube-proxy comes back; hand the node back when `serviceProxy` is `kube-proxy`.
    /// `false`: none of it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub kube_proxy_takeover: bool,
    /// Let a switch from kube-proxy go ahead even when its first sync would delete, unbind or
    /// re-weight to 0 something carrying connections (what `kipvs-proxier takeover` marks);
    /// without it the proxier stays in standby and reports its revision Failed.
    #[arg(long)]
    pub allow_connection_changes: bool,
    /// Written to /proc/self/oom_score_adj at start (kube-proxy's `oomScoreAdj`, whose
    /// default -999 the DaemonSet in `config/` passes), so that the kernel's OOM killer takes
    /// the proxier last; not written when not given. Lowering it needs CAP_SYS_RESOURCE (a
    /// privileged container); a failure is logged and the proxier goes on.
    #[arg(long, env = "KIPVS_OOM_SCORE_ADJ", allow_hyphen_values = true,
          value_parser = clap::value_parser!(i32).range(-1000..=1000))]
    pub oom_score_adj: Option<i32>,
    /// Test only, with --dataplane=fake: simulate a kernel without this IPVS scheduler module
    /// (a configuration using it is reported Failed). Repeatable.
    #[arg(long, value_name = "NAME", hide = true, requires = "dataplane")]
    pub fake_missing_scheduler: Vec<String>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print the desired IPVS state for the manifests without touching the kernel.
    Plan {
        #[command(flatten)]
        source: SourceArgs,
        /// Output format.
        #[arg(long, value_enum, default_value = "ipvsadm")]
        format: Format,
        /// An address on one of the node's interfaces but kube-ipvs0 (repeatable), as `run`
        /// reads them from the kernel: NodePorts listen on it too (unless --node-ip), and an
        /// externalIP or load-balancer IP on it is not bound on kube-ipvs0.
        #[arg(long = "local-address")]
        local_addresses: Vec<IpAddr>,
    },
    /// Compare the desired IPVS state with the kernel's, by Service (desired and kernel
    /// weights, connection counts, and what the kernel has that no Service wants).
    Inspect {
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        api: ApiArgs,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        format: InspectFormat,
        /// The dataplane to read (`fake`: an empty table, for tests without kernel IPVS).
        #[arg(long, value_enum, default_value = "kernel", hide = true)]
        dataplane: DataplaneKind,
    },
    /// Preview a takeover from kube-proxy's IPVS mode on this node, changing nothing: every
    /// IPVS and kube-ipvs0 operation of the first full sync (those touching established
    /// connections marked with their count), kipvs's nftables table, and kube-proxy's
    /// iptables rules, chains and ipsets that would go. Exits 3 when an operation would
    /// delete, unbind or re-weight something carrying connections, unless
    /// --allow-connection-changes.
    Takeover {
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        api: ApiArgs,
        /// Exit 0 even when operations touch established connections.
        #[arg(long)]
        allow_connection_changes: bool,
        /// kube-proxy's configuration file (the `config.conf` key of its `kube-proxy`
        /// ConfigMap): the preview first lists each setting kipvs carries over whose value
        /// differs in the configuration kipvs will run with.
        #[arg(long, value_name = "FILE")]
        kube_proxy_config: Option<PathBuf>,
    },
    /// Remove what kipvs (or kube-proxy in IPVS mode) programmed: its virtual servers, the
    /// addresses on kube-ipvs0 and the kube-ipvs0 link. Other virtual servers are left alone.
    Cleanup {
        /// ProxierConfiguration (or KubeProxyConfiguration) file: its ipvs.excludeCIDRs are kept.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Program the kernel from the Kubernetes API (or the manifests) and keep it in step.
    Run {
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Sync once and exit.
        #[arg(long)]
        once: bool,
    },
}

/// The `--config` file (a kipvs ProxierConfiguration or kube-proxy's KubeProxyConfiguration),
/// logging what kipvs ignores in it; defaults without one.
pub fn load_config(path: Option<&Path>) -> anyhow::Result<ProxierConfiguration> {
    let Some(path) = path else {
        return Ok(ProxierConfiguration::default());
    };
    let (config, warnings) = ProxierConfiguration::load_any(path)?;
    for warning in warnings {
        tracing::warn!("{}: {warning}", path.display());
    }
    Ok(config)
}

/// The manifests source of `args` (`plan` needs one).
pub fn manifests_source(args: &SourceArgs) -> anyhow::Result<ManifestsSource> {
    let path = args.manifests.clone().context("--manifests is required")?;
    Ok(ManifestsSource {
        path,
        node_name: args.node.clone(),
        node_configs: None,
    })
}

/// A client from `--kubeconfig`, or the default ($KUBECONFIG / ~/.kube/config, then
/// in-cluster), with its server chosen by [`apiserver::choose_server`] (`--master`, the
/// remembered addresses); and whether the API is reached only through a ClusterIP with nothing
/// remembered ([`ApiPath`]) and its sender.
pub async fn kube_client(
    api: &ApiArgs,
) -> anyhow::Result<(kube::Client, watch::Sender<Option<String>>, ApiPath)> {
    let mut config = match &api.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let remembered = match &api.remember_apiserver {
        Some(path) if api.master.is_none() && api.kubeconfig.is_none() => {
            Memory { path: path.clone() }.read()
        }
        _ => Vec::new(),
    };
    let (answering, default_answers) = if remembered.is_empty() {
        (Vec::new(), false)
    } else {
        let probes = remembered.iter().map(apiserver::answers);
        tokio::join!(
            futures::future::join_all(probes),
            apiserver::answers(&config.cluster_url)
        )
    };
    let choice = apiserver::choose_server(
        api.master.as_ref(),
        api.kubeconfig.is_some(),
        &remembered,
        |uri| {
            let i = remembered.iter().position(|r| r == uri);
            i.is_some_and(|i| answering[i])
        },
        default_answers,
    );
    if let Some(server) = &choice.server {
        config.cluster_url = server.clone();
    }
    let origin = choice.origin.describe();
    tracing::info!(server = %config.cluster_url, origin, "Kubernetes API server");
    let (tx, path) = ApiPath::of(choice.origin, &remembered);
    if let Some(why) = path.refusal() {
        tracing::warn!("a takeover from kube-proxy waits: {why}");
    }
    Ok((kube::Client::try_from(config)?, tx, path))
}

pub fn identity(args: &SourceArgs) -> NodeIdentity {
    NodeIdentity {
        name: args.node.clone(),
        node_ips: args.node_ips.clone(),
    }
}

/// The kernel dataplane, with a hint when IPVS is not there.
pub async fn connect_kernel() -> anyhow::Result<KernelDataplane> {
    KernelDataplane::connect()
        .await
        .context("connecting to the kernel (are the ip_vs and dummy modules loaded?)")
}
