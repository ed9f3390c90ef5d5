#!/bin/bash
# The real-kernel VM suite: build the proxier image (hack/build-images.sh: static release kipvs-proxier +
# Debian's nft, an OCI layout) and the ipvs-rs kernel test (debug, host target), fetch Debian's kernel +
# QEMU + userland through apt into the cache, pack them with the image's root filesystem, tests/vm and the
# example cluster into an initrd, and boot once (QEMU software emulation) to run every guest test with the
# proxier and nft of the image.
# Prints each guest test's result and the wall times; exits non-zero on any FAIL or missing result.
#
# usage: hack/test-vm.sh [--demo|--bench|--e2e|--kube-proxy]   (--demo: what hack/demo.sh shows; --bench:
#        hack/bench-vm.sh; --e2e: the guest half of hack/test-e2e.sh, which sets KIPVS_E2E_KUBECONFIG,
#        KIPVS_TRAFFIC and VMNET; --kube-proxy: the guest half of hack/parity-kube-proxy.sh, which sets
#        VMNET; KIPVS_KUBE_PROXY_DIR (kube-proxy and its userland, hack/lib/kube-proxy-vm.sh; the end to
#        end through kube-proxy too) is copied to the guest's /payload/kube-proxy)
# env:   VMCACHE (~/.cache/kipvs-vm), VMTIMEOUT (s, 600), CARGO_TARGET_DIR; output in $target/vm/
#        KIPVS_PROXIER: run this kipvs-proxier instead of the image's (nft still comes from the image)
#        KIPVS_KERNEL_TEST: use this ipvs-rs kernel test executable instead of building it
#        VM_TESTS: run only the guest tests matching this glob (e.g. '3[56]-*'; default all)
#        KIPVS_VM_KERNEL_SUITE: boot the kernel of this Debian suite (bullseye: 5.10; VMCACHE gets its name)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VM=$ROOT/hack/vm
MODE=test
case "${1:-}" in --demo) MODE=demo ;; --bench) MODE=bench ;; --e2e) MODE=e2e ;; --kube-proxy) MODE=kube-proxy ;; esac
export VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm${KIPVS_VM_KERNEL_SUITE:+-$KIPVS_VM_KERNEL_SUITE}}
. "$ROOT/hack/lib/init.sh" && suite test-vm # now, elapsed, fatal
T0=$(now)

# --- host tools (nft, umoci, ...; hack/lib/host-tools.sh) and the executables of the workspace's test build ---
. "$ROOT/hack/lib/host-tools.sh"
host_tools
. "$ROOT/hack/lib/executables.sh"
cd "$ROOT"
t=$(now)
# the proxier image (static release build + Debian's nft), written as an OCI layout
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
"$ROOT/hack/build-images.sh" proxier
IMAGE=$TARGET/images/kipvs-proxier:$(umoci ls --layout "$TARGET/images/kipvs-proxier" | head -n1)
PROXIER=${KIPVS_PROXIER:-}
[ -z "$PROXIER" ] || [ -x "$PROXIER" ] || fatal "KIPVS_PROXIER=$PROXIER is not executable"
KTEST=""
if [ "$MODE" = test ] && [ -n "${KIPVS_KERNEL_TEST:-}" ]; then
  KTEST=$KIPVS_KERNEL_TEST
elif [ "$MODE" = test ] && [ -f ipvs-rs/tests/kernel.rs ]; then
  KTEST=$(executable kernel)
  [ -x "$KTEST" ] || fatal "no ipvs-rs kernel test binary"
fi
T_BUILD=$(elapsed "$t")

# --- fetch (no-op when cached) and the base initramfs (cached by its inputs) ---
t=$(now)
"$VM/fetch.sh"
T_FETCH=$(elapsed "$t"); t=$(now)
OUT=$TARGET/vm; mkdir -p "$OUT" "$VMCACHE/initramfs"
key=$(cat "$VM/build-initramfs.sh" "$ROOT/hack/lib/modules.sh" "$VM/init" "$VM/moddeps.py" "$VMCACHE/stamp" "$(command -v ip)" |
  sha256sum | cut -c1-16)
BASE=$VMCACHE/initramfs/base-$key.cpio.gz
if [ ! -f "$BASE" ]; then
  rm -f "$VMCACHE"/initramfs/base-*.cpio.gz
  "$VM/build-initramfs.sh" "$BASE.tmp" && mv "$BASE.tmp" "$BASE"
fi

# --- payload: /payload/{run.sh,bin/,tests/,manifests/,image/} appended to the initrd ---
P=$(mktemp -d); trap 'rm -rf "$P"' EXIT
mkdir -p "$P/bin" "$P/tests" "$P/manifests"
printf '#!/bin/sh\nexec sh /payload/tests/run.sh %s\n' "$MODE" > "$P/run.sh"
# The proxier image's root filesystem, unpacked from its OCI layout: the VM runs kipvs-proxier and nft
# from it (chrooted, tests/vm/run.sh mounts /proc, /sys, ... into it), so a library or executable
# missing from the image fails the suite. KIPVS_PROXIER replaces only the proxier binary.
umoci raw unpack --image "$IMAGE" "$P/image"
img_exec() { # NAME PATH: /payload/bin/NAME runs PATH of the image, chrooted, with the image's PATH (nft)
  printf '#!/bin/sh\n# %s from the proxier image\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin exec /bin/chroot /payload/image %s "$@"\n' \
    "$1" "$2" > "$P/bin/$1"
  chmod +x "$P/bin/$1"
}
img_exec nft /usr/sbin/nft
if [ -n "${KIPVS_PROXIER:-}" ]; then cp "$PROXIER" "$P/bin/kipvs-proxier"
else img_exec kipvs-proxier /usr/local/bin/kipvs-proxier; fi
[ -z "$KTEST" ] || cp "$KTEST" "$P/bin/ipvs-rs-kernel"
cp -r "$ROOT"/tests/vm/. "$P/tests/"
cp "$ROOT/hack/lib/init.sh" "$P/tests/init.sh" # the vocabulary, sourced by tests/vm/lib.sh
for f in "$P"/tests/[0-9][0-9]-*.sh; do case $(basename "$f") in ${VM_TESTS:-*}) ;; *) rm "$f" ;; esac; done
cp -r "$ROOT/tests/manifests/cluster" "$P/manifests/"
if [ "$MODE" = e2e ]; then
  cp "${KIPVS_TRAFFIC:?}" "$P/bin/e2e_traffic"; cp "${KIPVS_E2E_KUBECONFIG:?}" "$P/tests/e2e/kubeconfig"
fi
[ -z "${KIPVS_KUBE_PROXY_DIR:-}" ] || cp -r "$KIPVS_KUBE_PROXY_DIR" "$P/kube-proxy"
if [ "$MODE" = bench ]; then
  mkdir -p "$P/manifests/bench"
  python3 "$ROOT/hack/gen-manifests.py" "${BENCH_SERVICES:-10000}" "${BENCH_ENDPOINTS:-2}" "$P/manifests/bench/cluster.json"
fi
"$VM/build-payload.sh" "$P" "$OUT/payload.cpio.gz"
cat "$BASE" "$OUT/payload.cpio.gz" > "$OUT/initrd.gz"
T_IMAGE=$(elapsed "$t")
echo "test-vm: initrd $(du -h "$OUT/initrd.gz" | cut -f1) (base $(du -h "$BASE" | cut -f1), payload $(du -h "$OUT/payload.cpio.gz" | cut -f1))"

# --- one boot runs everything ---
t=$(now)
set +e
VMLOG=$OUT/console.log VMTIMEOUT=${VMTIMEOUT:-600} "$VM/run-vm.sh" "$OUT/initrd.gz"
rc=$?
set -e
T_VM=$(elapsed "$t")

# --- results: one PASS/FAIL/SKIP line per guest test; a test that printed none is MISSING ---
echo
echo "=== VM suite ($MODE): console log $OUT/console.log"
fail=0
[ "$rc" -eq 0 ] || { echo "  guest exit status $rc"; fail=1; }
# results with the guest's per-test seconds ("TIME name s")
awk '$1 == "TIME" { t[$2] = $3; next } /^(PASS|FAIL|SKIP) / { n = $2; sub(":$", "", n); r[++k] = $0; name[k] = n }
  END { for (i = 1; i <= k; i++) printf "  %s%s\n", r[i], (name[i] in t) ? "  [" t[name[i]] " s]" : "" }' "$OUT/console.log"
if [ "$MODE" = test ]; then expected="topology"; for f in tests/vm/[0-9][0-9]-*.sh; do
    case $(basename "$f") in ${VM_TESTS:-*}) ;; *) continue ;; esac; n=$(basename "$f" .sh); expected="$expected ${n#[0-9][0-9]-}"; done
elif [ "$MODE" = demo ]; then expected="topology demo"; elif [ "$MODE" = e2e ]; then expected="topology e2e"
elif [ "$MODE" = kube-proxy ]; then expected="kube-proxy"
else expected="bench"; fi
for n in $expected; do
  grep -qE "^(PASS|SKIP) $n\$|^(PASS|SKIP) $n:" "$OUT/console.log" && continue
  grep -qE "^FAIL $n:" "$OUT/console.log" || echo "  MISSING $n (no result line)"
  fail=1
done
echo "=== wall: build $T_BUILD s, fetch $T_FETCH s, initrd $T_IMAGE s, VM boot-to-exit $T_VM s, total $(elapsed "$T0" | cut -d. -f1) s"
[ "$fail" -eq 0 ] && echo "=== OK" || echo "=== FAILED"
exit "$fail"
