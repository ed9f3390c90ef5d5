#!/usr/bin/env bash
# Differential parity with the real kube-proxy: kube-proxy in IPVS mode (Debian's 1.20.2 build, or
# KIPVS_K8S_BIN's: hack/lib/k8s-build.sh) and kipvs (the proxier image's kipvs-proxier) program the same
# kernel in turn, in one VM boot (hack/test-vm.sh --kube-proxy), from the same objects in a real
# kube-apiserver of the same release on this machine's loopback (hack/control-plane.sh; the guest reaches it
# through QEMU's user-mode network as in hack/test-e2e.sh), with the same KubeProxyConfiguration. The corpus,
# the configuration and the deviations are keyed on that release (1.MINOR, k8s_minor): what it serves and
# knows, and how it differs from kipvs.
#
# The corpus (tests/kube-proxy/corpus.py): one cluster per plan vector (proxier/testdata/plan, every step
# of a multi-step one; ClusterIPs and NodePorts moved into the apiserver's ranges) and generated clusters of
# random Services (fixed seed). For each cluster: the previous objects are deleted, the cluster's applied
# (and its status patched), then the guest agent (tests/kube-proxy/agent.sh) runs kube-proxy until it has
# converged, reads `ipvsadm -Sn` and the addresses on kube-ipvs0, stops it and flushes the kernel, and does
# the same with `kipvs-proxier run --once`. tests/kube-proxy/compare.py compares the two states line by line:
# every difference is a deviation listed in tests/kube-proxy/deviations.yaml (with its reason and source) or
# fails the run. With PARITY_DETECTION=1, then the bench's detection path through the proxiers' sync metric
# (hack/lib/kube-proxy-vm.sh kpvm_detection_check: convergence and churn as kube-proxy's nftables mode needs
# them, checked in IPVS mode) on the first generated cluster (~30 s more).
# The VM, the control plane and the agent are hack/lib/kube-proxy-vm.sh's (shared with
# hack/bench-vs-kube-proxy.sh, the speed and cost comparison).
#
# usage: hack/parity-kube-proxy.sh [--fast]
#   --fast: the subset hack/test.sh runs (PARITY_FAST_VECTORS and one generated cluster of 30 Services)
#   default: every plan vector, PARITY_GENERATED (6) generated clusters of PARITY_PER_CLUSTER (40) Services and
#           the scale clusters of PARITY_SCALE (1000; comma-separated sizes, "" for none), with their figures
# env:   KIPVS_K8S_BIN (hack/lib/k8s-build.sh), PARITY_DETECTION (0), PARITY_SEED (25), CP_PORT/CP_ETCD_PORT (27443/27790), PARITY_AGENT_PORT (27100), KEEP=1 (keep the
#        state dir: corpus, results, logs), VMCACHE, CPCACHE
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/host-tools.sh && host_tools # kubectl, curl, ...
. hack/lib/kube-proxy-vm.sh # kpvm_*, agent
export CP_PORT=${CP_PORT:-27443} CP_ETCD_PORT=${CP_ETCD_PORT:-27790}
SEED=${PARITY_SEED:-25}
FAST_VECTORS=${PARITY_FAST_VECTORS:-load-balancer-source-ranges,external-ips,only-local-load-balancing,nodeport-ipv4-sctp,session-affinity,ready-and-terminating-cluster,internal-traffic-policy-e2e,dual-stack}
say() { printf 'parity: %s\n' "$*"; }
kpvm_require
T0=$(date +%s)
say "kube-proxy $KPVM_RELEASE (IPVS mode) against kipvs; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
STATE=$(mktemp -d /tmp/kipvs-parity.XXXXXX)

# ---- the corpus ------------------------------------------------------------------------------------------
CORPUS=$STATE/corpus
LIMIT=120 # seconds a proxier may take to converge on one cluster
if [ "${1:-}" = --fast ]; then
  python3 tests/kube-proxy/corpus.py "$CORPUS" --minor "$KPVM_MINOR" --vectors proxier/testdata/plan --only "$FAST_VECTORS" \
    --generated 1 --per-cluster 30 --seed "$SEED"
else
  python3 tests/kube-proxy/corpus.py "$CORPUS" --minor "$KPVM_MINOR" --vectors proxier/testdata/plan \
    --generated "${PARITY_GENERATED:-6}" --per-cluster "${PARITY_PER_CLUSTER:-40}" --seed "$SEED" \
    --scale "${PARITY_SCALE-1000}"
  LIMIT=600
fi
# the fast subset's clusters first, the scale clusters last
CLUSTERS=$(ls "$CORPUS" | awk -v fast=",$FAST_VECTORS," '{ n = $0; sub(/\..*/, "", n)
  print (index(fast, "," n ",") || $0 ~ /^gen-[0-9]+-0$/ ? 0 : $0 ~ /^scale-/ ? 2 : 1), $0 }' | sort -k1,1n -k2 | cut -d' ' -f2)
say "corpus: $(wc -w <<<"$CLUSTERS") clusters"

# ---- control plane, the guest's files, the VM -------------------------------------------------------------
kpvm_init "$STATE"
for c in $CLUSTERS; do kpvm_cluster "$CORPUS" "$c"; done
kpvm_boot || exit 1

# ---- each cluster: apply, kube-proxy, kipvs --------------------------------------------------------------
R=$STATE/results
failed=0
for c in $CLUSTERS; do
  mkdir -p "$R/$c"
  if [ -f "$CORPUS/$c/not-comparable" ]; then
    say "$c: not compared: $(cat "$CORPUS/$c/not-comparable")"; continue
  fi
  kpvm_apply "$CORPUS" "$c" "$R/$c"
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
python3 tests/kube-proxy/compare.py "$CORPUS" "$R" tests/kube-proxy/deviations.yaml "$KPVM_MINOR" | tee "$STATE/report"
rc=${PIPESTATUS[0]}
set -e
[ "$failed" = 0 ] || rc=1
c=$(grep -m1 '^gen-' <<<"$CLUSTERS" || true)
if [ "${PARITY_DETECTION:-0}" = 1 ] && [ -n "$c" ]; then kpvm_detection_check "$CORPUS" "$c" "$R/$c" || rc=1; fi
kpvm_finish "$rc" || rc=1
say "done in $(( $(date +%s) - T0 )) s, load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
