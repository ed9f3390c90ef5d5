//! Unit tests of `crds/src/kubeproxy.rs`.

use super::*;
use crate::LocalMode;

/// `config.conf` of the `kube-proxy` ConfigMap as `kubeadm init` (v1.31) writes it, with
/// the pod CIDR of a typical `--pod-network-cidr`.
const KUBEADM_CONFIG_CONF: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

/// The same file as an IPVS cluster runs it: MetalLB's strictARP, an explicit scheduler
/// and timeouts, metrics for Prometheus, nodePortAddresses, feature gates.
fn ipvs_config_conf() -> String {
    KUBEADM_CONFIG_CONF
            .replace("mode: \"\"", "mode: ipvs")
            .replace(
                "ipvs:\n  excludeCIDRs: null\n  minSyncPeriod: 0s\n  scheduler: \"\"\n  \
                 strictARP: false\n  syncPeriod: 0s\n  tcpFinTimeout: 0s\n  tcpTimeout: 0s\n  \
                 udpTimeout: 0s\n",
                "ipvs:\n  excludeCIDRs: [10.200.0.0/16]\n  minSyncPeriod: 1s\n  scheduler: lc\n  \
                 strictARP: true\n  syncPeriod: 1m0s\n  tcpFinTimeout: 2m0s\n  tcpTimeout: 15m0s\n  \
                 udpTimeout: 5m0s\n",
            )
            .replace("metricsBindAddress: \"\"", "metricsBindAddress: 0.0.0.0")
            .replace("nodePortAddresses: null", "nodePortAddresses: [192.168.0.0/16]")
            .replace(
                "enableProfiling: false\n",
                "enableProfiling: false\nfeatureGates:\n  LoadBalancerIPMode: false\n  \
                 NFTablesProxyMode: true\n",
            )
            .replace("masqueradeAll: false\n  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs",
                     "masqueradeAll: true\n  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs")
}

#[test]
fn kubeadm_default_file_gives_kube_proxys_defaults() {
    let (config, warnings) = ProxierConfiguration::from_any_yaml_str(KUBEADM_CONFIG_CONF).unwrap();
    let expected = ProxierConfiguration {
        cluster_cidr: "10.244.0.0/16".into(),
        ..ProxierConfiguration::default()
    };
    assert_eq!(config, expected);
    assert_eq!(
        warnings,
        [
            "mode is \"\" (kube-proxy's default, iptables on Linux); kipvs programs IPVS",
            "clientConnection.kubeconfig is ignored by kipvs; kipvs uses --kubeconfig, else \
                 the in-cluster configuration",
        ]
    );
}

#[test]
fn ipvs_file_maps_every_ipvs_field() {
    let (config, warnings) = ProxierConfiguration::from_any_yaml_str(&ipvs_config_conf()).unwrap();
    assert_eq!(config.ipvs.scheduler, "lc");
    assert_eq!(config.ipvs.sync_period, Duration::from_secs(60));
    assert_eq!(config.ipvs.min_sync_period, Duration::from_secs(1));
    assert!(config.ipvs.strict_arp);
    assert_eq!(config.ipvs.tcp_timeout, Duration::from_secs(900));
    assert_eq!(config.ipvs.tcp_fin_timeout, Duration::from_secs(120));
    assert_eq!(config.ipvs.udp_timeout, Duration::from_secs(300));
    assert_eq!(config.ipvs.exclude_cidrs, ["10.200.0.0/16"]);
    assert_eq!(
        config.ipvs.drain_timeout,
        IpvsConfiguration::default().drain_timeout
    );
    assert_eq!(config.node_port_addresses, ["192.168.0.0/16"]);
    assert_eq!(config.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(config.metrics_bind_address, "0.0.0.0:10249");
    assert!(!config.gate_enabled(Gate::LoadBalancerIPMode));
    assert!(config.gate_enabled(Gate::ProxyTerminatingEndpoints));
    assert_eq!(config.cluster_cidr, "10.244.0.0/16");
    assert!(
        config.nftables.masquerade_all,
        "from iptables.masqueradeAll"
    );
    assert_eq!(
        warnings,
        [
            "featureGates.NFTablesProxyMode is not a kipvs feature gate (known: \
                 ProxyTerminatingEndpoints, LoadBalancerIPMode, KubeProxyDrainingTerminatingNodes); \
                 ignored",
            "clientConnection.kubeconfig is ignored by kipvs; kipvs uses --kubeconfig, else \
                 the in-cluster configuration",
        ]
    );
}

/// Issue 34: the `conntrack` section was dropped with a warning. `null` takes kube-proxy's
/// defaults, zero leaves the kernel's value, the rest is taken as written.
#[test]
fn conntrack_section_is_honoured() {
    let (config, _) = ProxierConfiguration::from_any_yaml_str(KUBEADM_CONFIG_CONF).unwrap();
    assert_eq!(config.conntrack.max(4), Some(131_072), "min wins on 4 CPUs");
    assert_eq!(config.conntrack.max(8), Some(262_144), "32768 x 8");
    assert_eq!(
        config.conntrack.tcp_established_timeout,
        Duration::from_secs(86_400)
    );
    assert_eq!(
        config.conntrack.tcp_close_wait_timeout,
        Duration::from_secs(3600)
    );

    let text = KUBEADM_CONFIG_CONF.replace(
        "conntrack:\n  maxPerCore: null\n  min: null\n  tcpBeLiberal: false\n  \
             tcpCloseWaitTimeout: null\n  tcpEstablishedTimeout: null\n  udpStreamTimeout: 0s\n  \
             udpTimeout: 0s\n",
        "conntrack:\n  maxPerCore: 0\n  min: 1000\n  tcpBeLiberal: true\n  \
             tcpCloseWaitTimeout: 0s\n  tcpEstablishedTimeout: 2h\n  udpStreamTimeout: 2m\n  \
             udpTimeout: 45s\n  futureKnob: 3\n",
    );
    let (config, warnings) = ProxierConfiguration::from_any_yaml_str(&text).unwrap();
    let conntrack = &config.conntrack;
    assert_eq!(conntrack.max(64), None, "maxPerCore 0 leaves the limit");
    assert_eq!(conntrack.min, 1000);
    assert!(conntrack.tcp_be_liberal);
    assert_eq!(conntrack.tcp_close_wait_timeout, Duration::ZERO);
    assert_eq!(conntrack.tcp_established_timeout, Duration::from_secs(7200));
    assert_eq!(conntrack.udp_stream_timeout, Duration::from_secs(120));
    assert_eq!(conntrack.udp_timeout, Duration::from_secs(45));
    assert!(
        warnings
            .iter()
            .all(|w| !w.starts_with("conntrack.") || w.starts_with("conntrack.futureKnob is not")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("conntrack.futureKnob"))
    );

    for (body, expected) in [
        (
            "conntrack: {maxPerCore: -1}\n",
            "conntrack.maxPerCore: -1 must be between 0",
        ),
        (
            "conntrack: {tcpEstablishedTimeout: 5}\n",
            "conntrack.tcpEstablishedTimeout: 5 is",
        ),
    ] {
        let text = format!("apiVersion: {API_VERSION}\nkind: {KIND}\n{body}");
        let err = ProxierConfiguration::from_any_yaml_str(&text)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(expected), "{body}: {err}");
    }
}

/// Issue 34: `detectLocalMode` and `detectLocal` were ignored; they are read, and checked
/// as kube-proxy checks them.
#[test]
fn detect_local_mode_is_read() {
    let with = |mode: &str, bridge: &str, prefix: &str| {
        KUBEADM_CONFIG_CONF
            .replace(
                "detectLocalMode: \"\"",
                &format!("detectLocalMode: \"{mode}\""),
            )
            .replace(
                "bridgeInterface: \"\"",
                &format!("bridgeInterface: \"{bridge}\""),
            )
            .replace(
                "interfaceNamePrefix: \"\"",
                &format!("interfaceNamePrefix: \"{prefix}\""),
            )
    };
    for (mode, bridge, prefix, expected) in [
        ("", "", "", LocalMode::ClusterCidr),
        ("ClusterCIDR", "", "", LocalMode::ClusterCidr),
        ("NodeCIDR", "", "", LocalMode::NodeCidr),
        (
            "BridgeInterface",
            "cbr0",
            "",
            LocalMode::BridgeInterface("cbr0".into()),
        ),
        (
            "InterfaceNamePrefix",
            "",
            "veth",
            LocalMode::InterfaceNamePrefix("veth".into()),
        ),
    ] {
        let (config, warnings) =
            ProxierConfiguration::from_any_yaml_str(&with(mode, bridge, prefix)).unwrap();
        assert_eq!(config.parsed_local_mode().unwrap(), expected, "{mode}");
        assert!(
            warnings.iter().all(|w| !w.starts_with("detectLocal")),
            "{warnings:?}"
        );
    }
    for (mode, bridge, prefix, expected) in [
        (
            "BridgeInterface",
            "",
            "veth",
            "detectLocal.bridgeInterface: \"\" is not",
        ),
        (
            "InterfaceNamePrefix",
            "cbr0",
            "",
            "detectLocal.interfaceNamePrefix: \"\" is not",
        ),
        (
            "InterfaceNamePrefix",
            "",
            "a/b",
            "detectLocal.interfaceNamePrefix: \"a/b\" is not",
        ),
        (
            "PodCIDR",
            "",
            "",
            "detectLocalMode: \"PodCIDR\" is not one of ClusterCIDR, NodeCIDR, \
              BridgeInterface, InterfaceNamePrefix",
        ),
    ] {
        let err = ProxierConfiguration::from_any_yaml_str(&with(mode, bridge, prefix))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(expected), "{mode}: {err}");
    }
}

/// Issue 33: what of kube-proxy's configuration a kipvs configuration does not carry over
/// is named, field by field; spellings of one meaning (an empty scheduler and `rr`, an empty
/// detectLocalMode and `ClusterCIDR`, an unset gate and a gate at its default) are equal.
#[test]
fn differences_name_what_is_not_carried_over() {
    let (kube_proxy, _) = ProxierConfiguration::from_any_yaml_str(&ipvs_config_conf()).unwrap();
    assert!(differences(&kube_proxy, &kube_proxy).is_empty());
    let mut kipvs = kube_proxy.clone();
    kipvs.ipvs.drain_timeout = Duration::from_secs(60);
    kipvs.node_port_range = "20000-22767".into();
    kipvs.detect_local_mode = "ClusterCIDR".into();
    assert!(
        differences(&kube_proxy, &kipvs).is_empty(),
        "kipvs-only settings"
    );
    assert_eq!(
        differences(
            &ProxierConfiguration::default(),
            &ProxierConfiguration::from_yaml_str(
                "ipvs: {scheduler: rr}\nfeatureGates: {LoadBalancerIPMode: true}\n"
            )
            .unwrap()
        ),
        Vec::<String>::new()
    );
    let kipvs = ProxierConfiguration::default();
    assert_eq!(
        differences(&kube_proxy, &kipvs),
        [
            "clusterCIDR: kube-proxy \"10.244.0.0/16\", kipvs \"\"",
            "featureGates.LoadBalancerIPMode: kube-proxy false, kipvs true",
            "ipvs.excludeCIDRs: kube-proxy [\"10.200.0.0/16\"], kipvs []",
            "ipvs.minSyncPeriod: kube-proxy \"1s\", kipvs \"0s\"",
            "ipvs.scheduler: kube-proxy \"lc\", kipvs \"rr\"",
            "ipvs.strictARP: kube-proxy true, kipvs false",
            "ipvs.syncPeriod: kube-proxy \"1m0s\", kipvs \"30s\"",
            "ipvs.tcpFinTimeout: kube-proxy \"2m0s\", kipvs \"0s\"",
            "ipvs.tcpTimeout: kube-proxy \"15m0s\", kipvs \"0s\"",
            "ipvs.udpTimeout: kube-proxy \"5m0s\", kipvs \"0s\"",
            "metricsBindAddress: kube-proxy \"0.0.0.0:10249\", kipvs \"127.0.0.1:10249\"",
            "nftables.masqueradeAll: kube-proxy true, kipvs false",
            "nodePortAddresses: kube-proxy [\"192.168.0.0/16\"], kipvs []",
        ]
    );
}

#[test]
fn other_modes_are_errors() {
    for mode in ["iptables", "nftables", "kernelspace", "userspace"] {
        let text = KUBEADM_CONFIG_CONF.replace("mode: \"\"", &format!("mode: {mode}"));
        let err = ProxierConfiguration::from_any_yaml_str(&text).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "mode: \"{mode}\": kipvs is an IPVS service proxy and replaces kube-proxy's \
                     \"ipvs\" mode only; set mode to \"ipvs\" (or leave it empty)"
            )
        );
    }
}

#[test]
fn kind_and_api_version_are_checked() {
    for (text, expected) in [
        (
            "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
            "apiVersion: \"kubeproxy.config.k8s.io/v1alpha2\" is not supported for \
                 KubeProxyConfiguration: expected kubeproxy.config.k8s.io/v1alpha1",
        ),
        (
            "kind: KubeProxyConfiguration\n",
            "apiVersion: \"\" is not supported for KubeProxyConfiguration: expected \
                 kubeproxy.config.k8s.io/v1alpha1",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\ndata: {}\n",
            "kind: \"ConfigMap\" is not supported: expected ProxierConfiguration \
                 (kipvs.io/v1alpha1) or KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1)",
        ),
        (
            "apiVersion: kipvs.io/v1beta1\nkind: ProxierConfiguration\n",
            "kind: \"ProxierConfiguration\" with apiVersion \"kipvs.io/v1beta1\" is not \
                 supported: expected kind ProxierConfiguration with apiVersion kipvs.io/v1alpha1 \
                 (or neither, for a kipvs file), or kind KubeProxyConfiguration \
                 (kubeproxy.config.k8s.io/v1alpha1)",
        ),
        (
            "apiVersion: kipvs.io/v1alpha1\n",
            "kind: \"\" with apiVersion \"kipvs.io/v1alpha1\" is not supported: expected \
                 kind ProxierConfiguration with apiVersion kipvs.io/v1alpha1 (or neither, for a \
                 kipvs file), or kind KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1)",
        ),
        ("kind: 7\n", "kind: 7 is not a string"),
    ] {
        let err = ProxierConfiguration::from_any_yaml_str(text).unwrap_err();
        assert_eq!(err.to_string(), expected, "{text}");
    }
}

#[test]
fn kipvs_file_with_and_without_header() {
    let body = "ipvs:\n  scheduler: wrr\n";
    let (headerless, warnings) = ProxierConfiguration::from_any_yaml_str(body).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(headerless.ipvs.scheduler, "wrr");
    let versioned = format!("apiVersion: kipvs.io/v1alpha1\nkind: ProxierConfiguration\n{body}");
    let (config, warnings) = ProxierConfiguration::from_any_yaml_str(&versioned).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(config, headerless);
    // the header does not relax the strict field check
    let err =
        ProxierConfiguration::from_any_yaml_str(&format!("{versioned}bogus: 1\n")).unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
    // and is not part of the embedded form (NodeProxyConfig / ProxyConfig spec.config)
    assert!(ProxierConfiguration::from_yaml_str(&versioned).is_err());
}

#[test]
fn minimal_file_and_address_defaults() {
    let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                    mode: ipvs\n";
    let (config, warnings) = ProxierConfiguration::from_any_yaml_str(head).unwrap();
    assert_eq!(config, ProxierConfiguration::default());
    assert!(warnings.is_empty(), "{warnings:?}");

    // An IPv6 bindAddress picks IPv6 defaults (getDefaultAddresses); a bare IP gets the
    // default port (AppendPortIfNeeded).
    let (config, warnings) = ProxierConfiguration::from_any_yaml_str(&format!(
        "{head}bindAddress: \"::\"\nhealthzBindAddress: \"::1\"\n"
    ))
    .unwrap();
    assert_eq!(config.healthz_bind_address, "[::1]:10256");
    assert_eq!(config.metrics_bind_address, "[::1]:10249");
    assert!(warnings.is_empty(), "{warnings:?}");

    let (config, warnings) = ProxierConfiguration::from_any_yaml_str(&format!(
        "{head}bindAddress: 192.168.0.10\nhealthzBindAddress: 0.0.0.0:12345\n\
             nodePortAddresses: [all]\nhostnameOverride: node-1\n"
    ))
    .unwrap();
    assert_eq!(config.healthz_bind_address, "0.0.0.0:12345");
    assert_eq!(config.metrics_bind_address, "127.0.0.1:10249");
    assert_eq!(config.node_port_addresses, ["0.0.0.0/0", "::/0"]);
    assert_eq!(
        warnings,
        [
            "hostnameOverride is ignored by kipvs; kipvs takes the node name from --node \
                 (KIPVS_NODE_NAME)",
            "bindAddress 192.168.0.10 is ignored (kipvs takes the node's primary IP from its \
                 Node object); only its IP family picks the default health and metrics addresses",
        ]
    );
}

#[test]
fn unknown_fields_are_ignored_with_a_warning() {
    let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                    mode: ipvs\nnotAField: {a: 1, b: 0}\nipvs:\n  masqueradeBit: 14\n";
    let (_, warnings) = ProxierConfiguration::from_any_yaml_str(text).unwrap();
    assert_eq!(
        warnings,
        [
            "ipvs.masqueradeBit is not a KubeProxyConfiguration \
                 kubeproxy.config.k8s.io/v1alpha1 field; ignored",
            "notAField.a is not a KubeProxyConfiguration kubeproxy.config.k8s.io/v1alpha1 \
                 field; ignored",
        ]
    );
}

#[test]
fn invalid_values_name_the_field() {
    let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    for (body, expected) in [
        (
            "ipvs: {syncPeriod: 30}\n",
            "ipvs.syncPeriod: 30 is not a duration string",
        ),
        (
            "ipvs: {tcpTimeout: \"15\"}\n",
            "ipvs.tcpTimeout: invalid duration \"15\": missing unit",
        ),
        (
            "ipvs: {syncPeriod: 10s, minSyncPeriod: 1m}\n",
            "ipvs.minSyncPeriod: 1m0s must not be greater than ipvs.syncPeriod (10s)",
        ),
        (
            "nodePortAddresses: [primary, 10.0.0.0/8]\n",
            "nodePortAddresses[0]: \"primary\" must be the only entry",
        ),
        (
            "metricsBindAddress: localhost\n",
            "metricsBindAddress: \"localhost\"",
        ),
        (
            "featureGates: {LoadBalancerIPMode: maybe}\n",
            "invalid configuration: KubeProxyConfiguration:",
        ),
    ] {
        let err = ProxierConfiguration::from_any_yaml_str(&format!("{head}{body}"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(expected), "{body}: {err}");
    }
}

#[test]
fn kipvs_files_are_read_strictly() {
    let (config, warnings) =
        ProxierConfiguration::from_any_yaml_str("ipvs:\n  scheduler: wlc\n").unwrap();
    assert_eq!(config.ipvs.scheduler, "wlc");
    assert!(warnings.is_empty());
    let (config, _) = ProxierConfiguration::from_any_yaml_str("").unwrap();
    assert_eq!(config, ProxierConfiguration::default());
    let err = ProxierConfiguration::from_any_yaml_str("mode: ipvs\n").unwrap_err();
    assert!(matches!(err, ConfigError::Yaml(_)), "{err:?}");
}

#[test]
fn load_any_names_the_file() {
    let dir = std::env::temp_dir().join(format!("kipvs-kubeproxy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("config.conf");
    std::fs::write(&conf, ipvs_config_conf()).unwrap();
    let (config, warnings) = ProxierConfiguration::load_any(&conf).unwrap();
    assert_eq!(config.ipvs.scheduler, "lc");
    assert_eq!(warnings.len(), 2);

    let bad = dir.join("bad.conf");
    std::fs::write(
        &bad,
        KUBEADM_CONFIG_CONF.replace("mode: \"\"", "mode: nftables"),
    )
    .unwrap();
    let message = ProxierConfiguration::load_any(&bad)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with(&format!("{}: mode: \"nftables\"", bad.display())),
        "{message}"
    );
    let missing = ProxierConfiguration::load_any(dir.join("missing.conf")).unwrap_err();
    assert!(matches!(missing, ConfigError::Read { .. }), "{missing:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
