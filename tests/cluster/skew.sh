# Sourced by hack/test-cluster.sh after the NodeProxyConfig checks (CRDs installed; k, check, until_, is, metric,
# npc_status... defined there). Two more proxiers with the fake dataplane, each on its own node name and ports:
#   - skew-new: its NodeProxyConfig was written by a "newer operator" (the CRD is patched to carry a setting this
#     version does not know, ipvs.futureSetting): it applies the known settings at once, reports Applied with the
#     ignored setting named in status.message, logs it and exports kipvs_config_ignored_settings 1;
#   - skew-rbac: its user (impersonated through the admin kubeconfig) may read Services, EndpointSlices and
#     Nodes but not NodeProxyConfigs (403, an install with the RBAC of an older release): it programs the
#     Services from its local configuration within seconds, logs why and exports
#     kipvs_api_resource_unavailable{resource="nodeproxyconfigs.kipvs.io/v1alpha1"} 1.
NPC_RESOURCE='kipvs_api_resource_unavailable{resource="nodeproxyconfigs.kipvs.io/v1alpha1"}'
skew_metric() { curl -s -m 2 "http://$1/metrics" | awk -v n="$2" '$1 == n { print $2 }'; }
skew_start() { # NAME KUBECONFIG PORT_OFFSET: start a proxier; its metrics address in $skew_mp
  local hz=127.0.0.1:$((PORT_BASE + $3)) gp=127.0.0.1:$((PORT_BASE + $3 + 2))
  skew_mp=127.0.0.1:$((PORT_BASE + $3 + 1))
  RUST_LOG=info,kipvs_proxier::ops=debug,kube_client::client::builder=off "$KIPVS_PROXIER" run --kubeconfig "$2" --node "$1" --dataplane=fake --healthz-bind-address "$hz" \
    --metrics-bind-address "$skew_mp" --grpc-health-bind-address "$gp" --health-check-bind-ip 127.0.0.2 \
    > "$STATE/$1.log" 2>&1 &
  skew_pids="${skew_pids:-} $!"
}
# The cluster IPs of kubernetes, shop and web (at least): what "programs its Services" means here.
programmed() { [ "$(skew_metric "$1" kipvs_virtual_servers)" -ge 3 ] 2>/dev/null; }

# A newer operator's CRD and NodeProxyConfig.
k patch crd nodeproxyconfigs.kipvs.io --type=json -p '[{"op": "add",
  "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/config/properties/ipvs/properties/futureSetting",
  "value": {"type": "string"}}]' > /dev/null
skew_new_npc='apiVersion: kipvs.io/v1alpha1
kind: NodeProxyConfig
metadata: {name: skew-new}
spec: {revision: r-new, assignedAt: "2026-11-22T00:00:00Z", config: {ipvs: {scheduler: wrr, futureSetting: "on"}}}'
# The apiserver takes the patched schema up asynchronously: until then it prunes futureSetting.
future_setting_kept() {
  is on k apply --dry-run=server -o 'jsonpath={.spec.config.ipvs.futureSetting}' -f - <<<"$skew_new_npc" 2> /dev/null
}
wait_for 20 "the apiserver to serve the patched NodeProxyConfig schema" future_setting_kept || true
k apply -f - > /dev/null <<<"$skew_new_npc"
check "the newer NodeProxyConfig keeps ipvs.futureSetting (the patched CRD)" \
  is on k get nodeproxyconfig skew-new -o 'jsonpath={.spec.config.ipvs.futureSetting}'
t=$(now)
skew_start skew-new "$KC" 3; MP_NEW=$skew_mp
check "skew-new (unknown setting): programs its Services within 10 s" until_ 10 programmed "$MP_NEW"
say "  programmed $(elapsed "$t") s after start"
skew_status() { k get nodeproxyconfig skew-new -o 'jsonpath={.status.observedRevision} {.status.phase}'; }
check "  ... applying the NodeProxyConfig: reported r-new Applied" until_ 20 is "r-new Applied" skew_status
check "  ... with the ignored setting in status.message" sh -c "kubectl --kubeconfig '$KC' get nodeproxyconfig \
  skew-new -o jsonpath='{.status.message}' | grep -q ipvs.futureSetting"
check "  ... in kipvs_config_ignored_settings (1)" is 1 skew_metric "$MP_NEW" kipvs_config_ignored_settings
check "  ... and in the log" grep -q 'ignoring settings this kipvs version does not know.*ipvs.futureSetting' \
  "$STATE/skew-new.log"
check "  ... never on the local configuration" sh -c "! grep -q 'could not be read' '$STATE/skew-new.log'"

# A user that may not read NodeProxyConfigs.
k apply -f - > /dev/null <<EOT
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kipvs-proxier-without-npc}
rules:
  - {apiGroups: [""], resources: ["services", "nodes"], verbs: ["get", "list", "watch"]}
  - {apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["get", "list", "watch"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kipvs-proxier-without-npc}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kipvs-proxier-without-npc}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kipvs-old-proxier}]
EOT
sed 's/user: {token: kipvs-test-token}/user: {token: kipvs-test-token, as: kipvs-old-proxier}/' "$KC" > "$STATE/kubeconfig-rbac"
check "the restricted user gets 403 on NodeProxyConfigs" sh -c "kubectl --kubeconfig '$STATE/kubeconfig-rbac' \
  get nodeproxyconfigs 2>&1 | grep -qi forbidden"
t=$(now)
skew_start skew-rbac "$STATE/kubeconfig-rbac" 6; MP_RBAC=$skew_mp
check "skew-rbac (403 on NodeProxyConfigs): programs its Services within 15 s" until_ 15 programmed "$MP_RBAC"
say "  programmed $(elapsed "$t") s after start"
check "  ... reported in $NPC_RESOURCE (1)" until_ 5 is 1 skew_metric "$MP_RBAC" "$NPC_RESOURCE"
check "  ... and logged with the reason" sh -c "grep -q 'could not be read' '$STATE/skew-rbac.log' && \
  grep -qi 'forbidden' '$STATE/skew-rbac.log'"
for pid in $skew_pids; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
skew_pids=""
k delete nodeproxyconfig skew-new > /dev/null
