//! `kipvs-operator`: rolls ProxyConfig changes out to per-node NodeProxyConfigs.
//!
//! Runs as a Deployment (config/operator/). Only the replica holding the Lease writes; the
//! others wait. A replica that loses the Lease stops writing at once and is a candidate again;
//! one started while the API server is away waits for it. It exits on SIGTERM (releasing the
//! Lease) and on errors of its own configuration.

use anyhow::Context as _;
use clap::Parser;
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::coordination::v1::Lease;
use kipvs_operator::controller;
use kipvs_operator::lease::{Elector, LeaseConfig};
use kipvs_operator::metrics::{self, Metrics};
use kipvs_operator::stored::StoredProxyConfig;
use kube::api::ListParams;
use kube::{Api, Client};
use std::io::IsTerminal;
use tokio::signal::unix::{SignalKind, signal};
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
    let leases: Api<Lease> = Api::namespaced(client.clone(), &args.lease_namespace);
    let config = LeaseConfig::new(&args.lease_name, &identity);
    let retry = config.retry_period;
    let mut elector = Elector::new(leases, config);
    let shutdown = shutdown_signal().boxed().shared();
    let outcome = tokio::select! {
        () = wait_for_api(&client, retry) => {
            metrics.set_ready();
            tracing::info!(%identity, lease = %args.lease_name, namespace = %args.lease_namespace, "waiting for leadership");
            lead(&client, &identity, &metrics, &mut elector, shutdown.clone()).await
        }
        () = shutdown.clone() => Ok(()),
    };
    if let Err(e) = elector.release().await {
        tracing::warn!(error = %e, "cannot release the Lease");
    }
    outcome
}

/// Lists ProxyConfigs every `retry` until the API server answers (and has the CRDs). A replica
/// started while the API server is away waits for it, as client-go's leader election does,
/// instead of exiting into a kubelet's growing restart back-off. ProxyConfigs are read
/// leniently: one undecodable ProxyConfig does not keep the operator from starting.
async fn wait_for_api(client: &Client, retry: std::time::Duration) {
    let api = Api::<StoredProxyConfig>::all(client.clone());
    for failures in 0u32.. {
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => {
                if failures > 0 {
                    tracing::info!(failures, "the API server answers");
                }
                return;
            }
            // Once a minute at WARN.
            Err(e) if failures % 30 == 0 => {
                let hint = match &e {
                    kube::Error::Api(status) if status.code == 404 => {
                        " (are the CRDs installed? kubectl apply -k config/crd)"
                    }
                    _ => "",
                };
                tracing::warn!(error = %e, failures, "cannot list ProxyConfigs{hint}; retrying every {retry:?}");
            }
            Err(e) => tracing::debug!(error = %e, failures, "cannot list ProxyConfigs"),
        }
        tokio::time::sleep(retry).await;
    }
}

/// Leads whenever this replica holds the Lease: takes it, runs the controller while holding
/// it, and when leadership is lost (an API server outage longer than the renew deadline, or
/// another holder) stops the controller, its writes included, and is a candidate again.
/// Returns when the controller ends on `shutdown`.
///
/// # Errors
/// As [`controller::run`].
async fn lead(
    client: &Client,
    identity: &str,
    metrics: &Metrics,
    elector: &mut Elector,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            () = elector.acquire() => {}
            () = shutdown.clone() => return Ok(()),
        }
        tracing::info!(%identity, "leading");
        metrics.leadership.leader.set(1);
        tokio::select! {
            result = controller::run(client.clone(), identity, metrics.clone(), shutdown.clone()) => return result,
            () = elector.hold() => {}
        }
        metrics.leadership.leader.set(0);
        metrics.leadership.lost.inc();
        tracing::warn!(%identity, "lost the leader-election Lease: stopped writing; waiting for leadership again");
    }
}

/// Completes on SIGTERM (the kubelet stopping the pod) or SIGINT.
async fn shutdown_signal() {
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        Ok(()) = tokio::signal::ctrl_c() => {}
        Some(()) = terminate.recv() => {}
        else => std::future::pending().await,
    }
}
