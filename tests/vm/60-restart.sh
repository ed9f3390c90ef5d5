#!/bin/sh
# (d) Restart is transparent: stop the proxier, start it again on the same manifests, and show that no
# virtual or real server was deleted and re-added. Evidence: the second run's first sync applies no
# operation (ops=0, no op= line adding or deleting a server), the table is unchanged, and the kernel's
# per-server connection counters (reset when a server is re-created) are unchanged.
. /payload/tests/lib.sh
proxier_ensure
check "converged before the restart" wait_converged 30
first=$(proxier_log)
check "the running proxier logged its kernel operations (op= lines)" grep -q 'op=' "$first"
# one new connection per TCP virtual server and one datagram per UDP one, so every counter is non-zero
ipvsadm -Sn | awk '$1 == "-A" { print $2, $3 }' | while read -r proto vs; do
  ip=${vs%:*} port=${vs##*:}
  case $proto in -t) http_get "$ip" "$port" >/dev/null ;; -u) udp_ask "$ip" "$port" >/dev/null ;; esac
done
# "proto vip:port conns" for virtual servers, "  vip:port -> rip:port conns" for real servers
counters() {
  ipvsadm -Ln --stats | awk '$1 ~ /^(TCP|UDP|SCTP|FWM)$/ { vs = $1 " " $2; print vs, $3 } $1 == "->" && NF > 2 { print vs, "->", $2, $3 }'
}
# the kernel folds its per-CPU counters into what ipvsadm shows every 2 s (IPVS estimator): let it catch up
sleep 2.5 # on purpose: one estimator period, which no state shows the end of
counters > "$W/counters.before"; kernel_table > "$W/table.before"; kernel_bind > "$W/bind.before"
say "connection counters before the restart:"; indent < "$W/counters.before"
check "some connections were counted" sh -c "awk '\$NF > 0' $W/counters.before | grep -q ."

check "proxier stopped on SIGTERM" proxier_stop
check "the table outlives the proxier (no flush on exit)" sh -c "ipvsadm -Sn | sort | cmp -s - $W/table.before"
proxier_start
second=$(proxier_log)
wait_for 30 "the second run's first sync" grep -q 'sync complete' "$second" 2>/dev/null
sync_line=$(grep -m1 'sync complete' "$second")
say "second run: $sync_line"
converged_again=0; wait_converged 30 || converged_again=1
sleep 2.5 # on purpose: later syncs and the counter estimator get their chance to show churn
failures=$(grep -c 'sync failed' "$second")
check "no failed sync in the second run (got $failures; a failed sync waits for the next trigger)" [ "$failures" -eq 0 ]
check "second run completed a sync within 30 s" [ -n "$sync_line" ]
case $sync_line in "") ;; *"ops=0"*) ok "its first sync applied ops=0" ;; *) bad "first sync after restart was not ops=0: $sync_line" ;; esac
check "converged after the restart" [ $converged_again -eq 0 ]
ops=$(grep 'op=' "$second")
[ -z "$ops" ] || { say "op= lines of the second run:"; echo "$ops" | indent; }
churn=$(grep -o 'op=[A-Za-z_]*' "$second" | grep -iE '(add|del|remove|flush|create)' | grep -iE '(virtual|real|server|service|dest)' | sort -u | tr '\n' ' ')
check "no virtual/real server added or deleted by the second run ${churn:+($churn)}" [ -z "$churn" ]
check "table unchanged" sh -c "ipvsadm -Sn | sort | cmp -s - $W/table.before"
kernel_bind > "$W/bind.after"
check "kube-ipvs0 addresses unchanged" cmp -s "$W/bind.before" "$W/bind.after"
counters > "$W/counters.after"
if cmp -s "$W/counters.before" "$W/counters.after"; then ok "connection counters unchanged (nothing re-created)"
else bad "connection counters changed across the restart"; diff -u "$W/counters.before" "$W/counters.after" | indent; fi
a=$(many 3 http_get 10.96.0.20 80)
if [ "$(echo "$a" | distinct)" = "web-0 web-1 web-2" ]; then ok "traffic after the restart: $(echo "$a" | tr '\n' ' ')"
else bad "traffic after the restart: got $(echo "$a" | tr '\n' ' ')"; fi
finish
