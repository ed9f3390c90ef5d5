# Shared helpers for the guest-side VM tests (POSIX sh, busybox). Sourced by run.sh and every test.
# Layout in the guest: /payload/tests (this dir), /payload/manifests/cluster (the example cluster),
# /payload/bin/kipvs-proxier and /payload/bin/nft (wrappers that run the proxier image's, chrooted in
# /payload/image). Tests work on a copy of the manifests in $M, which they may edit.
PATH=/payload/bin:$PATH

# busybox sh runs its own applets before $PATH: its `ip` lacks netns/veth/dummy, so force iproute2
ip() { /sbin/ip "$@"; }

T=/payload/tests
. "$T/init.sh" # say, ok, bad, check, wait_for, now (hack/lib/init.sh)
KIPVS=${KIPVS:-/payload/bin/kipvs-proxier}
NODE=test-node
NODE_IP=192.168.100.1 # the Node's InternalIP; bound on vclient, the veth towards the client netns
W=/tmp/kipvs          # scratch: live manifests, proxier logs, snapshots
M=$W/manifests
TEST=$(basename "$0" .sh); TEST=${TEST#[0-9][0-9]-}

skip() { echo "SKIP $TEST: $*"; exit 0; }
finish() { # the one result line per test that hack/test-vm.sh looks for
  if [ "$fail" = 0 ]; then echo "PASS $TEST"; else echo "FAIL $TEST: $FIRST_FAILURE"; exit 1; fi
}
indent() { sed 's/^/    /'; }

# ---- the proxier -------------------------------------------------------------------------------
# the node's addresses on every interface but kube-ipvs0, as `kipvs-proxier run` reads them (NodePorts listen on
# them: 192.168.100.1 and the pods' gateway 10.244.0.1, as kube-proxy IPVS; the proxier skips loopback, fe80::)
local_addresses() { ip -o addr show | awk '$2 != "kube-ipvs0" { sub(/\/.*/, "", $4); print $4 }' | sort -u; }
plan() { "$KIPVS" plan --node "$NODE" --manifests "$M" $(local_addresses | sed 's/^/--local-address /') "$@"; }
# bind addresses from `plan --format json` ("bind_addresses": [...], camelCase accepted too), one per
# line, prefix length dropped
plan_bind() {
  plan --format json | tr -d ' \n\t' | sed -nE 's/.*"(bind_addresses|bindAddresses)":\[([^]]*)\].*/\2/p' |
    grep -oE '[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+' | sort -u
}
kernel_bind() { ip -o -4 addr show dev kube-ipvs0 2>/dev/null | awk '{print $4}' | sed 's#/.*##' | sort -u; }
kernel_table() { ipvsadm -Sn | sort; }

alive() { # PID: running and not a zombie
  [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat"
}
proxier_pid() { cat "$W/proxier.pid" 2>/dev/null; }
proxier_log() { echo "$W/proxier.$(cat "$W/proxier.n" 2>/dev/null || echo 0).log"; }
# what the proxier reads: the API server when KIPVS_KUBECONFIG is set (the end to end), else the manifests
proxier_source() { if [ -n "${KIPVS_KUBECONFIG:-}" ]; then echo "--kubeconfig $KIPVS_KUBECONFIG"; else echo "--manifests $M"; fi; }
# kube-proxy (IPVS mode, the test bed's release) and its userland, when the payload has them (hack/lib/kube-proxy-vm.sh,
# hack/test-e2e.sh with E2E_PROXIER=kube-proxy): hack/vm/kube-proxy-userland.sh's layout
KP=/payload/kube-proxy
kube_proxy_modules() { # loads the iptables and ipset modules kube-proxy needs (KP/modules/order), those not loaded yet
  for m in $(cat "$KP/modules/order"); do
    grep -q "^${m%.ko} " /proc/modules || insmod "$KP/modules/$m" || echo "kube-proxy: insmod $m failed"
  done
}
proxier_start() { # start `kipvs-proxier run` in the background; log to $W/proxier.N.log
  n=$(( $(cat "$W/proxier.n" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$W/proxier.n"
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info,kipvs_proxier::ops=debug,kube_client::client::builder=off} "$KIPVS" run --node "$NODE" $(proxier_source) ${KIPVS_CONFIG:+--config "$KIPVS_CONFIG"} \
    > "$W/proxier.$n.log" 2>&1 &
  echo $! > "$W/proxier.pid"
  say "started kipvs-proxier run (pid $!, log $W/proxier.$n.log)"
}
proxier_ensure() { p=$(proxier_pid); [ -n "$p" ] && alive "$p" || proxier_start; }
proxier_running() { p=$(proxier_pid); [ -n "$p" ] && alive "$p"; }
gone() { ! alive "$1"; } # PID
proxier_stop() { # SIGTERM, then SIGKILL after 10 s; 0 if it is gone
  p=$(proxier_pid); [ -n "$p" ] || return 0
  kill "$p" 2>/dev/null
  wait_for 10 "the proxier to exit on SIGTERM" gone "$p" 2>/dev/null ||
    { say "proxier ignored SIGTERM, killing"; kill -9 "$p"; wait_for 2 "the proxier to exit on SIGKILL" gone "$p"; }
}

# Wait until the kernel's table equals the plan for the current manifests (the proxier re-reads
# the files itself). On timeout, show the difference and the log's tail.
converged() {
  plan > "$W/plan.out" 2> "$W/plan.err" || return 1
  sort "$W/plan.out" > "$W/plan.sorted"; kernel_table > "$W/kernel.sorted"
  cmp -s "$W/plan.sorted" "$W/kernel.sorted"
}
converge_step() { # true once converged (CONVERGED=1) or the proxier is gone (CONVERGED=0)
  if converged; then CONVERGED=1; return 0; fi
  proxier_running && return 1
  CONVERGED=0; say "the proxier is not running"
}
wait_converged() { # [TIMEOUT_S=30]
  CONVERGED=0; t0=$(now)
  wait_for "${1:-30}" "the kernel to equal the plan" converge_step 2>/dev/null
  [ "$CONVERGED" = 0 ] || { say "converged in $(awk "BEGIN{print $(now) - $t0}") s"; return 0; }
  say "not converged after ${1:-30} s; plan (-) vs kernel (+):"
  [ -s "$W/plan.err" ] && indent < "$W/plan.err"
  diff -u "$W/plan.sorted" "$W/kernel.sorted" | indent
  say "proxier log tail:"; tail -n 15 "$(proxier_log)" | indent
  return 1
}

# ---- traffic, always from the client netns (192.168.100.2, routed through the node) -------------
# (busybox nsenter, not `ip netns exec`: a static exec is ~5x cheaper under emulation)
in_client() { nsenter --net=/run/netns/client "$@"; }
# one HTTP request; prints the backend's answer (its pod name) or nothing
http_get() { # IP PORT
  printf 'GET / HTTP/1.0\r\n\r\n' | in_client nc -w 3 "$1" "$2" 2>/dev/null | tail -n1
}
# one UDP datagram; prints the first answer line. stdin stays open 1.5 s (on purpose) so nc waits for the reply
# (0.5 s lost answers that came late on a loaded host: the cold CI-like run saw "- -" while IPVS
# counted the replies)
udp_ask() { # IP PORT
  (echo q; sleep 1.5) | in_client nc.traditional -u -q 0 -w 2 "$1" "$2" 2>/dev/null | head -n1
}
# N requests; prints the answers one per line ("-" for no answer)
many() { # N FUNC IP PORT
  i=0; while [ $i -lt "$1" ]; do a=$("$2" "$3" "$4"); echo "${a:--}"; i=$((i + 1)); done
}
distinct() { sort -u | tr '\n' ' ' | sed 's/ $//'; }

# ---- manifest edits (atomic: write aside, then rename into the watched dir) ------------------------
set_conditions() { # FILE ENDPOINT_IP READY SERVING TERMINATING
  sed "/^  - $2\$/,/terminating:/{s/ready: .*/ready: $3/;s/serving: .*/serving: $4/;s/terminating: .*/terminating: $5/}" \
    "$M/$1" > "$W/edit.tmp" && mv "$W/edit.tmp" "$M/$1"
}

# ---- the node's NodeProxyConfig, the proxier's log, held connections (90-gate-flips.sh, demo.sh) ---
npc() { # REVISION LBIPMODE TERMINATING DRAINING: the NodeProxyConfig for test-node
  cat > "$W/npc.tmp" <<NPC
apiVersion: kipvs.io/v1alpha1
kind: NodeProxyConfig
metadata: {name: test-node}
spec:
  revision: $1
  assignedAt: "2026-11-22T05:00:00Z"
  config:
    featureGates:
      LoadBalancerIPMode: $2
      ProxyTerminatingEndpoints: $3
      KubeProxyDrainingTerminatingNodes: $4
NPC
  mv "$W/npc.tmp" "$M/nodeproxyconfig.yaml"
}
status_applied() { # REVISION: the proxier logged that revision Applied
  grep 'NodeProxyConfig status' "$(proxier_log)" | grep -q "\"observedRevision\":\"$1\",\"phase\":\"Applied\""
}
applied() { # REVISION: wait until the proxier logs that revision Applied
  wait_for 30 "revision $1 Applied" status_applied "$1" 2>/dev/null || { bad "revision $1 not reported Applied"; return 1; }
  ok "revision $1 reported Applied"
}
mark() { wc -l < "$(proxier_log)"; }
ops_since() { tail -n +"$(( $1 + 1 ))" "$(proxier_log)" | grep -o 'op=[A-Za-z]*.*' | sed 's/ *$//'; }
http_code() { # PATH: the status code of the proxier's health server (stdin stays open 1 s, on purpose, for the answer)
  (printf 'GET %s HTTP/1.0\r\n\r\n' "$1"; sleep 1) | nc -w 3 127.0.0.1 10256 2>/dev/null | head -n1 | cut -d' ' -f2
}
metric() { # NAME: its value on the proxier's /metrics (stdin stays open 1 s, on purpose, for the answer)
  (printf 'GET /metrics HTTP/1.0\r\n\r\n'; sleep 1) | nc -w 3 127.0.0.1 10249 2>/dev/null |
    awk -v n="$1" '$1 == n { print $2 }'
}
want_code() { # PATH CODE
  c=$(http_code "$1"); [ "$c" = "$2" ] && ok "$1 answers $2" || bad "$1 answers '$c', want $2"
}
hold() { # NAME IP PORT: open a connection that stays open (no request yet) on fd 3/4 via a fifo
  rm -f "$W/$1.fifo"; mkfifo "$W/$1.fifo"
  in_client nc -w 120 "$2" "$3" < "$W/$1.fifo" > "$W/$1.out" 2>/dev/null &
  echo $! > "$W/$1.pid"
}
established() { # VIP:PORT: prints the real server IP of an ESTABLISHED connection to it; false if none
  ipvsadm -Lnc | awk -v vs="$1" '$3 == "ESTABLISHED" && $5 == vs { sub(/:.*/, "", $6); print $6; found = 1; exit }
    END { exit !found }'
}
held_backend() { # VIP:PORT: the real server IP of the ESTABLISHED connection to it (waits up to 10 s)
  wait_for 10 "an ESTABLISHED connection to $1" established "$1" > /dev/null 2>&1
  established "$1"
}
ask() { # NAME FD: send the request on the held connection, close it, print the answer
  eval "printf 'GET / HTTP/1.0\r\n\r\n' >&$2; exec $2>&-"
  wait "$(cat "$W/$1.pid")" 2>/dev/null; tail -n1 "$W/$1.out"
}
