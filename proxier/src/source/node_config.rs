//! Following the node's own `NodeProxyConfig`: which configuration is in force, how
//! a new revision is checked and applied live, and how the proxier reports on it.
//!
//! - **Precedence**: the NodeProxyConfig's `spec.config` over the local `--config` file over
//!   the defaults. Without a NodeProxyConfig (none for this node, or the CRD is not
//!   installed: logged once) the proxier runs on its local configuration, so it works without
//!   the operator. Deleting the NodeProxyConfig returns to the local configuration.
//! - [`watch_assigned`] watches `nodeproxyconfigs` with the field selector
//!   `metadata.name=<node>` and publishes the [`Assigned`] configuration on a
//!   `tokio::sync::watch` channel; the [`Engine`](crate::engine::Engine) selects on it (no
//!   shared mutable configuration). Status writes of the proxier itself come back as watch
//!   events with the same spec and are not republished.
//! - **Version skew** (the operator and the proxiers are upgraded at different times): the
//!   object is read as JSON and `spec.config` decoded by
//!   [`ProxierConfiguration::from_value_ignoring_unknown`] ([`assigned_by`]): settings this
//!   version does not know are left out and reported (log, `kipvs_config_ignored_settings`,
//!   the status message); a spec this version cannot use is reported `Failed`
//!   ([`Assigned::Unusable`]). The reported revision is derived from the content where the
//!   operator named it by content ([`reported_revision`]), so hand edits show.
//! - The engine checks a new revision first ([`ProxierConfiguration::validate`], then
//!   [`KernelSettings::check`](crate::dataplane::kernel::settings::KernelSettings::check): the
//!   scheduler must be available). A revision that fails is reported `Failed` with the reason
//!   and the previous configuration stays in force. While the proxier writes nothing (standby
//!   during a move from kube-proxy) a revision is validated only; the kernel's check and
//!   settings come at the switch to kipvs, before its first sync ([`crate::engine::takeover`]).
//! - Applied live, without a restart: every Service is re-planned (feature gates, scheduler,
//!   `nodePortAddresses`, `excludeCIDRs`) and synced through the usual diff, so only what the
//!   change concerns is touched; `ipvs.drainTimeout`; IPVS timeouts and strictARP sysctls
//!   ([`KernelSettings::apply`](crate::dataplane::kernel::settings::KernelSettings::apply): zero
//!   timeouts leave the kernel's as they are, and turning strictARP off does not restore
//!   `arp_ignore`/`arp_announce`, as in kube-proxy); the
//!   `KubeProxyDrainingTerminatingNodes` gate and the `/livez` timeout (`2 × syncPeriod`) of
//!   the health servers; `syncPeriod` and `minSyncPeriod`. `healthzBindAddress` and
//!   `metricsBindAddress` need a restart (a change is logged).
//! - [`report_status`](kipvs_proxier_contract::report_status) writes the status the engine
//!   reports ([`kipvs_proxier_contract::report`]) by server-side apply on the `status` subresource,
//!   whenever the engine's report or the `/livez` verdict changes: `Pending` when a live change
//!   starts, then `Applied` after the first sync with it (at start, directly `Applied`), or
//!   `Failed`.

use super::is_not_found;
use futures::StreamExt;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_crds::nodeproxyconfig::NodeProxyConfig;
use kipvs_crds::revision::{config_revision, is_config_revision};
use kipvs_proxier_contract::Retry;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::watch;

/// The NodeProxyConfig resource, as named in logs and in `kipvs_api_resource_unavailable`
/// (1 while the proxier runs on its local configuration because it cannot read its
/// NodeProxyConfig).
pub const NODE_PROXY_CONFIGS_RESOURCE: &str = "nodeproxyconfigs.kipvs.io/v1alpha1";

/// The configuration the node's NodeProxyConfig assigns.
#[derive(Clone, Debug, PartialEq)]
pub enum Assigned {
    /// Not known yet (the NodeProxyConfigs are not listed): the engine waits for it at most
    /// [`ASSIGNMENT_WAIT`](crate::engine::ASSIGNMENT_WAIT), then programs with the local
    /// configuration.
    Unknown,
    /// No NodeProxyConfig for this node (or no CRD): the local configuration.
    Local,
    /// The NodeProxyConfig's `spec.config`, as this version reads it.
    Revision {
        /// The revision reported in `status.observedRevision` ([`reported_revision`]).
        revision: String,
        /// `spec.config` without what this version does not know.
        config: Box<ProxierConfiguration>,
        /// What was left out of `spec.config` (paths such as `ipvs.newSetting`,
        /// `featureGates.NewGate`): settings of a newer kipvs, reported, never fatal.
        ignored: Vec<String>,
    },
    /// A NodeProxyConfig whose `spec.config` this version cannot use (a known field of the
    /// wrong type, an invalid value): reported `Failed`, the configuration in force stays.
    Unusable {
        /// `spec.revision`.
        revision: String,
        /// Why.
        message: String,
    },
}

/// Watch the NodeProxyConfig named `node` forever, publishing what it assigns on `assigned`
/// (only when that changes). It is read as plain JSON and decoded by [`assigned_by`], so an
/// object a newer operator wrote (unknown fields) is still followed. A 404 (the CRD is not
/// installed) is logged once and counts as [`Assigned::Local`]; the watch keeps retrying with
/// the backoff of [`Retry`] and picks the CRD up when it appears. Other errors
/// (403 from RBAC, 5xx) are logged and keep the last assignment; while none is known yet, the engine
/// runs on the local configuration after [`ASSIGNMENT_WAIT`](crate::engine::ASSIGNMENT_WAIT).
pub async fn watch_assigned(client: Client, node: String, assigned: watch::Sender<Assigned>) {
    let resource = ApiResource::erase::<NodeProxyConfig>(&());
    let api = Api::<DynamicObject>::all_with(client, &resource);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = watcher::watcher(api, config).boxed();
    let mut retry = Retry::new("NodeProxyConfig watch");
    let mut listing = None;
    let mut missing = false;
    let publish = |next: Assigned| {
        assigned.send_if_modified(|current| {
            let changed = *current != next;
            *current = next;
            changed
        });
    };
    while let Some(event) = events.next().await {
        if event.is_ok() {
            retry.succeeded();
        }
        match event {
            Ok(Event::Init) => listing = None,
            Ok(Event::InitApply(object)) => listing = Some(object),
            Ok(Event::InitDone) => {
                if missing {
                    tracing::info!("the NodeProxyConfig CRD is installed now");
                    missing = false;
                }
                publish(
                    listing
                        .take()
                        .map_or(Assigned::Local, |o| assigned_by(&o.data)),
                );
            }
            Ok(Event::Apply(object)) => publish(assigned_by(&object.data)),
            Ok(Event::Delete(_)) => publish(Assigned::Local),
            Err(e) if is_not_found(&e) => {
                if !missing {
                    tracing::warn!(
                        "nodeproxyconfigs.kipvs.io is not served (the CRD is not installed): \
                         running on the local configuration and retrying"
                    );
                    missing = true;
                }
                publish(Assigned::Local);
                retry.wait(&e).await;
            }
            Err(e) => retry.failed(&e, "the configuration in force").await,
        }
    }
}

/// What the NodeProxyConfigs of a manifests snapshot assign to `node`: the one named after it,
/// else the local configuration.
pub fn assigned_from(configs: &[DynamicObject], node: &str) -> Assigned {
    configs
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(node))
        .map_or(Assigned::Local, |c| assigned_by(&c.data))
}

/// What a NodeProxyConfig assigns, from its JSON body (`spec`, `status`, ...): `spec.config`
/// decoded by [`ProxierConfiguration::from_value_ignoring_unknown`], reported under
/// [`reported_revision`].
pub fn assigned_by(object: &Value) -> Assigned {
    let spec = object.get("spec");
    let spec_revision = spec
        .and_then(|s| s.get("revision"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let config = spec.and_then(|s| s.get("config")).unwrap_or(&Value::Null);
    match ProxierConfiguration::from_value_ignoring_unknown(config) {
        Ok((config, ignored)) => Assigned::Revision {
            revision: reported_revision(spec_revision, &config, &ignored),
            config: Box::new(config),
            ignored,
        },
        Err(e) => Assigned::Unusable {
            revision: spec_revision,
            message: format!("spec.config: {e}"),
        },
    }
}

/// The revision to report for `config`, assigned under `spec_revision` (a hand edit of
/// `spec.config` that keeps `spec.revision` must show). The operator names a revision by its
/// content ([`config_revision`]); when `spec_revision` has that form and this version read the
/// whole of `spec.config`, the revision of the content is reported, so content that does not
/// match its name is visible as another observed revision (and logged). Otherwise
/// `spec_revision` is echoed: a hand-named revision (`r1`) names no content, and settings
/// this version left out (a newer operator's) would change the hash, so a skewed proxier
/// cannot judge and trusts the name.
pub fn reported_revision(
    spec_revision: String,
    config: &ProxierConfiguration,
    ignored: &[String],
) -> String {
    if !ignored.is_empty() || !is_config_revision(&spec_revision) {
        return spec_revision;
    }
    let content = config_revision(config);
    if content != spec_revision {
        tracing::warn!(
            spec_revision,
            content_revision = content,
            "spec.config is not the configuration of spec.revision (edited by hand?): \
             reporting the revision of its content"
        );
    }
    content
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_of_a_newer_version_are_ignored_and_named() {
        let object = json!({"spec": {"revision": "r7", "config": {
            "ipvs": {"scheduler": "wlc", "newSetting": true},
            "featureGates": {"FutureGate": true}
        }}});
        let Assigned::Revision {
            revision,
            config,
            ignored,
        } = assigned_by(&object)
        else {
            panic!("not applied: {:?}", assigned_by(&object))
        };
        assert_eq!(revision, "r7");
        assert_eq!(config.ipvs.scheduler, "wlc");
        assert_eq!(ignored, ["featureGates.FutureGate", "ipvs.newSetting"]);
    }

    #[test]
    fn a_spec_config_this_version_cannot_use_is_unusable_not_unknown() {
        let object = json!({"spec": {"revision": "r1", "config": {"ipvs": {"syncPeriod": 0}}}});
        assert!(matches!(
            assigned_by(&object),
            Assigned::Unusable { revision, .. } if revision == "r1"
        ));
    }

    /// Issue 15 item 3: a hand edit of spec.config that keeps the operator's spec.revision is
    /// reported under the revision of its content; hand-named revisions and configurations
    /// read only in part (version skew) keep their name.
    #[test]
    fn the_reported_revision_is_derived_from_the_content_when_it_can_be() {
        let mut config = ProxierConfiguration::default();
        config.ipvs.scheduler = "wlc".into();
        let named = config_revision(&config);
        let revision = |spec: &str, config: &Value| match assigned_by(
            &json!({"spec": {"revision": spec, "config": config}}),
        ) {
            Assigned::Revision { revision, .. } => revision,
            other => panic!("{other:?}"),
        };
        let wlc = json!({"ipvs": {"scheduler": "wlc"}});
        let edited = json!({"ipvs": {"scheduler": "lc"}});
        assert_eq!(revision(&named, &wlc), named);
        let mut lc = ProxierConfiguration::default();
        lc.ipvs.scheduler = "lc".into();
        assert_eq!(revision(&named, &edited), config_revision(&lc));
        assert_eq!(revision("r1", &edited), "r1");
        let newer = json!({"ipvs": {"scheduler": "lc", "newSetting": 1}});
        assert_eq!(revision(&named, &newer), named);
    }
}
