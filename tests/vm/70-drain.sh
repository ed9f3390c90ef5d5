#!/bin/sh
# Draining (issue 3): a real server that leaves the desired set while it holds a live TCP connection
#  1. goes to weight 0 and stays: the live connection keeps working, new connections go elsewhere;
#  2. is deleted once its connections are gone (IPVS active + inactive counts reach 0);
# and a UDP real server that leaves is deleted at once, whatever its connection entries.
# The proxier runs with short IPVS FIN timeouts so a closed connection's entry expires quickly.
. /payload/tests/lib.sh
. /payload/tests/topology.sh
proxier_stop
printf 'apiVersion: kipvs.io/v1alpha1\nkind: ProxierConfiguration\nipvs:\n  tcpFinTimeout: 5s\n  udpTimeout: 5s\n' > "$W/drain-config.yaml"
KIPVS_CONFIG=$W/drain-config.yaml proxier_start
wait_converged 30 >/dev/null || bad "not converged at start"
cp "$M/web.yaml" "$W/web.yaml.orig"; cp "$M/kube-dns.yaml" "$W/kube-dns.yaml.orig"
rs_line() { ipvsadm -Sn | grep -E "^-a -t 10\.96\.0\.20:80 -r $1:8080 "; } # REAL_SERVER_IP

say "opening a connection to 10.96.0.20:80 that stays open (no request sent yet)"
rm -f "$W/hold"; mkfifo "$W/hold"
in_client nc -w 60 10.96.0.20 80 < "$W/hold" > "$W/held.out" 2>/dev/null &
held=$!
exec 3> "$W/hold"
ep=$(held_backend 10.96.0.20:80)
[ -n "$ep" ] || { bad "no ESTABLISHED IPVS connection for the held client"; finish; }
pod=$(for p in $PODS; do [ "$(field "$p" 2)" = "$ep" ] && field "$p" 1; done)
ok "held connection is on real server $ep ($pod)"

say "step 1: $ep stops serving (ready=false serving=false terminating=true): it leaves the desired set"
t0=$(now)
set_conditions web.yaml "$ep" false false true
at_weight_0() { rs_line "$ep" | grep -q -- '-w 0$'; }
wait_for 30 "$ep at weight 0" at_weight_0 2>/dev/null
check "$ep drains at weight 0 while its connection is open" sh -c "ipvsadm -Sn | grep -qE '^-a -t 10\.96\.0\.20:80 -r $ep:8080 -m -w 0\$'"
a=$(many 8 http_get 10.96.0.20 80)
names=$(echo "$a" | distinct)
case " $names " in
  *" - "* | *" $pod "*) bad "new connections with $pod draining: $(echo "$a" | tr '\n' ' ')" ;;
  *) ok "8 new connections all answered elsewhere: $names" ;;
esac
printf 'GET / HTTP/1.0\r\n\r\n' >&3
exec 3>&-
wait "$held" 2>/dev/null
answer=$(tail -n1 "$W/held.out")
if [ "$answer" = "$pod" ]; then ok "the held connection still works at weight 0: answered by $answer"
else bad "the held connection got no answer after its real server went to weight 0"; fi

say "step 2: the connection is closed; the real server must be deleted once IPVS forgets it"
rs_gone() { ! rs_line "$ep" >/dev/null; }
wait_for 150 "$ep deleted" rs_gone 2>/dev/null
if rs_line "$ep" >/dev/null; then bad "$ep still present 150 s after its connection closed: $(rs_line "$ep")"
else ok "$ep deleted $(awk "BEGIN{print $(now) - $t0}") s after it left the endpoints"; fi
check "the table equals the plan again" wait_converged 10

say "step 3: UDP: a DNS backend with connection entries leaves; deleted at once"
udp_ask 10.96.0.10 53 >/dev/null; udp_ask 10.96.0.10 53 >/dev/null
ipvsadm -Ln -u 10.96.0.10:53 | indent
set_conditions kube-dns.yaml 10.244.2.6 false false true
t0=$(now)
check "UDP real server 10.244.2.6:53 removed in the next sync" wait_converged 10
check "it is gone from UDP 10.96.0.10:53" sh -c "! ipvsadm -Sn | grep -q -- '-u 10.96.0.10:53 -r 10.244.2.6:53'"
a=$(many 3 udp_ask 10.96.0.10 53 | distinct)
if [ "$a" = "coredns-76f75df574-4kd8w" ]; then ok "DNS answered by the remaining backend"
else bad "DNS after removal: want coredns-76f75df574-4kd8w, got '$a'"; fi

cp "$W/web.yaml.orig" "$W/edit.tmp" && mv "$W/edit.tmp" "$M/web.yaml"
cp "$W/kube-dns.yaml.orig" "$W/edit.tmp" && mv "$W/edit.tmp" "$M/kube-dns.yaml"
check "back to the example cluster" wait_converged 30
finish
