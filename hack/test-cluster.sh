#!/usr/bin/env bash
# The proxier (fake dataplane) against a real kube-apiserver on loopback (hack/control-plane.sh): watches, the
# EndpointSlice version, /healthz and /livez, NodeProxyConfig status, version skew and RBAC (tests/cluster/skew.sh),
# the Services and EndpointSlices of tests/cluster/endpointslices.yaml, an apiserver outage. docs/testing.md,
# "The layers". Ends with "N passed, M failed"; exit status 1 if anything failed.
#
# env: KIPVS_PROXIER (binary; default: cargo build, target/debug/kipvs-proxier), CLUSTER_STATE (state dir,
#      default a temporary one, removed unless KEEP=1), CP_PORT/CP_ETCD_PORT (apiserver and etcd ports, default
#      26443/24790: not hack/control-plane.sh's defaults, so that a control plane started by hand keeps running,
#      and below the kernel's ephemeral port range, so that no outgoing connection holds one),
#      CPCACHE (hack/control-plane.sh), PORT_BASE (first of nine local ports: healthz, metrics and gRPC
#      health of the main proxier, then of the two in tests/cluster/skew.sh; default 20256).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/init.sh && suite cluster
. hack/lib/host-tools.sh && host_tools # kubectl, curl, ... (a fresh machine lacks them)
export RUST_BACKTRACE=0
state_dir cluster "${CLUSTER_STATE:-}"
export CP_PORT=${CP_PORT:-26443} CP_ETCD_PORT=${CP_ETCD_PORT:-24790}
PORT_BASE=${PORT_BASE:-20256}
HZ=127.0.0.1:$PORT_BASE MP=127.0.0.1:$((PORT_BASE + 1)) GP=127.0.0.1:$((PORT_BASE + 2))
NODE=test-node

if [ -z "${KIPVS_PROXIER:-}" ]; then
  . hack/lib/executables.sh
  KIPVS_PROXIER=$(executable kipvs-proxier)
fi

proxier_pid=""
stop_all() {
  [ -n "$proxier_pid" ] && kill "$proxier_pid" 2>/dev/null && wait "$proxier_pid" 2>/dev/null
  for pid in ${skew_pids:-}; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  hack/control-plane.sh stop "$STATE" || true
}
on_exit stop_all

for port in "$CP_PORT" "$CP_ETCD_PORT" "$((CP_ETCD_PORT + 10))" $(seq "$PORT_BASE" $((PORT_BASE + 8))); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    say "port $port is in use; set CP_PORT, CP_ETCD_PORT or PORT_BASE"; trap - EXIT; exit 2
  fi
done
t0=$(now)
hack/control-plane.sh start "$STATE"
KC=$STATE/kubeconfig
K8S=$(cat "$STATE/version")
say "control plane (kube-apiserver $K8S) up in $(elapsed "$t0") s"
MINOR=${K8S#1.}
python3 -c 'import yaml' 2> /dev/null || apt-get install -y -qq python3-yaml > /dev/null
ES_API=$(python3 tests/lib/k8s_api.py "$MINOR" --api)

RUST_LOG=info,kipvs_proxier::ops=debug,kube_client::client::builder=off "$KIPVS_PROXIER" run --kubeconfig "$KC" --node "$NODE" --dataplane=fake --healthz-bind-address "$HZ" \
  --metrics-bind-address "$MP" --grpc-health-bind-address "$GP" --health-check-bind-ip 127.0.0.1 \
  > "$STATE/proxier.log" 2>&1 &
proxier_pid=$!
LOG=$STATE/proxier.log

code() { curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$1"; }
body() { curl -s -m 2 "http://$1"; }
metric() { curl -s -m 2 "http://$MP/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
alive() { kill -0 "$proxier_pid" 2>/dev/null; }

check "the proxier serves /livez (200)" until_ 30 is 200 code "$HZ/livez"
ES="kipvs_api_resource_unavailable{resource=\"endpointslices.$ES_API\"}"
check "the proxier logs that it reads EndpointSlices as $ES_API" until_ 30 grep -qE "reading EndpointSlices as $ES_API( |\$)" "$LOG"
check "/healthz is 503 while the Node does not exist" until_ 10 is 503 code "$HZ/healthz"
check "  ... with nodeEligible false" sh -c "curl -s http://$HZ/healthz | grep -q '\"nodeEligible\":false'"

# The apiserver's own `default/kubernetes` Service is there from the start.
check "the kubernetes Service is planned (kipvs_virtual_servers 1)" until_ 20 is 1 metric kipvs_virtual_servers
k apply -f tests/cluster/objects.yaml > "$STATE/apply.log" 2>&1 || { cat "$STATE/apply.log"; bad "kubectl apply"; }
check "/healthz is 200 once the Node exists" until_ 20 is 200 code "$HZ/healthz"
check "the two new Services' cluster IPs are planned (kipvs_virtual_servers 3)" until_ 20 is 3 metric kipvs_virtual_servers
changes=$(metric kubeproxy_sync_proxy_rules_service_changes_total)
check "service changes counted ($changes)" [ "${changes:-0}" -ge 2 ]
HCP=$(k get service shop -o jsonpath='{.spec.healthCheckNodePort}')
say "shop's healthCheckNodePort: $HCP"
check "its health-check node port answers 503 (no local endpoint)" until_ 10 is 503 code "127.0.0.1:$HCP/"
check "  ... with localEndpoints 0" sh -c "curl -s http://127.0.0.1:$HCP/ | grep -q '\"localEndpoints\":0'"
check "  ... and X-Load-Balancing-Endpoint-Weight: 0" \
  sh -c "curl -s -D - -o /dev/null http://127.0.0.1:$HCP/ | grep -qi '^x-load-balancing-endpoint-weight: 0'"

"$KIPVS_PROXIER" inspect --kubeconfig "$KC" --node "$NODE" --dataplane=fake > "$STATE/inspect.txt" 2>&1 || true
check "inspect lists the Services from the API, by name" grep -q '^default/shop:http$' "$STATE/inspect.txt"
check "  ... with their virtual servers" grep -q 'TCP 10.96.0.51:80 rr' "$STATE/inspect.txt"

k taint nodes "$NODE" ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule > /dev/null
t=$(now)
POLL=0.02 check "tainted ToBeDeletedByClusterAutoscaler: /healthz 503" until_ 20 is 503 code "$HZ/healthz"
say "  /healthz flipped $(awk "BEGIN{printf \"%.2f\", $(now) - $t}") s after kubectl taint"
check "  ... with nodeEligible false" sh -c "curl -s http://$HZ/healthz | grep -q '\"nodeEligible\":false'"
check "  ... while /livez stays 200" is 200 code "$HZ/livez"
k taint nodes "$NODE" ToBeDeletedByClusterAutoscaler- > /dev/null
check "taint removed: /healthz 200 again" until_ 20 is 200 code "$HZ/healthz"

# NodeProxyConfig: no CRD at start, then a revision applied live, then one the proxier cannot apply.
check "NodeProxyConfig CRD missing: logged, running on the local configuration" \
  grep -q 'nodeproxyconfigs.kipvs.io is not served' "$LOG"
k apply --validate=false -k config/crd > "$STATE/crd.log" 2>&1 || { cat "$STATE/crd.log"; bad "kubectl apply CRDs"; }
k wait --for condition=established --timeout=30s crd/nodeproxyconfigs.kipvs.io > /dev/null
npc() { # npc REVISION SCHEDULER: the operator's part of the node's NodeProxyConfig
  k apply -f - > /dev/null <<EOF
apiVersion: kipvs.io/v1alpha1
kind: NodeProxyConfig
metadata: {name: $NODE}
spec: {revision: $1, assignedAt: "2026-11-22T00:00:00Z", config: {ipvs: {scheduler: $2}}}
EOF
}
npc_field() { k get nodeproxyconfig "$NODE" -o "jsonpath={.status.$1}"; }
npc_status() { echo "$(npc_field observedRevision) $(npc_field phase) $(npc_field healthy)"; }
npc r1 wrr
check "NodeProxyConfig r1 (wrr): reported r1 Applied, healthy" until_ 60 is "r1 Applied true" npc_status
check "  ... with syncErrors 0" is 0 npc_field syncErrors
check "  ... and a lastSyncTime" [ -n "$(npc_field lastSyncTime)" ]
check "  ... by the proxier's field manager" sh -c "kubectl --kubeconfig '$KC' get nodeproxyconfig '$NODE' \
  -o jsonpath='{.metadata.managedFields[*].manager}' | grep -q kipvs-proxier"
npc r2 nope
check "NodeProxyConfig r2 (unknown scheduler): reported r2 Failed, healthy" until_ 30 is "r2 Failed true" npc_status
check "  ... with the reason" sh -c "kubectl --kubeconfig '$KC' get nodeproxyconfig '$NODE' \
  -o jsonpath='{.status.message}' | grep -q nope"
check "  ... while the proxier keeps running (/livez 200)" is 200 code "$HZ/livez"
npc r1 wrr
check "rolled back to r1: reported r1 Applied again" until_ 30 is "r1 Applied true" npc_status
# Issue 15 item 4: a hand edit under the same revision that fails, then reverted to the exact original.
npc r1 nope
check "r1 edited by hand to an unknown scheduler: reported r1 Failed" until_ 30 is "r1 Failed true" npc_status
npc r1 wrr
check "  ... and reverted: reported r1 Applied again without a restart" until_ 30 is "r1 Applied true" npc_status
. tests/cluster/skew.sh

. tests/cluster/endpointslices.sh

k delete service web > /dev/null
check "a deleted Service leaves the plan (kipvs_virtual_servers 2)" until_ 20 is 2 metric kipvs_virtual_servers
check "the health-check node port still answers" is 503 code "127.0.0.1:$HCP/"
k delete node "$NODE" > /dev/null
check "a deleted Node fails /healthz (503)" until_ 20 is 503 code "$HZ/healthz"
check "  ... while /livez stays 200" is 200 code "$HZ/livez"

# The apiserver goes away (SIGKILL: on SIGTERM newer releases stop listening but keeps open watches for a while): the
# proxier keeps running with what it knows.
kill -9 "$(cat "$STATE/apiserver.pid")"
sleep 5 # on purpose: the watchers' retries (0.8-6 s apart, source::Retry) against no apiserver
check "apiserver gone: the proxier keeps running" alive
check "  ... and keeps its objects (kipvs_virtual_servers 2)" is 2 metric kipvs_virtual_servers
check "  ... and /livez 200" is 200 code "$HZ/livez"
check "  ... and logs the failed watches" until_ 30 grep -q 'watch failed, keeping the last known objects' "$LOG"
check "the EndpointSlice API was never reported unavailable (log, metric)" \
  sh -c "! grep -q 'does not serve endpointslices' '$LOG' && [ '$(metric "$ES")' != 1 ]"
check "the proxier never exited" alive

if [ "$fail" -gt 0 ]; then say "proxier log tail:"; tail -n 30 "$LOG" | sed 's/^/    /'; fi
suite_end
