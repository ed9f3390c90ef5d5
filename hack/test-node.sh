#!/usr/bin/env bash
# kipvs as users run it: a real Kubernetes node in the test VM, kipvs installed on it with `kubectl apply -k
# config/`, real pods behind real Services.
#
#   - The Kubernetes components are Debian's 1.20.2 or KIPVS_K8S_BIN's (hack/lib/k8s-build.sh `k8s_bin`); what
#     the test does follows their release (k8s_minor, the kubelet's --version), never where they came from.
#   - The control plane runs here, in a network namespace of its own (kipvs-node: no port of this machine is
#     taken, nothing else sees it): etcd + kube-apiserver (hack/control-plane.sh, with the ServiceAccount
#     admission plugin), kube-controller-manager and kube-scheduler. The namespace's tap device is the VM's NIC:
#     this side is HOST_IP, the node NODE_IP, pods 10.244.0.0/24 are routed to the node.
#   - The VM (hack/vm: Debian's kernel under QEMU, 2 vCPUs, 3 GB) boots the initramfs of hack/node/fetch.sh
#     (the test VM's base + node modules, Debian's containerd/runc/CNI plugins/iptables, the kubelet) with the
#     payload tests/node/guest: containerd, the images loaded offline (`ctr images import`: the two kipvs
#     images of hack/build-images.sh, pause and agnhost of hack/node/images.sh), a CNI bridge, and the kubelet
#     with the flags its release takes (--container-runtime=remote before 1.24), which registers the Node.
#     Measured: QEMU start to Node Ready.
#   - Install: config/ (kubelet 1.24 and later: gRPC probes) or config-http-probes/ (older kubelets: HTTP GET
#     /livez; --validate=false before 1.23, whose schema lacks the CRDs' CEL rules, as README says) copied with
#     config/ beside it, its images set to the loaded ones (what `kustomize edit set image` writes), the
#     ConfigMap kipvs-apiserver naming the apiserver's address (kipvs is the only service proxy: the ClusterIP of
#     `kubernetes` is what it programs), `kubectl apply -k`. Measured: apply to the proxier pod Ready and to the
#     `kubernetes` Service's virtual server in the node's kernel.
#   - Checks: the kubelet's readiness/liveness probes (gRPC or HTTP) keep the proxier pod Ready without a restart, the
#     operator's Deployment becomes Available (its pods reach the API through the ClusterIP kipvs programs), an
#     agnhost Deployment behind a ClusterIP and a NodePort Service answers from a pod, from the node and from
#     outside the node (this namespace).
#   - A reboot with the default install (issue 33): the ConfigMap deleted, the proxier stopped, the kernel cleared
#     (`kipvs-proxier cleanup` in a privileged host-network pod, inet kipvs deleted), the proxier started again: it
#     finds the API server at the address it remembered on the node, programs, and is Ready only once it has.
#
# Then (not with --smoke) under e2e-traffic's load from outside the node (25 new TCP connections/s, 5 UDP
# datagrams/s, 4 long-lived connections) through the NodePort of tests/node/traffic.yaml: 20 s steady, `kubectl
# rollout restart` of the backends' Deployment (new requests must not fail; a long-lived connection ends with its
# old pod), and the kipvs DaemonSet updated to a new image tag (the same image tagged TAG-next; nothing may fail).
# Then KEP-3836 on the real node: `kubectl drain` (cordon + eviction) leaves the proxier's /healthz
# at 200 as kube-proxy's; the ToBeDeletedByClusterAutoscaler taint turns it to 503 while the liveness probe
# (gRPC service "", or HTTP /livez) keeps the pod Ready, and removing the taint turns it back to 200.
#
# With --conformance, instead of the load and KEP-3836: upstream's own Service tests, the release's `e2e.test` and
# ginkgo (k8s_bin; only in this mode), every `[sig-network] Services` test a single node can run (and
# `[sig-network] SCTP`); a test that needs what a one-node cluster lacks skips itself and says why. The result is
# a Markdown table (hack/node/e2e-table.py) in $E2E_REPORT (target/node-e2e) with ginkgo's JUnit report and the
# run's log; docs/node-conformance.md explains each failure and skip.
#
# With NODES=N (2 or more; default 1) the cluster has N nodes, each a VM of the same initrd (NODE_MEM each): the
# namespace's side is a bridge (kipvs-br0, HOST_IP) with a tap per VM; node i (from 0) is kipvs-node (i = 0) or
# kipvs-node-<i+1>, at 192.168.77.<10+i> with the pods of 10.244.<i>.0/24; its identity comes on the kernel
# command line (tests/node/guest/run.sh), and each pod CIDR is routed to its node's address from the other nodes
# and from the namespace (no overlay: the nodes share the link). The checks above run against kipvs-node as with
# one node; then a Service whose pods run on kipvs-node-2 (tests/node/nodes.yaml) is reached from a pod and from
# the host network of kipvs-node through its ClusterIP and its NodePort, the pod's own address seen by the
# backend. --conformance also selects upstream's [sig-network] Conntrack and KubeProxy tests (they need two
# nodes) and tells e2e.test the node count.
#
# usage: hack/test-node.sh [--smoke|--conformance]    (--smoke: up to the probes, the part meant for hack/test.sh)
# env:   KEEP=1 (keep the state dir and leave the cluster running until Enter is pressed), VMCACHE, NODECACHE,
#        CPCACHE, NODES (1), NODE_MEM (MB per node, 3072), NODE_SMP (2); with --conformance E2E_FOCUS, E2E_SKIP (ginkgo regular
#        expressions), E2E_REPORT, E2E_NODES (3), KIPVS_K8S_BIN
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/host-tools.sh && host_tools
. hack/lib/k8s-build.sh
export RUST_BACKTRACE=0
case ${1:-} in
  "") MODE=full ;;
  --smoke) MODE=smoke ;;
  --conformance) MODE=conformance ;;
  *) echo "usage: hack/test-node.sh [--smoke|--conformance]" >&2; exit 2 ;;
esac
NS=kipvs-node TAP=kipvs-tap0 HOST_IP=192.168.77.1 NODE_IP=192.168.77.10 NODE=kipvs-node
NODES=${NODES:-1}
[[ $NODES =~ ^[1-9]$ ]] || { echo "NODES: 1 to 9, not '$NODES'" >&2; exit 2; }
# node i: NODE_NAMES[i] at NODE_IPS[i] with the pods of POD_CIDRS[i] (node 0 is NODE at NODE_IP)
NODE_NAMES=() NODE_IPS=() POD_CIDRS=()
for i in $(seq 0 $(( NODES - 1 ))); do
  if [ "$i" = 0 ]; then NODE_NAMES+=("$NODE"); else NODE_NAMES+=("$NODE-$(( i + 1 ))"); fi
  NODE_IPS+=("${NODE_IP%.*}.$(( ${NODE_IP##*.} + i ))") POD_CIDRS+=("10.244.$i.0/24")
done
LB_IP=203.0.113.10 # the web-lb Service's load-balancer address (written by this test); 203.0.113.0/24 is routed
# to the node (--conformance: hack/node/lb-status.py gives LoadBalancer Services addresses from it)
export CP_PORT=16443 CP_ETCD_PORT=23790
say() { printf 'node: %s\n' "$*"; }
T0=$(date +%s)
LOAD0=$(uptime | sed 's/.*load average/load average/')
. hack/lib/checks.sh # pass/fail tally: ok, bad, check
elapsed() { awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $1}"; }
until_() { local end=$(( $(date +%s) + $1 )); shift; until "$@"; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 1; done; }

# ---- builds (all cached but the kipvs images) ----------------------------------------------------------------
t=$(date +%s)
hack/control-plane.sh build
K8S=$(hack/control-plane.sh version)
mapfile -t BINS < <(k8s_bin kubelet kube-controller-manager kube-scheduler)
[ ${#BINS[@]} = 3 ] || { say "k8s_bin gave no executables"; exit 1; }
KUBELET=${BINS[0]} KCM=${BINS[1]} SCHED=${BINS[2]}
E2E=()
if [ "$MODE" = conformance ]; then
  mapfile -t E2E < <(k8s_bin e2e.test ginkgo)
  [ ${#E2E[@]} = 2 ] || { say "k8s_bin gave no e2e.test and ginkgo"; exit 1; }
fi
# the kubelet's release decides its flags and the probes kipvs is installed with
KUBELET_MINOR=$(k8s_minor_of "$KUBELET")
KUBELET_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock"
[ "$KUBELET_MINOR" -ge 24 ] || KUBELET_ARGS="--container-runtime=remote $KUBELET_ARGS" # docker before, refused after
INSTALL=$(k8s_install "$KUBELET_MINOR") INSTALL=${INSTALL%/}
if [ "$INSTALL" = config ]; then
  PROBE=gRPC PROBE_AT='liveness port {.livenessProbe.grpc.port}, readiness port {.readinessProbe.grpc.port}'
else # no gRPC probes (KEP-2727)
  PROBE=HTTP
  PROBE_AT='liveness GET :{.livenessProbe.httpGet.port}{.livenessProbe.httpGet.path}, readiness GET :{.readinessProbe.httpGet.port}{.readinessProbe.httpGet.path}'
fi
# before 1.23 the apiserver's schema has no x-kubernetes-validations (the CRDs' CEL rules), which kubectl's
# client-side validation refuses: --validate=false there, as README says
mapfile -t VALIDATE < <(k8s_apply_flags "${K8S#1.}")
say "kube-apiserver $K8S, kubelet 1.$KUBELET_MINOR: kubelet $KUBELET_ARGS; kubectl apply -k $INSTALL/ ${VALIDATE[*]}" \
  "($PROBE probes)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
hack/build-images.sh
TAG=$(umoci ls --layout "$TARGET/images/kipvs-proxier" | head -n1)
mapfile -t UPSTREAM < <(hack/node/images.sh "$KUBELET" "${E2E[0]:-}")
[ ${#UPSTREAM[@]} = 2 ] || { say "hack/node/images.sh gave no images"; exit 1; }
SANDBOX_IMAGE=$(cut -d' ' -f2 <<<"${UPSTREAM[0]}") # pause under the kubelet's name for it
# the pause image's --pod-infra-container-image as long as the kubelet takes it (only a name from 1.27)
[ "$KUBELET_MINOR" -ge 27 ] || KUBELET_ARGS+=" --pod-infra-container-image=$SANDBOX_IMAGE"
mapfile -t INITRD < <(hack/node/fetch.sh "$KUBELET")
if [ "$MODE" = full ]; then
  # e2e-traffic: the load client runs here (a release build), its backends in pods on the node (static, the
  # flags of hack/build-images.sh so that both builds share their artefacts; mounted into agnhost's image)
  cargo build --release --locked --quiet -p kipvs-e2e-traffic
  RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$ROOT=/kipvs --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo" \
    cargo build --release --locked --quiet --target x86_64-unknown-linux-gnu -p kipvs-e2e-traffic
fi
T_BUILD=$(( $(date +%s) - t ))

STATE=$(mktemp -d /tmp/kipvs-node.XXXXXX)
P=$STATE/initrd.d/payload # the guest's /payload
mkdir -p "$P/node" "$P/images"
cp -r tests/node/guest/. "$P/"
mv "$P"/{containerd.toml,cni.conflist,kubelet.yaml} "$P/node/"
printf 'NODE_NAME=%s\nNODE_IP=%s\nHOST_IP=%s\nSANDBOX_IMAGE=%s\nKUBELET_ARGS="%s"\n' "$NODE" "$NODE_IP" "$HOST_IP" \
  "$SANDBOX_IMAGE" "$KUBELET_ARGS" > "$P/node.env"
cat > "$P/node/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: kipvs-node, cluster: {server: "https://$HOST_IP:$CP_PORT", insecure-skip-tls-verify: true}}]
users: [{name: kubelet, user: {token: kipvs-test-token}}]
contexts: [{name: kipvs-node, context: {cluster: kipvs-node, user: kubelet}}]
current-context: kipvs-node
EOF
# the images' list: "FILE REF..." a line (tests/node/guest/run.sh imports FILE, tags it REF)
# the kipvs images as OCI archives, named kipvs.test/NAME:TAG (set in the kustomization below)
for n in kipvs-proxier kipvs-operator; do
  tar -C "$TARGET/images/$n" -cf "$P/images/$n.tar" oci-layout index.json blobs
  echo "$n.tar kipvs.test/$n:$TAG" >> "$P/images/list"
done
if [ "$MODE" = full ]; then
  # the proxier image once more as TAG2 (the DaemonSet's rolling update to a new tag), and the load's backend
  TAG2=$TAG-next
  cp -r "$TARGET/images/kipvs-proxier" "$STATE/proxier-next"
  umoci tag --image "$STATE/proxier-next:$TAG" "$TAG2" && umoci rm --image "$STATE/proxier-next:$TAG"
  tar -C "$STATE/proxier-next" -cf "$P/images/kipvs-proxier-next.tar" oci-layout index.json blobs
  echo "kipvs-proxier-next.tar kipvs.test/kipvs-proxier:$TAG2" >> "$P/images/list"
  mkdir -p "$P/bin" && cp "$TARGET/x86_64-unknown-linux-gnu/release/e2e_traffic" "$P/bin/"
fi
for u in "${UPSTREAM[@]}"; do
  read -r file refs <<<"$u"
  cp "$file" "$P/images/"; echo "$(basename "$file") $refs" >> "$P/images/list"
done
(cd "$STATE/initrd.d" && find . | "${VMCACHE:-$HOME/.cache/kipvs-vm}/userland/bin/busybox" cpio -o -H newc 2>/dev/null) \
  > "$STATE/payload.cpio"
# The kernel unpacks each archive in turn; an uncompressed one must start at a multiple of 4 bytes (zeros between
# archives are skipped).
for f in "${INITRD[0]}" "${INITRD[1]}" "$STATE/payload.cpio"; do
  cat "$f"; head -c $(( (512 - $(stat -c %s "$f") % 512) % 512 )) /dev/zero
done > "$STATE/initrd"
say "initrd $(du -h "$STATE/initrd" | cut -f1) (base $(du -h "${INITRD[0]}" | cut -f1), node userland" \
  "$(du -h "${INITRD[1]}" | cut -f1), payload $(du -h "$STATE/payload.cpio" | cut -f1)); builds ${T_BUILD}s"

# ---- the network namespace and the control plane ------------------------------------------------------------
nsx() { ip netns exec "$NS" "$@"; }
ns_down() { # every process of the namespace was started by this script
  local p
  for p in $(ip netns pids "$NS" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  sleep 1
  for p in $(ip netns pids "$NS" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$NS" 2>/dev/null || true
}
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then
    say "cluster kept: ip netns exec $NS kubectl --kubeconfig $STATE/kubeconfig ...; press Enter to stop it"
    read -r _ || true
  fi
  [ -z "${dns_pid:-}" ] || kill "$dns_pid" 2>/dev/null || true
  [ -z "${lb_pid:-}" ] || kill "$lb_pid" 2>/dev/null || true
  nsx hack/control-plane.sh stop "$STATE" 2>/dev/null || true
  ns_down
  if [ "${KEEP:-0}" = 1 ]; then say "state kept in $STATE"; else rm -rf "$STATE"; fi
}
ns_down # what a killed run left
trap cleanup EXIT
ip netns add "$NS"
nsx ip link set lo up
if [ "$NODES" = 1 ]; then
  nsx ip tuntap add dev "$TAP" mode tap
  nsx ip addr add "$HOST_IP/24" dev "$TAP"
  nsx ip link set "$TAP" up
else # a bridge with HOST_IP and a tap per node
  nsx ip link add kipvs-br0 type bridge
  nsx ip addr add "$HOST_IP/24" dev kipvs-br0
  nsx ip link set kipvs-br0 up
  for i in "${!NODE_IPS[@]}"; do
    nsx ip tuntap add dev "kipvs-tap$i" mode tap
    nsx ip link set "kipvs-tap$i" master kipvs-br0 up
  done
fi
for i in "${!NODE_IPS[@]}"; do nsx ip route add "${POD_CIDRS[$i]}" via "${NODE_IPS[$i]}"; done
nsx ip route add "${LB_IP%.*}.0/24" via "$NODE_IP"
CP_BIND_ADDRESS=0.0.0.0 CP_SERVICE_ACCOUNTS=1 \
  CP_APISERVER_FLAGS="--advertise-address=$HOST_IP --kubelet-preferred-address-types=InternalIP" \
  nsx hack/control-plane.sh start "$STATE"
KC=$STATE/kubeconfig
k() { nsx kubectl --kubeconfig "$KC" "$@"; }
# the apiserver's gates (k8s_gates): the EndpointSlice controller writes the conditions they turn on
KCM_GATES=$(k8s_gates "${K8S#1.}" | paste -sd, -)
KCM_GATES=${KCM_GATES:+--feature-gates=$KCM_GATES}
# shellcheck disable=SC2086 # KCM_GATES: one word or none
nsx "$KCM" --kubeconfig="$KC" --service-account-private-key-file="$STATE/sa.key" \
  --root-ca-file="$STATE/certs/apiserver.crt" --leader-elect=false --bind-address=127.0.0.1 $KCM_GATES > "$STATE/kcm.log" 2>&1 &
nsx "$SCHED" --kubeconfig="$KC" --leader-elect=false --bind-address=127.0.0.1 > "$STATE/scheduler.log" 2>&1 &

# ---- the cluster's DNS -----------------------------------------------------------------------------------------
# No CoreDNS here (Debian has none): dnsmasq on HOST_IP:53 (the kubelet's clusterDNS)
# answers for cluster.local with what a loop here writes from the Services every 2 s: an A record per ClusterIP
# (NAME.NAMESPACE.svc.cluster.local), a CNAME per ExternalName Service; it is restarted when they change.
command -v dnsmasq > /dev/null 2>&1 || fetch_tool dnsmasq dnsmasq-base usr/sbin/dnsmasq
dns_records() { k get svc -A -o json | hack/node/dns-records.py "$HOST_IP" "$STATE/dns.hosts"; }
dns_loop() { # (no errexit: a failed round is tried again)
  local pid=""
  set +e
  while :; do
    if dns_records > "$STATE/dns.conf.new" 2>/dev/null &&
      ! { cmp -s "$STATE/dns.conf.new" "$STATE/dns.conf" && cmp -s "$STATE/dns.hosts.new" "$STATE/dns.hosts"; }; then
      mv "$STATE/dns.hosts.new" "$STATE/dns.hosts"; mv "$STATE/dns.conf.new" "$STATE/dns.conf"
      [ -z "$pid" ] || { kill "$pid"; wait "$pid"; } 2>/dev/null
      # not through nsx (a function: $! would be its subshell, not dnsmasq)
      ip netns exec "$NS" dnsmasq --keep-in-foreground --conf-file="$STATE/dns.conf" --log-facility=- \
        >> "$STATE/dnsmasq.log" 2>&1 &
      pid=$!
    fi
    sleep 2
  done
}
dns_loop &
dns_pid=$!

# ---- the node ----------------------------------------------------------------------------------------------
node_agent() { # node_agent CMD ARG...: the answer without its AGENT-RC line (AGENT_IP's agent, NODE_IP's by
  # default); fails when the command did
  local out
  out=$(nsx curl -s -m "${AGENT_TIMEOUT:-30}" "http://${AGENT_IP:-$NODE_IP}:7000/cgi-bin/agent?$(tr ' ' '+' <<<"$*")") ||
    return 1
  sed '$d' <<<"$out"
  [ "$(tail -n1 <<<"$out")" = AGENT-RC=0 ]
}
# node i's console: console.log (node 0), console-<i+1>.log; with NODES > 1 the nodes boot together, each told
# its identity and the routes to the others' pods on its kernel command line, on a NIC of its own MAC
console() { if [ "$1" = 0 ]; then echo "$STATE/console.log"; else echo "$STATE/console-$(( $1 + 1 )).log"; fi; }
say "booting $NODES node(s) (console: $STATE/console.log)"
t_boot=$(date +%s.%N)
vm_pids=()
for i in "${!NODE_IPS[@]}"; do
  append="" tap=$TAP
  if [ "$NODES" != 1 ]; then
    tap=kipvs-tap$i append="kipvs.node=${NODE_NAMES[$i]},${NODE_IPS[$i]},${POD_CIDRS[$i]} kipvs.routes="
    for j in "${!NODE_IPS[@]}"; do [ "$j" = "$i" ] || append+="${POD_CIDRS[$j]}@${NODE_IPS[$j]},"; done
    append=${append%,}
  fi
  VMLOG=$(console "$i") VMTIMEOUT=7200 VMMEM=${NODE_MEM:-3072} VMSMP=${NODE_SMP:-2} VMAPPEND=$append \
    nsx hack/vm/run-vm.sh "$STATE/initrd" -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:12:34:$(printf %02x $(( 0x56 + i )))" \
    > "$STATE/vm$i.out" 2>&1 &
  vm_pids+=($!)
done
node_ready() { # node_ready NAME
  [ "$(k get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
vm_alive() { # every node's VM runs
  local i
  for i in "${!vm_pids[@]}"; do kill -0 "${vm_pids[$i]}" 2>/dev/null || { tail -n 60 "$(console "$i")"; return 1; }; done
}
T_READIES=()
while [ ${#T_READIES[@]} -lt "$NODES" ]; do
  vm_alive || { bad "a VM exited before its Node was Ready"; exit 1; }
  [ "$(elapsed "$t_boot" | cut -d. -f1)" -lt 900 ] || { tail -n 60 "$STATE/console.log"; bad "no Ready Node after 900 s"; exit 1; }
  for i in "${!NODE_NAMES[@]}"; do
    [ -z "${T_READIES[$i]:-}" ] || continue
    ! node_ready "${NODE_NAMES[$i]}" || {
      T_READIES[$i]=$(elapsed "$t_boot")
      ok "Node ${NODE_NAMES[$i]} Ready ${T_READIES[$i]} s after QEMU started (guest uptime: $(AGENT_IP=${NODE_IPS[$i]} node_agent log milestones |
        sed 's/NODE \([a-z]*\).*uptime=\([0-9.]*\)/\1 \2 s/' | paste -sd, | sed 's/,/, /g'))"
    }
  done
  sleep 1
done
k get node -o wide | sed 's/^/    /'

# ---- install from config/ (or config-http-probes/) --------------------------------------------------------------
cp -r config "$STATE/config"
[ "$INSTALL" = config ] || cp -r "$INSTALL" "$STATE/$INSTALL"
python3 - "$STATE/config/kustomization.yaml" "$TAG" <<'PY'
import re, sys
path, tag = sys.argv[1], sys.argv[2]
s = open(path).read()
# what `kustomize edit set image ghcr.io/kipvs/NAME=kipvs.test/NAME:TAG` writes
for name in ("kipvs-proxier", "kipvs-operator"):
    s, n = re.subn(rf"(- name: ghcr.io/kipvs/{name}\n\s+newName: )\S+(\n\s+newTag: )\S+", rf"\g<1>kipvs.test/{name}\g<2>{tag}", s)
    assert n == 1, f"no images entry for {name} in {path}"
s = s.replace("resources:\n", "resources:\n  - apiserver.yaml\n", 1)
open(path, "w").write(s)
PY
[ "${KIPVS_NODE_NO_MEMORY:-0}" = 0 ] || sed -i '/--remember-apiserver=/d' "$STATE/config/proxier/daemonset.yaml"
cat > "$STATE/config/apiserver.yaml" <<EOF
apiVersion: v1
kind: ConfigMap
metadata: {name: kipvs-apiserver, namespace: kipvs-system}
data: {master: "https://$HOST_IP:$CP_PORT"}
EOF
t_apply=$(date +%s.%N)
k apply -k "$STATE/$INSTALL" "${VALIDATE[@]}" > "$STATE/apply.out" 2>&1 ||
  { cat "$STATE/apply.out"; bad "kubectl apply -k $INSTALL/ ${VALIDATE[*]}"; exit 1; }
ok "kubectl apply -k $INSTALL/ ${VALIDATE[*]} ($(grep -vc '^#' "$STATE/apply.out") objects)"
# the proxier's pod on node NODE_ON (NODE by default)
proxier_of() { k -n kipvs-system get pod -l app.kubernetes.io/name=kipvs-proxier --field-selector "spec.nodeName=${NODE_ON:-$NODE}" "$@"; }
proxier_pod() { proxier_of -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
proxier_ready() { [ "$(proxier_of -o jsonpath='{.items[0].status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
kubernetes_programmed() { # the `kubernetes` Service's virtual server, with the apiserver as its real server
  local cip
  cip=$(k get svc kubernetes -o jsonpath='{.spec.clusterIP}')
  node_agent ipvs 2>/dev/null | grep -q -- "-a -t $cip:443 -r $HOST_IP:$CP_PORT "
}
T_PROG="" T_PODREADY=""
for _ in $(seq 600); do
  [ -n "$T_PROG" ] || ! kubernetes_programmed || T_PROG=$(elapsed "$t_apply")
  [ -n "$T_PODREADY" ] || ! proxier_ready || T_PODREADY=$(elapsed "$t_apply")
  [ -z "$T_PROG" ] || [ -z "$T_PODREADY" ] || break
  vm_alive || break
  sleep 1
done
k -n kipvs-system get pods -o wide | sed 's/^/    /'
check "the proxier pod is Ready (kubelet's $PROBE readiness probe) ${T_PODREADY:-never} s after the apply" [ -n "$T_PODREADY" ]
check "the proxier programmed the kubernetes Service in the node's kernel ${T_PROG:-never} s after the apply" [ -n "$T_PROG" ]
PP=$(proxier_pod)
if [ -z "$T_PROG" ] || [ -z "$T_PODREADY" ]; then
  k -n kipvs-system describe pod "$PP" | tail -n 30 | sed 's/^/    /' || true
  k -n kipvs-system logs "$PP" --tail=40 2>&1 | sed 's/^/    /' || true
  node_agent log kubelet 40 | sed 's/^/    /' || true
fi

# ---- the operator: a pod reaching the API through the ClusterIP kipvs programs ------------------------------
operator_available() {
  [ "$(k -n kipvs-system get deploy kipvs-operator -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ]
}
check "the operator's Deployment is Available (its pods reach the API through the kubernetes ClusterIP)" \
  until_ 300 operator_available

# ---- real workloads --------------------------------------------------------------------------------------------
k apply -f tests/node/workloads.yaml > /dev/null
check "the agnhost Deployment is rolled out" k rollout status deploy/web --timeout=300s
check "the client pod is Ready" k wait --for=condition=Ready pod/client --timeout=300s
CIP=$(k get svc web -o jsonpath='{.spec.clusterIP}')
PODS=$(k get pods -l app=web -o jsonpath='{.items[*].metadata.name}')
answered() { # answered DESCRIPTION COMMAND...: the answer is one of the web pods' names
  local a
  a=$("${@:2}" 2>&1) || true
  if grep -qxF -e "${PODS// /$'\n'}" <<<"$a"; then ok "$1: answered by $a"; else bad "$1: got '${a:0:200}'"; return 1; fi
}
web_programmed() { [ "$(node_agent ipvs | grep -c -- "-a -t $CIP:80 ")" = 2 ]; }
check "the web Service's ClusterIP is programmed with both pods" until_ 60 web_programmed
CLIENT_IP=$(k get pod client -o jsonpath='{.status.podIP}')
dial() { # dial HOST PORT [REQUEST]: the answer to REQUEST ("hostname") the client pod at CLIENT_IP got over HTTP
  # (agnhost netexec's /dial, as
  # upstream's e2e tests reach a Service from a pod), or its errors
  nsx curl -s -m 15 "http://$CLIENT_IP:8080/dial?request=${3:-hostname}&protocol=http&host=$1&port=$2&tries=1" |
    python3 -c 'import json, sys; d = json.load(sys.stdin); print("\n".join(d.get("responses") or d.get("errors") or ["?"]))'
}
answered "ClusterIP $CIP:80 from a pod" dial "$CIP" 80 || true
answered "NodePort $NODE_IP:30080 from a pod" dial "$NODE_IP" 30080 || true
from_node() { # from_node DESCRIPTION URL: answered from the node; on failure, what the node saw meanwhile
  answered "$1" node_agent get "$2" && return
  AGENT_TIMEOUT=60 node_agent trace "$2" | sed 's/^/    /' || true
  k -n kipvs-system exec "$PP" -- nft list table inet kipvs | sed 's/^/    /' || true
}
from_node "ClusterIP $CIP:80 from the node" "http://$CIP/hostname"
from_node "NodePort $NODE_IP:30080 from the node" "http://$NODE_IP:30080/hostname"
answered "NodePort $NODE_IP:30080 from outside the node" nsx curl -s -m 5 "http://$NODE_IP:30080/hostname" || true
# the LoadBalancer: its status as a cloud's controller writes it, then the address from a pod, the node and outside
k get svc web-lb -o json |
  python3 -c 'import json, sys; s = json.load(sys.stdin); s["status"] = {"loadBalancer": {"ingress": [{"ip": sys.argv[1]}]}}; print(json.dumps(s))' "$LB_IP" |
  k replace --raw /api/v1/namespaces/default/services/web-lb/status -f - > /dev/null
lb_programmed() { [ "$(node_agent ipvs | grep -c -- "-a -t $LB_IP:80 ")" = 2 ]; }
check "the web-lb Service's load-balancer address $LB_IP:80 is programmed with both pods" until_ 60 lb_programmed
answered "LoadBalancer $LB_IP:80 from a pod" dial "$LB_IP" 80 || true
from_node "LoadBalancer $LB_IP:80 from the node" "http://$LB_IP/hostname"
answered "LoadBalancer $LB_IP:80 from outside the node" nsx curl -s -m 5 "http://$LB_IP/hostname" || true

# ---- a second node: traffic from the first node to pods on the second, through kipvs ---------------------------
if [ "$NODES" -gt 1 ]; then
  N2=${NODE_NAMES[1]} N2_IP=${NODE_IPS[1]}
  for n in "${NODE_NAMES[@]:1}"; do
    NODE_ON=$n check "the proxier pod on $n is Ready" until_ 300 proxier_ready
  done
  k apply -f tests/node/nodes.yaml > /dev/null
  check "the web2 Deployment is rolled out" k rollout status deploy/web2 --timeout=300s
  check "the client1 pod is Ready" k wait --for=condition=Ready pod/client1 --timeout=300s
  W2_PODS=$(k get pods -l app=web2 -o jsonpath='{.items[*].metadata.name}')
  W2_NODES=$(k get pods -l app=web2 -o jsonpath='{.items[*].spec.nodeName}')
  C1_NODE=$(k get pod client1 -o jsonpath='{.spec.nodeName}') C1_IP=$(k get pod client1 -o jsonpath='{.status.podIP}')
  check "web2's pods run on $N2 ($W2_NODES), client1 on $NODE ($C1_NODE, $C1_IP)" \
    [ "$W2_NODES $C1_NODE" = "$N2 $N2 $NODE" ]
  CIP2=$(k get svc web2 -o jsonpath='{.spec.clusterIP}')
  web2_programmed() { # on both nodes: web2's ClusterIP with its two pods
    [ "$(node_agent ipvs | grep -c -- "-a -t $CIP2:80 ")" = 2 ] &&
      [ "$(AGENT_IP=$N2_IP node_agent ipvs | grep -c -- "-a -t $CIP2:80 ")" = 2 ]
  }
  check "the web2 Service's ClusterIP is programmed with both pods on $NODE and on $N2" until_ 60 web2_programmed
  PODS=$W2_PODS CLIENT_IP=$C1_IP answered "$N2's pods: ClusterIP $CIP2:80 from a pod on $NODE" dial "$CIP2" 80 || true
  PODS=$W2_PODS CLIENT_IP=$C1_IP answered "$N2's pods: NodePort $NODE_IP:30082 from a pod on $NODE" \
    dial "$NODE_IP" 30082 || true
  PODS=$W2_PODS from_node "$N2's pods: ClusterIP $CIP2:80 from $NODE's host network" "http://$CIP2/hostname"
  PODS=$W2_PODS from_node "$N2's pods: NodePort $NODE_IP:30082 from $NODE's host network" \
    "http://$NODE_IP:30082/hostname"
  PODS=$W2_PODS answered "$N2's pods: NodePort $NODE_IP:30082 from outside the nodes" \
    nsx curl -s -m 5 "http://$NODE_IP:30082/hostname" || true
  # what upstream's "should preserve source pod IP for traffic thru service cluster IP" asks: the backend on the
  # other node sees the client pod's own address
  SEEN=$(CLIENT_IP=$C1_IP dial "$CIP2" 80 clientip 2>&1 || true)
  check "$N2's pod sees the client pod's own address through the ClusterIP (${SEEN:-nothing}; client1 $C1_IP)" \
    [ "${SEEN%:*}" = "$C1_IP" ]
fi

# ---- the probes: the kubelet's own counters (prober_probe_total on its /metrics/probes) -------------------------
probes() { # probes CONTAINER: "<probe_type>/<result> <count>" per series of the kipvs-system pods' CONTAINER, summed
  # over the nodes
  local ip
  for ip in "${NODE_IPS[@]}"; do nsx curl -sk -m 10 "https://$ip:10250/metrics/probes"; done |
    awk -v c="container=\"$1\"" 'index($0, c) && index($0, "namespace=\"kipvs-system\"") {
      match($0, /probe_type="[^"]*"/); t = substr($0, RSTART + 12, RLENGTH - 13)
      match($0, /result="[^"]*"/); r = substr($0, RSTART + 8, RLENGTH - 9); n[t "/" r] += $NF }
      END { for (k in n) print k, n[k] }' | sort
}
# The liveness probes start 10 s after the containers (initialDelaySeconds) and run every 10 s: wait until the
# kubelet has run both, so that a fast run does not judge a probe that has not happened yet.
until_ 60 eval 'probes proxier | grep -q "^Liveness/" && probes operator | grep -q "^Liveness/"' || true
RESTARTS=$(k -n kipvs-system get pod "$PP" -o jsonpath='{.status.containerStatuses[0].restartCount}')
PROBE_AT=$(k -n kipvs-system get pod "$PP" -o jsonpath="${PROBE_AT//'{.'/'{.spec.containers[0].'}")
UNHEALTHY=$(k -n kipvs-system get events --field-selector "involvedObject.name=$PP,reason=Unhealthy" -o name | wc -l)
PROXIER_PROBES=$(probes proxier | paste -sd, | sed 's/,/, /g')
OPERATOR_PROBES=$(probes operator | paste -sd, | sed 's/,/, /g')
say "kubelet probes of the proxier ($PROBE, $PROBE_AT): ${PROXIER_PROBES:-none}; of the operator (HTTP): ${OPERATOR_PROBES:-none}"
probed_ok() { # $1: the probe counts: both probes succeeded. A failure below failureThreshold (a 5 s timeout on
  # a loaded, emulated node) is printed above, not judged: what the kubelet acts on is a restart.
  grep -q 'Liveness/successful' <<<"$1" && grep -q 'Readiness/successful' <<<"$1"
}
OPERATOR_RESTARTS=$(k -n kipvs-system get pods -l app.kubernetes.io/name=kipvs-operator \
  -o jsonpath='{range .items[*]}{.status.containerStatuses[0].restartCount}{"\n"}{end}' | awk '{n += $1} END {print n + 0}')
proxier_probed() { probed_ok "$PROXIER_PROBES" && [ "$RESTARTS" = 0 ]; }
operator_probed() { probed_ok "$OPERATOR_PROBES" && [ "$OPERATOR_RESTARTS" = 0 ]; }
check "the kubelet's $PROBE liveness and readiness probes keep the proxier Ready ($RESTARTS restarts, $UNHEALTHY Unhealthy events)" \
  proxier_probed
check "the kubelet's HTTP probes keep the operator Ready ($OPERATOR_RESTARTS restarts)" operator_probed
check "still Ready" proxier_ready
node_agent ipvs | sed 's/^/    /' || true

# ---- a reboot of a node with the default install (issue 33) ----------------------------------------------------
# The ConfigMap kipvs-apiserver deleted (the default install has none), the proxier stopped, the kernel's state as a
# reboot leaves it (`kipvs-proxier cleanup` in a privileged host-network pod, and inet kipvs deleted), the proxier
# started again: with no ClusterIP programmed it must find the API server at the address it remembered on the node
# (/var/lib/kipvs/apiserver, hostPath), program, and be Ready only once it has programmed. KIPVS_NODE_NO_MEMORY=1
# installs without --remember-apiserver: the code path before it (the ClusterIP only), which must fail here.
MEMORY=$(node_agent sh cat /var/lib/kipvs/apiserver 2>/dev/null | grep -v '^#' || true)
check "the proxier remembered the API server's address on the node (${MEMORY:-nothing})" \
  [ "$MEMORY" = "https://$HOST_IP:$CP_PORT/" ]
t_reboot=$(date +%s.%N)
k -n kipvs-system delete configmap kipvs-apiserver > /dev/null
k -n kipvs-system patch ds kipvs-proxier --type=merge \
  -p '{"spec":{"template":{"spec":{"nodeSelector":{"kipvs.test/stopped":"true"}}}}}' > /dev/null
proxier_gone() { [ -z "$(proxier_pod)" ]; }
check "the proxier is stopped" until_ 120 proxier_gone
k apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: kipvs-cleanup, namespace: kipvs-system}
spec:
  nodeName: $NODE
  hostNetwork: true
  restartPolicy: Never
  tolerations: [{operator: Exists}]
  containers:
    - name: cleanup
      image: kipvs.test/kipvs-proxier:$TAG
      args: [cleanup]
      securityContext: {privileged: true}
EOF
cleanup_done() { [ "$(k -n kipvs-system get pod kipvs-cleanup -o jsonpath='{.status.phase}')" = Succeeded ]; }
check "kipvs-proxier cleanup in a privileged host-network pod" until_ 120 cleanup_done
node_agent sh nft delete table inet kipvs > /dev/null 2>&1 || true
k -n kipvs-system delete pod kipvs-cleanup --wait=false > /dev/null
rebooted() { # no virtual server, no kube-ipvs0, no inet kipvs
  [ -z "$(node_agent ipvs | grep -v '^$')" ] && ! node_agent sh ip link show kube-ipvs0 > /dev/null 2>&1 &&
    ! node_agent sh nft list table inet kipvs > /dev/null 2>&1
}
check "the kernel as after a reboot: no virtual server, no kube-ipvs0, no inet kipvs" rebooted
k -n kipvs-system patch ds kipvs-proxier --type=json \
  -p '[{"op":"remove","path":"/spec/template/spec/nodeSelector/kipvs.test~1stopped"}]' > /dev/null
t_start=$(date +%s.%N)
# every second: the pod's Ready condition and the kubernetes Service in the kernel; Ready before programmed is a
# failure (a DaemonSet rolling update would go on past a node that cannot program)
R_PROG="" R_READY="" EARLY=""
for _ in $(seq 150); do
  programmed=0 ready=0
  ! kubernetes_programmed || programmed=1
  ! proxier_ready || ready=1
  [ "$ready" = 0 ] || [ "$programmed" = 1 ] || EARLY=$(elapsed "$t_start")
  [ -n "$R_PROG" ] || [ "$programmed" = 0 ] || R_PROG=$(elapsed "$t_start")
  [ -n "$R_READY" ] || [ "$ready" = 0 ] || R_READY=$(elapsed "$t_start")
  [ -z "$R_PROG" ] || [ -z "$R_READY" ] || break
  vm_alive || break
  sleep 1
done
PP=$(proxier_pod)
check "after the reboot the proxier programmed the kubernetes Service ${R_PROG:-never} s after its start" [ -n "$R_PROG" ]
never_early() { [ -n "$R_READY" ] && [ -z "$EARLY" ]; }
check "after the reboot the pod is Ready ${R_READY:-never} s after its start, not before it programmed${EARLY:+ (Ready unprogrammed at $EARLY s)}" \
  never_early
check "the web Service is programmed again with both pods" until_ 60 web_programmed
from_node "ClusterIP $CIP:80 from the node after the reboot" "http://$CIP/hostname"
FROM=$(k -n kipvs-system logs "$PP" 2>&1 | grep -m1 'Kubernetes API server' | sed 's/.*server=//' || true)
say "after the reboot: the proxier's API server: ${FROM:-?}; the reboot scenario took $(elapsed "$t_reboot") s"
if [ -z "$R_PROG" ] || ! never_early; then
  k -n kipvs-system logs "$PP" --tail=30 2>&1 | sed 's/^/    /' || true
  k -n kipvs-system describe pod "$PP" | tail -n 15 | sed 's/^/    /' || true
fi

# ---- under load: the backends' Deployment restarted, the proxier's DaemonSet updated to a new image tag ----------
# e2e-traffic's load from outside the node (this namespace) through the NodePort of the traffic Service
# (tests/node/traffic.yaml: e2e-traffic backends in pods): 25 new TCP connections/s, 5 UDP datagrams/s, 4 long-lived
# TCP connections sending a line every 200 ms. Each phase prints requests sent / failed and long-lived
# connections broken.
if [ "$MODE" = full ]; then
  k apply -f tests/node/traffic.yaml > /dev/null
  check "the traffic Deployment (e2e-traffic backends) is rolled out" k rollout status deploy/traffic --timeout=300s
  traffic_programmed() { [ "$(node_agent ipvs | grep -c -- "-a -t $NODE_IP:30090 ")" = 3 ]; }
  check "its NodePort $NODE_IP:30090 is programmed with the three pods" until_ 60 traffic_programmed
  TRAFFIC=$TARGET/release/e2e_traffic
  nsx "$TRAFFIC" load --tcp "$NODE_IP:30090" --udp "$NODE_IP:30090" --rate 25 --udp-rate 5 --long 4 \
    --stats "$STATE/load.stats" --stop "$STATE/load.stop" < /dev/null > /dev/null 2> "$STATE/load.log" &
  load_pid=$!
  stats() { cat "$STATE/load.stats" 2>/dev/null; }
  field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
  long_opened() { [ "$(field "$(stats)" long_opened)" = 4 ]; }
  check "load running: 4 long-lived connections" until_ 30 long_opened
  # every pod change from now on, with the load log's clock: when each pod was marked terminating, lost its
  # Ready, and was gone (printed with the load's failures at the end)
  k get pods -A -w --output-watch-events -o wide 2>&1 | while IFS= read -r l; do
    printf '%s %s\n' "$(date +%s.%N | cut -c1-14)" "$l"; done > "$STATE/pods.watch" &
  ipvs_snapshot() { # $1: a name; the traffic NodePort's virtual servers (weights, connections) and IPVS's
    # connections to them, kept in $STATE/ipvs.$1
    node_agent sh "ipvsadm -Ln -t $NODE_IP:30090; ipvsadm -Ln -u $NODE_IP:30090; ipvsadm -Lnc | grep -c ':30090 '" \
      > "$STATE/ipvs.$1" 2>&1 || true
  }
  FIG=()
  begin() { PHASE=$1; LAST=$(stats); say "== $PHASE (from $(date +%s.%N | cut -c1-14), the load log's clock)"; }
  zeros() { local v; for v in "$@"; do [ "$v" = 0 ] || return 1; done; }
  end_phase() { # end_phase LONG_BROKEN_ALLOWED: the phase's figures; a failed request fails the check, and so
    # does a broken long-lived connection beyond LONG_BROKEN_ALLOWED (those on pods that exited); fails with them
    local s d=() f fail0=$fail
    s=$(stats)
    for f in tcp_sent tcp_failed udp_sent udp_failed long_broken long_connect_failed slow pauses; do
      d+=("$(( $(field "$s" "$f") - $(field "$LAST" "$f") ))")
    done
    FIG+=("$(printf '%-34s TCP sent %5d failed %d | UDP sent %4d failed %d | long-lived broken %d (reconnects failed %d) | slower than 1 s %d | load paused %d' \
      "$PHASE" "${d[@]}")")
    say "${FIG[-1]}"
    check "$PHASE: no failed request" zeros "${d[1]}" "${d[3]}" "${d[5]}"
    check "$PHASE: long-lived connections broken ${d[4]} <= $1" [ "${d[4]}" -le "$1" ]
    [ "$fail" = "$fail0" ]
  }
  fail_load=$fail
  begin "steady (20 s)"; sleep 20; end_phase 0 || true
  # Each old pod ends its long-lived connections when it exits (after its preStop sleep, in its grace period):
  # that is the application's end. A connection opened again may land on another old pod and end with it too: at
  # most 4 connections x 3 old pods. New connections must never fail.
  begin "kubectl rollout restart deploy/traffic"
  OLD_PODS=$(k get pods -l app=traffic -o name)
  k rollout restart deploy/traffic > /dev/null
  check "  ... rolled out" k rollout status deploy/traffic --timeout=300s
  # The phase ends when the old pods are gone (each within its grace period after its preStop sleep; e2e-traffic
  # as PID 1 ignores SIGTERM, so the kubelet kills it at the end of the grace period), and the client has seen
  # their connections end (its read timeout, 3 s): a connection on an old pod never breaks in the next phase.
  # shellcheck disable=SC2086 # OLD_PODS: words
  old_gone() { local left; left=$(k get $OLD_PODS --ignore-not-found -o name) && [ -z "$left" ]; }
  check "  ... the old pods are gone" until_ 120 old_gone
  sleep 4
  end_phase 12 || true
  begin "DaemonSet kipvs-proxier to $TAG2"
  ipvs_snapshot before
  t_update=$(date +%s.%N)
  k -n kipvs-system logs -f "$PP" > "$STATE/proxier-old.log" 2>&1 &
  k -n kipvs-system set image ds/kipvs-proxier "proxier=kipvs.test/kipvs-proxier:$TAG2" > /dev/null
  updated_ready() { # NODE's proxier pod runs TAG2 and is Ready
    [ "$(proxier_of -o jsonpath='{range .items[*]}{.spec.containers[0].image} {.status.conditions[?(@.type=="Ready")].status};{end}')" = \
      "kipvs.test/kipvs-proxier:$TAG2 True;" ]
  }
  check "the DaemonSet's pod replaced by one of $TAG2, Ready" until_ 300 updated_ready
  say "  set image -> the new pod Ready: $(elapsed "$t_update") s"
  PP=$(proxier_pod)
  sleep 10
  ipvs_snapshot after
  end_phase 0 || {
    say "the old proxier's last log lines and the new one's first (times in UTC; the load's in Unix seconds):"
    tail -n 15 "$STATE/proxier-old.log" | sed 's/^/    old: /'
    k -n kipvs-system logs "$PP" 2>&1 | head -n 25 | sed 's/^/    new: /' || true
    say "the NodePort in IPVS before the update and after (virtual servers; the count of IPVS's connections):"
    sed 's/^/    before: /' "$STATE/ipvs.before"; sed 's/^/    after:  /' "$STATE/ipvs.after"
  }
  touch "$STATE/load.stop"; wait "$load_pid" || true
  say "load, whole run: $(stats)"
  # every failure with its time and cause and the backend of each long-lived connection, then how many requests
  # were slow (>1 s); the pods' changes when something failed
  grep -v ': slow: ' "$STATE/load.log" | head -n 60 | sed 's/^/    /' || true
  say "requests slower than 1 s: $(grep -c ': slow: ' "$STATE/load.log" || true)"
  if [ "$fail" != "$fail_load" ]; then
    say "pod changes (the load log's clock):"
    sed 's/^/    /' "$STATE/pods.watch"
  fi
fi

# ---- upstream's Service tests: e2e.test against this cluster ------------------------------------------------------
# From the control plane's namespace (the apiserver, the node and its NodePorts reachable, as from a machine of the
# cluster's network), the framework's own provider (local, no cloud), E2E_NODES (3) tests at a time (ginkgo's
# parallel nodes, as upstream runs the non-[Serial] tests). The tests' pods run upstream's images loaded into the
# node (agnhost, pause).
if [ "$MODE" = conformance ]; then
  # every [sig-network] Services test but the one that waits for a cloud's service controller (its load-balancer
  # cleanup finalizer; none runs here); those a one-node cluster cannot run skip themselves and say why. With
  # NODES > 1 also [sig-network] Conntrack and KubeProxy (their tests need two nodes) but "should resolve
  # connection reset issue #74839" (an image of its own, not built here; one node's test)
  if [ "$NODES" = 1 ]; then
    E2E_FOCUS=${E2E_FOCUS:-'\[sig-network\] Services |\[sig-network\] SCTP'}
    E2E_SKIP=${E2E_SKIP:-'\[Flaky\]|load balancer cleanup finalizer'}
  else
    E2E_FOCUS=${E2E_FOCUS:-'\[sig-network\] Services |\[sig-network\] SCTP|\[sig-network\] Conntrack|\[sig-network\] KubeProxy'}
    E2E_SKIP=${E2E_SKIP:-'\[Flaky\]|load balancer cleanup finalizer|#74839'}
  fi
  REPORT=${E2E_REPORT:-$TARGET/node-e2e}
  rm -rf "$REPORT" && mkdir -p "$REPORT"
  # a cloud's load balancer as the tests see it: each LoadBalancer Service gets an address of 203.0.113.0/24 in
  # its status (hack/node/lb-status.py every 2 s), routed to the node, which kipvs programs
  lb_loop() { # (no errexit: a failed round is tried again)
    set +e
    while :; do
      nsx python3 hack/node/lb-status.py "https://$HOST_IP:$CP_PORT" kipvs-test-token "${LB_IP%.*}" >> "$REPORT/lb-status.log" 2>&1
      sleep 2
    done
  }
  lb_loop &
  lb_pid=$!
  say "e2e.test: focus '$E2E_FOCUS', skip '$E2E_SKIP', ${E2E_NODES:-3} at a time (log: $REPORT/e2e.log)"
  t_e2e=$(date +%s)
  nsx "${E2E[1]}" -nodes="${E2E_NODES:-3}" -noColor -focus="$E2E_FOCUS" -skip="$E2E_SKIP" "${E2E[0]}" -- \
    --kubeconfig="$KC" --provider=local --kubectl-path="$(command -v kubectl)" --num-nodes="$NODES" --report-dir="$REPORT" \
    --disable-log-dump --dump-logs-on-failure=false --node-os-distro=debian > "$REPORT/e2e.log" 2>&1 || true
  T_E2E=$(( $(date +%s) - t_e2e ))
  hack/node/e2e-table.py --log "$REPORT/e2e.log" "$REPORT"/junit_*.xml > "$REPORT/table.md" || true
  sed 's/^/    /' "$REPORT/table.md"
  check "e2e.test ran (${T_E2E} s): $(tail -n1 "$REPORT/table.md")" grep -q ' passed, ' "$REPORT/table.md"
  say "the table: $REPORT/table.md; the run's log: $REPORT/e2e.log"
fi

# ---- KEP-3836: a node on its way out fails the proxier's /healthz -----------------------------------------------
if [ "$MODE" = full ]; then
  HZ=http://127.0.0.1:10256/healthz
  healthz_is() { [ "$(node_agent status "$HZ")" = "$1" ]; }
  check "/healthz on the node answers 200" until_ 30 healthz_is 200
  k drain "$NODE" --ignore-daemonsets --delete-emptydir-data --force --timeout=120s > "$STATE/drain.out" 2>&1 ||
    { sed 's/^/    /' "$STATE/drain.out"; bad "kubectl drain"; }
  sleep 5
  check "kubectl drain (cordon + eviction): /healthz stays 200 (as kube-proxy's: deletion and the autoscaler's taint fail it)" \
    healthz_is 200
  k taint node "$NODE" ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule > /dev/null
  check "taint ToBeDeletedByClusterAutoscaler: /healthz 503" until_ 30 healthz_is 503
  sleep 12 # two readiness periods
  if [ "$PROBE" = gRPC ]; then why='its gRPC probes ask service "", liveness'; else why='its HTTP probes GET /livez'; fi
  check "  ... the proxier pod stays Ready ($why)" proxier_ready
  k taint node "$NODE" ToBeDeletedByClusterAutoscaler- > /dev/null
  check "taint removed: /healthz 200 again" until_ 30 healthz_is 200
  k uncordon "$NODE" > /dev/null
fi
node_agent free | sed 's/^/    /' || true

echo
echo "=== node (kube-apiserver $K8S, kubelet in the VM): $pass passed, $fail failed ($(( $(date +%s) - T0 )) s)"
echo "  Node Ready after ${T_READIES[*]} s; apply -> proxier pod Ready ${T_PODREADY:-never} s, -> kubernetes Service programmed ${T_PROG:-never} s"
[ "$MODE" != full ] || printf '  %s\n' "${FIG[@]}"
echo "  machine load: at start $LOAD0; at end $(uptime | sed 's/.*load average/load average/')"
[ "$fail" = 0 ]
