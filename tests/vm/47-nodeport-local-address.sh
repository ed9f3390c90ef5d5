#!/bin/sh
# NodePorts on every local address (issue 33 item 6). With nodePortAddresses unset, kube-proxy IPVS serves
# NodePorts on every local address but kube-ipvs0's (second NICs, keepalived or kube-vip VIPs); so does kipvs
# without --node-ip. A second address on the client's interface (a keepalived VIP, 192.168.100.10), added while
# the proxier runs:
#  1. control: before, no virtual server on it (the address is what brings the NodePort);
#  2. it gets web's NodePort 30080 within 20 s (the proxier follows the node's addresses through rtnetlink
#     notifications while it programs; at its full syncs only, every 30 s, it would not), the table equals the
#     plan with it, and it
#     answers the client;
#  3. removed, the NodePort goes with it, as fast.
. /payload/tests/lib.sh
VIP=192.168.100.10
proxier_ensure
check "converged before" wait_converged 30
has_vs() { ipvsadm -Sn | grep -q -- "^-A -t $VIP:30080 "; }
no_vs() { ! has_vs; }
check "control: no NodePort on $VIP while it is not a local address" no_vs
ip addr add $VIP/32 dev vclient
t0=$(now)
check "web's NodePort appears on the new address within 20 s" wait_for 20 "web's NodePort on $VIP" has_vs
say "NodePort on $VIP after $(awk "BEGIN{print $(now) - $t0}") s"
check "ipvsadm -Sn equals the plan with $VIP" wait_converged 30
a=$(many 6 http_get $VIP 30080)
say "answers from $VIP:30080: $(echo "$a" | tr '\n' ' ')"
check "the client is served on $VIP:30080 (6 of 6 by web-*)" [ "$(echo "$a" | grep -c '^web-')" = 6 ]
ip addr del $VIP/32 dev vclient
check "the NodePort goes with the address within 20 s" wait_for 20 "no NodePort on $VIP" no_vs
check "ipvsadm -Sn equals the plan again" wait_converged 30
finish
