//! Events about ProxyConfigs, published as core/v1 Events in the `default` namespace.
//!
//! kube-runtime's `Recorder` writes `events.k8s.io/v1` Events, which Kubernetes before 1.22
//! rejects for cluster-scoped objects (`involvedObject.namespace: Invalid value: "": does not
//! match event.namespace`). A core/v1 Event about a cluster-scoped object is valid in `default`
//! on every version as long as it has no `eventTime` (with one, the API server wants it in
//! `kube-system`), and `kubectl describe proxyconfig` finds it.

use crate::rollout::Note;
use k8s_openapi::api::core::v1::{Event, EventSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::OPERATOR_FIELD_MANAGER;
use kube::api::PostParams;
use kube::{Api, Client, Resource, ResourceExt};
use std::sync::atomic::{AtomicU64, Ordering};

/// Namespace of Events about cluster-scoped objects (as kubelet and client-go do).
const EVENT_NAMESPACE: &str = "default";
/// Longest message kept (the API's limit is 1 KiB for events.k8s.io; stay well inside).
const MAX_MESSAGE: usize = 1024;

/// Publishes Events about ProxyConfigs.
pub struct Publisher {
    api: Api<Event>,
    instance: String,
    sequence: AtomicU64,
}

impl Publisher {
    /// A publisher reporting as `instance` (the pod name).
    pub fn new(client: Client, instance: impl Into<String>) -> Self {
        Publisher {
            api: Api::namespaced(client, EVENT_NAMESPACE),
            instance: instance.into(),
            sequence: AtomicU64::new(0),
        }
    }

    /// Creates one Event about `pc` (a [`kipvs_crds::ProxyConfig`], or a stored one whose
    /// spec does not decode).
    ///
    /// # Errors
    /// The API's refusal.
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        pc: &K,
        note: &Note,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let event = Event {
            metadata: ObjectMeta {
                // Unique like client-go's: object name, then a timestamp (and a sequence number,
                // for Events created within one nanosecond tick).
                name: Some(format!(
                    "{}.{:x}{sequence:x}",
                    pc.name_any(),
                    now.as_nanosecond()
                )),
                namespace: Some(EVENT_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: pc.object_ref(&()),
            reason: Some(note.reason.to_owned()),
            message: Some(note.message.chars().take(MAX_MESSAGE).collect()),
            type_: Some(if note.warning { "Warning" } else { "Normal" }.to_owned()),
            action: Some("Rollout".to_owned()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(OPERATOR_FIELD_MANAGER.to_owned()),
                host: None,
            }),
            reporting_component: Some(OPERATOR_FIELD_MANAGER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        self.api
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
    }
}
