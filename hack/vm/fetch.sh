#!/bin/bash
# Fetch everything the real-kernel test VM needs into $VMCACHE, through apt only, without installing
# anything: Debian's kernel (vmlinuz + modules), QEMU (+ its libraries and firmware), busybox-static and
# ipvsadm (+ libraries), netcat-traditional (busybox's nc has no UDP). Packages are `apt-get download`ed
# and unpacked with `dpkg -x`.
#
# usage: hack/vm/fetch.sh        env: VMCACHE (default ~/.cache/kipvs-vm), KFLAVOR (default cloud-amd64),
#        KIPVS_VM_KERNEL_SUITE (a Debian suite to take the kernel from, e.g. bullseye for 5.10, through a private
#        apt configuration under $VMCACHE; default: the machine's own suite; QEMU and userland always are)
#
# Idempotent and fast when cached: $VMCACHE/stamp records the exact package versions that were unpacked.
# apt is only asked again when its package lists changed since (i.e. after an `apt-get update`); if the
# resolved versions differ (e.g. a kernel ABI bump behind linux-image-cloud-amd64) everything is refetched.
# Writes $VMCACHE/env.sh (QEMU command line, kernel and module paths) for the other scripts.
#
# Why not `apt-get install qemu-system-x86`: it would remove the preinstalled qemu-utils 10 (backports),
# whose Breaks: qemu-system-common (<< 1:8.0) conflicts with bookworm's QEMU 7.2.
set -euo pipefail
VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
KFLAVOR=${KFLAVOR:-cloud-amd64}
KSUITE=${KIPVS_VM_KERNEL_SUITE:-}
FORMAT=3 # bump when the package set or the cache layout below changes
STAMP=$VMCACHE/stamp
QEMU_PKGS="qemu-system-x86 qemu-system-common qemu-system-data seabios libcapstone4 libfdt1 libpmem1
  librdmacm1 libibverbs1 libslirp0 libvdeplug2 libndctl6 libdaxctl1 libnl-3-200 libnl-route-3-200"
USER_PKGS="busybox-static ipvsadm libnl-3-200 libnl-genl-3-200 libpopt0 netcat-traditional"
mkdir -p "$VMCACHE"

# Fast path: unpacked cache for this format/flavor, and apt's lists unchanged since the last resolve.
if [ -f "$STAMP" ] && [ -f "$VMCACHE/env.sh" ] && head -n1 "$STAMP" | grep -qx "format=$FORMAT flavor=$KFLAVOR$KSUITE" &&
   [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -newer "$STAMP" -print -quit 2>/dev/null)" ]; then
  exit 0
fi

# The kernel's apt: the machine's, or a private configuration for $KSUITE on the machine's Debian mirror.
KAPT=()
if [ -n "$KSUITE" ]; then
  A=$VMCACHE/apt-$KSUITE
  KAPT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$A/parts"
    -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache")
  if [ ! -f "$A/updated" ]; then
    mkdir -p "$A/parts" "$A/lists/partial" "$A/cache/archives/partial"
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$KSUITE" > "$A/parts/kernel.sources"
    apt-get "${KAPT[@]}" update -qq 2>&1 | grep -v -e unsandboxed -e 'pkgAcquire::Run' >&2 || true
    touch "$A/updated"
  fi
fi
# Resolve "pkg=version" for everything; the kernel ABI package comes from the flavor's meta package.
policy() { # PKG...: "pkg=candidate" lines; fails on a package without a candidate
  apt-cache "$@" |
    awk '/^[^ ]/{p=$1; sub(":$","",p)} /Candidate:/{ if ($2=="(none)") exit 1; print p "=" $2 }'
}
resolve() {
  local kpkg
  kpkg=$(apt-cache "${KAPT[@]}" show --no-all-versions "linux-image-$KFLAVOR" 2>/dev/null |
    sed -n 's/^Depends:.*\(linux-image-[0-9][^ ,]*\).*/\1/p' | head -n1)
  [ -n "$kpkg" ] || return 1
  # shellcheck disable=SC2086
  { policy "${KAPT[@]}" policy $kpkg && policy policy $QEMU_PKGS $USER_PKGS; } | sort -u
}
[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update -qq
refresh() { apt-get update -qq; [ -z "$KSUITE" ] || apt-get "${KAPT[@]}" update -qq 2>&1 | grep -v -e unsandboxed >&2 || true; }
WANT=$(resolve) || { refresh; WANT=$(resolve); }
NEW=$(printf 'format=%s flavor=%s\n%s\n' "$FORMAT" "$KFLAVOR$KSUITE" "$WANT")
if [ -f "$STAMP" ] && [ -f "$VMCACHE/env.sh" ] && [ "$(cat "$STAMP")" = "$NEW" ]; then
  touch "$STAMP"; exit 0 # lists changed, versions did not
fi

echo "fetch: $(echo "$WANT" | wc -l) packages into $VMCACHE" >&2
start=$(date +%s%N)
D=$VMCACHE/debs.new; rm -rf "$D"; mkdir -p "$D"
chmod 777 "$D" # apt-get download drops to the _apt user when it can
download() { # fetch what is missing from $D, reusing unchanged debs of the previous fetch
  local pv missing=""
  for pv in $WANT; do
    f=$(ls "$VMCACHE/debs/${pv%%=*}_$(echo "${pv#*=}" | sed 's/:/%3a/')_"*.deb 2>/dev/null | head -n1) || true
    if [ -n "$f" ]; then ln -f "$f" "$D/"; else missing="$missing $pv"; fi
  done
  local kmissing=$(printf '%s\n' $missing | grep '^linux-image-' || true) other=$(printf '%s\n' $missing | grep -v '^linux-image-' || true)
  [ -z "$kmissing" ] || (cd "$D" && apt-get "${KAPT[@]}" download -q $kmissing) 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2 || true
  [ -z "$other" ] || (cd "$D" && apt-get download -q $other) 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2 || true
  [ "$(find "$D" -name '*.deb' | wc -l)" -eq "$(echo "$WANT" | wc -l)" ]
}
if ! download; then
  # stale lists (an old kernel ABI gone from the mirror): refresh once and resolve again
  refresh; WANT=$(resolve)
  NEW=$(printf 'format=%s flavor=%s\n%s\n' "$FORMAT" "$KFLAVOR$KSUITE" "$WANT")
  rm -f "$D"/*.deb
  download || { echo "fetch: download failed" >&2; exit 1; }
fi
rm -f "$STAMP" # an interrupted unpack must not look complete
rm -rf "$VMCACHE/debs" "$VMCACHE/qemu" "$VMCACHE/userland" "$VMCACHE"/kernel-*
mv "$D" "$VMCACHE/debs"; D=$VMCACHE/debs
deb() { ls "$D/$1"_*.deb; } # exactly one per package: the dir was filled from one resolve
Q=$VMCACHE/qemu U=$VMCACHE/userland K=$VMCACHE/kernel-$KFLAVOR
for p in $QEMU_PKGS; do dpkg -x "$(deb "$p")" "$Q"; done
for p in $USER_PKGS; do dpkg -x "$(deb "$p")" "$U"; done
KPKG=$(echo "$WANT" | sed -n 's/^\(linux-image-[0-9][^=]*\)=.*/\1/p')
mkdir -p "$K"
# only the kernel image and the network/netfilter/crypto/lib module trees (skip firmware, docs, drivers)
dpkg-deb --fsys-tarfile "$(deb "$KPKG")" | tar -x -C "$K" --wildcards './boot/vmlinuz-*' \
  './lib/modules/*/kernel/net/*' './lib/modules/*/kernel/lib/*' './lib/modules/*/kernel/crypto/*' \
  './lib/modules/*/kernel/drivers/net/*' './lib/modules/*/kernel/drivers/virtio/*'
KERNEL=$(ls "$K"/boot/vmlinuz-*); MODDIR=$(ls -d "$K"/lib/modules/*)
cat > "$VMCACHE/env.sh" <<EOT
# generated by hack/vm/fetch.sh: paths into the VM cache (sourced by the other hack/vm scripts)
QEMU_DIR=$Q
KERNEL=$KERNEL
MODDIR=$MODDIR
USERLAND=$U
EOT
echo "$NEW" > "$STAMP"
echo "fetch: $KPKG + QEMU + userland: $(du -sh "$D" | cut -f1) of debs, $(( ($(date +%s%N) - start) / 1000000 )) ms" >&2
