#!/usr/bin/env bash
# The project's test command (README "The two commands"; .ci/run calls it): every layer, fastest first; the
# layers and what each proves: docs/testing.md.
# env: KIPVS_SKIP_VM=1 skips the VM suite and every layer that boots the VM, KIPVS_SKIP_CP=1 the control-plane
#      suites and everything after them; KIPVS_VM_OLD_KERNEL=0, KIPVS_E2E=0, KIPVS_PARITY=0, KIPVS_NODE=0 and
#      KIPVS_TAKEOVER=0 one layer each; KIPVS_K8S_BIN (a directory with the Kubernetes binaries to test against).
set -euo pipefail
[ -z "${KIPVS_K8S_BIN:-}" ] || export KIPVS_K8S_BIN=$(realpath "$KIPVS_K8S_BIN") # relative to the caller
cd "$(dirname "$0")/.."
# Everything the layers below need on the host (nft, umoci, kubectl, base tools), fetched into
# ~/.cache/kipvs-tools or installed when missing: a fresh machine needs no manual step.
. hack/lib/host-tools.sh
host_tools
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
. hack/lib/init.sh # step
export RUST_BACKTRACE=0
t0=$(date +%s)
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --workspace --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
step "cargo clippy of the shipped proxier alone (its own features: proxier-contract without harness) -D warnings"
cargo clippy -p kipvs-proxier -p kipvs-proxier-contract --quiet -- -D warnings
step "module layering of every crate (hack/check-imports.py: no import cycle; the proxier's plan/ and model/ stay below dataplane/)"
hack/check-imports.py
step "Markdown: relative links resolve, no path outside the repository (hack/check-doc-links.py)"
hack/check-doc-links.py
step "cargo test --workspace (unit tests, golden vectors, plan vectors, property tests, nftables in a private netns)"
KIPVS_REQUIRE_NFT=${KIPVS_REQUIRE_NFT:-1} cargo test --workspace --quiet
if [ "${KIPVS_SKIP_VM:-0}" != 1 ]; then
  step "real-kernel VM suite (hack/test-vm.sh)"
  hack/test-vm.sh
  step "the VM suite's kernel tests on Debian 11's kernel 5.10, the oldest in Debian's archive (docs/kernel.md; KIPVS_VM_OLD_KERNEL=0 skips it)"
  if [ "${KIPVS_VM_OLD_KERNEL:-1}" != 0 ]; then
    KIPVS_VM_KERNEL_SUITE=bullseye VM_TESTS='[1-48]*' hack/test-vm.sh
  fi
fi
if [ "${KIPVS_SKIP_CP:-0}" != 1 ]; then
  step "control plane: build or reuse the Kubernetes components and etcd (hack/control-plane.sh build)"
  hack/control-plane.sh build
  step "proxier against the real kube-apiserver $(hack/control-plane.sh version) (hack/test-cluster.sh)"
  hack/test-cluster.sh
  if [ -z "${KIPVS_K8S_BIN:-}" ]; then
    step "KIPVS_K8S_BIN: the same suite against the Debian binaries copied into a directory"
    hack/test-k8s-bin.sh
  fi
  step "operator against the real kube-apiserver (hack/test-operator.sh)"
  hack/test-operator.sh
  if [ "${KIPVS_SKIP_VM:-0}" != 1 ] && [ "${KIPVS_E2E:-1}" != 0 ]; then
    step "end to end: the proxier in the VM against the real kube-apiserver (hack/test-e2e.sh; KIPVS_E2E=0 skips it)"
    hack/test-e2e.sh
  else
    step "end to end (hack/test-e2e.sh) not run (KIPVS_E2E=0 or KIPVS_SKIP_VM=1)"
  fi
  if [ "${KIPVS_SKIP_VM:-0}" != 1 ] && [ "${KIPVS_PARITY:-1}" != 0 ]; then
    step "parity with kube-proxy's IPVS mode in the VM, fast subset (hack/parity-kube-proxy.sh --fast; KIPVS_PARITY=0 skips it)"
    hack/parity-kube-proxy.sh --fast
  fi
  if [ "${KIPVS_SKIP_VM:-0}" != 1 ] && [ "${KIPVS_NODE:-1}" != 0 ]; then
    step "a real node in the VM, kipvs installed from config/, smoke part (hack/test-node.sh --smoke; KIPVS_NODE=0 skips it)"
    hack/test-node.sh --smoke
  fi
  if [ "${KIPVS_SKIP_VM:-0}" != 1 ] && [ "${KIPVS_TAKEOVER:-1}" != 0 ]; then
    step "takeover of a node from kube-proxy's IPVS mode under load, kube-proxy --cleanup as control (hack/test-takeover.sh; KIPVS_TAKEOVER=0 skips it)"
    hack/test-takeover.sh
  fi
fi
echo "all tests passed in $(( $(date +%s) - t0 ))s"
