//! What the build and deployment files say about each other.

/// `hack/build-images.sh`'s header names the capabilities the proxier's container gets: only
/// those `config/proxier/daemonset.yaml` grants (issue 23: it listed SYS_MODULE and
/// SYS_RESOURCE, which the DaemonSet does not add).
#[test]
fn the_image_build_names_only_capabilities_the_daemonset_grants() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let read = |path: &str| std::fs::read_to_string(format!("{root}/{path}")).unwrap();
    let daemonset = read("config/proxier/daemonset.yaml");
    let granted: Vec<&str> = daemonset
        .lines()
        .filter_map(|line| line.trim().strip_prefix("add:"))
        .flat_map(|list| list.split(|c: char| !(c.is_ascii_uppercase() || c == '_')))
        .filter(|name| !name.is_empty())
        .collect();
    assert_eq!(
        granted,
        ["NET_ADMIN"],
        "the DaemonSet's capabilities changed"
    );
    let build = read("hack/build-images.sh");
    let header = build.lines().take_while(|line| line.starts_with('#'));
    let named: Vec<&str> = header
        .flat_map(|line| line.split(|c: char| !(c.is_ascii_uppercase() || c == '_')))
        .filter(|word| {
            word.starts_with("NET_") || word.starts_with("SYS_") || word.starts_with("CAP_")
        })
        .collect();
    assert!(!named.is_empty(), "the header names the capabilities");
    for name in named {
        assert!(
            granted.contains(&name),
            "hack/build-images.sh names {name}, which the DaemonSet does not grant"
        );
    }
}
