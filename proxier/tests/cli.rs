//! The `kipvs-proxier plan` command end to end: bad input is reported by name and loses
//! nothing else; a bad configuration stops the command with a clear error.

use std::path::PathBuf;
use std::process::{Command, Output};

fn proxier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kipvs-proxier"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run kipvs-proxier")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kipvs-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: good, namespace: default}
spec:
  clusterIP: 10.96.0.50
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: good-abc
  namespace: default
  labels: {kubernetes.io/service-name: good}
addressType: IPv4
endpoints:
- addresses: [10.244.1.2]
  conditions: {ready: true}
ports: [{name: http, port: 8080, protocol: TCP}]
"#;

const BAD_IP: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: broken, namespace: shop}
spec:
  clusterIP: 10.96.0.999
  ports: [{name: http, port: 80, protocol: TCP}]
"#;

#[test]
fn malformed_input_is_named_and_the_rest_is_planned() {
    let dir = scratch("malformed");
    std::fs::write(dir.join("a-good.yaml"), GOOD).unwrap();
    std::fs::write(dir.join("b-bad-ip.yaml"), BAD_IP).unwrap();
    std::fs::write(
        dir.join("c-unparsable.yaml"),
        "kind: Service\nspec: [unclosed\n",
    )
    .unwrap();
    let out = proxier(&["plan", "--node", "n1", "--manifests", dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stdout,
        "-A -t 10.96.0.50:80 -s rr\n-a -t 10.96.0.50:80 -r 10.244.1.2:8080 -m -w 1\n"
    );
    assert!(stderr.contains("shop/broken"), "{stderr}");
    assert!(stderr.contains("10.96.0.999"), "{stderr}");
    assert!(stderr.contains("c-unparsable.yaml"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unknown_feature_gate_is_a_clear_error() {
    let dir = scratch("gate");
    std::fs::write(dir.join("svc.yaml"), GOOD).unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "featureGates:\n  ProxyTerminatingEndpoint: false\n",
    )
    .unwrap();
    let out = proxier(&[
        "plan",
        "--node",
        "n1",
        "--manifests",
        dir.join("svc.yaml").to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(stderr.contains("ProxyTerminatingEndpoint"), "{stderr}");
    assert!(stderr.contains("config.yaml"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn json_format_lists_bind_addresses() {
    let dir = scratch("json");
    std::fs::write(dir.join("svc.yaml"), GOOD).unwrap();
    let out = proxier(&[
        "plan",
        "--node",
        "n1",
        "--manifests",
        dir.join("svc.yaml").to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = v.to_string();
    assert!(text.contains("10.96.0.50"), "{text}");
    assert!(text.contains("10.244.1.2:8080"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// How long a test waits at most for an event of a proxier it runs: only a bound against a
/// proxier that hangs. Each wait ends at its event, however long load delays it (a loaded
/// machine once took more than 20 s to the proxier's first warning).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);

/// A `kipvs-proxier run` process, killed when dropped (also when a test fails), and its stderr
/// lines as they come.
struct Running {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// The lines read so far.
    seen: Vec<String>,
}

impl Running {
    /// Starts `command` with its stderr read line by line.
    fn start(mut command: Command) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = command
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kipvs-proxier");
        let (lines_tx, lines) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first stderr line, read before or now, that contains `needle`. Panics with the
    /// stderr so far if the proxier exits first, or after [`PATIENCE`].
    fn wait_for(&mut self, needle: &str) -> String {
        use std::sync::mpsc::RecvTimeoutError;
        if let Some(line) = self.seen.iter().find(|line| line.contains(needle)) {
            return line.clone();
        }
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let why = match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line);
                    let line = self.seen.last().unwrap();
                    if line.contains(needle) {
                        return line.clone();
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => "the proxier exited before",
                Err(RecvTimeoutError::Timeout) => "after PATIENCE, still no",
            };
            panic!("{why} {needle:?}; stderr:\n{}", self.seen.join("\n"));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `ready` holds, polling; panics naming `what` after [`PATIENCE`].
fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} within {PATIENCE:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A port taken by another process (kube-controller-manager on 10257, kube-proxy still stopping
/// on 10256) does not stop the proxier: it programs, and binds the server once the port is free.
#[test]
fn a_taken_server_port_is_retried_while_the_proxier_programs() {
    use std::net::{TcpListener, TcpStream};

    let dir = scratch("taken-port");
    std::fs::write(dir.join("good.yaml"), GOOD).unwrap();
    let free = || {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let grpc = taken.local_addr().unwrap();
    let (healthz, metrics) = (free(), free());
    let mut command = Command::new(env!("CARGO_BIN_EXE_kipvs-proxier"));
    command
        .args([
            "run",
            "--node",
            "node-1",
            "--dataplane",
            "fake",
            "--manifests",
        ])
        .arg(&dir)
        .arg(format!("--healthz-bind-address={healthz}"))
        .arg(format!("--metrics-bind-address={metrics}"))
        .arg(format!("--grpc-health-bind-address={grpc}"))
        .env("RUST_LOG", "info");
    let mut proxier = Running::start(command);
    // The warning and the first sync come in either order.
    let warning = proxier.wait_for("cannot bind the gRPC health server");
    assert!(warning.contains(&grpc.to_string()), "{warning}");
    proxier.wait_for("sync complete");
    wait_until("healthz serves while the gRPC health port is taken", || {
        TcpStream::connect(healthz).is_ok()
    });
    assert!(
        proxier.seen.iter().all(|l| !l.contains("bound the gRPC")),
        "no gRPC health server bound while the port is taken"
    );
    drop(taken);
    proxier.wait_for("bound the gRPC health server");
    assert!(
        TcpStream::connect(grpc).is_ok(),
        "the gRPC health port is served now"
    );
    drop(proxier);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The DaemonSet in `config/` runs on every node, kubeadm control-plane nodes included: none of
/// its ports may be one a kubeadm control-plane node or its kubelet already uses (kube-proxy's
/// 10249 and 10256 are kipvs's own, as it replaces kube-proxy; a taken port is retried).
#[test]
fn the_daemonset_uses_no_port_of_a_kubeadm_control_plane_node() {
    const TAKEN: [(u16, &str); 8] = [
        (6443, "kube-apiserver"),
        (2379, "etcd"),
        (2380, "etcd peer"),
        (10248, "kubelet healthz"),
        (10250, "kubelet"),
        (10255, "kubelet read-only"),
        (10257, "kube-controller-manager"),
        (10259, "kube-scheduler"),
    ];
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/proxier/daemonset.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let ports: Vec<u16> = text
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(|line| line.split(|c: char| !c.is_ascii_digit()))
        .filter(|s| (4..=5).contains(&s.len()))
        .filter_map(|s| s.parse().ok())
        .collect();
    assert!(
        ports.contains(&10266),
        "the gRPC health port is read: {ports:?}"
    );
    for (port, owner) in TAKEN {
        assert!(!ports.contains(&port), "{path} uses {port}, {owner}'s port");
    }
}
