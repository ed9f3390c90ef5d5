#!/bin/sh
# UDP flows that keep their source port (DNS resolvers, statsd, QUIC) survive backend changes (issue 13).
# A client sends a datagram every ~0.1 s from one fixed source port to one path of a UDP Service —
# ClusterIP, NodePort on the node IP, externalIP (the last two masqueraded) — and
#   move: the backend the flow landed on is removed from the EndpointSlice;
#   zero: every backend is removed, then one comes back (the Service scaled to zero and up again);
# the next datagrams, same source port, must reach the remaining (returning) backend within 3 s of the
# proxier converging. Prints the delay and the flow's conntrack entries before and after.
# Measured on this kernel (6.1): IPVS alone already recovers these flows (expire_nodest_conn=1 expires
# the connections of a deleted real server and kills their conntrack entries), with or without kipvs's
# cleanup. Where a stale entry does hurt: a flow whose entry was made before its address became a
# virtual server (here: an externalIP that was routed elsewhere). IPVS forwards its packets but never
# rewrites a confirmed entry, and the masquerade decision was taken for the entry's first packet, so the
# backend sees the client and its replies bypass the node. Only deleting the entry (kipvs's conntrack
# cleanup: its reply source is no real server) fixes it; checked last, as "claimed".
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null
A=10.244.1.20; B=10.244.3.21
{
  echo "netns add udp-a"; echo "link add vudpa type veth peer name eth0 netns udp-a"
  echo "addr add 10.244.0.1/32 dev vudpa"; echo "link set vudpa up"; echo "route add $A/32 dev vudpa"
  echo "netns add udp-b"; echo "link add vudpb type veth peer name eth0 netns udp-b"
  echo "addr add 10.244.0.1/32 dev vudpb"; echo "link set vudpb up"; echo "route add $B/32 dev vudpb"
} > "$W/ct.topo"
/sbin/ip -batch "$W/ct.topo"
for p in udp-a=$A udp-b=$B; do
  printf 'link set lo up\naddr add %s/32 dev eth0\nlink set eth0 up\nroute add 10.244.0.1 dev eth0\nroute add default via 10.244.0.1 dev eth0\n' \
    "${p#*=}" | /sbin/ip -n "${p%%=*}" -batch -
done
service() { # ENDPOINT=NODE...: write the Service with these endpoints and wait for the kernel
  # and an entry to no virtual server, which the kernel must leave out of the proxier's dumps
  echo foreign | nc.traditional -u -q 0 -p 41009 $A 9999 2>/dev/null
  sh /payload/tests/conntrack/udp-sink.sh "$@" > "$W/ct.tmp" && mv "$W/ct.tmp" "$M/udp-sink.yaml"
  wait_converged 30 >/dev/null || bad "not converged with endpoints '$*'"
}
ct() { # PORT: the conntrack entries of the client's source port
  grep -E "sport=$1 " /proc/net/nf_conntrack 2>/dev/null | sed -E 's/^ipv4 +2 +//; s/ mark=.*//' | indent
}
lines() { wc -l < "$1" 2>/dev/null || echo 0; }
heard() { [ "$(lines "$1")" -gt 0 ]; } # SINK_LOG
listening() { # NETNS: a sink listens on UDP port 9000 (0x2328) there
  nsenter --net="/run/netns/$1" cat /proc/net/udp | grep -q ':2328 '
}
sinks_listening() { listening udp-a && listening udp-b; }
sinks() { # a fresh sink per backend (netcat-traditional serves the first peer it hears from)
  for n in udp-a udp-b; do
    [ -f "$W/$n.pid" ] && kill "$(cat "$W/$n.pid")" 2>/dev/null
    : > "$W/$n.log"
    nsenter --net=/run/netns/$n nc.traditional -u -l -p 9000 > "$W/$n.log" 2>/dev/null &
    echo $! > "$W/$n.pid"
  done
  wait_for 5 "the sinks to listen" sinks_listening
}
reaches() { # NAME SINK SOURCE_PORT: within 3 s, the sink hears from the flow
  t0=$(now)
  wait_for 3 "$2 to hear the flow" heard "$W/$2.log" 2>/dev/null
  got=$(lines "$W/$2.log"); d=$(awk "BEGIN{print $(now) - $t0}")
  say "$1: conntrack now:"; ct "$3"
  check "$1: the flow from port $3 reaches $2 within 3 s of the sync ($got datagrams, $d s)" [ "$got" -gt 0 ]
}

round() { # move|zero NAME IP PORT SOURCE_PORT
  kind=$1 name="$1 $2" ip=$3 port=$4 sport=$5
  service $A=test-node $B=node-b
  sinks
  # one datagram per nc run, always from the same source port: one conntrack entry, and an ICMP
  # error (no endpoint) cannot end the flow
  # (the pace of the flow, on purpose: a datagram every 50 ms)
  (i=0; while [ $i -lt 600 ]; do echo "$name $i" | in_client nc.traditional -u -q 0 -p "$sport" "$ip" "$port" 2>/dev/null
     i=$((i + 1)); sleep 0.05; done) &
  flow=$!
  first=""
  first_heard() { for n in udp-a udp-b; do heard "$W/$n.log" && first=$n; done; [ -n "$first" ]; }
  wait_for 10 "a backend to hear the flow" first_heard 2>/dev/null
  if [ -z "$first" ]; then bad "$name: the flow from port $sport reached no backend"; else
    say "$name: flow to $ip:$port from port $sport is on $first; conntrack:"; ct "$sport"
    if [ "$kind" = move ]; then
      if [ "$first" = udp-a ]; then service $B=node-b; sinks; reaches "$name" udp-b "$sport"
      else service $A=test-node; sinks; reaches "$name" udp-a "$sport"; fi
    else
      service; sleep 2; say "$name: no endpoints for 2 s; conntrack:"; ct "$sport" # (2 s without endpoints: on purpose)
      service $A=test-node; sinks; reaches "$name" udp-a "$sport"
    fi
  fi
  kill "$flow" 2>/dev/null; sleep 0.3 # on purpose: a datagram the killed flow has in flight lands before the next round
}
round move ClusterIP 10.96.0.50 9000 41001
round move externalIP 203.0.113.50 9000 41003
round zero NodePort $NODE_IP 30950 41005

say "claimed: a flow to 203.0.113.50:9000 starts while the address is routed to udp-b's link, then the Service claims it"
rm -f "$M/udp-sink.yaml"; wait_converged 30 >/dev/null || bad "claimed: not converged without the Service"
/sbin/ip route add 203.0.113.50/32 dev vudpb
(i=0; while [ $i -lt 600 ]; do echo "claimed $i" | in_client nc.traditional -u -q 0 -p 41006 203.0.113.50 9000 2>/dev/null
   i=$((i + 1)); sleep 0.05; done) &
flow=$!
has_entry() { ct 41006 | grep -q "$1"; } # PATTERN
wait_for 10 "a conntrack entry for the flow" has_entry . 2>/dev/null
say "claimed: conntrack before the Service:"; ct 41006
/sbin/ip route del 203.0.113.50/32 dev vudpb
service $A=test-node $B=node-b
t0=$(now)
wait_for 3 "the flow masqueraded" has_entry 'dst=10.244.0.1 ' 2>/dev/null
d=$(awk "BEGIN{print $(now) - $t0}")
say "claimed: conntrack after the sync:"; ct 41006
check "claimed: within 3 s of the sync the flow goes through IPVS and is masqueraded (reply to the node, ${d} s)" \
  sh -c "grep -E 'sport=41006 ' /proc/net/nf_conntrack | grep -qE 'src=10\.244\.(1\.20|3\.21) dst=10\.244\.0\.1 '"
kill "$flow" "$(cat "$W/udp-a.pid")" "$(cat "$W/udp-b.pid")" 2>/dev/null

rm -f "$M/udp-sink.yaml"
wait_converged 30 >/dev/null || bad "not converged after removing the test Service"
grep -o 'conntrack_us=[0-9]*' "$(proxier_log)" | cut -d= -f2 | awk '$1 > 100' | sort -n |
  awk '{a[NR] = $1} END {print "conntrack cleanups: " NR ", median " a[int((NR + 1) / 2)] " us, max " a[NR] " us"}' | indent
check "the kernel filtered the proxier's conntrack dumps (CTA_FILTER: an entry to no virtual server is in the table, none came back)" \
  sh -c "grep -q 'sport=41009 ' /proc/net/nf_conntrack && ! grep -q 'ignored the conntrack dump filter' '$(proxier_log)'"
check "every conntrack listing and delete succeeded" sh -c "! grep -E 'cannot (list|delete) (stale )?UDP conntrack' '$(proxier_log)'"
finish
