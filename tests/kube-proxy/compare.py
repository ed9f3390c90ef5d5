#!/usr/bin/env python3
"""Compares what kube-proxy and kipvs programmed for each cluster of the parity corpus
(hack/parity-kube-proxy.sh) and explains every difference by the deviations file, or reports it.

usage: compare.py CORPUS_DIR RESULTS_DIR DEVIATIONS_YAML MINOR

MINOR is the release of kube-proxy under test (1.MINOR). A deviation with `releases` ("1.20", "1.21-1.25",
"1.26-", "-1.28": inclusive ranges, comma-separated) applies to those releases only; the others do not
explain a difference there and are not listed.

RESULTS_DIR/CLUSTER/{kube-proxy,kipvs}.out hold the guest agent's `run` output (tests/kube-proxy/agent.sh:
`ipvs LINE` and `bind ADDRESS` lines, `seconds S`); RESULTS_DIR/CLUSTER/rejected-objects, when not empty,
names the objects the apiserver rejected (the cluster is compared without them). A line one side has and the other lacks is a
difference; it is explained by the first deviation whose `only_in` is that side, whose `clusters` globs
(default: every cluster) match the cluster and one of whose `lines` regular expressions matches the line
(re.search; `{LOCAL}`, `{LOCAL_NOT_NODE}`, `{SERVING_TERMINATING}`, `{ETP_LOCAL_NO_LOCAL}` and `{ITP_LOCAL_EXTERNAL}` stand for
addresses of the cluster, see placeholders()). Prints one block per cluster with differences, then the totals: clusters and Services
compared, lines compared, differences per deviation, unexplained differences (each one a defect of kipvs or
a deviation to write down). Exit status 1 when a difference is unexplained or a result is missing.
"""
import fnmatch
import json
import os
import re
import sys

import yaml

# the guest's user-mode NIC (tests/kube-proxy/guest.sh) and the address QEMU's router advertisement gives it
GUEST_NIC = ["10.0.2.15", "fec0::5054:ff:fe12:3456"]


def alternation(addrs):
    """A regular expression matching any of ADDRS as ipvsadm prints them (IPv6 in brackets) or on a bind line."""
    alts = []
    for a in addrs:
        e = re.escape(a)
        alts.append(rf"\[{e}\]" if ":" in a else rf"(?<![0-9.]){e}(?![0-9])")
        if ":" in a:
            alts.append(rf"(?<=bind ){e}$")
    return "(?:" + "|".join(alts) + ")" if alts else "(?!)"


def placeholders(cluster_dir):
    """The values of the placeholders a deviation's lines may use, for one cluster:
    LOCAL: its local addresses (the guest's NIC, addrs);
    LOCAL_NOT_NODE: those that are not node IPs (not in node-ips);
    SERVING_TERMINATING: addresses of its endpoints that are serving and terminating, not ready;
    ETP_LOCAL_NO_LOCAL: node IPs, externalIPs and load-balancer IPs of its externalTrafficPolicy Local
    Services whose endpoints include no local ready or serving+terminating one;
    ITP_LOCAL_EXTERNAL: the same addresses of its internalTrafficPolicy Local Services."""
    def read(f):
        return [a.strip() for a in open(os.path.join(cluster_dir, f)) if a.strip()]
    node = read("node-ips")
    docs = [d for d in yaml.safe_load_all(open(os.path.join(cluster_dir, "objects.yaml"))) if d]
    slices = {}
    for d in docs:
        if d["kind"] == "EndpointSlice":
            owner = (d["metadata"].get("namespace", "default"), d["metadata"]["labels"].get("kubernetes.io/service-name"))
            slices.setdefault(owner, []).extend(d.get("endpoints") or [])
    serving_terminating, etp_local = [], []
    for eps in slices.values():
        for e in eps:
            c = e.get("conditions") or {}
            if c.get("ready") is False and c.get("serving") and c.get("terminating"):
                serving_terminating += e["addresses"][:1]
    status = {}
    for line in open(os.path.join(cluster_dir, "status.txt")):
        path, body = line.split(" ", 1)
        status[path] = json.loads(body)
    itp_local = []

    def usable(e):
        c = e.get("conditions") or {}
        return e.get("nodeName") == "test-node" and (c.get("ready", True) or (c.get("serving") and c.get("terminating")))
    for d in docs:
        spec = d.get("spec") or {}
        if d["kind"] != "Service":
            continue
        ns = d["metadata"].get("namespace", "default")
        ingress = status.get(f"/api/v1/namespaces/{ns}/services/{d['metadata']['name']}", {})
        ingress = (ingress.get("status", {}).get("loadBalancer") or {}).get("ingress") or []
        external = (node if spec.get("type") in ("NodePort", "LoadBalancer") else []) + \
            (spec.get("externalIPs") or []) + [i["ip"] for i in ingress if "ip" in i]
        if spec.get("internalTrafficPolicy") == "Local":
            itp_local += external
        if spec.get("externalTrafficPolicy") == "Local" and \
                not any(usable(e) for e in slices.get((ns, d["metadata"]["name"]), [])):
            etp_local += external
    return {
        "LOCAL": alternation(GUEST_NIC + read("addrs")),
        "LOCAL_NOT_NODE": alternation([a for a in GUEST_NIC + read("addrs") if a not in node]),
        "SERVING_TERMINATING": alternation(serving_terminating),
        "ETP_LOCAL_NO_LOCAL": alternation(etp_local),
        "ITP_LOCAL_EXTERNAL": alternation(itp_local),
    }


def load_state(path):
    """The state lines of one agent output and its figures: seconds, cpu (s)."""
    lines, figures = set(), {}
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith(("ipvs ", "bind ")):
            lines.add(line)
        elif line.split(" ")[0] in ("seconds", "cpu"):
            figures[line.split()[0]] = float(line.split()[1])
    return lines, figures


def count_services(cluster_dir):
    """Services in objects.yaml and, for a scale cluster, in its create-P.json Lists."""
    docs = list(yaml.safe_load_all(open(os.path.join(cluster_dir, "objects.yaml"))))
    for f in sorted(os.listdir(cluster_dir)):
        if f.startswith("create-") and f.endswith(".json"):
            docs += yaml.safe_load(open(os.path.join(cluster_dir, f)))["items"]
    return sum(1 for d in docs if d and d.get("kind") == "Service")


def applies(deviation, minor):
    """Whether DEVIATION's `releases` (see the module doc; every release when absent) include 1.MINOR."""
    spec = str(deviation.get("releases", "")).strip()
    if not spec:
        return True

    def m(v, default):
        return int(v.split(".")[1]) if v else default
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if "-" not in part:
            hi = lo
        if m(lo, 0) <= minor <= m(hi, 10**6):
            return True
    return False


def ratio(a, b):
    return f"{a / b:.1f}x" if b else "-"


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    corpus, results, dev_path, minor = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    deviations = [d for d in yaml.safe_load(open(dev_path)) or [] if applies(d, minor)]
    for d in deviations:
        for key in ("id", "reason", "source", "only_in", "lines"):
            if key not in d:
                sys.exit(f"compare: deviation {d.get('id', '?')} has no {key}")
        if d["only_in"] not in ("kube-proxy", "kipvs"):
            sys.exit(f"compare: deviation {d['id']}: only_in must be kube-proxy or kipvs")
    hits = {d["id"]: 0 for d in deviations}
    hit_clusters = {d["id"]: set() for d in deviations}
    clusters = services = compared_lines = unexplained = missing = 0
    rejected = []  # (cluster, the apiserver's message)
    not_comparable = []  # (cluster, why kube-proxy 1.MINOR cannot run it)
    secs = {"kube-proxy": 0.0, "kipvs": 0.0}
    scale_rows = []
    for name in sorted(os.listdir(corpus)):
        rdir = os.path.join(results, name)
        nc = os.path.join(corpus, name, "not-comparable")
        if os.path.exists(nc):
            not_comparable.append((name, open(nc).read().strip()))
            continue
        rej = os.path.join(rdir, "rejected-objects")
        if os.path.exists(rej):
            rejected += [(name, line.strip()) for line in open(rej) if line.strip()]
        paths = {s: os.path.join(rdir, f"{s}.out") for s in ("kube-proxy", "kipvs")}
        if not all(os.path.exists(p) for p in paths.values()):
            print(f"MISSING {name}: no result of " + " and ".join(s for s, p in paths.items() if not os.path.exists(p)))
            missing += 1
            continue
        state, fig = {}, {}
        for side, p in paths.items():
            state[side], fig[side] = load_state(p)
            secs[side] += fig[side].get("seconds", 0.0)
        clusters += 1
        n = count_services(os.path.join(corpus, name))
        services += n
        if name.startswith("scale-"):
            scale_rows.append((name, n, fig))
        compared_lines += len(state["kube-proxy"] | state["kipvs"])
        report = []
        values = placeholders(os.path.join(corpus, name))
        regexes = {}
        for d in deviations:
            rs = []
            for r in d["lines"]:
                for k, v in values.items():
                    r = r.replace("{" + k + "}", v)
                rs.append(re.compile(r))
            regexes[d["id"]] = rs
        for side, other in (("kube-proxy", "kipvs"), ("kipvs", "kube-proxy")):
            for line in sorted(state[side] - state[other]):
                why = next((d for d in deviations if d["only_in"] == side
                            and any(fnmatch.fnmatch(name, g) for g in d.get("clusters", ["*"]))
                            and any(r.search(line) for r in regexes[d["id"]])), None)
                if why:
                    hits[why["id"]] += 1
                    hit_clusters[why["id"]].add(name)
                    report.append(f"  deviation {why['id']}: only {side}: {line}")
                else:
                    unexplained += 1
                    report.append(f"  DIFFERENCE only {side}: {line}")
        if any("DIFFERENCE" in r for r in report) or os.environ.get("PARITY_VERBOSE"):
            src = open(os.path.join(corpus, name, "source")).read().strip()
            print(f"--- {name} ({src})")
            print("\n".join(report) if report else "  identical")
    print(f"=== parity with kube-proxy 1.{minor}: {clusters} clusters ({services} Services) compared, {compared_lines} distinct lines,"
          f" kube-proxy {secs['kube-proxy']:.0f} s / kipvs {secs['kipvs']:.0f} s to converge in all")
    for name, why in not_comparable:
        print(f"  not compared: {name}: {why}")
    for name, why in rejected:
        print(f"  rejected by the apiserver, left out: {name}: {why}")
    for d in deviations:
        if hits[d["id"]]:
            print(f"  deviation {d['id']}: {hits[d['id']]} lines in {len(hit_clusters[d['id']])} clusters")
    unused = [d["id"] for d in deviations if not hits[d["id"]]]
    if unused:
        print(f"  deviations not seen in this corpus: {', '.join(unused)}")
    print(f"  unexplained differences: {unexplained}; missing results: {missing}")
    if scale_rows:
        print("=== cold start to the converged table, same kernel, same objects (kube-proxy / kipvs = ratio)")
        for name, n, fig in scale_rows:
            kp, kv = fig["kube-proxy"], fig["kipvs"]
            print(f"  {n} Services: converged {kp.get('seconds', 0):.1f} s / {kv.get('seconds', 0):.1f} s = "
                  f"{ratio(kp.get('seconds', 0), kv.get('seconds', 0))}; CPU {kp.get('cpu', 0):.1f} s / "
                  f"{kv.get('cpu', 0):.1f} s = {ratio(kp.get('cpu', 0), kv.get('cpu', 0))}")
    sys.exit(1 if unexplained or missing else 0)


if __name__ == "__main__":
    main()
