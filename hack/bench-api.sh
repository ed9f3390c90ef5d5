#!/bin/bash
# Peak memory of the proxier holding and planning a large cluster read from a real kube-apiserver
# (issue 12's 256 MiB target on the Kubernetes source, not only on the store the scale example builds
# in memory), today's tree against a baseline commit, side by side.
#
# Starts the control plane (hack/control-plane.sh, loopback, its own ports), creates SERVICES
# (default 50000) ClusterIP Services with an EndpointSlice of 10 ready endpoints each, the bench Node
# and their namespaces (hack/gen-manifests.py; created once: a cluster that already holds them is
# reused when CLUSTER_STATE names it), then runs `kipvs-proxier run --once --dataplane=fake` of
# BASELINE (default 7ee6e93, whose API source buffered each list whole as Kubernetes objects) and of
# the current tree, one after the other, and prints per binary: the peak RSS (VmHWM) when its lists
# are complete ("programming starts"), when its first plan is done ("re-planned every Service", read
# within milliseconds of the line: the sync that follows has started), and the seconds from start
# to each. The in-memory dataplane then holds a copy of the table and a log of every op, so the
# process's peak after the sync is not the node's and is not shown.
# Usage: hack/bench-api.sh [SERVICES]   env: BASELINE, CLUSTER_STATE (kept when given), CP_PORT
# (22443), CP_ETCD_PORT (25790; below the ephemeral and NodePort ranges), KEEP_BASELINE=1 (keep the baseline worktree and its build)
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/host-tools.sh && host_tools
. hack/lib/baseline.sh
services=${1:-50000}
export CP_PORT=${CP_PORT:-22443} CP_ETCD_PORT=${CP_ETCD_PORT:-25790}
out=$PWD/target/bench-api
mkdir -p "$out"
state=${CLUSTER_STATE:-$(mktemp -d /tmp/kipvs-bench-api.XXXXXX)}
stop() {
    hack/control-plane.sh stop "$state" >/dev/null 2>&1 || true
    [ -n "${CLUSTER_STATE:-}" ] || rm -rf "$state"
}
trap 'stop; baseline_cleanup' EXIT

baseline_checkout "${BASELINE:-7ee6e93}" "$out/tree"
echo "building baseline $(git -C "$out/tree" rev-parse --short HEAD) and now ($(git rev-parse --short HEAD))" >&2
(cd "$out/tree" && CARGO_TARGET_DIR=$out/target cargo build -q --release -p kipvs-proxier --bin kipvs-proxier)
cargo build -q --release -p kipvs-proxier --bin kipvs-proxier
cp "$out/target/release/kipvs-proxier" "$out/proxier-baseline"
cp target/release/kipvs-proxier "$out/proxier-now"

[ -f "$state/kubeconfig" ] && kubectl --kubeconfig "$state/kubeconfig" get --raw /readyz >/dev/null 2>&1 ||
    hack/control-plane.sh start "$state" >&2
export KUBECONFIG=$state/kubeconfig
count() { kubectl get "$1" -A --no-headers 2>/dev/null | grep -c ' svc-' || true; }
have=$(count services) slices=$(count endpointslices)
if [ "$have" -lt "$services" ] || [ "$slices" -lt "$services" ]; then
    echo "creating $services Services and their EndpointSlices (the apiserver holds $have)" >&2
    hack/gen-manifests.py "$services" 10 "$out/cluster.json"
    python3 - "$out/cluster.json" "$out" <<'EOF'
import json, sys
items = json.load(open(sys.argv[1]))["items"]
namespaces = sorted({i["metadata"]["namespace"] for i in items if "namespace" in i["metadata"]})
lists = [[{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]
         + [i for i in items if i["kind"] == "Node"]]
objects = [i for i in items if i["kind"] != "Node"]
lists += [objects[p::4] for p in range(4)]  # four kubectl processes at once
for p, l in enumerate(lists):
    json.dump({"apiVersion": "v1", "kind": "List", "items": l}, open(f"{sys.argv[2]}/create-{p}.json", "w"))
EOF
    kubectl apply -f "$out/create-0.json" >/dev/null
    for p in 1 2 3 4; do kubectl create -f "$out/create-$p.json" 2>&1 | grep -v ' created$\|AlreadyExists' & done
    wait
fi
have=$(count services) slices=$(count endpointslices)
echo "the apiserver holds $have bench Services and $slices of their EndpointSlices" >&2
[ "$have" -ge "$services" ] && [ "$slices" -ge "$services" ] || { echo "bench-api: objects missing" >&2; exit 1; }

measure() { # name -> "name listed_mib listed_s planned_mib planned_s"
    local name=$1 pid start line listed=() planned=()
    start=$(date +%s.%N)
    # The first line is the pid of the process that becomes the proxier (exec keeps it).
    exec 3< <(echo "pid $BASHPID"; RUST_LOG=info,kipvs_proxier::engine=debug exec "$out/proxier-$name" \
        run --once --dataplane=fake --kubeconfig "$KUBECONFIG" --node bench-node \
        --healthz-bind-address 127.0.0.1:0 --metrics-bind-address 127.0.0.1:0 2>&1)
    read -r _ pid <&3
    hwm() { awk '/^VmHWM:/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status"; }
    elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)"; }
    while IFS= read -r line <&3; do
        echo "$line" >>"$out/$name.log"
        case $line in
        *"programming starts"*) listed=("$(hwm)" "$(elapsed)") ;;
        *"re-planned every Service"*) planned=("$(hwm)" "$(elapsed)") ;;
        esac
    done
    exec 3<&-
    echo "$name ${listed[0]:-?} ${listed[1]:-?} ${planned[0]:-?} ${planned[1]:-?}"
}
rm -f "$out"/{baseline,now}.log
base=$(measure baseline) now=$(measure now)
python3 - "$base" "$now" <<'EOF'
import sys
rows = [("peak RSS, lists complete", 1, "MiB"), ("seconds to lists complete", 2, "s"),
        ("peak RSS, first plan done", 3, "MiB"), ("seconds to first plan done", 4, "s")]
b, n = sys.argv[1].split(), sys.argv[2].split()
print(f"{'figure':<28} {'baseline':>10} {'now':>10} {'ratio':>7}")
for label, i, unit in rows:
    try:
        ratio = f"{float(b[i]) / float(n[i]):.2f}"
    except (ValueError, ZeroDivisionError):
        ratio = "-"
    print(f"{label:<28} {b[i] + ' ' + unit:>10} {n[i] + ' ' + unit:>10} {ratio:>7}")
EOF
