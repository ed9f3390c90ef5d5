//! `kipvs-operator`: rolls ProxyConfig changes out to per-node NodeProxyConfigs.
//!
//! Runs as a Deployment (config/operator/). Only the replica holding the Lease writes; the
//! others wait. It exits non-zero when it loses the Lease, so that it never writes without it.

use anyhow::Context as _;
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use kipvs_operator::controller;
use kipvs_operator::lease::{Elector, LeaseConfig};
use kipvs_operator::metrics::{self, Metrics};
use kipvs_operator::stored::StoredProxyConfig;
use kube::api::ListParams;
use kube::{Api, Client};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Command line (each flag can also come from the environment).
#[derive(Parser, Debug)]
#[command(name = "kipvs-operator", version, about)]
struct Args {
    /// Namespace of the leader-election Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kipvs-system")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "kipvs-operator")]
    lease_name: String,
    /// This replica's identity in the Lease (the pod name; the host name if unset).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Address of the HTTP server for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_bind_address: std::net::SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    let args = Args::parse();
    let identity = match args.identity {
        Some(identity) => identity,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| format!("kipvs-operator-{}", std::process::id())),
    };
    let metrics = Metrics::new();
    let listener = tokio::net::TcpListener::bind(args.metrics_bind_address)
        .await
        .with_context(|| {
            format!(
                "binding --metrics-bind-address {}",
                args.metrics_bind_address
            )
        })?;
    tokio::spawn(metrics::serve(listener, metrics.clone()));
    tracing::info!(address = %args.metrics_bind_address, "serving /metrics, /healthz and /readyz");
    let client = Client::try_default()
        .await
        .context("no Kubernetes client configuration")?;
    // Read leniently: one undecodable ProxyConfig must not keep the operator from starting.
    Api::<StoredProxyConfig>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .context(
            "cannot list ProxyConfigs: are the CRDs installed (kubectl apply -k config/crd)?",
        )?;
    metrics.set_ready();

    let leases: Api<Lease> = Api::namespaced(client.clone(), &args.lease_namespace);
    let mut elector = Elector::new(leases, LeaseConfig::new(&args.lease_name, &identity));
    tracing::info!(%identity, lease = %args.lease_name, namespace = %args.lease_namespace, "waiting for leadership");
    elector.acquire().await;
    tracing::info!(%identity, "leading");
    let outcome = tokio::select! {
        result = controller::run(client, &identity, metrics) => result,
        () = elector.hold() => Err(anyhow::anyhow!("lost the leader-election Lease; exiting so as not to write without it")),
    };
    if let Err(e) = elector.release().await {
        tracing::warn!(error = %e, "cannot release the Lease");
    }
    outcome
}
