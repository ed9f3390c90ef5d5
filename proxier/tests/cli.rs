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
