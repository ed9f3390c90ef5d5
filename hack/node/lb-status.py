#!/usr/bin/env python3
"""A cloud's load-balancer controller as far as the node's Service tests see it (hack/test-node.sh --conformance):
every LoadBalancer Service without an ingress address gets one from PREFIX (PREFIX.100 up, one per Service, not
reused while a Service holds it) in its status, which kipvs then programs on the node. No load balancer stands in
front: PREFIX.0/24 is routed to the node, as a cloud's load balancer forwards to it.

usage: lb-status.py APISERVER TOKEN PREFIX     (one pass; prints "NAMESPACE/NAME IP" per address given)
"""
import json
import ssl
import sys
import urllib.request

api, token, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = ssl._create_unverified_context()  # the test apiserver's self-signed certificate


def call(method, path, body=None):
    req = urllib.request.Request(api + path, method=method, data=json.dumps(body).encode() if body else None)
    req.add_header("Authorization", "Bearer " + token)
    if body is not None:
        req.add_header("Content-Type", "application/merge-patch+json")
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return json.load(r)


services = call("GET", "/api/v1/services")["items"]
held = {i.get("ip") for s in services for i in (s.get("status", {}).get("loadBalancer", {}).get("ingress") or [])}
free = (f"{prefix}.{n}" for n in range(100, 255) if f"{prefix}.{n}" not in held)
for s in services:
    if s["spec"].get("type") != "LoadBalancer" or (s.get("status", {}).get("loadBalancer", {}).get("ingress")):
        continue
    ip = next(free)
    m = s["metadata"]
    call("PATCH", f"/api/v1/namespaces/{m['namespace']}/services/{m['name']}/status",
         {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})
    print(f"{m['namespace']}/{m['name']} {ip}", flush=True)
