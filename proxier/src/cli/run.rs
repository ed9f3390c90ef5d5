//! `run`: the wiring of a proxier that keeps the kernel in step: its servers, its source, the
//! node's NodeProxyConfig followed, the takeover from kube-proxy, and the engine.

use super::args::{
    ApiArgs, ClusterArgs, DataplaneKind, SourceArgs, connect_kernel, identity, kube_client,
    load_config, manifests_source,
};
use anyhow::Context;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::dataplane::Dataplane;
use kipvs_proxier::dataplane::fake::FakeDataplane;
use kipvs_proxier::dataplane::host::kube_proxy::HostKubeProxy;
use kipvs_proxier::dataplane::kernel::preflight;
use kipvs_proxier::dataplane::kernel::settings::{Kernel, KernelSettings};
use kipvs_proxier::dataplane::nftables::runner::Nft;
use kipvs_proxier::engine::observer::Observer;
use kipvs_proxier::engine::planner::Planner;
use kipvs_proxier::engine::takeover::Takeover;
use kipvs_proxier::engine::{ConfigFollower, Engine};
use kipvs_proxier::serve::grpc;
use kipvs_proxier::serve::health::{self, ProxyHealth, ServiceHealthServers};
use kipvs_proxier::serve::metrics::Metrics;
use kipvs_proxier::serve::ports::{Ports, serve_while};
use kipvs_proxier::source::SourceHandle;
use kipvs_proxier::source::apiserver::{self, ApiPath, Memory};
use kipvs_proxier::source::kube::{Contact, KubeSource};
use kipvs_proxier::source::manifests::ManifestsSource;
use kipvs_proxier::source::node_config::{self, Assigned};
use kipvs_proxier_contract::report_status;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument;

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
    // Configured by the engine (`Observer::config_changed`) once it is built.
    let health = ProxyHealth::default();
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
    let healthz = serve_while(
        healthz_addr,
        "healthz",
        routes,
        metrics.clone(),
        ports.may_hold.clone(),
        own_healthz,
    );
    tokio::spawn(
        healthz.instrument(tracing::info_span!("server", what = "healthz", addr = %healthz_addr)),
    );
    let metrics_server = serve_while(
        metrics_addr,
        "metrics",
        metrics.routes(),
        metrics.clone(),
        ports.may_hold,
        None,
    );
    tokio::spawn(
        metrics_server
            .instrument(tracing::info_span!("server", what = "metrics", addr = %metrics_addr)),
    );
    tracing::info!(%healthz_addr, %metrics_addr, "serving /healthz, /livez and /metrics");
    if let Some(addr) = cluster.probe_bind_address {
        let held = watch::channel(true).1;
        let routes = health.routes(metrics);
        let server = serve_while(addr, "probe", routes, metrics.clone(), held, None);
        tokio::spawn(server.instrument(tracing::info_span!("server", what = "probe", %addr)));
        tracing::info!(%addr, "serving /livez, /readyz and /healthz for the kubelet's probes");
    }
    if let Some(addr) = cluster.grpc_health_bind_address {
        let (health, m) = (health.clone(), metrics.clone());
        tokio::spawn(
            async move {
                let what = "gRPC health";
                let listener = health::bind_retrying(addr, what, || m.bind_failed(what)).await;
                if let Err(e) = grpc::serve(listener, health, never()).await {
                    tracing::error!("gRPC health server failed: {e}");
                }
            }
            .instrument(tracing::info_span!("server", what = "gRPC health", %addr)),
        );
        tracing::info!(%addr, "serving grpc.health.v1.Health");
    }
    Ok(())
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
        let span = tracing::info_span!("source", manifests = %source.path.display());
        tokio::spawn(source.watch(handle.clone()).instrument(span));
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
        let span = tracing::info_span!("apiserver_memory", file = %file.display());
        tokio::spawn(
            memory
                .keep(urls, contact.subscribe(), path_tx)
                .instrument(span),
        );
    }
    let span = tracing::info_span!("source", api = "watch");
    tokio::spawn(source.run_in(handle.clone(), contact).instrument(span));
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
    tokio::spawn(
        async move {
            while report_rx.changed().await.is_ok() {
                let status = report_rx.borrow_and_update().clone();
                if let Some(status) = status {
                    let json = serde_json::to_string(&status).unwrap_or_default();
                    tracing::info!("NodeProxyConfig status: {json}");
                }
            }
        }
        .instrument(tracing::info_span!("status_log")),
    );
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
    let watch = node_config::watch_assigned(client.clone(), node.to_owned(), assigned_tx);
    tokio::spawn(watch.instrument(tracing::info_span!("node_config_watch", node)));
    let writer = report_status(client, node.to_owned(), report_rx, health);
    tokio::spawn(writer.instrument(tracing::info_span!("status_writer", node)));
    ConfigFollower {
        assigned,
        local,
        kernel,
        report,
    }
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
pub async fn run(args: SourceArgs, cluster: ClusterArgs, once: bool) -> anyhow::Result<()> {
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
            let mut dataplane = FakeDataplane::default();
            dataplane.missing_schedulers = cluster.fake_missing_scheduler.iter().cloned().collect();
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
