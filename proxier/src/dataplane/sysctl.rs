//! The kernel settings kube-proxy's IPVS mode makes at start (`NewProxier`, `EnsureSysctl`),
//! computed purely by [`required`] and written by [`ensure`] only where they differ.

use std::io;
use std::path::{Path, PathBuf};

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
