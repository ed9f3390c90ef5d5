#!/bin/bash
# The upstream images a node and upstream's e2e tests need, built offline and written as OCI archives (an OCI
# image layout in a tar: what `ctr images import` reads):
#   pause     build/pause/linux/pause.c of Debian's kubernetes source (k8s_source), `gcc -static`; runs as 65535
#             like upstream's
#   agnhost   `k8s_bin agnhost` (KIPVS_K8S_BIN's when it has one, else the Debian build) at /agnhost, its
#             entrypoint, with busybox-static's applets in /bin and Debian's curl, wget, netcat-openbsd (`nc`),
#             conntrack and dash (`sh`) with the libraries they need: upstream's e2e tests run `sh -c` with curl,
#             wget and nc in it, as upstream's image (alpine + curl, netcat-openbsd; busybox's wget) has them.
#             busybox-static's own wget dies of a segmentation fault in this image, so /bin/wget is Debian's.
# The names are the release's, so that its pods and tests ask for exactly these images:
#   pause     the kubelet's default sandbox image (its --pod-infra-container-image default: k8s.gcr.io/pause:3.2
#             on 1.20; registry.k8s.io/pause:3.10 for a kubelet without the flag) and, with E2E_TEST, the pause
#             of that release's e2e framework (test/utils/image/manifest.go, as `e2e.test --list-images` prints)
#   agnhost   kipvs.test/agnhost:node (tests/node/*.yaml) and, with E2E_TEST, the e2e framework's agnhost
#             (k8s.gcr.io/e2e-test-images/agnhost:2.21 on 1.20) and its debian-iptables when it names one
#             (k8s.gcr.io/build-image/debian-iptables:buster-v1.3.0 on 1.20: KubeProxy's CLOSE_WAIT test runs
#             `sleep` and `conntrack -L` in it, on the host network)
# Cached in $NODECACHE/images by their inputs (pause.c, the agnhost binary, the Debian packages, this script).
# Prints one line per image, pause first: "FILE REF [REF...]" (the archive, the names it is tagged with).
#
# usage: hack/node/images.sh KUBELET [E2E_TEST]     env: NODECACHE (~/.cache/kipvs-node), VMCACHE (busybox-static)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/hack/lib/host-tools.sh"
host_tools
. "$ROOT/hack/lib/k8s-build.sh"
KUBELET=${1:?usage: hack/node/images.sh KUBELET [E2E_TEST]}
E2E_TEST=${2:-}
NODECACHE=${NODECACHE:-$HOME/.cache/kipvs-node}
VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}

# the names: the kubelet's sandbox image, and the e2e framework's pause and agnhost
SANDBOX=$("$KUBELET" --help 2>&1 | sed -n 's/.*--pod-infra-container-image .*(default "\([^"]*\)").*/\1/p' | head -n1)
PAUSE_REFS=("${SANDBOX:-registry.k8s.io/pause:3.10}") AGNHOST_REFS=(kipvs.test/agnhost:node)
if [ -n "$E2E_TEST" ]; then
  e2e_images=$("$E2E_TEST" --list-images 2>/dev/null) || { echo "node-images: $E2E_TEST --list-images failed" >&2; exit 1; }
  # the framework's agnhost is the e2e-test-images one (its list has a private registry's agnhost too)
  p=$(grep -m1 '/pause:' <<<"$e2e_images" || true) a=$(grep -m1 '/e2e-test-images/agnhost:' <<<"$e2e_images" || true)
  i=$(grep -m1 '/debian-iptables:' <<<"$e2e_images" || true)
  [ -n "$a" ] || { echo "node-images: no agnhost in $E2E_TEST --list-images" >&2; exit 1; }
  [ -z "$p" ] || [ "$p" = "${PAUSE_REFS[0]}" ] || PAUSE_REFS+=("$p")
  AGNHOST_REFS+=("$a" ${i:+"$i"})
fi

K=$(k8s_source)
PAUSE_C=$K/build/pause/linux/pause.c
AGNHOST=$(k8s_bin agnhost)
TOOLS=(curl wget netcat-openbsd conntrack) # in agnhost's image, with their closure (and dash alone: it needs libc6 only)
mapfile -t closure < <(deb_closure "${TOOLS[@]}")
key=$( (sha256sum "$PAUSE_C" "$AGNHOST" "$0" | cut -c1-64; ls "$VMCACHE"/debs/busybox-static_*.deb
  printf '%s\n' "${closure[@]}") | sha256sum | cut -c1-16)
D=$NODECACHE/images/$key
list() {
  echo "$D/pause.tar ${PAUSE_REFS[*]}"
  echo "$D/agnhost.tar ${AGNHOST_REFS[*]}"
}
if [ -f "$D/done" ]; then list; exit 0; fi
"$ROOT/hack/vm/fetch.sh"
rm -rf "$NODECACHE/images" && mkdir -p "$D"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
SOURCE_DATE_EPOCH=$(stat -c %Y "$PAUSE_C")
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# oci_archive NAME ROOTFS USER ENTRYPOINT [CMD]: ROOTFS as a one-layer image tagged `node`, tarred as an OCI
# archive (the node tags it with its names after the import)
oci_archive() {
  local name=$1 rootfs=$2 user=$3 entry=$4 cmd=${5:-} layout=$W/layout-$1
  find "$rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  umoci init --layout "$layout"
  umoci new --image "$layout:node"
  umoci insert --image "$layout:node" --history.created "$CREATED" --history.created_by "hack/node/images.sh" \
    "$rootfs" /
  umoci config --no-history --image "$layout:node" --created "$CREATED" --config.user "$user" \
    --config.entrypoint "$entry" ${cmd:+--config.cmd "$cmd"} --config.workingdir / \
    --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  umoci gc --layout "$layout"
  tar -C "$layout" -cf "$D/$name.tar" oci-layout index.json blobs
}

mkdir -p "$W/pause"
gcc -Os -static -DVERSION="${PAUSE_REFS[0]##*:}" -o "$W/pause/pause" "$PAUSE_C"
strip "$W/pause/pause"
oci_archive pause "$W/pause" 65535:65535 /pause

mkdir -p "$W/agnhost/bin" "$W/agnhost/tmp" "$W/agnhost/etc"
install -m755 "$AGNHOST" "$W/agnhost/agnhost"
dpkg -x "$(ls "$VMCACHE"/debs/busybox-static_*.deb | head -n1)" "$W/busybox"
cp "$W/busybox/bin/busybox" "$W/agnhost/bin/busybox"
for a in $("$W/agnhost/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$W/agnhost/bin/$a"; done
deb_fetch "$NODECACHE/debs" "${closure[@]}" dash
for p in "${closure[@]}" dash; do dpkg -x "$(ls "$NODECACHE/debs/${p}"_*.deb | head -n1)" "$W/agnhost"; done
rm -rf "$W"/agnhost/usr/share/{doc,man,info,locale,lintian,bug}
ln -sf nc.openbsd "$W/agnhost/bin/nc" # what netcat-openbsd's postinst makes /bin/nc (busybox's applet before)
ln -sf ../usr/bin/wget "$W/agnhost/bin/wget" # Debian's, wherever PATH finds it first
# /bin/sh is dash: busybox's shell runs its own applets before PATH's commands, so `sh -c 'nc ...'` would get
# busybox's nc (no -t) instead of netcat-openbsd's
ln -sf dash "$W/agnhost/bin/sh"
chmod 1777 "$W/agnhost/tmp"
printf 'root:x:0:0:root:/:/bin/sh\n' > "$W/agnhost/etc/passwd"; printf 'root:x:0:\n' > "$W/agnhost/etc/group"
printf 'hosts: files dns\n' > "$W/agnhost/etc/nsswitch.conf" # glibc's (wget, curl) name lookups
# the tools run (a missing library shows here, not as a test's timeout on the node)
for t in usr/bin/curl usr/bin/wget usr/sbin/conntrack; do
  LD_LIBRARY_PATH=$W/agnhost/lib/x86_64-linux-gnu:$W/agnhost/usr/lib/x86_64-linux-gnu \
    "$W/agnhost/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$W/agnhost/$t" --version > /dev/null ||
    { echo "node-images: $t does not run with the image's libraries" >&2; exit 1; }
done
oci_archive agnhost "$W/agnhost" 0:0 /agnhost pause
touch "$D/done"
echo "node-images: pause and agnhost in $D ($(du -sh "$D" | cut -f1))" >&2
list
