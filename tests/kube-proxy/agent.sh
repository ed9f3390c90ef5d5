#!/bin/sh
# The guest agent of the kube-proxy parity check: one command per call (hack/parity-kube-proxy.sh's
# `agent CMD ARGS`, through busybox httpd's CGI, www/cgi-bin/agent). Commands:
#   ping                    answers pong
#   run PROXIER CLUSTER [LIMIT]  PROXIER is kube-proxy or kipvs; the objects of cluster CLUSTER are in the API.
#                           Puts the cluster's node addresses on a dummy interface node0 (clusters/CLUSTER/addrs),
#                           runs the proxier with clusters/CLUSTER/PROXIER.yaml until it has converged, prints
#                           the kernel's state, stops it and removes all it programmed. Output: one
#                           `ipvs LINE` per `ipvsadm -Sn` line and one `bind ADDRESS` per address on kube-ipvs0,
#                           sorted, then `seconds S` (start to the converged state first seen), `cpu S` (user +
#                           system) and `maxrss KB` (peak RSS) of the proxier's process (busybox time -v). Exit 1
#                           (with the log's tail) when the proxier fails or does not converge within LIMIT seconds (120).
#                           kube-proxy: its IPVS mode, converged when it has synced at least once
#                           (kubeproxy_sync_proxy_rules_duration_seconds_count on 127.0.0.1:10249) and the
#                           state has not changed for 3 s. kipvs: `kipvs-proxier run --once` (it syncs once
#                           the API's lists are complete, then exits).
#   finish RC               ends the run (guest.sh prints PASS/FAIL kube-proxy)
. /payload/tests/lib.sh
K=/payload/kube-proxy
PATH=$K/bin:$PATH # iptables, ipset, conntrack for kube-proxy

state() {
  ipvsadm -Sn | sort | sed 's/^/ipvs /'
  ip -o addr show dev kube-ipvs0 2>/dev/null | awk '{sub(/\/[0-9]+$/, "", $4); print "bind " $4}' | sort
}
flush() { # everything either proxier programs
  ipvsadm -C
  ip link del kube-ipvs0 2>/dev/null
  for t in iptables ip6tables; do
    for tb in nat filter; do "$t" -t "$tb" -F 2>/dev/null; "$t" -t "$tb" -X 2>/dev/null; done
  done
  ipset flush 2>/dev/null; ipset destroy 2>/dev/null
  nft flush ruleset 2>/dev/null
  [ -z "$(ipvsadm -Sn)" ] && ! ip link show kube-ipvs0 > /dev/null 2>&1
}
node_up() { # ADDRS_FILE
  ip link add node0 type dummy && ip link set node0 up || return 1
  for a in $(cat "$1"); do
    case $a in *:*) ip -6 addr add "$a/128" dev node0 nodad ;; *) ip addr add "$a/32" dev node0 ;; esac || return 1
  done
}
fail() { echo "$1"; echo "--- $2 (last 40 lines)"; tail -n 40 "$2"; flush; ip link del node0 2>/dev/null; exit 1; }

cmd=$1; shift
case $cmd in
  ping) echo pong ;;
  run)
    proxier=$1; C=$K/clusters/$2; limit=${3:-120}
    [ -d "$C" ] || { echo "no cluster $2"; exit 2; }
    flush || { echo "the kernel still holds a table before the run"; exit 1; }
    node_up "$C/addrs" || { echo "cannot add the node addresses"; ip link del node0 2>/dev/null; exit 1; }
    log=$W/$proxier.$2.log; t0=$(now)
    case $proxier in
      kube-proxy)
        time -v -o "$W/rusage" "$K/kube-proxy" --config "$C/kube-proxy.yaml" --v=2 > "$log" 2>&1 &
        tpid=$!; pid=""; i=0
        while [ -z "$pid" ] && [ $i -lt 25 ]; do
          sleep 0.2; pid=$(cut -d' ' -f1 "/proc/$tpid/task/$tpid/children" 2>/dev/null); i=$((i + 1))
        done
        [ -n "$pid" ] || fail "kube-proxy did not start" "$log"
        i=0; last=""; stable=0; t1=0
        while [ $stable -lt 6 ]; do
          kill -0 "$pid" 2> /dev/null || fail "kube-proxy exited" "$log"
          [ $i -lt $((limit * 2)) ] || { kill "$pid"; fail "kube-proxy did not converge in $limit s" "$log"; }
          n=$(wget -qO- http://127.0.0.1:10249/metrics 2>/dev/null |
            awk '$1 == "kubeproxy_sync_proxy_rules_duration_seconds_count" { print int($2) }')
          s=$(state | md5sum)
          [ "$s" = "$last" ] || t1=$(awk "BEGIN{print $(now) - $t0}") # the state as it was first seen
          if [ "${n:-0}" -ge 1 ] && [ "$s" = "$last" ]; then stable=$((stable + 1)); else stable=0; fi
          last=$s; i=$((i + 1)); sleep 0.5
        done
        # (it falls back to iptables mode when it cannot use IPVS: no virtual server at all, not even the
        # kubernetes Service's)
        grep -q 'Using ipvs Proxier' "$log" && [ -n "$(ipvsadm -Sn)" ] || { kill "$pid"; fail "kube-proxy is not in IPVS mode" "$log"; }
        state
        kill "$pid"; i=0
        while alive "$tpid" && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
        alive "$pid" && kill -9 "$pid" ;;
      kipvs)
        NO_COLOR=1 RUST_LOG=info,kube_client::client::builder=off time -v -o "$W/rusage" timeout "$limit" "$KIPVS" run --once \
          --node "$NODE" --kubeconfig "$K/kipvs-kubeconfig" --config "$C/kipvs.yaml" > "$log" 2>&1 ||
          fail "kipvs-proxier run --once failed" "$log"
        t1=$(awk "BEGIN{print $(now) - $t0}")
        state ;;
      *) echo "unknown proxier $proxier"; exit 2 ;;
    esac
    grep -E '^[EW][0-9]{4}' "$log" | head -n 20 | sed 's/^/log /' # its errors and warnings, for the record
    echo "seconds $t1"
    awk -F': ' '/User time/ { u = $2 } /System time/ { s = $2 } /Maximum resident/ { m = $2 }
      END { printf "cpu %.2f\nmaxrss %d\n", u + s, m }' "$W/rusage"
    flush || { echo "the table is not empty after the flush"; exit 1; }
    ip link del node0 ;;
  finish) echo "$1" > "$W/kube-proxy.done" ;;
  *) echo "unknown command $cmd"; exit 2 ;;
esac
