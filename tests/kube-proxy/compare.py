#!/usr/bin/env python3
"""Compares what kube-proxy and kipvs programmed for each cluster of the parity corpus
(hack/parity-kube-proxy.sh) and explains every difference by the deviations file, or reports it.

usage: compare.py CORPUS_DIR RESULTS_DIR DEVIATIONS_YAML

RESULTS_DIR/CLUSTER/{kube-proxy,kipvs}.out hold the guest agent's `run` output (tests/kube-proxy/agent.sh:
`ipvs LINE` and `bind ADDRESS` lines, `seconds S`); RESULTS_DIR/CLUSTER/rejected-objects, when not empty,
names the objects the apiserver rejected (the cluster is compared without them). A line one side has and the other lacks is a
difference; it is explained by the first deviation whose `only_in` is that side, whose `clusters` globs
(default: every cluster) match the cluster and one of whose `lines` regular expressions matches the line
(re.search; `{LOCAL_NOT_NODE}` in one stands for the cluster's local addresses that are not node IPs:
the guest's 10.0.2.15 and the cluster's addrs not in its node-ips, as ipvsadm prints them). Prints one block per cluster with differences, then the totals: clusters and Services
compared, lines compared, differences per deviation, unexplained differences (each one a defect of kipvs or
a deviation to write down). Exit status 1 when a difference is unexplained or a result is missing.
"""
import fnmatch
import os
import re
import sys

import yaml

GUEST_NIC = "10.0.2.15"  # the guest's user-mode NIC (tests/kube-proxy/guest.sh)


def local_not_node(cluster_dir):
    """A regular expression matching the cluster's local addresses that are not node IPs, as ipvsadm -Sn
    and the bind lines print them (IPv6 in brackets in ipvsadm's address:port)."""
    def read(f):
        return [a.strip() for a in open(os.path.join(cluster_dir, f)) if a.strip()]
    node = set(read("node-ips"))
    alts = []
    for a in [GUEST_NIC] + read("addrs"):
        if a not in node:
            e = re.escape(a)
            alts.append(rf"\[{e}\]" if ":" in a else rf"{e}(?![0-9])")
            if ":" in a:
                alts.append(rf"(?<=bind ){e}$")
    return "(?:" + "|".join(alts) + ")"


def load_state(path):
    """The state lines of one agent output and its figures: seconds, cpu (s), maxrss (KiB)."""
    lines, figures = set(), {}
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith(("ipvs ", "bind ")):
            lines.add(line)
        elif line.split(" ")[0] in ("seconds", "cpu", "maxrss"):
            figures[line.split()[0]] = float(line.split()[1])
    return lines, figures


def count_services(cluster_dir):
    """Services in objects.yaml and, for a scale cluster, in its create-P.json Lists."""
    docs = list(yaml.safe_load_all(open(os.path.join(cluster_dir, "objects.yaml"))))
    for f in sorted(os.listdir(cluster_dir)):
        if f.startswith("create-") and f.endswith(".json"):
            docs += yaml.safe_load(open(os.path.join(cluster_dir, f)))["items"]
    return sum(1 for d in docs if d and d.get("kind") == "Service")


def ratio(a, b):
    return f"{a / b:.1f}x" if b else "-"


def main():
    corpus, results, dev_path = sys.argv[1:4]
    deviations = yaml.safe_load(open(dev_path)) or []
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
    not_comparable = []  # (cluster, why kube-proxy 1.24 cannot run it)
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
        lnn = local_not_node(os.path.join(corpus, name))
        regexes = {d["id"]: [re.compile(r.replace("{LOCAL_NOT_NODE}", lnn)) for r in d["lines"]] for d in deviations}
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
    print(f"=== parity: {clusters} clusters ({services} Services) compared, {compared_lines} distinct lines,"
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
                  f"{kv.get('cpu', 0):.1f} s = {ratio(kp.get('cpu', 0), kv.get('cpu', 0))}; peak RSS "
                  f"{kp.get('maxrss', 0) / 1024:.0f} MiB / {kv.get('maxrss', 0) / 1024:.0f} MiB = "
                  f"{ratio(kp.get('maxrss', 0), kv.get('maxrss', 0))}")
    sys.exit(1 if unexplained or missing else 0)


if __name__ == "__main__":
    main()
