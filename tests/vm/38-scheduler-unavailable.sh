#!/bin/sh
# A Service annotated with an IPVS scheduler this kernel lacks (Debian's 6.1 has no ip_vs_twos module), issue 12:
#  1. the annotated Service is reported (log, kipvs_ipvs_scheduler_unavailable{scheduler="twos"}) and programmed
#     with the configured scheduler (rr) instead of being retried forever;
#  2. every other Service keeps being synced incrementally: an endpoint change of web afterwards is applied by
#     incremental syncs (the log's `sync complete kind=incremental`), not by a full observe per sync;
#  3. the NodeProxyConfig status (logged in manifests mode) is not rewritten per failed sync: at most one
#     status line while the annotation is in force (counters are published at most once every 5 minutes: COUNTERS_REFRESH).
. /payload/tests/lib.sh
modprobe ip_vs_twos 2>/dev/null && skip "this kernel has the twos scheduler"
proxier_ensure; wait_converged 30 >/dev/null
cp "$M/shop.yaml" "$W/shop.yaml.orig"; cp "$M/web.yaml" "$W/web.yaml.orig"
scheduler_of() { ipvsadm -Sn | awk -v vs="$1" '$1 == "-A" && $3 == vs { print $5 }'; }

npc r-sched true true true
applied r-sched || true
say "step 1: annotate shop with kipvs.io/scheduler: twos"
start=$(mark)
awk '!done && /^metadata:/ { print; print "  annotations: {kipvs.io/scheduler: twos}"; done = 1; next } { print }' \
  "$W/shop.yaml.orig" > "$W/edit.tmp" && mv "$W/edit.tmp" "$M/shop.yaml"
logged_since() { tail -n +"$(($1 + 1))" "$(proxier_log)" | grep -q "$2"; } # LINE PATTERN
wait_for 30 "the missing scheduler logged" logged_since "$start" 'Services annotated kipvs.io/scheduler=twos get ipvs.scheduler' 2>/dev/null
check "the missing scheduler is logged" sh -c "tail -n +$((start + 1)) '$(proxier_log)' | \
  grep -q 'Services annotated kipvs.io/scheduler=twos get ipvs.scheduler'"
check "  ... and the Service named as a problem" sh -c "tail -n +$((start + 1)) '$(proxier_log)' | \
  grep -q 'default/shop.*lacks that IPVS scheduler'"
# the gauge is published with the sync after the probe: poll it for up to 20 s
gauge_set() { got=$(metric 'kipvs_ipvs_scheduler_unavailable{scheduler="twos"}'); [ "$got" = 1 ]; }
wait_for 20 "kipvs_ipvs_scheduler_unavailable 1" gauge_set 2>/dev/null
[ "$got" = 1 ] || { say "metrics mentioning twos:"; (printf 'GET /metrics HTTP/1.0\r\n\r\n'; sleep 1) | nc -w 3 127.0.0.1 10249 2>/dev/null | grep -i -e twos -e scheduler | indent; }
check "  ... and in kipvs_ipvs_scheduler_unavailable{scheduler=\"twos\"} (got ${got:-nothing})" [ "$got" = 1 ]
scheduler_is() { [ "$(scheduler_of "$1")" = "$2" ]; } # VS SCHEDULER
wait_for 10 "shop's virtual server with rr" scheduler_is 10.96.0.30:80 rr 2>/dev/null
check "shop's virtual server is programmed with the configured scheduler (rr)" \
  [ "$(scheduler_of 10.96.0.30:80)" = rr ]
check "  ... with its real servers" sh -c "ipvsadm -Sn | grep -q -- '-a -t 10.96.0.30:80 -r'"

say "step 2: an endpoint of web turns terminating"
step2=$(mark)
set_conditions web.yaml 10.244.1.2 false true true
at_weight_0() { ipvsadm -Sn | grep -q -- '-a -t 10.96.0.20:80 -r 10.244.1.2:8080 -m -w 0'; }
wait_for 30 "web's endpoint at weight 0" at_weight_0 2>/dev/null
check "web's endpoint is at weight 0" sh -c "ipvsadm -Sn | grep -q -- '-a -t 10.96.0.20:80 -r 10.244.1.2:8080 -m -w 0'"
sleep 3 # on purpose: later syncs get their chance to show a full observe each
syncs=$(tail -n +"$((step2 + 1))" "$(proxier_log)" | grep 'sync complete')
incremental=$(echo "$syncs" | grep -c incremental)
full=$(echo "$syncs" | grep -c 'full')
say "syncs since the change: $incremental incremental, $full full"
check "the change was synced incrementally" [ "$incremental" -ge 1 ]
check "  ... with no full observe per sync (at most one periodic full sync, got $full)" [ "$full" -le 1 ]
statuses=$(tail -n +"$((start + 1))" "$(proxier_log)" | grep -c 'NodeProxyConfig status' || true)
check "the NodeProxyConfig status was logged at most once meanwhile (got $statuses)" [ "$statuses" -le 1 ]

say "back to the original manifests"
cp "$W/shop.yaml.orig" "$W/edit.tmp" && mv "$W/edit.tmp" "$M/shop.yaml"
cp "$W/web.yaml.orig" "$W/edit.tmp" && mv "$W/edit.tmp" "$M/web.yaml"
rm -f "$M/nodeproxyconfig.yaml"
check "ipvsadm -Sn equals the plan" wait_converged 30
finish
