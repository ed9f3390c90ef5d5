# Sourced: builds Kubernetes commands from the source tarball in ../shared/k8s (its README.md has the recipe),
# offline, with Debian's Go 1.19, into the control-plane cache. Used by hack/control-plane.sh (kube-apiserver),
# the kube-proxy scripts (hack/kube-proxy-vm.sh) and any other script that needs a real Kubernetes component.
#
# k8s_tarball: prints the Kubernetes source tarball ($KIPVS_K8S_SRC, or shared/k8s next to this checkout, or
#   next to the main checkout when this is a `git worktree`); prints nothing when there is none.
# k8s_cache: prints the cache directory of that tarball, $CPCACHE/k8s-<first 16 hex digits of its sha256>
#   (fails when there is no tarball).
# k8s_build PKG...: builds each PKG (a main package of the tree: cmd/kube-proxy, cmd/kubelet,
#   test/e2e/e2e.test, ...) that is not cached yet, all in one `make WHAT="PKG..."` (static: CGO_ENABLED=0,
#   GOFLAGS=-tags=providerless, because the tarball leaves out the legacy cloud providers' generated clients),
#   and prints the path of each executable, $(k8s_cache)/bin/<basename of PKG>, one a line, in argument order.
#   Cached per tarball and per command: bin/NAME with its stamp stamp.NAME ("format=N" and the `--version`
#   line, when the executable has that flag). The Go toolchain (golang-1.19-go, -src) and rsync (the Makefile
#   needs it) are `apt-get download`ed and unpacked with `dpkg -x`; they, the unpacked source and the Go build
#   cache stay in $(k8s_cache)/build (~2.5 GB) so that the next command reuses the packages built before
#   (kube-apiserver cold: ~6.5 min of CPU on 2 cores; kube-proxy after it: much less). Concurrent calls on
#   the same cache wait for each other (flock on $(k8s_cache)/build.lock). Build output goes to
#   $(k8s_cache)/build/build.log; its last 40 lines are printed on failure.
#   Errors: no tarball, a failed download or build (exit status 1, message on stderr).
# k8s_build_e2e: builds upstream's end-to-end test executable (`go test -c ./test/e2e`) with its network tests
#   only and the ginkgo command that runs it in parallel (the tree's vendored github.com/onsi/ginkgo/ginkgo), if
#   not cached yet, and prints their paths, $(k8s_cache)/bin/e2e.test and bin/ginkgo, one a line. The
#   tarball leaves out generated clients of GCE and AWS (its README), which test/e2e's cloud providers and the
#   network tests on cloud load balancers, ingresses and firewalls import; a Go overlay (`go build -overlay`, the
#   tarball stays as it is) builds the package without them: e2e_test.go imports test/e2e/network alone, e2e.go no
#   cloud provider (`--provider=local` is the framework's own), and network's firewall.go, ingress.go,
#   ingress_scale.go, loadbalancer.go, network_tiers.go and storage/utils' ebs.go are empty. Module mode with vendor/, static, the
#   version of K8S_GIT_ENV in its ldflags. Same cache, lock and log as k8s_build (~10 min of CPU on 2 cores cold).
#   Errors: as k8s_build's.
# k8s_go_tools DIR: (what k8s_build uses; the Debian 1.20 build of hack/control-plane.sh too) Go 1.19 and an
#   rsync wrapper (it runs with the unpacked libpopt, nothing else sees that LD_LIBRARY_PATH) under DIR/tools.
# k8s_make DIR SRC LOG VAR=VALUE... make ARGS...: runs Kubernetes' Makefile in SRC with DIR's Go (offline:
#   GOPROXY=off, GOTOOLCHAIN=local, CGO_ENABLED=0, GOCACHE=DIR/gocache, linux/amd64), the extra environment
#   given, output in LOG.
#
# env: CPCACHE (~/.cache/kipvs-cp), KIPVS_K8S_SRC (directory holding kubernetes-*.tar.xz)
# needs: hack/lib/host-tools.sh sourced (deb_fetch)
K8S_BUILD_FORMAT=1 # bump when the build steps below change what ends up in bin/
# The tarball's commit (../shared/k8s/README.md): not a git work tree, so the version is given.
K8S_GIT_ENV=(KUBE_GIT_COMMIT=ab451280a0ea817bd9d6b4f3c06204e3f9a37e75 KUBE_GIT_VERSION=v1.24.0-alpha.1+ab451280a0ea81
  KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=24)

k8s_tarball() {
  local d dirs=() here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  if [ -n "${KIPVS_K8S_SRC:-}" ]; then
    dirs=("$KIPVS_K8S_SRC")
  else
    dirs=("$here/../shared/k8s")
    local common
    common=$(git -C "$here" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
    [ -n "$common" ] && dirs+=("$(dirname "$common")/../shared/k8s")
  fi
  for d in "${dirs[@]}"; do
    compgen -G "$d/kubernetes-*.tar.xz" > /dev/null && { ls "$d"/kubernetes-*.tar.xz | head -n1; return; }
  done
  return 0
}

k8s_cache() {
  local t
  t=$(k8s_tarball)
  [ -n "$t" ] || { echo "k8s-build: no Kubernetes source tarball (../shared/k8s or \$KIPVS_K8S_SRC)" >&2; return 1; }
  echo "${CPCACHE:-$HOME/.cache/kipvs-cp}/k8s-$(sha256sum "$t" | cut -c1-16)"
}

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

k8s_make() {
  local W=$1 K=$2 LOG=$3
  shift 3
  (cd "$K" && env PATH="$W/tools/bin:$W/tools/usr/lib/go-1.19/bin:$PATH" GOROOT="$W/tools/usr/lib/go-1.19" \
    GOPROXY=off CGO_ENABLED=0 GOTOOLCHAIN=local GOCACHE="$W/gocache" KUBE_GIT_TREE_STATE=clean \
    KUBE_BUILD_PLATFORMS=linux/amd64 "$@" > "$LOG" 2>&1) ||
    { tail -n 40 "$LOG" >&2; echo "k8s-build: build failed (log: $LOG)" >&2; return 1; }
}

# k8s_built C NAME: bin/NAME of cache C is there and was built by these steps
k8s_built() {
  [ -x "$1/bin/$2" ] && [ -f "$1/stamp.$2" ] && head -n1 "$1/stamp.$2" | grep -qx "format=$K8S_BUILD_FORMAT"
}

# k8s_tree C: (in k8s_build's locked subshell) the Go tools and the unpacked tree in C/build; prints the tree
k8s_tree() {
  local W=$1/build T K
  T=$(k8s_tarball)
  mkdir -p "$W"
  chmod 777 "$W" # apt's download sandbox user (_apt) writes here
  k8s_go_tools "$W" || return 1
  if [ ! -f "$W/src.done" ]; then
    rm -rf "$W/src" && mkdir -p "$W/src" && tar -xJf "$T" -C "$W/src" || return 1
    touch "$W/src.done"
  fi
  K=$W/src # the tree, or the one directory the tarball holds it in
  [ -f "$K/Makefile" ] || K=$(dirname "$(find "$W/src" -maxdepth 2 -name Makefile | head -n1)")
  [ -f "$K/Makefile" ] || { echo "k8s-build: no Makefile in $T" >&2; return 1; }
  echo "$K"
}

# k8s_stamp C NAME: records that bin/NAME of cache C was built by these steps
k8s_stamp() {
  { echo "format=$K8S_BUILD_FORMAT"; "$1/bin/$2" --version 2>/dev/null | head -n1 || true; } > "$1/stamp.$2"
}

k8s_build() {
  [ $# -gt 0 ] || { echo "usage: k8s_build PKG..." >&2; return 2; }
  local C p n want=() t0 W K
  C=$(k8s_cache) || return 1
  mkdir -p "$C/bin"
  (
    flock 9
    for p in "$@"; do k8s_built "$C" "$(basename "$p")" || want+=("$p"); done
    [ ${#want[@]} -gt 0 ] || exit 0
    t0=$(date +%s)
    W=$C/build
    echo "k8s-build: ${want[*]} from $(basename "$(k8s_tarball)") (several minutes; log: $W/build.log)" >&2
    K=$(k8s_tree "$C") || exit 1
    k8s_make "$W" "$K" "$W/build.log" "${K8S_GIT_ENV[@]}" make WHAT="${want[*]}" GOFLAGS=-tags=providerless || exit 1
    for p in "${want[@]}"; do
      n=$(basename "$p")
      cp "$K/_output/bin/$n" "$C/bin/$n.new" && mv "$C/bin/$n.new" "$C/bin/$n" || exit 1
      k8s_stamp "$C" "$n"
    done
    echo "k8s-build: built ${want[*]} in $(( $(date +%s) - t0 ))s" >&2
  ) 9> "$C/build.lock" || return 1
  for p in "$@"; do echo "$C/bin/$(basename "$p")"; done
}

k8s_build_e2e() {
  local C t0 W K O v ldflags
  C=$(k8s_cache) || return 1
  mkdir -p "$C/bin"
  (
    flock 9
    k8s_built "$C" e2e.test && k8s_built "$C" ginkgo && exit 0
    t0=$(date +%s)
    W=$C/build
    echo "k8s-build: test/e2e (network tests) from $(basename "$(k8s_tarball)") (10 min or more; log: $W/build.log)" >&2
    K=$(k8s_tree "$C") || exit 1
    O=$W/e2e-overlay
    rm -rf "$O" && mkdir -p "$O" || exit 1
    python3 - "$K" "$O" <<'PY' || exit 1
import json, os, re, sys
tree, out = sys.argv[1], sys.argv[2]
replace = {}
def put(rel, text):
    path = os.path.join(out, rel.replace("/", "_"))
    with open(path, "w") as f:
        f.write(text)
    replace[os.path.join(tree, rel)] = path
def edit(rel, pattern):
    with open(os.path.join(tree, rel)) as f:
        text, n = re.subn(pattern, "", f.read())
    assert n > 0, f"{rel}: nothing matches {pattern}"
    put(rel, text)
edit("test/e2e/e2e_test.go", r'\t_ "k8s.io/kubernetes/test/e2e/(?!network")[^"]*"\n')
edit("test/e2e/e2e.go", r'\t_ "k8s.io/kubernetes/test/e2e/framework/providers/[^"]*"\n')
for rel in ("test/e2e/network/firewall.go", "test/e2e/network/ingress.go", "test/e2e/network/ingress_scale.go",
            "test/e2e/network/loadbalancer.go", "test/e2e/network/network_tiers.go", "test/e2e/storage/utils/ebs.go"):
    with open(os.path.join(tree, rel)) as f:
        package = re.search(r"^package \w+$", f.read(), re.M).group(0)
    put(rel, package + "\n")
with open(os.path.join(out, "overlay.json"), "w") as f:
    json.dump({"Replace": replace}, f)
PY
    ldflags="-s -w"
    for v in "${K8S_GIT_ENV[@]}"; do
      case $v in
        KUBE_GIT_COMMIT=*) ldflags+=" -X k8s.io/component-base/version.gitCommit=${v#*=}" ;;
        KUBE_GIT_VERSION=*) ldflags+=" -X k8s.io/component-base/version.gitVersion=${v#*=}" ;;
        KUBE_GIT_MAJOR=*) ldflags+=" -X k8s.io/component-base/version.gitMajor=${v#*=}" ;;
        KUBE_GIT_MINOR=*) ldflags+=" -X k8s.io/component-base/version.gitMinor=${v#*=}" ;;
      esac
    done
    k8s_make "$W" "$K" "$W/build.log" GO111MODULE=on GOFLAGS=-mod=vendor go test -c -vet=off -tags providerless \
      -overlay "$O/overlay.json" -ldflags "$ldflags -X k8s.io/component-base/version.gitTreeState=clean" \
      -o "$C/bin/e2e.test.new" ./test/e2e || exit 1
    k8s_make "$W" "$K" "$W/build.log" GO111MODULE=on GOFLAGS=-mod=vendor go build -ldflags "-s -w" \
      -o "$C/bin/ginkgo.new" github.com/onsi/ginkgo/ginkgo || exit 1
    mv "$C/bin/e2e.test.new" "$C/bin/e2e.test" && k8s_stamp "$C" e2e.test || exit 1
    mv "$C/bin/ginkgo.new" "$C/bin/ginkgo" && k8s_stamp "$C" ginkgo || exit 1
    echo "k8s-build: built test/e2e (network tests) and ginkgo in $(( $(date +%s) - t0 ))s" >&2
  ) 9> "$C/build.lock" || return 1
  echo "$C/bin/e2e.test"
  echo "$C/bin/ginkgo"
}
