//! How the proxier reaches the Kubernetes API server with no ClusterIP in the way.
//!
//! The in-cluster configuration names the `kubernetes` Service's ClusterIP. On a node where
//! kipvs is the only service proxy nothing programs that address but kipvs itself, so after a
//! reboot (the kernel's IPVS table gone) a proxier that knows no other way never lists a
//! Service and never programs anything (issue 33). So the proxier remembers the API server's
//! own addresses on the node ([`Memory`]: the ready endpoints of the `kubernetes`
//! EndpointSlices, written to a file on a hostPath whenever they change while the watches are
//! in contact) and, at start, takes the server by this precedence ([`choose_server`]):
//!
//! 1. `--master` / `KIPVS_MASTER` (the DaemonSet sets it from the optional ConfigMap
//!    `kipvs-apiserver`), `https://` only ([`parse_master`]);
//! 2. the server of `--kubeconfig`;
//! 3. the remembered addresses: the first that accepts a TCP connection within
//!    [`CONNECT_TIMEOUT`], else the default configuration's server if that one does (a node
//!    whose ClusterIP works: kube-proxy runs, or kipvs's table is still in the kernel), else the
//!    first remembered (a reboot while the API server is still starting);
//! 4. the default configuration: `$KUBECONFIG` / `~/.kube/config`, else in-cluster (the
//!    ClusterIP).
//!
//! A proxier that reaches the API only through the ClusterIP, with nothing remembered yet, is
//! told by [`ApiPath`]: it refuses to take a node over from kube-proxy until an address is
//! remembered (after the takeover it alone would program that ClusterIP, and its next start
//! would find no way to the API).

use super::store::Store;
use http::Uri;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The file the DaemonSet in `config/` remembers the API server's addresses in (on the
/// hostPath `/var/lib/kipvs`, so that it outlives the pod and a reboot).
pub const DEFAULT_MEMORY: &str = "/var/lib/kipvs/apiserver";

/// How long a remembered address (or the default server) is given to accept a TCP connection
/// at start.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often [`Memory::keep`] looks at the `kubernetes` EndpointSlices in the store.
pub const MEMORY_CHECK: Duration = Duration::from_secs(5);

/// `--master` / `KIPVS_MASTER`: `https://host[:port]`, or `host[:port]` taken as `https://`.
///
/// # Errors
/// Not an address, a port that is not a number, or a scheme other than `https` (`http://` is
/// refused: the proxier would send its ServiceAccount token in clear text, and an API server
/// on plain HTTP cannot be told from anyone on the path).
pub fn parse_master(text: &str) -> Result<Uri, String> {
    let text = text.trim();
    let url = if text.contains("://") {
        text.to_owned()
    } else {
        format!("https://{text}")
    };
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{text:?} is not an API server address: {e}"))?;
    // `http` leaves a port that is not a number unchecked.
    let authority = uri.authority().map_or("", |a| a.as_str());
    let after_host = authority
        .rsplit_once(']')
        .map_or(authority, |(_, rest)| rest);
    let port_ok = after_host
        .rsplit_once(':')
        .is_none_or(|(_, port)| port.parse::<u16>().is_ok());
    match (uri.scheme_str(), uri.host()) {
        (Some("https"), Some(_)) if port_ok => Ok(uri),
        (Some("http"), Some(_)) => Err(format!(
            "{text:?}: the API server must be reached over https:// (http:// would send the \
             proxier's ServiceAccount token in clear text)"
        )),
        _ => Err(format!(
            "{text:?} is not an API server address (expected https://host:port or host:port)"
        )),
    }
}

/// Where the API server's address came from, in the order of precedence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--master` / `KIPVS_MASTER`.
    Master,
    /// The server of `--kubeconfig`.
    Kubeconfig,
    /// Remembered on the node ([`Memory`]).
    Remembered,
    /// The default configuration (`$KUBECONFIG`, `~/.kube/config`, else in-cluster).
    Default,
}

impl Origin {
    /// How the log names it.
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Master => "--master (KIPVS_MASTER, the ConfigMap kipvs-apiserver)",
            Origin::Kubeconfig => "--kubeconfig",
            Origin::Remembered => "remembered on the node",
            Origin::Default => "the default configuration",
        }
    }
}

/// The server chosen by [`choose_server`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerChoice {
    /// The server to use; `None`: the configuration's own.
    pub server: Option<Uri>,
    /// Where it came from.
    pub origin: Origin,
}

/// The API server by the precedence of the module documentation: `master`; else the
/// kubeconfig given (`kubeconfig`); else the first of `remembered` that `answers`, else the
/// default configuration's when `default_answers`, else the first remembered; else the default.
pub fn choose_server(
    master: Option<&Uri>,
    kubeconfig: bool,
    remembered: &[Uri],
    answers: impl Fn(&Uri) -> bool,
    default_answers: bool,
) -> ServerChoice {
    let choice = |server: Option<&Uri>, origin| ServerChoice {
        server: server.cloned(),
        origin,
    };
    if let Some(master) = master {
        return choice(Some(master), Origin::Master);
    }
    if kubeconfig {
        return choice(None, Origin::Kubeconfig);
    }
    let Some(first) = remembered.first() else {
        return choice(None, Origin::Default);
    };
    match remembered.iter().find(|uri| answers(uri)) {
        Some(answering) => choice(Some(answering), Origin::Remembered),
        None if default_answers => choice(None, Origin::Default),
        None => choice(Some(first), Origin::Remembered),
    }
}

/// Whether `uri`'s host and port (443 when not given) accept a TCP connection within
/// [`CONNECT_TIMEOUT`].
pub async fn answers(uri: &Uri) -> bool {
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    let connect = tokio::net::TcpStream::connect((host, port));
    matches!(
        tokio::time::timeout(CONNECT_TIMEOUT, connect).await,
        Ok(Ok(_))
    )
}

/// The address of an API server endpoint, `https://ip:port` (IPv6 in brackets).
fn endpoint_url(ip: IpAddr, port: i32) -> Option<Uri> {
    let port = u16::try_from(port).ok()?;
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    format!("https://{host}:{port}").parse().ok()
}

/// The API server's own addresses as the store has them: each ready endpoint of the
/// `default/kubernetes` Service's EndpointSlices at the slice's port named `https` (the only
/// one the API server registers; else its first port), sorted, without duplicates.
pub fn api_server_urls(store: &Store) -> Vec<Uri> {
    let key = ("default".to_owned(), "kubernetes".to_owned());
    let mut urls: Vec<String> = Vec::new();
    for slice in store.slices_of(&key) {
        let port = slice
            .ports
            .iter()
            .find(|p| &*p.name == "https")
            .or_else(|| slice.ports.first())
            .and_then(|p| p.port);
        let Some(port) = port else { continue };
        for endpoint in slice.endpoints.iter().filter(|e| e.ready) {
            if let Some(crate::model::objects::EndpointAddress::Ip(ip)) = endpoint.address {
                urls.extend(endpoint_url(ip, port).map(|u| u.to_string()));
            }
        }
    }
    urls.sort();
    urls.dedup();
    urls.into_iter().filter_map(|u| u.parse().ok()).collect()
}

/// The remembered addresses in `text` (one `https://` URL a line; `#` comments and blank
/// lines skipped, lines that do not parse ignored).
pub fn parse_memory(text: &str) -> Vec<Uri> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| parse_master(line).ok())
        .collect()
}

/// The API server's addresses remembered on the node, in a file.
#[derive(Clone, Debug)]
pub struct Memory {
    /// The file (`--remember-apiserver`; [`DEFAULT_MEMORY`] in the DaemonSet).
    pub path: PathBuf,
}

impl Memory {
    /// The remembered addresses; none when the file is missing or unreadable (logged).
    pub fn read(&self) -> Vec<Uri> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => parse_memory(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), "cannot read the remembered API server addresses: {e}");
                Vec::new()
            }
        }
    }

    /// Write `urls` (replacing the file at once: written beside it, then renamed).
    ///
    /// # Errors
    /// The directory cannot be made or the file written.
    pub fn write(&self, urls: &[Uri]) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut text = String::from(
            "# The Kubernetes API server's addresses (the `kubernetes` EndpointSlices), written by\n\
             # kipvs-proxier after each change it saw; read at its start when --master is not given.\n",
        );
        for url in urls {
            text.push_str(&url.to_string());
            text.push('\n');
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Keeps the file equal to the `kubernetes` EndpointSlices in `store` ([`api_server_urls`],
    /// looked at every [`MEMORY_CHECK`]) while the API is in contact (`lost_since` is `None`:
    /// what is written comes from an API server that answered) and the store has some, forever.
    /// `path` is told the refusal of [`ApiPath`] is over once the file holds an address.
    pub async fn keep(
        self,
        store: impl Fn() -> Vec<Uri>,
        lost_since: watch::Receiver<Option<Instant>>,
        path: watch::Sender<Option<String>>,
    ) {
        let mut written = self.read();
        let mut failed = None;
        loop {
            let urls = store();
            if lost_since.borrow().is_none() && !urls.is_empty() && urls != written {
                match self.write(&urls) {
                    Ok(()) => {
                        let list: Vec<String> = urls.iter().map(Uri::to_string).collect();
                        tracing::info!(path = %self.path.display(), "remembered the API server's addresses: {}", list.join(", "));
                        written = urls;
                        failed = None;
                    }
                    Err(e) => {
                        let message = e.to_string();
                        if failed.as_ref() != Some(&message) {
                            tracing::error!(path = %self.path.display(), "cannot remember the API server's addresses: {message}");
                            failed = Some(message);
                        }
                    }
                }
            }
            if !written.is_empty() {
                path.send_if_modified(|refusal| refusal.take().is_some());
            }
            tokio::time::sleep(MEMORY_CHECK).await;
        }
    }
}

/// Whether the proxier has a way to the API server other than a ClusterIP it alone would
/// program: the reason it has none, or `None`. Read by the takeover from kube-proxy, which
/// waits while there is a reason. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ApiPath(watch::Receiver<Option<String>>);

impl Default for ApiPath {
    /// A way that needs no ClusterIP (manifests, `--master`, tests).
    fn default() -> Self {
        ApiPath(watch::channel(None).1)
    }
}

impl ApiPath {
    /// The fact for a proxier that reached the API by `origin`, and its sender: with
    /// [`Origin::Default`] and nothing in `remembered`, the reason (from the start, until
    /// [`Memory::keep`] has written an address); `None` otherwise.
    pub fn of(origin: Origin, remembered: &[Uri]) -> (watch::Sender<Option<String>>, ApiPath) {
        let reason = (origin == Origin::Default && remembered.is_empty()).then(|| {
            "the API server is reached only through the kubernetes Service's ClusterIP and no \
             other address of it is remembered on this node yet (--remember-apiserver); after a \
             takeover kipvs alone would program that ClusterIP and a restart (a reboot) would \
             find no way to the API: set the ConfigMap kipvs-apiserver (README, \"Moving from \
             kube-proxy\")"
                .to_owned()
        });
        let (tx, rx) = watch::channel(reason);
        (tx, ApiPath(rx))
    }

    /// Why a takeover must wait, if it must.
    pub fn refusal(&self) -> Option<String> {
        self.0.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(text: &str) -> Uri {
        text.parse().unwrap()
    }

    #[test]
    fn master_is_an_https_url_or_a_host_and_port() {
        let url = |text| parse_master(text).map(|u| u.to_string());
        assert_eq!(
            url("https://10.0.0.1:6443").unwrap(),
            "https://10.0.0.1:6443/"
        );
        assert_eq!(url("10.0.0.1:6443").unwrap(), "https://10.0.0.1:6443/");
        assert_eq!(
            url(" cp.example:6443 ").unwrap(),
            "https://cp.example:6443/"
        );
        assert_eq!(url("[fd00::1]:6443").unwrap(), "https://[fd00::1]:6443/");
        for bad in ["", "ftp://x:1", "https://", "10.0.0.1:port"] {
            assert!(url(bad).is_err(), "{bad:?} is refused: {:?}", url(bad));
        }
        let http = url("http://10.0.0.1:8080").unwrap_err();
        assert!(http.contains("https://"), "{http}");
        assert!(http.contains("clear text"), "{http}");
    }

    /// `--master` over `--kubeconfig` over the remembered addresses over the default; among
    /// the remembered, one that answers, then a default that answers, then the first.
    #[test]
    fn the_server_is_chosen_by_precedence() {
        let master = uri("https://master:6443");
        let (a, b) = (uri("https://10.0.0.1:6443"), uri("https://10.0.0.2:6443"));
        let remembered = [a.clone(), b.clone()];
        // (master, kubeconfig given, remembered, those that answer, the default answers)
        let chosen = |master, kubeconfig, remembered: &[Uri], answering: &[&Uri], default| {
            choose_server(
                master,
                kubeconfig,
                remembered,
                |u| answering.contains(&u),
                default,
            )
        };
        let pick = |server: Option<&Uri>, origin| ServerChoice {
            server: server.cloned(),
            origin,
        };
        let both = [&a, &b];
        assert_eq!(
            chosen(Some(&master), true, &remembered, &both, true),
            pick(Some(&master), Origin::Master)
        );
        assert_eq!(
            chosen(None, true, &remembered, &both, true),
            pick(None, Origin::Kubeconfig)
        );
        assert_eq!(
            chosen(None, false, &remembered, &both, true),
            pick(Some(&a), Origin::Remembered)
        );
        assert_eq!(
            chosen(None, false, &remembered, &[&b], true),
            pick(Some(&b), Origin::Remembered)
        );
        // None answers: the ClusterIP if it does (kube-proxy runs; a restart, not a reboot).
        assert_eq!(
            chosen(None, false, &remembered, &[], true),
            pick(None, Origin::Default)
        );
        // Nothing answers (a reboot, the API server still starting): never the ClusterIP.
        assert_eq!(
            chosen(None, false, &remembered, &[], false),
            pick(Some(&a), Origin::Remembered)
        );
        assert_eq!(
            chosen(None, false, &[], &[], false),
            pick(None, Origin::Default)
        );
        assert_eq!(
            chosen(None, false, &[], &both, true),
            pick(None, Origin::Default)
        );
    }

    #[test]
    fn the_memory_is_written_and_read_back() {
        let dir = std::env::temp_dir().join(format!("kipvs-memory-{}", std::process::id()));
        let memory = Memory {
            path: dir.join("sub/apiserver"),
        };
        assert!(memory.read().is_empty(), "no file: nothing remembered");
        let urls = [
            uri("https://10.0.0.1:6443/"),
            uri("https://[fd00::1]:6443/"),
        ];
        memory.write(&urls).unwrap();
        assert_eq!(memory.read(), urls);
        let text = "# comment\n\nhttp://10.0.0.9:8080\nnot a url at all\nhttps://10.0.0.2:6443\n";
        assert_eq!(parse_memory(text), [uri("https://10.0.0.2:6443/")]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The `kubernetes` EndpointSlices' ready endpoints at their `https` port.
    #[test]
    fn the_api_servers_are_the_ready_endpoints_of_kubernetes() {
        let slice = |name: &str, service: &str, endpoints: serde_json::Value| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default",
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
                "endpoints": endpoints
            }))
            .unwrap()
        };
        let mut store = Store::default();
        store.upsert_slice(slice(
            "kubernetes",
            "kubernetes",
            serde_json::json!([
                {"addresses": ["10.0.0.2"]},
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}}
            ]),
        ));
        store.upsert_slice(slice(
            "web-abc",
            "web",
            serde_json::json!([{"addresses": ["10.244.0.5"]}]),
        ));
        let urls: Vec<String> = api_server_urls(&store).iter().map(Uri::to_string).collect();
        assert_eq!(urls, ["https://10.0.0.1:6443/", "https://10.0.0.2:6443/"]);
    }

    #[test]
    fn only_the_cluster_ip_with_nothing_remembered_refuses() {
        let remembered = [uri("https://10.0.0.1:6443")];
        assert!(ApiPath::of(Origin::Default, &[]).1.refusal().is_some());
        assert!(
            ApiPath::of(Origin::Default, &remembered)
                .1
                .refusal()
                .is_none()
        );
        for origin in [Origin::Master, Origin::Kubeconfig, Origin::Remembered] {
            assert!(ApiPath::of(origin, &[]).1.refusal().is_none(), "{origin:?}");
        }
        assert!(ApiPath::default().refusal().is_none());
    }

    /// The memory is written from the store while in contact only, and ends the refusal.
    #[tokio::test(start_paused = true)]
    async fn keep_writes_while_in_contact_and_ends_the_refusal() {
        let dir = std::env::temp_dir().join(format!("kipvs-keep-{}", std::process::id()));
        let memory = Memory {
            path: dir.join("apiserver"),
        };
        let (lost_tx, lost) = watch::channel(Some(Instant::now()));
        let (path_tx, path) = ApiPath::of(Origin::Default, &[]);
        let urls = vec![uri("https://10.0.0.1:6443/")];
        let task = tokio::spawn(memory.clone().keep(move || urls.clone(), lost, path_tx));
        tokio::time::sleep(MEMORY_CHECK * 2).await;
        assert!(memory.read().is_empty(), "not written while out of contact");
        assert!(path.refusal().is_some());
        lost_tx.send_replace(None);
        tokio::time::sleep(MEMORY_CHECK * 2).await;
        assert_eq!(memory.read(), [uri("https://10.0.0.1:6443/")]);
        assert!(
            path.refusal().is_none(),
            "remembered: a takeover may go ahead"
        );
        task.abort();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
