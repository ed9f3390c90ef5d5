#!/bin/bash
# Build the two container images without a registry or a container daemon, as OCI image layouts:
#   $OUT/kipvs-proxier  static kipvs-proxier + nft (Debian's nftables and the libraries it needs, libc6
#                       included) + iptables (both backends) and ipset (a takeover from kube-proxy removes
#                       its rules and sets with them), runs as root (config/proxier/daemonset.yaml: privileged, as kube-proxy;
#                       capabilities: add NET_ADMIN, drop ALL)
#   $OUT/kipvs-operator static kipvs-operator, runs as 65532:65532 (non-root)
# each tagged $TAG. The binaries are the workspace's release build, statically linked against glibc
# (`-C target-feature=+crt-static`, --target x86_64-unknown-linux-gnu); the Debian packages are fetched
# with `apt-get download` (hack/lib/host-tools.sh) into $TOOLSCACHE/image-debs; the layouts are written by
# umoci (Debian's package, fetched the same way). Reproducible: file times are the last commit's
# (SOURCE_DATE_EPOCH), so are the history entries, build paths are remapped: the same commit and the same
# Debian packages give the same image digests. Prints each image's size and digest.
#
# To push: skopeo copy oci:$OUT/kipvs-proxier:$TAG docker://REGISTRY/kipvs-proxier:$TAG (README).
# Containerfile.proxier / Containerfile.operator are the conventional builds of the same images.
#
# usage: hack/build-images.sh [proxier|operator]...   (default: both)
# env:   OUT (target/images), TAG (the workspace version, v0.1.0), CARGO_TARGET_DIR, TOOLSCACHE
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/host-tools.sh
host_tools
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$TARGET_DIR/images}
TAG=${TAG:-v$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)}
WANT=("$@"); [ ${#WANT[@]} -gt 0 ] || WANT=(proxier operator)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin # the images' PATH (nft is found on it)
t0=$(date +%s)

# --- static release binaries (build scripts and proc macros stay dynamic: --target keeps RUSTFLAGS off them)
bins=()
for w in "${WANT[@]}"; do bins+=(--bin "kipvs-$w"); done
RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$ROOT=/kipvs --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo" \
  cargo build --release --locked --quiet --target x86_64-unknown-linux-gnu --workspace "${bins[@]}"
REL=$TARGET_DIR/x86_64-unknown-linux-gnu/release

W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT"
image() { # NAME ROOTFS USER ENTRYPOINT
  local name=$1 rootfs=$2 user=$3 entry=$4 layout=$OUT/$1
  find "$rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  rm -rf "$layout"
  umoci init --layout "$layout"
  umoci new --image "$layout:$TAG"
  umoci insert --image "$layout:$TAG" --history.created "$CREATED" --history.author kipvs \
    --history.created_by "hack/build-images.sh" --history.comment "$name root filesystem" "$rootfs" /
  umoci config --no-history --image "$layout:$TAG" --created "$CREATED" --author kipvs \
    --config.user "$user" --config.entrypoint "$entry" --config.workingdir / --config.env "PATH=$IMAGE_PATH" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$TAG" \
    --config.label "org.opencontainers.image.source=https://github.com/kipvs/kipvs"
  umoci gc --layout "$layout"
  local digest size
  digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$layout/index.json")
  size=$(du -sb "$layout/blobs" | cut -f1)
  printf 'image %-15s %s:%s  %s (%s MB compressed)\n' "$name" "$layout" "$TAG" "$digest" \
    "$(awk "BEGIN{printf \"%.1f\", $size / 1048576}")"
}

for w in "${WANT[@]}"; do
  R=$W/$w; mkdir -p "$R/usr/local/bin" "$R/tmp" "$R/etc"
  install -m755 "$REL/kipvs-$w" "$R/usr/local/bin/kipvs-$w"
  strip "$R/usr/local/bin/kipvs-$w"
  case $w in
    proxier)
      # nft, iptables and ipset and everything they need at run time, libc6 included: the image has
      # nothing else
      mapfile -t pkgs < <(deb_closure nftables iptables ipset)
      deb_fetch "$TOOLSCACHE/image-debs" "${pkgs[@]}"
      for p in "${pkgs[@]}"; do dpkg -x "$(ls "$TOOLSCACHE/image-debs/${p}"_*.deb | head -n1)" "$R"; done
      rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bug} "$R"/usr/lib/x86_64-linux-gnu/gconv "$R"/etc/nftables.conf
      printf 'root:x:0:0:root:/:/usr/sbin/nologin\n' > "$R/etc/passwd"; printf 'root:x:0:\n' > "$R/etc/group"
      chmod 1777 "$R/tmp"
      # the image must run what it carries: nft and the proxier, with nothing from the host
      chroot "$R" /usr/sbin/nft --version >/dev/null || { echo "build-images: nft does not run in the image" >&2; exit 1; }
      for t in iptables-legacy-save iptables-nft-save ip6tables-legacy-restore ip6tables-nft-restore; do
        chroot "$R" "/usr/sbin/$t" --version >/dev/null || { echo "build-images: $t does not run in the image" >&2; exit 1; }
      done
      [ -x "$R/usr/sbin/ipset" ] || { echo "build-images: no ipset in the image" >&2; exit 1; }
      chroot "$R" /usr/local/bin/kipvs-proxier --version >/dev/null ||
        { echo "build-images: kipvs-proxier does not run in the image" >&2; exit 1; }
      image kipvs-proxier "$R" 0:0 /usr/local/bin/kipvs-proxier ;;
    operator)
      printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' > "$R/etc/passwd"
      printf 'root:x:0:\nnonroot:x:65532:\n' > "$R/etc/group"
      chmod 1777 "$R/tmp"
      chroot "$R" /usr/local/bin/kipvs-operator --version >/dev/null ||
        { echo "build-images: kipvs-operator does not run in the image" >&2; exit 1; }
      image kipvs-operator "$R" 65532:65532 /usr/local/bin/kipvs-operator ;;
    *) echo "build-images: unknown image $w (proxier, operator)" >&2; exit 2 ;;
  esac
done
echo "build-images: ${WANT[*]} in $(( $(date +%s) - t0 )) s"
