#!/bin/bash
# The operator with REAL proxiers, against a real kube-apiserver (hack/test-operator.sh runs it after
# e2e.sh, on the same control plane): one `kipvs-proxier run --dataplane=fake` process per simulated
# node (pnode-0 canary, pnode-1..4 the rest), each with its own health, metrics and health-check
# addresses (127.0.0.2x), following its NodeProxyConfig live and reporting on its status.
#   1. a ProxyConfig's first revision and then a scheduler change (rr -> wrr) roll out canary -> rest;
#      every node reports observedRevision = the revision, phase Applied, and the proxier's own log
#      says it put that revision in force;
#   2. a scheduler the canary's kernel lacks (`--fake-missing-scheduler sed` on pnode-0 only) is
#      reported Failed by the canary's proxier: the rollout halts, the revision is marked bad, the
#      rest never gets it, and every proxier ends on the previous revision, Applied and in force.
# Prints `kubectl get proxyconfig` and `kubectl get nodeproxyconfigs` at the end. Exit status 0 only
# if every check passed.
#
# env: KUBECONFIG (required), KIPVS_OPERATOR, KIPVS_PROXIER (executables), OUT (logs; a temp dir),
#      PROXIER_PORT (the healthz port on each node's 127.0.0.2x address, metrics on the next; 21256)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
: "${KUBECONFIG:?}" "${KIPVS_OPERATOR:?}" "${KIPVS_PROXIER:?}"
OUT=${OUT:-$(mktemp -d /tmp/kipvs-operator-e2e-proxiers.XXXXXX)}
mkdir -p "$OUT"
export KUBECONFIG RUST_BACKTRACE=0
cd "$ROOT"
PORT=${PROXIER_PORT:-21256}
NODES=(pnode-0 pnode-1 pnode-2 pnode-3 pnode-4)
PC=proxiers
. "$HERE/lib.sh" # ok, fatal, step, wait_until, pc, reason, follow_stages; PIDS stopped on exit
npc() { kubectl get nodeproxyconfig "$1" -o jsonpath="$2" 2>/dev/null; }
ip_of() { echo "127.0.0.$((20 + ${1#pnode-}))"; }
code() { curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$1"; }
# The revision a proxier last put in force, from its own log ("configuration in force" line).
in_force() {
  sed -n 's/.*configuration in force.*revision="\{0,1\}\([^" ]*\)"\{0,1\}.*/\1/p' "$OUT/proxier-$1.log" | tail -n 1
}
# When a proxier put REVISION in force (its log's timestamp).
in_force_at() { grep -m1 "configuration in force.*revision=\"\{0,1\}$2" "$OUT/proxier-$1.log" | cut -d' ' -f1; }
# Every node's NodeProxyConfig status says REVISION Applied, and its proxier's log says it is in force.
all_applied() {
  local n
  for n in "${NODES[@]}"; do
    [ "$(npc "$n" '{.spec.revision} {.status.observedRevision} {.status.phase} {.status.healthy}')" = "$1 $1 Applied true" ] || return 1
    [ "$(in_force "$n")" = "$1" ] || return 1
  done
}
step "setup: CRDs, RBAC, a clean slate"
for n in "${NODES[@]}"; do
  ip=$(ip_of "$n")
  for port in "$PORT" "$((PORT + 1))"; do
    if (exec 3<>"/dev/tcp/$ip/$port") 2>/dev/null; then fatal "$ip:$port is in use; set PROXIER_PORT"; fi
  done
done
kubectl apply --validate=false -k config/crd >/dev/null
kubectl wait --for condition=established --timeout=30s crd/proxyconfigs.kipvs.io crd/nodeproxyconfigs.kipvs.io >/dev/null
kubectl apply -f config/operator/namespace.yaml >/dev/null
kubectl apply -k config/rbac >/dev/null
# What an earlier scenario left (no garbage collector runs here: delete the owned objects too).
kubectl delete proxyconfig --all >/dev/null
kubectl delete nodeproxyconfig --all >/dev/null
ok "CRDs and RBAC in place; no ProxyConfig or NodeProxyConfig left"

for n in "${NODES[@]}"; do
  labels="kipvs.io/e2e: proxiers"
  [ "$n" = pnode-0 ] && labels="$labels, kipvs.io/canary: \"true\""
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata: {name: $n, labels: {$labels}}
EOF
  patch_status /api/v1/nodes/$n \
    '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"e2e"}]}}' >/dev/null
done
ok "${#NODES[@]} Ready nodes: pnode-0 canary"

step "operator and one real proxier per node"
POD_NAMESPACE=kipvs-system POD_NAME=operator-p RUST_LOG=info,kube=warn "$KIPVS_OPERATOR" --metrics-bind-address "127.0.0.1:$((${PORT_BASE:-18000} + 83))" > "$OUT/operator-p.log" 2>&1 &
PIDS+=($!)
for n in "${NODES[@]}"; do
  ip=$(ip_of "$n")
  extra=()
  [ "$n" = pnode-0 ] && extra=(--fake-missing-scheduler sed)
  RUST_LOG=info,kipvs_proxier::ops=debug,kube=warn "$KIPVS_PROXIER" run --kubeconfig "$KUBECONFIG" --node "$n" --dataplane=fake \
    --healthz-bind-address "$ip:$PORT" --metrics-bind-address "$ip:$((PORT + 1))" --health-check-bind-ip "$ip" \
    "${extra[@]}" > "$OUT/proxier-$n.log" 2>&1 &
  PIDS+=($!)
done
for n in "${NODES[@]}"; do
  ip=$(ip_of "$n")
  wait_until 60 "$n's proxier /healthz 200" bash -c "[ \"\$(curl -s -o /dev/null -m 2 -w '%{http_code}' http://$ip:$PORT/healthz)\" = 200 ]"
done
ok "5 kipvs-proxier processes (--dataplane=fake) serve /livez and /healthz 200 on 127.0.0.20-24:$PORT"
wait_until 30 "a Lease holder" bash -c "[ -n \"\$(kubectl -n kipvs-system get lease kipvs-operator -o jsonpath='{.spec.holderIdentity}')\" ]"
ok "operator leads: $(kubectl -n kipvs-system get lease kipvs-operator -o jsonpath='{.spec.holderIdentity}')"

kubectl apply -f - >/dev/null <<EOF
apiVersion: kipvs.io/v1alpha1
kind: ProxyConfig
metadata: {name: $PC}
spec:
  nodeSelector: {matchLabels: {kipvs.io/e2e: proxiers}}
  config: {ipvs: {scheduler: rr}}
  rollout:
    applyTimeout: 30s
    failureBudget: 0
    autoRollback: true
    stages:
      - name: canary
        nodeSelector: {matchLabels: {kipvs.io/canary: "true"}}
        soakDuration: 2s
      - name: rest
        maxUnavailable: "50%"
EOF

step "first revision (scheduler rr)"
stages=$(follow_stages 120 "$OUT/operator-p.log") || fatal "first rollout: $stages"
[ "$stages" = "canary rest" ] || fatal "first rollout went: $stages"
[ "$(reason Progressing)" = RolloutComplete ] || fatal "first rollout: Progressing $(reason Progressing)"
R1=$(pc '{.status.lastGoodRevision}')
ok "revision $R1 rolled out: $stages"
wait_until 30 "every node Applied $R1 and in force" all_applied "$R1"
ok "every proxier reports $R1 Applied, healthy, and logged it in force"

step "scheduler change rr -> wrr: canary -> rest"
kubectl patch proxyconfig "$PC" --type=merge -p '{"spec":{"config":{"ipvs":{"scheduler":"wrr"}}}}' >/dev/null
wait_until 30 "a new revision" bash -c "[ \"\$(kubectl get proxyconfig $PC -o jsonpath='{.status.revision}')\" != $R1 ]"
R2=$(pc '{.status.revision}')
wait_until 60 "the canary to apply $R2" \
  bash -c "[ \"\$(kubectl get nodeproxyconfig pnode-0 -o jsonpath='{.status.phase} {.status.observedRevision}')\" = 'Applied $R2' ]"
[ "$(in_force pnode-0)" = "$R2" ] || fatal "pnode-0 reports $R2 Applied, its log says $(in_force pnode-0) is in force"
stages=$(follow_stages 120 "$OUT/operator-p.log") || fatal "scheduler change: $stages"
[[ "$stages" =~ ^(canary )?rest$ ]] || fatal "scheduler change went: $stages (after the canary applied it)"
[ "$(reason Progressing)" = RolloutComplete ] || fatal "scheduler change: Progressing $(reason Progressing)"
[ "$(pc '{.status.lastGoodRevision}')" = "$R2" ] || fatal "lastGoodRevision $(pc '{.status.lastGoodRevision}'), want $R2"
wait_until 30 "every node Applied $R2 and in force" all_applied "$R2"
for n in "${NODES[@]}"; do
  grep -q 'op=UpdateVirtualServer vs="TCP 10.96.0.1:443" scheduler=wrr' "$OUT/proxier-$n.log" ||
    fatal "$n's proxier did not reprogram the kubernetes Service with wrr"
done
ok "every proxier's dataplane reprogrammed the kubernetes Service: op=UpdateVirtualServer scheduler=wrr"
# Canary first: by the proxiers' own clocks, the canary put R2 in force before any other node.
canary_at=$(in_force_at pnode-0 "$R2") first_rest=""
for n in pnode-1 pnode-2 pnode-3 pnode-4; do
  at=$(in_force_at "$n" "$R2")
  [[ "$canary_at" < "$at" ]] || fatal "$n put $R2 in force at $at, not after the canary ($canary_at)"
  [ -z "$first_rest" ] || [[ "$at" < "$first_rest" ]] && first_rest=$at
done
ok "the canary put $R2 in force at ${canary_at#*T}, the rest after it (from ${first_rest#*T})"
ok "revision $R2 (wrr) rolled out canary -> rest; every proxier reports it Applied and logged it in force"
# (1.20's managedFields have no `subresource`: check what the proxier's manager owns.)
[[ "$(npc pnode-3 '{.metadata.managedFields[?(@.manager=="kipvs-proxier")].fieldsV1}')" == *'"f:status":{'*'"f:observedRevision"'* ]] ||
  fatal "pnode-3's status.observedRevision is not owned by kipvs-proxier: $(npc pnode-3 '{.metadata.managedFields}')"
ok "status.observedRevision owned by the proxier's field manager (kipvs-proxier)"

step "a scheduler the canary's kernel lacks (sed): halt and roll back"
kubectl patch proxyconfig "$PC" --type=merge -p '{"spec":{"config":{"ipvs":{"scheduler":"sed"}}}}' >/dev/null
stages=$(follow_stages 120 "$OUT/operator-p.log") || fatal "bad revision: $stages"
R3=$(pc '{.status.revision}')
[ "$R3" != "$R2" ] || fatal "no new revision"
[ "$(reason Degraded)" = RevisionFailed ] || fatal "Degraded: $(reason Degraded)"
[ "$(reason Progressing)" = RolledBack ] || fatal "Progressing: $(reason Progressing)"
[ "$(pc '{.status.badRevisions[0]}')" = "$R3" ] || fatal "badRevisions: $(pc '{.status.badRevisions}')"
[ "$(pc '{.status.targetRevision}')" = "$R2" ] || fatal "target $(pc '{.status.targetRevision}'), want $R2"
failure=$(pc '{.status.failures[0].node}: {.status.failures[0].message}')
[[ "$failure" == pnode-0:*sed* ]] || fatal "failure: $failure"
[ "$stages" = canary ] || fatal "bad revision went: $stages"
ok "revision $R3 failed on the canary ($failure); stages seen: $stages"
grep -q "revision=\"\{0,1\}$R3\"\{0,1\}.*cannot apply\|cannot apply.*revision=\"\{0,1\}$R3" "$OUT/proxier-pnode-0.log" ||
  grep -q "cannot apply the configuration.*lacks ip_vs_sed" "$OUT/proxier-pnode-0.log" ||
  fatal "the canary's proxier did not log that it cannot apply $R3"
ok "the canary's proxier logged: $(grep -m1 'cannot apply the configuration' "$OUT/proxier-pnode-0.log" | sed 's/^.*ERROR //' | cut -c1-160)"
[ "$(pc '{.status.stages[1].updated}')" = 0 ] || fatal "the rest stage got the bad revision"
for n in pnode-1 pnode-2 pnode-3 pnode-4; do
  ! grep -q "revision=\"\{0,1\}$R3" "$OUT/proxier-$n.log" || fatal "$n saw $R3"
done
ok "the rest never saw $R3"
wait_until 30 "every node Applied $R2 again and in force" all_applied "$R2"
! grep -q "configuration in force.*revision=\"\{0,1\}$R3" "$OUT"/proxier-*.log || fatal "a proxier put $R3 in force"
! grep -q 'scheduler=sed' "$OUT"/proxier-*.log || fatal "a proxier programmed the sed scheduler"
ok "rolled back: every proxier reports $R2 Applied and runs it (the canary kept $R2 in force; no sed op anywhere)"
for n in "${NODES[@]}"; do
  [ "$(code "$(ip_of "$n"):$PORT/livez")" = 200 ] || fatal "$n's proxier /livez is not 200"
done
ok "every proxier still live (/livez 200)"

step "result"
echo "  \$ kubectl get proxyconfig"; kubectl get proxyconfig | sed 's/^/    /'
echo "  \$ kubectl get nodeproxyconfigs"; kubectl get nodeproxyconfigs | sed 's/^/    /'
echo "  in force per the proxiers' logs:$(for n in "${NODES[@]}"; do printf ' %s=%s' "$n" "$(in_force "$n")"; done)"
suite_end "operator e2e with proxiers"
