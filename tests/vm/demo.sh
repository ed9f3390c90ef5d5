#!/bin/sh
# Demo (hack/demo.sh): the proxier programs the example cluster; show the table, the bound addresses
# and where real connections from the client netns land.
. /payload/tests/lib.sh
proxier_start
if wait_converged 30; then ok "kernel table equals kipvs-proxier plan"; else bad "not converged"; fi
echo; echo "### ipvsadm -Ln"; ipvsadm -Ln
echo; echo "### kube-ipvs0"; ip -br addr show dev kube-ipvs0
echo; echo "### nft list table inet kipvs (masquerade, hairpin, filtering)"; nft list table inet kipvs
echo; echo "### traffic from the client netns (192.168.100.2)"
show() { printf '%-34s -> %s\n' "$1" "$(many "$2" "$3" "$4" "$5" | tr '\n' ' ')"; }
show "web ClusterIP 10.96.0.20:80" 6 http_get 10.96.0.20 80
show "web NodePort $NODE_IP:30080" 3 http_get "$NODE_IP" 30080
show "kube-dns UDP 10.96.0.10:53" 4 udp_ask 10.96.0.10 53
show "kube-dns TCP 10.96.0.10:53" 2 http_get 10.96.0.10 53
show "shop LB VIP 203.0.113.10:80" 4 http_get 203.0.113.10 80
show "shop LB Proxy-mode 203.0.113.11:80" 1 http_get 203.0.113.11 80
echo "    (- = no answer: a Proxy-mode ingress IP gets no virtual server and is not bound)"
echo; echo "### ipvsadm -Ln --stats"; ipvsadm -Ln --stats
echo; echo "### proxier log"; indent < "$(proxier_log)" | tail -n 30
proxier_stop
finish
