#!/bin/sh
# `kipvs-proxier cleanup` (issue 3): removes every virtual server kipvs owns, the addresses on
# kube-ipvs0 and the link itself, and leaves a virtual server of another owner alone (no flush).
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null || bad "not converged before cleanup"
proxier_stop
ipvsadm -A -t 198.51.100.7:8443 -s wrr && ipvsadm -a -t 198.51.100.7:8443 -r 10.244.1.2:8080 -m -w 3
"$KIPVS" cleanup > "$W/cleanup.log" 2>&1 || bad "cleanup exited with $?: $(tail -n 3 "$W/cleanup.log")"
left=$(ipvsadm -Sn)
want='-A -t 198.51.100.7:8443 -s wrr
-a -t 198.51.100.7:8443 -r 10.244.1.2:8080 -m -w 3'
if [ "$left" = "$want" ]; then ok "only the foreign virtual server is left"
else bad "after cleanup, want only the foreign virtual server, got: $(echo "$left" | tr '\n' ';')"; fi
check "kube-ipvs0 is gone" sh -c "! ip link show kube-ipvs0 >/dev/null 2>&1"
check "the nftables table inet kipvs is gone" sh -c "! nft list table inet kipvs >/dev/null 2>&1"
ipvsadm -D -t 198.51.100.7:8443
finish
