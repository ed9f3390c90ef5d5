//! The `kipvs-proxier` command line: its arguments ([`args`]), the one-shot commands
//! ([`oneshot`]: `plan`, `inspect`, `takeover`, `cleanup`) and `run` ([`run`]).

pub mod args;
mod oneshot;
mod run;

use args::{Cli, Command};

/// Runs the command `cli` names.
///
/// # Errors
/// The command's own, as each documents.
pub async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Plan {
            source,
            format,
            local_addresses,
        } => oneshot::plan(&source, format, local_addresses.into_iter().collect()),
        Command::Inspect {
            source,
            api,
            format,
            dataplane,
        } => oneshot::inspect(&source, &api, format, dataplane).await,
        Command::Takeover {
            source,
            api,
            allow_connection_changes,
            kube_proxy_config,
        } => {
            oneshot::takeover(
                &source,
                &api,
                allow_connection_changes,
                kube_proxy_config.as_deref(),
            )
            .await
        }
        Command::Cleanup { config } => oneshot::cleanup(config.as_deref()).await,
        Command::Run {
            source,
            cluster,
            once,
        } => run::run(source, cluster, once).await,
    }
}
