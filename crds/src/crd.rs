//! The CustomResourceDefinitions of kipvs, rendered as the files in `config/crd/`.
//!
//! `cargo run -p kipvs-crds --bin crdgen` writes them; `crdgen --check` fails when the
//! committed files differ from what the types generate (CI runs it).

use crate::{NodeProxyConfig, ProxyConfig};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use kube::CustomResourceExt;
use serde_json::Value;

/// First line of every generated file.
const HEADER: &str =
    "# Generated from crds/ by `cargo run -p kipvs-crds --bin crdgen`. Do not edit.\n";

/// Every CRD kipvs installs, as installed (see [`drop_empty_string_defaults`]).
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![ProxyConfig::crd(), NodeProxyConfig::crd()];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                drop_empty_string_defaults(schema);
            }
        }
    }
    crds
}

/// Removes `default: ""` from a schema, also inside object defaults. Kubernetes 1.20 reads an
/// empty-string default as null and rejects the CRD (`default.scheduler: Invalid value: "null":
/// ... must be of type string`); without it nothing changes for kipvs, whose types fill an
/// absent string with `""` themselves.
fn drop_empty_string_defaults(schema: &mut JSONSchemaProps) {
    fn strip(value: &mut Value) {
        if let Value::Object(map) = value {
            map.retain(|_, v| v.as_str() != Some(""));
            map.values_mut().for_each(strip);
        }
    }
    if let Some(default) = &mut schema.default {
        if default.0.as_str() == Some("") {
            schema.default = None;
        } else {
            strip(&mut default.0);
        }
    }
    let children = schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .chain(schema.items.iter_mut().filter_map(|i| match i {
            JSONSchemaPropsOrArray::Schema(s) => Some(s.as_mut()),
            JSONSchemaPropsOrArray::Schemas(_) => None,
        }));
    for child in children {
        drop_empty_string_defaults(child);
    }
}

/// The generated files of `config/crd/`: `(file name, contents)`, one YAML file per CRD named
/// `<group>_<plural>.yaml` (as controller-gen names them) and a `kustomization.yaml` listing them.
///
/// # Errors
/// A CRD that cannot be serialized (a bug in the types).
pub fn files() -> Result<Vec<(String, String)>, serde_saphyr::ser::Error> {
    let mut files = Vec::new();
    for crd in all() {
        let name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
        files.push((name, format!("{HEADER}{}", serde_saphyr::to_string(&crd)?)));
    }
    let resources: String = files
        .iter()
        .map(|(name, _)| format!("  - {name}\n"))
        .collect();
    files.push((
        "kustomization.yaml".to_owned(),
        format!(
            "{HEADER}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{resources}"
        ),
    ));
    Ok(files)
}
