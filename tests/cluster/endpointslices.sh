# Sourced by hack/test-cluster.sh: Services and EndpointSlices (discovery.k8s.io/v1, or v1beta1 before 1.21,
# tests/lib/k8s_api.py) created with kubectl reach the running proxier's plan through its watches. The plan is the fake dataplane's table,
# replayed from the proxier's op log (tests/cluster/table.py). Leaves the cluster as it found it.
rs() { python3 tests/cluster/table.py "$LOG" "$1"; } # rs "TCP 10.96.0.60:80" -> "10.244.1.10:8080=1 ..."
vs_count() { metric kipvs_virtual_servers; }
before=$(vs_count)
python3 tests/lib/k8s_api.py "$MINOR" < tests/cluster/endpointslices.yaml > "$STATE/endpointslices.yaml"
k apply -f "$STATE/endpointslices.yaml" > "$STATE/slices.log" 2>&1 || { cat "$STATE/slices.log"; bad "kubectl apply endpointslices.yaml"; }
check "$ES_API EndpointSlices: not reported unavailable" sh -c "! grep -q 'does not serve endpointslices' '$LOG'"
check "ready (1) and serving+terminating (0) endpoints, both programmed" \
  until_ 20 is "10.244.1.10:8080=1 10.244.1.11:8080=0" rs "TCP 10.96.0.60:80"
check "every endpoint serving+terminating: the fallback uses them at weight 1 (not the non-serving one)" \
  until_ 10 is "10.244.1.12:8080=1 10.244.2.12:8080=1" rs "TCP 10.96.0.61:80"
if [ "$MINOR" -ge 21 ]; then
  check "topology hints: only the endpoints hinted for zone-a (this node's zone)" \
    until_ 10 is "10.244.1.20:8080=1 10.244.3.20:8080=1" rs "TCP 10.96.0.62:80"
else # hints came in 1.21: this apiserver drops them, so every ready endpoint serves
  check "no hints before 1.21 (the apiserver drops them): every ready endpoint" \
    until_ 10 is "10.244.1.20:8080=1 10.244.2.20:8080=1 10.244.3.20:8080=1" rs "TCP 10.96.0.62:80"
fi
check "dual-stack Service: IPv4 slice -> IPv4 virtual server" until_ 10 is "10.244.1.30:53=1" rs "UDP 10.96.0.63:53"
check "  ... IPv6 slice -> IPv6 virtual server" until_ 10 is "[fd00:10:244:1::30]:53=1" rs "UDP [fd00:10:96::63]:53"
check "a Service's endpoints split across three slices: all of them" \
  until_ 10 is "10.244.1.40:8080=1 10.244.1.41:8080=1 10.244.2.40:8080=1 10.244.3.50:8080=1" rs "TCP 10.96.0.64:80"
table_has() { python3 tests/cluster/table.py "$LOG" | grep -qxF "$1"; }
check "a Service without slices has a virtual server without real servers" \
  until_ 10 table_has "TCP 10.96.0.65:80 (no real server)"
k label endpointslice mover --overwrite kubernetes.io/service-name=moved-to > /dev/null
check "slice moved to another Service (relabelled): it leaves the first" \
  until_ 10 is "10.244.1.40:8080=1 10.244.1.41:8080=1 10.244.2.40:8080=1" rs "TCP 10.96.0.64:80"
check "  ... and joins the second" until_ 10 is "10.244.3.50:8080=1" rs "TCP 10.96.0.65:80"
# The Deployment way: the terminating endpoint goes, a new one comes ready (one slice update).
k patch endpointslice ready-1 --type=json -p '[{"op": "replace", "path": "/endpoints/1",
  "value": {"addresses": ["10.244.1.13"], "conditions": {"ready": true, "serving": true, "terminating": false}}}]' > /dev/null
check "an endpoint replaced in a slice: the new one at weight 1, the old one gone" \
  until_ 10 is "10.244.1.10:8080=1 10.244.1.13:8080=1" rs "TCP 10.96.0.60:80"
k delete --ignore-not-found -f "$STATE/endpointslices.yaml" > /dev/null
check "the Services deleted: the plan is back to its $before virtual servers" until_ 20 is "$before" vs_count
python3 tests/cluster/table.py "$LOG" > "$STATE/table.txt"
check "  ... and their virtual servers are gone from the fake table" \
  sh -c "! grep -qE '10\.96\.0\.6[0-5]|fd00:10:96::63' '$STATE/table.txt'"

# CEL (x-kubernetes-validations, 1.23 behind a gate hack/control-plane.sh turns on, on by default from 1.25) is
# enforced by the apiserver: the rule's own message comes back.
if [ "$MINOR" -lt 23 ]; then
  skipped "kube-apiserver $K8S, needs 1.23" "a ProxyConfig violating a CEL rule is rejected by the apiserver (x-kubernetes-validations)"
else
  out=$(k apply -f - 2>&1 <<'YAML' || true
apiVersion: kipvs.io/v1alpha1
kind: ProxyConfig
metadata: {name: cel-violation}
spec:
  config: {ipvs: {syncPeriod: 10s, minSyncPeriod: 1m}}
YAML
  )
  check "a ProxyConfig violating a CEL rule is rejected by the apiserver with the rule's message" \
    grep -q 'ipvs.minSyncPeriod must not be greater than ipvs.syncPeriod' <<<"$out"
  say "  apiserver: ${out:0:200}"
  check "  ... and not stored" sh -c "! kubectl --kubeconfig '$KC' get proxyconfig cel-violation >/dev/null 2>&1"
fi
