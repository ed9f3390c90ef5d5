#!/bin/bash
# A real Kubernetes control plane for tests, on loopback only: kube-apiserver + Debian's etcd 3.4.
# kube-apiserver is Debian's 1.20.2, built once from Debian bookworm's `kubernetes` source package, or the one
# in KIPVS_K8S_BIN (hack/lib/k8s-build.sh). It runs with the feature gates its release needs for the tests
# and knows (apiserver_gates): EndpointSlice serving/terminating conditions and nodeName, dual-stack Services
# (fd00:10:96::/112), TCP and UDP on one LoadBalancer, EndpointSlice hints, CRD validation rules (CEL).
#
# usage: hack/control-plane.sh build            build (or find cached) kube-apiserver and etcd
#        hack/control-plane.sh version          print the release `start` runs, as 1.MINOR (1.20, 1.33, ...)
#        hack/control-plane.sh start STATE_DIR  build if needed, start etcd + apiserver, wait for /readyz,
#                                               write STATE_DIR/kubeconfig (token user in system:masters)
#                                               and STATE_DIR/version (as `version` prints)
#        hack/control-plane.sh stop STATE_DIR   stop what `start` started (by the pids it recorded)
#        hack/control-plane.sh stop-apiserver|start-apiserver STATE_DIR
#                                               only the apiserver (an outage; etcd and its data stay)
# env:   CPCACHE (~/.cache/kipvs-cp), CP_PORT (apiserver, 16443), CP_ETCD_PORT (client, 23790; peer = +10),
#        KIPVS_K8S_BIN (directory of Kubernetes binaries; default: the Debian build), CP_BIND_ADDRESS (the
#        apiserver's, 127.0.0.1), CP_APISERVER_FLAGS (more kube-apiserver flags, e.g. --advertise-address),
#        CP_SERVICE_ACCOUNTS=1 (keep the ServiceAccount admission plugin: pods get their token volume; needs
#        kube-controller-manager, whose controllers make each namespace's `default` ServiceAccount;
#        hack/test-node.sh)
# 1.20 rejects `--insecure-port` other than 0, so tests use the secure port with a static token.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/hack/lib/host-tools.sh" && host_tools # curl, openssl (a fresh machine may lack them)
. "$ROOT/hack/lib/k8s-build.sh" # k8s_bin, k8s_minor_of, k8s_gates
CPCACHE=${CPCACHE:-$HOME/.cache/kipvs-cp}
CP_PORT=${CP_PORT:-16443}
CP_ETCD_PORT=${CP_ETCD_PORT:-23790}
export DEBIAN_FRONTEND=noninteractive

log() { printf 'control-plane: %s\n' "$*" >&2; }

# select_version: sets APISERVER (its path), ETCD (Debian's, in the cache) and VERSION
# (1.MINOR of that kube-apiserver).
select_version() {
  APISERVER=$(k8s_bin kube-apiserver) || exit 1
  VERSION=1.$(k8s_minor_of "$APISERVER") || exit 1
  ETCD=$CPCACHE/etcd/etcd
}

# fetch_etcd: Debian's etcd-server, its etcd at $ETCD.
fetch_etcd() {
  local W=$CPCACHE/etcd
  [ -x "$ETCD" ] && return 0
  deb_fetch "$W/debs" etcd-server
  rm -rf "$W/x" && mkdir -p "$W/x" && dpkg -x "$W"/debs/etcd-server_*.deb "$W/x"
  cp "$W/x/usr/bin/etcd" "$ETCD.new" && mv "$ETCD.new" "$ETCD" && rm -rf "$W/x"
}

build() {
  mkdir -p "$CPCACHE"
  select_version
  fetch_etcd
}

# apiserver_gates MINOR: --feature-gates for kube-apiserver of release MINOR: k8s_gates, and CRD validation rules
# (CEL: alpha 1.23-1.24)
apiserver_gates() {
  local g
  mapfile -t g < <(k8s_gates "$1"; [ "$1" -lt 23 ] || [ "$1" -gt 24 ] || echo CustomResourceValidationExpressions=true)
  [ ${#g[@]} -eq 0 ] || { local IFS=,; echo "--feature-gates=${g[*]}"; }
}

start() {
  local S=$1
  build
  S=$(realpath -m "$S"); mkdir -p "$S"
  stop "$S" 2>/dev/null || true
  rm -rf "$S/etcd"
  openssl genrsa -out "$S/sa.key" 2048 2>/dev/null
  echo "kipvs-test-token,admin,0,system:masters" > "$S/tokens.csv"
  "$ETCD" --data-dir "$S/etcd" --listen-client-urls "http://127.0.0.1:$CP_ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$CP_ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((CP_ETCD_PORT + 10))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((CP_ETCD_PORT + 10))" \
    --initial-cluster "default=http://127.0.0.1:$((CP_ETCD_PORT + 10))" --unsafe-no-fsync > "$S/etcd.log" 2>&1 &
  echo $! > "$S/etcd.pid"
  # The apiserver gives up on a slow etcd ("context deadline exceeded"): start it once etcd answers.
  local e
  for e in $(seq 1 120); do
    curl -s -m 2 "http://127.0.0.1:$CP_ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"' && break
    if ! kill -0 "$(cat "$S/etcd.pid")" 2>/dev/null; then
      tail -n 20 "$S/etcd.log" >&2; log "etcd exited"; exit 1
    fi
    sleep 0.5
  done
  apiserver "$S"
  cat > "$S/kubeconfig" <<EOT
apiVersion: v1
kind: Config
clusters: [{name: kipvs-cp, cluster: {server: "https://127.0.0.1:$CP_PORT", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: kipvs-test-token}}]
contexts: [{name: kipvs-cp, context: {cluster: kipvs-cp, user: admin, namespace: default}}]
current-context: kipvs-cp
EOT
  echo "$VERSION" > "$S/version"
}

# apiserver STATE_DIR: start kube-apiserver on the etcd `start` started, wait for /readyz.
apiserver() {
  local S=$1 gates admission=(--disable-admission-plugins=ServiceAccount)
  [ "${CP_SERVICE_ACCOUNTS:-0}" != 1 ] || admission=()
  gates=$(apiserver_gates "${VERSION#1.}")
  # shellcheck disable=SC2086 # CP_APISERVER_FLAGS: words
  "$APISERVER" --etcd-servers="http://127.0.0.1:$CP_ETCD_PORT" --bind-address="${CP_BIND_ADDRESS:-127.0.0.1}" \
    --secure-port="$CP_PORT" --cert-dir="$S/certs" --service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112 \
    --token-auth-file="$S/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$S/sa.key" \
    --service-account-signing-key-file="$S/sa.key" --api-audiences=https://kubernetes.default.svc \
    --enable-priority-and-fairness=false "${admission[@]}" $gates \
    --allow-privileged=true ${CP_APISERVER_FLAGS:-} \
    >> "$S/apiserver.log" 2>&1 &
  echo $! > "$S/apiserver.pid"
  local i ok=""
  for i in $(seq 1 240); do
    if [ "$(curl -sk -m 2 -H 'Authorization: Bearer kipvs-test-token' "https://127.0.0.1:$CP_PORT/readyz" 2>/dev/null)" = ok ]; then
      ok=1; break
    fi
    kill -0 "$(cat "$S/apiserver.pid")" 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$ok" ]; then
    tail -n 20 "$S/apiserver.log" >&2; tail -n 5 "$S/etcd.log" >&2
    stop "$S"; log "apiserver did not become ready"; exit 1
  fi
  log "kube-apiserver $VERSION ready after ~$((i / 2))s at https://127.0.0.1:$CP_PORT (state: $S)"
}

# stop_pid FILE: stop the process FILE names (SIGTERM, SIGKILL after 5 s)
stop_pid() {
  local pid
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

stop() {
  stop_pid "$1/apiserver.pid"
  stop_pid "$1/etcd.pid"
}

case "${1:-}" in
  build) build ;;
  version) select_version; echo "$VERSION" ;;
  start) [ -n "${2:-}" ] || { echo "usage: $0 start STATE_DIR" >&2; exit 2; }; start "$2" ;;
  stop) [ -n "${2:-}" ] || { echo "usage: $0 stop STATE_DIR" >&2; exit 2; }; stop "$2" ;;
  stop-apiserver) [ -n "${2:-}" ] || { echo "usage: $0 stop-apiserver STATE_DIR" >&2; exit 2; }
    stop_pid "$2/apiserver.pid" ;;
  start-apiserver) [ -d "${2:-}" ] || { echo "usage: $0 start-apiserver STATE_DIR" >&2; exit 2; }
    select_version; apiserver "$(realpath "$2")" ;;
  *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
