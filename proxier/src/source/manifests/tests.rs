//! Unit tests of `proxier/src/source/manifests.rs`.

use super::*;

fn texts(input: &str) -> Vec<(usize, &str)> {
    split_documents(input)
        .into_iter()
        .map(|d| (d.first_line, d.text))
        .collect()
}

#[test]
fn splits_documents() {
    assert_eq!(texts("a: 1\n"), [(1, "a: 1\n")]);
    assert_eq!(
        texts("---\na: 1\n---\nb: 2\n"),
        [(1, "\na: 1\n"), (3, "\nb: 2\n")]
    );
    assert_eq!(texts("# top\n---\na: 1\n"), [(2, "\na: 1\n")]);
    assert_eq!(texts("a: 1\n---\n"), [(1, "a: 1\n")]);
    assert_eq!(texts("a: 1\n...\nb: 2\n"), [(1, "a: 1\n"), (3, "b: 2\n")]);
    assert_eq!(texts("--- {a: 1}\n"), [(1, " {a: 1}\n")]);
    assert_eq!(texts("a: |\n  ---x\n"), [(1, "a: |\n  ---x\n")]);
    // Empty documents between markers keep their number.
    assert_eq!(texts("---\n---\nb: 1\n"), [(1, "\n"), (2, "\nb: 1\n")]);
    assert_eq!(texts(""), []);
}

fn load_str(name: &str, text: &str) -> (Snapshot, Vec<ManifestError>) {
    let mut loader = Loader {
        file: PathBuf::from(name),
        ..Loader::default()
    };
    loader.load_text(text);
    (loader.snapshot, loader.errors)
}

#[test]
fn loads_objects_lists_and_skips_other_kinds() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
---
apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-abc, namespace: default, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  endpoints: [{addresses: [10.244.0.5]}]
- apiVersion: v1
  kind: Node
  metadata: {name: test-node}
---
apiVersion: v1
kind: ServiceList
items:
- metadata: {name: dns, namespace: kube-system}
  spec: {clusterIP: 10.96.0.10}
"#;
    let (snapshot, errors) = load_str("a.yaml", yaml);
    assert_eq!(errors, []);
    let names = |metas: Vec<Option<String>>| metas.into_iter().flatten().collect::<Vec<_>>();
    assert_eq!(
        names(
            snapshot
                .services
                .iter()
                .map(|s| s.metadata.name.clone())
                .collect()
        ),
        ["web", "dns"]
    );
    assert_eq!(snapshot.endpoint_slices.len(), 1);
    assert_eq!(snapshot.endpoint_slices[0].address_type, "IPv4");
    assert!(snapshot.node("test-node").is_some());
    assert!(snapshot.node("other").is_none());
}

#[test]
fn bad_documents_and_objects_are_reported_and_skipped() {
    let yaml = r#"# header
---
apiVersion: v1
kind: Service
metadata: {name: good, namespace: default}
---
apiVersion: v1
kind: Service
metadata: {name: bad-ports, namespace: default}
spec: {ports: "eighty"}
---
key: [unclosed
---
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata: {name: old, namespace: default}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: n1}
  status: {addresses: 7}
- just a string
---
metadata: {name: kindless}
---
apiVersion: v1
kind: Service
metadata: {name: also-good, namespace: default}
"#;
    let (snapshot, errors) = load_str("m.yaml", yaml);
    let services: Vec<_> = snapshot
        .services
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(services, ["good", "also-good"]);
    let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(rendered.len(), 6, "{rendered:#?}");
    assert!(
        rendered[0]
            .starts_with("m.yaml: document 2 (Service default/bad-ports): invalid Service: "),
        "{}",
        rendered[0]
    );
    assert!(
        rendered[1].starts_with("m.yaml: document 3: invalid YAML: "),
        "{}",
        rendered[1]
    );
    // Line numbers are the file's, not the document's.
    assert!(rendered[1].contains("line 12"), "{}", rendered[1]);
    assert_eq!(
        rendered[2],
        "m.yaml: document 4 (EndpointSlice default/old): apiVersion \"discovery.k8s.io/v1beta1\" \
             is not supported for EndpointSlice (expected discovery.k8s.io/v1)"
    );
    assert!(
        rendered[3].starts_with("m.yaml: document 5, items[0] (Node n1): invalid Node: "),
        "{}",
        rendered[3]
    );
    assert_eq!(
        rendered[4],
        "m.yaml: document 5, items[1]: not an object (expected a Kubernetes object with \
             apiVersion and kind)"
    );
    assert_eq!(rendered[5], "m.yaml: document 6 (kindless): has no kind");
}

/// A JSON file is read from its text, a YAML one through a parsed tree: the same list
/// (JSON is YAML) gives the same objects and the same errors both ways.
#[test]
fn a_json_list_loads_as_the_same_text_read_as_yaml() {
    let list = r#"{"apiVersion": "v1", "kind": "ServiceList", "items": [
            {"metadata": {"name": "dns", "namespace": "kube-system"},
             "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 53, "protocol": "UDP"}]}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "bad-ports", "namespace": "default"}, "spec": {"ports": "eighty"}},
            "just a string",
            {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1beta1",
             "metadata": {"name": "old", "namespace": "default"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
             "metadata": {"name": "web-abc", "namespace": "default",
                          "labels": {"kubernetes.io/service-name": "web"}},
             "endpoints": [{"addresses": ["10.244.0.5"]}]},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": 7}, "status": 3},
            {"kind": null, "metadata": {"name": "null-kind"}}
        ]}"#;
    let (json, json_errors) = load_str("l.json", list);
    let (yaml, yaml_errors) = load_str("l.yaml", list);
    assert_eq!(json, yaml);
    let names: Vec<_> = json
        .services
        .iter()
        .map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(names, [Some("dns".to_owned())]);
    assert_eq!(json.endpoint_slices.len(), 1);
    assert_eq!(json.nodes.len(), 1);
    // The deserializers word their messages differently; what failed where is the same.
    let what = |errors: &[ManifestError]| -> Vec<_> {
        errors
            .iter()
            .map(|e| {
                let head = e.message.split(':').next().unwrap_or_default().to_owned();
                (e.document, e.item, e.object.clone(), head)
            })
            .collect()
    };
    assert_eq!(what(&json_errors), what(&yaml_errors));
    assert_eq!(
        what(&json_errors),
        [
            (
                Some(1),
                Some(1),
                Some("Service default/bad-ports".to_owned()),
                "invalid Service".to_owned()
            ),
            (
                Some(1),
                Some(2),
                None,
                "not an object (expected a Kubernetes object with apiVersion and kind)".to_owned()
            ),
            (
                Some(1),
                Some(3),
                Some("EndpointSlice default/old".to_owned()),
                "apiVersion \"discovery.k8s.io/v1beta1\" is not supported for EndpointSlice \
                     (expected discovery.k8s.io/v1)"
                    .to_owned()
            ),
            (
                Some(1),
                Some(7),
                Some("Node".to_owned()),
                "invalid Node".to_owned()
            ),
            (
                Some(1),
                Some(8),
                Some("null-kind".to_owned()),
                "has no kind".to_owned()
            ),
        ]
    );
    // JSON allows a duplicate key (YAML does not): the last one wins, as in the old
    // parsed tree, for an item and for a whole document.
    let twice = r#"{"apiVersion": "v1", "kind": "ConfigMap", "kind": "Service",
            "metadata": {"name": "twice", "namespace": "default"}}"#;
    let (items, errors) = load_str(
        "d.json",
        &format!(r#"{{"kind": "List", "items": [{twice}]}}"#),
    );
    assert_eq!((items.services.len(), errors), (1, vec![]));
    let (one, errors) = load_str("d.json", twice);
    assert_eq!((one.services.len(), errors), (1, vec![]));
    // A list whose items are not an array is an object of a kind the proxier ignores.
    let (odd, errors) = load_str(
        "i.json",
        r#"{"apiVersion": "v1", "kind": "ServiceList", "items": "no"}"#,
    );
    assert_eq!((odd, errors), (Snapshot::default(), vec![]));
    // A lone object, and a null document (nothing).
    let (one, errors) = load_str(
        "o.json",
        r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}}"#,
    );
    assert_eq!((one.nodes.len(), errors), (1, vec![]));
    let (none, errors) = load_str("n.json", " null ");
    assert_eq!((none, errors), (Snapshot::default(), vec![]));
}

/// A JSON file that goes bad keeps its last good content; a removed one takes its objects
/// with it; an unchanged directory is not loaded again.
#[test]
fn a_json_file_that_goes_bad_keeps_its_last_good_content() {
    let dir = std::env::temp_dir().join(format!("kipvs-last-good-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let service = |name: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Service", "metadata": {{"name": "{name}",
                "namespace": "default"}}, "spec": {{"clusterIP": "10.96.0.9", "ports": [{{"port": 80}}]}}}}"#
        )
    };
    std::fs::write(dir.join("a.json"), service("a")).unwrap();
    std::fs::write(dir.join("b.yaml"), service("b")).unwrap();
    let source = ManifestsSource {
        path: dir.clone(),
        node_name: "n".into(),
        node_configs: None,
    };
    let handle = SourceHandle::default();
    let names = || -> Vec<String> {
        let store = handle.read();
        store.services().map(|(key, _)| key.1.clone()).collect()
    };
    let seen = source.load_into(&handle, None).unwrap();
    assert_eq!(names(), ["a", "b"]);
    assert!(source.load_into(&handle, seen.as_ref()).unwrap().is_none());
    // Half written: the old content stays, and stays the last good one.
    std::fs::write(dir.join("a.json"), &service("a")[..40]).unwrap();
    let seen = source.load_into(&handle, seen.as_ref()).unwrap();
    assert_eq!(names(), ["a", "b"]);
    std::fs::write(dir.join("a.json"), "{}").unwrap();
    let seen = source.load_into(&handle, seen.as_ref()).unwrap();
    assert_eq!(names(), ["a", "b"]);
    std::fs::write(dir.join("a.json"), service("c")).unwrap();
    let seen = source.load_into(&handle, seen.as_ref()).unwrap();
    assert_eq!(names(), ["b", "c"]);
    std::fs::remove_file(dir.join("a.json")).unwrap();
    source.load_into(&handle, seen.as_ref()).unwrap().unwrap();
    assert_eq!(names(), ["b"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 23: a manifests file cut mid-write (a writer that truncates, then writes) loaded
/// as valid: cut after an EndpointSlice's `kind` (no metadata) or inside its metadata (no
/// name), the nameless slice replaced the real one and its real servers went; cut to 0
/// bytes, the file's Services went. Each is an invalid file: its last good content stays.
#[test]
fn a_file_cut_mid_write_keeps_its_last_good_content() {
    let dir = std::env::temp_dir().join(format!("kipvs-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let full = include_str!("../../../../tests/manifests/cluster/web.yaml");
    let file = dir.join("web.yaml");
    std::fs::write(&file, full).unwrap();
    let source = ManifestsSource {
        path: dir.clone(),
        node_name: "n".into(),
        node_configs: None,
    };
    let handle = SourceHandle::default();
    let state = || {
        let store = handle.read();
        let web = ("default".to_owned(), "web".to_owned());
        let services: Vec<String> = store.services().map(|(key, _)| key.1.clone()).collect();
        let slices: Vec<(String, usize)> = store
            .slices_of(&web)
            .into_iter()
            .map(|s| (s.name.to_string(), s.endpoints.len()))
            .collect();
        (services, slices)
    };
    let mut seen = source.load_into(&handle, None).unwrap();
    let good = state();
    assert_eq!(good.0, ["web"]);
    assert_eq!(good.1, [("web-r7k2p".to_owned(), 3)]);
    let slice = full.find("kind: EndpointSlice\n").unwrap();
    let name = full[slice..].find("  name: web-r7k2p").unwrap() + slice;
    for cut in [0, slice + "kind: EndpointSlice\n".len(), name] {
        std::fs::write(&file, &full[..cut]).unwrap();
        seen = source.load_into(&handle, seen.as_ref()).unwrap();
        assert_eq!(state(), good, "cut at {cut} bytes");
        let (_, errors) = parse_file(&file, &full.as_bytes()[..cut]);
        assert_eq!(errors.len(), 1, "cut at {cut} bytes: {errors:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Wherever a file is cut (at a line's end, where a YAML document stays well-formed), no
/// object without a name is loaded from it.
#[test]
fn no_cut_of_a_manifests_file_loads_an_object_without_a_name() {
    for full in [
        include_str!("../../../../tests/manifests/cluster/web.yaml"),
        include_str!("../../../../tests/manifests/cluster/node.yaml"),
        include_str!("../../../../tests/manifests/cluster/kube-dns.yaml"),
    ] {
        for (cut, _) in full.match_indices('\n') {
            let (snapshot, _) = parse_file(Path::new("cut.yaml"), &full.as_bytes()[..=cut]);
            let names = snapshot
                .services
                .iter()
                .map(|o| &o.metadata)
                .chain(snapshot.endpoint_slices.iter().map(|o| &o.metadata))
                .chain(snapshot.nodes.iter().map(|o| &o.metadata))
                .map(|m| m.name.as_deref().unwrap_or_default());
            for name in names {
                assert!(!name.is_empty(), "cut after {} bytes", cut + 1);
            }
        }
    }
}

#[test]
fn json_and_directories() {
    let dir = std::env::temp_dir().join(format!("kipvs-manifests-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(
        dir.join("b.json"),
        r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node"}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("a.yml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: first}\n",
    )
    .unwrap();
    std::fs::write(dir.join("c.json"), "{ nope").unwrap();
    std::fs::write(dir.join("notes.txt"), "kind: Node").unwrap();
    std::fs::write(dir.join(".hidden.yaml"), "kind: Node").unwrap();
    std::fs::write(
        dir.join("sub/d.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: d}\n",
    )
    .unwrap();
    std::fs::write(dir.join("latin1.yaml"), b"kind: \xe9\n").unwrap();

    let (snapshot, errors) = load(&dir).unwrap();
    let nodes: Vec<_> = snapshot
        .nodes
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(nodes, ["first", "test-node"]);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_eq!(errors[0].file, dir.join("c.json"));
    assert_eq!(errors[0].document, Some(1));
    assert!(
        errors[0].message.starts_with("invalid JSON: "),
        "{}",
        errors[0]
    );
    assert_eq!(errors[1].file, dir.join("latin1.yaml"));
    assert_eq!(errors[1].document, None);

    let (single, errors) = load(&dir.join("a.yml")).unwrap();
    assert_eq!(single.nodes.len(), 1);
    assert!(errors.is_empty());

    let missing = load(&dir.join("missing")).unwrap_err();
    assert!(missing.to_string().contains("missing"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}
