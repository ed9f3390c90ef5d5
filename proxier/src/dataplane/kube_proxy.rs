//! kube-proxy on this node, for a takeover and a handback: whether it runs (its process, its
//! `/healthz` JSON), whether it came back after a takeover (its `KUBE-SERVICES` chain or
//! `KUBE-CLUSTER-IP` set), whether it has synced (its metrics), what of its iptables rules and
//! ipsets is left ([`crate::plan::kube_proxy`] decides what goes), and removing that.
//!
//! The tools are the node's `iptables`/`ip6tables` of both backends
//! (`{ip,ip6}tables-{legacy,nft}-{save,restore}`) and `ipset`, from the proxier image as `nft`
//! is: the legacy backend has no library interface (`iptables-restore` is its transaction), and
//! `iptables-restore --noflush` removes exactly the named rules and chains, atomically per table.
//! A legacy ruleset is read only when its tables are loaded (`/proc/net/ip_tables_names`,
//! `ip6_tables_names`), so a node without them does not get the modules loaded by the reading.

use super::program::{Program, ProgramError};
use crate::plan::kube_proxy::{self, IptablesRemoval};
use futures::future::BoxFuture;
use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// kube-proxy's healthz address (`healthzBindAddress` default `0.0.0.0:10256`), probed on the
/// loopback.
pub const KUBE_PROXY_HEALTHZ: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 10256);

/// kube-proxy's metrics address (`metricsBindAddress` default `127.0.0.1:10249`).
pub const KUBE_PROXY_METRICS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 10249);

/// The metric kube-proxy sets at the end of each sync (`metrics.SyncProxyRulesLastTimestamp`,
/// `pkg/proxy/ipvs/proxier.go:1654` in 1.24, after `cleanLegacyService` adopted the table).
const KUBE_PROXY_SYNCED_METRIC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// How long one HTTP request to kube-proxy (healthz, metrics) may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one run of a tool in [`KubeProxyNode::back`] may take (it runs between syncs).
const BACK_TOOL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one iptables or ipset run may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// One ruleset's removal: which iptables backend and family, and what goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ruleset {
    /// `legacy` or `nft`.
    pub backend: &'static str,
    /// `iptables` (IPv4) or `ip6tables` (IPv6).
    pub family: &'static str,
    /// What of it is kube-proxy's.
    pub removal: IptablesRemoval,
}

/// What kube-proxy left on the node: its rules per ruleset, its ipsets, and the rulesets that
/// could not be read (why).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Rulesets with something of kube-proxy's in them (to remove, or kept for a policy).
    pub rulesets: Vec<Ruleset>,
    /// kube-proxy's ipsets (destroyed after the rules that match them).
    pub ipsets: Vec<String>,
    /// What could not be read, and why (a missing tool, a refused listing).
    pub unreadable: Vec<String>,
}

impl Leftovers {
    /// Whether nothing of kube-proxy's was found.
    pub fn is_empty(&self) -> bool {
        self.rulesets.iter().all(|r| r.removal.is_empty()) && self.ipsets.is_empty()
    }

    /// How many rules, chains and sets go.
    pub fn counts(&self) -> (usize, usize, usize) {
        let rules = self.rulesets.iter().map(|r| r.removal.rules.len()).sum();
        let chains = self.rulesets.iter().map(|r| r.removal.chains.len()).sum();
        (rules, chains, self.ipsets.len())
    }
}

impl fmt::Display for Leftovers {
    /// One line per removal: `iptables-legacy -D nat PREROUTING ...`, `... -X nat CHAIN`,
    /// `ipset destroy NAME`; then `unreadable: ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for ruleset in &self.rulesets {
            for line in ruleset.removal.to_string().lines() {
                writeln!(f, "{}-{} {line}", ruleset.family, ruleset.backend)?;
            }
        }
        for set in &self.ipsets {
            writeln!(f, "ipset destroy {set}")?;
        }
        for why in &self.unreadable {
            writeln!(f, "unreadable: {why}")?;
        }
        Ok(())
    }
}

/// kube-proxy on a node: the engine's view of it during a takeover.
pub trait KubeProxyNode: Send + Sync {
    /// Why kube-proxy is taken to run on the node (`None`: it does not): a process named
    /// `kube-proxy`, or kube-proxy's `/healthz` JSON answering on its port.
    fn running(&self) -> BoxFuture<'_, Option<String>>;
    /// Why kube-proxy is taken to be back on a node kipvs took over and cleared (`None`: it is
    /// not): it runs ([`running`](Self::running)), or its `KUBE-SERVICES` chain (nat, any
    /// backend and family) or its `KUBE-CLUSTER-IP` ipset, which its every sync writes, is
    /// there again.
    fn back(&self) -> BoxFuture<'_, Option<String>>;
    /// kube-proxy's health once it has synced the node (`Some(true)`: its `/healthz` answers
    /// 200), `None` before its first sync or when it does not answer.
    fn synced(&self) -> BoxFuture<'_, Option<bool>>;
    /// What kube-proxy left (rulesets that cannot be read are named in
    /// [`Leftovers::unreadable`]; an iptables backend that is not installed is not);
    /// `kubelet_chains`: whether kubelet creates the shared nat chains
    /// ([`kube_proxy::kubelet_creates_shared_chains`]).
    fn leftovers(&self, kubelet_chains: bool) -> BoxFuture<'_, Leftovers>;
    /// Remove `leftovers`: each ruleset's rules and chains (`iptables-restore -w 5 --noflush`),
    /// then the ipsets.
    ///
    /// # Errors
    /// A message per ruleset or set that could not be removed (the others are removed).
    fn remove<'a>(&'a self, leftovers: &'a Leftovers) -> BoxFuture<'a, Result<(), String>>;
}

/// kube-proxy on this host: `/proc` and the tools on `PATH`.
#[derive(Clone, Debug)]
pub struct HostKubeProxy {
    /// Where `/proc` is.
    pub proc: PathBuf,
    /// Where `/sys/module` is (a module loaded has a directory there).
    pub sys_module: PathBuf,
    /// kube-proxy's healthz address ([`KUBE_PROXY_HEALTHZ`]).
    pub healthz: SocketAddr,
    /// kube-proxy's metrics address ([`KUBE_PROXY_METRICS`]).
    pub metrics: SocketAddr,
    /// Set while the proxier's own healthz server listens on `healthz`'s port: an answer there
    /// is then the proxier's own.
    pub own_healthz: Arc<AtomicBool>,
    /// The directory of the tools (`None`: found on `PATH`).
    pub tools: Option<PathBuf>,
}

impl Default for HostKubeProxy {
    fn default() -> Self {
        HostKubeProxy {
            proc: PathBuf::from("/proc"),
            sys_module: PathBuf::from("/sys/module"),
            healthz: KUBE_PROXY_HEALTHZ,
            metrics: KUBE_PROXY_METRICS,
            own_healthz: Arc::default(),
            tools: None,
        }
    }
}

/// The backends and families read, with the `/proc/net` file that says a legacy ruleset is
/// loaded.
const RULESETS: [(&str, &str, &str); 4] = [
    ("legacy", "iptables", "ip_tables_names"),
    ("legacy", "ip6tables", "ip6_tables_names"),
    ("nft", "iptables", ""),
    ("nft", "ip6tables", ""),
];

impl HostKubeProxy {
    /// The tool `name`, in [`HostKubeProxy::tools`] or on `PATH`.
    fn tool(&self, name: &str) -> Program {
        let name = match &self.tools {
            Some(dir) => dir.join(name).to_string_lossy().into_owned(),
            None => name.to_owned(),
        };
        Program {
            name,
            timeout: TOOL_TIMEOUT,
        }
    }

    /// The pids of processes named `kube-proxy` (visible when the proxier shares the host's PID
    /// namespace).
    fn processes(&self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir(&self.proc) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(self.proc.join(pid.to_string()).join("comm"))
                    .is_ok_and(|comm| comm.trim() == "kube-proxy")
            })
            .collect()
    }

    /// kube-proxy's `/healthz` verdict (`Some(true)`: 200), when kube-proxy answers there: a
    /// body with its `lastUpdated` and `currentTime` (`pkg/proxy/healthcheck/proxier_health.go`
    /// `healthzHandler`); anything else answering on the port (another proxy's healthz) is not
    /// kube-proxy. `None` too while the proxier's own server holds the port.
    async fn healthz(&self) -> Option<bool> {
        if self.own_healthz.load(Ordering::Relaxed) {
            return None;
        }
        let (code, body) = http_get(self.healthz, "/healthz").await?;
        let json: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
        let kube_proxy = json.get("lastUpdated").is_some() && json.get("currentTime").is_some();
        kube_proxy.then_some(code == 200)
    }

    /// Whether kube-proxy's `KUBE-SERVICES` chain is in a nat table (`-t nat` of each loaded
    /// backend and family) or its `KUBE-CLUSTER-IP` ipset exists: where.
    async fn kube_proxy_objects(&self) -> Option<String> {
        for (backend, family, loaded) in RULESETS {
            if !self.loaded(loaded) {
                continue;
            }
            let save = Program {
                timeout: BACK_TOOL_TIMEOUT,
                ..self.tool(&format!("{family}-{backend}-save"))
            };
            let Ok(text) = save.run(&["-t", "nat"], None).await else {
                continue;
            };
            if text.lines().any(|l| l.starts_with(":KUBE-SERVICES ")) {
                return Some(format!(
                    "its KUBE-SERVICES chain is in {family}-{backend} nat"
                ));
            }
        }
        // Without the ip_set module no set exists, and listing would load it.
        if !self.sys_module.join("ip_set").exists() {
            return None;
        }
        let ipset = Program {
            timeout: BACK_TOOL_TIMEOUT,
            ..self.tool("ipset")
        };
        let names = ipset.run(&["list", "-n"], None).await.unwrap_or_default();
        names
            .lines()
            .any(|l| l.trim() == "KUBE-CLUSTER-IP")
            .then(|| "its KUBE-CLUSTER-IP ipset exists".to_owned())
    }

    /// Whether the legacy tables named in `/proc/net/<loaded>` are loaded (`""`: the nft
    /// backend, always read).
    fn loaded(&self, loaded: &str) -> bool {
        loaded.is_empty()
            || std::fs::read_to_string(self.proc.join("net").join(loaded))
                .is_ok_and(|n| !n.trim().is_empty())
    }

    /// One ruleset's removal; `None` when that backend's tables are not loaded.
    async fn ruleset(
        &self,
        backend: &'static str,
        family: &'static str,
        loaded: &str,
        kubelet_chains: bool,
    ) -> Result<Option<Ruleset>, String> {
        if !self.loaded(loaded) {
            return Ok(None);
        }
        let save = self.tool(&format!("{family}-{backend}-save"));
        let text = match save.run(&[], None).await {
            Ok(text) => text,
            // No nft backend on the node: nothing of anyone's in it to read.
            Err(ProgramError::Exec { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && backend == "nft" =>
            {
                tracing::debug!("{}: not installed", save.name);
                return Ok(None);
            }
            Err(e) => return Err(e.to_string()),
        };
        let tables = kube_proxy::parse_save(&text).map_err(|e| format!("{}: {e}", save.name))?;
        Ok(Some(Ruleset {
            backend,
            family,
            removal: kube_proxy::iptables_removal(&tables, kubelet_chains),
        }))
    }
}

impl KubeProxyNode for HostKubeProxy {
    fn running(&self) -> BoxFuture<'_, Option<String>> {
        Box::pin(async move {
            let pids = self.processes();
            if !pids.is_empty() {
                return Some(format!("process kube-proxy (pid {pids:?})"));
            }
            self.healthz()
                .await
                .map(|_| format!("kube-proxy's /healthz answers on {}", self.healthz))
        })
    }

    fn back(&self) -> BoxFuture<'_, Option<String>> {
        Box::pin(async move {
            match self.running().await {
                Some(why) => Some(why),
                None => self.kube_proxy_objects().await,
            }
        })
    }

    fn synced(&self) -> BoxFuture<'_, Option<bool>> {
        Box::pin(async move {
            let (code, metrics) = http_get(self.metrics, "/metrics").await?;
            let synced = code == 200
                && metrics.lines().any(|line| {
                    line.strip_prefix(KUBE_PROXY_SYNCED_METRIC)
                        .and_then(|rest| rest.trim().parse::<f64>().ok())
                        .is_some_and(|at| at > 0.0)
                });
            if !synced {
                return None;
            }
            Some(self.healthz().await == Some(true))
        })
    }

    fn leftovers(&self, kubelet_chains: bool) -> BoxFuture<'_, Leftovers> {
        Box::pin(async move {
            let mut leftovers = Leftovers::default();
            let mut kept_sets = BTreeSet::new();
            for (backend, family, loaded) in RULESETS {
                match self.ruleset(backend, family, loaded, kubelet_chains).await {
                    Ok(Some(ruleset)) => {
                        let removal = &ruleset.removal;
                        kept_sets.extend(removal.kept_sets.iter().cloned());
                        if !removal.is_empty() || !removal.kept_for_policy.is_empty() {
                            leftovers.rulesets.push(ruleset)
                        }
                    }
                    Ok(None) => {}
                    Err(why) => leftovers.unreadable.push(why),
                }
            }
            match self.tool("ipset").run(&["list", "-n"], None).await {
                Ok(names) => leftovers.ipsets = kube_proxy::ipsets_to_destroy(&names, &kept_sets),
                // No ip_set module: no set of anyone's.
                Err(ProgramError::Failed { stderr, .. }) if stderr.contains("Kernel error") => {}
                Err(e) => leftovers.unreadable.push(e.to_string()),
            }
            leftovers
        })
    }

    fn remove<'a>(&'a self, leftovers: &'a Leftovers) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut errors = Vec::new();
            for ruleset in &leftovers.rulesets {
                let input = ruleset.removal.restore_input();
                if input.is_empty() {
                    continue;
                }
                let restore = self.tool(&format!("{}-{}-restore", ruleset.family, ruleset.backend));
                // -w: wait up to 5 s for the xtables lock (kubelet, Calico) rather than fail.
                let args = ["-w", "5", "--noflush"];
                if let Err(e) = restore.run(&args, Some(input.as_bytes())).await {
                    errors.push(e.to_string());
                }
            }
            for set in &leftovers.ipsets {
                if let Err(e) = self.tool("ipset").run(&["destroy", set], None).await {
                    errors.push(e.to_string());
                }
            }
            if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.join("; "))
            }
        })
    }
}

/// `GET path` on `addr` over HTTP/1.0 within [`HTTP_TIMEOUT`]: the status code and the body
/// (`None`: nothing answers, or not HTTP).
async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8_lossy(&response);
        let (head, body) = response.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_owned()))
    };
    tokio::time::timeout(HTTP_TIMEOUT, get).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP server on the loopback answering every request with `code` and `body`.
    fn answering(code: u16, body: &'static str) -> SocketAddr {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().map_while(Result::ok) {
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request);
                let _ = write!(
                    stream,
                    "HTTP/1.0 {code} X\r\nContent-Type: text/plain\r\n\r\n{body}"
                );
            }
        });
        addr
    }

    /// A process named kube-proxy in `/proc`, or kube-proxy's `/healthz` JSON on its port, is
    /// kube-proxy running; another server on the port is not, nor the proxier's own.
    #[tokio::test]
    async fn kube_proxy_runs_while_its_process_or_its_healthz_json_is_there() {
        let proc = std::env::temp_dir().join(format!("kipvs-kp-proc-{}", std::process::id()));
        std::fs::create_dir_all(proc.join("4242")).unwrap();
        std::fs::write(proc.join("4242/comm"), "kube-proxy\n").unwrap();
        std::fs::create_dir_all(proc.join("17")).unwrap();
        std::fs::write(proc.join("17/comm"), "kipvs-proxier\n").unwrap();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let node = HostKubeProxy {
            proc: proc.clone(),
            healthz: free_addr,
            metrics: free_addr,
            ..HostKubeProxy::default()
        };
        assert!(node.running().await.unwrap().contains("4242"));
        std::fs::remove_dir_all(proc.join("4242")).unwrap();
        assert_eq!(node.running().await, None);
        let kube_proxy = r#"{"lastUpdated": "2026-11-26 17:00:00.1 +0000 UTC","currentTime": "2026-11-26 17:00:00.1 +0000 UTC"}"#;
        let held = HostKubeProxy {
            healthz: answering(200, kube_proxy),
            ..node.clone()
        };
        assert!(held.running().await.unwrap().contains("/healthz"));
        held.own_healthz.store(true, Ordering::Relaxed);
        assert_eq!(held.running().await, None, "the proxier's own healthz");
        let other = HostKubeProxy {
            healthz: answering(200, r#"{"status": "ok"}"#),
            ..node.clone()
        };
        assert_eq!(other.running().await, None, "another proxy's healthz");
        // Synced: its metrics say a sync ended; healthy: its /healthz says 200.
        assert_eq!(held.synced().await, None, "no metrics");
        let starting = HostKubeProxy {
            metrics: answering(200, "kubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n"),
            own_healthz: Arc::default(),
            ..held.clone()
        };
        assert_eq!(starting.synced().await, None, "not synced yet");
        let synced = "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n\
            kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7645e+09\n";
        let metrics = answering(200, synced);
        let synced = HostKubeProxy {
            metrics,
            ..starting.clone()
        };
        assert_eq!(synced.synced().await, Some(true));
        let unhealthy = HostKubeProxy {
            healthz: answering(503, kube_proxy),
            ..synced.clone()
        };
        assert_eq!(unhealthy.synced().await, Some(false));
        std::fs::remove_dir_all(proc).unwrap();
    }

    /// The tools run as a takeover needs them: each loaded ruleset read with its backend's
    /// `-save` (a legacy one only when its tables are loaded), kube-proxy's rules removed with
    /// `-restore -w 5 --noflush` fed the removal, then its ipsets destroyed, in that order; a
    /// backend whose tool is not installed is not unreadable.
    #[tokio::test]
    async fn leftovers_are_read_and_removed_with_the_nodes_tools() {
        let dir = std::env::temp_dir().join(format!("kipvs-kp-tools-{}", std::process::id()));
        let (proc, tools, log) = (dir.join("proc"), dir.join("bin"), dir.join("log"));
        std::fs::create_dir_all(proc.join("net")).unwrap();
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::write(proc.join("net/ip_tables_names"), "filter\nnat\n").unwrap();
        std::fs::write(proc.join("net/ip6_tables_names"), "").unwrap();
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
            -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n";
        std::fs::write(dir.join("save"), save).unwrap();
        let script = |name: &str, body: String| {
            let path = tools.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        };
        let log_it = |what: &str| format!("echo \"{what} $*\" >> {}", log.display());
        script(
            "iptables-legacy-save",
            format!("cat {}", dir.join("save").display()),
        );
        script("ip6tables-legacy-save", "echo unexpected; exit 1".into());
        script(
            "iptables-nft-save",
            "echo '# Warning: iptables-legacy tables present'".into(),
        );
        // No ip6tables-nft-save: a backend that is not installed is not unreadable.
        script(
            "iptables-legacy-restore",
            format!("{}; cat >> {}", log_it("restore"), log.display()),
        );
        script(
            "ipset",
            format!(
                "if [ \"$1\" = list ]; then printf 'KUBE-CLUSTER-IP\\nmine\\n'; else {}; fi",
                log_it("ipset")
            ),
        );
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let node = HostKubeProxy {
            proc,
            sys_module: dir.join("module"),
            tools: Some(tools),
            healthz: free_addr,
            ..HostKubeProxy::default()
        };
        // Back: its KUBE-SERVICES chain in the legacy nat table (read with -t nat).
        assert_eq!(
            node.back().await.as_deref(),
            Some("its KUBE-SERVICES chain is in iptables-legacy nat")
        );
        let leftovers = node.leftovers(true).await;
        assert_eq!(leftovers.unreadable, Vec::<String>::new());
        assert_eq!(leftovers.ipsets, ["KUBE-CLUSTER-IP"]);
        assert_eq!(leftovers.counts(), (1, 1, 1));
        assert_eq!(
            (leftovers.rulesets[0].backend, leftovers.rulesets[0].family),
            ("legacy", "iptables")
        );
        node.remove(&leftovers).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "restore -w 5 --noflush\n*nat\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -F KUBE-SERVICES\n-X KUBE-SERVICES\nCOMMIT\nipset destroy KUBE-CLUSTER-IP\n"
        );
        // Its chain gone, its set there: back only once ip_set is loaded (no listing before).
        std::fs::write(dir.join("save"), "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n").unwrap();
        assert_eq!(node.back().await, None);
        std::fs::create_dir_all(dir.join("module/ip_set")).unwrap();
        assert_eq!(
            node.back().await.as_deref(),
            Some("its KUBE-CLUSTER-IP ipset exists")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
