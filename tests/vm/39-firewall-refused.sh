#!/bin/sh
# A set element the kernel refuses fails its own Service only, and closed (issue 23). The refusal is made
# real by putting an element that clashes with the firewall-allow interval of Service "refused" into
# kipvs's set by hand. This kernel (6.1) leaves out an interval nested in another when it is added without
# NLM_F_EXCL, silently (shown first, on a table of the test's own); kipvs creates firewall-allow elements
# with NLM_F_EXCL, so the kernel refuses its element and kipvs sees it.
#   1. "refused" and an unrelated "bystander" come in one sync while a wider interval of the same address
#      and port is in kipvs's set: bystander is served (its own source range holds), refused's
#      load-balancer virtual server is not added nor its address bound, so no source reaches it; its
#      ClusterIP (not filtered) is served; the refusal is logged with the Service's name and counted in
#      kipvs_sync_errors_total{cause="AddSetElement"};
#   2. the clash removed, the retry adds the virtual server behind its firewall: the client inside the range
#      is served, client2 outside it is dropped; a restart finds its elements in place and adds none again;
#   3. an existing open Service that gains a source range the kernel refuses stays filtered: its firewall
#      element lands, so client2 and the client of the refused range are dropped while its ClusterIP is served.
# The proxier runs with a 5-minute syncPeriod here: a full sync would delete the hand-made element of
# step 1, which has kipvs's form (step 3's, on a range of addresses, is neither read as kipvs's nor deleted).
. /payload/tests/lib.sh
LB=203.0.113.62 BY=203.0.113.60
# ("6" is TCP: this VM has no /etc/protocols)
nft add table inet probe
nft add set inet probe a '{ type ipv4_addr . inet_proto . inet_service . ipv4_addr; flags interval; }'
nft add element inet probe a "{ $LB . 6 . 80 . 192.168.0.0/16 }"
nft add element inet probe a "{ $LB . 6 . 80 . 192.168.100.0/24 }" 2>/dev/null; rc=$?
n=$(nft list set inet probe a | grep -c '192\.168\.100\.0/24')
say "this kernel ($(uname -r)): a nested interval added without NLM_F_EXCL: exit status $rc, $n element(s) added"
check "a nested interval created with NLM_F_EXCL is refused" sh -c "! nft create element inet probe a '{ $LB . 6 . 80 . 192.168.100.0/24 }' 2>/dev/null"
nft delete table inet probe

proxier_stop
printf 'apiVersion: kipvs.io/v1alpha1\nkind: ProxierConfiguration\nipvs: {syncPeriod: 5m}\n' > "$W/refused-config.yaml"
KIPVS_CONFIG=$W/refused-config.yaml proxier_start; wait_converged 30 >/dev/null
# The table survives the restart, so it equals the plan at once: the hand-made element goes in only after
# the new proxier's first full sync, which would delete it.
first_full() { grep -m1 'sync complete kind="full"' "$(proxier_log)"; }
wait_for 30 "the proxier's first full sync" first_full >/dev/null 2>&1 || bad "no full sync within 30 s"
FOREIGN="$LB . 6 . 80 . 192.168.0.0/16" # step 1: wider than refused's range, in kipvs's form
foreign() { nft "$1" element inet kipvs firewall-allow "{ $FOREIGN }"; } # add|delete
[ -e /run/netns/client2 ] || {
  printf 'netns add client2\nlink add vclient2 type veth peer name eth0 netns client2\naddr add 192.168.101.1/24 dev vclient2\nlink set vclient2 up\n' |
    /sbin/ip -batch -
  printf 'link set lo up\naddr add 192.168.101.2/24 dev eth0\nlink set eth0 up\nroute add default via 192.168.101.1\n' |
    /sbin/ip -n client2 -batch -
}
/sbin/ip addr replace 192.168.101.1/24 dev vclient2 # 35 leaves client2 without the host's address
get() { printf 'GET / HTTP/1.0\r\n\r\n' | nsenter --net=/run/netns/$1 nc -w 3 "$2" "$3" 2>/dev/null | tail -n1; } # NETNS IP PORT
has_vs() { ipvsadm -Sn | grep -q -- "-A -t $1 "; }
no_vs() { ! has_vs "$1"; }
unbound() { ! kernel_bind | grep -qx "$1"; }
errors() { v=$(metric 'kipvs_sync_errors_total{cause="AddSetElement"}'); echo "${v:-0}"; }

foreign add || bad "cannot put the clashing element into kipvs's set"
e0=$(errors); start=$(mark)
cp /payload/tests/nft/refused.yaml "$W/refused.tmp" && mv "$W/refused.tmp" "$M/refused.yaml"
served() { [ "$(get "$1" "$2" "$3")" = "$4" ]; } # NETNS IP PORT POD
wait_for 40 "bystander served" served client $BY 80 web-1 2>/dev/null
check "1. bystander (same sync) serves the client inside its range" served client $BY 80 web-1
a=$(get client2 $BY 80)
check "   bystander drops client2, outside its range (got '$a')" [ -z "$a" ]
check "   refused's load-balancer virtual server $LB:80 is not added" no_vs "$LB:80"
check "   its address is not bound on kube-ipvs0" unbound $LB
a=$(get client $LB 80); b=$(get client2 $LB 80)
check "   no source reaches $LB:80 (client got '$a', client2 '$b')" [ -z "$a$b" ]
check "   refused's ClusterIP (not filtered) is served" served client 10.96.0.46 80 web-0
log() { tail -n +"$((start + 1))" "$(proxier_log)"; }
line=$(log | grep 'failed op=AddSetElement' | grep 'default/refused' | grep -m1 "$LB")
[ -n "$line" ] && say "log: $(echo "$line" | cut -c1-300)"
check "   the refusal is logged with the Service's name" [ -n "$line" ]
e1=$(errors)
check "   kipvs_sync_errors_total{cause=\"AddSetElement\"} counts it ($e0 -> $e1)" [ "$e1" -gt "$e0" ]
log | grep -q 'failed op=AddSetElement.*default/bystander' && bad "   bystander's elements were refused too"

say "step 2: the clash removed by hand"
foreign delete || bad "cannot delete the clashing element"
wait_for 70 "the retry to add $LB:80" has_vs "$LB:80" 2>/dev/null
check "2. the retry adds $LB:80" has_vs "$LB:80"
check "   ... behind its firewall: the client inside the range is served" served client $LB 80 web-0
a=$(get client2 $LB 80)
check "   ... and client2 is dropped (got '$a')" [ -z "$a" ]
proxier_stop; KIPVS_CONFIG=$W/refused-config.yaml proxier_start
nothing_to_do() { first_full | grep -q ' ops=0 failed=0 '; }
wait_for 30 "the first full sync after the restart" first_full >/dev/null 2>&1
line=$(first_full); say "${line#*syncer: }"
check "   a restart with the elements in the kernel adds none again (its first full sync: ops=0 failed=0)" nothing_to_do

say "step 3: refused loses its range (open), then gets it back while the kernel refuses its element"
sed '/# refused$/d' /payload/tests/nft/refused.yaml > "$W/refused.tmp" && mv "$W/refused.tmp" "$M/refused.yaml"
wait_for 30 "client2 served on $LB (no range)" served client2 $LB 80 web-0 2>/dev/null
check "3. without a range client2 is served on $LB" served client2 $LB 80 web-0
FOREIGN="$LB/31 . 6 . 80 . 192.168.100.128/25" # step 3: on 203.0.113.62-63, outside the clients
foreign add || bad "cannot put the clashing element into kipvs's set"
e2=$(errors)
cp /payload/tests/nft/refused.yaml "$W/refused.tmp" && mv "$W/refused.tmp" "$M/refused.yaml"
firewalled() { nft list set inet kipvs firewall | grep -qE "$LB \. (tcp|6) \. 80"; }
wait_for 30 "the firewall element of $LB" firewalled 2>/dev/null
check "   the range comes back: its firewall element lands" firewalled
errors_grew() { [ "$(errors)" -gt "$e2" ]; }
wait_for 10 "the refusal counted" errors_grew 2>/dev/null
check "   its firewall-allow element is refused (errors $e2 -> $(errors))" errors_grew
a=$(get client2 $LB 80); b=$(get client $LB 80)
check "   client2 is dropped (got '$a')" [ -z "$a" ]
check "   the client of the refused range is dropped too (got '$b')" [ -z "$b" ]
check "   the virtual server stays (filtered, not removed)" has_vs "$LB:80"
check "   its ClusterIP is served" served client2 10.96.0.46 80 web-0

foreign delete
rm -f "$M/refused.yaml"
wait_converged 30 >/dev/null || bad "not converged after removing the test Services"
left=$(nft list table inet kipvs | grep -cE '203\.0\.113\.6[0-3]|10\.96\.0\.4[67]')
check "their set elements are gone ($left left)" [ "$left" = 0 ]
proxier_stop && proxier_start
/sbin/ip addr flush dev vclient2 # as 35 does: no extra local address for the later tests
finish
