#!/bin/sh
# The start-up check of the kernel (issue 34 item 8, proxier/src/dataplane/kernel/preflight.rs): a kernel that lacks a
# facility kipvs needs (here: nft_masq unloaded, as on a kernel built without it) gets one error naming it before
# anything is programmed; with the module back the check passes and the proxier programs.
. /payload/tests/lib.sh
proxier_stop
nft delete table inet kipvs 2>/dev/null
ip link del kube-ipvs0 2>/dev/null
rmmod nft_masq 2>/dev/null || skip "nft_masq cannot be unloaded here (built in or in use)"
NO_COLOR=1 timeout 30 "$KIPVS" run --once --node "$NODE" --manifests "$M" > "$W/kernel-check.log" 2>&1
rc=$?
insmod /lib/modules/nft_masq.ko || bad "nft_masq could not be loaded again"
say "without nft_masq: exit $rc; $(grep -c . "$W/kernel-check.log") log lines"
grep -i -e error -e lacks "$W/kernel-check.log" | head -n 3 | indent
refused() { [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 143 ]; }
check "the proxier refuses to start (exit $rc, not 0 or a timeout)" refused
check "  ... with one error naming the nftables facility" \
  [ "$(grep -c 'lacks what kipvs needs.*nftables inet NAT' "$W/kernel-check.log")" -eq 1 ]
check "  ... and nothing programmed (no kube-ipvs0, no table inet kipvs)" \
  sh -c '! ip link show kube-ipvs0 >/dev/null 2>&1 && ! nft list table inet kipvs >/dev/null 2>&1'
proxier_start
log=$(proxier_log)
check "with nft_masq back, the check passes" \
  wait_for 20 "the kernel check" grep -q 'the kernel has what kipvs needs' "$log"
check "  ... and the proxier programs the plan" wait_converged 30
finish
