//! kube-proxy on this node, for a takeover and a handback: what says it is there
//! ([`Signals`]: its pod through the API, its `/healthz` JSON at the address its ConfigMap
//! gives, its process where the PID namespace is shared, its iptables, ipset or nftables state,
//! its mode), whether it has synced (its metrics), what of its iptables rules and ipsets is left
//! ([`crate::plan::kube_proxy`] decides what goes), and removing that. What the engine does
//! with them is decided by [`crate::engine::takeover::state::decide`].
//!
//! The tools are the node's `iptables`/`ip6tables` of both backends
//! (`{ip,ip6}tables-{legacy,nft}-{save,restore}`), `ipset` and `nft`, from the proxier image:
//! the legacy backend has no library interface (`iptables-restore` is its transaction), and
//! `iptables-restore --noflush` removes exactly the named rules and chains, atomically per table.
//! A legacy ruleset is read only when its tables are loaded (`/proc/net/ip_tables_names`,
//! `ip6_tables_names`), so a node without them does not get the modules loaded by the reading.

use super::program::{Program, ProgramError};
use crate::plan::kube_proxy::{self, IptablesRemoval};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// kube-proxy's healthz address (`healthzBindAddress` default `0.0.0.0:10256`), probed on the
/// loopback.
pub const KUBE_PROXY_HEALTHZ: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 10256);

/// kube-proxy's metrics address (`metricsBindAddress` default `127.0.0.1:10249`).
pub const KUBE_PROXY_METRICS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 10249);

/// The metric kube-proxy sets at the end of each sync (`metrics.SyncProxyRulesLastTimestamp`,
/// `pkg/proxy/ipvs/proxier.go:1654` in 1.24, after `cleanLegacyService` adopted the table).
const KUBE_PROXY_SYNCED_METRIC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// How long one HTTP request to kube-proxy (healthz, metrics) may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one run of a tool in [`KubeProxyNode::back`] may take (it runs between syncs).
const BACK_TOOL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one iptables or ipset run may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// The label of kube-proxy's pods, as kubeadm's and kubespray's DaemonSet set it
/// (`k8s-app: kube-proxy`).
pub const KUBE_PROXY_POD_SELECTOR: &str = "k8s-app=kube-proxy";

/// kube-proxy's ConfigMap (`kube-system/kube-proxy`, as kubeadm writes it): namespace, name and
/// the key of its `KubeProxyConfiguration`.
pub const KUBE_PROXY_CONFIGMAP: (&str, &str, &str) = ("kube-system", "kube-proxy", "config.conf");

/// How long kube-proxy's ConfigMap, once read, is used before it is read again.
const CONFIGMAP_REFRESH: Duration = Duration::from_secs(60);

/// kube-proxy's proxy mode: `mode` in its configuration, served on its metrics address as
/// `/proxyMode` (`cmd/kube-proxy/app/server.go` `serveMetrics`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `ipvs`: the one mode a takeover adopts.
    Ipvs,
    /// `iptables`, and `""`: kube-proxy's default on Linux (`getProxyMode`).
    Iptables,
    /// `nftables` (kube-proxy 1.29 and later).
    Nftables,
    /// Any other name (`userspace` in old releases).
    Other(String),
}

impl Mode {
    /// The mode kube-proxy names `name` (`""`: iptables, its default on Linux).
    pub fn parse(name: &str) -> Mode {
        match name.trim() {
            "ipvs" => Mode::Ipvs,
            "" | "iptables" => Mode::Iptables,
            "nftables" => Mode::Nftables,
            other => Mode::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Ipvs => f.write_str("ipvs"),
            Mode::Iptables => f.write_str("iptables"),
            Mode::Nftables => f.write_str("nftables"),
            Mode::Other(name) => f.write_str(name),
        }
    }
}

/// kube-proxy's pod on this node, through the API (a watch of `kube-system` pods labelled
/// [`KUBE_PROXY_POD_SELECTOR`] with `spec.nodeName` this node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PodSignal {
    /// Not known: no API client, the list is not done, or it is refused (RBAC).
    #[default]
    Unknown,
    /// No kube-proxy pod on the node (or only finished ones: `Succeeded`, `Failed`).
    Absent,
    /// A kube-proxy pod is scheduled here and not running yet (`Pending`: pulling its image,
    /// waiting for a volume): kube-proxy is coming.
    Pending(String),
    /// A kube-proxy pod runs here (`Running`, also while its container restarts).
    Running(String),
}

/// What says kube-proxy is on the node, at one look ([`KubeProxyNode::signals`]). Each
/// `Some` names where it was seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// Its pod on this node.
    pub pod: PodSignal,
    /// Its `/healthz` JSON answers at its address (from its ConfigMap, else
    /// [`KUBE_PROXY_HEALTHZ`]).
    pub healthz: Option<String>,
    /// A process named `kube-proxy` (seen only where the proxier shares the host's PID
    /// namespace).
    pub process: Option<String>,
    /// Its state on the node, when it was read: its `KUBE-SERVICES` chain, its
    /// `KUBE-CLUSTER-IP` ipset, its nftables table `ip kube-proxy`/`ip6 kube-proxy`.
    pub state: Option<String>,
    /// Its mode and where it was read: its `/proxyMode` while it answers, else the form of its
    /// state (`KUBE-NODEPORTS`, `KUBE-SVC-*`, `KUBE-SEP-*` chains: iptables; its nftables
    /// table: nftables; else IPVS).
    pub mode: Option<(Mode, String)>,
    /// The mode its ConfigMap gives (what a kube-proxy started on this node would run).
    pub configured_mode: Option<Mode>,
}

impl Signals {
    /// Why kube-proxy is taken to run on the node (`None`: nothing says so): its running pod,
    /// its `/healthz`, its process.
    pub fn runs(&self) -> Option<String> {
        match &self.pod {
            PodSignal::Running(name) => Some(format!("its pod kube-system/{name} runs here")),
            _ => self.healthz.clone().or_else(|| self.process.clone()),
        }
    }

    /// Why kube-proxy is taken to be on the node or coming: it runs ([`runs`](Self::runs)),
    /// or its pod is scheduled here.
    pub fn present(&self) -> Option<String> {
        self.runs().or_else(|| match &self.pod {
            PodSignal::Pending(name) => Some(format!("its pod kube-system/{name} is pending here")),
            _ => None,
        })
    }
}

/// What kipvs reads of kube-proxy's configuration (`KubeProxyConfiguration`, the
/// `config.conf` of its ConfigMap): its mode and where to probe its healthz and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeProxyFile {
    /// `mode` (`""`: iptables).
    pub mode: Mode,
    /// Where its `/healthz` answers (`healthzBindAddress`; unset: `0.0.0.0:10256`), an
    /// unspecified address probed on the loopback of its family.
    pub healthz: SocketAddr,
    /// Where its metrics answer (`metricsBindAddress`; unset: `127.0.0.1:10249`), likewise.
    pub metrics: SocketAddr,
}

impl KubeProxyFile {
    /// Reads `config.conf` (YAML). Addresses follow kube-proxy's forms: `host:port`,
    /// `[v6]:port`, or a host alone with the default port (`AppendPortIfNeeded`).
    ///
    /// # Errors
    /// Malformed YAML, or an address that is not one.
    pub fn parse(text: &str) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct File {
            #[serde(default)]
            mode: Option<String>,
            #[serde(default)]
            healthz_bind_address: Option<String>,
            #[serde(default)]
            metrics_bind_address: Option<String>,
        }
        let file: File = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let text = |field: Option<String>| field.unwrap_or_default();
        Ok(KubeProxyFile {
            mode: Mode::parse(&text(file.mode)),
            healthz: probe_address(&text(file.healthz_bind_address), KUBE_PROXY_HEALTHZ)?,
            metrics: probe_address(&text(file.metrics_bind_address), KUBE_PROXY_METRICS)?,
        })
    }
}

/// Where to probe a server bound to `bind` (`""`: `default`; no port: `default`'s): an
/// unspecified address on the loopback of its family.
fn probe_address(bind: &str, default: SocketAddr) -> Result<SocketAddr, String> {
    let bind = bind.trim();
    let addr = match bind.parse::<SocketAddr>() {
        _ if bind.is_empty() => default,
        Ok(addr) => addr,
        Err(_) => {
            let ip = bind.trim_start_matches('[').trim_end_matches(']');
            let ip: IpAddr = ip.parse().map_err(|_| format!("{bind}: not an address"))?;
            SocketAddr::new(ip, default.port())
        }
    };
    Ok(match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    })
}

/// kube-proxy through the API: its pod on this node (a watch, kept by a task of its own) and
/// its ConfigMap (read again at most every [`CONFIGMAP_REFRESH`]). Needs `list`/`watch` on
/// pods and `get` on configmaps in `kube-system`; refused, the pod is [`PodSignal::Unknown`]
/// and the file unknown (logged).
pub struct KubeProxyApi {
    pods: reflector::Store<Pod>,
    configmaps: Api<ConfigMap>,
    file: tokio::sync::Mutex<Option<(Instant, Option<KubeProxyFile>)>>,
}

impl fmt::Debug for KubeProxyApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeProxyApi").finish_non_exhaustive()
    }
}

impl KubeProxyApi {
    /// Starts watching kube-proxy's pods on `node` with `client`.
    pub fn start(client: Client, node: &str) -> Self {
        let (namespace, _, _) = KUBE_PROXY_CONFIGMAP;
        let config = watcher::Config::default()
            .labels(KUBE_PROXY_POD_SELECTOR)
            .fields(&format!("spec.nodeName={node}"));
        let (pods, writer) = reflector::store();
        let api = Api::<Pod>::namespaced(client.clone(), namespace);
        let stream = reflector(writer, watcher(api, config)).default_backoff();
        tokio::spawn(
            async move {
                let mut stream = std::pin::pin!(stream);
                let mut failing = false;
                while let Some(event) = stream.next().await {
                    match event {
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!("kube-proxy's pods on this node cannot be watched: {e}");
                        }
                        Err(_) => {}
                        Ok(_) => failing = false,
                    }
                }
            }
            .instrument(tracing::info_span!("kube_proxy_pods", node)),
        );
        KubeProxyApi {
            pods,
            configmaps: Api::namespaced(client, namespace),
            file: tokio::sync::Mutex::new(None),
        }
    }

    /// kube-proxy's pod on the node, as last listed and watched.
    fn pod(&self) -> PodSignal {
        if self.pods.wait_until_ready().now_or_never().is_none() {
            return PodSignal::Unknown;
        }
        pod_signal(self.pods.state().iter().map(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            (name.to_owned(), phase.unwrap_or("Pending").to_owned())
        }))
    }

    /// kube-proxy's configuration from its ConfigMap (`None`: none, unreadable or not
    /// parsed; logged when that changes).
    async fn file(&self) -> Option<KubeProxyFile> {
        let mut cached = self.file.lock().await;
        if let Some((at, file)) = cached.as_ref()
            && at.elapsed() < CONFIGMAP_REFRESH
        {
            return file.clone();
        }
        let (_, name, key) = KUBE_PROXY_CONFIGMAP;
        let read = match self.configmaps.get_opt(name).await {
            Ok(Some(cm)) => match cm.data.as_ref().and_then(|d| d.get(key)) {
                Some(text) => KubeProxyFile::parse(text).map(Some),
                None => Err(format!("no key {key}")),
            },
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        };
        let file = read.unwrap_or_else(|e| {
            tracing::warn!("kube-proxy's ConfigMap cannot be read: {e}");
            None
        });
        if cached.as_ref().is_none_or(|(_, before)| *before != file) {
            tracing::info!(?file, "kube-proxy's configuration (its ConfigMap)");
        }
        *cached = Some((Instant::now(), file.clone()));
        file
    }
}

/// kube-proxy's pod on the node from its pods there (name, `status.phase`; unset: `Pending`):
/// a `Running` one first, else one not finished (`Succeeded`, `Failed`).
fn pod_signal(pods: impl Iterator<Item = (String, String)>) -> PodSignal {
    let (mut running, mut pending) = (None, None);
    for (name, phase) in pods {
        match phase.as_str() {
            "Running" => running = Some(name),
            "Succeeded" | "Failed" => {}
            _ => pending = Some(name),
        }
    }
    match (running, pending) {
        (Some(name), _) => PodSignal::Running(name),
        (None, Some(name)) => PodSignal::Pending(name),
        (None, None) => PodSignal::Absent,
    }
}

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
    /// What says kube-proxy is on the node now ([`Signals`]); its state (iptables, ipset,
    /// nftables: a few tool runs) only with `state`.
    fn signals(&self, state: bool) -> BoxFuture<'_, Signals>;
    /// Reads kube-proxy through the API from now on, with `client`, as the node `node` (its
    /// pod, its ConfigMap: [`KubeProxyApi`]); a node without it ignores this.
    fn follow_api(&self, client: Client, node: &str) {
        let _ = (client, node);
    }
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
    /// kube-proxy through the API, once a client is there (its pod; its ConfigMap, whose
    /// addresses replace `healthz` and `metrics`).
    pub api: Arc<OnceLock<KubeProxyApi>>,
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
            api: Arc::default(),
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

    /// kube-proxy's `/healthz` verdict at `addr` (`Some(true)`: 200), when kube-proxy answers
    /// there: a body with its `lastUpdated` and `currentTime`
    /// (`pkg/proxy/healthcheck/proxier_health.go` `healthzHandler`); anything else answering on
    /// the port (another proxy's healthz) is not kube-proxy. `None` too while the proxier's own
    /// server holds the port.
    async fn healthz(&self, addr: SocketAddr) -> Option<bool> {
        if self.own_healthz.load(Ordering::Relaxed) && addr.port() == self.healthz.port() {
            return None;
        }
        let (code, body) = http_get(addr, "/healthz").await?;
        let json: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
        let kube_proxy = json.get("lastUpdated").is_some() && json.get("currentTime").is_some();
        kube_proxy.then_some(code == 200)
    }

    /// Where kube-proxy's healthz and metrics answer, and its configured mode: from its
    /// ConfigMap when there is a client and it is read, else [`HostKubeProxy::healthz`] and
    /// [`HostKubeProxy::metrics`] and no mode.
    async fn addresses(&self) -> (SocketAddr, SocketAddr, Option<Mode>) {
        let file = match self.api.get() {
            Some(api) => api.file().await,
            None => None,
        };
        match file {
            Some(f) => (f.healthz, f.metrics, Some(f.mode)),
            None => (self.healthz, self.metrics, None),
        }
    }

    /// Whether kube-proxy's state is on the node, where, and the mode its form says: its
    /// nftables table (`ip kube-proxy`, `ip6 kube-proxy`: nftables mode), its `KUBE-SERVICES`
    /// chain in a nat table (`-t nat` of each loaded backend and family; with
    /// `KUBE-NODEPORTS`, `KUBE-SVC-*` or `KUBE-SEP-*`, which IPVS mode never creates: iptables
    /// mode, `pkg/proxy/iptables/proxier.go`), or its `KUBE-CLUSTER-IP` ipset (IPVS mode).
    async fn kube_proxy_objects(&self) -> Option<(String, Mode)> {
        let nft = Program {
            timeout: BACK_TOOL_TIMEOUT,
            ..self.tool("nft")
        };
        let tables = nft.run(&["list", "tables"], None).await.unwrap_or_default();
        let table = tables
            .lines()
            .map(str::trim)
            .find(|l| *l == "table ip kube-proxy" || *l == "table ip6 kube-proxy");
        if let Some(table) = table {
            let table = table.trim_start_matches("table ");
            return Some((format!("its nftables table {table}"), Mode::Nftables));
        }
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
                let iptables = text.lines().any(|l| {
                    l.starts_with(":KUBE-NODEPORTS ")
                        || l.starts_with(":KUBE-SVC-")
                        || l.starts_with(":KUBE-SEP-")
                });
                let mode = if iptables { Mode::Iptables } else { Mode::Ipvs };
                let chain = format!("its KUBE-SERVICES chain is in {family}-{backend} nat");
                return Some((chain, mode));
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
            .then(|| ("its KUBE-CLUSTER-IP ipset exists".to_owned(), Mode::Ipvs))
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
    fn follow_api(&self, client: Client, node: &str) {
        self.api.get_or_init(|| KubeProxyApi::start(client, node));
    }

    fn signals(&self, state: bool) -> BoxFuture<'_, Signals> {
        Box::pin(async move {
            let (healthz, metrics, configured_mode) = self.addresses().await;
            let pids = self.processes();
            let objects = match state {
                true => self.kube_proxy_objects().await,
                false => None,
            };
            // Its body is the mode's name alone; the proxier's own metrics server has none.
            let proxy_mode = match http_get(metrics, "/proxyMode").await {
                Some((200, name))
                    if !name.trim().is_empty() && !name.contains(char::is_whitespace) =>
                {
                    Some((Mode::parse(&name), format!("its /proxyMode on {metrics}")))
                }
                _ => None,
            };
            let state_mode = objects.as_ref().map(|(w, m)| (m.clone(), w.clone()));
            let healthz_answers = self.healthz(healthz).await.is_some();
            Signals {
                pod: self.api.get().map_or(PodSignal::Unknown, KubeProxyApi::pod),
                healthz: healthz_answers.then(|| format!("its /healthz answers on {healthz}")),
                process: (!pids.is_empty()).then(|| format!("process kube-proxy (pid {pids:?})")),
                state: objects.map(|(w, _)| w),
                mode: proxy_mode.or(state_mode),
                configured_mode,
            }
        })
    }

    fn synced(&self) -> BoxFuture<'_, Option<bool>> {
        Box::pin(async move {
            let (healthz, metrics, _) = self.addresses().await;
            let (code, text) = http_get(metrics, "/metrics").await?;
            let synced = code == 200
                && text.lines().any(|line| {
                    line.strip_prefix(KUBE_PROXY_SYNCED_METRIC)
                        .and_then(|rest| rest.trim().parse::<f64>().ok())
                        .is_some_and(|at| at > 0.0)
                });
            if !synced {
                return None;
            }
            Some(self.healthz(healthz).await == Some(true))
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

    /// Why kube-proxy is taken to run on `node` ([`Signals::runs`]).
    async fn runs(node: &HostKubeProxy) -> Option<String> {
        node.signals(false).await.runs()
    }

    /// kube-proxy's state on `node` ([`Signals::state`]).
    async fn state(node: &HostKubeProxy) -> Option<String> {
        node.signals(true).await.state
    }

    /// kube-proxy's ConfigMap: its mode, and its healthz and metrics addresses as kube-proxy
    /// binds them, an unspecified address probed on the loopback.
    #[test]
    fn kube_proxys_configmap_gives_its_mode_and_addresses() {
        let kubeadm = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
            bindAddress: 0.0.0.0\nhealthzBindAddress: \"\"\nmetricsBindAddress: \"\"\nmode: \"\"\n\
            ipvs: {scheduler: \"\"}\n";
        let file = KubeProxyFile::parse(kubeadm).unwrap();
        assert_eq!(
            file,
            KubeProxyFile {
                mode: Mode::Iptables,
                healthz: KUBE_PROXY_HEALTHZ,
                metrics: KUBE_PROXY_METRICS
            }
        );
        let node_ip = "mode: ipvs\nhealthzBindAddress: 192.168.100.1:10256\nmetricsBindAddress: 0.0.0.0:10249\n";
        let file = KubeProxyFile::parse(node_ip).unwrap();
        assert_eq!(file.mode, Mode::Ipvs);
        assert_eq!(file.healthz, "192.168.100.1:10256".parse().unwrap());
        assert_eq!(file.metrics, "127.0.0.1:10249".parse().unwrap());
        let bare = KubeProxyFile::parse("mode: nftables\nhealthzBindAddress: \"::\"\n").unwrap();
        assert_eq!(bare.mode, Mode::Nftables);
        assert_eq!(bare.healthz, "[::1]:10256".parse().unwrap());
        assert!(KubeProxyFile::parse("healthzBindAddress: node-ip\n").is_err());
    }

    /// Its pod: a running one first, else one not finished; none, absent.
    #[test]
    fn kube_proxys_pod_on_the_node() {
        let pods = |list: &[(&str, &str)]| {
            pod_signal(list.iter().map(|(n, p)| ((*n).to_owned(), (*p).to_owned())))
        };
        assert_eq!(pods(&[]), PodSignal::Absent);
        assert_eq!(pods(&[("a", "Failed")]), PodSignal::Absent);
        assert_eq!(pods(&[("a", "Pending")]), PodSignal::Pending("a".into()));
        assert_eq!(
            pods(&[("a", "Pending"), ("b", "Running")]),
            PodSignal::Running("b".into())
        );
    }

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
        assert!(runs(&node).await.unwrap().contains("4242"));
        std::fs::remove_dir_all(proc.join("4242")).unwrap();
        assert_eq!(runs(&node).await, None);
        let kube_proxy = r#"{"lastUpdated": "2026-11-26 17:00:00.1 +0000 UTC","currentTime": "2026-11-26 17:00:00.1 +0000 UTC"}"#;
        let held = HostKubeProxy {
            healthz: answering(200, kube_proxy),
            ..node.clone()
        };
        assert!(runs(&held).await.unwrap().contains("/healthz"));
        held.own_healthz.store(true, Ordering::Relaxed);
        assert_eq!(runs(&held).await, None, "the proxier's own healthz");
        let other = HostKubeProxy {
            healthz: answering(200, r#"{"status": "ok"}"#),
            ..node.clone()
        };
        assert_eq!(runs(&other).await, None, "another proxy's healthz");
        // Its mode from /proxyMode on its metrics address.
        let iptables = HostKubeProxy {
            metrics: answering(200, "iptables"),
            ..node.clone()
        };
        let mode = iptables.signals(false).await.mode.unwrap();
        assert_eq!(mode.0, Mode::Iptables);
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
            tools: Some(tools.clone()),
            healthz: free_addr,
            ..HostKubeProxy::default()
        };
        // Back: its KUBE-SERVICES chain in the legacy nat table (read with -t nat).
        assert_eq!(
            state(&node).await.as_deref(),
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
        assert_eq!(state(&node).await, None);
        std::fs::create_dir_all(dir.join("module/ip_set")).unwrap();
        assert_eq!(
            state(&node).await.as_deref(),
            Some("its KUBE-CLUSTER-IP ipset exists")
        );
        // iptables mode: its KUBE-SVC-* and KUBE-NODEPORTS chains, which IPVS mode never makes.
        let iptables = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SVC-ABC - [0:0]\nCOMMIT\n";
        std::fs::write(dir.join("save"), iptables).unwrap();
        let signals = node.signals(true).await;
        assert_eq!(signals.mode.map(|m| m.0), Some(Mode::Iptables));
        // nftables mode: its table ip kube-proxy.
        script(
            "nft",
            "printf 'table inet kipvs\\ntable ip kube-proxy\\n'".into(),
        );
        let signals = node.signals(true).await;
        assert_eq!(
            signals.state.as_deref(),
            Some("its nftables table ip kube-proxy")
        );
        assert_eq!(signals.mode.map(|m| m.0), Some(Mode::Nftables));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
