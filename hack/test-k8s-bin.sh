#!/usr/bin/env bash
# KIPVS_K8S_BIN, the way testers bring their own Kubernetes release, checked with binaries whose origin is known:
# the Debian build's kube-apiserver copied into a new directory, hack/test-cluster.sh run with KIPVS_K8S_BIN set
# to it, and its output must name that directory's kube-apiserver (hack/lib/k8s-build.sh logs the binary it takes
# with its --version). A directory that lacks a component a layer needs is refused with a message naming it.
#
# usage: hack/test-k8s-bin.sh        env: CPCACHE (hack/control-plane.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/init.sh && suite k8s-bin
. hack/lib/host-tools.sh && host_tools
. hack/lib/k8s-build.sh
state_dir k8s-bin
D=$STATE
cp "$(k8s_bin kube-apiserver 2> /dev/null)" "$D/"
out=$(KIPVS_K8S_BIN=$D k8s_bin kube-proxy 2>&1) && bad "a directory without kube-proxy was taken" ||
  check "a directory without kube-proxy is refused, naming it" grep -q "has no executable kube-proxy" <<<"$out"
check "k8s_minor reads the release from the directory's kube-apiserver" [ "$(KIPVS_K8S_BIN=$D k8s_minor 2> /dev/null)" = 20 ]
if KIPVS_K8S_BIN=$D hack/test-cluster.sh > "$D/cluster.log" 2>&1; then ok "hack/test-cluster.sh passed with KIPVS_K8S_BIN"
else tail -n 30 "$D/cluster.log"; bad "hack/test-cluster.sh failed with KIPVS_K8S_BIN"; fi
{ grep -E 'passed, [0-9]+ failed' "$D/cluster.log" || true; } | tail -n1 | sed 's/^/  /'
check "  ... on $D's kube-apiserver" grep -q "k8s: kube-apiserver: $D/kube-apiserver (Kubernetes v1.20.2)" "$D/cluster.log"
suite_end
