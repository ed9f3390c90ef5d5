#!/bin/sh
# The mh and sh schedulers past weight-0 real servers (issue 34 item 3; kubernetes#139497). kipvs keeps a
# serving+terminating endpoint at weight 0 while a ready one exists; mh and sh still hash connections to a
# weight-0 server and answer "no destination available" unless the fallback flag (IP_VS_SVC_F_SCHED1:
# mh-fallback / sh-fallback) is set. For each scheduler (kipvs.io/scheduler on web), the only ready backend
# moves web-0 -> web-1 -> web-2 while the other two are terminating (weight 0):
#  1. the virtual servers carry the fallback flag (ipvsadm -b mh-fallback,mh-port / sh-fallback);
#  2. every request to the ClusterIP and the NodePort is answered by the ready backend: 0 failures;
#  3. control, what kipvs programmed before (mh with mh-port only): with the proxier stopped and the flag
#     taken off by ipvsadm, the same traffic fails on the weight-0 servers, so step 2 is the flag's doing.
. /payload/tests/lib.sh
modprobe ip_vs_mh 2>/dev/null; modprobe ip_vs_sh 2>/dev/null
proxier_ensure; wait_converged 30 >/dev/null
npc r-fallback true true true
applied r-fallback || true
cp "$M/web.yaml" "$W/web.yaml.fallback.orig"
WEB="web-0=10.244.1.2 web-1=10.244.2.3 web-2=10.244.3.4"
N=9 # requests per address and step: with three servers hashed, ~2/3 of them reach a weight-0 one
flags_of() { ipvsadm -Sn | awk -v vs="$1" '$1 == "-A" && $3 == vs { for (i = 4; i <= NF; i++) if ($i == "-b") print $(i + 1) }'; }
only_ready() { # NAME: NAME ready, the other two serving+terminating
  for e in $WEB; do
    if [ "${e%%=*}" = "$1" ]; then set_conditions web.yaml "${e#*=}" true true false
    else set_conditions web.yaml "${e#*=}" false true true; fi
  done
}
failures() { # NAME IP PORT: how many of N requests were not answered by NAME
  many "$N" http_get "$2" "$3" | grep -cvx "$1"
}

for sched in mh sh; do
  say "scheduler $sched (kipvs.io/scheduler on web)"
  awk -v s="$sched" '!done && /^metadata:/ { print; print "  annotations: {kipvs.io/scheduler: " s "}"; done = 1; next } { print }' \
    "$W/web.yaml.fallback.orig" > "$W/edit.tmp" && mv "$W/edit.tmp" "$M/web.yaml"
  for ready in web-0 web-1 web-2; do
    only_ready "$ready"
    wait_converged 30 >/dev/null || bad "$sched, only $ready ready: the kernel does not equal the plan"
    want=$([ "$sched" = mh ] && echo mh-fallback,mh-port || echo sh-fallback)
    for vs in 10.96.0.20:80 "$NODE_IP:30080"; do
      got=$(flags_of "$vs")
      [ "$got" = "$want" ] || bad "$sched: $vs has flags '$got', want '$want'"
    done
    f=$(( $(failures "$ready" 10.96.0.20 80) + $(failures "$ready" "$NODE_IP" 30080) ))
    if [ "$f" = 0 ]; then ok "$sched, only $ready ready (two at weight 0): $((2 * N)) requests, 0 failures"
    else bad "$sched, only $ready ready (two at weight 0): $f of $((2 * N)) requests failed"; fi
  done
done

say "control: mh without the fallback flag (what kipvs programmed before), the proxier stopped"
awk '!done && /^metadata:/ { print; print "  annotations: {kipvs.io/scheduler: mh}"; done = 1; next } { print }' \
  "$W/web.yaml.fallback.orig" > "$W/edit.tmp" && mv "$W/edit.tmp" "$M/web.yaml"
only_ready web-0
wait_converged 30 >/dev/null
proxier_stop
ipvsadm -E -t 10.96.0.20:80 -s mh -b mh-port
f=$(failures web-0 10.96.0.20 80)
if [ "$f" -gt 0 ]; then ok "without mh-fallback, $f of $N requests failed (hashed to a weight-0 server)"
else bad "without mh-fallback, no request failed: the test does not show the flag's effect"; fi

say "back to the original manifests"
cp "$W/web.yaml.fallback.orig" "$W/edit.tmp" && mv "$W/edit.tmp" "$M/web.yaml"
rm -f "$M/nodeproxyconfig.yaml" # the later tests start from the local configuration
proxier_start
check "ipvsadm -Sn equals the plan" wait_converged 30
finish
