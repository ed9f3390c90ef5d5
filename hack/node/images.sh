#!/bin/bash
# The upstream images a node and upstream's e2e tests need, built offline from the Kubernetes source tarball and
# written as OCI archives (an OCI image layout in a tar: what `ctr images import --base-name REPO` reads), named
# as this tree's e2e framework names them (test/utils/image/manifest.go) so that pods ask for exactly these:
#   k8s.gcr.io/pause:3.6                         build/pause/linux/pause.c, `gcc -static`; runs as 65535 like
#                                                upstream's (the kubelet's sandbox image of this tree)
#   k8s.gcr.io/e2e-test-images/agnhost:2.33      test/images/agnhost (hack/lib/k8s-build.sh, static Go) at
#                                                /agnhost, its entrypoint, with busybox-static's applets in /bin
#                                                and Debian's curl, netcat-openbsd (`nc`) and dash (`sh`) with
#                                                the libraries they need: upstream's e2e tests run `sh -c` with
#                                                curl and nc in it, as upstream's image (alpine + curl,
#                                                netcat-openbsd) has them
# Cached in $NODECACHE/images by the tarball and this script; prints "REPO TAG FILE" per image.
#
# usage: hack/node/images.sh        env: NODECACHE (~/.cache/kipvs-node), VMCACHE (busybox-static)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/hack/lib/host-tools.sh"
host_tools
. "$ROOT/hack/lib/k8s-build.sh"
NODECACHE=${NODECACHE:-$HOME/.cache/kipvs-node}
VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
TARBALL=$(k8s_tarball)
[ -n "$TARBALL" ] || { echo "node-images: no Kubernetes source tarball (../shared/k8s)" >&2; exit 1; }
TOOLS=(curl netcat-openbsd) # in agnhost's image, with their closure (and dash alone: it needs libc6 only)
mapfile -t closure < <(deb_closure "${TOOLS[@]}")
key=$( (sha256sum "$TARBALL" "$0" | cut -c1-64; ls "$VMCACHE"/debs/busybox-static_*.deb; printf '%s\n' "${closure[@]}") |
  sha256sum | cut -c1-16)
D=$NODECACHE/images/$key
list() {
  echo "k8s.gcr.io/pause 3.6 $D/pause.tar"
  echo "k8s.gcr.io/e2e-test-images/agnhost 2.33 $D/agnhost.tar"
}
if [ -f "$D/done" ]; then list; exit 0; fi
"$ROOT/hack/vm/fetch.sh"
rm -rf "$NODECACHE/images" && mkdir -p "$D"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
SOURCE_DATE_EPOCH=$(stat -c %Y "$TARBALL")
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# oci_archive NAME TAG ROOTFS USER ENTRYPOINT [CMD]: ROOTFS as a one-layer image, tarred as an OCI archive
oci_archive() {
  local name=$1 tag=$2 rootfs=$3 user=$4 entry=$5 cmd=${6:-} layout=$W/layout-$1
  find "$rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci insert --image "$layout:$tag" --history.created "$CREATED" --history.created_by "hack/node/images.sh" \
    "$rootfs" /
  umoci config --no-history --image "$layout:$tag" --created "$CREATED" --config.user "$user" \
    --config.entrypoint "$entry" ${cmd:+--config.cmd "$cmd"} --config.workingdir / \
    --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  umoci gc --layout "$layout"
  tar -C "$layout" -cf "$D/$name.tar" oci-layout index.json blobs
}

tar -xJf "$TARBALL" -C "$W" --wildcards '*build/pause/linux/pause.c'
mkdir -p "$W/pause"
gcc -Os -static -DVERSION=3.6 -o "$W/pause/pause" "$(find "$W" -name pause.c | head -n1)"
strip "$W/pause/pause"
oci_archive pause 3.6 "$W/pause" 65535:65535 /pause

AGNHOST=$(k8s_build test/images/agnhost)
mkdir -p "$W/agnhost/bin" "$W/agnhost/tmp" "$W/agnhost/etc"
install -m755 "$AGNHOST" "$W/agnhost/agnhost"
dpkg -x "$(ls "$VMCACHE"/debs/busybox-static_*.deb | head -n1)" "$W/busybox"
cp "$W/busybox/bin/busybox" "$W/agnhost/bin/busybox"
for a in $("$W/agnhost/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$W/agnhost/bin/$a"; done
deb_fetch "$NODECACHE/debs" "${closure[@]}" dash
for p in "${closure[@]}" dash; do dpkg -x "$(ls "$NODECACHE/debs/${p}"_*.deb | head -n1)" "$W/agnhost"; done
rm -rf "$W"/agnhost/usr/share/{doc,man,info,locale,lintian,bug}
ln -sf nc.openbsd "$W/agnhost/bin/nc" # what netcat-openbsd's postinst makes /bin/nc (busybox's applet before)
# /bin/sh is dash: busybox's shell runs its own applets before PATH's commands, so `sh -c 'nc ...'` would get
# busybox's nc (no -t) instead of netcat-openbsd's
ln -sf dash "$W/agnhost/bin/sh"
chmod 1777 "$W/agnhost/tmp"
printf 'root:x:0:0:root:/:/bin/sh\n' > "$W/agnhost/etc/passwd"; printf 'root:x:0:\n' > "$W/agnhost/etc/group"
oci_archive agnhost 2.33 "$W/agnhost" 0:0 /agnhost pause
touch "$D/done"
echo "node-images: pause and agnhost in $D ($(du -sh "$D" | cut -f1))" >&2
list
