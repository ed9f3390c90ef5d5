#!/bin/bash
# A real Kubernetes control plane for tests: kube-apiserver v1.20.2, built once from Debian bookworm's
# `kubernetes` source package (the full tree with vendor/), and Debian's etcd 3.4, both on loopback only.
#
# usage: hack/control-plane.sh build            build (or find cached) $CPCACHE/bin/{kube-apiserver,etcd}
#        hack/control-plane.sh start STATE_DIR  build if needed, start etcd + apiserver, wait for /readyz,
#                                               write STATE_DIR/kubeconfig (token user in system:masters)
#        hack/control-plane.sh stop STATE_DIR   stop what `start` started (by the pids it recorded)
# env:   CPCACHE (~/.cache/kipvs-cp), CP_PORT (apiserver, 16443), CP_ETCD_PORT (client, 23790; peer = +10)
#
# Everything comes from Debian's archive through apt, without changing the machine: the Go 1.19 toolchain and
# rsync (which kubernetes' Makefile needs) are `apt-get download`ed and unpacked with `dpkg -x` into the cache;
# `apt-get source` runs against a private sources list + package lists in the cache (no deb-src line is added
# to /etc/apt). The cold build takes ~6 min of CPU and leaves only the two binaries (~120 MB) plus a stamp.
#
# Why these steps (found by ../shared/reference/test-infrastructure.md, "Task 2"):
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
. "$(dirname "$0")/lib/host-tools.sh" && host_tools # curl, openssl (a fresh machine may lack them)
CPCACHE=${CPCACHE:-$HOME/.cache/kipvs-cp}
CP_PORT=${CP_PORT:-16443}
CP_ETCD_PORT=${CP_ETCD_PORT:-23790}
FORMAT=3 # bump when the build steps below change what ends up in $CPCACHE/bin
STAMP=$CPCACHE/stamp
BIN=$CPCACHE/bin
export DEBIAN_FRONTEND=noninteractive

log() { printf 'control-plane: %s\n' "$*" >&2; }
quiet_apt() { grep -v -e unsandboxed -e 'pkgAcquire::Run' >&2 || true; }

build() {
  if [ -f "$STAMP" ] && head -n1 "$STAMP" | grep -qx "format=$FORMAT" &&
     [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd" ]; then
    return 0
  fi
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
  apt-get download -qq etcd-server golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev \
    golang-1.19-go golang-1.19-src rsync libpopt0 2>&1 | quiet_apt
  for d in golang-1.19-go golang-1.19-src rsync libpopt0; do dpkg -x "$d"_*.deb "$W/tools"; done
  # rsync and its libpopt from the cache, through a wrapper so nothing else sees LD_LIBRARY_PATH
  mkdir -p "$W/tools/bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$W/tools/usr/lib/x86_64-linux-gnu:$W/tools/lib/x86_64-linux-gnu" \
    "$W/tools/usr/bin/rsync" > "$W/tools/bin/rsync"
  chmod +x "$W/tools/bin/rsync"
  mkdir -p etcdx && dpkg -x etcd-server_*.deb etcdx && cp etcdx/usr/bin/etcd "$W/bin/"
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
  log "building kube-apiserver (several minutes)"
  (cd "$K" && env PATH="$W/tools/bin:$W/tools/usr/lib/go-1.19/bin:$PATH" GOROOT="$W/tools/usr/lib/go-1.19" \
    GOPROXY=off GOFLAGS= CGO_ENABLED=0 GOCACHE="$W/gocache" \
    KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
    KUBE_BUILD_PLATFORMS=linux/amd64 make WHAT=cmd/kube-apiserver >"$W/build.log" 2>&1) ||
    { tail -n 40 "$W/build.log" >&2; log "build failed (log: $W/build.log)"; exit 1; }
  cp "$K/_output/bin/kube-apiserver" "$W/bin/"
  rm -rf "$BIN" && mv "$W/bin" "$BIN"
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
  "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$CP_ETCD_PORT" --bind-address=127.0.0.1 \
    --secure-port="$CP_PORT" --cert-dir="$S/certs" --service-cluster-ip-range=10.96.0.0/16 \
    --token-auth-file="$S/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$S/sa.key" \
    --service-account-signing-key-file="$S/sa.key" --api-audiences=https://kubernetes.default.svc \
    --enable-priority-and-fairness=false --disable-admission-plugins=ServiceAccount > "$S/apiserver.log" 2>&1 &
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
  cat > "$S/kubeconfig" <<EOT
apiVersion: v1
kind: Config
clusters: [{name: kipvs-cp, cluster: {server: "https://127.0.0.1:$CP_PORT", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: kipvs-test-token}}]
contexts: [{name: kipvs-cp, context: {cluster: kipvs-cp, user: admin, namespace: default}}]
current-context: kipvs-cp
EOT
  log "ready after ~$((i / 2))s at https://127.0.0.1:$CP_PORT (kubeconfig: $S/kubeconfig)"
}

stop() {
  local S=$1 f pid
  for f in "$S/apiserver.pid" "$S/etcd.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
}

case "${1:-}" in
  build) build ;;
  start) [ -n "${2:-}" ] || { echo "usage: $0 start STATE_DIR" >&2; exit 2; }; start "$2" ;;
  stop) [ -n "${2:-}" ] || { echo "usage: $0 stop STATE_DIR" >&2; exit 2; }; stop "$2" ;;
  *) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
