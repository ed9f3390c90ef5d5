//! The operator process the harness runs (and restarts, as the kubelet would), and what it
//! reads from it: its metrics and its reconciles.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// The ProxyConfig the harness has the operator roll out.
pub(crate) const PC: &str = "scale";

/// How long the supervisor waits before restarting an exited operator.
pub(crate) const OPERATOR_RESTART: Duration = Duration::from_secs(2);

/// The operator process, run and restarted like the kubelet runs a container.
pub(crate) struct Operator {
    /// The running operator's pid (0 before the first start).
    pub(crate) pid: Arc<AtomicU32>,
    restarts: Arc<AtomicUsize>,
    /// Exits that were not a kill of the harness.
    exits: Arc<AtomicUsize>,
    kill: mpsc::UnboundedSender<bool>,
    done: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Operator {
    /// Starts `bin` with `args`, output appended to `log`, its pid written to `pid_file`;
    /// restarts it [`OPERATOR_RESTART`] after it exits.
    pub(crate) fn supervise(
        bin: String,
        args: Vec<String>,
        log: String,
        pid_file: Option<PathBuf>,
    ) -> Operator {
        let pid = Arc::new(AtomicU32::new(0));
        let restarts = Arc::new(AtomicUsize::new(0));
        let exits = Arc::new(AtomicUsize::new(0));
        let (kill, mut killed) = mpsc::unbounded_channel::<bool>();
        let task = {
            let (pid, restarts, exits) = (pid.clone(), restarts.clone(), exits.clone());
            tokio::spawn(async move {
                loop {
                    let child = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&log)
                        .and_then(|out| {
                            tokio::process::Command::new(&bin)
                                .args(&args)
                                .stdout(out.try_clone()?)
                                .stderr(out)
                                .kill_on_drop(true)
                                .spawn()
                        });
                    let mut child = match child {
                        Ok(child) => child,
                        Err(e) => {
                            eprintln!("fleet: cannot start {bin}: {e}");
                            return;
                        }
                    };
                    let id = child.id().unwrap_or_default();
                    pid.store(id, Ordering::Relaxed);
                    if let Some(file) = &pid_file {
                        let _ = std::fs::write(file, id.to_string());
                    }
                    let (status, last) = tokio::select! {
                        status = child.wait() => {
                            exits.fetch_add(1, Ordering::Relaxed);
                            (status, false)
                        }
                        Some(last) = killed.recv() => {
                            let _ = child.start_kill();
                            (child.wait().await, last)
                        }
                    };
                    if last {
                        return;
                    }
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    eprintln!(
                        "fleet: operator (pid {id}) exited: {status}; restarting in {} s",
                        OPERATOR_RESTART.as_secs()
                    );
                    restarts.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(OPERATOR_RESTART).await;
                }
            })
        };
        Operator {
            pid,
            restarts,
            exits,
            kill,
            done: Mutex::new(Some(task)),
        }
    }

    /// Restarts so far.
    pub(crate) fn restarts(&self) -> usize {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Exits that were not a kill of the harness.
    pub(crate) fn exits(&self) -> usize {
        self.exits.load(Ordering::Relaxed)
    }

    /// SIGKILL (the supervisor restarts it).
    pub(crate) fn kill(&self) {
        let _ = self.kill.send(false);
    }

    /// Stops it for good.
    pub(crate) async fn stop(&self) {
        let _ = self.kill.send(true);
        let task = self.done.lock().expect("operator task").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// The operator's /metrics text (plain HTTP/1.0 GET).
pub(crate) async fn operator_metrics(address: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text)
}

/// Reconciles the operator logged so far (its debug line "reconciled" per reconcile).
pub(crate) fn reconciles(log: &str) -> usize {
    std::fs::read_to_string(log)
        .map(|text| text.lines().filter(|l| l.contains("reconciled")).count())
        .unwrap_or(0)
}
