//! `kipvs-proxier`: the kipvs node agent.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kipvs_crds::Gate;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_node_status::report_status;
use kipvs_proxier::dataplane::Dataplane;
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::dataplane::host::kube_proxy::{HostKubeProxy, KubeProxyNode};
use kipvs_proxier::dataplane::kernel::KernelDataplane;
use kipvs_proxier::dataplane::kernel::preflight;
use kipvs_proxier::dataplane::kernel::settings::{Kernel, KernelSettings};
use kipvs_proxier::dataplane::nftables::runner::Nft;
use kipvs_proxier::engine::observer::Observer;
use kipvs_proxier::engine::planner::{NodeIdentity, Planner};
use kipvs_proxier::engine::preview::Preview;
use kipvs_proxier::engine::takeover::Takeover;
use kipvs_proxier::engine::{ConfigFollower, Engine};
use kipvs_proxier::plan::kube_proxy::kubelet_creates_shared_chains;
use kipvs_proxier::serve::grpc;
use kipvs_proxier::serve::health::{self, ProxyHealth, ServiceHealthServers};
use kipvs_proxier::serve::metrics::Metrics;
use kipvs_proxier::source::SourceHandle;
use kipvs_proxier::source::apiserver::{self, ApiPath, Memory};
use kipvs_proxier::source::kube::{Contact, KubeSource};
use kipvs_proxier::source::manifests::ManifestsSource;
use kipvs_proxier::source::node_config::{self, Assigned};
use kipvs_proxier::{format, inspect};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// kipvs proxier: programs kernel IPVS from Kubernetes Services and EndpointSlices.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the objects come from and which node this is.
#[derive(clap::Args)]
struct SourceArgs {
    /// This node's name (endpoints with this nodeName are local).
    #[arg(long = "node", env = "KIPVS_NODE_NAME")]
    node: String,
    /// YAML/JSON file (multi-document or a List) or directory of Services, EndpointSlices and
    /// Nodes. Without it, `run` watches the Kubernetes API.
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// Configuration file: `apiVersion: kipvs.io/v1alpha1`, `kind: ProxierConfiguration`
    /// (kube-proxy field names; the header may be left out), or kube-proxy's own
    /// KubeProxyConfiguration (its ConfigMap's config.conf). Defaults apply without it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Node IP for NodePort virtual servers (repeatable); default: the Node's InternalIPs.
    #[arg(long = "node-ip")]
    node_ips: Vec<IpAddr>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// The lines `ipvsadm -Sn` prints for the table.
    Ipvsadm,
    /// The nftables set elements as `nft` commands (`add element inet kipvs SET { ... }`).
    Nft,
    /// Virtual servers, bound addresses, health-check node ports and set elements as JSON.
    Json,
}

/// Output of `inspect`.
#[derive(Clone, Copy, ValueEnum)]
enum InspectFormat {
    /// One block per Service port: virtual servers, real servers, verdicts.
    Text,
    /// The same as JSON.
    Json,
}

/// How long `inspect` waits for the API server's lists.
const INSPECT_LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// Which dataplane `run` programs (or `inspect` reads).
#[derive(Clone, Copy, ValueEnum)]
enum DataplaneKind {
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
struct ApiArgs {
    /// kubeconfig for the Kubernetes API; default: $KUBECONFIG or ~/.kube/config, then the
    /// in-cluster config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The API server's address, `https://host:port` or `host:port` (kube-proxy's `--master`;
    /// `http://` is refused): replaces the server of the kubeconfig or of the in-cluster
    /// configuration, whose credentials and CA stay in use.
    #[arg(long, env = "KIPVS_MASTER", value_parser = apiserver::parse_master)]
    master: Option<http::Uri>,
    /// File of the API server's addresses remembered on the node: read at start when neither
    /// --master nor --kubeconfig is given; `run` writes the ready endpoints of the `kubernetes`
    /// EndpointSlices into it whenever they change (the DaemonSet: /var/lib/kipvs/apiserver on a
    /// hostPath, so that a reboot finds the API server without the ClusterIP).
    #[arg(long, env = "KIPVS_REMEMBER_APISERVER")]
    remember_apiserver: Option<PathBuf>,
}

/// The Kubernetes API and the proxier's own servers (`run` only).
#[derive(clap::Args)]
struct ClusterArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// `ip:port` of /healthz and /livez (overrides healthzBindAddress).
    #[arg(long)]
    healthz_bind_address: Option<String>,
    /// `ip:port` of /metrics (overrides metricsBindAddress).
    #[arg(long)]
    metrics_bind_address: Option<String>,
    /// `ip:port` of the gRPC health service (grpc.health.v1.Health: "" mirrors /livez,
    /// "kipvs.io/healthz" mirrors /healthz); off when not given.
    #[arg(long)]
    grpc_health_bind_address: Option<SocketAddr>,
    /// `ip:port` of a second HTTP server of /livez, /readyz and /healthz for the kubelet's HTTP
    /// probes (kubelets before 1.24: `config-http-probes/`), held all along: the healthz port
    /// is left to kube-proxy while the proxier stands by, where its answers would be
    /// kube-proxy's; off when not given.
    #[arg(long)]
    probe_bind_address: Option<SocketAddr>,
    /// Address health-check node ports listen on; default: every address (`::`, else
    /// `0.0.0.0`).
    #[arg(long)]
    health_check_bind_ip: Option<IpAddr>,
    /// The dataplane to program (`fake`: in memory, for tests without kernel IPVS).
    #[arg(long, value_enum, default_value = "kernel", hide = true)]
    dataplane: DataplaneKind,
    /// Take the node over from kube-proxy's IPVS mode and hand it back (README, "Moving from
    /// kube-proxy"): wait in standby while kube-proxy runs, then adopt its table and remove its
    /// iptables rules and ipsets once kipvs's nftables table is in place; stop writing when
    /// kube-proxy comes back; hand the node back when `serviceProxy` is `kube-proxy`.
    /// `false`: none of it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    kube_proxy_takeover: bool,
    /// Let a switch from kube-proxy go ahead even when its first sync would delete, unbind or
    /// re-weight to 0 something carrying connections (what `kipvs-proxier takeover` marks);
    /// without it the proxier stays in standby and reports its revision Failed.
    #[arg(long)]
    allow_connection_changes: bool,
    /// Written to /proc/self/oom_score_adj at start (kube-proxy's `oomScoreAdj`, whose
    /// default -999 the DaemonSet in `config/` passes), so that the kernel's OOM killer takes
    /// the proxier last; not written when not given. Lowering it needs CAP_SYS_RESOURCE (a
    /// privileged container); a failure is logged and the proxier goes on.
    #[arg(long, env = "KIPVS_OOM_SCORE_ADJ", allow_hyphen_values = true,
          value_parser = clap::value_parser!(i32).range(-1000..=1000))]
    oom_score_adj: Option<i32>,
    /// Test only, with --dataplane=fake: simulate a kernel without this IPVS scheduler module
    /// (a configuration using it is reported Failed). Repeatable.
    #[arg(long, value_name = "NAME", hide = true, requires = "dataplane")]
    fake_missing_scheduler: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the desired IPVS state for the manifests without touching the kernel.
    Plan {
        #[command(flatten)]
        source: SourceArgs,
        /// Output format.
        #[arg(long, value_enum, default_value = "ipvsadm")]
        format: Format,
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
fn load_config(path: Option<&Path>) -> anyhow::Result<ProxierConfiguration> {
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
fn manifests_source(args: &SourceArgs) -> anyhow::Result<ManifestsSource> {
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
async fn kube_client(
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

/// What [`start`] started.
struct Started {
    /// The handle the engine syncs from (ready once the source has loaded everything).
    handle: SourceHandle,
    /// The engine's observers (health, metrics, health-check node ports).
    observer: Arc<dyn Observer>,
    /// The health state.
    health: ProxyHealth,
    /// Where the node's NodeProxyConfig comes from.
    follow: Follow,
}

/// Start the health, metrics and gRPC health servers and the source.
async fn start(
    args: &SourceArgs,
    cluster: &ClusterArgs,
    config: &ProxierConfiguration,
    ports: Ports,
) -> anyhow::Result<Started> {
    let metrics = Metrics::new();
    let health = ProxyHealth::new(
        2 * config.ipvs.sync_period,
        config.gate_enabled(Gate::KubeProxyDrainingTerminatingNodes),
    );
    let bind_ips = match cluster.health_check_bind_ip {
        Some(ip) => vec![ip],
        None => vec![Ipv6Addr::UNSPECIFIED.into(), Ipv4Addr::UNSPECIFIED.into()],
    };
    let health_check_ports = ServiceHealthServers::new(health.clone(), bind_ips);
    let observers: Vec<Arc<dyn Observer>> = vec![
        Arc::new(health.clone()),
        Arc::new(metrics.clone()),
        Arc::new(health_check_ports),
    ];
    let observer: Arc<dyn Observer> = Arc::new(observers);
    let handle = SourceHandle::gated().with_observer(observer.clone());
    serve(cluster, config, &metrics, &health, ports)?;
    let follow = start_source(args, &cluster.api, &handle, &health).await?;
    Ok(Started {
        handle,
        observer,
        health,
        follow,
    })
}

/// When the healthz and metrics servers hold their ports: `may_hold` says (`true` while the
/// proxier programs, [`Takeover::ports`]; always without a takeover), and `own_healthz` is set
/// while the healthz server holds kube-proxy's healthz port (an answer there is the proxier's
/// own then).
struct Ports {
    may_hold: watch::Receiver<bool>,
    own_healthz: Option<(u16, Arc<std::sync::atomic::AtomicBool>)>,
}

impl Ports {
    /// Ports held all along (no takeover).
    fn always() -> Self {
        Ports {
            may_hold: watch::channel(true).1,
            own_healthz: None,
        }
    }
}

/// Starts the healthz (`/healthz`, `/livez`), metrics and, when asked for, gRPC health servers.
/// Each binds in a task of its own, retried while its port is taken: programming never waits
/// for it (kube-proxy's healthz and metrics servers do the same). The healthz and metrics
/// servers hold their ports only while `ports` lets them (kube-proxy binds the same ones).
///
/// # Errors
/// A bind address that does not parse.
fn serve(
    cluster: &ClusterArgs,
    config: &ProxierConfiguration,
    metrics: &Metrics,
    health: &ProxyHealth,
    ports: Ports,
) -> anyhow::Result<()> {
    let healthz_addr = match &cluster.healthz_bind_address {
        Some(a) => a
            .parse()
            .with_context(|| format!("--healthz-bind-address {a:?}"))?,
        None => config.healthz_socket_addr()?,
    };
    let metrics_addr = match &cluster.metrics_bind_address {
        Some(a) => a
            .parse()
            .with_context(|| format!("--metrics-bind-address {a:?}"))?,
        None => config.metrics_socket_addr()?,
    };
    let never = std::future::pending::<()>;
    let own_healthz = ports
        .own_healthz
        .filter(|(port, _)| *port == healthz_addr.port())
        .map(|(_, own)| own);
    let routes = health.routes(metrics);
    tokio::spawn(serve_while(
        healthz_addr,
        "healthz",
        routes,
        metrics.clone(),
        ports.may_hold.clone(),
        own_healthz,
    ));
    tokio::spawn(serve_while(
        metrics_addr,
        "metrics",
        metrics.routes(),
        metrics.clone(),
        ports.may_hold,
        None,
    ));
    tracing::info!(%healthz_addr, %metrics_addr, "serving /healthz, /livez and /metrics");
    if let Some(addr) = cluster.probe_bind_address {
        let held = watch::channel(true).1;
        let routes = health.routes(metrics);
        let server = serve_while(addr, "probe", routes, metrics.clone(), held, None);
        tokio::spawn(server);
        tracing::info!(%addr, "serving /livez, /readyz and /healthz for the kubelet's probes");
    }
    if let Some(addr) = cluster.grpc_health_bind_address {
        let (health, m) = (health.clone(), metrics.clone());
        tokio::spawn(async move {
            let what = "gRPC health";
            let listener = health::bind_retrying(addr, what, || m.bind_failed(what)).await;
            if let Err(e) = grpc::serve(listener, health, never()).await {
                tracing::error!("gRPC health server failed: {e}");
            }
        });
        tracing::info!(%addr, "serving grpc.health.v1.Health");
    }
    Ok(())
}

/// Serves `routes` on `addr` whenever `may_hold` is true: bound when it turns true (retried
/// while the port is taken, counted in `metrics`), released when it turns false; `own` is set
/// while bound.
async fn serve_while<F>(
    addr: SocketAddr,
    what: &'static str,
    routes: F,
    metrics: Metrics,
    mut may_hold: watch::Receiver<bool>,
    own: Option<Arc<std::sync::atomic::AtomicBool>>,
) where
    F: warp::Filter<Extract = (warp::reply::Response,)> + Clone + Send + Sync + 'static,
{
    use std::sync::atomic::Ordering;
    loop {
        if may_hold.wait_for(|hold| *hold).await.is_err() {
            return;
        }
        let bind = health::bind_retrying(addr, what, || metrics.bind_failed(what));
        let listener = tokio::select! {
            listener = bind => listener,
            Ok(_) = may_hold.wait_for(|hold| !*hold) => continue,
        };
        if let Some(own) = &own {
            own.store(true, Ordering::Relaxed);
        }
        let mut released = may_hold.clone();
        let release = async move {
            if released.wait_for(|hold| !*hold).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        health::serve(listener, routes.clone(), release).await;
        if let Some(own) = &own {
            own.store(false, Ordering::Relaxed);
        }
        tracing::info!(%addr, "released the {what} port");
    }
}

/// Starts the source of `args` writing into `handle`: the manifests (they also hold the node's
/// NodeProxyConfig), or the Kubernetes API of `api` (its contact followed by `health`, the API
/// server's addresses remembered in `--remember-apiserver`).
///
/// # Errors
/// No API client can be made from `api`.
async fn start_source(
    args: &SourceArgs,
    api: &ApiArgs,
    handle: &SourceHandle,
    health: &ProxyHealth,
) -> anyhow::Result<Follow> {
    if args.manifests.is_some() {
        let (assigned_tx, assigned) = watch::channel(Assigned::Unknown);
        let source = ManifestsSource {
            node_configs: Some(assigned_tx),
            ..manifests_source(args)?
        };
        tokio::spawn(source.watch(handle.clone()));
        return Ok(Follow::Manifests(assigned));
    }
    let (client, path_tx, path) = kube_client(api).await?;
    let source = KubeSource {
        client: client.clone(),
        node_name: args.node.clone(),
    };
    let contact = Contact::default();
    health.follow_sources(contact.subscribe());
    if let Some(file) = &api.remember_apiserver {
        let memory = Memory { path: file.clone() };
        let store = handle.clone();
        let urls = move || store.with_store(|store| apiserver::api_server_urls(store));
        tokio::spawn(memory.keep(urls, contact.subscribe(), path_tx));
    }
    tokio::spawn(source.run_in(handle.clone(), contact));
    Ok(Follow::Api(client, path))
}

/// Where the node's NodeProxyConfig comes from.
enum Follow {
    /// Watched on the API server; status written back there. With whether the API is reached
    /// without a ClusterIP in the way.
    Api(kube::Client, ApiPath),
    /// Read from the manifests (offline runs, the VM tests); status logged.
    Manifests(watch::Receiver<Assigned>),
}

/// Follow the NodeProxyConfig found in the manifests: the status the engine reports is logged
/// (`NodeProxyConfig status: {...}`), as there is no API server to write it to.
fn follow_manifests(
    assigned: watch::Receiver<Assigned>,
    local: ProxierConfiguration,
    kernel: Box<dyn KernelSettings>,
) -> ConfigFollower {
    let (report, mut report_rx) = watch::channel(None);
    tokio::spawn(async move {
        while report_rx.changed().await.is_ok() {
            let status = report_rx.borrow_and_update().clone();
            if let Some(status) = status {
                let json = serde_json::to_string(&status).unwrap_or_default();
                tracing::info!("NodeProxyConfig status: {json}");
            }
        }
    });
    ConfigFollower {
        assigned,
        local,
        kernel,
        report,
    }
}

/// Follow the node's NodeProxyConfig (see [`node_config`]): start its watch and the status
/// writer, and return what the engine needs to apply its revisions.
fn follow_node_config(
    client: kube::Client,
    node: &str,
    health: ProxyHealth,
    local: ProxierConfiguration,
    kernel: Box<dyn KernelSettings>,
) -> ConfigFollower {
    let (assigned_tx, assigned) = watch::channel(Assigned::Unknown);
    let (report, report_rx) = watch::channel(None);
    tokio::spawn(node_config::watch_assigned(
        client.clone(),
        node.to_owned(),
        assigned_tx,
    ));
    tokio::spawn(report_status(client, node.to_owned(), report_rx, health));
    ConfigFollower {
        assigned,
        local,
        kernel,
        report,
    }
}

/// The desired state for `args`: from the manifests, or listed from the Kubernetes API.
async fn desired_state(
    args: &SourceArgs,
    api: &ApiArgs,
) -> anyhow::Result<kipvs_proxier::model::DesiredState> {
    Ok(planned(args, api, BTreeSet::new())
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
        let listing = tokio::spawn(source.run(handle.clone()));
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

/// What the engine of `run` drives: the dataplane, the node-wide kernel settings and, on a node
/// taken over from kube-proxy, the removal of its leftovers.
struct EngineParts<D> {
    dataplane: D,
    kernel: Box<dyn KernelSettings>,
    takeover: Option<Takeover>,
}

/// Sync once the source is ready, then once (`--once`) or until a shutdown signal, following
/// the node's NodeProxyConfig with the Kubernetes source (not with `--once`).
async fn run_engine<D: Dataplane>(
    args: &SourceArgs,
    started: Started,
    config: ProxierConfiguration,
    parts: EngineParts<D>,
    once: bool,
) -> anyhow::Result<()> {
    let Started {
        handle,
        observer,
        health,
        follow,
    } = started;
    let EngineParts {
        dataplane,
        kernel,
        takeover,
    } = parts;
    let planner = Planner::new(identity(args), config.clone());
    let mut engine = Engine::new(handle.clone(), planner, dataplane).observed_by(observer);
    if let Some(takeover) = takeover {
        let takeover = match &follow {
            Follow::Api(_, path) => takeover.needing_api(path.clone()),
            Follow::Manifests(_) => takeover,
        };
        engine = engine.taking_over(takeover);
    }
    if !once {
        let follower = match follow {
            Follow::Api(client, _) => {
                follow_node_config(client, &args.node, health, config, kernel)
            }
            Follow::Manifests(assigned) => follow_manifests(assigned, config, kernel),
        };
        engine = engine.following(follower);
    }
    if once {
        handle.wait_ready().await;
        while let Some(wait) = engine.switch().await {
            tokio::select! {
                _ = shutdown_signal() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
        engine.sync().await?;
    } else {
        engine.run(shutdown_signal()).await;
    }
    Ok(())
}

fn identity(args: &SourceArgs) -> NodeIdentity {
    NodeIdentity {
        name: args.node.clone(),
        node_ips: args.node_ips.clone(),
    }
}

/// The kernel dataplane, with a hint when IPVS is not there.
async fn connect_kernel() -> anyhow::Result<KernelDataplane> {
    KernelDataplane::connect()
        .await
        .context("connecting to the kernel (are the ip_vs and dummy modules loaded?)")
}

/// The kernel's facilities checked before anything is programmed
/// ([`kipvs_proxier::dataplane::kernel::preflight`]): one error naming every missing one.
async fn check_kernel() -> anyhow::Result<()> {
    let osrelease = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    preflight::check(&Nft::default(), &osrelease).await?;
    tracing::info!(
        kernel = osrelease.trim(),
        "the kernel has what kipvs needs (IPVS, nftables)"
    );
    Ok(())
}

/// Kernel settings made at start (sysctls and IPVS timeouts, each logged; kube-proxy
/// `NewProxier`); a NodeProxyConfig revision sets them again live.
async fn setup_kernel(config: &ProxierConfiguration, kernel: &Kernel) -> anyhow::Result<()> {
    kernel.apply(config).await?;
    let osrelease =
        std::fs::read_to_string(kernel.proc_sys.join("kernel/osrelease")).unwrap_or_default();
    let now = kernel.ipvs.timeouts().await?;
    let info = kernel.ipvs.info().await?;
    tracing::info!(
        kernel = osrelease.trim(),
        ipvs_version = %info.version,
        tcp_timeout_s = now.tcp,
        tcp_fin_timeout_s = now.tcp_fin,
        udp_timeout_s = now.udp,
        "IPVS ready"
    );
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down; the kernel state stays as programmed");
}

async fn main_inner(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Plan { source, format } => plan(&source, format),
        Command::Inspect {
            source,
            api,
            format,
            dataplane,
        } => inspect(&source, &api, format, dataplane).await,
        Command::Takeover {
            source,
            api,
            allow_connection_changes,
            kube_proxy_config,
        } => {
            takeover(
                &source,
                &api,
                allow_connection_changes,
                kube_proxy_config.as_deref(),
            )
            .await
        }
        Command::Cleanup { config } => cleanup(config.as_deref()).await,
        Command::Run {
            source,
            cluster,
            once,
        } => run(source, cluster, once).await,
    }
}

/// `plan`: the desired state of the manifests, printed in `format`.
fn plan(args: &SourceArgs, format: Format) -> anyhow::Result<()> {
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
async fn inspect(
    args: &SourceArgs,
    api: &ApiArgs,
    format: InspectFormat,
    dataplane: DataplaneKind,
) -> anyhow::Result<()> {
    let desired = desired_state(args, api).await?;
    let observed = match dataplane {
        DataplaneKind::Kernel => connect_kernel().await?.observe().await?,
        DataplaneKind::Fake => Default::default(),
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
async fn takeover(
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
async fn cleanup(config: Option<&Path>) -> anyhow::Result<()> {
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

/// Writes `value` to `/proc/self/oom_score_adj` (kube-proxy: `oom.ApplyOOMScoreAdj(0,
/// oomScoreAdj)`), logging what was done; a failure is logged, not fatal (as kube-proxy).
fn set_oom_score_adj(value: i32) {
    match std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        Ok(()) => tracing::info!(oom_score_adj = value, "OOM score adjustment set"),
        Err(e) => tracing::warn!(
            oom_score_adj = value,
            "cannot set the OOM score adjustment (needs CAP_SYS_RESOURCE to lower it): {e}"
        ),
    }
}

/// `run`: programs the kernel (or the fake dataplane) and keeps it in step.
async fn run(args: SourceArgs, cluster: ClusterArgs, once: bool) -> anyhow::Result<()> {
    let config = load_config(args.config.as_deref())?;
    if let Some(value) = cluster.oom_score_adj {
        set_oom_score_adj(value);
    }
    if let Some(path) = &args.manifests {
        // Fail early on an unreadable path (the watch would only log it).
        std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    }
    match cluster.dataplane {
        DataplaneKind::Kernel => {
            anyhow::ensure!(
                cluster.fake_missing_scheduler.is_empty(),
                "--fake-missing-scheduler needs --dataplane=fake"
            );
            check_kernel().await?;
            let dataplane = connect_kernel().await?;
            let kernel = Kernel {
                ipvs: dataplane.ipvs().clone(),
                proc_sys: PathBuf::from("/proc/sys"),
            };
            let (takeover, ports) = if cluster.kube_proxy_takeover {
                // Nothing is written to the kernel (not even kube-ipvs0 or a sysctl) before the
                // engine's switch says the proxier programs.
                let kube_proxy = HostKubeProxy::default();
                let ports = Ports {
                    may_hold: watch::channel(false).1,
                    own_healthz: Some((kube_proxy.healthz.port(), kube_proxy.own_healthz.clone())),
                };
                let takeover = Takeover::new(
                    Arc::new(kube_proxy),
                    Box::new(kernel.clone()),
                    cluster.allow_connection_changes,
                );
                let ports = Ports {
                    may_hold: takeover.ports(),
                    ..ports
                };
                (Some(takeover), ports)
            } else {
                setup_kernel(&config, &kernel).await?;
                (None, Ports::always())
            };
            let started = start(&args, &cluster, &config, ports).await?;
            if let (Some(takeover), Follow::Api(client, _)) = (&takeover, &started.follow) {
                takeover.node().follow_api(client.clone(), &args.node);
            }
            let engine = EngineParts {
                dataplane,
                kernel: Box::new(kernel),
                takeover,
            };
            run_engine(&args, started, config, engine, once).await
        }
        DataplaneKind::Fake => {
            tracing::warn!("fake dataplane: nothing is programmed into the kernel");
            let started = start(&args, &cluster, &config, Ports::always()).await?;
            let dataplane = FakeDataplane {
                missing_schedulers: cluster.fake_missing_scheduler.iter().cloned().collect(),
                ..Default::default()
            };
            let kernel = Box::new(dataplane.kernel_settings());
            let engine = EngineParts {
                dataplane,
                kernel,
                takeover: None,
            };
            run_engine(&args, started, config, engine, once).await
        }
    }
}

/// Turns transparent huge pages off for this process (and the `nft` it runs): on a kernel with
/// THP `always`, mimalloc's arenas get 2 MiB pages where the heap touches 4 KiB ones (issue 32,
/// peak RSS with `--dataplane fake`: 18 -> 10.6 MiB with no Service, 31 -> 21 MiB at 1k). A
/// failure (a kernel without the flag) changes nothing else.
fn no_transparent_huge_pages() {
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes integers and sets one flag of this process.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// mimalloc: planning allocates many small maps; with glibc's malloc a full plan of 50k Services
/// spends a third of its time in malloc/free (`cargo bench -p kipvs-proxier --bench sync`;
/// figures in docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    no_transparent_huge_pages();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            // kube-client's HTTP trace layer logs every failed request at ERROR; the watchers
            // (source::Retry) and the status writer log their failures themselves, once per
            // outage rather than once per attempt.
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,kube_client::client::builder=off")),
        )
        .init();
    match main_inner(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Metrics, serve_while, watch};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// The healthz and metrics servers hold their port only while the proxier programs: bound
    /// when it may hold it, released (and `own` cleared) when it hands it to kube-proxy.
    #[tokio::test]
    async fn the_ports_are_held_only_while_allowed() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let (may_hold, rx) = watch::channel(false);
        let own = Arc::new(AtomicBool::new(false));
        let metrics = Metrics::new();
        let routes = metrics.routes();
        tokio::spawn(serve_while(
            addr,
            "metrics",
            routes,
            metrics,
            rx,
            Some(own.clone()),
        ));
        let bound = |want: bool| async move {
            for _ in 0..200 {
                let taken = std::net::TcpListener::bind(addr).is_err();
                if taken == want {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(bound(false).await, "not held in standby");
        may_hold.send_replace(true);
        assert!(bound(true).await, "held while programming");
        assert!(own.load(Ordering::Relaxed));
        may_hold.send_replace(false);
        assert!(bound(false).await, "released for kube-proxy");
        for _ in 0..100 {
            if !own.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!own.load(Ordering::Relaxed));
        may_hold.send_replace(true);
        assert!(bound(true).await, "held again after a takeover again");
    }
}
