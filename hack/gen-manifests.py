#!/usr/bin/env python3
"""Write a synthetic cluster for benchmarks: N ClusterIP Services (one TCP port each) with an
EndpointSlice of E ready endpoints each, plus the Node, as one `kind: List` JSON file that
`kipvs-proxier --manifests` reads. usage: gen-manifests.py N E OUT.json"""
import ipaddress, json, sys

n, e, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cluster_base = int(ipaddress.IPv4Address("10.96.0.0"))
pod_base = int(ipaddress.IPv4Address("10.128.0.0"))
items = [{
    "apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-node"},
    "status": {"addresses": [{"type": "InternalIP", "address": "192.168.100.1"}]},
}]
for i in range(n):
    name, ns = f"svc-{i}", f"ns-{i % 50}"
    items.append({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "ClusterIP", "clusterIP": str(ipaddress.IPv4Address(cluster_base + 10 + i)),
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    })
    items.append({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{name}-x", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [str(ipaddress.IPv4Address(pod_base + i * e + j))],
                       "conditions": {"ready": True}, "nodeName": f"node-{j}"} for j in range(e)],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
with open(out, "w") as f:
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)
