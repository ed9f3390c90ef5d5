//! The generated CRDs: structural schemas, the CEL rules evaluated locally (kube-cel, as
//! Kubernetes >= 1.25 would), and agreement between the schema patterns, the CEL rules and the
//! Rust validation the operator runs, on the fixtures in `tests/operator/invalid/` (the same
//! files the control-plane e2e applies to a real 1.20 apiserver).

use kipvs_crds::schema::{DURATION_PATTERN, PERCENT_PATTERN};
use kipvs_crds::{CountOrPercent, NodeProxyConfig, ProxyConfig, duration};
use kube::CustomResourceExt;
use kube::core::cel::Validator;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn openapi_schema<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema"),
    )
    .unwrap()
}

fn yaml_to_json(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("fixture is YAML")
}

/// Structural-schema rules the apiserver enforces: every node typed (or int-or-string), no
/// `oneOf`/`anyOf`/`allOf`/`$ref`, no `additionalProperties` next to `properties`.
#[test]
fn schemas_are_structural() {
    fn check(path: &str, value: &Value) {
        let object = value.as_object().expect("schema is an object");
        for forbidden in ["oneOf", "anyOf", "allOf", "$ref", "not"] {
            assert!(!object.contains_key(forbidden), "{path} uses {forbidden}");
        }
        let int_or_string = object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        assert!(
            object.contains_key("type") || int_or_string,
            "{path} has no type"
        );
        assert!(
            !(object.contains_key("properties") && object.contains_key("additionalProperties")),
            "{path} has properties and additionalProperties"
        );
        // Every field (not the array items) says what it is, for `kubectl explain`.
        if path.matches('.').count() > 1 && !path.ends_with("[]") {
            assert!(
                object.contains_key("description"),
                "{path} has no description"
            );
        }
        for (name, sub) in object
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            check(&format!("{path}.{name}"), sub);
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub) = object.get(key).filter(|s| s.is_object()) {
                check(&format!("{path}[]"), sub);
            }
        }
    }
    check("ProxyConfig", &openapi_schema::<ProxyConfig>());
    check("NodeProxyConfig", &openapi_schema::<NodeProxyConfig>());
}

#[test]
fn crds_are_cluster_scoped_with_status_and_short_names() {
    for (crd, short) in [
        (ProxyConfig::crd(), "pxc"),
        (NodeProxyConfig::crd(), "npxc"),
    ] {
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.group, "kipvs.io");
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_owned()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["kipvs".to_owned()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.subresources.as_ref().unwrap().status.is_some());
    }
}

/// Go durations: what the pattern accepts is what `duration::parse` accepts (negative zero
/// aside), so the apiserver and the proxier agree.
#[test]
fn duration_pattern_agrees_with_the_parser() {
    let pattern = regex::Regex::new(DURATION_PATTERN).unwrap();
    for input in [
        "0",
        "0s",
        "30s",
        "1m30s",
        "1.5h",
        ".5s",
        "5.s",
        "500ms",
        "1us",
        "1µs",
        "1μs",
        "2h45m",
        "+5s",
        "1h1m1s1ms1us1ns",
    ] {
        assert!(pattern.is_match(input), "{input} should match");
        assert!(duration::parse(input).is_ok(), "{input} should parse");
    }
    // The bounds: the largest values the pattern accepts still parse.
    for input in [
        "9999.999999999h9999.999999999h9999.999999999h9999.999999999h9999.999999999h9999.999999999h",
        "99999m99999m99999m99999m99999m99999m",
        "9999999s9999999s9999999s9999999s9999999s9999999s",
        "999999999ms",
        "300000ms",
        "99999h",
        "99999h59m59.999999999s",
    ] {
        assert!(pattern.is_match(input), "{input} should match");
        assert!(duration::parse(input).is_ok(), "{input} should parse");
    }
    // Too large (issue 15: the apiserver stored them, the operator could not read them; issue
    // 23: the operator wrote 599994h0m0s, which the NodeProxyConfig schema refused): the
    // schema rejects them.
    for input in [
        "100000000h",
        "2562048h",
        "100000h",
        "99999h60m",
        "10000h10000h",
        "100000m",
        "10000000s",
        "1h1h1h1h1h1h1h",
        "99999h99999h99999h99999h99999h99999h",
    ] {
        assert!(!pattern.is_match(input), "{input:?} should not match");
    }
    for input in [
        "", "-5s", "5", "s", "1d", "1.5", "5 s", "one", "1m-5s", "--1s", "1e3s", ".s",
    ] {
        assert!(!pattern.is_match(input), "{input:?} should not match");
        assert!(
            duration::parse(input).is_err(),
            "{input:?} should not parse"
        );
    }
}

/// Issue 23, one type, one rule: every duration the schema accepts, the operator reads and
/// writes back (Go's form, as it writes NodeProxyConfigs) as one the schema and the parser
/// accept again. `ipvs.syncPeriod: 99999h99999h99999h99999h99999h99999h` passed the ProxyConfig
/// schema and was written as `599994h0m0s`, which the NodeProxyConfig schema refused; a value
/// neither can carry does not decode (the operator reports InvalidSpec).
#[test]
fn every_duration_the_schema_accepts_is_written_back_as_one_it_accepts() {
    let pattern = regex::Regex::new(DURATION_PATTERN).unwrap();
    let round_trip = |input: &str| {
        assert!(pattern.is_match(input), "{input:?} should match");
        let parsed = duration::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        let written = duration::format(parsed);
        assert!(
            pattern.is_match(&written),
            "{input:?} is written as {written:?}"
        );
        assert_eq!(duration::parse(&written), Ok(parsed), "{written:?}");
    };
    for input in [
        "9999h9999h9999h9999h9999h9999h",
        "9999.999999999h9999.999999999h9999.999999999h9999.999999999h9999.999999999h9999.999999999h",
        "99999m99999m99999m99999m99999m99999m",
        "9999999s9999999s9999999s9999999s9999999s9999999s",
        "99999h59m59.999999999s",
        "1.5h",
        "0",
    ] {
        round_trip(input);
    }
    // Random strings of the pattern (proptest generates from the regex without its anchors).
    let body = DURATION_PATTERN
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix('$'))
        .unwrap();
    let strategy = proptest::string::string_regex(body).unwrap();
    proptest::test_runner::TestRunner::default()
        .run(&strategy, |input| {
            round_trip(&input);
            Ok(())
        })
        .unwrap();

    // The issue's value, and its written form, in either kind's configuration: neither decodes.
    for value in ["99999h99999h99999h99999h99999h99999h", "599994h0m0s"] {
        assert!(duration::parse(value).is_err(), "{value}");
        let pc = serde_json::json!({
            "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig", "metadata": {"name": "x"},
            "spec": {"config": {"ipvs": {"syncPeriod": value}}},
        });
        let err = serde_json::from_value::<ProxyConfig>(pc).unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
        let npc = serde_json::json!({
            "apiVersion": "kipvs.io/v1alpha1", "kind": "NodeProxyConfig", "metadata": {"name": "x"},
            "spec": {"revision": "r", "assignedAt": "2026-01-01T00:00:00Z",
                     "config": {"ipvs": {"tcpTimeout": value}}},
        });
        assert!(
            serde_json::from_value::<NodeProxyConfig>(npc).is_err(),
            "{value}"
        );
    }
}

/// One type, one rule: a NodeProxyConfig's `spec.config` has the ProxyConfig's `spec.config`
/// schema (the same Rust type); the ProxyConfig adds only defaults and its CEL rules (stricter),
/// so whatever a ProxyConfig carries, a NodeProxyConfig can carry.
#[test]
fn the_nodeproxyconfig_config_schema_is_the_proxyconfigs() {
    fn without(value: &Value, keys: &[&str]) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .filter(|(k, _)| !keys.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), without(v, keys)))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| without(v, keys)).collect()),
            other => other.clone(),
        }
    }
    let config = |schema: Value| schema["properties"]["spec"]["properties"]["config"].clone();
    let pc = config(openapi_schema::<ProxyConfig>());
    let npc = config(openapi_schema::<NodeProxyConfig>());
    assert_eq!(
        without(&pc, &["description", "default", "x-kubernetes-validations"]),
        without(&npc, &["description", "default"])
    );
}

#[test]
fn percent_pattern_agrees_with_count_or_percent() {
    let pattern = regex::Regex::new(PERCENT_PATTERN).unwrap();
    for p in 0..=101 {
        let text = format!("{p}%");
        let parsed = serde_json::from_value::<CountOrPercent>(Value::String(text.clone()));
        assert_eq!(pattern.is_match(&text), parsed.is_ok(), "{text}");
    }
    for text in ["05%", "+5%", "5", "%", "5 %", "five%"] {
        assert!(!pattern.is_match(text), "{text}");
        assert!(serde_json::from_value::<CountOrPercent>(Value::String(text.into())).is_err());
    }
}

/// The sample is valid everywhere: it deserializes, passes the operator's validation and the
/// CEL rules.
#[test]
fn sample_is_valid() {
    let text = std::fs::read_to_string(repo().join("config/samples/proxyconfig.yaml")).unwrap();
    let object = yaml_to_json(&text);
    let pc: ProxyConfig = serde_json::from_value(object.clone()).unwrap();
    pc.spec.validate().unwrap();
    let stages = pc.spec.rollout.effective_stages();
    let names: Vec<_> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["canary", "early", "fleet"]);
    Validator::new()
        .validate(&openapi_schema::<ProxyConfig>(), &object, None)
        .unwrap();
}

struct Fixture {
    path: PathBuf,
    object: Value,
    cel: String,
    operator: String,
}

fn fixtures() -> Vec<Fixture> {
    let dir = repo().join("tests/operator/invalid");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 8, "fixtures in {}", dir.display());
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let header = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("# {key}:")))
                    .unwrap_or_else(|| panic!("{} has no {key}", path.display()))
                    .trim()
                    .to_owned()
            };
            Fixture {
                cel: header("expect-cel"),
                operator: header("expect-operator"),
                object: yaml_to_json(&text),
                path,
            }
        })
        .collect()
}

/// Each invalid fixture is rejected by the CEL rules exactly when its header says so, with the
/// rule's message (an empty `expect-cel` means the CEL rules accept it: the schema rejects it).
#[test]
fn cel_rules_reject_what_the_fixtures_expect() {
    let schema = openapi_schema::<ProxyConfig>();
    let validator = Validator::new();
    for f in fixtures() {
        let verdict = validator.validate(&schema, &f.object, None);
        match (f.cel.as_str(), verdict) {
            ("", Ok(())) => {}
            ("", Err(e)) => panic!("{}: CEL rejected it: {e}", f.path.display()),
            (want, Ok(())) => panic!("{}: CEL accepted it, want {want:?}", f.path.display()),
            (want, Err(e)) => assert!(
                e.to_string().contains(want),
                "{}: {e} does not contain {want:?}",
                f.path.display()
            ),
        }
    }
}

/// The operator's own validation (deserialization + `ProxyConfigSpec::validate`) rejects every
/// fixture that the CEL rules or the schema reject in a way the Rust types can see, so a
/// Kubernetes without CEL (1.20) gets the same verdict from the operator.
#[test]
fn operator_validation_agrees_with_the_fixtures() {
    for f in fixtures() {
        let verdict = serde_json::from_value::<ProxyConfig>(f.object.clone())
            .map_err(|e| e.to_string())
            .and_then(|pc| pc.spec.validate().map_err(|e| e.to_string()));
        match (f.operator.as_str(), verdict) {
            ("", Ok(())) => {}
            ("", Err(e)) => panic!("{}: the operator rejected it: {e}", f.path.display()),
            (want, Ok(())) => panic!(
                "{}: the operator accepted it, want {want:?}",
                f.path.display()
            ),
            (want, Err(e)) => assert!(
                e.contains(want),
                "{}: {e} does not contain {want:?}",
                f.path.display()
            ),
        }
        if !f.cel.is_empty() {
            assert!(
                !f.operator.is_empty(),
                "{}: a CEL rule without a Rust twin",
                f.path.display()
            );
        }
    }
}
