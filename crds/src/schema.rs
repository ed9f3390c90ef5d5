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

/// A non-negative Go duration (`time.ParseDuration` syntax, optional `+`): `"0"`, `"30s"`,
/// `"1m30s"`, `"1.5h"`, `"500ms"`, bounded so that everything it accepts
/// [`crate::duration::parse`] accepts too (Go's `time.Duration` ends at about 2,562,047 h, and
/// an object the apiserver stores but the operator cannot read must not exist): at most 6
/// components, integer parts of at most 5 digits for `h`, 7 for `m` and 9 for the smaller units,
/// fractions of at most 9 digits. The worst case, six `99999.999999999h`, is about 600,000 h.
pub const DURATION_PATTERN: &str = concat!(
    r"^\+?(0|(",
    r"(([0-9]{1,9}(\.[0-9]{0,9})?|\.[0-9]{1,9})(ns|us|µs|μs|ms|s))",
    r"|(([0-9]{1,7}(\.[0-9]{0,9})?|\.[0-9]{1,9})m)",
    r"|(([0-9]{1,5}(\.[0-9]{0,9})?|\.[0-9]{1,9})h)",
    r"){1,6})$"
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
