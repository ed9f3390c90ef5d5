#!/bin/sh
# IPv6 with traffic (issue 34 item 7), from real IPv6 clients through the example cluster's dual-stack Service
# `dual` (tests/manifests/cluster/dual.yaml: IPv6 first, both ClusterIPs, NodePort 30050 on both node IPs, a
# load-balancer IP of each family, loadBalancerSourceRanges of each family; IPv4 backends web-0 web-1, IPv6
# backends web-0 web-2; the pods and the clients have both families, tests/vm/topology.sh):
#   - its IPv6 service IPs are bound on kube-ipvs0 (a DOWN dummy) as planned;
#   - ClusterIP, NodePort and load-balancer IP answer over IPv6 from the IPv6 backends, and the IPv4 ClusterIP
#     and NodePort of the same Service from the IPv4 ones;
#   - loadBalancerSourceRanges: the client inside fd00:192:168:100::2/128 is served on the IPv6 load-balancer
#     IP, client6 (fd00:192:168:101::2) is dropped there and served on the ClusterIP (not filtered);
#   - masquerade: through the NodePort and the load-balancer IP (externalTrafficPolicy Cluster) the backend
#     sees the node (fd00:10:244::1, its address towards the pods); through the ClusterIP (no clusterCIDR) it
#     sees the client's own address;
#   - hairpin: web-0 reaches itself through the IPv6 ClusterIP;
#   - controls: with the proxier stopped, each IPv6 set element the checks rely on is deleted by hand and the
#     same probe then fails (masquerade: external-v6, hairpin: hairpin-v6, source ranges: firewall-v6), so the
#     checks above cannot pass without them; the elements are put back and the proxier started again.
. /payload/tests/lib.sh
. /payload/tests/topology.sh # NODE_IP6, CLIENT_IP6
proxier_ensure; wait_converged 30 >/dev/null || bad "not converged"
CIP6=fd00:10:96::50 LB6=2001:db8:113::50 NODE_PEER6=fd00:10:244::1
get() { # NETNS IP PORT: the answering pod's name
  printf 'GET / HTTP/1.0\r\n\r\n' | nsenter --net="/run/netns/$1" nc -w 3 "$2" "$3" 2>/dev/null | tail -n1
}
peer() { # NETNS IP PORT: the client address the backend saw (httpd's REMOTE_ADDR, brackets dropped)
  printf 'GET /cgi-bin/peer HTTP/1.0\r\n\r\n' | nsenter --net="/run/netns/$1" nc -w 3 "$2" "$3" 2>/dev/null |
    tail -n1 | sed 's/^\[//; s/\]$//; s/^::ffff://'
}
answers() { # NETNS IP PORT N: N answers, one per line ("-" for none)
  i=0; while [ $i -lt "$4" ]; do a=$(get "$1" "$2" "$3"); echo "${a:--}"; i=$((i + 1)); done
}
expect() { # DESCRIPTION EXPECTED_DISTINCT NETNS IP PORT N
  a=$(answers "$3" "$4" "$5" "$6")
  if [ "$(echo "$a" | distinct)" = "$2" ]; then ok "$1: $(echo "$a" | tr '\n' ' ')"
  else bad "$1: want answers from {$2}, got: $(echo "$a" | tr '\n' ' ')"; fi
}

# client6: an IPv6 client outside the source ranges
printf 'netns add client6\nlink add vclient6 type veth peer name eth0 netns client6\naddr add fd00:192:168:101::1/64 dev vclient6 nodad\nlink set vclient6 up\n' |
  /sbin/ip -batch -
printf 'link set lo up\naddr add fd00:192:168:101::2/64 dev eth0 nodad\nlink set eth0 up\nroute add default via fd00:192:168:101::1\n' |
  /sbin/ip -n client6 -batch -

want=$(plan --format json | tr -d ' \n\t' | sed -nE 's/.*"(bind_addresses|bindAddresses)":\[([^]]*)\].*/\2/p' |
  tr ',' '\n' | tr -d '"' | grep : | sort | tr '\n' ' ')
have=$(ip -o -6 addr show dev kube-ipvs0 | awk '{print $4}' | sed 's#/.*##' | sort | tr '\n' ' ')
check "kube-ipvs0 holds the planned IPv6 service IPs ($have)" [ "${want:-none}" = "$have" ]
say "$(ip -o -6 addr show dev kube-ipvs0 | awk '{$1 = ""; print}' | head -n 4)"

v6="web-0 web-2" v4="web-0 web-1"
expect "IPv6 ClusterIP [$CIP6]:80" "$v6" client $CIP6 80 4
expect "IPv6 NodePort [$NODE_IP6]:30050" "$v6" client $NODE_IP6 30050 4
expect "IPv6 load-balancer IP [$LB6]:80 from the client inside its source range" "$v6" client $LB6 80 4
expect "dual stack: the IPv4 ClusterIP 10.96.0.50:80 of the same Service, from the IPv4 backends" "$v4" client 10.96.0.50 80 4
expect "dual stack: its IPv4 NodePort $NODE_IP:30050" "$v4" client $NODE_IP 30050 4

a=$(get client6 $LB6 80)
check "source ranges: client6 (fd00:192:168:101::2, outside them) is dropped on [$LB6]:80 (got '$a')" [ -z "$a" ]
a=$(get client6 $CIP6 80)
check "source ranges: client6 is served on the same Service's IPv6 ClusterIP, not filtered (got '$a')" [ -n "$a" ]

a=$(peer client $NODE_IP6 30050)
check "masquerade: through the IPv6 NodePort the backend sees the node ('$a')" [ "$a" = $NODE_PEER6 ]
a=$(peer client $LB6 80)
check "masquerade: through the IPv6 load-balancer IP the backend sees the node ('$a')" [ "$a" = $NODE_PEER6 ]
a=$(peer client $CIP6 80)
check "no masquerade: through the IPv6 ClusterIP (no clusterCIDR) the backend sees the client ('$a')" [ "$a" = "$CLIENT_IP6" ]

expect "hairpin: web-0 reaches the IPv6 ClusterIP, itself included (rr over web-0 and web-2)" "$v6" web-0 $CIP6 80 2

say "controls: the proxier stopped, each IPv6 element deleted by hand makes its check fail"
proxier_stop
element() { nft "$1" element inet kipvs "$2" "{ $3 }"; } # add|delete SET ELEMENT ("6" is TCP: no /etc/protocols)
EXT="$NODE_IP6 . 6 . 30050" HAIR="fd00:10:244:1::2 . fd00:10:244:1::2" FW="$LB6 . 6 . 80"
element delete external-v6 "$EXT" || bad "cannot delete $EXT from external-v6"
a=$(peer client $NODE_IP6 30050)
check "control: without its external-v6 element the NodePort backend sees the client ('$a'), not the node" [ "$a" = "$CLIENT_IP6" ]
element delete hairpin-v6 "$HAIR" || bad "cannot delete $HAIR from hairpin-v6"
a=$(answers web-0 $CIP6 80 2 | tr '\n' ' ')
check "control: without its hairpin-v6 element web-0 does not reach itself ($a)" sh -c "! echo '$a' | grep -q web-0"
element delete firewall-v6 "$FW" || bad "cannot delete $FW from firewall-v6"
a=$(get client6 $LB6 80)
check "control: without its firewall-v6 element client6 is served on [$LB6]:80 ('$a')" [ -n "$a" ]
element add external-v6 "$EXT"; element add hairpin-v6 "$HAIR"; element add firewall-v6 "$FW"
proxier_start; wait_converged 30 >/dev/null || bad "not converged after the controls"
a=$(get client6 $LB6 80)
check "the elements back: client6 is dropped again (got '$a')" [ -z "$a" ]

/sbin/ip netns del client6; /sbin/ip link del vclient6 2>/dev/null
finish
