#!/bin/sh
# A hostPort on the same port as a ClusterIP (issue 34 item 6; kubernetes#62718). The CNI portmap plugin DNATs
# a hostPort in iptables' nat PREROUTING and OUTPUT for every local destination (CNI-HOSTPORT-DNAT,
# --dst-type LOCAL), and cluster IPs on kube-ipvs0 are local: without kube-proxy's nat ACCEPT for its IPVS
# sets, a hostPort pod on :80 captures ClusterIP:80. Here portmap's rule is emulated by a NAT chain at the
# same priority (dstnat, -100: one list of NAT chains in the kernel, iptables' nat table among them) sending
# local :80 to shop-5c9d7f8b4-kq2vw (10.244.1.7:8080):
#  1. the node IP's port 80 goes to the hostPort pod (the emulation works);
#  2. the web ClusterIP 10.96.0.20:80 still reaches web-*, from the client and from the node itself, because
#     kipvs's pin-prerouting / pin-output chains (priority -110) give ClusterIP connections their own
#     destination first (before: every answer came from the hostPort pod).
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null
printf 'table ip portmap {\n chain pre { type nat hook prerouting priority -100; fib daddr type local tcp dport 80 dnat to 10.244.1.7:8080; }\n chain out { type nat hook output priority -100; fib daddr type local tcp dport 80 dnat to 10.244.1.7:8080; }\n}\n' |
  nft -f - || bad "cannot emulate portmap's DNAT"
node_get() { printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$1" "$2" 2>/dev/null | tail -n1; }
a=$(http_get $NODE_IP 80)
check "the hostPort answers on the node IP's port 80 (got '$a')" [ "$a" = shop-5c9d7f8b4-kq2vw ]
a=$(many 6 http_get 10.96.0.20 80 | distinct)
case $a in web-*) ok "client to ClusterIP 10.96.0.20:80 reaches the Service: $a" ;;
  *) bad "client to ClusterIP 10.96.0.20:80 with a hostPort on :80: got '$a', want web-*" ;; esac
a=$(i=0; while [ $i -lt 4 ]; do node_get 10.96.0.20 80; i=$((i + 1)); done | distinct)
case $a in web-*) ok "the node to ClusterIP 10.96.0.20:80 reaches the Service: $a" ;;
  *) bad "the node to ClusterIP 10.96.0.20:80 with a hostPort on :80: got '$a', want web-*" ;; esac
nft delete table ip portmap
finish
