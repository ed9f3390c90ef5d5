#!/usr/bin/env bash
# The true end to end: kube-apiserver (Debian's 1.20.2, or KIPVS_K8S_BIN's) + etcd on this machine's loopback (hack/control-plane.sh), the
# proxier image's kipvs-proxier (release build, as on a node) in the VM (hack/test-vm.sh --e2e: real kernel
# IPVS + nftables) running `kipvs-proxier run
# --kubeconfig` against that apiserver through QEMU's user-mode network (the guest routes only 10.0.2.2/32,
# which QEMU maps to this machine's loopback), and kipvs-operator here. This script drives it with kubectl
# (and curl for the timed EndpointSlice writes) and asks the guest's agent (tests/vm/e2e/agent.sh, through a
# forwarded loopback port) to start pods, the proxier and the load, and to report the kernel's table.
#
#   1. a dual-stack LoadBalancer Service (ClusterIP, NodePort, load-balancer VIP; TCP and UDP; IPv4 and IPv6)
#      whose EndpointSlices (one per family) list three backend pods (network namespaces in the VM, each with an
#      IPv4 and an IPv6 address): real requests through each address of each family;
#   2. under load from the VM's client netns (25 new TCP connections/s, 5 UDP queries/s, 4 long-lived TCP
#      connections sending a line every 200 ms; tests/vm/e2e + e2e-traffic/, a release build), to the
#      IPv4 and the IPv6 ClusterIP in turn (half of it IPv6, counted apart too), phases:
#      - readiness flap: each backend in turn not ready (serving+terminating) for a second and ready again while
#        it still has connections (every long-lived connection goes through one flap of its backend);
#      - rolling update, twice: every backend replaced the Deployment way (new endpoint ready -> old one
#        serving+terminating -> old one removed, one pod at a time); old pods keep running, as in their
#        termination grace period, so a broken connection is the proxier's doing;
#      - proxier restart (SIGTERM, start again);
#      - a gate flip through the operator (ProxyConfig -> the VM node's NodeProxyConfig -> the proxier):
#        ProxyTerminatingEndpoints off (a terminating real server of another Service leaves the kernel),
#        then on again (it comes back at weight 0);
#      - apiserver outage: stopped 30 s (the table must not change), started again (the proxier resumes:
#        a new endpoint reaches the kernel);
#      each phase prints requests sent / failed and long-lived connections broken (target 0: any failure
#      fails the test), and requests answered but slower than 1 s;
#   3. latency from an EndpointSlice write (the apiserver's answer) to the kernel table in the VM changing,
#      p50/p99 over E2E_SAMPLES (40) changes, with the guest's clock mapped to this one (offset from the
#      fastest of 10 round trips; the guest polls ipvsadm, so each figure is rounded up to one poll), under the
#      same load, counted as a phase too;
#   4. every failure, slow request and pause of the load, with the share of the 4 s before it that the VM's
#      emulated CPU was waiting for a CPU of this machine (QEMU's vCPU thread, /proc/PID/task/TID/schedstat):
#      this machine's load, told apart from the proxier's doing;
#   5. the nftables stage per sync: how many went as one nfnetlink batch or through `nft -f`, and how long they took.
#
# E2E_PROXIER=kube-proxy runs the same with kube-proxy of the same release as the proxier (IPVS mode; hack/lib/kube-proxy-payload.sh,
# the agent's kube-proxy-start and kube-proxy-stop; its KubeProxyConfiguration is the parity check's,
# tests/kube-proxy/corpus.py), for hack/bench-vs-kube-proxy.sh --e2e: every phase but the gate flip (the operator's
# NodeProxyConfig is kipvs's); a terminating endpoint's real server may leave the kernel instead of staying at
# weight 0 (kube-proxy deletes it once it has no connection), and failed requests are figures, not failed checks.
# It runs without the IPv6 share (E2E_IPV6=0: single-stack objects, IPv4 load): the parity check's
# KubeProxyConfiguration is single-stack.
#
# usage: hack/test-e2e.sh
# env:   CP_PORT/CP_ETCD_PORT (28443/29790), E2E_AGENT_PORT (host loopback port forwarded to the agent, 27000),
#        E2E_SAMPLES (40), E2E_PROXIER (kipvs | kube-proxy), E2E_IPV6 (1 with kipvs, 0 with kube-proxy: the
#        IPv6 share of objects and load), E2E_FIGURES (a file that gets one line per phase,
#        hack/lib/e2e.sh end_phase), KEEP=1 (keep the state dir), VMCACHE, CPCACHE
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/host-tools.sh && host_tools # kubectl, curl, nft (for the VM image), ...
export RUST_BACKTRACE=0
# Below the kernel's ephemeral port range (32768-60999): an outgoing connection (the apiserver's to
# etcd) once took 47000 as its own port just before QEMU was to forward it, and the run failed.
export CP_PORT=${CP_PORT:-28443} CP_ETCD_PORT=${CP_ETCD_PORT:-29790}
AGENT_PORT=${E2E_AGENT_PORT:-27000}
SAMPLES=${E2E_SAMPLES:-40}
PROXIER=${E2E_PROXIER:-kipvs}
case $PROXIER in kipvs | kube-proxy) ;; *) echo "E2E_PROXIER: kipvs or kube-proxy, not $PROXIER" >&2; exit 2 ;; esac
IPV6=${E2E_IPV6:-$([ "$PROXIER" = kipvs ] && echo 1 || echo 0)}
say() { printf 'e2e: %s\n' "$*"; }
K8S=$(hack/control-plane.sh version)
# The EndpointSlice group/version this release serves (v1 from 1.21, v1beta1 before): hack/lib/e2e.sh's slice
ES_API=$(python3 tests/lib/k8s_api.py "${K8S#1.}" --api)
T0=$(date +%s)
LOAD0=$(uptime | sed 's/.*load average/load average/')
. hack/lib/checks.sh # pass/fail tally: ok, bad, check
now() { date +%s.%N; }

. hack/lib/executables.sh
. hack/lib/wait.sh
. hack/lib/guest-clock.sh # guest_clock_offset
# The proxier in the VM is the one of the proxier image (release build, hack/test-vm.sh builds it), as on a node;
# the backends and the load client are a release build too (std + clap: seconds to build), so that the emulated
# CPU spends its time on the traffic, not on debug code.
OPERATOR=$(executable kipvs-operator)
cargo build --release --locked --quiet -p kipvs-e2e-traffic
TRAFFIC=${CARGO_TARGET_DIR:-$ROOT/target}/release/e2e_traffic
[ -x "$OPERATOR" ] && [ -x "$TRAFFIC" ] || { say "build produced no executables"; exit 1; }

STATE=$(mktemp -d /tmp/kipvs-e2e.XXXXXX)
. hack/lib/e2e.sh # agent, must, api_apply, slice, the load phases (stats, begin, end_phase), guest_kubeconfig
vm_pid="" operator_pid="" sampler_pid=""
cleanup() {
  [ -z "$operator_pid" ] || kill "$operator_pid" 2>/dev/null || true
  [ -z "$sampler_pid" ] || kill "$sampler_pid" 2>/dev/null || true
  stop_vm_and_control_plane
}
trap cleanup EXIT
hack/control-plane.sh start "$STATE"
KC=$STATE/kubeconfig
k() { kubectl --kubeconfig "$KC" "$@"; }
guest_kubeconfig "$KC" > "$STATE/guest-kubeconfig"
KP_DIR="" # the guest's /payload/kube-proxy with E2E_PROXIER=kube-proxy
if [ "$PROXIER" = kube-proxy ]; then
  . hack/lib/kube-proxy-payload.sh # kube_proxy_payload
  python3 -c 'import yaml' 2> /dev/null || apt-get install -y -qq python3-yaml > /dev/null
  KP_DIR=$STATE/kube-proxy
  kube_proxy_payload "$KP_DIR" "$KC"
  python3 -c 'import sys, yaml; sys.path.insert(0, "tests/kube-proxy"); import corpus
yaml.safe_dump(corpus.kube_proxy_config({})[0], sys.stdout, sort_keys=False)' > "$KP_DIR/config.yaml"
fi
# ---- objects: the VM's Node, the Services ---------------------------------------------------------------
k apply --validate=false -k config/crd > /dev/null
k apply -f config/operator/namespace.yaml > /dev/null
# With E2E_IPV6=1 the Node has an IPv6 InternalIP too (NodePorts of both families) and web is dual-stack
NODE_IP6="" WEB_FAMILIES="ipFamilyPolicy: SingleStack"
if [ "$IPV6" = 1 ]; then
  NODE_IP6="{type: InternalIP, address: fd00:192:168:100::1}, "
  WEB_FAMILIES="ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [10.96.0.80, fd00:10:96::80]"
fi
k apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: test-node
  labels: {kubernetes.io/hostname: test-node, kubernetes.io/os: linux, topology.kubernetes.io/zone: zone-a}
status:
  addresses: [{type: InternalIP, address: 192.168.100.1}, $NODE_IP6{type: Hostname, address: test-node}]
  conditions: [{type: Ready, status: "True", reason: KubeletReady, message: the VM}]
---
# web: what the load goes through (ClusterIP, NodePort, load-balancer VIP; TCP and UDP; both families with
# E2E_IPV6=1: the VM's topology gives the node fd00:192:168:100::1 and the client fd00:192:168:100::2)
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.80
  $WEB_FAMILIES
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30081}
EOF
# lat: the latency samples add and remove one endpoint here; term: one ready and one serving+terminating
# endpoint, for the ProxyTerminatingEndpoints gate flip
for s in lat=10.96.0.81 term=10.96.0.82; do
  k apply -f - > /dev/null <<EOF
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "${s%=*}", "namespace": "default"},
 "spec": {"clusterIP": "${s#*=}", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                                          {"name": "udp", "port": 80, "protocol": "UDP", "targetPort": 8080}]}}
EOF
done
# Status through the API with curl (hack/lib/kube-status.sh): `kubectl patch --subresource` needs kubectl >= 1.24.
. hack/lib/kube-status.sh
ADDRS='{"type":"InternalIP","address":"192.168.100.1"}' INGRESS='{"ip":"203.0.113.80"}'
if [ "$IPV6" = 1 ]; then
  ADDRS+=',{"type":"InternalIP","address":"fd00:192:168:100::1"}' INGRESS+=',{"ip":"2001:db8:113::80"}'
fi
[ "$(k get node test-node -o jsonpath='{.status.addresses[0].address}')" = 192.168.100.1 ] ||
  KUBECONFIG=$KC patch_status /api/v1/nodes/test-node \
    '{"status":{"addresses":['"$ADDRS"'],"conditions":[{"type":"Ready","status":"True"}]}}' > /dev/null
VIP=203.0.113.80 VIP6=2001:db8:113::80 CIP6="[fd00:10:96::80]:80"
KUBECONFIG=$KC patch_status /api/v1/namespaces/default/services/web \
  '{"status":{"loadBalancer":{"ingress":['"$INGRESS"']}}}' > /dev/null
gen() { echo "10.244.1.$((100 + 10 * $1 + $2))"; } # gen GENERATION INDEX: the pod IP
v6() { local a=${1#10.244.}; echo "fd00:10:244:${a%.*}::${a#*.}"; } # v6 POD_IP: its IPv6 address (topology.sh's rule)
pod() { must pod "$1" "$2" $([ "$IPV6" = 0 ] || v6 "$2"); } # pod NAME IP: a backend with its address(es)
web_slices() { # web_slices ENDPOINT...: web's EndpointSlice, and with IPV6=1 its IPv6 one of the same pods
  local e six=()
  slice web-e2e web "$@"
  [ "$IPV6" = 1 ] || return 0
  for e in "$@"; do six+=("$(v6 "${e%:*}"):${e##*:}"); done
  slice web-e2e-v6 web "${six[@]}"
}
web_wait() { # web_wait POD_IP WANT [SECONDS]: its real server of web's ClusterIP, in each family, reaches WANT
  agent wait tcp $CIP "$1:8080" "$2" "${3:-30}" > /dev/null || return 1
  [ "$IPV6" = 1 ] || return 0
  agent wait tcp "$CIP6" "[$(v6 "$1")]:8080" "$2" "${3:-30}" > /dev/null
}
for i in 1 2 3; do CUR+=("$(gen 1 "$i"):ready"); done
web_slices "${CUR[@]}"
slice lat-e2e lat "10.244.1.99:ready"
slice term-e2e term "10.244.1.97:ready" "10.244.1.98:terminating"

# ---- the VM ----------------------------------------------------------------------------------------------
say "starting the VM (hack/test-vm.sh --e2e; console log in target/vm/console.log)"
KIPVS_TRAFFIC=$TRAFFIC KIPVS_E2E_KUBECONFIG=$STATE/guest-kubeconfig KIPVS_KUBE_PROXY_DIR=$KP_DIR VMTIMEOUT=${VMTIMEOUT:-1800} \
  VMNET="net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:$AGENT_PORT-10.0.2.15:7000" \
  hack/test-vm.sh --e2e > "$STATE/vm.log" 2>&1 &
vm_pid=$!
# The emulated CPU's share of this machine, sampled every 0.5 s: host time, then the QEMU vCPU thread's time
# running and time runnable but waiting for a host CPU (ns, /proc/.../schedstat). Read with the load's log at
# the end: a failure while the vCPU waited for the host is the machine's doing, not the proxier's.
descendant() { # descendant PID NAME: the first process named NAME* below PID
  local c
  for c in $(pgrep -P "$1"); do
    case $(cat "/proc/$c/comm" 2>/dev/null) in "$2"*) echo "$c"; return 0 ;; esac
    descendant "$c" "$2" && return 0
  done
  return 1
}
sample_vcpu() {
  local q="" t=""
  until q=$(descendant "$vm_pid" qemu-system); do kill -0 "$vm_pid" 2>/dev/null || return 0; sleep 1; done
  for t in /proc/"$q"/task/*; do case $(cat "$t/comm") in CPU*) break ;; esac; done
  # the sampling period
  while [ -r "$t/schedstat" ]; do echo "$(date +%s.%N) $(cat "$t/schedstat" 2>/dev/null)"; sleep 0.5; done > "$STATE/vcpu"
}
t=$(date +%s)
WAIT_STEP=1 wait_for 900 "the guest agent" agent_up || { tail -n 40 "$STATE/vm.log"; say "no agent after 900 s"; exit 1; }
say "guest agent up after $(( $(date +%s) - t )) s"
sample_vcpu &
sampler_pid=$!
for i in 1 2 3; do pod "gen1-$i" "$(gen 1 "$i")"; done
must pod lat-0 10.244.1.99; must pod lat-1 10.244.1.96; must pod term-0 10.244.1.97; must pod term-1 10.244.1.98
# the proxier under test: kipvs (agent proxier-start, -stop) or kube-proxy (kube-proxy-start answers once it has
# synced, kube-proxy-stop); CHECKED is end_phase's argument: kube-proxy's failures are figures
if [ "$PROXIER" = kipvs ]; then START=proxier-start STOP=proxier-stop CHECKED=""
else START=kube-proxy-start STOP=kube-proxy-stop CHECKED=figures; fi
AGENT_TIMEOUT=150 must $START
CIP=10.96.0.80:80
check "the proxier programs the Service from the API: every endpoint in the kernel" web_wait "$(gen 1 3)" 1 120
agent table > "$STATE/table.0"
sed 's/^/    /' "$STATE/table.0"
TARGETS=("tcp $CIP" "udp $CIP" "tcp 192.168.100.1:30080" "udp 192.168.100.1:30081" "tcp $VIP:80" "udp $VIP:80")
[ "$IPV6" = 0 ] || TARGETS+=("tcp $CIP6" "udp $CIP6" "tcp [fd00:192:168:100::1]:30080" "udp [fd00:192:168:100::1]:30081"
  "tcp [$VIP6]:80" "udp [$VIP6]:80")
for target in "${TARGETS[@]}"; do
  a=$(agent probe $target 2>&1) || true
  check "real traffic through ${target/ /: } answered by a backend (${a})" grep -qx 'gen1-[123]' <<<"$a"
done

# The table without the real servers at weight 0: those of removed endpoints leave by themselves once their
# connections are gone (drained), whatever else happens.
active() { grep -v -- ' -w 0$' || true; }

FIG=()
# with IPV6=1 the load takes the IPv4 and the IPv6 ClusterIP in turn: half of it is IPv6 (tcp6_*, udp6_*)
must load-start $CIP $CIP $([ "$IPV6" = 0 ] || echo "$CIP6 $CIP6")
long_opened() { [ "$(field "$(stats)" long_opened)" = 4 ]; }
wait_for 30 "the load's 4 long-lived connections" long_opened || true
s=$(stats)
check "load running: $(field "$s" long_opened) long-lived connections on $(field "$s" long)" [ "$(field "$s" long_opened)" = 4 ]

# what a serving+terminating endpoint's real server becomes: weight 0 (kipvs); kube-proxy deletes it once it has
# no connection (graceful_termination.go:158-182, deleteRsFunc), weight 0 until then
TERMINATING_RS=0
[ "$PROXIER" = kipvs ] || TERMINATING_RS=drained
# Readiness flap: each backend in turn goes not ready (serving+terminating: draining) for a second under load and
# comes back ready while it still has connections; the load's 4 long-lived connections were opened to these three,
# so each of them goes through one flap. kipvs gives the real server its weight back in place. kube-proxy 1.24
# deletes a real server of its graceful-termination list and adds it again (pkg/proxy/ipvs/proxier.go:2093-2106,
# syncEndpoint; graceful_termination.go:191-202, MoveRSOutofGracefulDeleteList), and with expire_nodest_conn=1 the
# kernel expires the connections of a deleted destination one tick later unless it is added back first
# (ip_vs_enqueue_expire_nodest_conns, since Linux 5.9): whether a flap breaks them is a race with that tick.
flap() { # flap I: gen1-I of CUR not ready, then ready again
  local e
  e=$(gen 1 "$1")
  web_slices "${CUR[@]/$e:ready/$e:terminating}"
  web_wait "$e" $TERMINATING_RS || bad "gen1-$1 not at weight 0"
  sleep 1 # on purpose, here and below: a second of load on the draining backend, then on the ready one
  web_slices "${CUR[@]}"
  web_wait "$e" 1 || bad "gen1-$1 not back at weight 1"
  sleep 1
}
begin "readiness flap"; for i in 1 2 3; do flap "$i"; done; end_phase $CHECKED

rollout() { # rollout FROM TO: replace every pod of generation FROM by one of TO, the Deployment way
  local i
  for i in 1 2 3; do
    pod "gen$2-$i" "$(gen "$2" "$i")"
    CUR+=("$(gen "$2" "$i"):ready")
    web_slices "${CUR[@]}"
    web_wait "$(gen "$2" "$i")" 1 || bad "gen$2-$i not programmed"
    sleep 1 # on purpose, here and below: each step of the update carries load for a second
    CUR=("${CUR[@]/$(gen "$1" "$i"):ready/$(gen "$1" "$i"):terminating}")
    web_slices "${CUR[@]}"
    web_wait "$(gen "$1" "$i")" $TERMINATING_RS || bad "gen$1-$i not at weight 0"
    sleep 1
    local keep=()
    for e in "${CUR[@]}"; do [ "$e" = "$(gen "$1" "$i"):terminating" ] || keep+=("$e"); done
    CUR=("${keep[@]}")
    web_slices "${CUR[@]}"
    sleep 1
  done
}
begin "rolling update 1"; rollout 1 2; end_phase $CHECKED
a=$(agent probe tcp $CIP) || true
check "after rolling update 1 new connections reach generation 2 ($a)" grep -qx 'gen2-[123]' <<<"$a"
begin "rolling update 2"; rollout 2 3; end_phase $CHECKED
a=$(agent probe tcp $CIP) || true
check "after rolling update 2 new connections reach generation 3 ($a)" grep -qx 'gen3-[123]' <<<"$a"

begin "proxier restart"
agent table > "$STATE/table.before-restart"
must $STOP
AGENT_TIMEOUT=150 must $START
restarted_synced() { agent log 100000 | grep -q 'sync complete'; }
[ "$PROXIER" != kipvs ] || wait_for 60 "the restarted proxier's first sync" restarted_synced ||
  bad "the restarted proxier did not sync within 60 s"
agent table > "$STATE/table.after-restart"
check "proxier restart: the same virtual servers and weighted real servers" \
  cmp -s <(active < "$STATE/table.before-restart") <(active < "$STATE/table.after-restart")
end_phase $CHECKED

proxyconfig() { # TERMINATING: ProxyTerminatingEndpoints on (true) or off (false), one stage: the VM's node
  k apply -f - > /dev/null <<EOF
apiVersion: kipvs.io/v1alpha1
kind: ProxyConfig
metadata: {name: e2e}
spec:
  nodeSelector: {matchLabels: {kubernetes.io/os: linux}}
  config: {featureGates: {ProxyTerminatingEndpoints: $1}}
  rollout: {applyTimeout: 60s, failureBudget: 0, autoRollback: true, stages: [{name: all, soakDuration: 1s}]}
EOF
}
npc_state() { k get nodeproxyconfig test-node -o jsonpath='{.spec.revision} {.status.observedRevision} {.status.phase}' 2>/dev/null; }
applied() { local s; s=$(npc_state); read -r a b c <<<"$s"; [ -n "$a" ] && [ "$a" = "$b" ] && [ "$c" = Applied ]; }
if [ "$PROXIER" = kipvs ]; then # kube-proxy has no NodeProxyConfig
  begin "gate flip (operator)"
  KUBECONFIG=$KC POD_NAMESPACE=kipvs-system POD_NAME=e2e-operator RUST_LOG=info,kube=warn "$OPERATOR" \
    > "$STATE/operator.log" 2>&1 &
  operator_pid=$!
  proxyconfig false
  check "gate ProxyTerminatingEndpoints off: the operator wrote test-node's NodeProxyConfig, the proxier reports it Applied" \
    wait_for 90 "test-node's NodeProxyConfig Applied" applied
  check "  ... and the terminating real server of term left the kernel" quiet agent wait tcp 10.96.0.82:80 10.244.1.98:8080 absent 30
  proxyconfig true
  check "gate ProxyTerminatingEndpoints on again: Applied" wait_for 90 "test-node's NodeProxyConfig Applied" applied
  check "  ... the terminating real server is back at weight 0" quiet agent wait tcp 10.96.0.82:80 10.244.1.98:8080 0 30
  k get nodeproxyconfig test-node -o wide | sed 's/^/    /' || true
  end_phase
fi

begin "apiserver outage (30 s)"
agent table > "$STATE/table.before-outage"
hack/control-plane.sh stop-apiserver "$STATE"
sleep 30 # on purpose: the outage
agent table > "$STATE/table.during-outage"
# The real server of `kubernetes` (10.96.0.1:443) is the apiserver's own endpoint: newer releases withdraw it
# when they shut down gracefully, a change the proxier follows. Everything else must stay.
but_apiserver() { active | grep -v -- '^-a -t 10\.96\.0\.1:443 ' || true; }
check "apiserver down 30 s: the same virtual servers and weighted real servers (nothing deleted)" \
  cmp -s <(but_apiserver < "$STATE/table.before-outage") <(but_apiserver < "$STATE/table.during-outage")
hack/control-plane.sh start-apiserver "$STATE" 2> "$STATE/apiserver-restart.log"
slice lat-e2e lat "10.244.1.99:ready" "10.244.1.96:ready"
t=$(now)
# Its watches were retrying every 0.8-6 s (source::Retry), get 410 Gone from the restarted apiserver and relist
# after 0.8-1.6 s: resumed within seconds (unit test: kube_source watches_back_off_..._resume_within_seconds).
check "apiserver back: the proxier resumed (a new endpoint reached the kernel)" \
  quiet agent wait tcp 10.96.0.81:80 10.244.1.96:8080 1 60
RESUMED=$(awk "BEGIN{printf \"%.1f\", $(now) - $t}")
say "  resumed: the first write after the apiserver's return reached the kernel after $RESUMED s"
end_phase $CHECKED

# ---- EndpointSlice write -> kernel latency ------------------------------------------------------------------
begin "latency ($SAMPLES writes)"
slice lat-e2e lat "10.244.1.99:ready"
agent wait tcp 10.96.0.81:80 10.244.1.96:8080 absent 30 > /dev/null
guest_clock_offset
say "guest clock offset $OFFSET s (round trip $RTT s)"
: > "$STATE/latency"
for n in $(seq "$SAMPLES"); do
  if [ $((n % 2)) = 1 ]; then want=1; eps=("10.244.1.99:ready" "10.244.1.96:ready"); else want=absent; eps=("10.244.1.99:ready"); fi
  agent wait tcp 10.96.0.81:80 10.244.1.96:8080 "$want" 30 > "$STATE/wait.out" &
  w=$!
  sleep 1 # on purpose: the guest is polling before the write (the agent answers only when the wait ends)
  slice lat-e2e lat "${eps[@]}"
  t0=$(now)
  if wait "$w"; then
    awk -v g="$(cat "$STATE/wait.out")" -v o="$OFFSET" -v t="$t0" 'BEGIN{printf "%.3f\n", g - o - t}' >> "$STATE/latency"
  else bad "latency sample $n: the change did not reach the kernel"; fi
done
read -r P50 P99 MIN MAX N < <(sort -n "$STATE/latency" | awk '{v[NR] = $1} END {
  i50 = int(0.5 * NR + 0.999); i99 = int(0.99 * NR + 0.999); printf "%.3f %.3f %.3f %.3f %d\n", v[i50], v[i99], v[1], v[NR], NR }')
LAT="EndpointSlice write -> kernel in the VM: p50 ${P50} s, p99 ${P99} s (min $MIN, max $MAX, n=$N)"
say "$LAT"
check "every latency sample measured ($N of $SAMPLES)" [ "$N" = "$SAMPLES" ]
end_phase $CHECKED

final=$(agent load-stop)
say "load, whole run: $(head -n1 <<<"$final")"
V6="IPv6 share: none (E2E_IPV6=0)"
if [ "$IPV6" = 1 ]; then # counted in the totals above too, so in every phase's failed requests
  s=$(head -n1 <<<"$final")
  V6="IPv6 share of the load: TCP $(field "$s" tcp6_sent) of $(field "$s" tcp_sent) sent, $(field "$s" tcp6_failed) failed;"
  V6+=" UDP $(field "$s" udp6_sent) of $(field "$s" udp_sent) sent, $(field "$s" udp6_failed) failed"
  v6_clean() { [ "$(field "$1" tcp6_sent)" -gt 0 ] && [ "$(field "$1" udp6_sent)" -gt 0 ] &&
    zeros "$(field "$1" tcp6_failed)" "$(field "$1" udp6_failed)"; }
  check "$V6" v6_clean "$s"
fi
agent load-log > "$STATE/load.log" || true
agent log 100000 > "$STATE/proxier.log" || true
# The nftables stage of each sync (the kernel dataplane's debug line): how it was applied (one nfnetlink batch, or
# `nft -f` for rules and intervals) and how long it took.
nft_stages() {
  sed 's/\x1b\[[0-9;]*m//g' "$STATE/proxier.log" | grep 'applied nftables transaction' |
    sed -n 's/.*via="\{0,1\}\([a-z]*\)"\{0,1\}.* duration_us=\([0-9]*\).*/\1 \2/p' | sort -k2,2n |
    awk '{n++; via[$1]++; d[n]=$2}
      END {if (!n) {print "none logged"; exit}
        s=""; for (v in via) {w=w s v " " via[v]; s=", "}
        printf "%d transactions (%s): p50 %.1f ms, p90 %.1f ms, max %.1f ms\n", n, w, d[int(n*0.5)+1]/1000, d[int(n*0.9)+1]/1000, d[n]/1000}'
}
NFTSTAGES="nftables stage per sync: $(nft_stages || echo '?')"
[ "$PROXIER" = kipvs ] || NFTSTAGES="nftables stage per sync: kipvs's only"
say "$NFTSTAGES"
G=$(agent wallclock) H=$(now)
# Every failure, slow request (> 1 s) and pause of the load, with what the host did to the VM meanwhile: the share
# of the preceding 4 s the vCPU was runnable but waiting for a host CPU ("host-wait"), or running ("run").
python3 - "$STATE" "$(awk "BEGIN{print $G - $H}")" <<'PY'
import re, sys
state, offset = sys.argv[1], float(sys.argv[2])
samples = []
for line in open(f"{state}/vcpu"):
    f = line.split()
    if len(f) >= 3:
        samples.append((float(f[0]), int(f[1]), int(f[2])))
def shares(t0, t1):
    inside = [s for s in samples if t0 - 0.5 <= s[0] <= t1 + 0.5]
    if len(inside) < 2:
        return None
    (a, ra, wa), (b, rb, wb) = inside[0], inside[-1]
    return (rb - ra) / 1e9 / (b - a), (wb - wa) / 1e9 / (b - a)
events = []
for line in open(f"{state}/load.log"):
    m = re.match(r"(\d+\.\d+) (.*)", line.strip())
    if m:
        events.append((float(m.group(1)) - offset, m.group(2)))
phases = [l.split(None, 2) for l in open(f"{state}/phases")]
def phase(t):
    name = "-"
    for p in phases:
        if float(p[0]) <= t and p[1] == "begin":
            name = p[2].strip()
    return name
print(f"  load events (failures, slow requests > 1 s, pauses > 0.5 s): {len(events)}; host time = guest time - {offset:.2f} s")
for t, what in events[:60]:
    s = shares(t - 4, t)
    print(f"    {t:.1f} [{phase(t)}] {what}" + (f"  | vCPU run {s[0]:.0%} host-wait {s[1]:.0%}" if s else ""))
kinds = {}
for t, what in events:
    s = shares(t - 4, t)
    if s:
        kind = "slow" if ": slow: " in what else "pause" if what.startswith("pause") else "failed"
        kinds.setdefault(kind, []).append(s)
for kind, v in sorted(kinds.items()):
    wait = sorted(w for _, w in v)
    busy = min(r + w for r, w in v)
    print(f"  {kind}: {len(v)}; in the 4 s before each, the vCPU waited for a host CPU {wait[len(wait) // 2]:.0%} "
          f"(median, least {wait[0]:.0%}) and was busy (running or waiting) at least {busy:.0%}")
if samples:
    whole = shares(samples[0][0], samples[-1][0])
    worst = max((shares(s[0], s[0] + 3) or (0, 0))[1] for s in samples)
    print(f"  vCPU over the run: running {whole[0]:.0%}, waiting for a host CPU {whole[1]:.0%} (worst 3 s: {worst:.0%})")
PY

echo
echo "=== end to end (kube-apiserver $K8S, $PROXIER in the VM): requests sent / failed, long-lived connections broken"
printf '  %s\n' "${FIG[@]}"
echo "  $LAT"
echo "  $V6"
echo "  $NFTSTAGES"
echo "  after the 30 s apiserver outage the first write reached the kernel after ${RESUMED:-?} s"
echo "  machine load: at start $LOAD0; at end $(uptime | sed 's/.*load average/load average/')"
agent finish "$([ "$fail" = 0 ] && echo 0 || echo 1)" > /dev/null || true
wait "$vm_pid" || bad "the VM run failed (its log: $STATE/vm.log)"
vm_pid=""
grep -E '^(PASS|FAIL|SKIP|  (PASS|FAIL))|^=== wall' "$STATE/vm.log" | sed 's/^/  /' || true
echo "$pass passed, $fail failed ($(( $(date +%s) - T0 )) s)"
[ "$fail" = 0 ]
