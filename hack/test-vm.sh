#!/bin/bash
# The real-kernel VM suite: build the proxier and the ipvs-rs kernel test (debug, host target), fetch
# Debian's kernel + QEMU + userland through apt into the cache, pack them with tests/vm and the example
# cluster into an initrd, and boot once (QEMU software emulation) to run every guest test.
# Prints each guest test's result and the wall times; exits non-zero on any FAIL or missing result.
#
# usage: hack/test-vm.sh [--demo|--bench|--e2e]   (--demo: what hack/demo.sh shows; --bench: hack/bench-vm.sh;
#        --e2e: the guest half of hack/test-e2e.sh, which sets KIPVS_E2E_KUBECONFIG, KIPVS_TRAFFIC and VMNET)
# env:   VMCACHE (~/.cache/kipvs-vm), VMTIMEOUT (s, 600), CARGO_TARGET_DIR; output in $target/vm/
#        KIPVS_PROXIER, KIPVS_KERNEL_TEST: use these executables instead of building them
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VM=$ROOT/hack/vm
MODE=test
case "${1:-}" in --demo) MODE=demo ;; --bench) MODE=bench ;; --e2e) MODE=e2e ;; esac
export VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
T0=$(date +%s%N)

# --- build: the executables of the workspace's test build ---
. "$ROOT/hack/lib/executables.sh"
cd "$ROOT"
t=$(date +%s%N)
PROXIER=${KIPVS_PROXIER:-$(executable kipvs-proxier)}
[ -x "$PROXIER" ] || { echo "test-vm: no kipvs-proxier binary" >&2; exit 1; }
KTEST=""
if [ "$MODE" = test ] && [ -n "${KIPVS_KERNEL_TEST:-}" ]; then
  KTEST=$KIPVS_KERNEL_TEST
elif [ "$MODE" = test ] && [ -f ipvs-rs/tests/kernel.rs ]; then
  KTEST=$(executable kernel)
  [ -x "$KTEST" ] || { echo "test-vm: no ipvs-rs kernel test binary" >&2; exit 1; }
fi
T_BUILD=$(ms "$t")

# --- fetch (no-op when cached) and the base initramfs (cached by its inputs) ---
t=$(date +%s%N)
"$VM/fetch.sh"
T_FETCH=$(ms "$t"); t=$(date +%s%N)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/vm; mkdir -p "$OUT" "$VMCACHE/initramfs"
key=$(cat "$VM/build-initramfs.sh" "$VM/init" "$VM/moddeps.py" "$VMCACHE/stamp" "$(command -v ip)" "$(command -v nft)" | sha256sum | cut -c1-16)
BASE=$VMCACHE/initramfs/base-$key.cpio.gz
if [ ! -f "$BASE" ]; then
  rm -f "$VMCACHE"/initramfs/base-*.cpio.gz
  "$VM/build-initramfs.sh" "$BASE.tmp" && mv "$BASE.tmp" "$BASE"
fi

# --- payload: /payload/{run.sh,bin/,tests/,manifests/} appended to the initrd ---
P=$(mktemp -d); trap 'rm -rf "$P"' EXIT
mkdir -p "$P/bin" "$P/tests" "$P/manifests"
printf '#!/bin/sh\nexec sh /payload/tests/run.sh %s\n' "$MODE" > "$P/run.sh"
cp "$PROXIER" "$P/bin/kipvs-proxier"
[ -z "$KTEST" ] || cp "$KTEST" "$P/bin/ipvs-rs-kernel"
cp -r "$ROOT"/tests/vm/. "$P/tests/"; cp -r "$ROOT/tests/manifests/cluster" "$P/manifests/"
if [ "$MODE" = e2e ]; then
  cp "${KIPVS_TRAFFIC:?}" "$P/bin/e2e_traffic"; cp "${KIPVS_E2E_KUBECONFIG:?}" "$P/tests/e2e/kubeconfig"
fi
if [ "$MODE" = bench ]; then
  mkdir -p "$P/manifests/bench"
  python3 "$ROOT/hack/gen-manifests.py" "${BENCH_SERVICES:-10000}" "${BENCH_ENDPOINTS:-2}" "$P/manifests/bench/cluster.json"
fi
"$VM/build-payload.sh" "$P" "$OUT/payload.cpio.gz"
cat "$BASE" "$OUT/payload.cpio.gz" > "$OUT/initrd.gz"
T_IMAGE=$(ms "$t")
echo "test-vm: initrd $(du -h "$OUT/initrd.gz" | cut -f1) (base $(du -h "$BASE" | cut -f1), payload $(du -h "$OUT/payload.cpio.gz" | cut -f1))"

# --- one boot runs everything ---
t=$(date +%s%N)
set +e
VMLOG=$OUT/console.log VMTIMEOUT=${VMTIMEOUT:-600} "$VM/run-vm.sh" "$OUT/initrd.gz"
rc=$?
set -e
T_VM=$(ms "$t")

# --- results: one PASS/FAIL/SKIP line per guest test; a test that printed none is MISSING ---
echo
echo "=== VM suite ($MODE): console log $OUT/console.log"
fail=0
[ "$rc" -eq 0 ] || { echo "  guest exit status $rc"; fail=1; }
# results with the guest's per-test seconds ("TIME name s")
awk '$1 == "TIME" { t[$2] = $3; next } /^(PASS|FAIL|SKIP) / { n = $2; sub(":$", "", n); r[++k] = $0; name[k] = n }
  END { for (i = 1; i <= k; i++) printf "  %s%s\n", r[i], (name[i] in t) ? "  [" t[name[i]] " s]" : "" }' "$OUT/console.log"
if [ "$MODE" = test ]; then expected="topology"; for f in tests/vm/[0-9][0-9]-*.sh; do
    n=$(basename "$f" .sh); expected="$expected ${n#[0-9][0-9]-}"; done
elif [ "$MODE" = demo ]; then expected="topology demo"; elif [ "$MODE" = e2e ]; then expected="topology e2e"
else expected="bench"; fi
for n in $expected; do
  grep -qE "^(PASS|SKIP) $n\$|^(PASS|SKIP) $n:" "$OUT/console.log" && continue
  grep -qE "^FAIL $n:" "$OUT/console.log" || echo "  MISSING $n (no result line)"
  fail=1
done
echo "=== wall: build $((T_BUILD / 1000)).$((T_BUILD % 1000 / 100)) s, fetch $((T_FETCH / 1000)).$((T_FETCH % 1000 / 100)) s," \
  "initrd $((T_IMAGE / 1000)).$((T_IMAGE % 1000 / 100)) s, VM boot-to-exit $((T_VM / 1000)).$((T_VM % 1000 / 100)) s," \
  "total $(( $(ms "$T0") / 1000 )) s"
[ "$fail" -eq 0 ] && echo "=== OK" || echo "=== FAILED"
exit "$fail"
