//! A `ProxyConfig` read the way the API server stores it, without failing.
//!
//! The operator watches ProxyConfigs as [`StoredProxyConfig`]: metadata always, the spec and the
//! status each decoded on their own. A typed watch of [`ProxyConfig`] fails the whole list or
//! watch when one object does not decode (a `soakDuration: 100000000h` that an older schema
//! let through would blind the operator to every ProxyConfig, and a restarted operator could
//! not even list them). Here such an object is one [`StoredProxyConfig`] whose spec is an error,
//! which the controller reports on the object itself (Degraded `InvalidSpec`, an Event) while
//! the others are reconciled.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kipvs_crds::{ProxyConfig, ProxyConfigSpec, ProxyConfigStatus};
use kube::Resource;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::borrow::Cow;
use std::sync::Arc;

/// Why a stored ProxyConfig's spec cannot be read: the serde error, which names the field and
/// the value (`spec: rollout.stages[0].soakDuration: ...`).
#[derive(Clone, Debug, thiserror::Error)]
#[error("spec: {0}")]
pub struct UndecodableSpec(Arc<serde_json::Error>);

/// A ProxyConfig whose spec and status may not decode.
#[derive(Clone, Debug)]
pub struct StoredProxyConfig {
    /// Object metadata (always readable: the API server validates it).
    pub metadata: ObjectMeta,
    /// The spec, or why it cannot be read (the serde error, naming the field and value).
    pub spec: Result<ProxyConfigSpec, UndecodableSpec>,
    /// The status, if there is one and it decodes (an unreadable status is treated as none).
    pub status: Option<ProxyConfigStatus>,
    /// `spec.nodeSelector` read on its own, so that the nodes of a ProxyConfig whose spec does
    /// not decode still count as selected by it for conflict detection.
    pub node_selector: Option<LabelSelector>,
}

impl StoredProxyConfig {
    /// The typed object, or why its spec cannot be read.
    ///
    /// # Errors
    /// The spec's decoding error.
    pub fn decode(&self) -> Result<ProxyConfig, UndecodableSpec> {
        let spec = self.spec.clone()?;
        Ok(ProxyConfig {
            metadata: self.metadata.clone(),
            spec,
            status: self.status.clone(),
        })
    }
}

impl From<ProxyConfig> for StoredProxyConfig {
    fn from(pc: ProxyConfig) -> Self {
        StoredProxyConfig {
            node_selector: pc.spec.node_selector.clone(),
            metadata: pc.metadata,
            spec: Ok(pc.spec),
            status: pc.status,
        }
    }
}

impl<'de> Deserialize<'de> for StoredProxyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Value,
            #[serde(default)]
            status: Value,
        }
        let raw = Raw::deserialize(deserializer)?;
        let node_selector = raw
            .spec
            .get("nodeSelector")
            .and_then(|s| serde_json::from_value(s.clone()).ok());
        let spec = if raw.spec.is_null() {
            Ok(ProxyConfigSpec::default())
        } else {
            serde_json::from_value(raw.spec).map_err(|e| UndecodableSpec(Arc::new(e)))
        };
        let status = serde_json::from_value(raw.status).ok().flatten();
        Ok(StoredProxyConfig {
            metadata: raw.metadata,
            spec,
            status,
            node_selector,
        })
    }
}

impl Resource for StoredProxyConfig {
    type DynamicType = ();
    type Scope = <ProxyConfig as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        ProxyConfig::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        ProxyConfig::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        ProxyConfig::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        ProxyConfig::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        ProxyConfig::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_undecodable_spec_is_an_error_on_one_object() {
        let object = json!({
            "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig",
            "metadata": {"name": "huge", "generation": 3},
            "spec": {
                "nodeSelector": {"matchLabels": {"pool": "a"}},
                "rollout": {"stages": [{"name": "canary", "size": 1, "soakDuration": "100000000h"}]}
            },
            "status": {"lastGoodRevision": "abc"}
        });
        let stored: StoredProxyConfig = serde_json::from_value(object).unwrap();
        let error = stored.decode().unwrap_err().to_string();
        assert!(error.contains("out of range"), "{error}");
        assert_eq!(stored.metadata.name.as_deref(), Some("huge"));
        assert_eq!(
            stored.status.unwrap().last_good_revision.as_deref(),
            Some("abc")
        );
        assert!(stored.node_selector.is_some());
        // Typed, the same object fails as a whole (what a typed watch did).
        let typed = serde_json::from_value::<ProxyConfig>(json!({
            "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig",
            "metadata": {"name": "huge"},
            "spec": {"rollout": {"applyTimeout": "100000000h"}}
        }));
        assert!(typed.is_err());
    }

    #[test]
    fn a_good_object_decodes_as_the_typed_one() {
        let pc = ProxyConfig::new("fleet", ProxyConfigSpec::default());
        let value = serde_json::to_value(&pc).unwrap();
        let stored: StoredProxyConfig = serde_json::from_value(value).unwrap();
        assert_eq!(stored.decode().unwrap(), pc);
    }
}
