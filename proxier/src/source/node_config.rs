//! Following the node's own `NodeProxyConfig` (issue 6): which configuration is in force, how
//! a new revision is checked and applied live, and how the proxier reports on it.
//!
//! - **Precedence**: the NodeProxyConfig's `spec.config` over the local `--config` file over
//!   the defaults. Without a NodeProxyConfig (none for this node, or the CRD is not
//!   installed: logged once) the proxier runs on its local configuration, so it works without
//!   the operator. Deleting the NodeProxyConfig returns to the local configuration.
//! - [`watch_assigned`] watches `nodeproxyconfigs` with the field selector
//!   `metadata.name=<node>` and publishes the [`Assigned`] configuration on a
//!   `tokio::sync::watch` channel; the [`Engine`](crate::engine::Engine) selects on it (no
//!   shared mutable configuration). Status writes of the proxier itself come back as watch
//!   events with the same spec and are not republished.
//! - The engine checks a new revision first ([`ProxierConfiguration::validate`], then
//!   [`KernelSettings::check`]: the scheduler must be available). A revision that fails is
//!   reported `Failed` with the reason and the previous configuration stays in force.
//! - Applied live, without a restart: every Service is re-planned (feature gates, scheduler,
//!   `nodePortAddresses`, `excludeCIDRs`) and synced through the usual diff, so only what the
//!   change concerns is touched; `ipvs.drainTimeout`; IPVS timeouts and strictARP sysctls
//!   ([`KernelSettings::apply`]: zero timeouts leave the kernel's as they are, and turning
//!   strictARP off does not restore `arp_ignore`/`arp_announce`, as in kube-proxy); the
//!   `KubeProxyDrainingTerminatingNodes` gate and the `/livez` timeout (`2 × syncPeriod`) of
//!   the health servers; `syncPeriod` and `minSyncPeriod`. `healthzBindAddress` and
//!   `metricsBindAddress` need a restart (a change is logged).
//! - [`report_status`] writes [`NodeProxyConfigStatus`] by server-side apply on the `status`
//!   subresource (field manager [`PROXIER_FIELD_MANAGER`], forced), whenever the engine's
//!   report or the `/livez` verdict changes: `Pending` when a live change starts, then
//!   `Applied` after the first sync with it (at start, directly `Applied`), or `Failed`.

use crate::dataplane::sysctl;
use crate::plan::IPVS_SCHEDULERS;
use crate::serve::health::ProxyHealth;
use crate::source::kube::is_not_found;
use futures::StreamExt;
use futures::future::BoxFuture;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_crds::nodeproxyconfig::{NodeProxyConfig, NodeProxyConfigStatus, PROXIER_FIELD_MANAGER};
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;

/// The configuration the node's NodeProxyConfig assigns.
#[derive(Clone, Debug, PartialEq)]
pub enum Assigned {
    /// Not known yet (the NodeProxyConfigs are not listed): the engine does not program.
    Unknown,
    /// No NodeProxyConfig for this node (or no CRD): the local configuration.
    Local,
    /// The NodeProxyConfig's `spec.revision` and `spec.config`.
    Revision {
        /// `spec.revision`, echoed in `status.observedRevision`.
        revision: String,
        /// `spec.config`.
        config: Box<ProxierConfiguration>,
    },
}

/// Address of the probe virtual server [`Kernel::check`] adds and deletes to test a scheduler:
/// `198.51.100.0:20000/TCP` (TEST-NET-2, as kube-proxy's `CanUseIPVSProxier`).
pub const PROBE_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 0));

/// Port of the probe virtual server (see [`PROBE_ADDRESS`]).
pub const PROBE_PORT: u16 = 20000;

/// The node-wide kernel settings of a configuration: what is checked before a revision is
/// accepted and what is set outside the IPVS table.
pub trait KernelSettings: Send + Sync {
    /// Whether `config` can run here: its scheduler is available.
    ///
    /// Errors: a message saying why not (it becomes the Failed status's message).
    fn check<'a>(&'a self, config: &'a ProxierConfiguration) -> BoxFuture<'a, Result<(), String>>;

    /// Set `config`'s IPVS timeouts and strictARP sysctls, logging each.
    ///
    /// Errors: a message naming the setting that could not be made (the ones before it stay
    /// set).
    fn apply<'a>(&'a self, config: &'a ProxierConfiguration) -> BoxFuture<'a, Result<(), String>>;
}

/// [`KernelSettings`] of the in-memory dataplane: a scheduler is available when it is one of
/// [`IPVS_SCHEDULERS`]; nothing is set.
#[derive(Clone, Copy, Debug, Default)]
pub struct FakeKernel;

impl KernelSettings for FakeKernel {
    fn check<'a>(&'a self, config: &'a ProxierConfiguration) -> BoxFuture<'a, Result<(), String>> {
        let scheduler = config.ipvs.effective_scheduler();
        let known = IPVS_SCHEDULERS.contains(&scheduler);
        Box::pin(async move {
            known
                .then_some(())
                .ok_or_else(|| format!("IPVS scheduler {scheduler:?} is not available"))
        })
    }

    fn apply<'a>(&'a self, _: &'a ProxierConfiguration) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// [`KernelSettings`] of the kernel: the scheduler is probed by adding and deleting a virtual
/// server at [`PROBE_ADDRESS`]:[`PROBE_PORT`]; sysctls are written under `proc_sys`.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The IPVS generic-netlink handle.
    pub ipvs: ipvs::Handle,
    /// Root of the sysctls (`/proc/sys`).
    pub proc_sys: PathBuf,
}

impl KernelSettings for Kernel {
    fn check<'a>(&'a self, config: &'a ProxierConfiguration) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let scheduler = config.ipvs.effective_scheduler();
            let id = ipvs::ServiceId::Inet {
                address: PROBE_ADDRESS,
                port: PROBE_PORT,
                protocol: ipvs::Protocol::Tcp,
            };
            // A probe left over by an interrupted check would make the add fail.
            let _ = self.ipvs.delete_service(&id).await;
            self.ipvs
                .add_service(&ipvs::Service::new(id, scheduler))
                .await
                .map_err(|e| format!("IPVS scheduler {scheduler:?} is not available: {e}"))?;
            if let Err(e) = self.ipvs.delete_service(&id).await {
                tracing::warn!("cannot delete the scheduler probe virtual server: {e}");
            }
            Ok(())
        })
    }

    fn apply<'a>(&'a self, config: &'a ProxierConfiguration) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let osrelease =
                std::fs::read_to_string(self.proc_sys.join("kernel/osrelease")).unwrap_or_default();
            let wanted = sysctl::required(
                sysctl::parse_kernel_version(&osrelease),
                config.ipvs.strict_arp,
            );
            let applied = sysctl::ensure(&self.proc_sys, wanted)
                .map_err(|e| format!("cannot set sysctls: {e}"))?;
            for a in applied {
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
                self.ipvs
                    .set_timeouts(&timeouts)
                    .await
                    .map_err(|e| format!("cannot set IPVS timeouts: {e}"))?;
            }
            Ok(())
        })
    }
}

/// Watch the NodeProxyConfig named `node` forever, publishing what it assigns on `assigned`
/// (only when that changes). A 404 (the CRD is not installed) is logged once and counts as
/// [`Assigned::Local`]; the watch keeps retrying with kube-runtime's default backoff and
/// picks the CRD up when it appears. Other errors keep the last assignment.
pub async fn watch_assigned(client: Client, node: String, assigned: watch::Sender<Assigned>) {
    let api = Api::<NodeProxyConfig>::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut listing = None;
    let mut missing = false;
    let publish = |next: Assigned| {
        assigned.send_if_modified(|current| {
            let changed = *current != next;
            *current = next;
            changed
        });
    };
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listing = None,
            Ok(Event::InitApply(object)) => listing = Some(object),
            Ok(Event::InitDone) => {
                if missing {
                    tracing::info!("the NodeProxyConfig CRD is installed now");
                    missing = false;
                }
                publish(listing.take().map_or(Assigned::Local, spec_of));
            }
            Ok(Event::Apply(object)) => publish(spec_of(object)),
            Ok(Event::Delete(_)) => publish(Assigned::Local),
            Err(e) if is_not_found(&e) => {
                if !missing {
                    tracing::warn!(
                        "nodeproxyconfigs.kipvs.io is not served (the CRD is not installed): \
                         running on the local configuration and retrying"
                    );
                    missing = true;
                }
                publish(Assigned::Local);
            }
            Err(e) => tracing::warn!(
                "NodeProxyConfig watch failed, keeping the configuration in force and \
                 retrying: {e}"
            ),
        }
    }
}

/// What the NodeProxyConfigs of a manifests snapshot assign to `node`: the one named after it,
/// else the local configuration.
pub fn assigned_from(configs: &[NodeProxyConfig], node: &str) -> Assigned {
    configs
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(node))
        .map_or(Assigned::Local, |c| spec_of(c.clone()))
}

/// What a NodeProxyConfig assigns.
fn spec_of(object: NodeProxyConfig) -> Assigned {
    Assigned::Revision {
        revision: object.spec.revision,
        config: Box::new(object.spec.config),
    }
}

/// How soon a failed status write is retried.
pub const STATUS_RETRY: Duration = Duration::from_secs(2);

/// Write the status of the NodeProxyConfig named `node` forever: the engine's `report` (`None`:
/// nothing to report, e.g. no NodeProxyConfig) with `healthy` set to `health`'s `/livez`
/// verdict, by server-side apply on the status subresource, whenever it differs from the last
/// one written. A failed write is logged and retried after [`STATUS_RETRY`].
pub async fn report_status(
    client: Client,
    node: String,
    mut report: watch::Receiver<Option<NodeProxyConfigStatus>>,
    health: ProxyHealth,
) {
    let api = Api::<NodeProxyConfig>::all(client);
    let params = PatchParams::apply(PROXIER_FIELD_MANAGER).force();
    let mut health_changed = health.subscribe();
    let mut written: Option<NodeProxyConfigStatus> = None;
    loop {
        let status = report.borrow_and_update().clone().map(|mut status| {
            status.healthy = Some(health.live());
            status
        });
        if let Some(status) = status.filter(|s| written.as_ref() != Some(s)) {
            let patch = Patch::Apply(status.apply_patch(&node));
            match api.patch_status(&node, &params, &patch).await {
                Ok(_) => written = Some(status),
                Err(e) => {
                    tracing::warn!("cannot write the NodeProxyConfig status, will retry: {e}");
                    tokio::time::sleep(STATUS_RETRY).await;
                    continue;
                }
            }
        }
        tokio::select! {
            changed = report.changed() => if changed.is_err() { return },
            _ = health_changed.changed() => {}
            _ = sleep_until(health.stale_at()) => {}
        }
    }
}

/// Sleep until `at`, or forever.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
