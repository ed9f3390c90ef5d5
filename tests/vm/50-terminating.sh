#!/bin/sh
# (c) ProxyTerminatingEndpoints, by editing the manifests the proxier watches:
#  1. web-0 terminating but still serving while web-1/web-2 are ready: web-0 stays a real server with
#     weight 0 (finishes its connections, gets no new ones) and every new connection goes elsewhere;
#  2. all three terminating (serving): none is ready, so the serving+terminating ones get weight 1
#     again (the KEP-1669 fallback) and traffic reaches all of them;
#  3. the original manifests again: all ready, all weight 1.
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null
cp "$M/web.yaml" "$W/web.yaml.orig"
weights() { # VIP:PORT -> "ip=weight ..." of its real servers
  ipvsadm -Sn | awk -v vs="$1" '$1 == "-a" && $3 == vs { sub(/:.*/, "", $5); printf "%s=%s ", $5, $NF }' |
    sed 's/ $//'
}
want_weights() { # DESCRIPTION WANT
  for vs in 10.96.0.20:80 "$NODE_IP:30080"; do
    got=$(weights "$vs")
    if [ "$got" = "$2" ]; then ok "$1 on $vs: $got"; else bad "$1 on $vs: want '$2', got '$got'"; fi
  done
}

say "step 1: web-0 (10.244.1.2) ready=false serving=true terminating=true"
set_conditions web.yaml 10.244.1.2 false true true
check "ipvsadm -Sn equals the new plan" wait_converged 30
want_weights "terminating web-0 drained to weight 0" "10.244.1.2=0 10.244.2.3=1 10.244.3.4=1"
a=$(many 8 http_get 10.96.0.20 80; many 4 http_get $NODE_IP 30080)
if [ "$(echo "$a" | distinct)" = "web-1 web-2" ]; then ok "12 new connections all went to web-1/web-2"
else bad "new connections with web-0 terminating: want only web-1 web-2, got: $(echo "$a" | tr '\n' ' ')"; fi

say "step 2: all web endpoints terminating (still serving)"
for e in 10.244.1.2 10.244.2.3 10.244.3.4; do set_conditions web.yaml $e false true true; done
check "ipvsadm -Sn equals the new plan" wait_converged 30
want_weights "no ready endpoint: serving+terminating fall back to weight 1" "10.244.1.2=1 10.244.2.3=1 10.244.3.4=1"
a=$(many 6 http_get 10.96.0.20 80)
if [ "$(echo "$a" | distinct)" = "web-0 web-1 web-2" ]; then ok "traffic flows to all three: $(echo "$a" | tr '\n' ' ')"
else bad "with all terminating: want web-0 web-1 web-2, got: $(echo "$a" | tr '\n' ' ')"; fi

say "step 3: back to the original manifests"
cp "$W/web.yaml.orig" "$W/edit.tmp" && mv "$W/edit.tmp" "$M/web.yaml"
check "ipvsadm -Sn equals the plan" wait_converged 30
sort "$T/expected/cluster.ipvsadm" > "$W/expected.sorted"
check "table is the example cluster's again" sh -c "ipvsadm -Sn | sort | cmp -s - $W/expected.sorted"
finish
