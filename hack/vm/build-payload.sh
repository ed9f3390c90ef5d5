#!/bin/bash
# Pack a payload directory (it must hold run.sh) into a cpio that appends to the base initramfs:
#   cat base.cpio.gz payload.cpio.gz > initrd.gz     (the kernel unpacks concatenated archives)
# The guest sees it as /payload and init runs /payload/run.sh. ELF executables and libraries are stripped (debug info and
# symbols: the debug proxier shrinks from 66 to 35 MB, and every initrd byte is unpacked by an emulated
# CPU; panic messages keep their file:line), and dynamic ones bring the libraries ldd reports (e.g.
# libgcc_s.so.1 for Rust binaries).
#
# usage: hack/vm/build-payload.sh DIR OUT.cpio.gz      env: VMCACHE
set -euo pipefail
VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
SRC=$(realpath "$1"); OUT=$(realpath -m "$2"); mkdir -p "$(dirname "$OUT")"
[ -f "$SRC/run.sh" ] || { echo "build-payload: $SRC/run.sh missing" >&2; exit 2; }
R=$(mktemp -d); trap 'rm -rf "$R"' EXIT
mkdir -p "$R/payload"; cp -aL "$SRC"/. "$R/payload/"
# (not the proxier image's root filesystem, payload/image: it runs as the image has it, in a chroot)
find "$R/payload" -path "$R/payload/image" -prune -o -type f -print | while read -r f; do
  kind=$(file -b "$f")
  case $kind in ELF*relocatable*) continue ;; ELF*) ;; *) continue ;; esac # (kernel modules stay as they are)
  chmod u+w "$f"; strip "$f"
  case $kind in *dynamically\ linked*)
    ldd "$f" | awk '/=> \//{print $3} /^[ \t]*\/lib64\//{print $1}' | while read -r l; do
      case $l in */ld-linux-x86-64.so.2) install -D "$l" "$R/lib64/ld-linux-x86-64.so.2" ;;
        *) install -D "$l" "$R/lib/x86_64-linux-gnu/$(basename "$l")" ;; esac
    done ;;
  esac
done
(cd "$R" && find . | "$VMCACHE/userland/bin/busybox" cpio -o -H newc 2>/dev/null) | gzip -1 > "$OUT"
echo "payload: $OUT $(du -h "$OUT" | cut -f1)" >&2
