#!/bin/sh
# (e) LoadBalancerIPMode: shop's ingress 203.0.113.10 (ipMode VIP) has a virtual server, is bound on
# kube-ipvs0 and carries traffic; 203.0.113.11 (ipMode Proxy) has neither (the load balancer itself
# proxies to the node), so a connection to it finds nothing.
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null
vip=203.0.113.10; proxy=203.0.113.11
check "VIP $vip has a virtual server" sh -c "ipvsadm -Sn | grep -q -- '-A -t $vip:80 '"
check "VIP $vip is bound on kube-ipvs0" sh -c "/sbin/ip -o addr show dev kube-ipvs0 | grep -q ' $vip/'"
check "Proxy $proxy has no virtual server" sh -c "! ipvsadm -Sn | grep -qF '$proxy'"
check "Proxy $proxy is not bound on kube-ipvs0" sh -c "! /sbin/ip -o addr show dev kube-ipvs0 | grep -qF ' $proxy/'"
plan_bind | grep -qxF $proxy && bad "plan binds $proxy" || ok "plan does not bind $proxy"
a=$(many 4 http_get $vip 80)
if [ "$(echo "$a" | distinct)" = "shop-5c9d7f8b4-kq2vw shop-5c9d7f8b4-t8mxn" ]; then ok "TCP $vip:80 reaches both shop pods"
else bad "TCP $vip:80: got $(echo "$a" | tr '\n' ' ')"; fi
a=$(http_get $proxy 80)
check "TCP $proxy:80 gets no answer from this node (got '${a}')" [ -z "$a" ]
a=$(many 2 http_get $NODE_IP 31380)
if [ "$(echo "$a" | distinct)" = "shop-5c9d7f8b4-kq2vw shop-5c9d7f8b4-t8mxn" ]; then ok "TCP $NODE_IP:31380 (shop's NodePort) reaches both shop pods"
else bad "TCP $NODE_IP:31380: got $(echo "$a" | tr '\n' ' ')"; fi
finish
