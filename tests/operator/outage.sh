#!/bin/bash
# The operator and an absent apiserver, against a real kube-apiserver (hack/test-operator.sh starts
# it; this script stops and starts it through hack/control-plane.sh stop-apiserver|start-apiserver):
#   1. an operator started while the apiserver is down does not exit: it waits, and leads (holds its
#      Lease) within a few seconds of the apiserver's return (the retry period is 2 s);
#   2. the leader survives an outage longer than its renew deadline: it loses the Lease (stops
#      writing, kipvs_operator_leadership_lost_total 1), does not exit, and leads again within a few
#      seconds of the apiserver's return.
# A kubelet restarts an exited container with a back-off of 10 s doubling up to 5 min: an operator
# that exits for an outage comes back minutes late. Exit status 0 only if every check passed.
#
# env: KUBECONFIG, KIPVS_OPERATOR (executable), CP_STATE (the control plane's state directory),
#      OUT (logs; a temp dir), PORT_BASE (the operator's /metrics port is PORT_BASE + 85)
set -euo pipefail
: "${KUBECONFIG:?}" "${KIPVS_OPERATOR:?}" "${CP_STATE:?}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/kipvs-operator-outage.XXXXXX)}
mkdir -p "$OUT"
export KUBECONFIG
cd "$ROOT"
. hack/lib/init.sh # ok, fatal, step, on_exit, wait_for

LEASE=kipvs-operator-outage
ID=outage-operator
METRICS=127.0.0.1:$((${PORT_BASE:-18000} + 85))
PID=""
stop_operator() {
  [ -z "$PID" ] || kill "$PID" 2>/dev/null || true
  # The apiserver must be up for whatever runs next.
  curl -sk -m 2 "https://127.0.0.1:${CP_PORT:-16443}/readyz" >/dev/null 2>&1 || hack/control-plane.sh start-apiserver "$CP_STATE"
}
on_exit stop_operator
on_exit '[ "$EXIT_STATUS" = 0 ] || { echo "---- $OUT/operator.log (last 30 lines)"; tail -n 30 "$OUT/operator.log"; }'
alive() { kill -0 "$PID" 2>/dev/null || fatal "the operator exited: $(tail -n 3 "$OUT/operator.log")"; }
holder() { kubectl -n kipvs-system get lease "$LEASE" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
metric() { curl -s -m 2 "http://$METRICS/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
# leads_within SECONDS: waits until the operator holds the Lease and runs the controller
# (kipvs_operator_leader 1: after an outage the Lease still names the old holder); prints the seconds
leading() { alive; [ "$(holder)" = "$ID" ] && [ "$(metric kipvs_operator_leader)" = 1 ]; }
leads_within() {
  local start
  start=$(now)
  WAIT_STEP=0.2 wait_for "$1" "the operator to lead" leading 2> /dev/null ||
    fatal "not leading ${1}s after the apiserver returned (holder: '$(holder)')"
  elapsed "$start"
}

step "the operator started while the apiserver is away"
kubectl apply -f config/operator/namespace.yaml >/dev/null
kubectl -n kipvs-system delete lease "$LEASE" --ignore-not-found >/dev/null
hack/control-plane.sh stop-apiserver "$CP_STATE"
POD_NAMESPACE=kipvs-system POD_NAME=$ID RUST_LOG=info,kube=warn "$KIPVS_OPERATOR" \
  --lease-name "$LEASE" --metrics-bind-address "$METRICS" > "$OUT/operator.log" 2>&1 &
PID=$!
sleep 12
alive
grep -q "cannot list ProxyConfigs" "$OUT/operator.log" || fatal "no word of the absent apiserver in the log"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://$METRICS/healthz")" = 200 ] || fatal "/healthz does not answer 200"
ok "12 s without an apiserver: still running, /healthz 200, logs that it retries"
hack/control-plane.sh start-apiserver "$CP_STATE" 2>/dev/null
took=$(leads_within 10)
ok "leads ${took} s after the apiserver is ready again"

step "the leader and an outage longer than its renew deadline (10 s)"
hack/control-plane.sh stop-apiserver "$CP_STATE"
sleep 1
for _ in $(seq 1 40); do
  grep -q "lost the leader-election Lease" "$OUT/operator.log" && break
  alive
  sleep 0.5
done
grep -q "lost the leader-election Lease" "$OUT/operator.log" || fatal "the leader did not give up leadership in 20 s without an apiserver"
[ "$(metric kipvs_operator_leader)" = 0 ] || fatal "kipvs_operator_leader is not 0 after the Lease was lost"
[ "$(metric kipvs_operator_leadership_lost_total)" = 1 ] || fatal "kipvs_operator_leadership_lost_total is not 1"
sleep 5
alive
ok "lost the Lease (stopped writing, leader 0, leadership_lost_total 1) and is still running"
hack/control-plane.sh start-apiserver "$CP_STATE" 2>/dev/null
took=$(leads_within 10)
ok "leads again ${took} s after the apiserver is ready again"
kill "$PID"
wait "$PID" || fatal "exit status $? on SIGTERM"
PID=""
[ -z "$(holder)" ] || fatal "the Lease was not released on SIGTERM (holder '$(holder)')"
ok "SIGTERM: exit status 0, Lease released"
suite_end "operator outage"
