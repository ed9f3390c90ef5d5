//! Unit tests of `crds/src/config.rs`.

use super::*;

#[test]
fn service_proxy_is_written_only_when_not_the_default() {
    let default = serde_json::to_value(ProxierConfiguration::default()).unwrap();
    assert!(default.get("serviceProxy").is_none(), "{default}");
    let config = ProxierConfiguration::from_yaml_str("serviceProxy: kube-proxy\n").unwrap();
    assert_eq!(config.service_proxy, ServiceProxy::KubeProxy);
    assert_eq!(
        serde_json::to_value(&config).unwrap()["serviceProxy"],
        ServiceProxy::KubeProxy.as_str()
    );
    assert_ne!(
        crate::revision::config_revision(&config),
        crate::revision::config_revision(&ProxierConfiguration::default())
    );
    assert!(ProxierConfiguration::from_yaml_str("serviceProxy: cilium\n").is_err());
    // A NodeProxyConfig's spec.config: known, not ignored.
    let value = serde_json::json!({"serviceProxy": "kube-proxy"});
    let (config, ignored) = ProxierConfiguration::from_value_ignoring_unknown(&value).unwrap();
    assert_eq!(config.service_proxy, ServiceProxy::KubeProxy);
    assert!(ignored.is_empty(), "{ignored:?}");
}

#[test]
fn out_of_range_timeouts_are_rejected_not_wrapped() {
    let mut config = ProxierConfiguration::default();
    config.ipvs.tcp_timeout = Duration::from_secs(2_000_000 * 3600);
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("ipvs.tcpTimeout"), "{err}");
    config.ipvs.tcp_timeout = Duration::from_secs(u64::from(u32::MAX));
    config.ipvs.udp_timeout = Duration::from_secs(300);
    let secs = config.ipvs.timeout_seconds().unwrap();
    assert_eq!((secs.tcp, secs.tcp_fin, secs.udp), (u32::MAX, 0, 300));
}

#[test]
fn defaults_are_kube_proxys() {
    let config = ProxierConfiguration::default();
    assert!(Gate::ALL.into_iter().all(|g| config.gate_enabled(g)));
    assert_eq!(config.ipvs.effective_scheduler(), "rr");
    assert_eq!(config.ipvs.sync_period, Duration::from_secs(30));
    assert_eq!(config.ipvs.min_sync_period, Duration::ZERO);
    assert!(!config.ipvs.strict_arp);
    assert_eq!(config.ipvs.tcp_timeout, Duration::ZERO);
    assert_eq!(config.ipvs.tcp_fin_timeout, Duration::ZERO);
    assert_eq!(config.ipvs.udp_timeout, Duration::ZERO);
    assert!(config.ipvs.exclude_cidrs.is_empty());
    assert!(config.node_port_addresses.is_empty());
    assert_eq!(
        config.healthz_socket_addr().unwrap(),
        "0.0.0.0:10256".parse().unwrap()
    );
    assert_eq!(
        config.metrics_socket_addr().unwrap(),
        "127.0.0.1:10249".parse().unwrap()
    );
    config.validate().unwrap();
}

#[test]
fn node_port_range_is_parsed_and_validated() {
    assert_eq!(
        ProxierConfiguration::default()
            .parsed_node_port_range()
            .unwrap(),
        30000..=32767
    );
    let config = ProxierConfiguration::from_yaml_str("nodePortRange: 20000-22767\n").unwrap();
    assert_eq!(config.parsed_node_port_range().unwrap(), 20000..=22767);
    assert_eq!(
        ProxierConfiguration::from_yaml_str("nodePortRange: \" 80 - 80 \"\n")
            .unwrap()
            .parsed_node_port_range()
            .unwrap(),
        80..=80
    );
    for bad in ["30000", "0-100", "200-100", "1-65536", "a-b", ""] {
        let yaml = format!("nodePortRange: \"{bad}\"\n");
        let err = ProxierConfiguration::from_yaml_str(&yaml).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { field, .. } if field == "nodePortRange"),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn empty_and_partial_documents_take_defaults() {
    let default = ProxierConfiguration::default();
    assert_eq!(ProxierConfiguration::from_yaml_str("").unwrap(), default);
    assert_eq!(
        ProxierConfiguration::from_yaml_str("# nothing\n").unwrap(),
        default
    );
    assert_eq!(ProxierConfiguration::from_yaml_str("{}").unwrap(), default);
    let partial = ProxierConfiguration::from_yaml_str("ipvs:\n  scheduler: wlc\n").unwrap();
    assert_eq!(partial.ipvs.scheduler, "wlc");
    assert_eq!(partial.ipvs.sync_period, Duration::from_secs(30));
    assert_eq!(partial.healthz_bind_address, default.healthz_bind_address);
}

#[test]
fn full_file() {
    let yaml = r#"
featureGates:
  ProxyTerminatingEndpoints: false
  LoadBalancerIPMode: true
  KubeProxyDrainingTerminatingNodes: false
ipvs:
  scheduler: mh
  syncPeriod: 1m30s
  minSyncPeriod: 500ms
  strictARP: true
  tcpTimeout: 15m
  tcpFinTimeout: 2m
  udpTimeout: 5m
  excludeCIDRs: ["10.200.0.0/16", "fd00:200::/64"]
nodePortAddresses: ["192.168.0.0/16", "fd00::/8"]
healthzBindAddress: "[::]:10256"
metricsBindAddress: 0.0.0.0:9100
"#;
    let config = ProxierConfiguration::from_yaml_str(yaml).unwrap();
    assert!(!config.gate_enabled(Gate::ProxyTerminatingEndpoints));
    assert!(config.gate_enabled(Gate::LoadBalancerIPMode));
    assert!(!config.gate_enabled(Gate::KubeProxyDrainingTerminatingNodes));
    assert_eq!(config.ipvs.effective_scheduler(), "mh");
    assert_eq!(config.ipvs.sync_period, Duration::from_secs(90));
    assert_eq!(config.ipvs.min_sync_period, Duration::from_millis(500));
    assert!(config.ipvs.strict_arp);
    assert_eq!(config.ipvs.tcp_timeout, Duration::from_secs(900));
    assert_eq!(config.ipvs.tcp_fin_timeout, Duration::from_secs(120));
    assert_eq!(config.ipvs.udp_timeout, Duration::from_secs(300));
    assert_eq!(
        config.ipvs.parsed_exclude_cidrs().unwrap(),
        vec![
            "10.200.0.0/16".parse::<IpNet>().unwrap(),
            "fd00:200::/64".parse().unwrap()
        ]
    );
    assert_eq!(
        config.parsed_node_port_addresses().unwrap(),
        vec![
            NodePortAddress::Cidr("192.168.0.0/16".parse().unwrap()),
            NodePortAddress::Cidr("fd00::/8".parse().unwrap())
        ]
    );
    assert_eq!(
        config.healthz_socket_addr().unwrap(),
        "[::]:10256".parse().unwrap()
    );
    assert_eq!(
        config.metrics_socket_addr().unwrap(),
        "0.0.0.0:9100".parse().unwrap()
    );

    // Serializing gives Go durations back, and the result reads back identically.
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["ipvs"]["syncPeriod"], "1m30s");
    assert_eq!(json["ipvs"]["minSyncPeriod"], "500ms");
    assert_eq!(json["ipvs"]["strictARP"], true);
    assert_eq!(json["ipvs"]["excludeCIDRs"][0], "10.200.0.0/16");
    let back: ProxierConfiguration = serde_json::from_value(json).unwrap();
    assert_eq!(back, config);
}

#[test]
fn primary_node_port_addresses() {
    let config = ProxierConfiguration::from_yaml_str("nodePortAddresses: [primary]\n").unwrap();
    assert_eq!(
        config.parsed_node_port_addresses().unwrap(),
        vec![NodePortAddress::Primary]
    );
    let err = ProxierConfiguration::from_yaml_str("nodePortAddresses: [primary, 10.0.0.0/8]\n")
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("nodePortAddresses[0]: \"primary\" must be the only entry"),
        "{err}"
    );
}

#[test]
fn embedded_form_of_a_newer_version_is_decoded_without_what_this_one_lacks() {
    let value = serde_json::json!({
        "ipvs": {"scheduler": "wlc", "newSetting": 3, "newBlock": {"a": 1}},
        "featureGates": {"LoadBalancerIPMode": false, "FutureGate": true},
        "futureTopLevel": "x",
        "nftables": {"masqueradeAll": true, "newFlag": true}
    });
    let (config, ignored) = ProxierConfiguration::from_value_ignoring_unknown(&value).unwrap();
    assert_eq!(
        ignored,
        [
            "featureGates.FutureGate",
            "futureTopLevel",
            "ipvs.newBlock",
            "ipvs.newSetting",
            "nftables.newFlag"
        ]
    );
    assert_eq!(config.ipvs.scheduler, "wlc");
    assert!(config.nftables.masquerade_all);
    assert!(!config.gate_enabled(Gate::LoadBalancerIPMode));
    // What this version knows is still checked.
    let bad = serde_json::json!({"ipvs": {"syncPeriod": 5, "newSetting": 1}});
    assert!(matches!(
        ProxierConfiguration::from_value_ignoring_unknown(&bad),
        Err(ConfigError::Yaml(_))
    ));
    let (config, ignored) =
        ProxierConfiguration::from_value_ignoring_unknown(&serde_json::Value::Null).unwrap();
    assert_eq!(
        (config, ignored.len()),
        (ProxierConfiguration::default(), 0)
    );
}

#[test]
fn unknown_field_is_named() {
    let err = ProxierConfiguration::from_yaml_str("ipvs:\n  schedular: rr\n").unwrap_err();
    assert!(matches!(err, ConfigError::Yaml(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("schedular"), "{message}");
    assert!(message.contains("scheduler"), "{message}");

    let err = ProxierConfiguration::from_yaml_str("mode: ipvs\n").unwrap_err();
    assert!(err.to_string().contains("mode"), "{err}");
}

#[test]
fn unknown_gate_is_named_with_known_ones() {
    let err = ProxierConfiguration::from_yaml_str("featureGates:\n  TopologyAwareHints: true\n")
        .unwrap_err();
    assert!(matches!(err, ConfigError::UnknownGate(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "featureGates: unknown feature gate \"TopologyAwareHints\" (known gates: \
             ProxyTerminatingEndpoints, LoadBalancerIPMode, KubeProxyDrainingTerminatingNodes)"
    );
}

#[test]
fn bad_durations_are_rejected() {
    for (yaml, needle) in [
        ("ipvs:\n  syncPeriod: 30\n", "missing unit"),
        ("ipvs:\n  syncPeriod: 3d\n", "unknown unit \"d\""),
        ("ipvs:\n  tcpTimeout: -5s\n", "negative"),
        ("ipvs:\n  udpTimeout: soon\n", "invalid duration \"soon\""),
    ] {
        let err = ProxierConfiguration::from_yaml_str(yaml).unwrap_err();
        assert!(matches!(err, ConfigError::Yaml(_)), "{yaml}: {err:?}");
        assert!(err.to_string().contains(needle), "{yaml}: {err}");
    }
}

#[test]
fn validation_names_the_field() {
    for (yaml, expected) in [
        (
            "ipvs:\n  syncPeriod: 0s\n",
            "ipvs.syncPeriod: must be greater than 0",
        ),
        (
            "ipvs:\n  syncPeriod: 10s\n  minSyncPeriod: 1m\n",
            "ipvs.minSyncPeriod: 1m0s must not be greater than ipvs.syncPeriod (10s)",
        ),
        (
            "ipvs:\n  excludeCIDRs: [10.0.0.0/8, 10.0.0.1]\n",
            "ipvs.excludeCIDRs[1]: \"10.0.0.1\" is not a CIDR",
        ),
        (
            "nodePortAddresses: [eth0]\n",
            "nodePortAddresses[0]: \"eth0\" is not a CIDR",
        ),
        (
            "clusterCIDR: \"10.244.0.0/16, fd00:10:244::/56,pods\"\n",
            "clusterCIDR[2]: \"pods\" is not a CIDR",
        ),
        (
            "healthzBindAddress: 0.0.0.0\n",
            "healthzBindAddress: \"0.0.0.0\" is not an ip:port address",
        ),
        (
            "metricsBindAddress: localhost:10249\n",
            "metricsBindAddress: \"localhost:10249\" is not an ip:port address",
        ),
    ] {
        let err = ProxierConfiguration::from_yaml_str(yaml).unwrap_err();
        assert!(
            matches!(err, ConfigError::Invalid { .. }),
            "{yaml}: {err:?}"
        );
        assert!(err.to_string().starts_with(expected), "{yaml}: {err}");
    }
}

#[test]
fn load_any_names_the_file() {
    let dir = std::env::temp_dir().join(format!("kipvs-crds-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.yaml");
    std::fs::write(&good, "ipvs:\n  scheduler: lc\n").unwrap();
    assert_eq!(
        ProxierConfiguration::load_any(&good)
            .unwrap()
            .0
            .ipvs
            .scheduler,
        "lc"
    );

    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "ipvs:\n  bogus: 1\n").unwrap();
    let err = ProxierConfiguration::load_any(&bad).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{}: ", bad.display())),
        "{message}"
    );
    assert!(message.contains("bogus"), "{message}");

    let missing = dir.join("missing.yaml");
    let err = ProxierConfiguration::load_any(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("missing.yaml"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The CRD-facing schema must stay structural: every property typed, no `oneOf`/`anyOf`
/// (see rust-dependencies.md, pitfall 3).
#[test]
fn schema_is_structural() {
    let settings = schemars::generate::SchemaSettings::openapi3().with(|s| {
        s.inline_subschemas = true;
    });
    let schema = settings
        .into_generator()
        .into_root_schema_for::<ProxierConfiguration>();
    let value = serde_json::to_value(&schema).unwrap();

    fn check(path: &str, value: &serde_json::Value) {
        let object = value.as_object().expect("schema is an object");
        for forbidden in ["oneOf", "anyOf", "allOf", "$ref"] {
            assert!(
                !object.contains_key(forbidden),
                "{path} uses {forbidden}: {value}"
            );
        }
        assert!(object.contains_key("type"), "{path} has no type: {value}");
        if let Some(properties) = object.get("properties").and_then(|p| p.as_object()) {
            for (name, property) in properties {
                check(&format!("{path}.{name}"), property);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub) = object.get(key).filter(|s| s.is_object()) {
                check(&format!("{path}[{key}]"), sub);
            }
        }
    }
    check("ProxierConfiguration", &value);
    for gate in Gate::ALL {
        assert_eq!(
            value["properties"]["featureGates"]["properties"][gate.name()]["type"],
            "boolean"
        );
    }
    assert_eq!(
        value["properties"]["ipvs"]["properties"]["syncPeriod"]["type"],
        "string"
    );
}
