#!/bin/bash
# The operator end to end, against a real kube-apiserver (hack/test-operator.sh starts one):
#   1. the CRDs install; the samples apply (the ProxyConfig, and the patch that keeps kube-proxy's
#      DaemonSet off nodes labelled kipvs.io/service-proxy=kipvs); the operator's RBAC lets it patch
#      Nodes (the label) and nothing more on them; each invalid ProxyConfig in invalid/ is rejected by the
#      apiserver with the schema's message (from 1.23, with CEL on, also the rules only CEL can say:
#      `expect-cel`), or (those CEL rules before 1.23, which ignores them) accepted and reported
#      InvalidSpec by the operator;
#   2. two operator replicas elect one leader through a Lease;
#   3. ten Nodes (one canary, one tainted ToBeDeletedByClusterAutoscaler) and fake_proxier standing in
#      for their proxiers: the first revision and then a gate change roll out canary -> early (10%) ->
#      fleet; the tainted node is skipped, never written;
#   4. a configuration the proxiers reject (IPVS scheduler "sed") fails on the canary: the rollout
#      halts, the revision is marked bad and every touched node returns to the last good revision;
#   5. the leader is killed: the other replica takes the Lease and rolls the next change out;
#   6. the move from kube-proxy (issue 26), fake_proxier --kube-proxy standing in for kube-proxy's
#      DaemonSet (it avoids nodes labelled kipvs.io/service-proxy=kipvs) and the proxiers' takeover:
#      serviceProxy kube-proxy (kipvs stands by, every node labelled kube-proxy), then kipvs in stages
#      with node-5's kube-proxy never leaving: node-5 fails by applyTimeout, the fleet rolls back and
#      every label is kube-proxy again; then (issue 33) the canary's proxier missing: its label stays
#      kube-proxy, it fails by applyTimeout and the fleet rolls back, no node ever without a serving
#      proxy ("never none"); then, kube-proxy leaving everywhere, the takeover completes.
# Prints `kubectl get proxyconfig` along the way. Exit status 0 only if every check passed.
#
# env: KUBECONFIG (required), KIPVS_OPERATOR, KIPVS_FAKE_PROXIER (executables), OUT (logs; a temp dir)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
: "${KUBECONFIG:?}" "${KIPVS_OPERATOR:?}" "${KIPVS_FAKE_PROXIER:?}"
OUT=${OUT:-$(mktemp -d /tmp/kipvs-operator-e2e.XXXXXX)}
mkdir -p "$OUT"
export KUBECONFIG RUST_BACKTRACE=0
PC=fleet
. "$HERE/lib.sh" # ok, fatal, step, wait_until, pc, reason, follow_stages; PIDS stopped on exit
cd "$ROOT"

reason_is() { [ "$(reason "$1")" = "$2" ]; }
revision_of() { kubectl get nodeproxyconfig "$1" -o jsonpath='{.spec.revision}' 2>/dev/null; }
header() { sed -n "s/^# $1: //p" "$2"; }
show() { echo "  \$ kubectl get proxyconfig   # $*"; kubectl get proxyconfig | sed 's/^/    /'; }

step "CRDs, RBAC, sample"
# Kubernetes 1.20 does not know x-kubernetes-validations (CEL): kubectl's client-side validation
# would refuse the CRDs, and the apiserver drops the field. Newer servers enforce the rules.
kubectl apply --validate=false -k config/crd >/dev/null
kubectl wait --for condition=established --timeout=30s crd/proxyconfigs.kipvs.io crd/nodeproxyconfigs.kipvs.io >/dev/null
ok "CRDs installed and established"
kubectl apply -f config/operator/namespace.yaml >/dev/null
kubectl apply -k config/rbac >/dev/null
ok "namespace and RBAC apply"
kubectl apply -f config/samples/proxyconfig.yaml >/dev/null || fatal "the sample does not apply"
[ "$(kubectl get proxyconfig fleet -o jsonpath='{.spec.rollout.stages[1].size}')" = "10%" ] || fatal "sample not stored"
kubectl delete -f config/samples/proxyconfig.yaml >/dev/null
ok "config/samples/proxyconfig.yaml applies"
# kube-proxy's DaemonSet as kubeadm makes it (no affinity), patched with the committed sample as the
# README says: its pods then avoid nodes labelled kipvs.io/service-proxy=kipvs.
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-proxy, namespace: kube-system, labels: {k8s-app: kube-proxy}}
spec:
  selector: {matchLabels: {k8s-app: kube-proxy}}
  template:
    metadata: {labels: {k8s-app: kube-proxy}}
    spec:
      nodeSelector: {kubernetes.io/os: linux}
      containers: [{name: kube-proxy, image: registry.k8s.io/kube-proxy:v1.24.0}]
EOF
kubectl -n kube-system patch daemonset kube-proxy --type=strategic \
  --patch-file config/samples/kube-proxy-daemonset-patch.yaml >/dev/null || fatal "the DaemonSet patch does not apply"
affinity=$(kubectl -n kube-system get daemonset kube-proxy -o jsonpath='{.spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]}')
[[ "$affinity" == *'"key":"kipvs.io/service-proxy"'* && "$affinity" == *'"operator":"NotIn"'* && "$affinity" == *'"values":["kipvs"]'* ]] ||
  fatal "kube-proxy's DaemonSet affinity after the patch: $affinity"
ok "config/samples/kube-proxy-daemonset-patch.yaml: kube-proxy's DaemonSet avoids nodes labelled kipvs.io/service-proxy=kipvs"
SA=system:serviceaccount:kipvs-system:kipvs-operator
[ "$(kubectl auth can-i patch nodes --as=$SA)" = yes ] || fatal "the operator cannot patch Nodes (its label)"
for verb in update create delete; do
  [ "$(kubectl auth can-i $verb nodes --as=$SA 2>/dev/null)" = no ] || fatal "the operator can $verb Nodes"
done
ok "RBAC: the operator may patch Nodes (its label), not update, create or delete them"
[ "$(kubectl -n kube-system auth can-i get daemonsets/kube-proxy --as=$SA)" = yes ] || fatal "the operator cannot read kube-proxy's DaemonSet"
[ "$(kubectl -n kube-system auth can-i list daemonsets --as=$SA 2>/dev/null)" = no ] || fatal "the operator can list DaemonSets"
ok "RBAC: the operator may get kube-system/kube-proxy's DaemonSet (its affinity), nothing else there"

step "invalid ProxyConfigs"
# CEL rules (x-kubernetes-validations) are enforced from 1.23 (hack/control-plane.sh turns its gate on there);
# before, a file whose rule only CEL can say is accepted by the apiserver, named as skipped, and caught by the
# operator below.
MINOR=$(kubectl get --raw /version | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p')
ACCEPTED=()
for f in tests/operator/invalid/*.yaml; do
  want=$(header expect-apiserver "$f")
  if [ "$want" = accepted ] && [ -n "$(header expect-cel "$f")" ]; then
    if [ "$MINOR" -ge 23 ]; then
      want=$(header expect-cel "$f")
    else
      echo "SKIPPED on 1.$MINOR (needs 1.23: CEL): $(basename "$f") rejected by the apiserver's CEL rule"
    fi
  fi
  if out=$(kubectl apply -f "$f" 2>&1); then
    [ "$want" = accepted ] || fatal "$f was accepted, want: $want"
    ACCEPTED+=("$f")
    kubectl delete -f "$f" >/dev/null
  else
    [[ "$out" == *"$want"* ]] || fatal "$f: rejected with '$out', want '$want'"
    ok "$(basename "$f"): rejected: ${out:0:150}"
  fi
done

step "operator: two replicas, one leader"
# /metrics ports PORT_BASE+81 (a) and +82 (b), so concurrent suites with their own PORT_BASE don't collide
port=$((${PORT_BASE:-18000} + 80))
for id in operator-a operator-b; do
  port=$((port + 1))
  POD_NAMESPACE=kipvs-system POD_NAME=$id RUST_LOG=info,kube=warn "$KIPVS_OPERATOR" --metrics-bind-address "127.0.0.1:$port" \
    > "$OUT/$id.log" 2>&1 &
  PIDS+=($!)
  eval "PID_${id//-/_}=$!"
done
holder() { kubectl -n kipvs-system get lease kipvs-operator -o jsonpath='{.spec.holderIdentity}'; }
wait_until 30 "a Lease holder" bash -c "[ -n \"\$(kubectl -n kipvs-system get lease kipvs-operator -o jsonpath='{.spec.holderIdentity}')\" ]"
LEADER=$(holder)
ok "leader: $LEADER"
sleep 2 # on purpose: one retry period of the other replica (operator/src/lease.rs, 2 s), in which a second leader would show
[ "$(grep -l '"leading"\|leading' "$OUT"/operator-*.log | wc -l)" = 1 ] || fatal "not exactly one replica leads"
ok "the other replica waits"

for f in "${ACCEPTED[@]}"; do
  want=$(header expect-operator "$f")
  kubectl apply -f "$f" >/dev/null
  wait_until 20 "InvalidSpec for $f" bash -c \
    "[ \"\$(kubectl get proxyconfig invalid -o jsonpath='{.status.conditions[?(@.type==\"Degraded\")].reason}')\" = InvalidSpec ]"
  msg=$(kubectl get proxyconfig invalid -o jsonpath='{.status.conditions[?(@.type=="Degraded")].message}')
  [[ "$msg" == *"$want"* ]] || fatal "$f: Degraded says '$msg', want '$want'"
  ok "$(basename "$f"): accepted by 1.$MINOR (CEL-only rule), operator reports InvalidSpec: ${msg:0:110}"
  kubectl delete -f "$f" >/dev/null
done

step "nodes and proxiers"
for i in $(seq 0 9); do
  labels="kubernetes.io/os: linux"
  [ "$i" = 0 ] && labels="$labels, kipvs.io/canary: \"true\""
  taints=""
  [ "$i" = 9 ] && taints="taints: [{key: ToBeDeletedByClusterAutoscaler, value: \"1700000000\", effect: NoSchedule}]"
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata: {name: node-$i, labels: {$labels}}
spec: {$taints}
EOF
  patch_status /api/v1/nodes/node-$i \
    '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"e2e"}]}}' >/dev/null
done
ok "10 Ready nodes: node-0 canary, node-9 tainted ToBeDeletedByClusterAutoscaler"
"$KIPVS_FAKE_PROXIER" --apply-delay 1s --unsupported-schedulers sed > "$OUT/fake-proxier.log" 2>&1 &
PIDS+=($!)
FAKE_PID=$!
ok "fake_proxier reports for every node (scheduler sed unsupported)"

step "first revision"
kubectl apply -f tests/operator/fleet.yaml >/dev/null
stages=$(follow_stages 120) || fatal "first rollout: $stages"
[ "$stages" = "canary early fleet" ] || fatal "first rollout went: $stages"
reason_is Progressing RolloutComplete || fatal "first rollout: Progressing $(reason Progressing)"
R1=$(pc '{.status.lastGoodRevision}')
ok "revision $R1 rolled out: $stages"
[ -z "$(revision_of node-9)" ] || fatal "the tainted node-9 was written"
[ "$(pc '{.status.skippedNodes}')" = 1 ] || fatal "skippedNodes $(pc '{.status.skippedNodes}')"
ok "node-9 (ToBeDeletedByClusterAutoscaler) skipped: no NodeProxyConfig, skippedNodes 1"
owner=$(kubectl get nodeproxyconfig node-0 -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} controller={.metadata.ownerReferences[0].controller}')
[ "$owner" = "ProxyConfig/fleet controller=true" ] || fatal "owner of node-0: $owner"
ok "NodeProxyConfigs are controlled by ProxyConfig fleet"
show "after the first revision"

step "gate change: LoadBalancerIPMode off"
kubectl patch proxyconfig fleet --type=merge -p '{"spec":{"config":{"featureGates":{"LoadBalancerIPMode":false}}}}' >/dev/null
stages=$(follow_stages 120) || fatal "gate change: $stages"
[ "$stages" = "canary early fleet" ] || fatal "gate change went: $stages"
R2=$(pc '{.status.lastGoodRevision}')
[ "$R2" != "$R1" ] || fatal "no new revision"
for i in $(seq 0 8); do [ "$(revision_of node-$i)" = "$R2" ] || fatal "node-$i has $(revision_of node-$i), want $R2"; done
[ "$(kubectl get nodeproxyconfig node-3 -o jsonpath='{.spec.config.featureGates.LoadBalancerIPMode}')" = false ] ||
  fatal "node-3's configuration does not have the gate off"
reason_is Available AllHealthy || fatal "Available: $(reason Available)"
ok "revision $R2 (gate off) rolled out: $stages; nodes 0-8 carry it"
show "after the gate change"
kubectl get events -n default --field-selector involvedObject.name=fleet -o custom-columns=REASON:.reason,MESSAGE:.message \
  > "$OUT/events.log" 2>&1 || true
grep -q StageStarted "$OUT/events.log" && grep -q RolloutComplete "$OUT/events.log" || fatal "no stage Events"
ok "Events: $(awk 'NR>1{print $1}' "$OUT/events.log" | sort | uniq -c | awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}')"

step "a revision the proxiers reject: halt and roll back"
kubectl patch proxyconfig fleet --type=merge -p '{"spec":{"config":{"ipvs":{"scheduler":"sed"}}}}' >/dev/null
stages=$(follow_stages 120) || fatal "bad revision: $stages"
R3=$(pc '{.status.revision}')
[ "$(reason Degraded)" = RevisionFailed ] || fatal "Degraded: $(reason Degraded)"
[ "$(reason Progressing)" = RolledBack ] || fatal "Progressing: $(reason Progressing)"
[ "$(pc '{.status.badRevisions[0]}')" = "$R3" ] || fatal "badRevisions: $(pc '{.status.badRevisions}')"
[ "$(pc '{.status.targetRevision}')" = "$R2" ] || fatal "target $(pc '{.status.targetRevision}'), want $R2"
for i in $(seq 0 8); do [ "$(revision_of node-$i)" = "$R2" ] || fatal "node-$i not rolled back: $(revision_of node-$i)"; done
[ "$(pc '{.status.stages[2].updated}')" = 0 ] || fatal "the fleet stage got the bad revision"
failure=$(pc '{.status.failures[0].node}: {.status.failures[0].message}')
ok "revision $R3 failed on the canary ($failure), stages seen: $stages"
ok "rolled back: every node carries $R2 again; the fleet stage never started"
kubectl get events -n default --field-selector involvedObject.name=fleet -o custom-columns=REASON:.reason,MESSAGE:.message \
  > "$OUT/events.log" 2>&1 || true
for reason in NodeFailed RevisionFailed RollingBack; do
  grep -q "^$reason " "$OUT/events.log" || fatal "no $reason Event"
done
ok "Warning Events: $(grep -E '^(NodeFailed|RevisionFailed|RollingBack) ' "$OUT/events.log" | cut -c1-150 | paste -sd'|' | sed 's/|/ | /g')"
show "after the rollback"

step "leader failover"
if [ "$LEADER" = operator-a ]; then kill "$PID_operator_a"; OTHER=operator-b; else kill "$PID_operator_b"; OTHER=operator-a; fi
wait_until 40 "$OTHER to take the Lease" bash -c "[ \"\$(kubectl -n kipvs-system get lease kipvs-operator -o jsonpath='{.spec.holderIdentity}')\" = $OTHER ]"
ok "$LEADER stopped (released the Lease); $OTHER leads"
kubectl patch proxyconfig fleet --type=merge -p '{"spec":{"config":{"ipvs":{"scheduler":"wrr"}}}}' >/dev/null
stages=$(follow_stages 120) || fatal "after failover: $stages"
reason_is Progressing RolloutComplete || fatal "after failover: Progressing $(reason Progressing)"
reason_is Degraded AsExpected || fatal "after failover: Degraded $(reason Degraded)"
ok "$OTHER rolled revision $(pc '{.status.lastGoodRevision}') out: $stages"

step "operator metrics and probes"
METRICS_PORT=$((${PORT_BASE:-18000} + $([ "$OTHER" = operator-a ] && echo 81 || echo 82)))
curl -fsS "http://127.0.0.1:$METRICS_PORT/healthz" >/dev/null || fatal "/healthz"
curl -fsS "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null || fatal "/readyz"
curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" > "$OUT/metrics.txt" || fatal "/metrics"
grep -q '^kipvs_operator_reconciles_total{result="ok"}' "$OUT/metrics.txt" || fatal "no reconcile counter"
grep -q '^kipvs_operator_rollout_nodes{proxyconfig="fleet",state="healthy"} 9' "$OUT/metrics.txt" ||
  fatal "rollout_nodes: $(grep rollout_nodes "$OUT/metrics.txt")"
grep -q '^kipvs_operator_writes_total{kind="apply"}' "$OUT/metrics.txt" || fatal "no write counter"
ok "$OTHER serves /healthz, /readyz and /metrics: $(grep -E '^kipvs_operator_(reconciles_total|writes_total)' "$OUT/metrics.txt" | paste -sd' ')"

step "the move from kube-proxy: standby, a takeover that fails on node-5 and rolls back, then one that completes"
label_of() { kubectl get node "$1" -o jsonpath='{.metadata.labels.kipvs\.io/service-proxy}'; }
labels() { for i in $(seq 0 8); do printf '%s ' "$(label_of node-$i)"; done; }
proxy_phase() { kubectl get nodeproxyconfig "$1" -o jsonpath='{.status.serviceProxy}'; }
kill "$FAKE_PID"; wait "$FAKE_PID" 2>/dev/null || true
"$KIPVS_FAKE_PROXIER" --apply-delay 1s --kube-proxy --kube-proxy-stays node-5 > "$OUT/fake-kube-proxy.log" 2>&1 &
PIDS+=($!)
FAKE_PID=$!
ok "fake_proxier --kube-proxy: kube-proxy runs where the label is not kipvs, and never leaves node-5"
kubectl patch proxyconfig fleet --type=merge -p '{"spec":{"config":{"serviceProxy":"kube-proxy"}}}' >/dev/null
stages=$(follow_stages 120) || fatal "serviceProxy kube-proxy: $stages"
reason_is Progressing RolloutComplete || fatal "serviceProxy kube-proxy: Progressing $(reason Progressing)"
STANDBY=$(pc '{.status.lastGoodRevision}')
[ "$(labels)" = "$(printf 'kube-proxy %.0s' $(seq 0 8))" ] || fatal "labels after serviceProxy kube-proxy: $(labels)"
[ -z "$(label_of node-9)" ] || fatal "the tainted node-9 was labelled"
[ "$(proxy_phase node-3)" = HandedBack ] || fatal "node-3 status.serviceProxy $(proxy_phase node-3)"
ok "revision $STANDBY (serviceProxy kube-proxy) rolled out: $stages; nodes 0-8 labelled kube-proxy, kipvs HandedBack"

mark=$(wc -l < "$OUT/fake-kube-proxy.log")
kubectl patch proxyconfig fleet --type=merge -p '{"spec":{"config":{"serviceProxy":"kipvs"}}}' >/dev/null
stages=$(follow_stages 180) || fatal "takeover with node-5 stuck: $stages"
TAKEOVER=$(pc '{.status.revision}')
[ "$(reason Degraded)" = RevisionFailed ] || fatal "Degraded: $(reason Degraded)"
[ "$(reason Progressing)" = RolledBack ] || fatal "Progressing: $(reason Progressing)"
[ "$(pc '{.status.targetRevision}')" = "$STANDBY" ] || fatal "target $(pc '{.status.targetRevision}'), want $STANDBY"
[[ " $(pc '{.status.badRevisions[*]}') " == *" $TAKEOVER "* ]] || fatal "badRevisions: $(pc '{.status.badRevisions}')"
failure=$(pc '{.status.failures[0].node}: {.status.failures[0].message}')
[[ "$failure" == node-5:* ]] || fatal "failures: $failure"
ok "revision $TAKEOVER (serviceProxy kipvs) went $stages and failed on $failure"
took_over=$(tail -n +$((mark + 1)) "$OUT/fake-kube-proxy.log" | grep -c ': taking over' || true)
[ "$took_over" -ge 1 ] || fatal "no node took over before node-5 failed"
export -f label_of labels
wait_until 60 "every label back to kube-proxy" bash -c '[ "$(labels)" = "$1" ]' _ "$(printf 'kube-proxy %.0s' $(seq 0 8))"
applied() { kubectl get nodeproxyconfigs -o jsonpath='{range .items[*]}{.status.observedRevision}/{.status.phase} {end}'; }
export -f applied
wait_until 60 "every node Applied on $STANDBY" bash -c '[ "$(applied)" = "$1" ]' _ "$(printf "$STANDBY/Applied %.0s" $(seq 0 8))"
handed_back=$(tail -n +$((mark + 1)) "$OUT/fake-kube-proxy.log" | grep -c ': handing back' || true)
grep -q 'node-5: kube-proxy leaves' "$OUT/fake-kube-proxy.log" && fatal "kube-proxy left node-5"
ok "rolled back: $took_over node(s) had taken over and $handed_back handed back; every label is kube-proxy again, every node Applied on $STANDBY"

step "a crashlooping kipvs pod on the canary (issue 33): kube-proxy stays there, the revision fails and rolls back"
unserved() { grep ': no serving proxy' "$@" || true; }
kill "$FAKE_PID"; wait "$FAKE_PID" 2>/dev/null || true
"$KIPVS_FAKE_PROXIER" --apply-delay 1s --kube-proxy --proxier-missing node-0 > "$OUT/fake-kube-proxy-missing.log" 2>&1 &
PIDS+=($!)
FAKE_PID=$!
kubectl patch proxyconfig fleet --type=merge -p '{"spec":{"config":{"ipvs":{"scheduler":"wlc"}}}}' >/dev/null
stages=$(follow_stages 120) || fatal "takeover with the canary's proxier missing: $stages"
MISSING=$(pc '{.status.revision}')
[ "$(reason Degraded)" = RevisionFailed ] || fatal "Degraded: $(reason Degraded)"
failure=$(pc '{.status.failures[0].node}: {.status.failures[0].message}')
[[ "$failure" == node-0:* ]] || fatal "failures: $failure"
[ "$(pc '{.status.targetRevision}')" = "$STANDBY" ] || fatal "target $(pc '{.status.targetRevision}'), want $STANDBY"
[ "$(label_of node-0)" = kube-proxy ] || fatal "node-0 labelled $(label_of node-0)"
grep -q 'node-0: kube-proxy leaves' "$OUT/fake-kube-proxy-missing.log" && fatal "kube-proxy left node-0, whose proxier never ran"
[ -z "$(unserved "$OUT/fake-kube-proxy-missing.log")" ] || fatal "nodes without a proxy: $(unserved "$OUT/fake-kube-proxy-missing.log")"
ok "revision $MISSING: node-0's proxier never reported, its label stayed kube-proxy (kube-proxy never left), it failed by applyTimeout ($failure) and the fleet rolled back to $STANDBY; no node was ever without a serving proxy"

kill "$FAKE_PID"; wait "$FAKE_PID" 2>/dev/null || true
"$KIPVS_FAKE_PROXIER" --apply-delay 1s --kube-proxy > "$OUT/fake-kube-proxy-2.log" 2>&1 &
PIDS+=($!)
FAKE_PID=$!
# A new revision (the failed one is bad): the same takeover with scheduler lc.
kubectl patch proxyconfig fleet --type=merge -p '{"spec":{"config":{"ipvs":{"scheduler":"lc"}}}}' >/dev/null
stages=$(follow_stages 180) || fatal "takeover: $stages"
[ "$stages" = "canary early fleet" ] || fatal "takeover went: $stages"
reason_is Progressing RolloutComplete || fatal "takeover: Progressing $(reason Progressing)"
[ "$(labels)" = "$(printf 'kipvs %.0s' $(seq 0 8))" ] || fatal "labels after the takeover: $(labels)"
for i in $(seq 0 8); do
  [ "$(proxy_phase node-$i)" = Programming ] || fatal "node-$i status.serviceProxy $(proxy_phase node-$i)"
done
first=$(grep -m1 ': taking over' "$OUT/fake-kube-proxy-2.log" | sed 's/^fake-proxier: \([^:]*\):.*/\1/')
[ "$first" = node-0 ] || fatal "the first node taken over is $first, not the canary"
managers=$(kubectl get --raw /api/v1/nodes/node-3 | python3 -c '
import json, sys
print(json.dumps([f["fieldsV1"] for f in json.load(sys.stdin)["metadata"]["managedFields"] if f["manager"] == "kipvs-operator"]))')
[ "$managers" = '[{"f:metadata": {"f:labels": {"f:kipvs.io/service-proxy": {}}}}]' ] ||
  fatal "kipvs-operator manages more of node-3 than its label: $managers"
ok "revision $(pc '{.status.lastGoodRevision}') took every node over: $stages, the canary first; labels kipvs, status.serviceProxy Programming; kipvs-operator manages only the label of a Node"
show "after the takeover"

step "result"
show "final"
echo "  \$ kubectl get proxyconfig -o wide"; kubectl get proxyconfig -o wide | sed 's/^/    /'
echo "  \$ kubectl get nodeproxyconfigs"; kubectl get nodeproxyconfigs | sed 's/^/    /'
echo "  \$ kubectl get proxyconfig   # at each stage start, every rollout above"; sed 's/^/    /' "$OUT/snapshots.log"
suite_end "operator e2e"
