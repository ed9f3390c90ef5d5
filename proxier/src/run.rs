//! `kipvs-proxier run` with the manifests source: re-read the files when they change, plan,
//! and sync the dataplane; resync in full every `ipvs.syncPeriod`.

use crate::dataplane::{DEFAULT_NODE_PORT_RANGE, Dataplane, Ownership};
use crate::manifests;
use crate::plan::{self, Plan, PlanInput};
use crate::sync::Syncer;
use kipvs_crds::config::ProxierConfiguration;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// What the manifests source needs to know besides the files.
#[derive(Clone, Debug)]
pub struct ManifestsSource {
    /// File or directory of manifests.
    pub path: PathBuf,
    /// This node's name (endpoints with this `nodeName` are local).
    pub node_name: String,
    /// Node IPs for NodePort virtual servers; empty means the Node's InternalIP addresses.
    pub node_ips: Vec<IpAddr>,
}

impl ManifestsSource {
    /// Load the manifests and plan them. Unreadable documents and unplannable objects are
    /// logged as warnings naming the object; everything else is planned.
    ///
    /// Errors: only when the path itself cannot be read.
    pub fn plan(&self, config: &ProxierConfiguration) -> io::Result<(Plan, Vec<IpAddr>)> {
        let (snapshot, errors) = manifests::load(&self.path)?;
        for e in &errors {
            tracing::warn!("skipped manifest: {e}");
        }
        let node = snapshot.node(&self.node_name);
        let node_ips = if self.node_ips.is_empty() {
            node.map(plan::node_internal_ips).unwrap_or_default()
        } else {
            self.node_ips.clone()
        };
        let plan = plan::plan(&PlanInput {
            services: &snapshot.services,
            endpoint_slices: &snapshot.endpoint_slices,
            node_name: &self.node_name,
            node,
            node_ips: &node_ips,
            config,
        });
        for p in &plan.problems {
            tracing::warn!("{p}");
        }
        Ok((plan, node_ips))
    }
}

/// A cheap fingerprint of the manifests' contents, to notice edits.
fn fingerprint(path: &Path) -> io::Result<u64> {
    let mut hasher = DefaultHasher::new();
    let mut files = vec![path.to_path_buf()];
    if path.is_dir() {
        files = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<io::Result<_>>()?;
        files.sort();
    }
    for f in files {
        f.hash(&mut hasher);
        std::fs::read(&f).unwrap_or_default().hash(&mut hasher);
    }
    Ok(hasher.finish())
}

/// How often the files are checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Run until `shutdown` resolves: sync at start, whenever the manifests change (at most once
/// per `ipvs.minSyncPeriod`) and at least every `ipvs.syncPeriod`. Failed ops and unreadable
/// files are logged and retried on the next sync; the kernel state is left as it is on
/// shutdown (never flushed).
pub async fn run<D: Dataplane>(
    source: &ManifestsSource,
    config: &ProxierConfiguration,
    dataplane: D,
    once: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> io::Result<()> {
    let exclude_cidrs = config.ipvs.parsed_exclude_cidrs().unwrap_or_default();
    let mut syncer = Syncer::new(dataplane, Ownership::default());
    let mut seen: Option<u64> = None;
    let mut last_sync: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let current = fingerprint(&source.path).ok();
        let changed = current != seen;
        let resync_due = last_sync.is_none_or(|t| t.elapsed() >= config.ipvs.sync_period);
        let allowed = last_sync.is_none_or(|t| t.elapsed() >= config.ipvs.min_sync_period);
        if (changed || resync_due) && allowed {
            match source.plan(config) {
                Ok((plan, node_ips)) => {
                    syncer.ownership = Ownership {
                        node_ips: node_ips.into_iter().collect(),
                        node_port_range: Some(DEFAULT_NODE_PORT_RANGE),
                        exclude_cidrs: exclude_cidrs.clone(),
                    };
                    match syncer.sync(&plan.desired).await {
                        Ok(_) => seen = current,
                        Err(e) => tracing::error!("sync failed, nothing changed: {e}"),
                    }
                }
                Err(e) => {
                    tracing::error!(path = %source.path.display(), "cannot read manifests: {e}")
                }
            }
            last_sync = Some(Instant::now());
            if once {
                return Ok(());
            }
        }
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}
