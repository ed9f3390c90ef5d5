#!/bin/sh
# externalTrafficPolicy: Local with no local endpoint (issue 34 item 4), with traffic. shop (LoadBalancer,
# 203.0.113.10 in VIP mode, NodePort 31380) turns Local; its endpoint 10.244.1.7 moves between this node and
# node-b while the proxier runs (incremental syncs), then the proxier restarts. The proxier runs with
# clusterCIDR 10.244.0.0/16 (the pods' traffic is the cluster's). Each time:
#  - with the endpoint here: neither address is in external-no-local; the outside client (the client netns)
#    is served by the local endpoint only;
#  - without it: both addresses are in external-no-local and keep the cluster's two real servers; the outside
#    client gets kube-proxy IPVS's answer on both, refused at once (ICMP port unreachable), not forwarded to a
#    remote endpoint; the node itself (the root netns) and a pod (web-1's netns) are served by a shop pod.
# Control, the proxier stopped: with the two elements deleted by hand (what kipvs programmed before d02210c)
# the outside client is not refused, so the refusal above is the rule's doing.
. /payload/tests/lib.sh
LB=203.0.113.10 NP=31380 LOCAL_EP=10.244.1.7
proxier_stop
printf 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nclusterCIDR: 10.244.0.0/16\n' \
  > "$W/etp-config.yaml"
cp "$M/shop.yaml" "$W/shop.yaml.etp.orig"
shop_local() { # NODE: shop with externalTrafficPolicy Local, its endpoint LOCAL_EP on NODE
  awk -v ep="  - $LOCAL_EP" -v node="$1" '
    /^  externalTrafficPolicy: / { print "  externalTrafficPolicy: Local"; print "  healthCheckNodePort: 32100"; next }
    $0 == ep { in_ep = 1 }
    in_ep && /^  nodeName: / { print "  nodeName: " node; in_ep = 0; next }
    { print }' "$W/shop.yaml.etp.orig" > "$W/edit.tmp" && mv "$W/edit.tmp" "$M/shop.yaml"
}
settled() { # the kernel equals the plan but for real servers left draining at weight 0 (the node's and the
  # pod's connections to a remote endpoint that lost its place: drained, not cut)
  plan 2> "$W/plan.err" | grep -v -- ' -w 0$' | sort > "$W/plan.sorted" &&
    kernel_table | grep -v -- ' -w 0$' > "$W/kernel.sorted" && cmp -s "$W/plan.sorted" "$W/kernel.sorted"
}
no_local() { nft list set inet kipvs external-no-local 2>/dev/null; }
in_no_local() { no_local | grep -q "$1 \. tcp \. $2"; } # IP PORT
reals() { ipvsadm -Sn | grep -c -- "^-a -t $1:$2 -r .* -w [1-9]"; } # VIP PORT: how many weighted real servers
# the outside client: refused, not answered (nc's message, well before its 3 s timeout). The kernel rate-limits
# ICMP errors per peer (net.ipv4.icmp_ratelimit, 1 s): after a few rejects the first SYN's answer is skipped
# and the retransmitted one, 1 s later, is refused (kube-proxy IPVS's ICMP from ip_vs_leave is limited alike)
refused() { # IP PORT
  t0=$(now)
  out=$(printf 'GET / HTTP/1.0\r\n\r\n' | in_client nc -w 3 "$1" "$2" 2>&1)
  took=$(awk "BEGIN{print $(now) - $t0}")
  case $out in *"Connection refused"*) awk "BEGIN{exit !($took < 2.5)}" ;; *) false ;; esac
}
from_node() { printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$1" "$2" 2>/dev/null | tail -n1; }
from_pod() { printf 'GET / HTTP/1.0\r\n\r\n' | nsenter --net=/run/netns/web-1 nc -w 3 "$1" "$2" 2>/dev/null | tail -n1; }
shop_pod() { case $1 in shop-5c9d7f8b4-kq2vw | shop-5c9d7f8b4-t8mxn) ;; *) false ;; esac; }
served_by_shop() { for a in $1; do shop_pod "$a" || return 1; done; } # ANSWERS: every one from a shop pod
with_local() { # WHAT: the endpoint on this node: not in external-no-local, the outside client served by it alone
  wait_for 30 "$1: the kernel to equal the plan" settled 2>/dev/null
  check "$1: ipvsadm -Sn equals the plan (but for draining real servers)" settled
  for vs in "$LB 80" "$NODE_IP $NP"; do
    set -- "$1" $vs
    check "$1: $2:$3 is not in external-no-local" sh -c "! nft list set inet kipvs external-no-local | grep -q '$2 \. tcp \. $3'"
    a=$(many 3 http_get "$2" "$3" | distinct)
    check "$1: outside client to $2:$3 served by the local endpoint only (got '$a')" [ "$a" = shop-5c9d7f8b4-kq2vw ]
  done
}
without_local() { # WHAT: no endpoint on this node: rejected for the outside client, served for the node and a pod
  wait_for 30 "$1: the kernel to equal the plan" settled 2>/dev/null
  check "$1: ipvsadm -Sn equals the plan (but for draining real servers)" settled
  for vs in "$LB 80" "$NODE_IP $NP"; do
    set -- "$1" $vs
    check "$1: $2:$3 is in external-no-local" in_no_local "$2" "$3"
    check "$1: $2:$3 keeps the cluster's real servers ($(reals "$2" "$3"))" [ "$(reals "$2" "$3")" = 2 ]
    if refused "$2" "$3"; then ok "$1: outside client to $2:$3 refused in ${took} s"
    else bad "$1: outside client to $2:$3: want refused at once, got '$(echo "$out" | tail -n1)' after ${took} s"; fi
    a=$(many 3 from_node "$2" "$3" | distinct)
    check "$1: the node to $2:$3 served by a shop pod (got '$a')" served_by_shop "$a"
    a=$(many 3 from_pod "$2" "$3" | distinct)
    check "$1: a pod (web-1) to $2:$3 served by a shop pod (got '$a')" served_by_shop "$a"
  done
  say "$1: external-no-local: $(no_local | tr -d '\n\t' | sed 's/.*elements = //')"
}

shop_local test-node
KIPVS_CONFIG=$W/etp-config.yaml proxier_start
with_local "start, endpoint local"
say "the endpoint $LOCAL_EP moves to node-b"
shop_local node-b
without_local "no local endpoint"
say "the endpoint $LOCAL_EP back on this node"
shop_local test-node
with_local "local again"
say "the endpoint $LOCAL_EP on node-b again"
shop_local node-b
without_local "no local endpoint again"
proxier_stop
KIPVS_CONFIG=$W/etp-config.yaml proxier_start
without_local "after a restart"

say "control: external-no-local emptied by hand, the proxier stopped"
proxier_stop
nft delete element inet kipvs external-no-local "{ $LB . tcp . 80, $NODE_IP . tcp . $NP }"
for vs in "$LB 80" "$NODE_IP $NP"; do
  set -- $vs
  if refused "$1" "$2"; then bad "control: outside client to $1:$2 still refused without the element"
  else ok "control: outside client to $1:$2 not refused without the element (got '$(echo "$out" | tail -n1)' after ${took} s)"; fi
done

say "back to the original manifests and the local configuration"
proxier_stop
cp "$W/shop.yaml.etp.orig" "$W/edit.tmp" && mv "$W/edit.tmp" "$M/shop.yaml"
proxier_start
check "ipvsadm -Sn equals the plan (but for draining real servers)" wait_for 30 "the plan" settled
finish
