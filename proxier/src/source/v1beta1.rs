//! `discovery.k8s.io/v1beta1` EndpointSlices, read where the API server does not serve
//! `discovery.k8s.io/v1` (Kubernetes 1.20). Kubernetes API: `discovery.k8s.io/v1beta1` is served
//! in 1.17–1.24, `discovery.k8s.io/v1` from 1.21.
//!
//! k8s-openapi's `latest` has no v1beta1 discovery types, so [`EndpointSlice`] is the source's
//! own, with what the store reads and no more; its parts whose JSON is the same in both versions
//! (`metadata`, `ports`, `conditions`, `hints`, `targetRef`) are k8s-openapi's v1 types. Each
//! object becomes a v1 [`v1::EndpointSlice`] ([`From`]) before the store converts it
//! ([`super::convert::slice`]), so both versions take one conversion path.

use crate::model::objects::ZONE_LABEL;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{self, EndpointConditions, EndpointHints, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The `topology` key of an endpoint's node in v1beta1 (`kubernetes.io/hostname`: the
/// EndpointSlice controller writes the pod's `spec.nodeName` there).
pub const HOSTNAME_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// A `discovery.k8s.io/v1beta1` EndpointSlice, as a 1.17–1.24 API server returns it: what the
/// store reads of it.
///
/// Shape (JSON): `{"metadata": {..}, "addressType": "IPv4", "endpoints": [..], "ports":
/// [{"name", "protocol", "port", "appProtocol"}]}`, `endpoints` being [`Endpoint`]s. The API
/// server writes an empty `endpoints` as `null` (Go's nil slice without `omitempty`), as it may
/// any list here.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    /// The object's metadata (name, namespace, labels, annotations), as in v1.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `IPv4`, `IPv6` or `FQDN`, as in v1.
    #[serde(default)]
    pub address_type: String,
    /// The endpoints.
    pub endpoints: Option<Vec<Endpoint>>,
    /// The ports, as in v1.
    pub ports: Option<Vec<EndpointPort>>,
}

/// One `endpoints[]` entry of a v1beta1 EndpointSlice.
///
/// Shape (JSON): `{"addresses": ["10.244.1.2"], "conditions": {"ready", "serving",
/// "terminating"}, "hostname", "targetRef": {..}, "topology": {"kubernetes.io/hostname": "node-a",
/// "topology.kubernetes.io/zone": "zone-a", ..}, "nodeName", "hints": {"forZones": [{"name"}]}}`.
/// `nodeName` is behind the `EndpointSliceNodeName` gate in 1.20 (`topology` carries the node
/// in any case), `serving` and `terminating` behind `EndpointSliceTerminatingCondition`, and
/// `hints` came with 1.21.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Its addresses (the first one is read).
    pub addresses: Option<Vec<String>>,
    /// `ready`, `serving`, `terminating`, as in v1.
    pub conditions: Option<EndpointConditions>,
    /// Its hostname.
    pub hostname: Option<String>,
    /// The object it stands for (a Pod).
    pub target_ref: Option<ObjectReference>,
    /// Topology labels: [`HOSTNAME_TOPOLOGY_KEY`] and [`ZONE_LABEL`] are read.
    pub topology: Option<BTreeMap<String, String>>,
    /// Its node, where the API server sets it.
    pub node_name: Option<String>,
    /// Topology hints (`forZones`), as in v1.
    pub hints: Option<EndpointHints>,
}

impl Resource for EndpointSlice {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "EndpointSlice".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "discovery.k8s.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1beta1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "endpointslices".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<EndpointSlice> for v1::EndpointSlice {
    /// The v1 object for a v1beta1 one: metadata, `addressType`, ports and every endpoint
    /// ([`v1::Endpoint::from`]) as they are.
    fn from(slice: EndpointSlice) -> Self {
        v1::EndpointSlice {
            metadata: slice.metadata,
            address_type: slice.address_type,
            endpoints: slice
                .endpoints
                .map(|endpoints| endpoints.into_iter().map(v1::Endpoint::from).collect()),
            ports: slice.ports,
        }
    }
}

impl From<Endpoint> for v1::Endpoint {
    /// The v1 endpoint for a v1beta1 one: `nodeName`, else `topology["kubernetes.io/hostname"]`
    /// (the key kube-proxy 1.20 reads; 1.21's reads `nodeName` first), gives `nodeName`; `topology["topology.kubernetes.io/zone"]`
    /// gives `zone`; the rest as it is. The other topology keys, v1's `deprecatedTopology`, are
    /// read by nothing and left out.
    fn from(endpoint: Endpoint) -> Self {
        let mut topology = endpoint.topology.unwrap_or_default();
        v1::Endpoint {
            addresses: endpoint.addresses.unwrap_or_default(),
            conditions: endpoint.conditions,
            deprecated_topology: None,
            hints: endpoint.hints,
            hostname: endpoint.hostname,
            node_name: endpoint
                .node_name
                .or_else(|| topology.remove(HOSTNAME_TOPOLOGY_KEY)),
            target_ref: endpoint.target_ref,
            zone: topology.remove(ZONE_LABEL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::SliceInfo;
    use crate::source::store::Store;
    use serde_json::{Value, json};

    /// A Service's slice as a 1.20 API server returns it in v1beta1: topology for node and zone,
    /// one endpoint with `nodeName` as well (the gate on), one terminating but serving, one with
    /// hints (1.21–1.24), one without topology or conditions, one with a null address list.
    fn v1beta1_json() -> Value {
        json!({
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1beta1",
            "metadata": {"name": "web-abc12", "namespace": "shop", "resourceVersion": "731",
                         "generateName": "web-",
                         "labels": {"kubernetes.io/service-name": "web",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2021-01-13T10:00:00Z"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.2"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "u1", "resourceVersion": "700"},
                 "topology": {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "zone-a",
                              "topology.kubernetes.io/region": "region-1"}},
                {"addresses": ["10.244.2.3"], "conditions": {"ready": false, "serving": true, "terminating": true},
                 "topology": {"kubernetes.io/hostname": "node-b", "topology.kubernetes.io/zone": "zone-b"},
                 "nodeName": "node-b"},
                {"addresses": ["10.244.3.4"], "conditions": {"ready": true},
                 "topology": {"kubernetes.io/hostname": "node-c", "topology.kubernetes.io/zone": "zone-a"},
                 "hints": {"forZones": [{"name": "zone-a"}]}},
                {"addresses": ["10.244.4.5"], "hostname": "pod-4",
                 "conditions": {"ready": false, "serving": false, "terminating": true},
                 "topology": {"kubernetes.io/hostname": "node-d"}, "nodeName": "node-d-by-name"},
                {"addresses": ["10.244.5.6"]},
                {"addresses": null, "conditions": {"ready": true}}
            ],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080},
                      {"name": "dns", "protocol": "UDP", "port": 53, "appProtocol": "dns"}]
        })
    }

    /// The same slice as v1 has it (what a 1.21+ API server returns for it).
    fn v1_json() -> Value {
        json!({
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "web-abc12", "namespace": "shop", "resourceVersion": "731",
                         "generateName": "web-",
                         "labels": {"kubernetes.io/service-name": "web",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2021-01-13T10:00:00Z"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.2"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "u1", "resourceVersion": "700"},
                 "nodeName": "node-a", "zone": "zone-a",
                 "deprecatedTopology": {"topology.kubernetes.io/region": "region-1"}},
                {"addresses": ["10.244.2.3"], "conditions": {"ready": false, "serving": true, "terminating": true},
                 "nodeName": "node-b", "zone": "zone-b"},
                {"addresses": ["10.244.3.4"], "conditions": {"ready": true},
                 "nodeName": "node-c", "zone": "zone-a",
                 "hints": {"forZones": [{"name": "zone-a"}]}},
                {"addresses": ["10.244.4.5"], "hostname": "pod-4",
                 "conditions": {"ready": false, "serving": false, "terminating": true},
                 "nodeName": "node-d-by-name",
                 "deprecatedTopology": {"kubernetes.io/hostname": "node-d"}},
                {"addresses": ["10.244.5.6"]},
                {"addresses": [], "conditions": {"ready": true}}
            ],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080},
                      {"name": "dns", "protocol": "UDP", "port": 53, "appProtocol": "dns"}]
        })
    }

    fn v1beta1_slice(json: Value) -> EndpointSlice {
        serde_json::from_value(json).expect("a v1beta1 EndpointSlice")
    }

    fn v1_slice(json: Value) -> v1::EndpointSlice {
        serde_json::from_value(json).expect("a v1 EndpointSlice")
    }

    /// What the store keeps of `slice` (a Service `shop/web` slice): its converted value with
    /// its key and trigger time, and the Service's slices once it is put in.
    fn stored(slice: v1::EndpointSlice) -> (String, Vec<SliceInfo>) {
        let mut store = Store::default();
        let converted = format!("{:?}", store.convert_slice(&slice));
        store.upsert_slice(slice);
        let service = ("shop".to_owned(), "web".to_owned());
        let slices = store.slices_of(&service).into_iter().cloned().collect();
        (converted, slices)
    }

    #[test]
    fn a_v1beta1_slice_is_stored_as_its_v1_equivalent() {
        let converted = v1::EndpointSlice::from(v1beta1_slice(v1beta1_json()));
        let (text, slices) = stored(converted.clone());
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].endpoints.len(), 6);
        assert!(text.contains("trigger_time: Some("), "{text}");
        assert_eq!((text, slices), stored(v1_slice(v1_json())));
        // What v1 reads, field by field (deprecatedTopology aside).
        let mut expected = v1_slice(v1_json());
        for endpoint in expected.endpoints.iter_mut().flatten() {
            endpoint.deprecated_topology = None;
        }
        assert_eq!(converted, expected);
        let nodes: Vec<_> = converted
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.node_name.as_deref())
            .collect();
        assert_eq!(
            nodes,
            [
                Some("node-a"),
                Some("node-b"),
                Some("node-c"),
                Some("node-d-by-name"),
                None,
                None
            ]
        );
    }

    #[test]
    fn conditions_hints_and_topology_convert_one_to_one() {
        // An endpoint each: the v1beta1 fields on the left, the v1 ones on the right.
        for (v1beta1, v1) in [
            (
                json!({"addresses": ["10.0.0.1"]}),
                json!({"addresses": ["10.0.0.1"]}),
            ),
            (
                json!({"addresses": ["10.0.0.1"], "topology": {"kubernetes.io/hostname": "n"}}),
                json!({"addresses": ["10.0.0.1"], "nodeName": "n"}),
            ),
            (
                json!({"addresses": ["10.0.0.1"], "nodeName": "m", "topology": {"kubernetes.io/hostname": "n"}}),
                json!({"addresses": ["10.0.0.1"], "nodeName": "m"}),
            ),
            (
                json!({"addresses": ["10.0.0.1"], "topology": {"topology.kubernetes.io/zone": "z"}}),
                json!({"addresses": ["10.0.0.1"], "zone": "z"}),
            ),
            (
                json!({"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}}),
                json!({"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}}),
            ),
            (
                json!({"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "z"}, {"name": "y"}]}}),
                json!({"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "z"}, {"name": "y"}]}}),
            ),
        ] {
            let beta: Endpoint = serde_json::from_value(v1beta1.clone()).unwrap();
            let v1: v1::Endpoint = serde_json::from_value(v1).unwrap();
            assert_eq!(v1::Endpoint::from(beta), v1, "{v1beta1}");
        }
    }

    #[test]
    fn null_lists_are_empty_and_the_resource_is_v1beta1() {
        let slice = v1beta1_slice(json!({
            "metadata": {"name": "web-empty", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": null, "ports": null
        }));
        let (_, slices) = stored(slice.clone().into());
        assert_eq!(slices.len(), 1);
        assert!(slices[0].endpoints.is_empty() && slices[0].ports.is_empty());
        assert_eq!(
            stored(slice.into()),
            stored(v1_slice(json!({
                "metadata": {"name": "web-empty", "namespace": "shop",
                             "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4", "endpoints": []
            })))
        );
        assert_eq!(EndpointSlice::api_version(&()), "discovery.k8s.io/v1beta1");
        assert_eq!(
            EndpointSlice::url_path(&(), None),
            "/apis/discovery.k8s.io/v1beta1/endpointslices"
        );
        assert_eq!(
            EndpointSlice::url_path(&(), Some("shop")),
            "/apis/discovery.k8s.io/v1beta1/namespaces/shop/endpointslices"
        );
    }
}
