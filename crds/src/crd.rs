//! The CustomResourceDefinitions of kipvs, rendered as the files in `config/crd/`.
//!
//! `cargo run -p kipvs-crds --bin crdgen` writes them; `crdgen --check` fails when the
//! committed files differ from what the types generate (CI runs it).

use crate::{NodeProxyConfig, ProxyConfig};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// First line of every generated file.
const HEADER: &str =
    "# Generated from crds/ by `cargo run -p kipvs-crds --bin crdgen`. Do not edit.\n";

/// Every CRD kipvs installs.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![ProxyConfig::crd(), NodeProxyConfig::crd()]
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
