#!/usr/bin/env bash
# Differential parity with the real kube-proxy: kube-proxy v1.24.0-alpha.1 (IPVS mode, built from
# ../shared/k8s by hack/lib/k8s-build.sh) and kipvs (the proxier image's kipvs-proxier) program the same
# kernel in turn, in one VM boot (hack/test-vm.sh --kube-proxy), from the same objects in a real
# kube-apiserver 1.24 on this machine's loopback (hack/control-plane.sh; the guest reaches it through QEMU's
# user-mode network as in hack/test-e2e.sh), with the same KubeProxyConfiguration.
#
# The corpus (tests/kube-proxy/corpus.py): one cluster per plan vector (proxier/testdata/plan, every step
# of a multi-step one; ClusterIPs and NodePorts moved into the apiserver's ranges) and generated clusters of
# random Services (fixed seed). For each cluster: the previous objects are deleted, the cluster's applied
# (and its status patched), then the guest agent (tests/kube-proxy/agent.sh) runs kube-proxy until it has
# converged, reads `ipvsadm -Sn` and the addresses on kube-ipvs0, stops it and flushes the kernel, and does
# the same with `kipvs-proxier run --once`. tests/kube-proxy/compare.py compares the two states line by line:
# every difference is a deviation listed in tests/kube-proxy/deviations.yaml (with its reason and source) or
# fails the run.
# Without kube-apiserver 1.24 (no ../shared/k8s) it prints what it skips and exits 0.
#
# usage: hack/parity-kube-proxy.sh [--fast | --bench N...]
#   --fast: the subset hack/test.sh runs (PARITY_FAST_VECTORS and one generated cluster of 30 Services)
#   --bench N...: clusters of N ClusterIP Services with 2 endpoints each (hack/bench-vs-kube-proxy.sh), each
#           compared too; prints both proxiers' time to converge, CPU seconds and peak RSS, and the ratios
#   default: every plan vector, PARITY_GENERATED (6) generated clusters of PARITY_PER_CLUSTER (40) Services and
#           the scale clusters of PARITY_SCALE (1000; comma-separated sizes, "" for none), with their figures
# env:   PARITY_SEED (25), CP_PORT/CP_ETCD_PORT (27443/27790), PARITY_AGENT_PORT (27100), KEEP=1 (keep the
#        state dir: corpus, results, logs), VMCACHE, CPCACHE
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/host-tools.sh && host_tools # kubectl, curl, ...
. hack/lib/k8s-build.sh
. hack/lib/kube-status.sh
export CP_PORT=${CP_PORT:-27443} CP_ETCD_PORT=${CP_ETCD_PORT:-27790}
AGENT_PORT=${PARITY_AGENT_PORT:-27100}
SEED=${PARITY_SEED:-25}
FAST_VECTORS=${PARITY_FAST_VECTORS:-load-balancer-source-ranges,external-ips,only-local-load-balancing,nodeport-ipv4-sctp,session-affinity,ready-and-terminating-cluster,internal-traffic-policy-e2e,dual-stack}
say() { printf 'parity: %s\n' "$*"; }
if [ "$(hack/control-plane.sh version)" != 1.24 ]; then
  say "SKIPPED (needs the Kubernetes 1.24 source in ../shared/k8s: kube-proxy 1.24 and v1 EndpointSlices)"
  exit 0
fi
python3 -c 'import yaml' 2> /dev/null || apt-get install -y -qq python3-yaml > /dev/null
T0=$(date +%s)
say "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
KUBE_PROXY=$(k8s_build cmd/kube-proxy)

STATE=$(mktemp -d /tmp/kipvs-parity.XXXXXX)
vm_pid=""
agent() { # agent CMD ARGS...: the answer without its AGENT-RC line; fails when the command did
  local out
  out=$(curl -s -m "${AGENT_TIMEOUT:-300}" "http://127.0.0.1:$AGENT_PORT/cgi-bin/agent?$(tr ' ' '+' <<<"$*")") || return 1
  sed '$d' <<<"$out"
  [ "$(tail -n1 <<<"$out")" = AGENT-RC=0 ]
}
cleanup() {
  if [ -n "$vm_pid" ] && kill -0 "$vm_pid" 2>/dev/null; then
    AGENT_TIMEOUT=5 agent finish 1 > /dev/null 2>&1 || true
    sleep 5; kill "$vm_pid" 2>/dev/null || true
  fi
  hack/control-plane.sh stop "$STATE/cp" || true
  if [ "${KEEP:-0}" = 1 ]; then say "state kept in $STATE"; else rm -rf "$STATE"; fi
}
trap cleanup EXIT

# ---- the corpus ------------------------------------------------------------------------------------------
CORPUS=$STATE/corpus
LIMIT=120 # seconds a proxier may take to converge on one cluster
if [ "${1:-}" = --fast ]; then
  python3 tests/kube-proxy/corpus.py "$CORPUS" --vectors proxier/testdata/plan --only "$FAST_VECTORS" \
    --generated 1 --per-cluster 30 --seed "$SEED"
elif [ "${1:-}" = --bench ]; then
  shift
  [ $# -gt 0 ] || { echo "usage: $0 --bench N..." >&2; exit 2; }
  python3 tests/kube-proxy/corpus.py "$CORPUS" --scale "$(tr ' ' ',' <<<"$*")"
  LIMIT=1800
else
  python3 tests/kube-proxy/corpus.py "$CORPUS" --vectors proxier/testdata/plan \
    --generated "${PARITY_GENERATED:-6}" --per-cluster "${PARITY_PER_CLUSTER:-40}" --seed "$SEED" \
    --scale "${PARITY_SCALE-1000}"
  LIMIT=600
fi
# the fast subset's clusters first, the scale clusters last
CLUSTERS=$(ls "$CORPUS" | awk -v fast=",$FAST_VECTORS," '{ n = $0; sub(/\..*/, "", n)
  print (index(fast, "," n ",") || $0 ~ /^gen-[0-9]+-0$/ ? 0 : $0 ~ /^scale-/ ? 2 : 1), $0 }' | sort -k1,1n -k2 | cut -d' ' -f2)
say "corpus: $(wc -w <<<"$CLUSTERS") clusters"

# ---- control plane, the guest's files --------------------------------------------------------------------
hack/control-plane.sh start "$STATE/cp"
KC=$STATE/cp/kubeconfig
k() { kubectl --kubeconfig "$KC" "$@"; }
G=$STATE/guest # the guest's /payload/kube-proxy
mkdir -p "$G/clusters"
hack/vm/kube-proxy-userland.sh "$G"
cp "$KUBE_PROXY" "$G/kube-proxy"
cp tests/kube-proxy/guest.sh tests/kube-proxy/agent.sh "$G/" && cp -r tests/kube-proxy/www "$G/"
# The guest's kubeconfigs: the host's loopback as QEMU shows it; kipvs's rustls client also gets the
# apiserver's certificate as CA (it loads a CA bundle otherwise, and the guest has none), client-go refuses
# a CA together with insecure-skip-tls-verify (the certificate does not name 10.0.2.2).
sed "s#https://127.0.0.1:$CP_PORT#https://10.0.2.2:$CP_PORT#" "$KC" > "$G/kubeconfig"
sed "s#insecure-skip-tls-verify: true#insecure-skip-tls-verify: true, certificate-authority-data: $(base64 -w0 "$STATE/cp/certs/apiserver.crt")#" \
  "$G/kubeconfig" > "$G/kipvs-kubeconfig"
for c in $CLUSTERS; do
  mkdir -p "$G/clusters/$c" && cp "$CORPUS/$c"/{kube-proxy.yaml,kipvs.yaml,addrs} "$G/clusters/$c/"
done

# ---- the VM ----------------------------------------------------------------------------------------------
say "starting the VM (hack/test-vm.sh --kube-proxy; console log in target/vm/console.log)"
KIPVS_KUBE_PROXY_DIR=$G VMTIMEOUT=${VMTIMEOUT:-3600} VMNET="net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:$AGENT_PORT-10.0.2.15:7000" \
  hack/test-vm.sh --kube-proxy > "$STATE/vm.log" 2>&1 &
vm_pid=$!
t=$(date +%s)
until [ "$(AGENT_TIMEOUT=5 agent ping 2>/dev/null)" = pong ]; do
  kill -0 "$vm_pid" 2>/dev/null || { tail -n 40 "$STATE/vm.log"; say "the VM exited before its agent answered"; exit 1; }
  [ $(( $(date +%s) - t )) -lt 900 ] || { tail -n 40 "$STATE/vm.log"; say "no agent after 900 s"; exit 1; }
  sleep 2
done
say "guest agent up after $(( $(date +%s) - t )) s"

# ---- each cluster: apply, kube-proxy, kipvs --------------------------------------------------------------
R=$STATE/results
failed=0
for c in $CLUSTERS; do
  mkdir -p "$R/$c"
  if [ -f "$CORPUS/$c/not-comparable" ]; then
    say "$c: not compared: $(cat "$CORPUS/$c/not-comparable")"; continue
  fi
  k delete svc,endpointslices -A -l kipvs-parity=1 --wait=false > /dev/null 2>&1
  k delete node test-node --ignore-not-found --wait=false > /dev/null
  # The apiserver's validation stands: an object it rejects (an invalid vector input, a second Service on one
  # ClusterIP) is left out and named in the report; fields 1.24 does not know (trafficDistribution) are
  # pruned, as a 1.24 cluster does (--validate=false: no client-side schema check).
  k apply --validate=false -f "$CORPUS/$c/objects.yaml" > "$R/$c/apply.log" 2>&1 || true
  if [ -f "$CORPUS/$c/create-0.json" ]; then # a scale cluster: four kubectl at once
    creates=()
    for f in "$CORPUS/$c"/create-*.json; do
      { k create -f "$f" 2>&1 | grep -v ' created$' >> "$R/$c/apply.log"; } &
      creates+=($!)
    done
    wait "${creates[@]}" || true # (not the VM, the other background job)
  fi
  grep -E '^(Error|error)|is invalid' "$R/$c/apply.log" | sed 's/^Error from server ([A-Za-z]*): error when [a-z]* "[^"]*": //' > "$R/$c/rejected-objects" || true
  while read -r path body; do
    KUBECONFIG=$KC patch_status "$path" "$body" > /dev/null
  done < "$CORPUS/$c/status.txt"
  for p in kube-proxy kipvs; do
    if ! AGENT_TIMEOUT=$((LIMIT + 100)) agent run "$p" "$c" "$LIMIT" > "$R/$c/$p.out"; then
      say "$c: $p failed:"; sed 's/^/    /' "$R/$c/$p.out" | tail -n 45; failed=1
      rm -f "$R/$c/$p.out"
    fi
  done
  say "$c: kube-proxy $(sed -n 's/^seconds //p' "$R/$c/kube-proxy.out" 2>/dev/null) s, kipvs $(sed -n 's/^seconds //p' "$R/$c/kipvs.out" 2>/dev/null) s"
done

# ---- the comparison ----------------------------------------------------------------------------------------
set +e
python3 tests/kube-proxy/compare.py "$CORPUS" "$R" tests/kube-proxy/deviations.yaml | tee "$STATE/report"
rc=${PIPESTATUS[0]}
set -e
[ "$failed" = 0 ] || rc=1
agent finish "$rc" > /dev/null
wait "$vm_pid"; vrc=$?
vm_pid=""
grep -E '^(PASS|FAIL|SKIP) kube-proxy' "$STATE/vm.log"
[ "$vrc" = 0 ] || { tail -n 30 "$STATE/vm.log"; rc=1; }
say "done in $(( $(date +%s) - T0 )) s, load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
