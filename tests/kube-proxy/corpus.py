#!/usr/bin/env python3
"""The corpus of the kube-proxy parity check (hack/parity-kube-proxy.sh): clusters of Services,
EndpointSlices and a Node, each with the proxy settings both proxiers get.

usage: corpus.py OUT_DIR --minor MINOR [--vectors PLAN_DIR] [--only NAME,...] [--generated N]
                 [--per-cluster K] [--seed S] [--scale N,...]

MINOR is the release under test (1.MINOR: kube-apiserver and kube-proxy, hack/lib/k8s-build.sh k8s_minor).
The objects and settings are written as that release takes them: EndpointSlices through
tests/lib/k8s_api.py endpointslice_for (v1beta1 before 1.21), and kube-proxy's configuration with only the
feature gates, schedulers and nodePortAddresses keywords that release knows (kube_proxy_config).

Writes one directory per cluster under OUT_DIR:
  objects.yaml    Namespaces, the Node test-node (without status) and the Services and EndpointSlices
                  (labelled kipvs-parity=1, so that they can be deleted between clusters)
  status.txt      status merge patches to make after the apply, one "API_PATH JSON" a line (the Node's
                  addresses, Services' load-balancer ingress)
  kube-proxy.yaml the KubeProxyConfiguration kube-proxy 1.MINOR runs with
  kipvs.yaml      the same file for kipvs, with the cluster's own gates (kipvs's) in place of kube-proxy's
                  (a kube-proxy given a gate its release does not know refuses to start)
  addrs           addresses the guest puts on a dummy interface (node0) besides loopback: the node IPs and
                  the addresses of the node's other interfaces, as a node would have them
  node-ips        the Node's InternalIPs, one a line
  not-comparable  (when kube-proxy 1.MINOR refuses the settings, e.g. a scheduler it does not know) why; the
                  driver names the cluster and runs neither proxier
  source          where the cluster comes from (the plan vector, or "generated seed S")
  create-P.json   (scale clusters) the Services and EndpointSlices as four Lists, for four `kubectl create`
                  at once; objects.yaml then holds the Namespaces and the Node only

Two sources:
- the plan vectors (proxier/testdata/plan/*/input.yaml, every step of a multi-step one): the objects as
  they are, the node IPs of their `# node-ips:` comment (the Node's InternalIPs otherwise), the
  `# other-interface-addresses:` too, and their config.yaml (a kipvs ProxierConfiguration, whose fields
  are kube-proxy's) as KubeProxyConfiguration. ClusterIPs and NodePorts are moved into the test
  apiserver's ranges (10.96.0.0/16 and fd00:10:96::/112, 30000-32767), one new value per old value and
  unique over the corpus (no release/reuse race between clusters). A vector the apiserver rejects is
  reported by the driver and not compared.
- generated clusters (--generated N clusters of --per-cluster K Services, random with --seed): Service
  types, ports, protocols (TCP, UDP, SCTP), session affinity, traffic policies, externalIPs, load
  balancer ingress and source ranges, endpoint counts and conditions, local and remote nodeNames, zones
  and hints (with the topology-aware-hints annotation), one of a few proxy settings per cluster.
- scale clusters (--scale N: cluster scale-N, hack/bench-vs-kube-proxy.sh): N ClusterIP Services, one TCP
  port each, with an EndpointSlice of two ready endpoints on other nodes, default settings.
"""
import argparse
import ipaddress
import json
import os
import random
import re
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from k8s_api import endpointslice_for  # noqa: E402

NODE = "test-node"
MINOR = 24  # the release under test, 1.MINOR (main sets it from --minor)
LABEL = {"kipvs-parity": "1"}


class Alloc:
    """Unique ClusterIPs and NodePorts in the test apiserver's ranges, over the whole corpus."""

    def __init__(self):
        self.v4 = 100 * 256  # 10.96.100.0 on: clear of 10.96.0.1 (the kubernetes Service)
        self.v6 = 0x1000
        self.port = 30000
        self.maps = {}

    def ip(self, old=None):
        key = ("ip", old)
        if old is not None and key in self.maps:
            return self.maps[key]
        fam6 = old is not None and ":" in old
        if fam6:
            self.v6 += 1
            new = str(ipaddress.IPv6Address(int(ipaddress.IPv6Address("fd00:10:96::")) + self.v6))
        else:
            self.v4 += 1
            if self.v4 % 256 in (0, 255):
                self.v4 += 2
            new = str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.96.0.0")) + self.v4))
        if old is not None:
            self.maps[key] = new
        return new

    def node_port(self, old=None):
        key = ("port", old)
        if old is not None and key in self.maps:
            return self.maps[key]
        self.port += 1
        if self.port > 32767:
            sys.exit("corpus: out of NodePorts (30000-32767)")
        if old is not None:
            self.maps[key] = self.port
        return self.port


def kube_proxy_gates(gates, minor):
    """The feature gates kube-proxy 1.MINOR runs with, for a cluster whose (kipvs) gates are GATES: only gates
    that release knows (it refuses any other), and only where they matter to the comparison."""
    kp = {}
    if minor == 20:
        # alpha in 1.20, off by default: the dual-stack proxier (cmd/kube-proxy/app/server_others.go
        # IPv6DualStack) and an endpoint's nodeName (pkg/proxy/endpointslicecache.go EndpointSliceNodeName),
        # as the apiserver runs with them (hack/control-plane.sh)
        kp.update(IPv6DualStack=True, EndpointSliceNodeName=True)
    if 22 <= minor <= 27:
        # alpha 1.22-1.25 (off), beta 1.26-1.27, GA (locked on) from 1.28: given explicitly, both follow the
        # cluster's setting (kipvs's gates default to on)
        kp["ProxyTerminatingEndpoints"] = gates.get("ProxyTerminatingEndpoints", True)
    if 21 <= minor <= 32:
        # alpha 1.21-1.22, beta from 1.23 (off by default in some), GA in 1.33: on, as kipvs always reads hints
        kp["TopologyAwareHints"] = True
    return kp


# The schedulers kube-proxy accepts (pkg/proxy/apis/config/validation/validation.go
# validateIPVSSchedulerMethod: the same list in 1.20 and 1.24, "" is rr)
SCHEDULERS = {"", "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq"}


def kube_proxy_config(settings, minor):
    """The KubeProxyConfiguration of SETTINGS (kube-proxy field names: ipvs, nodePortAddresses,
    featureGates, iptables.masqueradeAll, clusterCIDR) for kube-proxy 1.MINOR and for kipvs. Every field
    written here is in 1.20's KubeProxyConfiguration v1alpha1."""
    base = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "ipvs",
        "hostnameOverride": NODE,
        "clientConnection": {"kubeconfig": "/payload/kube-proxy/kubeconfig"},
        "metricsBindAddress": "127.0.0.1:10249",
        # kube-proxy would size the conntrack table from the CPU count (writes to /sys/module); not compared
        "conntrack": {"maxPerCore": 0, "min": 0},
    }
    ipvs = dict(settings.get("ipvs") or {})
    ipvs.setdefault("strictARP", False)
    base["ipvs"] = ipvs
    for key in ("nodePortAddresses", "clusterCIDR"):
        if key in settings:
            base[key] = settings[key]
    if (settings.get("nftables") or {}).get("masqueradeAll") or (settings.get("iptables") or {}).get("masqueradeAll"):
        base["iptables"] = {"masqueradeAll": True}
    gates = dict(settings.get("featureGates") or {})
    kp = dict(base)
    kp_gates = kube_proxy_gates(gates, minor)
    if kp_gates:
        kp["featureGates"] = kp_gates
    kv = dict(base)
    kv["featureGates"] = gates
    # the nodePortAddresses keyword "primary" (the node's primary IPs) came in 1.29; before, kube-proxy
    # refuses anything but a CIDR (validation.go validateNodePortAddresses), so kipvs alone reads it
    if minor < 29 and any(a == "primary" for a in base.get("nodePortAddresses", [])):
        kp["nodePortAddresses"] = [a for a in base["nodePortAddresses"] if a != "primary"]
    return kp, kv


def write_cluster(out, name, source, docs, status, settings, addrs):
    """Writes the files of the module doc for cluster NAME under OUT (MINOR: the module's global)."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    scheduler = (settings.get("ipvs") or {}).get("scheduler", "")
    if scheduler not in SCHEDULERS:
        with open(os.path.join(d, "not-comparable"), "w") as f:
            f.write(f"kube-proxy 1.{MINOR} refuses ipvs.scheduler {scheduler} (not in its validation's list)\n")
    namespaces = sorted({o["metadata"].get("namespace", "default") for o in docs if o["kind"] != "Node"})
    objs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces if n != "default"]
    objs += [endpointslice_for(o, MINOR) for o in docs]
    with open(os.path.join(d, "objects.yaml"), "w") as f:
        yaml.safe_dump_all(objs, f, sort_keys=False)
    with open(os.path.join(d, "status.txt"), "w") as f:
        for path, body in status:
            f.write(f"{path} {json.dumps(body, separators=(',', ':'))}\n")
    kp, kv = kube_proxy_config(settings, MINOR)
    for fname, conf in (("kube-proxy.yaml", kp), ("kipvs.yaml", kv)):
        with open(os.path.join(d, fname), "w") as f:
            yaml.safe_dump(conf, f, sort_keys=False)
    with open(os.path.join(d, "addrs"), "w") as f:
        for a in addrs:
            f.write(a + "\n")
    with open(os.path.join(d, "source"), "w") as f:
        f.write(source + "\n")
    node_ips = [a["address"] for a in status[0][1]["status"]["addresses"]]
    with open(os.path.join(d, "node-ips"), "w") as f:
        f.write("".join(a + "\n" for a in node_ips))


def node_object(labels, addresses):
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": dict(labels or {})}}
    node["metadata"]["labels"].setdefault("kubernetes.io/hostname", NODE)
    status = {"status": {"addresses": [{"type": "InternalIP", "address": a} for a in addresses],
                         "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "parity"}]}}
    return node, (f"/api/v1/nodes/{NODE}", status)


def comment_list(text, key):
    m = re.search(rf"^# {key}: (.*)$", text, re.M)
    return [a.strip() for a in m.group(1).split(",") if a.strip()] if m else []


def vector_clusters(plan_dir, only):
    """(name, dir) of every planned snapshot: single cases and the steps of multi-step ones."""
    out = []
    for name in sorted(os.listdir(plan_dir)):
        d = os.path.join(plan_dir, name)
        if not os.path.isdir(d):
            continue
        if os.path.exists(os.path.join(d, "input.yaml")):
            out.append((name, d))
        else:
            for step in sorted(os.listdir(d)):
                if os.path.exists(os.path.join(d, step, "input.yaml")):
                    out.append((f"{name}.{step}", os.path.join(d, step)))
    if only:
        out = [(n, d) for n, d in out if n in only or n.split(".")[0] in only]
    return out


def from_vector(out, name, d, alloc):
    """Writes the cluster of the plan vector in D (see the module doc)."""
    text = open(os.path.join(d, "input.yaml")).read()
    docs = []
    try:
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict):
                docs += doc.get("items", []) if doc.get("kind", "").endswith("List") else [doc]
    except yaml.YAMLError as e:
        print(f"corpus: {name}: not compared, its input is not YAML ({str(e).splitlines()[0]})", file=sys.stderr)
        return
    settings = {}
    if os.path.exists(os.path.join(d, "config.yaml")):
        settings = yaml.safe_load(open(os.path.join(d, "config.yaml"))) or {}
    node_ips = comment_list(text, "node-ips")
    other = comment_list(text, "other-interface-addresses")
    objs, status, node = [], [], None
    for o in docs:
        kind = o.get("kind")
        meta = o.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(LABEL)
        if kind == "Node":
            if meta.get("name") != NODE:
                continue  # other nodes matter to neither proxier
            node = o
            continue
        if kind == "Service":
            spec = o.setdefault("spec", {})
            if MINOR < 24 and spec.get("type", "ClusterIP") == "ClusterIP" and spec.get("externalTrafficPolicy") == "Cluster":
                # 1.20 rejects any externalTrafficPolicy on a ClusterIP Service (1.24 takes it); Cluster is
                # what such a Service does anyway
                del spec["externalTrafficPolicy"]
            if spec.get("externalIPs"):
                # the apiserver refuses a loopback, link-local or unspecified externalIP and with it the
                # Service (1.20 pkg/apis/core/validation/validation.go:5721-5731): the vector's other addresses stay comparable
                spec["externalIPs"] = [a for a in spec["externalIPs"] if not special_ip(a)]
            ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
            if ips and ips[0] != "None":
                new = [alloc.ip(ip) for ip in ips]
                spec["clusterIP"] = new[0]
                if "clusterIPs" in spec:
                    spec["clusterIPs"] = new
            for p in spec.get("ports", []):
                if "nodePort" in p:
                    p["nodePort"] = alloc.node_port(p["nodePort"])
            if "healthCheckNodePort" in spec:
                spec["healthCheckNodePort"] = alloc.node_port(spec["healthCheckNodePort"])
            elif spec.get("type") == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local":
                spec["healthCheckNodePort"] = alloc.node_port()  # (see gen_service)
            st = o.pop("status", None)
            if st:
                status.append((f"/api/v1/namespaces/{meta.get('namespace', 'default')}/services/{meta['name']}", {"status": st}))
        objs.append(o)
    if node is not None:
        addresses = node_ips or [a["address"] for a in (node.get("status") or {}).get("addresses", []) if a.get("type") == "InternalIP"]
        n, st = node_object(node["metadata"].get("labels"), addresses)
    else:
        n, st = node_object({}, node_ips)
    n["metadata"]["labels"].update(LABEL)
    objs.insert(0, n)
    status.insert(0, st)
    write_cluster(out, name, f"proxier/testdata/plan/{name.replace('.', '/')}", objs, status, settings, local_addrs(node_ips or [a["address"] for a in st[1]["status"]["addresses"]], other))


def special_ip(a):
    """Whether A is an address the apiserver refuses as an externalIP (or not an address at all: kept, for
    the apiserver to judge)."""
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return False
    return ip.is_unspecified or ip.is_loopback or ip.is_link_local


def local_addrs(node_ips, other):
    """What the guest binds on node0: everything but loopback (already on lo)."""
    seen = []
    for a in node_ips + other:
        if ipaddress.ip_address(a).is_loopback or a in seen:
            continue
        seen.append(a)
    return seen


# ---- generated clusters ---------------------------------------------------------------------------

GEN_SETTINGS = [
    {},
    {"ipvs": {"scheduler": "wrr"}},
    {"featureGates": {"ProxyTerminatingEndpoints": False}},
    {"nodePortAddresses": ["192.168.100.0/24"]},
    {"ipvs": {"scheduler": "sh"}, "iptables": {"masqueradeAll": True}},
]
NODE_IP = "192.168.100.1"
OTHER_IP = "192.168.200.1"


def gen_service(rng, alloc, ns, i):
    name = f"s{i}"
    typ = rng.choice(["ClusterIP", "ClusterIP", "NodePort", "LoadBalancer"])
    spec = {"type": typ, "clusterIP": alloc.ip()}
    protos = rng.choice([["TCP"], ["UDP"], ["TCP", "UDP"], ["SCTP"], ["TCP", "TCP"]])
    ports, slice_ports = [], []
    for k, proto in enumerate(protos):
        p = {"name": f"p{k}", "port": 80 + k * 1000 + rng.randrange(3), "protocol": proto, "targetPort": 8080 + k}
        if typ != "ClusterIP":
            p["nodePort"] = alloc.node_port()
        ports.append(p)
        slice_ports.append({"name": f"p{k}", "port": 8080 + k, "protocol": proto})
    spec["ports"] = ports
    if rng.random() < 0.25:
        spec["sessionAffinity"] = "ClientIP"
        if rng.random() < 0.5:
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": rng.choice([60, 3600, 10800])}}
    if typ != "ClusterIP" and rng.random() < 0.4:
        spec["externalTrafficPolicy"] = "Local"
        if typ == "LoadBalancer":
            # from the corpus's ports: one the apiserver picks may be a later Service's nodePort, which it
            # then refuses while the earlier cluster's deletion is not through
            spec["healthCheckNodePort"] = alloc.node_port()
    # (internalTrafficPolicy Local only on ClusterIP Services: kube-proxy 1.21-1.25 applies it to the NodePort
    # and load-balancer virtual servers too, a deviation the plan vectors show on their own; a 1.20 apiserver
    # drops the field)
    if typ == "ClusterIP" and rng.random() < 0.3:
        spec["internalTrafficPolicy"] = "Local"
    if rng.random() < 0.2:
        spec["externalIPs"] = [f"203.0.113.{i % 250 + 1}"]
    status = None
    if typ == "LoadBalancer":
        if rng.random() < 0.3:
            spec["loadBalancerSourceRanges"] = rng.choice([["198.51.100.0/24"], ["198.51.100.0/24", "192.168.100.0/24"]])
        if rng.random() < 0.8:
            status = {"status": {"loadBalancer": {"ingress": [{"ip": f"198.18.{i // 250}.{i % 250 + 1}"}]}}}
    # Hints only where kube-proxy 1.21-1.26 reads them too: with its annotation, and not with
    # externalTrafficPolicy Local (it then ignores hints for the whole Service); the other cases are plan
    # vectors of their own. (A 1.20 apiserver drops hints: EndpointSlice hints came in 1.21.)
    hinted = "externalTrafficPolicy" not in spec and rng.random() < 0.3
    annotations = {"service.kubernetes.io/topology-aware-hints": "auto"} if hinted else {}
    meta = {"name": name, "namespace": ns, "labels": dict(LABEL)}
    if annotations:
        meta["annotations"] = annotations
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}
    eps = []
    for e in range(rng.choice([0, 1, 2, 2, 3, 4])):
        cond = rng.choice([(True, True, False)] * 4 + [(False, True, True), (False, False, True), (False, False, False)])
        ep = {"addresses": [f"10.244.{i % 250}.{e + 10}"],
              "conditions": {"ready": cond[0], "serving": cond[1], "terminating": cond[2]},
              "nodeName": rng.choice([NODE, NODE, "other-node"]),
              "zone": rng.choice(["zone-a", "zone-b"])}
        if hinted:
            ep["hints"] = {"forZones": [{"name": rng.choice(["zone-a", "zone-b"])}]}
        eps.append(ep)
    slc = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": f"{name}-1", "namespace": ns,
                        "labels": dict(LABEL, **{"kubernetes.io/service-name": name})},
           "addressType": "IPv4", "endpoints": eps, "ports": slice_ports}
    return svc, slc, status


def generated(out, alloc, n, k, seed):
    rng = random.Random(seed)
    for c in range(n):
        ns = f"gen{c}"
        objs, status = [], []
        for i in range(k):
            svc, slc, st = gen_service(rng, alloc, ns, c * k + i)
            objs += [svc, slc]
            if st:
                status.append((f"/api/v1/namespaces/{ns}/services/{svc['metadata']['name']}", st))
        node, st = node_object({"topology.kubernetes.io/zone": "zone-a", **LABEL}, [NODE_IP])
        settings = GEN_SETTINGS[c % len(GEN_SETTINGS)]
        write_cluster(out, f"gen-{seed}-{c}", f"generated seed {seed} cluster {c} ({k} Services)",
                      [node] + objs, [st] + status, settings, [NODE_IP, OTHER_IP])


def scale(out, alloc, n):
    """Writes cluster scale-N (see the module doc)."""
    objs = []
    for i in range(n):
        ns, name = f"scale{i % 20}", f"s{i}"
        objs.append({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": name, "namespace": ns, "labels": dict(LABEL)},
                     "spec": {"clusterIP": alloc.ip(), "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
        objs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"{name}-1", "namespace": ns,
                                  "labels": dict(LABEL, **{"kubernetes.io/service-name": name})},
                     "addressType": "IPv4",
                     "endpoints": [{"addresses": [str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.128.0.0")) + 2 * i + j))],
                                    "conditions": {"ready": True}, "nodeName": f"node-{j}"} for j in range(2)],
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
    node, st = node_object({"topology.kubernetes.io/zone": "zone-a", **LABEL}, [NODE_IP])
    name = f"scale-{n}"
    namespaces = sorted({o["metadata"]["namespace"] for o in objs})
    write_cluster(out, name, f"scale: {n} ClusterIP Services, 2 endpoints each", [node], [st], {}, [NODE_IP])
    with open(os.path.join(out, name, "objects.yaml"), "w") as f:
        yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces] + [node], f)
    for p in range(4):
        with open(os.path.join(out, name, f"create-{p}.json"), "w") as f:
            json.dump({"apiVersion": "v1", "kind": "List", "items": [endpointslice_for(o, MINOR) for o in objs[p::4]]}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vectors")
    ap.add_argument("--only", default="")
    ap.add_argument("--generated", type=int, default=0)
    ap.add_argument("--per-cluster", type=int, default=40)
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--scale", default="")
    ap.add_argument("--minor", type=int, required=True)
    a = ap.parse_args()
    global MINOR
    MINOR = a.minor
    alloc = Alloc()
    only = {x for x in a.only.split(",") if x}
    if a.vectors:
        for name, d in vector_clusters(a.vectors, only):
            from_vector(a.out, name, d, alloc)
    if a.generated:
        generated(a.out, alloc, a.generated, a.per_cluster, a.seed)
    for n in [int(x) for x in a.scale.split(",") if x]:
        scale(a.out, alloc, n)


if __name__ == "__main__":
    main()
