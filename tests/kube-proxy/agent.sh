#!/bin/sh
# The guest agent of the kube-proxy parity check: one command per call (hack/parity-kube-proxy.sh's
# `agent CMD ARGS`, through busybox httpd's CGI, www/cgi-bin/agent). Commands:
#   ping                    answers pong
#   run PROXIER CLUSTER [LIMIT]  PROXIER is kube-proxy or kipvs; the objects of cluster CLUSTER are in the API.
#                           Puts the cluster's node addresses on a dummy interface node0 (clusters/CLUSTER/addrs),
#                           runs the proxier with clusters/CLUSTER/PROXIER.yaml until it has converged, prints
#                           the kernel's state, stops it and removes all it programmed. Output: one
#                           `ipvs LINE` per `ipvsadm -Sn` line and one `bind ADDRESS` per address on kube-ipvs0,
#                           sorted, then `seconds S` (start to the converged state first seen) and `cpu S` (user +
#                           system, busybox time -v; no RSS: its "Maximum resident set size" is pages, not KiB)
#                           of the proxier's process. Exit 1 (with the log's tail) when the proxier fails or does
#                           not converge within LIMIT seconds (120).
#                           kube-proxy: its IPVS mode, converged once a sync has completed (synced) and
#                           the state has not changed for 3 s since. kipvs: `kipvs-proxier run --once` (it
#                           syncs once the API's lists are complete, then exits).
#   clock                   the guest's clock (seconds since boot, /proc/uptime, 10 ms steps)
#   start PROXIER CLUSTER VS RS [LIMIT]  (hack/bench-vs-kube-proxy.sh) as run, but the proxier keeps running
#                           (kipvs: `kipvs-proxier run`; kube-proxy-nft: kube-proxy with
#                           clusters/CLUSTER/kube-proxy-nft.yaml, its nftables mode). Converged at the end of the
#                           sync that completed the table: the first sync (synced:
#                           kubeproxy_sync_proxy_rules_last_timestamp_seconds, which every proxier here sets at the
#                           end of a sync) that ended after the last poll (every 0.5 s) at which the kernel held
#                           fewer than VS virtual or RS real servers (/proc/net/ip_vs; 0 0 and kube-proxy-nft:
#                           the first completed sync). Prints `seconds S` (process start to that sync's end, both
#                           the guest's wall clock), `seen S` (start to the poll that saw it), `counts V R` and the
#                           usage lines; exit 1 (the proxier stopped) when it fails or does not converge within
#                           LIMIT (600)
#   usage                   of the running proxier: `cpu S` (user + system, its waited-for children's
#                           included: kube-proxy's iptables-restore and ipset), `maxrss KB` (VmHWM),
#                           `sync_count N`, `sync_sum S` (kubeproxy_sync_proxy_rules_duration_seconds: every
#                           sync) and `full_sync_count N`, `full_sync_sum S`, `full_sync_metric NAME` (the
#                           histogram of full syncs only: FULL_SYNC_METRICS's first that the proxier exports, or
#                           the every-sync one, named so), all from 127.0.0.1:10249
#   stop                    prints usage, stops the running proxier, removes all it programmed
#   watch-start VS SVC VIEW SYNC|watch-peek|watch-stop  polls every ~0.05 s from start to stop the endpoints of
#                           Service SVC (VS its ClusterIP:port) as the kernel holds them: VIEW ipvs: `ipvsadm -Ln -t
#                           VS`; VIEW nft: kube-proxy's nftables endpoint chains of SVC, printed as ipvsadm's lines
#                           ("  -> ADDRESS:PORT Masq 1 0 0"); with SYNC 1 then `S TIMESTAMP` (the proxier's
#                           kubeproxy_sync_proxy_rules_last_timestamp_seconds, the guest's wall clock); each poll
#                           ends with `T AFTER BEFORE [WALL]` (the clock after and before the poll, with SYNC 1 the
#                           wall clock too). peek prints the polls so far, stop stops polling and prints them all
#   finish RC               ends the run (guest.sh prints PASS/FAIL kube-proxy)
. /payload/tests/lib.sh
K=$KP # tests/vm/lib.sh
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
kube_proxy() { # CONFIG LOG [WRAPPER...]: starts kube-proxy in the background, $! its process or the wrapper's
  conf=$1 log=$2; shift 2
  "$@" "$K/kube-proxy" --config "$conf" --v=2 > "$log" 2>&1 < /dev/null &
}
kipvs() { # CONFIG LOG ONCE [WRAPPER...]: starts `kipvs-proxier run [--once]` in the background, $! as above
  conf=$1 log=$2 once=$3; shift 3
  NO_COLOR=1 RUST_LOG=info,kube_client::client::builder=off "$@" "$KIPVS" run $once --node "$NODE" \
    --kubeconfig "$K/kipvs-kubeconfig" --config "$conf" > "$log" 2>&1 < /dev/null &
}
ipvs_mode() { # LOG: kube-proxy falls back to iptables mode when it cannot use IPVS
  grep -q 'Using ipvs Proxier' "$1"
}
# The histograms of full syncs only, the first the proxier exports is read (NAME or NAME{LABELS}): kube-proxy's
# (1.28 and later, its iptables and nftables modes; its IPVS mode makes only full syncs and exports none) and
# kipvs's
FULL_SYNC_METRICS='kubeproxy_sync_full_proxy_rules_duration_seconds kipvs_full_sync_duration_seconds'
metrics() { wget -qO- http://127.0.0.1:10249/metrics 2>/dev/null; }
wall() { adjtimex | awk '$1 == "time.tv_sec:" { s = $2 } $1 == "time.tv_usec:" { u = $2 } END { printf "%d.%06d\n", s, u }'; }
usage() { # PID
  sed 's/.*) //' "/proc/$1/stat" | awk '{ printf "cpu %.2f\n", ($12 + $13 + $14 + $15) / 100 }'
  awk '$1 == "VmHWM:" { print "maxrss " $2 }' "/proc/$1/status"
  metrics | awk -v full="$FULL_SYNC_METRICS" '
    BEGIN { n = split(full, names, " ")
      for (i = 1; i <= n; i++) { # NAME{LABELS} -> NAME_count{LABELS}
        j = index(names[i] "{", "{"); base = substr(names[i], 1, j - 1); lab = substr(names[i], j)
        cn[base "_count" lab] = i; sn[base "_sum" lab] = i } }
    $1 == "kubeproxy_sync_proxy_rules_duration_seconds_count" { print "sync_count " int($2); ac = int($2) }
    $1 == "kubeproxy_sync_proxy_rules_duration_seconds_sum" { print "sync_sum " $2; as = $2 }
    $1 in cn { c[cn[$1]] = int($2) }
    $1 in sn { s[sn[$1]] = $2 }
    END {
      for (i = 1; i <= n; i++) if (i in c) { printf "full_sync_count %d\nfull_sync_sum %s\nfull_sync_metric %s\n", c[i], s[i], names[i]; exit }
      if (ac != "") printf "full_sync_count %d\nfull_sync_sum %s\nfull_sync_metric every-sync\n", ac, as }'
}
# synced LOG: 0 once the proxier (LOG its log) has completed a sync of every IP family it runs, 1 before, 2 when
# an iptables-restore of a sync failed. kubeproxy_sync_proxy_rules_last_timestamp_seconds is set at the end
# of a successful sync, after the stale virtual servers and bound addresses are removed (1.20:
# pkg/proxy/ipvs/proxier.go:1657; kipvs the same), but a dual-stack kube-proxy's two proxiers (one a family)
# share it: there the duration histogram's count (one per sync and family, failed ones included:
# proxier.go:1043, 1617) must reach 2 as well. A failed iptables-restore (proxier.go:1611-1617, e.g. a
# missing match module) leaves the sync unfinished: the run fails rather than wait for a state it never reaches.
synced() {
  fams=1; grep -qi 'dualStackProxier' "$1" 2>/dev/null && fams=2
  wget -qO- http://127.0.0.1:10249/metrics 2>/dev/null | awk -v fams=$fams '
    $1 == "kubeproxy_sync_proxy_rules_last_timestamp_seconds" && $2 + 0 > 0 { done = 1 }
    $1 == "kubeproxy_sync_proxy_rules_duration_seconds_count" { n = $2 + 0 }
    $1 == "kubeproxy_sync_proxy_rules_iptables_restore_failures_total" && $2 + 0 > 0 { failed = 1 }
    END { exit failed ? 2 : !(done && n >= fams) }'
}
counts() { # virtual and real servers in the kernel (an IPv6 real server's address is in brackets)
  awk '/^(TCP|UDP|SCTP|FWM) / { v++ } /^  -> [0-9A-F[]/ { r++ } END { print v + 0, r + 0 }' /proc/net/ip_vs
}

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
        kube_proxy "$C/kube-proxy.yaml" "$log" time -v -o "$W/rusage"
        tpid=$!; pid=""; i=0
        while [ -z "$pid" ] && [ $i -lt 25 ]; do
          sleep 0.2; pid=$(cut -d' ' -f1 "/proc/$tpid/task/$tpid/children" 2>/dev/null); i=$((i + 1))
        done
        [ -n "$pid" ] || fail "kube-proxy did not start" "$log"
        i=0; last=""; stable=0; t1=0
        while [ $stable -lt 6 ]; do
          kill -0 "$pid" 2> /dev/null || fail "kube-proxy exited" "$log"
          [ $i -lt $((limit * 2)) ] || { kill "$pid"; fail "kube-proxy did not converge in $limit s" "$log"; }
          ok=0; synced "$log" && ok=1 || [ $? = 1 ] || { kill "$pid"; fail "kube-proxy: an iptables-restore failed" "$log"; }
          # (synced is read before the state: the state read is that sync's or a later one's)
          s=$(state | md5sum)
          [ "$s" = "$last" ] || t1=$(awk "BEGIN{print $(now) - $t0}") # the state as it was first seen
          if [ $ok = 1 ] && [ "$s" = "$last" ]; then stable=$((stable + 1)); else stable=0; fi
          last=$s; i=$((i + 1)); sleep 0.5
        done
        # (it falls back to iptables mode when it cannot use IPVS: no virtual server at all, not even the
        # kubernetes Service's)
        ipvs_mode "$log" && [ -n "$(ipvsadm -Sn)" ] || { kill "$pid"; fail "kube-proxy is not in IPVS mode" "$log"; }
        state
        kill "$pid"; i=0
        while alive "$tpid" && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
        alive "$pid" && kill -9 "$pid" ;;
      kipvs)
        kipvs "$C/kipvs.yaml" "$log" --once time -v -o "$W/rusage" timeout "$limit"
        wait $! ||
          fail "kipvs-proxier run --once failed" "$log"
        t1=$(awk "BEGIN{print $(now) - $t0}")
        state ;;
      *) echo "unknown proxier $proxier"; exit 2 ;;
    esac
    grep -E '^[EW][0-9]{4}' "$log" | head -n 20 | sed 's/^/log /' # its errors and warnings, for the record
    echo "seconds $t1"
    awk -F': ' '/User time/ { u = $2 } /System time/ { s = $2 } END { printf "cpu %.2f\n", u + s }' "$W/rusage"
    flush || { echo "the table is not empty after the flush"; exit 1; }
    ip link del node0 ;;
  clock) now ;;
  start)
    proxier=$1; C=$K/clusters/$2; vs=$3; rs=$4; limit=${5:-600}
    [ -d "$C" ] || { echo "no cluster $2"; exit 2; }
    flush || { echo "the kernel still holds a table before the run"; exit 1; }
    node_up "$C/addrs" || { echo "cannot add the node addresses"; ip link del node0 2>/dev/null; exit 1; }
    log=$W/$proxier.$2.log; t0=$(now); w0=$(wall)
    case $proxier in
      kube-proxy|kube-proxy-nft) kube_proxy "$C/$proxier.yaml" "$log" ;;
      kipvs) kipvs "$C/kipvs.yaml" "$log" "" ;;
      *) echo "unknown proxier $proxier"; exit 2 ;;
    esac
    pid=$!; echo "$pid" > "$W/bench.pid"; echo "$log" > "$W/bench.log"
    give_up() { kill "$pid" 2>/dev/null; fail "$1" "$log"; }
    last_sync() { metrics | awk '$1 == "kubeproxy_sync_proxy_rules_last_timestamp_seconds" { printf "%.6f\n", $2 }'; }
    # lacking: the wall clock of the last poll whose kernel lacked part of the table; the sync that completed it
    # ended after that (kube-proxy 1.20 can end a sync with part of the table: its first at 10,000 Services held
    # 2,275 of 10,001 virtual servers)
    lacking=$w0 done_at=0
    while :; do
      alive "$pid" || fail "$proxier exited" "$log"
      [ "$(awk "BEGIN{print ($(now) - $t0 < $limit)}")" = 1 ] || give_up "$proxier did not converge in $limit s ($(counts))"
      w=$(wall)
      case $proxier in kube-proxy-nft) set -- 0 0 ;; *) set -- $(counts) ;; esac
      if [ "$1" -lt "$vs" ] || [ "$2" -lt "$rs" ]; then lacking=$w
      elif synced "$log"; then
        done_at=$(last_sync)
        [ "$(awk "BEGIN{print ($done_at > $lacking)}")" = 1 ] && break
      else [ $? = 1 ] || give_up "$proxier: an iptables-restore failed"; fi
      sleep 0.5
    done
    echo "seconds $(awk "BEGIN{printf \"%.2f\", $done_at - $w0}")"
    echo "seen $(awk "BEGIN{print $(now) - $t0}")"
    echo "counts $(counts)"
    [ "$proxier" != kube-proxy ] || ipvs_mode "$log" || give_up "kube-proxy is not in IPVS mode"
    usage "$pid" ;;
  usage) usage "$(cat "$W/bench.pid")" ;;
  stop)
    pid=$(cat "$W/bench.pid"); log=$(cat "$W/bench.log")
    alive "$pid" || fail "the proxier had exited" "$log"
    usage "$pid"; grep -E '^[EW][0-9]{4}|ERROR' "$log" | head -n 20 | sed 's/^/log /'
    kill "$pid"; i=0
    while alive "$pid" && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
    alive "$pid" && kill -9 "$pid"
    flush || { echo "the table is not empty after the flush"; exit 1; }
    ip link del node0 ;;
  watch-start)
    vs=$1 svc=$2 view=$3 sync=$4
    rm -f "$W/watch" "$W/watch.stop"
    while [ ! -f "$W/watch.stop" ]; do
      read -r before _ < /proc/uptime
      case $view in
        ipvs) ipvsadm -Ln -t "$vs" ;;
        # kube-proxy's chain endpoint-HASH-NS/SVC/PROTO/PORTNAME__ADDRESS/PORT (pkg/proxy/nftables)
        nft) nft list chains ip kube-proxy 2>/dev/null |
          sed -n "s#.*chain endpoint-[^ /]*-[^ /]*/$svc/[^ ]*__\([0-9.]*\)/\([0-9]*\) .*#  -> \1:\2 Masq 1 0 0#p" ;;
      esac
      read -r after _ < /proc/uptime
      if [ "$sync" = 1 ]; then
        metrics | awk '$1 == "kubeproxy_sync_proxy_rules_last_timestamp_seconds" { printf "S %.6f\n", $2 }'
        echo "T $after $before $(wall)"
      else echo "T $after $before"; fi
      sleep 0.05
    done > "$W/watch" 2>&1 < /dev/null &
    echo $! > "$W/watch.pid" ;;
  watch-peek) cat "$W/watch" ;;
  watch-stop)
    touch "$W/watch.stop"; p=$(cat "$W/watch.pid"); i=0
    while alive "$p" && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
    cat "$W/watch" ;;
  finish) echo "$1" > "$W/kube-proxy.done" ;;
  *) echo "unknown command $cmd"; exit 2 ;;
esac
