#!/bin/sh
# The guest agent of the end to end: one command per call (hack/test-e2e.sh's `agent CMD ARGS`, through
# busybox httpd's CGI, www/cgi-bin/agent). Commands:
#   ping                          answers pong
#   clock                         the guest's clock (seconds since boot, /proc/uptime, 10 ms steps)
#   wallclock                     the guest's wall clock (date +%s, busybox has no %N: the load log's times)
#   pod NAME IP [IP6]             a backend pod: netns NAME with IP (and IPv6 address IP6, behind fd00:10:244::1
#                                 as in topology.sh), e2e_traffic serve --name NAME on 8080 (both families)
#   proxier-start|proxier-restart `kipvs-proxier run --kubeconfig` (SIGTERM first for restart); the real
#                                 kernel dataplane (IPVS + nftables)
#   proxier-start-pidns           proxier-start in a PID namespace of its own (as the DaemonSet runs it, without
#                                 hostPID: it sees no other process); proxier-stop stops it alike
#   proxier-stop                  SIGTERM to the proxier, until it has exited
#   table                         ipvsadm -Sn, sorted
#   binds                         the addresses on kube-ipvs0, sorted
#   wait PROTO VS RS WANT SECONDS until the real server RS of virtual server VS has weight WANT, or WANT is
#                                 "absent" and it is gone, or "drained" and it is at weight 0 or gone
#                                 (polling ipvsadm); prints the clock then; exit 1 on timeout
#   probe tcp|udp IP:PORT         one request from the client netns; prints the answering pod
#   vip-add IP                    IP/32 on vclient, the client's link: a second local address (a keepalived VIP)
#   load-start TCP UDP [TCP2 [UDP2]]
#                                 e2e_traffic load from the client netns (25 connections/s, 5 datagrams/s,
#                                 4 long-lived connections; TCP2 and UDP2 take the load in turn with TCP and UDP,
#                                 an IPv6 one counted apart too)
#   load-stats                    its counters so far; load-stop stops it and prints the final ones
#   load-log                      the load's log: failures, slow requests, pauses (with wall-clock times)
#   log [N]                       the proxier log's last N lines
#   kube-proxy-start [CONFIG]     kube-proxy (IPVS mode; /payload/kube-proxy from hack/test-takeover.sh: the
#                                 binary, config.yaml, kubeconfig, the iptables/ipset userland and modules)
#                                 against the host's apiserver; answers once it has synced in the mode of
#                                 its configuration (CONFIG: another file of /payload/kube-proxy)
#   kube-proxy-stop               SIGTERM to kube-proxy, until it has exited (it leaves its rules behind)
#   kube-proxy-cleanup            kube-proxy --cleanup (flushes IPVS, removes its rules and sets)
#   conns-save                    keeps the established IPVS connection entries (ipvsadm -Lnc); prints their count
#   conns-kept                    how many of the kept entries are still there (same protocol, client,
#                                 virtual and real server)
#   leftovers                     kube-proxy's iptables chains (both families) and ipsets left: `chain TABLE
#                                 NAME` and `ipset NAME` lines
#   metric NAME                   the lines of the proxier's metric NAME (127.0.0.1:10249)
#   kipvs-table                   `present` or `absent`: kipvs's nftables table inet kipvs
#   timeouts                      the kernel's IPVS timeouts in seconds: `TCP TCPFIN UDP`
#   finish RC                     ends the run (guest.sh prints PASS/FAIL e2e)
. /payload/tests/lib.sh
E=/payload/tests/e2e
TRAFFIC=/payload/bin/e2e_traffic
KIPVS_KUBECONFIG=$E/kubeconfig
# each dataplane stage's duration (nftables transaction, IPVS stages), to see where a slow sync spends it
export RUST_LOG=info,kipvs_proxier::ops=debug,kipvs_proxier::dataplane::kernel=debug,kube_client::client::builder=off
cmd=$1; shift
case $cmd in
  ping) echo pong ;;
  clock) now ;;
  wallclock) date +%s ;;
  pod)
    n=$1; addr=$2; addr6=${3:-}; i=$(( $(cat "$W/vpod.n" 2>/dev/null || echo 100) + 1 )); echo "$i" > "$W/vpod.n"
    printf 'netns add %s\nlink add vpod%s type veth peer name eth0 netns %s\naddr add 10.244.0.1/32 dev vpod%s\nlink set vpod%s up\nroute add %s/32 dev vpod%s\n' \
      "$n" "$i" "$n" "$i" "$i" "$addr" "$i" | /sbin/ip -batch - &&
    printf 'link set lo up\naddr add %s/32 dev eth0\nlink set eth0 up\nroute add 10.244.0.1 dev eth0\nroute add default via 10.244.0.1 dev eth0\n' \
      "$addr" | /sbin/ip -n "$n" -batch - || exit 1
    if [ -n "$addr6" ]; then # IPv6 in batches of its own, after IPv4's (ip -batch stops at its first error)
      printf 'addr add fd00:10:244::1/128 dev vpod%s nodad\nroute add %s/128 dev vpod%s\n' "$i" "$addr6" "$i" | /sbin/ip -batch - &&
      printf 'addr add %s/128 dev eth0 nodad\nroute add fd00:10:244::1 dev eth0\nroute add default via fd00:10:244::1 dev eth0\n' \
        "$addr6" | /sbin/ip -n "$n" -batch - || exit 1
    fi
    nsenter --net="/run/netns/$n" setsid "$TRAFFIC" serve --name "$n" --port 8080 < /dev/null > "$W/$n.log" 2>&1 &
    # answering directly from the root netns (no IPVS) before it is listed anywhere, on each family it has
    answers() {
      [ "$("$TRAFFIC" probe tcp "$addr:8080" 2>/dev/null)" = "$n" ] &&
        { [ -z "$addr6" ] || [ "$("$TRAFFIC" probe tcp "[$addr6]:8080" 2>/dev/null)" = "$n" ]; }
    }
    wait_for 10 "pod $n to answer" answers 2>/dev/null || { echo "pod $n does not answer"; exit 1; }
    echo "pod $n $addr${addr6:+ $addr6} up" ;;
  proxier-start) proxier_start < /dev/null ;;
  proxier-start-pidns)
    printf '#!/bin/sh\nexec unshare -p -f --mount-proc %s "$@"\n' "$KIPVS" > "$W/kipvs-pidns"; chmod +x "$W/kipvs-pidns"
    KIPVS=$W/kipvs-pidns proxier_start < /dev/null
    u=$(cat "$W/proxier.pid"); c=""
    child() { c=$(awk -v u="$u" '$4 == u { print $1 }' /proc/[0-9]*/stat 2>/dev/null | head -n1); [ -n "$c" ]; }
    wait_for 5 "the proxier in its PID namespace" child || exit 1
    echo "$c" > "$W/proxier.pid" ;; # the proxier itself (its namespace's init): proxier-stop signals it
  proxier-restart) proxier_stop && proxier_start < /dev/null ;;
  proxier-stop) proxier_stop ;;
  table) kernel_table ;;
  binds) kernel_bind ;;
  wait)
    proto=-$(echo "$1" | cut -c1); vs=$2; rs=$3; want=$4
    read -r up _ < /proc/uptime; end=$(( ${up%.*} + ${5:-30} ))
    while [ "${up%.*}" -lt "$end" ]; do
      w=$(ipvsadm -Sn | awk -v p="$proto" -v vs="$vs" -v rs="$rs" '$1 == "-a" && $2 == p && $3 == vs && $5 == rs { print $NF }')
      read -r up _ < /proc/uptime
      case "$want:${w:-absent}" in "$want:$want" | drained:absent | drained:0) echo "$up"; exit 0 ;; esac
    done
    echo "timed out: $proto $vs $rs is '${w:-absent}', want $want"; exit 1 ;;
  probe) in_client "$TRAFFIC" probe "$1" "$2" ;;
  vip-add) /sbin/ip addr add "$1/32" dev vclient ;;
  load-start)
    rm -f "$W/load.stop" "$W/load.stats"
    nsenter --net=/run/netns/client setsid "$TRAFFIC" load --tcp "$1" ${3:+--tcp "$3"} --udp "$2" ${4:+--udp "$4"} --rate 25 --udp-rate 5 --long 4 \
      --stats "$W/load.stats" --stop "$W/load.stop" < /dev/null > /dev/null 2> "$W/load.log" &
    echo $! > "$W/load.pid"
    wait_for 10 "the load's first stats" test -s "$W/load.stats" || exit 1
    cat "$W/load.stats" ;;
  load-stats) cat "$W/load.stats" ;;
  load-log) grep -v 'talking to' "$W/load.log" ;;
  load-stop)
    touch "$W/load.stop"; p=$(cat "$W/load.pid")
    wait_for 20 "the load to stop" gone "$p" 2>/dev/null
    cat "$W/load.stats"; echo "--- load failures (first 20)"; grep -v 'talking to' "$W/load.log" | head -n 20 ;;
  log) tail -n "${1:-50}" "$(proxier_log)" ;;
  kube-proxy-start)
    kube_proxy_modules
    conf=$KP/${1:-config.yaml}; mode=$(sed -n 's/^mode: *//p' "$conf")
    PATH=$KP/bin:$PATH setsid "$KP/kube-proxy" --config "$conf" --v=2 < /dev/null > "$W/kube-proxy.log" 2>&1 &
    echo $! > "$W/kube-proxy.pid"
    synced() {
      wget -qO- http://127.0.0.1:10249/metrics 2>/dev/null |
        awk '$1 == "kubeproxy_sync_proxy_rules_duration_seconds_count" { n = $2 } END { exit !(n >= 1) }'
    }
    wait_for 120 "kube-proxy's first sync" synced && grep -q "Using ${mode:-ipvs} Proxier" "$W/kube-proxy.log" ||
      { echo "kube-proxy did not sync in ${mode:-ipvs} mode"; tail -n 30 "$W/kube-proxy.log"; exit 1; }
    echo "kube-proxy $(cat "$W/kube-proxy.pid") synced" ;;
  kube-proxy-stop)
    p=$(cat "$W/kube-proxy.pid"); kill "$p"
    wait_for 20 "kube-proxy to exit" gone "$p" || { kill -9 "$p"; exit 1; } ;;
  kube-proxy-cleanup)
    PATH=$KP/bin:$PATH "$KP/kube-proxy" --config "$KP/config.yaml" --cleanup > "$W/kube-proxy-cleanup.log" 2>&1
    echo "kube-proxy --cleanup: exit $?" ;;
  conns-save)
    ipvsadm -Lnc | awk '$3 == "ESTABLISHED" { print $1, $4, $5, $6 }' | sort > "$W/conns"; wc -l < "$W/conns" ;;
  conns-kept)
    ipvsadm -Lnc | awk 'NR > 2 { print $1, $4, $5, $6 }' | sort > "$W/conns.now"
    awk 'NR == FNR { saved[$0]; next } $0 in saved' "$W/conns" "$W/conns.now" | wc -l ;;
  leftovers)
    for t in iptables ip6tables; do
      "$KP/bin/$t-save" 2>/dev/null | awk -v f="$t" '/^\*/ { tb = substr($0, 2) }
        /^:KUBE-/ { print "chain", f, tb, substr($1, 2) }'
    done
    "$KP/bin/ipset" list -n 2>/dev/null | grep '^KUBE-' | sed 's/^/ipset /' ;;
  metric) wget -qO- http://127.0.0.1:10249/metrics | grep "^$1" ;;
  kipvs-table) nft list table inet kipvs > /dev/null 2>&1 && echo present || echo absent ;;
  timeouts) ipvsadm -L --timeout | sed -n 's/^Timeout (tcp tcpfin udp): //p' ;;
  finish) echo "$1" > "$W/e2e.done" ;;
  *) echo "unknown command $cmd"; exit 2 ;;
esac
