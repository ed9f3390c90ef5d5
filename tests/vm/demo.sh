#!/bin/sh
# Demo (hack/demo.sh), the product's story on a real kernel, with the proxier and nft of the proxier image:
#  1. the proxier programs the example cluster: the IPVS table, the addresses on kube-ipvs0, the nftables
#     table, and where real connections from the client netns land;
#  2. a Deployment rollout step: one web backend turns serving+terminating while a client holds a
#     connection to it; it stays a real server at weight 0, new connections go to the others, and the held
#     connection keeps working;
#  3. a gate changes through the node's NodeProxyConfig (as the operator writes it): LoadBalancerIPMode
#     off, and the log shows exactly the kernel operations that flip caused.
. /payload/tests/lib.sh
. /payload/tests/topology.sh
proxier_start
if wait_converged 30; then ok "kernel table equals kipvs-proxier plan"; else bad "not converged"; fi
echo; echo "### 1. ipvsadm -Ln"; ipvsadm -Ln
echo; echo "### kube-ipvs0"; ip -br addr show dev kube-ipvs0
echo; echo "### nft list table inet kipvs (masquerade, hairpin, filtering): chains"
nft list table inet kipvs | grep -E '^\s+(chain|set) ' | sed 's/{$//' | indent
echo; echo "### traffic from the client netns (192.168.100.2)"
show() { printf '%-34s -> %s\n' "$1" "$(many "$2" "$3" "$4" "$5" | tr '\n' ' ')"; }
show "web ClusterIP 10.96.0.20:80" 6 http_get 10.96.0.20 80
show "web NodePort $NODE_IP:30080" 3 http_get "$NODE_IP" 30080
show "kube-dns UDP 10.96.0.10:53" 4 udp_ask 10.96.0.10 53
show "shop LB VIP 203.0.113.10:80" 4 http_get 203.0.113.10 80
show "shop LB Proxy-mode 203.0.113.11:80" 1 http_get 203.0.113.11 80
echo "    (- = no answer: a Proxy-mode ingress IP gets no virtual server and is not bound)"

echo; echo "### 2. rollout step: the backend of a held connection turns serving+terminating"
hold held 10.96.0.20 80; exec 3> "$W/held.fifo"
ep=$(held_backend 10.96.0.20:80)
pod=$(for p in $PODS; do [ "$(field "$p" 2)" = "$ep" ] && field "$p" 1; done)
[ -n "$ep" ] || bad "no ESTABLISHED connection for the held client"
say "a client holds a connection to $pod ($ep); its EndpointSlice entry becomes ready=false serving=true terminating=true"
set_conditions web.yaml "$ep" false true true
check "kernel table equals the new plan" wait_converged 30
ipvsadm -Ln -t 10.96.0.20:80 | indent
ipvsadm -Sn | grep -qE -- "-t 10.96.0.20:80 -r $ep:8080 -m -w 0\$" && ok "$pod is a real server at weight 0" ||
  bad "$pod is not at weight 0"
a=$(many 6 http_get 10.96.0.20 80 | distinct)
case " $a " in *" $pod "*) bad "a new connection reached terminating $pod: $a" ;; *) ok "6 new connections went to: $a" ;; esac
a=$(ask held 3)
[ "$a" = "$pod" ] && ok "the held connection to terminating $pod still works" || bad "held connection to $pod: got '$a'"

echo; echo "### 3. NodeProxyConfig revision r2 turns LoadBalancerIPMode off (r1: the defaults)"
npc r1 true true true; applied r1
m=$(mark); npc r2 false true true; applied r2
check "kernel table equals the plan of r2" wait_converged 30
say "kernel operations caused by the flip (from the proxier's log):"
ops_since "$m" | indent
check "the Proxy-mode ingress IP 203.0.113.11 now has a virtual server" sh -c "ipvsadm -Sn | grep -q -- '-A -t 203.0.113.11:80'"
show "shop LB Proxy-mode 203.0.113.11:80" 2 http_get 203.0.113.11 80

echo; echo "### proxier log (last lines)"; indent < "$(proxier_log)" | tail -n 12
proxier_stop
finish
