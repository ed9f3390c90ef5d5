#!/bin/bash
# Boot Debian's kernel under QEMU with an initrd and return the guest script's exit code.
# Software emulation (TCG): KVM on these hosts is PVM-nested and hangs stock kernels. smp 1 and
# 1024 MB measured fastest on 2 host cores. No NIC (nothing can leave the VM) unless VMNET gives one.
#
# usage: hack/vm/run-vm.sh INITRD [extra qemu args...]
# env:   VMCACHE, VMTIMEOUT (s, default 300), VMSMP (1), VMMEM (1024), VMAPPEND (extra kernel args),
#        VMLOG (also keep the console log in this file), VMNET (options of a QEMU `-netdev user` for one
#        virtio NIC, e.g. the end to end's "net=10.0.2.0/24,hostfwd=...", hack/test-e2e.sh; default: no NIC)
# exit:  the guest's /payload/run.sh exit code; 124 on timeout; 125 if the guest printed no exit marker.
set -uo pipefail
VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
# shellcheck source=/dev/null
. "$VMCACHE/env.sh" # QEMU_DIR KERNEL
INITRD=$1; shift
LOG=${VMLOG:-$(mktemp)}
start=$(date +%s%N)
NIC=(-nic none)
# romfile= : no PXE option ROM (not in the cache; the kernel boots directly)
[ -z "${VMNET:-}" ] || NIC=(-netdev "user,id=net0,$VMNET" -device virtio-net-pci,netdev=net0,romfile=)
# qemu's own libraries and its TCG accelerator module live in the unpacked (not installed) packages
LD_LIBRARY_PATH=$QEMU_DIR/usr/lib/x86_64-linux-gnu:$QEMU_DIR/lib/x86_64-linux-gnu \
QEMU_MODULE_DIR=$QEMU_DIR/usr/lib/x86_64-linux-gnu/qemu \
timeout -k 5 "${VMTIMEOUT:-300}" "$QEMU_DIR/usr/bin/qemu-system-x86_64" \
  -L "$QEMU_DIR/usr/share/qemu" -L "$QEMU_DIR/usr/share/seabios" \
  -accel tcg,thread=multi -cpu max -m "${VMMEM:-1024}" -smp "${VMSMP:-1}" \
  -nographic -no-reboot "${NIC[@]}" -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off ${VMAPPEND:-}" "$@" </dev/null 2>&1 |
  tr -d '\r' | sed -u -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc//g' | tee "$LOG"
qrc=${PIPESTATUS[0]}
echo "run-vm: qemu rc=$qrc wall=$(( ($(date +%s%N) - start) / 1000000 )) ms"
rc=$(sed -n 's/^VMTEST-EXIT=\([0-9]*\).*/\1/p' "$LOG" | tail -n1)
[ -n "${VMLOG:-}" ] || rm -f "$LOG"
if [ "$qrc" = 124 ]; then echo "run-vm: timed out after ${VMTIMEOUT:-300} s"; exit 124; fi
[ -n "$rc" ] || { echo "run-vm: no VMTEST-EXIT marker (qemu rc=$qrc)"; exit 125; }
exit "$rc"
