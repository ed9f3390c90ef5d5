#!/bin/bash
# The operator at fleet scale against a real kube-apiserver (issue 15): N Nodes, N simulated
# proxiers reporting through the proxier's own status writer (operator/examples/fleet/) and one
# real kipvs-operator, two 3-stage rollouts (canary -> 10% -> rest, zero soak) while every
# proxier refreshes its status at the proxier's cadence; prints the issue's target table.
#
# With --faults, two more revisions roll out under a fault: the operator killed mid-rollout, and
# the apiserver stopped for 30 s (see operator/examples/fleet/main.rs for what --check then asserts).
# With --takeover, the rounds are the move from kube-proxy instead (kube-proxy's DaemonSet simulated
# too): serviceProxy kube-proxy (standby), kipvs while kube-proxy never leaves --stuck-share of the
# nodes (default 0.01: they fail, the fleet rolls back to kube-proxy), kipvs again (it completes);
# kube-proxy serves a node 2 s after its pod starts, and --check fails if any node was ever without
# a serving proxy ("never none") or had two; operator/examples/fleet/takeover.rs.
#
# usage: hack/fleet.sh [NODES] [--check] [--faults | --takeover [--stuck-share S]]   NODES: default 500 (the CI size;
#                    hack/test-operator.sh runs it with --check --faults); the bench is hack/bench-fleet.sh
# env:   KUBECONFIG  an existing control plane with nothing else on it (else one is started with
#                    hack/control-plane.sh and stopped on exit); KIPVS_CP_STATE its state directory
#                    (needed by --faults and for the apiserver's and etcd's CPU/RSS figures)
#        PORT_BASE   the operator's /metrics port is PORT_BASE + 89 (default 18089)
#        OUT         logs (default: a temp dir)
#        FLEET_RELEASE=1  release builds (default: the debug builds CI already has)
#        FLEET_ARGS  extra flags for the harness (--fail-share 0.02, --silent-share 0.01, --quiet 60s)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/init.sh && suite fleet # on_exit, state_dir, fatal
NODES=${1:-500}
shift || true
OUT=${OUT:-$(mktemp -d /tmp/kipvs-fleet.XXXXXX)}
mkdir -p "$OUT"
. hack/lib/executables.sh # executables_built
built=$(cargo build -q ${FLEET_RELEASE:+--release} --workspace --bin kipvs-operator --example fleet --message-format=json-render-diagnostics |
  executables_built kipvs-operator fleet)
OPERATOR=$(awk '$1 == "kipvs-operator" {print $2}' <<<"$built")
FLEET=$(awk '$1 == "fleet" {print $2}' <<<"$built")
[ -x "$OPERATOR" ] && [ -x "$FLEET" ] || fatal "build produced no executables"

STATE=""
# The harness stops the operator it runs; if it died first, its pid file names the operator.
on_exit '[ ! -f "$OUT/operator.pid" ] || kill "$(cat "$OUT/operator.pid")" 2>/dev/null; [ -z "$STATE" ] || hack/control-plane.sh stop "$STATE"'
CP_STATE=${KIPVS_CP_STATE:-}
if [ -z "${KUBECONFIG:-}" ]; then
  state_dir cp
  hack/control-plane.sh start "$STATE"
  export KUBECONFIG=$STATE/kubeconfig
  CP_STATE=$STATE
fi
kubectl apply --validate=false -k config/crd >/dev/null
kubectl wait --for condition=established --timeout=30s crd/proxyconfigs.kipvs.io crd/nodeproxyconfigs.kipvs.io >/dev/null
kubectl apply -f config/operator/namespace.yaml >/dev/null
echo "fleet: $NODES nodes, logs in $OUT"
set +e
# The harness runs the operator (and restarts it when it exits, as the kubelet would).
POD_NAMESPACE=kipvs-system POD_NAME=fleet-operator RUST_LOG=info,kipvs_operator=debug,kube=warn \
  "$FLEET" --nodes "$NODES" --operator "$OPERATOR" --operator-log "$OUT/operator.log" \
  --operator-metrics "127.0.0.1:$((${PORT_BASE:-18000} + 89))" --pid-file "$OUT/operator.pid" \
  ${CP_STATE:+--cp-state "$CP_STATE"} "$@" ${FLEET_ARGS:-} 2> >(tee "$OUT/fleet.log" >&2)
rc=$?
set -e
kubectl get proxyconfig scale -o wide 2>&1 | sed 's/^/  /'
# Where the apiserver's time went: requests by verb/resource/subresource (count, summed handling
# seconds; watches left out) and watch events sent, from its own metrics.
kubectl get --raw /metrics > "$OUT/apiserver-metrics.txt" 2>/dev/null && python3 - "$OUT/apiserver-metrics.txt" <<'PY'
import re, sys
count, seconds, watch = {}, {}, {}
for line in open(sys.argv[1]):
    m = re.match(r'apiserver_request_duration_seconds_(count|sum)\{(.*)\} (\S+)', line)
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("verb") in ("WATCH", "CONNECT") or labels.get("resource") not in (
                "nodeproxyconfigs", "proxyconfigs", "nodes", "leases", "events"):
            continue
        key = (labels["verb"], labels["resource"] + ("/" + labels["subresource"] if labels.get("subresource") else ""))
        table = count if m.group(1) == "count" else seconds
        table[key] = table.get(key, 0) + float(m.group(3))
    m = re.match(r'apiserver_watch_events_total\{(.*)\} (\S+)', line)
    if m:
        kind = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))).get("kind", "?")
        watch[kind] = watch.get(kind, 0) + float(m.group(2))
print("| apiserver requests (verb resource) | count | handling s |\n|---|---|---|")
for key in sorted(count, key=lambda k: -seconds.get(k, 0)):
    print(f"| {key[0]} {key[1]} | {count[key]:.0f} | {seconds.get(key, 0):.1f} |")
print("| watch events sent: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(watch.items()) if v) + " | | |")
PY
if [ "$rc" != 0 ]; then
  echo "---- operator log (last 40 lines)"; tail -n 40 "$OUT/operator.log"
fi
exit "$rc"
