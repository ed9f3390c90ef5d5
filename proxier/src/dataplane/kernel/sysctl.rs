//! The kernel settings kube-proxy's IPVS mode makes at start (`NewProxier`, `EnsureSysctl`),
//! computed purely by [`required`] and written by [`ensure`] only where they differ; and the
//! conntrack table size and timeouts kube-proxy sets (`conntrack` section), computed by
//! [`conntrack`] and written by [`raise`] only where they raise the kernel's value.

use kipvs_crds::ConntrackConfiguration;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One sysctl kipvs needs, with the reason it is needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sysctl {
    /// Path below `/proc/sys`, e.g. `net/ipv4/vs/conntrack`.
    pub path: &'static str,
    /// The value to write.
    pub value: &'static str,
    /// Why (upstream issue or rule), for the start-up log.
    pub reason: &'static str,
}

/// A Linux kernel version `major.minor` (from `/proc/sys/kernel/osrelease`).
pub type KernelVersion = (u32, u32);

/// Parse `6.1.0-28-cloud-amd64` into `(6, 1)`; `None` when unparsable.
pub fn parse_kernel_version(osrelease: &str) -> Option<KernelVersion> {
    let mut parts = osrelease.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The sysctls for this kernel and `ipvs.strictARP` (kube-proxy `proxier.go` `NewProxier`):
///
/// - `net/ipv4/vs/conntrack=1`: IPVS connections get conntrack entries (needed for NAT).
/// - `net/ipv4/vs/conn_reuse_mode=0` only on 4.1 ≤ kernel < 5.9 (kubernetes#93297; 5.9 fixed
///   the 1 s SYN-drop stall, so newer kernels keep the default 1 and weight-0 servers really
///   receive no reused connections).
/// - `net/ipv4/vs/expire_nodest_conn=1`: packets of a deleted real server's connections are
///   dropped and the entry expired at once instead of black-holing (kubernetes#71834).
/// - `net/ipv4/vs/expire_quiescent_template=1`: persistence templates stop pinning clients to
///   weight-0 servers (kubernetes#71809).
/// - `net/ipv4/ip_forward=1`.
/// - with strictARP: `net/ipv4/conf/all/arp_ignore=1` and `arp_announce=2`, so the node does
///   not answer ARP for addresses on `kube-ipvs0` (MetalLB L2, kubernetes PR #70530).
pub fn required(kernel: Option<KernelVersion>, strict_arp: bool) -> Vec<Sysctl> {
    let mut out = vec![Sysctl {
        path: "net/ipv4/vs/conntrack",
        value: "1",
        reason: "NAT through IPVS needs conntrack entries",
    }];
    if kernel.is_some_and(|k| ((4, 1)..(5, 9)).contains(&k)) {
        out.push(Sysctl {
            path: "net/ipv4/vs/conn_reuse_mode",
            value: "0",
            reason: "kernel < 5.9 stalls reused source ports for 1s (kubernetes#93297)",
        });
    }
    out.extend([
        Sysctl {
            path: "net/ipv4/vs/expire_nodest_conn",
            value: "1",
            reason: "expire connections of deleted real servers (kubernetes#71834)",
        },
        Sysctl {
            path: "net/ipv4/vs/expire_quiescent_template",
            value: "1",
            reason: "do not pin persistent clients to weight-0 real servers (kubernetes#71809)",
        },
        Sysctl {
            path: "net/ipv4/ip_forward",
            value: "1",
            reason: "forward traffic to real servers",
        },
    ]);
    if strict_arp {
        out.extend([
            Sysctl {
                path: "net/ipv4/conf/all/arp_ignore",
                value: "1",
                reason: "ipvs.strictARP: do not answer ARP for kube-ipvs0 addresses",
            },
            Sysctl {
                path: "net/ipv4/conf/all/arp_announce",
                value: "2",
                reason: "ipvs.strictARP: announce only addresses of the outgoing interface",
            },
        ]);
    }
    out
}

/// The outcome of [`ensure`] for one sysctl.
#[derive(Debug)]
pub struct Applied {
    /// The sysctl.
    pub sysctl: Sysctl,
    /// Its value before, if it could be read.
    pub previous: Option<String>,
}

/// Write each sysctl under `root` (normally `/proc/sys`) whose current value differs.
///
/// Errors: the first write that fails, with the path in the message.
pub fn ensure(root: &Path, sysctls: Vec<Sysctl>) -> io::Result<Vec<Applied>> {
    sysctls
        .into_iter()
        .map(|sysctl| {
            let path: PathBuf = root.join(sysctl.path);
            let previous = std::fs::read_to_string(&path)
                .ok()
                .map(|v| v.trim().to_owned());
            if previous.as_deref() != Some(sysctl.value) {
                std::fs::write(&path, sysctl.value).map_err(|e| {
                    io::Error::new(e.kind(), format!("writing {}: {e}", path.display()))
                })?;
            }
            Ok(Applied { sysctl, previous })
        })
        .collect()
}

/// Where a conntrack setting is written: a sysctl below `/proc/sys`, or the hash table size
/// below `/sys`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// A path below `/proc/sys`, e.g. `net/netfilter/nf_conntrack_max`.
    Sysctl(&'static str),
    /// `/sys/module/nf_conntrack/parameters/hashsize` (writable from the initial network
    /// namespace only).
    Hashsize,
}

impl Knob {
    /// The file under `proc_sys` (`/proc/sys`) or `sys` (`/sys`).
    pub fn path(self, proc_sys: &Path, sys: &Path) -> PathBuf {
        match self {
            Knob::Sysctl(path) => proc_sys.join(path),
            Knob::Hashsize => sys.join(HASHSIZE),
        }
    }
}

/// `nf_conntrack`'s hash table size, below `/sys`.
const HASHSIZE: &str = "module/nf_conntrack/parameters/hashsize";

/// A conntrack value kipvs sets where the kernel's differs (the hash size: where it is lower).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raise {
    /// The sysctl or sysfs file.
    pub knob: Knob,
    /// The least value wanted.
    pub value: u64,
    /// The configuration field it comes from, for the log.
    pub field: &'static str,
}

/// The conntrack settings of `config` on a node with `cpus` CPUs, in the order kube-proxy
/// writes them (`cmd/kube-proxy/app/server.go` `Run`, `conntrack.go`):
///
/// - `nf_conntrack_max` = `maxPerCore` × `cpus`, at least `min`, then the hash table size
///   = a quarter of it (`SetMax`); nothing when `maxPerCore` is 0;
/// - `nf_conntrack_tcp_timeout_established` and `_close_wait` in seconds, when not zero;
/// - `nf_conntrack_tcp_be_liberal=1` with `tcpBeLiberal`, and `nf_conntrack_udp_timeout` /
///   `_udp_timeout_stream` when not zero (the fields of later kube-proxy releases).
pub fn conntrack(config: &ConntrackConfiguration, cpus: u32) -> Vec<Raise> {
    let mut out = Vec::new();
    if let Some(max) = config.max(cpus) {
        out.push(Raise {
            knob: Knob::Sysctl("net/netfilter/nf_conntrack_max"),
            value: max,
            field: "conntrack.maxPerCore",
        });
        out.push(Raise {
            knob: Knob::Hashsize,
            value: max / 4,
            field: "conntrack.maxPerCore",
        });
    }
    let timeouts = [
        (
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            config.tcp_established_timeout,
            "conntrack.tcpEstablishedTimeout",
        ),
        (
            "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
            config.tcp_close_wait_timeout,
            "conntrack.tcpCloseWaitTimeout",
        ),
    ];
    let later = [
        (
            "net/netfilter/nf_conntrack_udp_timeout",
            config.udp_timeout,
            "conntrack.udpTimeout",
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout_stream",
            config.udp_stream_timeout,
            "conntrack.udpStreamTimeout",
        ),
    ];
    let seconds = |(path, timeout, field): (&'static str, Duration, &'static str)| {
        (timeout.as_secs() > 0).then_some(Raise {
            knob: Knob::Sysctl(path),
            value: timeout.as_secs(),
            field,
        })
    };
    out.extend(timeouts.into_iter().filter_map(seconds));
    if config.tcp_be_liberal {
        out.push(Raise {
            knob: Knob::Sysctl("net/netfilter/nf_conntrack_tcp_be_liberal"),
            value: 1,
            field: "conntrack.tcpBeLiberal",
        });
    }
    out.extend(later.into_iter().filter_map(seconds));
    out
}

/// What [`raise`] did with one [`Raise`].
#[derive(Debug, PartialEq, Eq)]
pub enum Raised {
    /// Written: it was `from` (`None`: unreadable).
    Raised {
        /// The value before.
        from: Option<u64>,
    },
    /// Left alone: the kernel's value is the wanted one (the hash size: at least the wanted one).
    AtLeast {
        /// The kernel's value.
        current: u64,
    },
    /// Could not be written (a read-only `/proc/sys` or `/sys` in a container, a network
    /// namespace other than the initial one for the hash size, no `nf_conntrack` module):
    /// reported, never fatal (kube-proxy goes on when `/sys` is read-only).
    Failed {
        /// The error, with the path.
        error: String,
    },
}

/// Writes each of `raises` whose current value (read under `proc_sys` or `sys`) differs, as
/// kube-proxy's `setIntSysCtl` (`val != value`, `cmd/kube-proxy/app/conntrack.go`) does; the
/// hash size only when it is lower (`SetMax`: "Don't set hashsize if the current one is
/// larger"). A failure is returned for that setting and the next ones are still tried.
pub fn raise(proc_sys: &Path, sys: &Path, raises: Vec<Raise>) -> Vec<(Raise, Raised)> {
    raises
        .into_iter()
        .map(|raise| {
            let path = raise.knob.path(proc_sys, sys);
            let current = std::fs::read_to_string(&path)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok());
            let outcome = match current {
                Some(current)
                    if current == raise.value
                        || (raise.knob == Knob::Hashsize && current >= raise.value) =>
                {
                    Raised::AtLeast { current }
                }
                from => match std::fs::write(&path, raise.value.to_string()) {
                    Ok(()) => Raised::Raised { from },
                    Err(e) => Raised::Failed {
                        error: format!("writing {} to {}: {e}", raise.value, path.display()),
                    },
                },
            };
            (raise, outcome)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_parse() {
        assert_eq!(parse_kernel_version("6.1.0-28-cloud-amd64\n"), Some((6, 1)));
        assert_eq!(parse_kernel_version("5.4.17"), Some((5, 4)));
        assert_eq!(parse_kernel_version("garbage"), None);
    }

    #[test]
    fn conn_reuse_mode_only_on_old_kernels() {
        let has = |k| {
            required(Some(k), false)
                .iter()
                .any(|s| s.path.ends_with("conn_reuse_mode"))
        };
        assert!(has((5, 4)));
        assert!(has((4, 1)));
        assert!(!has((5, 9)));
        assert!(!has((6, 1)));
        assert!(!has((3, 10)));
    }

    #[test]
    fn strict_arp_adds_arp_sysctls() {
        let paths: Vec<_> = required(Some((6, 1)), true)
            .into_iter()
            .map(|s| s.path)
            .collect();
        assert!(paths.contains(&"net/ipv4/conf/all/arp_ignore"));
        assert!(paths.contains(&"net/ipv4/conf/all/arp_announce"));
        assert!(
            !required(Some((6, 1)), false)
                .iter()
                .any(|s| s.path.contains("arp"))
        );
    }

    /// Issue 34: kube-proxy's `conntrack` section was dropped. Its defaults on 8 CPUs give
    /// kube-proxy's settings; 0 leaves a setting alone.
    #[test]
    fn conntrack_settings_are_kube_proxys() {
        let defaults = ConntrackConfiguration::default();
        let wanted: Vec<(Knob, u64)> = conntrack(&defaults, 8)
            .into_iter()
            .map(|r| (r.knob, r.value))
            .collect();
        assert_eq!(
            wanted,
            [
                (Knob::Sysctl("net/netfilter/nf_conntrack_max"), 262_144),
                (Knob::Hashsize, 65_536),
                (
                    Knob::Sysctl("net/netfilter/nf_conntrack_tcp_timeout_established"),
                    86_400
                ),
                (
                    Knob::Sysctl("net/netfilter/nf_conntrack_tcp_timeout_close_wait"),
                    3600
                ),
            ]
        );
        // 2 CPUs: `min` wins.
        assert_eq!(conntrack(&defaults, 2)[0].value, 131_072);
        let off = ConntrackConfiguration {
            max_per_core: 0,
            tcp_established_timeout: Duration::ZERO,
            tcp_close_wait_timeout: Duration::ZERO,
            ..defaults.clone()
        };
        assert!(conntrack(&off, 64).is_empty());
        let later = ConntrackConfiguration {
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(60),
            udp_stream_timeout: Duration::from_secs(180),
            ..off
        };
        let wanted: Vec<(Knob, u64)> = conntrack(&later, 1)
            .into_iter()
            .map(|r| (r.knob, r.value))
            .collect();
        assert_eq!(
            wanted,
            [
                (Knob::Sysctl("net/netfilter/nf_conntrack_tcp_be_liberal"), 1),
                (Knob::Sysctl("net/netfilter/nf_conntrack_udp_timeout"), 60),
                (
                    Knob::Sysctl("net/netfilter/nf_conntrack_udp_timeout_stream"),
                    180
                ),
            ]
        );
    }

    /// kube-proxy's rule (`setIntSysCtl`, `SetMax`): a sysctl is written where it differs
    /// (the kernel's 5-day established timeout becomes 24 h), the hash size only where it is
    /// lower; one that cannot be written (read-only /proc/sys or /sys) is reported and the rest
    /// still goes.
    #[test]
    fn settings_are_written_where_they_differ_and_failures_reported() {
        let dir = std::env::temp_dir().join(format!("kipvs-conntrack-{}", std::process::id()));
        let (proc_sys, sys) = (dir.join("proc/sys"), dir.join("sys"));
        std::fs::create_dir_all(proc_sys.join("net/netfilter")).unwrap();
        std::fs::create_dir_all(sys.join("module/nf_conntrack/parameters")).unwrap();
        let netfilter = |name: &str| proc_sys.join("net/netfilter").join(name);
        std::fs::write(netfilter("nf_conntrack_max"), "65536\n").unwrap();
        std::fs::write(
            netfilter("nf_conntrack_tcp_timeout_established"),
            "432000\n",
        )
        .unwrap();
        // Unwritable: a directory where the file should be (as EACCES/EROFS would).
        std::fs::create_dir_all(netfilter("nf_conntrack_tcp_timeout_close_wait")).unwrap();
        std::fs::write(sys.join(HASHSIZE), "16384\n").unwrap();

        let outcomes = raise(
            &proc_sys,
            &sys,
            conntrack(&ConntrackConfiguration::default(), 8),
        );
        let outcomes: Vec<&Raised> = outcomes.iter().map(|(_, o)| o).collect();
        assert_eq!(outcomes[0], &Raised::Raised { from: Some(65_536) });
        assert_eq!(outcomes[1], &Raised::Raised { from: Some(16_384) });
        assert_eq!(
            outcomes[2],
            &Raised::Raised {
                from: Some(432_000)
            }
        );
        assert!(
            matches!(outcomes[3], Raised::Failed { error } if error.contains("close_wait")),
            "{:?}",
            outcomes[3]
        );
        let read = |path: PathBuf| std::fs::read_to_string(path).unwrap();
        assert_eq!(read(netfilter("nf_conntrack_max")), "262144");
        assert_eq!(read(sys.join(HASHSIZE)), "65536");
        assert_eq!(
            read(netfilter("nf_conntrack_tcp_timeout_established")),
            "86400",
            "the kernel's 5 days become kube-proxy's 24 h"
        );
        // A bigger maximum is set to kube-proxy's; a bigger hash table is left as it is.
        std::fs::write(netfilter("nf_conntrack_max"), "1048576").unwrap();
        let again = raise(
            &proc_sys,
            &sys,
            conntrack(&ConntrackConfiguration::default(), 8),
        );
        assert_eq!(
            again[0].1,
            Raised::Raised {
                from: Some(1_048_576)
            }
        );
        assert_eq!(again[1].1, Raised::AtLeast { current: 65_536 });
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ensure_writes_only_differences() {
        let dir = std::env::temp_dir().join(format!("kipvs-sysctl-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("net/ipv4/vs")).unwrap();
        std::fs::write(dir.join("net/ipv4/vs/conntrack"), "1\n").unwrap();
        std::fs::write(dir.join("net/ipv4/vs/expire_nodest_conn"), "0\n").unwrap();
        let list = vec![
            Sysctl {
                path: "net/ipv4/vs/conntrack",
                value: "1",
                reason: "",
            },
            Sysctl {
                path: "net/ipv4/vs/expire_nodest_conn",
                value: "1",
                reason: "",
            },
        ];
        let applied = ensure(&dir, list).unwrap();
        assert_eq!(applied[0].previous.as_deref(), Some("1"));
        assert_eq!(applied[1].previous.as_deref(), Some("0"));
        let now = std::fs::read_to_string(dir.join("net/ipv4/vs/expire_nodest_conn")).unwrap();
        assert_eq!(now, "1");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
