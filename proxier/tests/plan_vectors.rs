//! Data-driven `plan()` vectors: every directory under `testdata/plan/` holding an
//! `input.yaml` is one case; a directory without one groups the steps of a scenario (its
//! subdirectories, in name order, each a full snapshot planned on its own).
//!
//! A case holds:
//! - `input.yaml`: Services, EndpointSlices and Nodes (read with [`manifests::load`]). It starts
//!   with comments naming the upstream kube-proxy test it mirrors and where kipvs's semantics
//!   differ. The node is `test-node`. Addresses on its interfaces but `kube-ipvs0` come from a
//!   `# other-interface-addresses: a, b` comment; none without it. Its IPs (the NodePort
//!   candidates) come from a `# node-ips: a, b` comment, as `--node-ip` gives them; else they
//!   are the InternalIP addresses of a Node named `test-node` in the input and those other
//!   addresses ([`plan::node_addresses`]).
//! - `config.yaml` (optional): the [`ProxierConfiguration`]; defaults otherwise.
//! - `expected.ipvsadm`: the `ipvsadm -Sn` rules ([`format::ipvsadm`]).
//! - `expected.bind`: addresses bound on `kube-ipvs0`, one per line.
//! - `expected.healthcheck`: health-check node ports, `port namespace/name localReadyEndpoints`.
//! - `expected.problems`: manifest errors (file names relative to the case), then plan problems.
//! - `expected.counts`: the non-zero metric counts, `name value`.
//! - `expected.nft`: the nftables set elements, as `plan --format nft` prints them
//!   ([`format::nft`]).
//!
//! Every expectation file but `expected.ipvsadm` and `expected.nft` may be left out, which
//! means "nothing": no bound address, no health-check port, no problem, all counts zero.
//! `expected.nft` is checked where present (every Service has set elements, so "none" would
//! be wrong for almost every case).

use kipvs_crds::ProxierConfiguration;
use kipvs_proxier::format;
use kipvs_proxier::model::objects::Interner;
use kipvs_proxier::plan::{self, Plan, PlanInput};
use kipvs_proxier::source::convert;
use kipvs_proxier::source::manifests;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

const NODE_NAME: &str = "test-node";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/plan")
}

/// Every case directory under `dir`, in path order: those with an `input.yaml`, found
/// through step directories.
fn case_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .collect();
    subdirs.sort();
    let mut cases = Vec::new();
    for subdir in subdirs {
        if subdir.join("input.yaml").exists() {
            cases.push(subdir);
        } else {
            let steps = case_dirs(&subdir);
            assert!(
                !steps.is_empty(),
                "{}: neither input.yaml nor steps",
                subdir.display()
            );
            cases.extend(steps);
        }
    }
    cases
}

fn read_optional(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// The addresses of a `# <name>: a, b` comment of the input.
fn addresses_comment(input: &str, name: &str) -> Option<Vec<IpAddr>> {
    let prefix = format!("# {name}:");
    input.lines().find_map(|line| {
        let list = line.strip_prefix(&prefix)?;
        Some(
            list.split(',')
                .map(str::trim)
                .filter(|ip| !ip.is_empty())
                .map(|ip| {
                    ip.parse()
                        .unwrap_or_else(|_| panic!("bad {name} entry {ip:?}"))
                })
                .collect(),
        )
    })
}

/// Everything a case checks, rendered as the expectation files spell it.
struct Outcome {
    ipvsadm: String,
    bind: String,
    healthcheck: String,
    problems: String,
    counts: String,
    nft: String,
}

fn run_case(dir: &Path) -> Outcome {
    let input_path = dir.join("input.yaml");
    let input = std::fs::read_to_string(&input_path).unwrap();
    assert!(
        input.starts_with("# "),
        "{}: must start with a comment naming the upstream test",
        input_path.display()
    );
    let (snapshot, manifest_errors) = manifests::load(&input_path).unwrap();
    let config_path = dir.join("config.yaml");
    let config = if config_path.exists() {
        ProxierConfiguration::load_any(&config_path).unwrap().0
    } else {
        ProxierConfiguration::default()
    };
    // Converted at the store's boundary, as the running proxier does.
    let mut strings = Interner::default();
    let services: Vec<_> = (snapshot.services.iter())
        .map(|service| convert::service(service, &mut strings))
        .collect();
    let slices: Vec<_> = (snapshot.endpoint_slices.iter())
        .map(|slice| convert::slice(slice, &mut strings))
        .collect();
    let node = snapshot.node(NODE_NAME).map(convert::node);
    let other_interface_addresses =
        addresses_comment(&input, "other-interface-addresses").unwrap_or_default();
    let node_ips = plan::node_addresses(
        &addresses_comment(&input, "node-ips").unwrap_or_default(),
        node.as_ref(),
        &other_interface_addresses.iter().copied().collect(),
    );

    let Plan {
        desired,
        problems,
        no_local_endpoints,
        terminating_fallback_services,
    } = plan::plan(&PlanInput {
        services: &services,
        endpoint_slices: &slices,
        node_name: NODE_NAME,
        node: node.as_ref(),
        node_ips: &node_ips,
        other_interface_addresses: &other_interface_addresses,
        config: &config,
    });

    let mut bind = String::new();
    for address in &desired.bind_addresses {
        writeln!(bind, "{address}").unwrap();
    }
    let mut healthcheck = String::new();
    for (port, hc) in &desired.health_check_node_ports {
        let (namespace, name, count) = (&hc.namespace, &hc.name, hc.local_ready_endpoints);
        writeln!(healthcheck, "{port} {namespace}/{name} {count}").unwrap();
    }
    let mut rendered_problems = String::new();
    for mut error in manifest_errors {
        error.file = error.file.strip_prefix(dir).unwrap().to_owned();
        writeln!(rendered_problems, "{error}").unwrap();
    }
    for problem in &problems {
        writeln!(rendered_problems, "{problem}").unwrap();
    }
    let mut counts = String::new();
    for (name, value) in [
        ("no_local_endpoints_internal", no_local_endpoints.internal),
        ("no_local_endpoints_external", no_local_endpoints.external),
        (
            "terminating_fallback_services",
            terminating_fallback_services,
        ),
    ] {
        if value != 0 {
            writeln!(counts, "{name} {value}").unwrap();
        }
    }
    Outcome {
        ipvsadm: format::ipvsadm(&desired),
        bind,
        healthcheck,
        problems: rendered_problems,
        counts,
        nft: format::nft(&desired),
    }
}

#[test]
fn plan_vectors() {
    let root = root();
    let dirs = case_dirs(&root);
    assert!(
        dirs.len() >= 62,
        "expected the full vector set, found {}",
        dirs.len()
    );
    let mut failures = String::new();
    for dir in &dirs {
        let case = dir.strip_prefix(&root).unwrap().display();
        let expected_ipvsadm = dir.join("expected.ipvsadm");
        assert!(
            expected_ipvsadm.exists(),
            "{case}: expected.ipvsadm is missing"
        );
        let outcome = run_case(dir);
        for (file, actual) in [
            ("expected.ipvsadm", &outcome.ipvsadm),
            ("expected.bind", &outcome.bind),
            ("expected.healthcheck", &outcome.healthcheck),
            ("expected.problems", &outcome.problems),
            ("expected.counts", &outcome.counts),
            ("expected.nft", &outcome.nft),
        ] {
            if file == "expected.nft" && !dir.join(file).exists() {
                continue;
            }
            let expected = read_optional(&dir.join(file));
            if &expected != actual {
                writeln!(
                    failures,
                    "── {case}/{file}\n   expected:\n{}   actual:\n{}",
                    indent(&expected),
                    indent(actual)
                )
                .unwrap();
            }
        }
    }
    assert!(failures.is_empty(), "plan vectors differ:\n{failures}");
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("     {line}\n")).collect()
}
