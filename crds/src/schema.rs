//! Hand-written OpenAPI schemas for fields whose Rust type says less than the CRD should.
//!
//! Every schema here is *structural* (typed, no `oneOf`/`anyOf`/`$ref`) and uses only
//! validations that kube-apiserver enforces since 1.16 (`pattern`, `minimum`,
//! `x-kubernetes-int-or-string`, `x-kubernetes-list-type`), so Kubernetes 1.20 rejects bad
//! values with the schema's own message. Rules that need CEL live on the types
//! ([`crate::proxyconfig`]), and are mirrored in Rust validation for servers without CEL.

use crate::gates::Gate;
use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value, json};

/// A non-negative Go duration (`time.ParseDuration` syntax, optional `+`) below
/// [`crate::duration::MAX`] (100,000 h): `"0"`, `"30s"`, `"1m30s"`, `"1.5h"`, `"500ms"`.
///
/// One rule for every field of this type, in the ProxyConfig and the NodeProxyConfig alike:
/// everything the pattern accepts [`crate::duration::parse`] accepts, and the operator writes
/// it back in Go's form ([`crate::duration::format`], e.g. `"1h30m0s"`), which the pattern
/// accepts too. Two forms:
/// - up to 6 components, integer parts of at most 4 digits for `h`, 5 for `m`, 7 for `s` and 9
///   for the smaller units, fractions of at most 9 digits: each component is under 10,000 h,
///   so the sum is under 60,000 h;
/// - Go's form of larger values: hours of up to 5 digits, then optionally minutes and seconds
///   below 60 (up to `"99999h59m59.999999999s"`).
pub const DURATION_PATTERN: &str = concat!(
    r"^\+?(0|(",
    r"(([0-9]{1,9}(\.[0-9]{0,9})?|\.[0-9]{1,9})(ns|us|µs|μs|ms))",
    r"|(([0-9]{1,7}(\.[0-9]{0,9})?|\.[0-9]{1,9})s)",
    r"|(([0-9]{1,5}(\.[0-9]{0,9})?|\.[0-9]{1,9})m)",
    r"|(([0-9]{1,4}(\.[0-9]{0,9})?|\.[0-9]{1,9})h)",
    r"){1,6}",
    r"|[0-9]{1,5}h([0-5]?[0-9]m([0-5]?[0-9](\.[0-9]{1,9})?s)?)?",
    r")$"
);

/// A percentage from 1% to 100%, as written in a count-or-percentage field (`"10%"`).
pub const PERCENT_PATTERN: &str = r"^(100|[1-9][0-9]?)%$";

/// Schema of a Go duration string ([`DURATION_PATTERN`]).
pub fn go_duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "pattern": DURATION_PATTERN })
}

/// Schema of an optional Go duration string.
pub fn optional_go_duration(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = go_duration(generator);
    schema.insert("nullable".into(), true.into());
    schema
}

/// Schema of `serviceProxy`: a plain string enum (schemars would give documented variants a
/// `oneOf`, which a structural CRD schema does not allow).
pub fn service_proxy(_: &mut SchemaGenerator) -> Schema {
    let names = [crate::ServiceProxy::Kipvs, crate::ServiceProxy::KubeProxy].map(|p| p.as_str());
    json_schema!({ "type": "string", "enum": names })
}

/// Schema of `featureGates`: an object with one boolean property per known [`Gate`], so that
/// `kubectl explain` lists the gates and strict field validation (kubectl's client-side
/// validation on old servers, `fieldValidation=Strict` on new ones) rejects unknown names.
/// The Rust type stays a map, checked by [`crate::ProxierConfiguration::validate`].
pub fn feature_gates(_: &mut SchemaGenerator) -> Schema {
    let properties: Map<String, Value> = Gate::ALL
        .into_iter()
        .map(|gate| {
            (
                gate.name().to_owned(),
                json!({ "type": "boolean", "description": gate.description() }),
            )
        })
        .collect();
    json_schema!({ "type": "object", "properties": properties })
}

/// Schema of a [`crate::CountOrPercent`] with a minimum count of 1 or 1%.
pub fn count_or_percent(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "minimum": 1,
        "pattern": PERCENT_PATTERN,
    })
}

/// Schema of an optional [`crate::CountOrPercent`].
pub fn optional_count_or_percent(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = count_or_percent(generator);
    schema.insert("nullable".into(), true.into());
    schema
}

/// Schema of a `metav1.Condition` list: a list-map keyed by `type`, as Kubernetes API
/// conventions require (so server-side apply merges conditions by type).
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let item =
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}
