//! The node-wide kernel settings of a configuration ([`KernelSettings`]): what is checked before
//! a configuration is put in force (the scheduler is available) and what is set outside the
//! IPVS table (IPVS timeouts, [`sysctl`]s).

use super::sysctl;
use crate::model::IPVS_SCHEDULERS;
use futures::future::BoxFuture;
use kipvs_crds::config::{ConfigError, ProxierConfiguration};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// Address of the probe virtual server [`Kernel::check`] adds and deletes to test a scheduler:
/// `198.51.100.0:20000/TCP` (TEST-NET-2, as kube-proxy's `CanUseIPVSProxier`).
pub const PROBE_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 0));

/// Port of the probe virtual server (see [`PROBE_ADDRESS`]); when it holds a virtual server
/// that is not a probe, the next ones are tried, up to [`PROBE_PORTS`] in all.
pub const PROBE_PORT: u16 = 20000;

/// How many ports from [`PROBE_PORT`] the probe may use.
pub const PROBE_PORTS: u16 = 16;

/// The persistence timeout that marks a probe virtual server (seconds; no Service gets it:
/// session affinity timeouts are at most 86,400 s), so that a probe left by an interrupted
/// check is recognised and removed, and no other virtual server is ever touched.
pub const PROBE_MARK_TIMEOUT: u32 = 1_000_000;

/// The node-wide kernel settings of a configuration: what is checked before a revision is
/// accepted and what is set outside the IPVS table.
pub trait KernelSettings: Send + Sync {
    /// Whether `config` can run here: its scheduler is available.
    ///
    /// # Errors
    /// Why the scheduler cannot be used; its message becomes the Failed status's message.
    fn check<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SchedulerError>>;

    /// Set `config`'s IPVS timeouts and strictARP sysctls, logging each, and the conntrack
    /// settings of its `conntrack` section where the kernel's differ (the hash size: where it is
    /// lower; logged; one that cannot be written is a warning, never an error).
    ///
    /// # Errors
    /// The setting that could not be made (the ones before it stay set).
    fn apply<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SettingsError>>;
}

/// Why an IPVS scheduler cannot be used on this node.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The kernel refused a virtual server with it (its `ip_vs_<name>` module is missing).
    #[error("IPVS scheduler {scheduler:?} is not available: {error}")]
    Refused {
        /// The scheduler's name.
        scheduler: String,
        /// The kernel's answer (part of the message, so not also a `source()`).
        error: ipvs::Error,
    },
    /// Every probe port holds a virtual server of someone else: nothing was probed.
    #[error(
        "cannot probe IPVS scheduler {scheduler:?}: {PROBE_ADDRESS} ports {PROBE_PORT}-{} hold \
         virtual servers of others",
        PROBE_PORT + PROBE_PORTS - 1
    )]
    ProbePortsTaken {
        /// The scheduler's name.
        scheduler: String,
    },
    /// Not one of the schedulers IPVS has ([`IPVS_SCHEDULERS`]; the in-memory dataplane).
    #[error("IPVS scheduler {scheduler:?} is not available")]
    Unknown {
        /// The name asked for.
        scheduler: String,
    },
    /// A scheduler the in-memory dataplane's kernel is set to lack
    /// ([`crate::dataplane::fake::FakeModules`]).
    #[error("IPVS scheduler {scheduler:?} is not available: the kernel lacks ip_vs_{scheduler}")]
    Missing {
        /// The scheduler's name.
        scheduler: String,
    },
}

/// Which node-wide kernel setting of a configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A sysctl could not be read or written.
    #[error("cannot set sysctls: {0}")]
    Sysctl(std::io::Error),
    /// The configuration's IPVS timeouts do not fit the kernel's (seconds, 32 bits).
    #[error("cannot set IPVS timeouts: {0}")]
    TimeoutsOutOfRange(ConfigError),
    /// The kernel refused the IPVS timeouts.
    #[error("cannot set IPVS timeouts: {0}")]
    Timeouts(ipvs::Error),
}

/// [`KernelSettings`] of the in-memory dataplane: a scheduler is available when it is one of
/// [`IPVS_SCHEDULERS`]; nothing is set.
#[derive(Clone, Copy, Debug, Default)]
pub struct FakeKernel;

impl KernelSettings for FakeKernel {
    fn check<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        let scheduler = config.ipvs.effective_scheduler();
        let known = IPVS_SCHEDULERS.contains(&scheduler);
        Box::pin(async move {
            known.then_some(()).ok_or_else(|| SchedulerError::Unknown {
                scheduler: scheduler.to_owned(),
            })
        })
    }

    fn apply<'a>(
        &'a self,
        _: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SettingsError>> {
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
    fn check<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(probe_scheduler(
            &self.ipvs,
            config.ipvs.effective_scheduler(),
        ))
    }

    fn apply<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SettingsError>> {
        Box::pin(async move {
            let osrelease =
                std::fs::read_to_string(self.proc_sys.join("kernel/osrelease")).unwrap_or_default();
            let wanted = sysctl::required(
                sysctl::parse_kernel_version(&osrelease),
                config.ipvs.strict_arp,
            );
            let applied = sysctl::ensure(&self.proc_sys, wanted).map_err(SettingsError::Sysctl)?;
            for a in applied {
                tracing::info!(
                    sysctl = a.sysctl.path,
                    value = a.sysctl.value,
                    previous = a.previous.as_deref().unwrap_or("?"),
                    "sysctl: {}",
                    a.sysctl.reason
                );
            }
            raise_conntrack(&self.proc_sys, Path::new("/sys"), config);
            let secs = config
                .ipvs
                .timeout_seconds()
                .map_err(SettingsError::TimeoutsOutOfRange)?;
            let timeouts = ipvs::Timeouts {
                tcp: secs.tcp,
                tcp_fin: secs.tcp_fin,
                udp: secs.udp,
            };
            if timeouts.tcp > 0 || timeouts.tcp_fin > 0 || timeouts.udp > 0 {
                self.ipvs
                    .set_timeouts(&timeouts)
                    .await
                    .map_err(SettingsError::Timeouts)?;
            }
            Ok(())
        })
    }
}

/// Sets the conntrack settings of `config` (read and written under `proc_sys` and `sys`) where
/// the kernel's differ (the hash size: where it is lower), as kube-proxy does
/// ([`sysctl::raise`]), logging each outcome: set (info), already so (debug), not writable
/// (warning; kube-proxy too goes on without them).
fn raise_conntrack(proc_sys: &Path, sys: &Path, config: &ProxierConfiguration) {
    let cpus = cpu_count();
    for (raise, outcome) in sysctl::raise(proc_sys, sys, sysctl::conntrack(&config.conntrack, cpus))
    {
        let path = raise.knob.path(proc_sys, sys);
        let path = path.display();
        match outcome {
            sysctl::Raised::Raised { from } => tracing::info!(
                path = %path,
                value = raise.value,
                previous = from.map_or_else(|| "?".to_owned(), |v| v.to_string()),
                cpus,
                "conntrack: set for {}",
                raise.field
            ),
            sysctl::Raised::AtLeast { current } => tracing::debug!(
                path = %path,
                value = raise.value,
                current,
                "conntrack: already what {} asks",
                raise.field
            ),
            sysctl::Raised::Failed { error } => tracing::warn!(
                path = %path,
                value = raise.value,
                "conntrack: cannot apply {} ({error}); programming goes on with the kernel's value",
                raise.field
            ),
        }
    }
}

/// The CPUs this process may run on (`sched_getaffinity`, as Go's `runtime.NumCPU` that
/// kube-proxy's `getConntrackMax` multiplies by); 1 if it cannot be read.
fn cpu_count() -> u32 {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a live cpu_set_t of `size` bytes that the kernel fills.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return 1;
    }
    // SAFETY: `set` was filled by the kernel.
    let count = unsafe { libc::CPU_COUNT(&set) };
    u32::try_from(count).unwrap_or(1).max(1)
}

/// The virtual-server operations the scheduler probe needs ([`probe_scheduler`]).
pub trait ProbeTable: Sync {
    /// Adds `service` (`EEXIST`: [`ipvs::Error::Exists`]).
    fn add(&self, service: &ipvs::Service) -> impl Future<Output = Result<(), ipvs::Error>> + Send;
    /// Reads the virtual server `id`.
    fn get(
        &self,
        id: &ipvs::ServiceId,
    ) -> impl Future<Output = Result<ipvs::Service, ipvs::Error>> + Send;
    /// Deletes the virtual server `id`.
    fn delete(&self, id: &ipvs::ServiceId) -> impl Future<Output = Result<(), ipvs::Error>> + Send;
}

impl ProbeTable for ipvs::Handle {
    async fn add(&self, service: &ipvs::Service) -> Result<(), ipvs::Error> {
        self.add_service(service).await
    }

    async fn get(&self, id: &ipvs::ServiceId) -> Result<ipvs::Service, ipvs::Error> {
        self.service(id).await
    }

    async fn delete(&self, id: &ipvs::ServiceId) -> Result<(), ipvs::Error> {
        self.delete_service(id).await
    }
}

/// Whether the kernel has the IPVS scheduler `scheduler`: a probe virtual server at
/// [`PROBE_ADDRESS`] is added with it and deleted (kube-proxy's `CanUseIPVSProxier`). Used for
/// `ipvs.scheduler` ([`Kernel::check`]) and for the `kipvs.io/scheduler` annotation of a Service
/// ([`crate::dataplane::Dataplane::check_scheduler`]).
///
/// Only what the probe created is deleted: the probe carries [`PROBE_MARK_TIMEOUT`] as its
/// persistence timeout. When its port holds a virtual server already (`EEXIST`), one marked so
/// (left by an interrupted check) is deleted, anything else is left alone, and the next port
/// is tried.
///
/// # Errors
/// [`SchedulerError::Refused`] with the kernel's answer, or
/// [`SchedulerError::ProbePortsTaken`] when every probe port holds another virtual server.
pub async fn probe_scheduler(
    ipvs: &impl ProbeTable,
    scheduler: &str,
) -> Result<(), SchedulerError> {
    for port in PROBE_PORT..PROBE_PORT + PROBE_PORTS {
        let id = ipvs::ServiceId::Inet {
            address: PROBE_ADDRESS,
            port,
            protocol: ipvs::Protocol::Tcp,
        };
        let mut probe = ipvs::Service::new(id, scheduler);
        probe.flags = ipvs::ServiceFlags::PERSISTENT;
        probe.timeout = PROBE_MARK_TIMEOUT;
        match ipvs.add(&probe).await {
            Ok(()) => {
                if let Err(e) = ipvs.delete(&id).await {
                    tracing::warn!("cannot delete the scheduler probe virtual server {id}: {e}");
                }
                return Ok(());
            }
            Err(ipvs::Error::Exists) => {
                if let Ok(found) = ipvs.get(&id).await
                    && is_probe(&found)
                {
                    let _ = ipvs.delete(&id).await;
                }
            }
            Err(error) => {
                return Err(SchedulerError::Refused {
                    scheduler: scheduler.to_owned(),
                    error,
                });
            }
        }
    }
    Err(SchedulerError::ProbePortsTaken {
        scheduler: scheduler.to_owned(),
    })
}

/// Whether `service` is a probe of [`probe_scheduler`] (by its mark).
fn is_probe(service: &ipvs::Service) -> bool {
    service.flags.0 & ipvs::ServiceFlags::PERSISTENT.0 != 0 && service.timeout == PROBE_MARK_TIMEOUT
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A kernel's virtual servers, with the schedulers it has.
    struct Table {
        services: Mutex<HashMap<ipvs::ServiceId, ipvs::Service>>,
        schedulers: &'static [&'static str],
    }

    impl ProbeTable for Table {
        async fn add(&self, service: &ipvs::Service) -> Result<(), ipvs::Error> {
            if !self.schedulers.contains(&service.scheduler.as_str()) {
                return Err(ipvs::Error::NotFound);
            }
            let mut services = self.services.lock().unwrap();
            if services.contains_key(&service.id) {
                return Err(ipvs::Error::Exists);
            }
            services.insert(service.id, service.clone());
            Ok(())
        }

        async fn get(&self, id: &ipvs::ServiceId) -> Result<ipvs::Service, ipvs::Error> {
            let services = self.services.lock().unwrap();
            services.get(id).cloned().ok_or(ipvs::Error::NoSuchService)
        }

        async fn delete(&self, id: &ipvs::ServiceId) -> Result<(), ipvs::Error> {
            let mut services = self.services.lock().unwrap();
            services
                .remove(id)
                .map(drop)
                .ok_or(ipvs::Error::NoSuchService)
        }
    }

    fn at(port: u16) -> ipvs::ServiceId {
        ipvs::ServiceId::Inet {
            address: PROBE_ADDRESS,
            port,
            protocol: ipvs::Protocol::Tcp,
        }
    }

    /// Issue 23: the probe deleted whatever virtual server was at 198.51.100.0:20000 before
    /// adding its own. A user's virtual server there is left alone (the next port is used);
    /// a probe left by an interrupted check is removed; nothing of the probe stays.
    #[tokio::test]
    async fn the_probe_deletes_only_what_it_created() {
        let users = ipvs::Service::new(at(PROBE_PORT), "wrr");
        let mut left_over = ipvs::Service::new(at(PROBE_PORT + 1), "rr");
        left_over.flags = ipvs::ServiceFlags::PERSISTENT;
        left_over.timeout = PROBE_MARK_TIMEOUT;
        let table = Table {
            services: Mutex::new(HashMap::from([
                (users.id, users.clone()),
                (left_over.id, left_over),
            ])),
            schedulers: &["rr", "wrr", "mh"],
        };
        probe_scheduler(&table, "mh").await.unwrap();
        let left = table.services.lock().unwrap().clone();
        assert_eq!(left, HashMap::from([(users.id, users.clone())]));

        let error = probe_scheduler(&table, "twos")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("IPVS scheduler \"twos\" is not available: not found (ENOENT)"),
            "{error}"
        );
        assert_eq!(*table.services.lock().unwrap(), left);

        // Every probe port taken by others: an error, and nothing touched.
        let taken: HashMap<_, _> = (PROBE_PORT..PROBE_PORT + PROBE_PORTS)
            .map(|port| (at(port), ipvs::Service::new(at(port), "rr")))
            .collect();
        *table.services.lock().unwrap() = taken.clone();
        let error = probe_scheduler(&table, "rr").await.unwrap_err().to_string();
        assert_eq!(
            error,
            "cannot probe IPVS scheduler \"rr\": 198.51.100.0 ports 20000-20015 hold virtual \
             servers of others"
        );
        assert_eq!(*table.services.lock().unwrap(), taken);
    }
}
