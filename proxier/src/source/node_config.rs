//! Following the node's own `NodeProxyConfig` (issue 6): which configuration is in force, how
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
//! - The engine checks a new revision first ([`ProxierConfiguration::validate`], then
//!   [`KernelSettings::check`](crate::dataplane::settings::KernelSettings::check): the
//!   scheduler must be available). A revision that fails is reported `Failed` with the reason
//!   and the previous configuration stays in force.
//! - Applied live, without a restart: every Service is re-planned (feature gates, scheduler,
//!   `nodePortAddresses`, `excludeCIDRs`) and synced through the usual diff, so only what the
//!   change concerns is touched; `ipvs.drainTimeout`; IPVS timeouts and strictARP sysctls
//!   ([`KernelSettings::apply`](crate::dataplane::settings::KernelSettings::apply): zero
//!   timeouts leave the kernel's as they are, and turning strictARP off does not restore
//!   `arp_ignore`/`arp_announce`, as in kube-proxy); the
//!   `KubeProxyDrainingTerminatingNodes` gate and the `/livez` timeout (`2 × syncPeriod`) of
//!   the health servers; `syncPeriod` and `minSyncPeriod`. `healthzBindAddress` and
//!   `metricsBindAddress` need a restart (a change is logged).
//! - [`report_status`](crate::serve::status::report_status) writes the status the engine
//!   reports ([`crate::engine::status`]) by server-side apply on the `status` subresource,
//!   whenever the engine's report or the `/livez` verdict changes: `Pending` when a live change
//!   starts, then `Applied` after the first sync with it (at start, directly `Applied`), or
//!   `Failed`.

use super::{Retry, is_not_found};
use futures::StreamExt;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_crds::nodeproxyconfig::NodeProxyConfig;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
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
    /// The NodeProxyConfig's `spec.revision` and `spec.config`.
    Revision {
        /// `spec.revision`, echoed in `status.observedRevision`.
        revision: String,
        /// `spec.config`.
        config: Box<ProxierConfiguration>,
    },
}

/// Watch the NodeProxyConfig named `node` forever, publishing what it assigns on `assigned`
/// (only when that changes). A 404 (the CRD is not installed) is logged once and counts as
/// [`Assigned::Local`]; the watch keeps retrying with the backoff of
/// [`Retry`](super::Retry) and picks the CRD up when it appears. Other errors (403 from RBAC, 5xx, an object this version
/// cannot decode) are logged and keep the last assignment; while none is known yet, the engine
/// runs on the local configuration after [`ASSIGNMENT_WAIT`](crate::engine::ASSIGNMENT_WAIT).
pub async fn watch_assigned(client: Client, node: String, assigned: watch::Sender<Assigned>) {
    let api = Api::<NodeProxyConfig>::all(client);
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
                publish(listing.take().map_or(Assigned::Local, spec_of));
            }
            Ok(Event::Apply(object)) => publish(spec_of(object)),
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
pub fn assigned_from(configs: &[NodeProxyConfig], node: &str) -> Assigned {
    configs
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(node))
        .map_or(Assigned::Local, |c| spec_of(c.clone()))
}

/// What a NodeProxyConfig assigns.
fn spec_of(object: NodeProxyConfig) -> Assigned {
    Assigned::Revision {
        revision: object.spec.revision,
        config: Box::new(object.spec.config),
    }
}
