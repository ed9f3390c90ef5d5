#!/usr/bin/env bash
# The project's test command (README "Tests"; .ci/run calls it).
# Layers, fastest first: formatting and lints, unit tests + golden vectors + plan vectors,
# then the real-kernel VM suite (hack/test-vm.sh). Set KIPVS_SKIP_VM=1 to stop before the VM.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0
step() { printf '\n==> %s\n' "$*"; }
t0=$(date +%s)
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --workspace --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
step "cargo test --workspace (unit tests, golden vectors, plan vectors, property tests)"
cargo test --workspace --quiet
if [ "${KIPVS_SKIP_VM:-0}" != 1 ]; then
  step "real-kernel VM suite (hack/test-vm.sh)"
  hack/test-vm.sh
fi
echo "all tests passed in $(( $(date +%s) - t0 ))s"
