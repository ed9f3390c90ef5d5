#!/bin/sh
# (b) Real traffic through the proxier's IPVS table from the client netns (an outside client routed via
# the node): TCP through the web ClusterIP and its NodePort on the node IP, UDP and TCP through the
# DNS ClusterIP. Round robin over N new connections must reach every backend.
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null
expect() { # DESCRIPTION EXPECTED_DISTINCT ANSWERS
  if [ "$(echo "$3" | distinct)" = "$2" ]; then ok "$1: $(echo "$3" | tr '\n' ' ')"
  else bad "$1: want answers from {$2}, got: $(echo "$3" | tr '\n' ' ')"; fi
}
expect "TCP 10.96.0.20:80 (ClusterIP)" "web-0 web-1 web-2" "$(many 6 http_get 10.96.0.20 80)"
expect "TCP $NODE_IP:30080 (NodePort)" "web-0 web-1 web-2" "$(many 6 http_get $NODE_IP 30080)"
dns="coredns-76f75df574-4kd8w coredns-76f75df574-9xq7z"
expect "UDP 10.96.0.10:53 (DNS ClusterIP)" "$dns" "$(many 4 udp_ask 10.96.0.10 53)"
expect "TCP 10.96.0.10:53 (DNS ClusterIP)" "$dns" "$(many 2 http_get 10.96.0.10 53)"
expect "TCP 10.96.0.30:80 (LoadBalancer's ClusterIP)" "shop-5c9d7f8b4-kq2vw shop-5c9d7f8b4-t8mxn" "$(many 2 http_get 10.96.0.30 80)"
say "ipvsadm -Ln --stats:"; ipvsadm -Ln --stats | indent
finish
