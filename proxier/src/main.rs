//! `kipvs-proxier`: the kipvs node agent.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier::dataplane::kernel::KernelDataplane;
use kipvs_proxier::run::{Engine, ManifestsSource, NodeIdentity, Planner, SourceHandle};
use kipvs_proxier::{format, sysctl};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
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
    /// YAML/JSON file (multi-document or a List) or directory of Services, EndpointSlices and Nodes.
    #[arg(long)]
    manifests: PathBuf,
    /// ProxierConfiguration file (kube-proxy field names). Defaults apply without it.
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
    /// Virtual servers, bound addresses and health-check node ports as JSON.
    Json,
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
    /// Program the kernel from the manifests and keep it in step as they change.
    Run {
        #[command(flatten)]
        source: SourceArgs,
        /// Sync once and exit.
        #[arg(long)]
        once: bool,
    },
}

fn load_config(path: Option<&Path>) -> anyhow::Result<ProxierConfiguration> {
    Ok(match path {
        Some(p) => ProxierConfiguration::from_file(p)?,
        None => ProxierConfiguration::default(),
    })
}

fn source(args: &SourceArgs) -> ManifestsSource {
    ManifestsSource {
        path: args.manifests.clone(),
        node_name: args.node.clone(),
    }
}

fn identity(args: &SourceArgs) -> NodeIdentity {
    NodeIdentity {
        name: args.node.clone(),
        node_ips: args.node_ips.clone(),
    }
}

/// Kernel settings made once at start, each logged (kube-proxy `NewProxier`).
async fn setup_kernel(
    config: &ProxierConfiguration,
    dataplane: &KernelDataplane,
) -> anyhow::Result<()> {
    let osrelease = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kernel = sysctl::parse_kernel_version(&osrelease);
    let wanted = sysctl::required(kernel, config.ipvs.strict_arp);
    for a in sysctl::ensure(Path::new("/proc/sys"), wanted)? {
        tracing::info!(
            sysctl = a.sysctl.path,
            value = a.sysctl.value,
            previous = a.previous.as_deref().unwrap_or("?"),
            "sysctl: {}",
            a.sysctl.reason
        );
    }
    let ipvs = &config.ipvs;
    let timeouts = ipvs::Timeouts {
        tcp: ipvs.tcp_timeout.as_secs() as u32,
        tcp_fin: ipvs.tcp_fin_timeout.as_secs() as u32,
        udp: ipvs.udp_timeout.as_secs() as u32,
    };
    if timeouts.tcp > 0 || timeouts.tcp_fin > 0 || timeouts.udp > 0 {
        dataplane.ipvs().set_timeouts(&timeouts).await?;
    }
    let now = dataplane.ipvs().timeouts().await?;
    let info = dataplane.ipvs().info().await?;
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
        Command::Plan {
            source: args,
            format,
        } => {
            let config = load_config(args.config.as_deref())?;
            let handle = SourceHandle::default();
            source(&args)
                .load_into(&handle, None)
                .with_context(|| format!("reading {}", args.manifests.display()))?;
            let mut planner = Planner::new(identity(&args), config);
            planner.replan(&mut handle.store.lock().expect("store lock"));
            let plan = planner.plan();
            let text = match format {
                Format::Ipvsadm => format::ipvsadm(&plan.desired),
                Format::Json => format::json(&plan.desired),
            };
            print!("{text}");
        }
        Command::Run { source: args, once } => {
            let config = load_config(args.config.as_deref())?;
            let dataplane = KernelDataplane::connect()
                .await
                .context("connecting to the kernel (are the ip_vs and dummy modules loaded?)")?;
            setup_kernel(&config, &dataplane).await?;
            let handle = SourceHandle::default();
            let source = source(&args);
            let planner = Planner::new(identity(&args), config);
            let mut engine = Engine::new(handle.clone(), planner, dataplane);
            if once {
                source
                    .load_into(&handle, None)
                    .with_context(|| format!("reading {}", args.manifests.display()))?;
                engine.sync().await?;
            } else {
                tokio::spawn(source.watch(handle));
                engine.run(shutdown_signal()).await;
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
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
