#!/bin/sh
# (n) The nftables table that completes IPVS (issue 7), with real traffic:
#   - NodePort, externalTrafficPolicy Cluster, to a backend "on another node" (far-0 has no route back
#     to outside clients): the reply comes back because the node masqueraded; far-0 sees the node;
#   - NodePort, externalTrafficPolicy Local: the backend (near-0) sees the client's own address;
#   - hairpin: near-0 reaches itself through its ClusterIP;
#   - a host port (2222 on every address of the node) is not reachable on a ClusterIP, but still on the
#     node IP; the service port on the same ClusterIP is;
#   - loadBalancerSourceRanges [192.168.100.2/32]: the client is served, client2 (192.168.101.2) and
#     the node itself are not; a firewalled load-balancer IP whose port equals a healthCheckNodePort
#     stays closed to client2 while the health check on the node IP answers it;
#   - the table's rule count does not change when Services are added;
#   - on-premises source ranges (nested, holding the node IP and the load-balancer IP) are merged and
#     hold: outside sources are dropped. (An element the kernel refuses: 39-firewall-refused.sh.)
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null
rules() { nft list table inet kipvs 2>/dev/null | grep -c 'comment "'; }
peer() { # NETNS_CMD IP PORT: the backend's view of the client address (httpd says [::ffff:a.b.c.d])
  printf 'GET /cgi-bin/peer HTTP/1.0\r\n\r\n' | $1 nc -w 3 "$2" "$3" 2>/dev/null | tail -n1 |
    sed 's/^\[::ffff://; s/\]$//'
}
r0=$(rules); say "kipvs table: $r0 rules"
[ "$r0" -gt 0 ] && ok "the table inet kipvs holds its rules" || bad "no kipvs table/rules"

# far-0 ("another node") and near-0 (this node), both answering with the peer address they see
{
  echo "netns add far-0"; echo "link add vfar type veth peer name eth0 netns far-0"
  echo "addr add 10.244.0.1/32 dev vfar"; echo "link set vfar up"; echo "route add 10.244.9.9/32 dev vfar"
  echo "netns add near-0"; echo "link add vnear type veth peer name eth0 netns near-0"
  echo "addr add 10.244.0.1/32 dev vnear"; echo "link set vnear up"; echo "route add 10.244.1.9/32 dev vnear"
  echo "netns add client2"; echo "link add vclient2 type veth peer name eth0 netns client2"
  echo "addr add 192.168.101.1/24 dev vclient2"; echo "link set vclient2 up"
} > "$W/nft.topo"
/sbin/ip -batch "$W/nft.topo"
# far-0 only knows the pod network: without masquerade its replies to outside clients go nowhere
printf 'link set lo up\naddr add 10.244.9.9/32 dev eth0\nlink set eth0 up\nroute add 10.244.0.1 dev eth0\nroute add 10.244.0.0/16 via 10.244.0.1 dev eth0\n' |
  /sbin/ip -n far-0 -batch -
printf 'link set lo up\naddr add 10.244.1.9/32 dev eth0\nlink set eth0 up\nroute add 10.244.0.1 dev eth0\nroute add default via 10.244.0.1 dev eth0\n' |
  /sbin/ip -n near-0 -batch -
printf 'link set lo up\naddr add 192.168.101.2/24 dev eth0\nlink set eth0 up\nroute add default via 192.168.101.1\n' |
  /sbin/ip -n client2 -batch -
for n in far-0 near-0; do
  mkdir -p "/tmp/www/$n/cgi-bin"; echo "$n" > "/tmp/www/$n/index.html"
  printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\necho "$REMOTE_ADDR"\n' > "/tmp/www/$n/cgi-bin/peer"
  chmod +x "/tmp/www/$n/cgi-bin/peer"
  nsenter --net=/run/netns/$n httpd -p 8080 -h "/tmp/www/$n"
done
httpd -p 2222 -h /tmp/www/near-0 # a host port on every address of the node
CLIENT="nsenter --net=/run/netns/client"; CLIENT2="nsenter --net=/run/netns/client2"
NEAR="nsenter --net=/run/netns/near-0"

cp /payload/tests/nft/services.yaml "$W/nft.tmp" && mv "$W/nft.tmp" "$M/nft.yaml"
wait_converged 30 || bad "not converged with the nftables test Services"
say "nft list table inet kipvs (sets):"; nft list table inet kipvs | grep -A3 -E '^\s+set ' | grep -E 'set |elements' | indent

a=$(peer "$CLIENT" $NODE_IP 30090)
check "NodePort 30090 (Cluster) to far-0 answers, masqueraded: far-0 sees '$a' (the node)" [ "$a" = 10.244.0.1 ]
a=$(peer "$CLIENT" 10.96.0.40 80)
check "ClusterIP 10.96.0.40 from outside without clusterCIDR is not masqueraded: no answer from far-0 (got '$a')" [ -z "$a" ]
a=$(peer "$CLIENT" $NODE_IP 30091)
check "NodePort 30091 (Local) to near-0: it sees the client's own address ('$a')" [ "$a" = 192.168.100.2 ]
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | $NEAR nc -w 3 10.96.0.41 80 2>/dev/null | tail -n1)
check "hairpin: near-0 reaches itself through its ClusterIP 10.96.0.41 (got '$a')" [ "$a" = near-0 ]
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | $CLIENT nc -w 3 $NODE_IP 2222 2>/dev/null | tail -n1)
check "host port 2222 answers on the node IP (got '$a')" [ "$a" = near-0 ]
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | $CLIENT nc -w 3 10.96.0.41 2222 2>/dev/null | tail -n1)
check "host port 2222 is not reachable on ClusterIP 10.96.0.41 (got '$a')" [ -z "$a" ]
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | $CLIENT nc -w 3 10.96.0.41 80 2>/dev/null | tail -n1)
check "service port 80 on that ClusterIP still answers (got '$a')" [ "$a" = near-0 ]
a=$(peer "$CLIENT" 203.0.113.20 80)
check "load-balancer IP from 192.168.100.2 (inside loadBalancerSourceRanges) is served (seen as '$a')" [ -n "$a" ]
a=$(peer "$CLIENT2" 203.0.113.20 80)
check "load-balancer IP from 192.168.101.2 (outside the ranges) is dropped (got '$a')" [ -z "$a" ]
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 203.0.113.20 80 2>/dev/null | tail -n1)
check "load-balancer IP from the node itself (not in the ranges) is dropped (got '$a')" [ -z "$a" ]
a=$(peer "$CLIENT2" 10.96.0.42 80)
check "the same Service's ClusterIP is not restricted: client2 is served (got '$a')" [ -n "$a" ]
a=$(peer "$CLIENT2" 203.0.113.21 30380)
check "firewalled load-balancer IP 203.0.113.21 on port 30380 (= a healthCheckNodePort) stays closed to 192.168.101.2 (got '$a')" [ -z "$a" ]
a=$(peer "$CLIENT" 203.0.113.21 30380)
check "the same port on 203.0.113.21 serves 192.168.100.2, inside the range (seen as '$a')" [ -n "$a" ]
# stdin stays open 1 s, on purpose, for the answer (as http_code): hyper drops a request whose client half-closed first
a=$( (printf 'GET /healthz HTTP/1.0\r\n\r\n'; sleep 1) | $CLIENT2 nc -w 3 $NODE_IP 30380 2>/dev/null | grep -o '"localEndpoints": *[0-9]*')
check "the health check on the node IP $NODE_IP:30380 answers 192.168.101.2 ('$a')" [ -n "$a" ]
r1=$(rules)
check "rule count unchanged by 4 more Services ($r0 -> $r1)" [ "$r0" = "$r1" ]
# kubernetes#119656 in reverse: a range holding the node IP lets the node in (from the LB IP)
sed 's#192.168.100.2/32#192.168.100.0/24#' /payload/tests/nft/services.yaml > "$W/nft.tmp" && mv "$W/nft.tmp" "$M/nft.yaml"
wait_converged 30 >/dev/null
node_allowed() { nft list set inet kipvs firewall-allow 2>/dev/null | grep -qE '203\.0\.113\.20 \. (tcp|6) \. 80 \. 203\.0\.113\.20'; }
wait_for 10 "the node IP in firewall-allow" node_allowed 2>/dev/null
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 203.0.113.20 80 2>/dev/null | tail -n1)
check "with 192.168.100.0/24 (holds the node IP) the node itself is served (got '$a')" [ "$a" = near-0 ]

# On-premises source ranges: nested, holding the node IP and the load-balancer IP itself. The kernel
# refuses an interval inside another, so they are merged; the firewall holds (fails closed).
cp /payload/tests/nft/firewall.yaml "$W/nft.tmp" && mv "$W/nft.tmp" "$M/firewall.yaml"
wait_converged 30 >/dev/null || bad "not converged with the on-premises firewall Service"
# (without /etc/protocols, as in this VM, nft names TCP "6")
allow=$(nft list set inet kipvs firewall-allow | grep -oE '203\.0\.113\.30 \. (tcp|6) \. 80 \. [0-9./]+' | awk '{print $7}' | sort | tr '\n' ' ')
check "nested ranges merged: firewall-allow of 203.0.113.30:80 is '$allow'" [ "$allow" = "192.168.100.0/24 203.0.113.0/24 " ]
a=$(peer "$CLIENT" 203.0.113.30 80)
check "nested ranges: 192.168.100.2 (inside) is served ('$a')" [ -n "$a" ]
a=$(peer "$CLIENT2" 203.0.113.30 80)
check "nested ranges: 192.168.101.2 (outside) is dropped (got '$a')" [ -z "$a" ]
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 203.0.113.30 80 2>/dev/null | tail -n1)
check "nested ranges: the node (its IP and the LB IP inside a range) is served (got '$a')" [ "$a" = near-0 ]

rm -f "$M/nft.yaml" "$M/firewall.yaml"
wait_converged 30 >/dev/null || bad "not converged after removing the test Services"
left=$(nft list table inet kipvs | grep -cE '10\.96\.0\.4[0-3]|203\.0\.113\.(2[01]|30)|10\.244\.(9\.9|1\.9)')
[ "$left" = 0 ] || nft list table inet kipvs | grep -E '10\.96\.0\.4[0-3]|203\.0\.113\.(2[01]|30)|10\.244\.(9\.9|1\.9)' | indent
check "their set elements are gone ($left left)" [ "$left" = 0 ]
pkill -f 'httpd -p 2222' 2>/dev/null
# client2's host address 192.168.101.1 goes: it would be one more local address, with NodePorts, in the tables the
# later tests compare with tests/vm/expected (39 adds it again). The netns stays: deleting a netns that carried
# IPVS traffic hangs on 5.10 ("unregister_netdevice: waiting for lo to become free"), and vclient2 with it.
/sbin/ip addr flush dev vclient2
finish
