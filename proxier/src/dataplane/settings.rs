//! The node-wide kernel settings of a configuration ([`KernelSettings`]): what is checked before
//! a configuration is put in force (the scheduler is available) and what is set outside the
//! IPVS table (IPVS timeouts, [`sysctl`]s).

use super::sysctl;
use crate::model::IPVS_SCHEDULERS;
use futures::future::BoxFuture;
use kipvs_crds::config::ProxierConfiguration;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

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
        Box::pin(probe_scheduler(
            &self.ipvs,
            config.ipvs.effective_scheduler(),
        ))
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
            let secs = config
                .ipvs
                .timeout_seconds()
                .map_err(|e| format!("cannot set IPVS timeouts: {e}"))?;
            let timeouts = ipvs::Timeouts {
                tcp: secs.tcp,
                tcp_fin: secs.tcp_fin,
                udp: secs.udp,
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

/// Whether the kernel has the IPVS scheduler `scheduler`: a virtual server at
/// [`PROBE_ADDRESS`]:[`PROBE_PORT`] is added with it and deleted (kube-proxy's
/// `CanUseIPVSProxier`). Used for `ipvs.scheduler` ([`Kernel::check`]) and for the
/// `kipvs.io/scheduler` annotation of a Service ([`crate::dataplane::Dataplane::check_scheduler`]).
///
/// Errors: a message naming the scheduler and the kernel's answer.
pub async fn probe_scheduler(ipvs: &ipvs::Handle, scheduler: &str) -> Result<(), String> {
    let id = ipvs::ServiceId::Inet {
        address: PROBE_ADDRESS,
        port: PROBE_PORT,
        protocol: ipvs::Protocol::Tcp,
    };
    // A probe left over by an interrupted check would make the add fail.
    let _ = ipvs.delete_service(&id).await;
    ipvs.add_service(&ipvs::Service::new(id, scheduler))
        .await
        .map_err(|e| format!("IPVS scheduler {scheduler:?} is not available: {e}"))?;
    if let Err(e) = ipvs.delete_service(&id).await {
        tracing::warn!("cannot delete the scheduler probe virtual server: {e}");
    }
    Ok(())
}
