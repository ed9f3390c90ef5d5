#!/usr/bin/env python3
"""EndpointSlice churn and its latency to the kernel, for hack/bench-vs-kube-proxy.sh.

usage: churn.py write MINOR SERVER TOKEN NAMESPACE SERVICE FIRST RATE SECONDS OUT
       churn.py latency WRITES WATCH OFFSET

write: (MINOR: the release of the kube-apiserver, 1.MINOR: the EndpointSlice's group/version is the one it
  serves, tests/lib/k8s_api.py) RATE writes a second for SECONDS (paced from the start: a write that returns late is not made up
  for by a burst) to the EndpointSlice SERVICE-churn of Service SERVICE in NAMESPACE, through one
  keep-alive HTTPS connection to the kube-apiserver at SERVER (https://host:port, bearer TOKEN, the
  certificate not verified: the test control plane's own). Write k (k = FIRST, FIRST + 1, ...) is a
  server-side apply that leaves two ready endpoints: the one of sequence number k (address(k)) and
  10.251.0.1. OUT gets one line per write, "k T", T the time (this machine's clock, seconds) at which the
  apiserver's answer arrived; a write answered with anything but 200/201 fails the run.
latency: WRITES is write's OUT; WATCH the guest agent's watch-stop output (`ipvsadm -Ln -t VS` polls, each
  followed by "T CLOCK" in the guest's clock); OFFSET the guest's clock minus this machine's
  (hack/lib/guest-clock.sh). Write k is visible at the first poll whose weighted (weight > 0) real servers
  include address(j) for some j >= k: the kernel then reflects write k or a later one that replaced it.
  Polls before the first change of the churned real servers show the state before these writes and count
  for none of them.
  Prints "p50 P99 MAX SEEN WRITES" (seconds from the apiserver's answer to that poll; SEEN of WRITES
  writes became visible before the watch stopped).
"""
import http.client
import json
import ssl
import sys
import time
import os
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from k8s_api import endpointslice_api, endpointslice_for  # noqa: E402

FIXED = "10.251.0.1"


def address(k):
    """The endpoint address of write k: 10.250.0.1 on, 250 a /24 (k < 62,500)."""
    if not 0 <= k < 62500:
        sys.exit(f"churn: sequence number {k} out of range (0-62499)")
    return f"10.250.{k // 250}.{k % 250 + 1}"


def sequence(addr):
    """The sequence number of a churn address, None for any other."""
    parts = addr.split(".")
    if len(parts) != 4 or parts[:2] != ["10", "250"]:
        return None
    return int(parts[2]) * 250 + int(parts[3]) - 1


def write(minor, server, token, ns, svc, first, rate, seconds, out):
    url = urllib.parse.urlparse(server)
    conn = http.client.HTTPSConnection(url.hostname, url.port, context=ssl._create_unverified_context(), timeout=30)
    name = f"{svc}-churn"
    path = f"/apis/{endpointslice_api(minor)}/namespaces/{ns}/endpointslices/{name}?fieldManager=kipvs-bench&force=true"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/apply-patch+yaml"}
    start = time.time()
    n = int(rate * seconds)
    with open(out, "w") as f:
        for i in range(n):
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            k = first + i
            body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": svc, "kipvs-parity": "1"}},
                    "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [a], "conditions": {"ready": True}, "nodeName": "node-0"} for a in (address(k), FIXED)]}
            conn.request("PATCH", path, json.dumps(endpointslice_for(body, minor)), headers)
            resp = conn.getresponse()
            text = resp.read()
            t = time.time()
            if resp.status not in (200, 201):
                sys.exit(f"churn: write {k}: HTTP {resp.status} {text[:300]!r}")
            f.write(f"{k} {t:.4f}\n")
    took = time.time() - start
    print(f"{n} writes in {took:.1f} s ({n / took:.1f}/s)")


def latency(writes_file, watch_file, offset):
    writes = [(int(k), float(t)) for k, t in (line.split() for line in open(writes_file) if line.strip())]
    polls, current, before = [], [], None
    for line in open(watch_file):
        f = line.split()
        if f and f[0] == "T" and len(f) == 2:
            top = max((s for s in current if s is not None), default=-1)
            if before is None:
                before = top
            if polls or top != before:
                polls.append((float(f[1]) - offset, top))
            current = []
        elif len(f) >= 4 and f[0] == "->" and f[3].isdigit() and int(f[3]) > 0:
            # "  -> 10.250.0.5:8080   Masq  1  0  0": address:port, forward, weight, active, inactive
            current.append(sequence(f[1].rsplit(":", 1)[0]))
    lat = []
    for k, t in writes:
        seen = next((pt for pt, top in polls if top >= k), None)
        if seen is not None:
            lat.append(max(seen - t, 0.0))
    if not lat:
        print("- - - 0", len(writes))
        return
    lat.sort()

    def pct(p):
        return lat[min(len(lat) - 1, int(p * len(lat) + 0.999) - 1)]
    print(f"{pct(0.5):.3f} {pct(0.99):.3f} {lat[-1]:.3f} {len(lat)} {len(writes)}")


def main():
    if len(sys.argv) == 11 and sys.argv[1] == "write":
        a = sys.argv[2:]
        write(int(a[0]), a[1], a[2], a[3], a[4], int(a[5]), float(a[6]), float(a[7]), a[8])
    elif len(sys.argv) == 5 and sys.argv[1] == "latency":
        latency(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
