#!/bin/bash
# Build the test VM's base initramfs from the cache that fetch.sh filled: static busybox (+ applet links),
# ipvsadm, iproute2's `ip` (the host's; busybox's ip has no netns/veth/dummy) and netcat-traditional
# (busybox's nc has no UDP) with their libraries (`nft` is not here: the VM runs the proxier image's,
# see hack/test-vm.sh),
# the kernel modules IPVS tests need (dependencies resolved by moddeps.py), and /init.
#
# usage: hack/vm/build-initramfs.sh OUT.cpio.gz [extra modules...]      env: VMCACHE
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
# shellcheck source=/dev/null
. "$VMCACHE/env.sh" # KERNEL MODDIR USERLAND
. "$HERE/../lib/modules.sh"
OUT=$(realpath -m "$1"); shift; mkdir -p "$(dirname "$OUT")"
# IPVS with every scheduler kube-proxy accepts, netns plumbing, conntrack for NAT from the root netns,
# nf_tables with what kipvs's table uses (ct state, nat chains, masquerade, dnat, reject, fib), virtio-net for the
# end to end's QEMU user-mode NIC (hack/test-e2e.sh)
MODS="ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_lblc ip_vs_lblcr ip_vs_sh ip_vs_dh ip_vs_sed ip_vs_nq
  ip_vs_mh nf_conntrack nf_conntrack_netlink dummy veth
  nf_tables nft_ct nft_chain_nat nft_masq nft_nat nft_fib_inet nft_reject_inet virtio_pci virtio_net $*"
R=$(mktemp -d); trap 'rm -rf "$R"' EXIT
mkdir -p "$R"/{bin,sbin,lib/modules,lib64,proc,sys,dev,run,tmp,etc}

# copy a dynamic binary and the libraries ldd reports (the host's glibc; the guest runs the same ABI)
add_bin() { # SRC DEST [LD_LIBRARY_PATH]
  install -D -m755 "$1" "$R$2"
  LD_LIBRARY_PATH=${3:-} ldd "$1" | awk '/=> \//{print $3} /^[ \t]*\/lib64\//{print $1}' | while read -r l; do
    case $l in */ld-linux-x86-64.so.2) install -D "$l" "$R/lib64/ld-linux-x86-64.so.2" ;;
      *) install -D "$l" "$R/lib/x86_64-linux-gnu/$(basename "$l")" ;; esac
  done
}
add_bin "$USERLAND/sbin/ipvsadm" /sbin/ipvsadm "$USERLAND/lib/x86_64-linux-gnu:$USERLAND/usr/lib/x86_64-linux-gnu"
add_bin "$(command -v ip)" /sbin/ip
add_bin "$USERLAND/bin/nc.traditional" /bin/nc.traditional # UDP client/server for the DNS-like tests

cp "$USERLAND/bin/busybox" "$R/bin/busybox"
for a in $("$R/bin/busybox" --list); do # applet links; `ip` stays iproute2's
  [ "$a" = ip ] || [ "$a" = busybox ] || ln -s busybox "$R/bin/$a"
done

# shellcheck disable=SC2086
unpack_modules "$MODDIR" "$R/lib/modules" $MODS

# static (glibc) busybox segfaults in NSS look-ups without these; tests use IP literals anyway
printf 'passwd: files\ngroup: files\nhosts: files\nservices: files\nprotocols: files\n' > "$R/etc/nsswitch.conf"
printf 'domain 53/tcp\ndomain 53/udp\nhttp 80/tcp\n' > "$R/etc/services"
printf 'ip 0 IP\ntcp 6 TCP\nudp 17 UDP\nsctp 132 SCTP\n' > "$R/etc/protocols"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"
printf 'root:x:0:0:root:/:/bin/sh\n' > "$R/etc/passwd"; printf 'root:x:0:\n' > "$R/etc/group"
install -m755 "$HERE/init" "$R/init"
(cd "$R" && find . | "$R/bin/busybox" cpio -o -H newc 2>/dev/null) | gzip -1 > "$OUT"
echo "initramfs: $OUT $(du -h "$OUT" | cut -f1); modules: $(tr '\n' ' ' < "$R/lib/modules/order")" >&2
