# Sourced: the Kubernetes components of the test layers. They come from one of two places:
#   - KIPVS_K8S_BIN=DIR: the binaries of any release a tester brings (kube-apiserver, kube-controller-manager,
#     kube-scheduler, kubelet, kube-proxy, e2e.test, ginkgo; each layer takes those it needs);
#   - otherwise Debian bookworm's `kubernetes` source package (1.20.2, the whole tree with vendor/), fetched with
#     `apt-get source` through a private apt configuration (nothing is added to /etc/apt), built offline with
#     Debian's Go 1.19 (golang-1.19-go, -src, and rsync, which the Makefile needs, `apt-get download`ed and
#     unpacked with `dpkg -x`), cached in $(k8s_cache).
# The harness keys what it does on the release it finds (k8s_minor), never on where the binaries came from.
#
# k8s_bin NAME...: prints the path of each component NAME, one a line, in argument order: DIR/NAME with
#   KIPVS_K8S_BIN, else the Debian build (built once, all missing ones in one `make`). agnhost (a test image,
#   not a release component) is DIR/agnhost when DIR has it, else the Debian build. Logs on stderr which
#   binary it took with its `--version`.
#   Errors: NAME missing from DIR, a failed download or build (exit status 1, message on stderr).
# k8s_minor_of PATH: the minor version (20, 24, 33, ...) of the component at PATH, from its `--version`.
#   Errors: no `v1.N` in that output (exit status 1, message on stderr).
# k8s_minor: k8s_minor_of the kube-apiserver k8s_bin gives (builds it if needed): the release under test.
# k8s_gates MINOR: the feature gates (pkg/features) the tests need that release MINOR knows and has off by
#   default, one NAME=true a line: EndpointSlice serving/terminating conditions and nodeName, dual-stack
#   Services, TCP and UDP on one LoadBalancer, EndpointSlice hints. kube-apiserver and kube-controller-manager
#   (whose EndpointSlice controller writes the conditions) take the same.
# k8s_install MINOR: the install for kubelets of that release: config/ (gRPC probes, KEP-2727: 1.24 and newer),
#   else config-http-probes/.
# k8s_apply_flags MINOR: kubectl apply's flags for that install: --validate=false before 1.23, whose schema has no
#   x-kubernetes-validations (CEL) for kubectl's client-side validation.
# k8s_tree: (the Debian source) prints the unpacked, patched tree, fetching and unpacking it when needed; for
#   callers outside k8s_build_debian, which holds the build lock: k8s_source does the same under that lock.
# k8s_cache: prints the Debian build's cache directory, $CPCACHE/k8s-debian.
#
# Why the tree is patched (Go 1.19 builds a 1.20 that breaks otherwise):
# - the vendored github.com/modern-go/reflect2 v1.0.1 built with Go >= 1.18 crashes on the first custom
#   resource create (`fatal error: fault ... mapiternext`): replaced by Debian's reflect2 1.0.2, and
#   json-iterator 1.1.10 by Debian's 1.1.12, the release made for it;
# - go-openapi's type validator (vendored, validate/type.go) decides "this is null" with
#   reflect.DeepEqual(reflect.Zero(T), reflect.ValueOf(data)), comparing reflect.Value internals: with Go >= 1.18
#   an empty string matches, so every custom resource with a "" field is rejected. The condition is reduced to
#   `data == nil` (what later kube-openapi versions do);
# - `go build -mod=vendor` fails on this tree (`updates to go.mod needed`): the Makefile is the way in.
# e2e.test is built with its network tests only (e2e_test.go and e2e.go cut: no other test package, no cloud
# provider), which cuts its build to what the node's conformance mode runs.
#
# env: CPCACHE (~/.cache/kipvs-cp), KIPVS_K8S_BIN (directory of binaries)
# needs: hack/lib/host-tools.sh sourced (deb_fetch)
K8S_BUILD_FORMAT=2 # bump when the build steps below change what ends up in bin/
K8S_DEB_VERSION=v1.20.2
K8S_GIT_ENV=(KUBE_GIT_VERSION=$K8S_DEB_VERSION KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 KUBE_GIT_TREE_STATE=clean)

k8s_cache() { echo "${CPCACHE:-$HOME/.cache/kipvs-cp}/k8s-debian"; }

k8s_log() { printf 'k8s: %s\n' "$*" >&2; }

# k8s_go_tools DIR: Go 1.19 and an rsync wrapper (it runs with the unpacked libpopt) under DIR/tools.
k8s_go_tools() {
  local W=$1 d
  [ -x "$W/tools/bin/rsync" ] && [ -x "$W/tools/usr/lib/go-1.19/bin/go" ] && return 0
  deb_fetch "$W/debs" golang-1.19-go golang-1.19-src rsync libpopt0 || return 1
  for d in golang-1.19-go golang-1.19-src rsync libpopt0; do dpkg -x "$W/debs/$d"_*.deb "$W/tools"; done
  mkdir -p "$W/tools/bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$W/tools/usr/lib/x86_64-linux-gnu:$W/tools/lib/x86_64-linux-gnu" \
    "$W/tools/usr/bin/rsync" > "$W/tools/bin/rsync"
  chmod +x "$W/tools/bin/rsync"
}

# k8s_make DIR SRC LOG VAR=VALUE... CMD...: CMD in SRC with DIR's Go, offline (GOPROXY=off, GOTOOLCHAIN=local,
# static: CGO_ENABLED=0, GOCACHE=DIR/gocache, linux/amd64), the extra environment given, output in LOG.
k8s_make() {
  local W=$1 K=$2 LOG=$3
  shift 3
  (cd "$K" && env PATH="$W/tools/bin:$W/tools/usr/lib/go-1.19/bin:$PATH" GOROOT="$W/tools/usr/lib/go-1.19" \
    GOPROXY=off CGO_ENABLED=0 GOTOOLCHAIN=local GOCACHE="$W/gocache" KUBE_BUILD_PLATFORMS=linux/amd64 \
    "$@" >> "$LOG" 2>&1) ||
    { tail -n 40 "$LOG" >&2; k8s_log "build failed (log: $LOG)"; return 1; }
}

# k8s_fetch_source W: `apt-get source --download-only kubernetes` and the replacement Go packages into W/src-debs.
k8s_fetch_source() {
  local W=$1 S=$1/src-debs src
  [ -f "$S.done" ] && return 0
  rm -rf "$W/apt" "$S" && mkdir -p "$W/apt/lists/partial" "$W/apt/cache/archives/partial" "$W/apt/parts" "$S"
  chmod 777 "$S" # apt's download sandbox user (_apt) writes here
  # deb-src for bookworm on the machine's own Debian mirror, in a private apt configuration
  src=$(grep -l 'Suites: bookworm' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
  if [ -n "$src" ]; then
    awk 'BEGIN{RS="";ORS="\n\n"} /Suites: bookworm( |$)/ && !/security/ {sub(/Types: deb/,"Types: deb-src"); print; exit}' \
      "$src" > "$W/apt/parts/debsrc.sources"
  else
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n' \
      > "$W/apt/parts/debsrc.sources"
  fi
  local APTSRC=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$W/apt/parts"
    -o "Dir::State::Lists=$W/apt/lists" -o "Dir::Cache=$W/apt/cache")
  k8s_log "fetching Debian's kubernetes source package through apt"
  apt-get "${APTSRC[@]}" update -qq 2>&1 | grep -v -e unsandboxed -e 'pkgAcquire::Run' >&2 || true
  (cd "$S" && apt-get "${APTSRC[@]}" source -qq --download-only kubernetes 2>&1) |
    grep -v -e unsandboxed -e 'pkgAcquire::Run' >&2 || true
  compgen -G "$S/kubernetes_*.orig.tar.gz" > /dev/null || { k8s_log "apt-get source kubernetes failed"; return 1; }
  deb_fetch "$S" golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev || return 1
  touch "$S.done" # an interrupted fetch starts again
}

k8s_tree() {
  local C W K pkg dir zero patched f
  C=$(k8s_cache)
  W=$C/build
  K=$W/src/kubernetes-${K8S_DEB_VERSION#v}
  [ -f "$W/src.done" ] && { echo "$K"; return 0; }
  mkdir -p "$W" && chmod 777 "$W"
  k8s_go_tools "$W" && k8s_fetch_source "$W" || return 1
  rm -rf "$W/src" && mkdir -p "$W/src" && tar -xzf "$W"/src-debs/kubernetes_*.orig.tar.gz -C "$W/src" || return 1
  [ -f "$K/Makefile" ] || { k8s_log "no $K/Makefile in Debian's kubernetes source"; return 1; }
  for pkg in golang-github-modern-go-reflect2-dev:github.com/modern-go/reflect2 \
             golang-github-json-iterator-go-dev:github.com/json-iterator/go; do
    dir=${pkg#*:}
    rm -rf "$W/deb" && mkdir -p "$W/deb" && dpkg -x "$W/src-debs/${pkg%%:*}"_*.deb "$W/deb"
    find "$K/vendor/$dir" -maxdepth 1 -type f -name '*.go' -delete
    find "$W/deb/usr/share/gocode/src/$dir" -maxdepth 1 -name '*.go' ! -name '*_test.go' -exec cp {} "$K/vendor/$dir/" \;
  done
  rm -rf "$W/deb"
  zero='data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))'
  patched=$(grep -rlF "$zero" "$K/vendor" || true)
  [ -n "$patched" ] || { k8s_log "go-openapi's zero-value check not found; the patch needs updating"; return 1; }
  for f in $patched; do sed -i "s/data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))/data == nil/" "$f"; done
  touch "$W/src.done"
  echo "$K"
}

k8s_gates() {
  local m=$1
  [ "$m" -gt 21 ] || echo EndpointSliceTerminatingCondition=true # alpha in 1.20-1.21
  [ "$m" -gt 20 ] || printf '%s\n' EndpointSliceNodeName=true IPv6DualStack=true # alpha in 1.20
  [ "$m" -gt 24 ] || echo MixedProtocolLBService=true # alpha 1.20-1.23, beta 1.24
  [ "$m" -lt 21 ] || [ "$m" -gt 23 ] || echo TopologyAwareHints=true # alpha 1.21-1.22, beta off in 1.23
}

k8s_install() { if [ "$1" -ge 24 ]; then echo config/; else echo config-http-probes/; fi; }

k8s_apply_flags() { [ "$1" -ge 23 ] || echo --validate=false; }

k8s_source() {
  local C
  C=$(k8s_cache)
  mkdir -p "$C"
  (flock 9; k8s_tree) 9> "$C/build.lock"
}

# k8s_pkg NAME: the package of the tree that builds NAME
k8s_pkg() {
  case $1 in
    agnhost) echo test/images/agnhost ;;
    e2e.test | ginkgo) echo "$1" ;;
    *) echo "cmd/$1" ;;
  esac
}

# k8s_built NAME: bin/NAME of the Debian build is there and was built by these steps
k8s_built() {
  local C
  C=$(k8s_cache)
  [ -x "$C/bin/$1" ] && [ -f "$C/stamp.$1" ] && head -n1 "$C/stamp.$1" | grep -qx "format=$K8S_BUILD_FORMAT"
}

k8s_stamp() {
  local C
  C=$(k8s_cache)
  { echo "format=$K8S_BUILD_FORMAT"; "$C/bin/$1" --version 2>/dev/null | head -n1 || true; } > "$C/stamp.$1"
}

# k8s_build_debian NAME...: builds each NAME not cached yet (one `make WHAT=...` for the commands, `go test -c`
# for e2e.test), under a lock (concurrent callers wait for each other).
k8s_build_debian() {
  local C
  C=$(k8s_cache)
  mkdir -p "$C/bin"
  (
    flock 9
    local n want=() e2e=() t0 W K LOG
    for n in "$@"; do
      k8s_built "$n" && continue
      case $n in e2e.test | ginkgo) e2e=(e2e.test ginkgo) ;; *) want+=("$(k8s_pkg "$n")") ;; esac
    done
    [ ${#want[@]} -gt 0 ] || [ ${#e2e[@]} -gt 0 ] || exit 0
    t0=$(date +%s)
    W=$C/build
    LOG=$W/build.log
    K=$(k8s_tree) || exit 1
    if [ ${#want[@]} -gt 0 ]; then
      k8s_log "building ${want[*]} from Debian's kubernetes $K8S_DEB_VERSION (several minutes; log: $LOG)"
      # KUBE_STATIC_OVERRIDES: 1.20 links the kubelet and agnhost dynamically unless told (CGO_ENABLED=0 is set too)
      k8s_make "$W" "$K" "$LOG" "${K8S_GIT_ENV[@]}" KUBE_STATIC_OVERRIDES="kubelet agnhost" GOFLAGS= \
        make WHAT="${want[*]}" || exit 1
      for n in "${want[@]}"; do
        n=$(basename "$n")
        cp "$K/_output/bin/$n" "$C/bin/$n.new" && mv "$C/bin/$n.new" "$C/bin/$n" && k8s_stamp "$n" || exit 1
      done
    fi
    if [ ${#e2e[@]} -gt 0 ]; then
      k8s_log "building test/e2e (network tests) and ginkgo from Debian's kubernetes (10 min or more; log: $LOG)"
      k8s_build_e2e "$W" "$K" "$LOG" "$C/bin" || exit 1
      k8s_stamp e2e.test && k8s_stamp ginkgo || exit 1
    fi
    k8s_log "built in $(( $(date +%s) - t0 ))s"
  ) 9> "$C/build.lock"
}

# k8s_build_e2e W TREE LOG BIN: e2e.test (network tests only) and ginkgo into BIN, through the Makefile (1.20
# builds in GOPATH mode; `go test -mod=vendor` fails on this tree). The tree is the build's own unpacked copy:
# e2e_test.go and e2e.go are cut to the network tests, without cloud providers, in place.
k8s_build_e2e() {
  local W=$1 K=$2 LOG=$3 B=$4
  python3 - "$K" <<'PY' || return 1
import os, re, sys
tree = sys.argv[1]
for rel, pattern in (("test/e2e/e2e_test.go", r'\t_ "k8s.io/kubernetes/test/e2e/(?!network")[^"]*"\n'),
                     ("test/e2e/e2e.go", r'\t_ "k8s.io/kubernetes/test/e2e/framework/providers/[^"]*"\n')):
    path = os.path.join(tree, rel)
    with open(path) as f:
        text = f.read()
    text = re.sub(pattern, "", text)  # a second run finds nothing left to cut
    assert rel.endswith("e2e.go") or '"k8s.io/kubernetes/test/e2e/network"' in text, f"{rel}: no network tests"
    with open(path, "w") as f:
        f.write(text)
PY
  k8s_make "$W" "$K" "$LOG" "${K8S_GIT_ENV[@]}" GOFLAGS= make WHAT="test/e2e/e2e.test vendor/github.com/onsi/ginkgo/ginkgo" ||
    return 1
  cp "$K/_output/bin/e2e.test" "$B/e2e.test.new" && cp "$K/_output/bin/ginkgo" "$B/ginkgo.new" &&
    mv "$B/e2e.test.new" "$B/e2e.test" && mv "$B/ginkgo.new" "$B/ginkgo"
}

k8s_bin() {
  [ $# -gt 0 ] || { echo "usage: k8s_bin NAME..." >&2; return 2; }
  local n debian=() out=()
  for n in "$@"; do
    if [ -n "${KIPVS_K8S_BIN:-}" ] && [ -x "$KIPVS_K8S_BIN/$n" ]; then
      continue
    elif [ -n "${KIPVS_K8S_BIN:-}" ] && [ "$n" != agnhost ]; then
      k8s_log "KIPVS_K8S_BIN=$KIPVS_K8S_BIN has no executable $n"; return 1
    fi
    debian+=("$n")
  done
  [ ${#debian[@]} -eq 0 ] || k8s_build_debian "${debian[@]}" || return 1
  for n in "$@"; do
    if [ -n "${KIPVS_K8S_BIN:-}" ] && [ -x "$KIPVS_K8S_BIN/$n" ]; then out+=("$(realpath "$KIPVS_K8S_BIN/$n")")
    else out+=("$(k8s_cache)/bin/$n"); fi
    k8s_log "$n: ${out[-1]} ($(k8s_version_of "${out[-1]}"))"
  done
  printf '%s\n' "${out[@]}"
}

# k8s_version_of PATH: the first version line PATH prints (e2e.test and ginkgo print theirs differently)
k8s_version_of() {
  local v
  v=$("$1" --version 2>/dev/null | head -n1 || true)
  [ -n "$v" ] || v=$("$1" version 2>/dev/null | head -n1 || true)
  echo "${v:-no version}"
}

k8s_minor_of() {
  local v
  v=$("$1" --version 2> /dev/null | grep -o 'v1\.[0-9]*' | head -n1 || true)
  [ -n "$v" ] || { k8s_log "$1 --version: no release"; return 1; }
  echo "${v#v1.}"
}

k8s_minor() {
  local api
  api=$(k8s_bin kube-apiserver 2> /dev/null) || { k8s_log "no kube-apiserver (k8s_bin kube-apiserver says why)"; return 1; }
  k8s_minor_of "$api"
}
