#!/bin/bash
# The operator at fleet scale against a real kube-apiserver (issue 15): N Nodes, N simulated
# proxiers reporting through the proxier's own status writer (proxier/examples/fleet.rs) and one
# real kipvs-operator, two 3-stage rollouts (canary -> 10% -> rest, zero soak) while every
# proxier refreshes its status at the proxier's cadence; prints the issue's target table.
#
# usage: hack/fleet.sh [NODES] [--check]     NODES: default 500 (the CI size; hack/test-operator.sh
#                                              runs it with --check); the bench is `hack/fleet.sh 5000`
# env:   KUBECONFIG  an existing control plane with nothing else on it (else one is started with
#                    hack/control-plane.sh and stopped on exit)
#        OUT         logs (default: a temp dir)
#        FLEET_RELEASE=1  release builds (default: the debug builds CI already has)
#        FLEET_ARGS  extra flags for the harness (--fail-share 0.02, --silent-share 0.01, --heartbeat 60s)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
NODES=${1:-500}
CHECK=${2:-}
OUT=${OUT:-$(mktemp -d /tmp/kipvs-fleet.XXXXXX)}
mkdir -p "$OUT"
executables() {
  python3 -c 'import json, sys
want = set(sys.argv[1:])
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])' "$@"
}
built=$(cargo build -q ${FLEET_RELEASE:+--release} --workspace --bin kipvs-operator --example fleet --message-format=json-render-diagnostics |
  executables kipvs-operator fleet)
OPERATOR=$(awk '$1 == "kipvs-operator" {print $2}' <<<"$built")
FLEET=$(awk '$1 == "fleet" {print $2}' <<<"$built")
[ -x "$OPERATOR" ] && [ -x "$FLEET" ] || { echo "fleet: build produced no executables" >&2; exit 1; }

PIDS=()
STATE=""
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$STATE" ]; then hack/control-plane.sh stop "$STATE"; rm -rf "$STATE"; fi
}
trap cleanup EXIT
if [ -z "${KUBECONFIG:-}" ]; then
  STATE=$(mktemp -d /tmp/kipvs-cp.XXXXXX)
  hack/control-plane.sh start "$STATE"
  export KUBECONFIG=$STATE/kubeconfig
fi
kubectl apply --validate=false -k config/crd >/dev/null
kubectl wait --for condition=established --timeout=30s crd/proxyconfigs.kipvs.io crd/nodeproxyconfigs.kipvs.io >/dev/null
kubectl apply -f config/operator/namespace.yaml >/dev/null
POD_NAMESPACE=kipvs-system POD_NAME=fleet-operator RUST_LOG=info,kipvs_operator=debug,kube=warn \
  "$OPERATOR" --metrics-bind-address 127.0.0.1:18089 > "$OUT/operator.log" 2>&1 &
OPERATOR_PID=$!
PIDS+=("$OPERATOR_PID")
echo "fleet: $NODES nodes, operator pid $OPERATOR_PID, logs in $OUT"
set +e
"$FLEET" --nodes "$NODES" --operator-pid "$OPERATOR_PID" --operator-log "$OUT/operator.log" \
  ${CHECK:+--check} ${FLEET_ARGS:-} 2> >(tee "$OUT/fleet.log" >&2)
rc=$?
set -e
kubectl get proxyconfig scale -o wide 2>&1 | sed 's/^/  /'
if [ "$rc" != 0 ]; then
  echo "---- operator log (last 40 lines)"; tail -n 40 "$OUT/operator.log"
fi
exit "$rc"
