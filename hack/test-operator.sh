#!/bin/bash
# The operator's control-plane suite: the committed CRDs match the types (crdgen --check), then
# kipvs-operator and its fake proxiers against a real kube-apiserver (Debian's 1.20.2, or KIPVS_K8S_BIN's) + etcd
# on loopback (hack/control-plane.sh builds it once, then reuses ~/.cache/kipvs-cp), running
# tests/operator/e2e.sh; then, on the same control plane, the operator with real
# `kipvs-proxier run --dataplane=fake` processes, one per node (tests/operator/e2e-proxiers.sh);
# then the operator started while the apiserver is away, and a leader through an outage
# (tests/operator/outage.sh: no exit, leads within seconds of the apiserver's return); then the
# fleet harness at CI size with its faults (hack/fleet.sh 500 --check --faults: the operator
# killed mid-rollout, the apiserver stopped for 30 s; KIPVS_FLEET_NODES changes N).
# Stops the control plane on exit.
#
# usage: hack/test-operator.sh       env: CPCACHE, CP_PORT, CP_ETCD_PORT (see hack/control-plane.sh),
#                                         KIPVS_E2E_OUT (logs; default a temp dir),
#                                         PROXIER_PORT (see tests/operator/e2e-proxiers.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/init.sh && suite test-operator # step, fatal, state_dir
. hack/lib/host-tools.sh && host_tools # kubectl, curl, ... (a fresh machine lacks them)

step "build crdgen, kipvs-operator, kipvs-proxier and the fake proxier"
# --workspace: the same feature set as the rest of CI's builds, so nothing is rebuilt for this.
. hack/lib/executables.sh # executables_built
built=$(cargo build -q --workspace --bin crdgen --bin kipvs-operator --bin kipvs-proxier --example fake_proxier \
  --message-format=json-render-diagnostics | executables_built crdgen kipvs-operator kipvs-proxier fake_proxier)
CRDGEN=$(awk '$1 == "crdgen" {print $2}' <<<"$built")
KIPVS_OPERATOR=$(awk '$1 == "kipvs-operator" {print $2}' <<<"$built")
KIPVS_FAKE_PROXIER=$(awk '$1 == "fake_proxier" {print $2}' <<<"$built")
KIPVS_PROXIER=$(awk '$1 == "kipvs-proxier" {print $2}' <<<"$built")
[ -x "$CRDGEN" ] && [ -x "$KIPVS_OPERATOR" ] && [ -x "$KIPVS_FAKE_PROXIER" ] && [ -x "$KIPVS_PROXIER" ] ||
  fatal "build produced no executables"

step "generated CRDs are committed (crdgen --check)"
"$CRDGEN" --check config/crd
T_BUILD=$(date +%s)

step "control plane (kube-apiserver $(hack/control-plane.sh version), etcd)"
state_dir cp
on_exit 'hack/control-plane.sh stop "$STATE"'
hack/control-plane.sh start "$STATE"
T_CP=$(date +%s)

minor=$(cut -d. -f2 "$STATE/version")
# kubelets before 1.24 have no gRPC probes (KEP-2727): config-http-probes/ is the install for them; before 1.23
# the apiserver's schema has no x-kubernetes-validations (CEL), which kubectl's client-side validation refuses:
# --validate=false, as README says
. hack/lib/k8s-build.sh # k8s_install, k8s_apply_flags
INSTALL=$(k8s_install "$minor")
mapfile -t VALIDATE < <(k8s_apply_flags "$minor")
step "the deployment: kubectl apply -k $INSTALL ${VALIDATE[*]} --dry-run=server (images, RBAC, DaemonSet, Deployment, CRDs)"
# The namespace for real (a server-side dry run of namespaced objects needs it), everything else dry.
kubectl --kubeconfig "$STATE/kubeconfig" apply -f config/operator/namespace.yaml >/dev/null
kubectl --kubeconfig "$STATE/kubeconfig" apply -k "$INSTALL" "${VALIDATE[@]}" --dry-run=server > "$STATE/dry-run.log" 2>&1 ||
  { cat "$STATE/dry-run.log"; fatal "kubectl apply -k $INSTALL --dry-run=server failed"; }
sed 's/^/  /' "$STATE/dry-run.log"
if [ "$minor" -lt 24 ]; then # the apiserver drops the unknown grpc handler and then refuses a probe without one
  if kubectl --kubeconfig "$STATE/kubeconfig" apply -k config/ "${VALIDATE[@]}" --dry-run=server \
    > "$STATE/dry-run-grpc.log" 2>&1; then
    fatal "config/ (gRPC probes) passed on 1.$minor, which has no gRPC probes"
  fi
  grep -q 'must specify a handler type' "$STATE/dry-run-grpc.log" ||
    { cat "$STATE/dry-run-grpc.log"; fatal "config/ refused on 1.$minor for another reason"; }
  echo "  config/ (gRPC probes) refused by 1.$minor, as it has no gRPC probes: $(grep -o 'spec.template.spec.containers\[0\].livenessProbe[^,]*' "$STATE/dry-run-grpc.log" | head -n1)"
fi

step "operator end to end (tests/operator/e2e.sh)"
KUBECONFIG=$STATE/kubeconfig KIPVS_OPERATOR=$KIPVS_OPERATOR KIPVS_FAKE_PROXIER=$KIPVS_FAKE_PROXIER \
  OUT=${KIPVS_E2E_OUT:-$STATE/logs} tests/operator/e2e.sh
T_E2E=$(date +%s)

step "operator with real proxiers (tests/operator/e2e-proxiers.sh)"
KUBECONFIG=$STATE/kubeconfig KIPVS_OPERATOR=$KIPVS_OPERATOR KIPVS_PROXIER=$KIPVS_PROXIER \
  OUT=${KIPVS_E2E_OUT:-$STATE/logs}/proxiers tests/operator/e2e-proxiers.sh
T_PROXIERS=$(date +%s)

step "operator and an absent apiserver: started without it, and an outage while leading (tests/operator/outage.sh)"
KUBECONFIG=$STATE/kubeconfig KIPVS_OPERATOR=$KIPVS_OPERATOR CP_STATE=$STATE \
  OUT=${KIPVS_E2E_OUT:-$STATE/logs}/outage tests/operator/outage.sh
T_OUTAGE=$(date +%s)

step "operator at fleet scale, with faults: ${KIPVS_FLEET_NODES:=500} nodes, 1% each failing, silent, flapping /livez (hack/fleet.sh --check --faults)"
KUBECONFIG=$STATE/kubeconfig KIPVS_CP_STATE=$STATE OUT=${KIPVS_E2E_OUT:-$STATE/logs}/fleet \
  hack/fleet.sh "$KIPVS_FLEET_NODES" --check --faults --fail-share 0.01 --silent-share 0.01 --flap-share 0.01
T_END=$(date +%s)
echo "test-operator: passed in $((T_END - T0))s (build $((T_BUILD - T0))s, control plane $((T_CP - T_BUILD))s," \
  "e2e $((T_E2E - T_CP))s, e2e with proxiers $((T_PROXIERS - T_E2E))s, outage $((T_OUTAGE - T_PROXIERS))s," \
  "fleet $((T_END - T_OUTAGE))s)"
