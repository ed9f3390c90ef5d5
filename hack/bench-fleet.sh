#!/bin/bash
# The operator's fleet benchmark (issue 15): hack/fleet.sh at several sizes, each on a fresh control
# plane, then one table: per size the issue's figures (first write, time to all Applied, spec writes
# per node, reconciles and status writes while the proxiers only sync) and the CPU seconds and peak RSS of the operator,
# kube-apiserver and etcd, with the operator's CPU per node (flat when its cost grows linearly).
# A size the control plane cannot hold shows as failed, with the fleet's own failure lines.
#
# usage: hack/bench-fleet.sh [N...]      default: 500 1000 2000 5000
# env:   OUT (logs; default a temp dir), FLEET_RELEASE (default 1: release builds, one build for all
#        sizes; FLEET_RELEASE= for the debug builds CI has), the ports of
#        hack/control-plane.sh (CP_PORT, CP_ETCD_PORT) and PORT_BASE (the operator's /metrics)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$(mktemp -d /tmp/kipvs-bench-fleet.XXXXXX)}
mkdir -p "$OUT"
SIZES=("$@")
export FLEET_RELEASE=${FLEET_RELEASE-1}
[ ${#SIZES[@]} -gt 0 ] || SIZES=(500 1000 2000 5000)
for n in "${SIZES[@]}"; do
  echo "==> $n nodes (logs in $OUT/$n)"
  mkdir -p "$OUT/$n"
  (unset KUBECONFIG KIPVS_CP_STATE; OUT=$OUT/$n hack/fleet.sh "$n" --check) > "$OUT/$n/result.txt" 2>&1
  echo "rc=$?" >> "$OUT/$n/result.txt"
  grep -E '^\| |^fleet: FAIL|^rc=' "$OUT/$n/result.txt" | sed 's/^/  /'
done
python3 - "$OUT" "${SIZES[@]}" <<'PY'
import re, sys
out, sizes = sys.argv[1], sys.argv[2:]
print("\n| nodes | first write (rev 1 / 2) | all Applied (rev 1 / 2) | spec writes per node | reconciles in quiet | "
      "operator CPU s (ms per node) | operator peak RSS | kube-apiserver CPU s / peak RSS | etcd CPU s / peak RSS | result |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in sizes:
    text = open(f"{out}/{n}/result.txt").read()
    rows = [l for l in text.splitlines() if l.startswith("| ")]
    def cells(pattern):
        return [l.rsplit("|", 2)[-2].strip() for l in rows if re.search(pattern, l)]
    first = " / ".join(cells(r"canary's NodeProxyConfig written")) or "-"
    applied = " / ".join(cells(r"answering nodes Applied")) or "-"
    writes = " / ".join(cells(r"spec writes per eligible node")) or "-"
    quiet = " ".join(cells(r"^\| quiet")) or "-"
    def per_role(pattern, fold):  # "role value, role value" in the rows matching pattern
        found = {}
        for l in rows:
            m = re.search(pattern, l)
            for part in (m.group(1).split(", ") if m else []):
                role, value = part.split(" ", 1)
                found[role] = fold(found.get(role), value)
        return found
    cpu = per_role(r"CPU seconds: (.*?) \|", lambda was, v: (was or 0.0) + float(v))
    rss = per_role(r"peak RSS \(VmHWM\) at \d+ nodes: (.*?):? \|", lambda was, v: v)
    rc = re.search(r"^rc=(\d+)", text, re.M)
    result = "ok" if rc and rc.group(1) == "0" else "FAILED (see result.txt)"
    seconds = lambda role: f"{cpu[role]:.1f}" if role in cpu else "-"
    per_node = f" ({1000 * cpu['operator'] / int(n):.2f})" if "operator" in cpu else ""
    print(f"| {n} | {first} | {applied} | {writes} | {quiet} | "
          f"{seconds('operator')}{per_node} | {rss.get('operator', '-')} | "
          f"{seconds('kube-apiserver')} / {rss.get('kube-apiserver', '-')} | "
          f"{seconds('etcd')} / {rss.get('etcd', '-')} | {result} |")
PY
