#!/bin/sh
# Issue 6 on a real kernel: the proxier follows its NodeProxyConfig (here from the manifests, as the
# API mode does from the API server) and applies each gate flip live, touching nothing else:
#  1. LoadBalancerIPMode off -> on: only the Proxy-mode ingress IP's virtual server goes and its
#     address is unbound; connections held open to the VIP and to a ClusterIP keep working;
#  2. ProxyTerminatingEndpoints on -> off: only the terminating real server leaves (it drains: its
#     held connection keeps working), every other real server is untouched;
#  3. KubeProxyDrainingTerminatingNodes off -> on (the Node is tainted ToBeDeletedByClusterAutoscaler):
#     no kernel operation at all, /healthz turns 503 while /livez stays 200.
. /payload/tests/lib.sh
. /payload/tests/topology.sh
proxier_stop
cp "$M/web.yaml" "$W/web.yaml.orig"; cp "$M/node.yaml" "$W/node.yaml.orig"
# taint the Node (KEP-3836): only /healthz may care, and only with the gate on
awk '!done && /^    podCIDR: 10.244.1.0\/24$/ { print "    taints:\n    - effect: NoSchedule\n      key: ToBeDeletedByClusterAutoscaler\n      value: \"1764000000\""; done = 1 } { print }' \
  "$W/node.yaml.orig" > "$W/edit.tmp" && mv "$W/edit.tmp" "$M/node.yaml"

say "revision r1: LoadBalancerIPMode off, ProxyTerminatingEndpoints on, KubeProxyDrainingTerminatingNodes off"
npc r1 false true false
proxier_start
applied r1
check "ipvsadm -Sn equals the plan of r1" wait_converged 30
check "gate off: the Proxy-mode IP 203.0.113.11 has a virtual server" sh -c "ipvsadm -Sn | grep -q -- '-A -t 203.0.113.11:80'"
check "... and is bound" sh -c "/sbin/ip -o -4 addr show dev kube-ipvs0 | grep -q ' 203.0.113.11/'"
say "the Node is tainted ToBeDeletedByClusterAutoscaler; the gate is off:"; want_code /healthz 200

say "step 1: r2 turns LoadBalancerIPMode on, with connections held to 203.0.113.10:80 and 10.96.0.20:80"
hold vip 203.0.113.10 80; exec 3> "$W/vip.fifo"
hold web 10.96.0.20 80; exec 4> "$W/web.fifo"
both_held() { established 203.0.113.10:80 >/dev/null && established 10.96.0.20:80 >/dev/null; }
wait_for 10 "both held connections ESTABLISHED" both_held || bad "the held connections are not ESTABLISHED"
m=$(mark); npc r2 true true false; applied r2
check "ipvsadm -Sn equals the plan of r2" wait_converged 30
got=$(ops_since "$m")
want='op=UnbindAddress address=203.0.113.11
op=DeleteVirtualServer vs="TCP 203.0.113.11:80"
op=DeleteSetElement element="external { 203.0.113.11 . tcp . 80 }"
op=DeleteSetElement element="service-ips { 203.0.113.11 }"'
if [ "$got" = "$want" ]; then ok "the flip applied exactly: $(echo "$got" | tr '\n' ';')"
else bad "ops of the LoadBalancerIPMode flip: want '$want', got '$(echo "$got" | tr '\n' ';')'"; fi
check "203.0.113.11 is no longer bound" sh -c "! /sbin/ip -o -4 addr show dev kube-ipvs0 | grep -q ' 203.0.113.11/'"
a=$(ask vip 3); case "$a" in shop-*) ok "held connection to the VIP still works: $a" ;; *) bad "held VIP connection: got '$a'" ;; esac
a=$(ask web 4); case "$a" in web-*) ok "held connection to the ClusterIP still works: $a" ;; *) bad "held ClusterIP connection: got '$a'" ;; esac

say "step 2: a held connection's web backend turns terminating (serving), then r3 turns ProxyTerminatingEndpoints off"
hold term 10.96.0.20 80; exec 3> "$W/term.fifo"
ep=$(held_backend 10.96.0.20:80)
pod=$(for p in $PODS; do [ "$(field "$p" 2)" = "$ep" ] && field "$p" 1; done)
[ -n "$ep" ] || bad "no ESTABLISHED connection for the held client"
set_conditions web.yaml "$ep" false true true
check "terminating $ep at weight 0 under r2 (gate on)" wait_converged 30
before=$(ipvsadm -Sn | grep -v -- "-r $ep:" | sort)
m=$(mark); npc r3 true false false; applied r3
sleep 1 # on purpose, here and in step 3: a stray kernel operation of the flip would show within it
got=$(ops_since "$m")
if [ -z "$got" ] || [ "$(echo "$got" | grep -vc "$ep")" -eq 0 ]; then ok "the flip touched only $ep: ${got:-no op (it already drains at weight 0)}"
else bad "ops of the ProxyTerminatingEndpoints flip touch more than $ep: $(echo "$got" | tr '\n' ';')"; fi
after=$(ipvsadm -Sn | grep -v -- "-r $ep:" | sort)
check "every other virtual and real server is unchanged" [ "$before" = "$after" ]
# web's virtual servers only: the dual-stack Service 'dual' (10.96.0.50, NodePort 30050, 203.0.113.50) has
# the same pod as a ready endpoint of its own
plan | grep -v -e ' 10.96.0.50:' -e ':30050 ' -e ' 203.0.113.50:' > "$W/plan.r3"
if grep -q -- "-r $ep:" "$W/plan.r3"; then bad "$ep is still in the plan of r3 for web"
elif ipvsadm -Sn | grep -qE -- "-r $ep:8080 -m -w 0\$"; then ok "$ep drains at weight 0 (not in the plan of r3, kept for its connection)"
else bad "$ep is not draining at weight 0: $(ipvsadm -Sn | grep -- "-r $ep:" | tr '\n' ';')"; fi
a=$(ask term 3); [ "$a" = "$pod" ] && ok "the held connection to terminating $pod still works" || bad "held connection to $pod: got '$a'"

say "step 3: r4 turns KubeProxyDrainingTerminatingNodes on (the Node is tainted)"
m=$(mark); npc r4 true false true; applied r4
sleep 1
got=$(ops_since "$m")
check "no kernel operation for the health gate flip" [ -z "$got" ]
want_code /healthz 503
want_code /livez 200

proxier_stop
rm -f "$M/nodeproxyconfig.yaml"
cp "$W/web.yaml.orig" "$M/web.yaml"; cp "$W/node.yaml.orig" "$M/node.yaml"
finish
