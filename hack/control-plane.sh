#!/bin/bash
# A real Kubernetes control plane for tests, on loopback only: kube-apiserver + Debian's etcd 3.4.
#   - kube-apiserver v1.24.0-alpha.1 when the Kubernetes source tarball is there ($KIPVS_K8S_SRC, default
#     ../shared/k8s next to the repository, or next to the main worktree of a `git worktree`; see its README):
#     built once from it (cache keyed by the tarball's sha256), run with the feature gates
#     CustomResourceValidationExpressions (CRD x-kubernetes-validations, CEL), TopologyAwareHints
#     (EndpointSlice hints) and MixedProtocolLBService (TCP and UDP on one LoadBalancer, for the end to end);
#     it serves discovery.k8s.io/v1 EndpointSlices and dual-stack Services (fd00:10:96::/112);
#   - otherwise kube-apiserver v1.20.2, built once from Debian bookworm's `kubernetes` source package: no v1
#     EndpointSlices and no CEL, so the suites skip (and name) the checks that need 1.24.
#
# usage: hack/control-plane.sh build            build (or find cached) kube-apiserver and etcd
#        hack/control-plane.sh version          print the minor version `start` runs: 1.24 or 1.20
#        hack/control-plane.sh start STATE_DIR  build if needed, start etcd + apiserver, wait for /readyz,
#                                               write STATE_DIR/kubeconfig (token user in system:masters)
#                                               and STATE_DIR/version (as `version` prints)
#        hack/control-plane.sh stop STATE_DIR   stop what `start` started (by the pids it recorded)
#        hack/control-plane.sh stop-apiserver|start-apiserver STATE_DIR
#                                               only the apiserver (an outage; etcd and its data stay)
# env:   CPCACHE (~/.cache/kipvs-cp), CP_PORT (apiserver, 16443), CP_ETCD_PORT (client, 23790; peer = +10),
#        KIPVS_K8S_SRC (directory holding kubernetes-*.tar.xz), KIPVS_K8S_VERSION=1.20 (use the Debian 1.20
#        build even when the 1.24 source is there), CP_BIND_ADDRESS (the apiserver's, 127.0.0.1),
#        CP_APISERVER_FLAGS (more kube-apiserver flags, e.g. --advertise-address), CP_SERVICE_ACCOUNTS=1 (keep the
#        ServiceAccount admission plugin: pods get their token volume; needs kube-controller-manager, whose
#        controllers make each namespace's `default` ServiceAccount; hack/test-node.sh)
#
# Everything else comes from Debian's archive through apt, without changing the machine: the Go 1.19 toolchain
# and rsync (which kubernetes' Makefile needs) are `apt-get download`ed and unpacked with `dpkg -x` into the
# cache (hack/lib/k8s-build.sh, shared with the scripts that build other Kubernetes commands).
#
# 1.24: `k8s_build cmd/kube-apiserver` (hack/lib/k8s-build.sh: ../shared/k8s/README.md's recipe, cached per
# tarball and command; a cold build takes ~6.5 min of CPU on 2 cores) and etcd in the same bin/.
#
# 1.20: `apt-get source` runs against a private sources list + package lists in the cache (no deb-src line is
# added to /etc/apt). Why these steps (found by ../shared/reference/test-infrastructure.md, "Task 2"):
# - the vendored github.com/modern-go/reflect2 v1.0.1 built with Go >= 1.18 crashes the apiserver on the first
#   custom resource create (`fatal error: fault ... mapiternext`): it is replaced by Debian's reflect2 1.0.2;
# - json-iterator 1.1.10 is replaced by Debian's 1.1.12 too, the release made for reflect2 1.0.2;
# - go-openapi's type validator (vendored, validate/type.go) decides "this is null" with
#   reflect.DeepEqual(reflect.Zero(T), reflect.ValueOf(data)), comparing reflect.Value internals: built with
#   Go >= 1.18 an empty string matches, so every custom resource with a "" field is rejected
#   (`Invalid value: "null": ... must be of type string`). JSON data is null only when it is nil: the
#   condition is reduced to `data == nil` (what later kube-openapi versions do);
# - `go build -mod=vendor` fails on this tree (`updates to go.mod needed`): the Makefile is the way in;
# - 1.20 rejects `--insecure-port` other than 0, so tests use the secure port with a static token.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/hack/lib/host-tools.sh" && host_tools # curl, openssl (a fresh machine may lack them)
. "$ROOT/hack/lib/k8s-build.sh" # k8s_tarball, k8s_build (the 1.24 build), k8s_go_tools, k8s_make
CPCACHE=${CPCACHE:-$HOME/.cache/kipvs-cp}
CP_PORT=${CP_PORT:-16443}
CP_ETCD_PORT=${CP_ETCD_PORT:-23790}
FORMAT=3 # bump when the 1.20 build steps below change what ends up in $CPCACHE/bin
export DEBIAN_FRONTEND=noninteractive

log() { printf 'control-plane: %s\n' "$*" >&2; }
quiet_apt() { grep -v -e unsandboxed -e 'pkgAcquire::Run' >&2 || true; }

# Which apiserver `start` runs (1.24 or 1.20), and where its binaries are: sets VERSION and BIN (and STAMP
# for 1.20; the 1.24 build keeps one stamp per command, hack/lib/k8s-build.sh).
select_version() {
  local tarball=""
  if [ "${KIPVS_K8S_VERSION:-}" != 1.20 ]; then tarball=$(k8s_tarball); fi
  if [ -n "$tarball" ]; then
    VERSION=1.24
    BIN=$(k8s_cache)/bin
  else
    VERSION=1.20
    BIN=$CPCACHE/bin
    STAMP=$CPCACHE/stamp
  fi
}

# fetch_etcd W DEST: Debian's etcd-server downloaded into W/debs, its etcd copied to DEST/etcd.
fetch_etcd() {
  local W=$1 D=$2
  deb_fetch "$W/debs" etcd-server
  rm -rf "$W/etcdx" && mkdir -p "$W/etcdx" "$D" && dpkg -x "$W"/debs/etcd-server_*.deb "$W/etcdx"
  cp "$W/etcdx/usr/bin/etcd" "$D/etcd.new" && mv "$D/etcd.new" "$D/etcd" && rm -rf "$W/etcdx"
}

# The 1.20 binaries are there and were built by these steps.
built() {
  [ -f "$STAMP" ] && head -n1 "$STAMP" | grep -qx "format=$FORMAT" && [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd" ]
}

build() {
  select_version
  if [ "$VERSION" = 1.24 ]; then build_124; else build_120; fi
}

build_124() {
  k8s_build cmd/kube-apiserver > /dev/null
  [ -x "$BIN/etcd" ] || fetch_etcd "$(dirname "$BIN")/build" "$BIN"
}

build_120() {
  built && return 0
  local t0 W src
  t0=$(date +%s)
  W=$CPCACHE/work
  # The previous binaries stay usable until the new ones are in place.
  rm -rf "$W" && mkdir -p "$W/apt/lists/partial" "$W/apt/cache/archives/partial" "$W/tools" "$W/bin"
  chmod 777 "$W" # apt's download sandbox user (_apt) writes here
  cd "$W"
  # A private apt configuration with deb-src for bookworm on the machine's own Debian mirror.
  src=$(grep -l 'Suites: bookworm' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
  if [ -n "$src" ]; then
    awk 'BEGIN{RS="";ORS="\n\n"} /Suites: bookworm( |$)/ && !/security/ {sub(/Types: deb/,"Types: deb-src"); print; exit}' \
      "$src" > "$W/apt/debsrc.sources"
  else
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n' > "$W/apt/debsrc.sources"
  fi
  local APTSRC=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$W/apt/none"
    -o "Dir::State::Lists=$W/apt/lists" -o "Dir::Cache=$W/apt/cache")
  mkdir -p "$W/apt/none" && cp "$W/apt/debsrc.sources" "$W/apt/none/"
  log "fetching sources and packages through apt"
  # (apt warns that root downloads unsandboxed into the cache; that warning is filtered, failures are not)
  apt-get "${APTSRC[@]}" update -qq 2>&1 | quiet_apt
  apt-get "${APTSRC[@]}" source -qq --download-only kubernetes 2>&1 | quiet_apt
  apt-get download -qq golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev 2>&1 | quiet_apt
  k8s_go_tools "$W"
  fetch_etcd "$W" "$W/bin"
  log "unpacking kubernetes source"
  tar xzf kubernetes_*.orig.tar.gz
  local K
  K=$(find "$W" -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
  local pkg dir
  for pkg in golang-github-modern-go-reflect2-dev:github.com/modern-go/reflect2 \
             golang-github-json-iterator-go-dev:github.com/json-iterator/go; do
    dir=${pkg#*:}
    mkdir -p "deb-${pkg%%:*}" && dpkg -x "${pkg%%:*}"_*.deb "deb-${pkg%%:*}"
    find "$K/vendor/$dir" -maxdepth 1 -type f -name '*.go' -delete
    find "deb-${pkg%%:*}/usr/share/gocode/src/$dir" -maxdepth 1 -name '*.go' ! -name '*_test.go' \
      -exec cp {} "$K/vendor/$dir/" \;
  done
  local zero='data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))'
  local patched
  patched=$(grep -rlF "$zero" "$K/vendor" || true)
  [ -n "$patched" ] || { log "build: go-openapi's zero-value check not found; the patch needs updating"; exit 1; }
  for f in $patched; do sed -i "s/data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))/data == nil/" "$f"; done
  log "patched the null check in: ${patched//$K\//}"
  log "building kube-apiserver (several minutes; log: $W/build.log)"
  k8s_make "$W" "$K" "$W/build.log" GOFLAGS= KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
    make WHAT=cmd/kube-apiserver
  cp "$K/_output/bin/kube-apiserver" "$W/bin/"
  rm -rf "$BIN" && mkdir -p "$(dirname "$BIN")" && mv "$W/bin" "$BIN"
  { echo "format=$FORMAT"; "$BIN/kube-apiserver" --version; "$BIN/etcd" --version | head -n1; } > "$STAMP"
  cd "$CPCACHE" && rm -rf "$W"
  log "built in $(( $(date +%s) - t0 ))s: $(sed -n 2p "$STAMP")"
}

start() {
  local S=$1
  build
  S=$(realpath -m "$S"); mkdir -p "$S"
  stop "$S" 2>/dev/null || true
  rm -rf "$S/etcd"
  openssl genrsa -out "$S/sa.key" 2048 2>/dev/null
  echo "kipvs-test-token,admin,0,system:masters" > "$S/tokens.csv"
  "$BIN/etcd" --data-dir "$S/etcd" --listen-client-urls "http://127.0.0.1:$CP_ETCD_PORT" \
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
  local S=$1 gates=() range=10.96.0.0/16 admission=(--disable-admission-plugins=ServiceAccount)
  [ "${CP_SERVICE_ACCOUNTS:-0}" != 1 ] || admission=()
  if [ "$VERSION" = 1.24 ]; then # dual-stack Services (GA in 1.23), CEL, EndpointSlice hints, TCP+UDP LoadBalancers
    range=$range,fd00:10:96::/112
    gates=(--feature-gates=CustomResourceValidationExpressions=true,TopologyAwareHints=true,MixedProtocolLBService=true)
  fi
  # shellcheck disable=SC2086 # CP_APISERVER_FLAGS: words
  "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$CP_ETCD_PORT" --bind-address="${CP_BIND_ADDRESS:-127.0.0.1}" \
    --secure-port="$CP_PORT" --cert-dir="$S/certs" --service-cluster-ip-range=$range \
    --token-auth-file="$S/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$S/sa.key" \
    --service-account-signing-key-file="$S/sa.key" --api-audiences=https://kubernetes.default.svc \
    --enable-priority-and-fairness=false "${admission[@]}" "${gates[@]}" \
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
