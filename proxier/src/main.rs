//! `kipvs-proxier`: the kipvs node agent. The command line is [`cli`]; this file sets the
//! process up (allocator, transparent huge pages, tracing) and runs the command.

mod cli;

use clap::Parser;
use cli::args::Cli;
use tracing_subscriber::EnvFilter;

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
    match cli::execute(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
