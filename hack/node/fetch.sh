#!/bin/bash
# What the VM needs to be a Kubernetes node, cached in $NODECACHE (~/.cache/kipvs-node), built from the test VM's
# cache (hack/vm/fetch.sh: kernel, QEMU, busybox) and Debian packages, nothing installed:
#   $NODECACHE/base-KEY.cpio.gz  the test VM's base initramfs (hack/vm/build-initramfs.sh, unchanged) with the
#                                modules a node adds: bridge + br_netfilter + veth (the CNI bridge), overlay
#                                (containerd's overlayfs snapshotter), the iptables-nft matches and targets the CNI
#                                bridge's ipMasq, its portmap (xt_sctp: an SCTP hostPort's `-p sctp --dport`) and
#                                the kubelet use; the module tree is the kernel package's
#                                net/, lib/, crypto/, drivers/net, drivers/virtio and fs/ (the VM cache has no fs/)
#   $NODECACHE/root-KEY.cpio     Debian's containerd (with the runc-v2 shim only), runc, containernetworking-plugins
#                                (the four the node uses) and iptables, with the libraries they need, unpacked at
#                                their paths, `iptables` -> iptables-nft, plus the kubelet given as argument at
#                                /usr/local/bin/kubelet; uncompressed (the binaries do not shrink much and the
#                                emulated kernel unpacks it without inflating)
# KEY covers the inputs; both are rebuilt when one changes. Prints the two paths, one a line.
#
# usage: hack/node/fetch.sh KUBELET     env: VMCACHE (~/.cache/kipvs-vm), NODECACHE (~/.cache/kipvs-node)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/hack/lib/host-tools.sh"
host_tools
KUBELET=$(realpath "${1:?usage: hack/node/fetch.sh KUBELET}")
VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
NODECACHE=${NODECACHE:-$HOME/.cache/kipvs-node}
PKGS=(containerd runc containernetworking-plugins iptables conntrack tcpdump)
# what the packages above declare but a node without users, package manager or PAM never runs (tcpdump's adduser
# and what that pulls in)
NOT_RUN=(adduser passwd debconf cdebconf dpkg install-info tar libpam-modules libpam-modules-bin libpam0g
  libsemanage2 libsemanage-common libsepol2 libnewt0.52 libslang2 libtextwrap1 libdebian-installer4 readline-common
  libreadline8 libaudit1 libaudit-common libdb5.3 libcap-ng0)
# kernel modules of a node, on top of the base initramfs's IPVS/conntrack/nf_tables set
MODS=(bridge br_netfilter overlay nft_compat nft_nat nft_fib_inet nft_limit xt_MASQUERADE xt_comment xt_addrtype
  xt_conntrack xt_mark xt_multiport xt_nat xt_tcpudp xt_statistic xt_physdev ipt_REJECT nf_reject_ipv4
  nfnetlink_log sctp xt_sctp)
"$ROOT/hack/vm/fetch.sh"
mkdir -p "$NODECACHE"

# --- the base initramfs: the VM cache's env.sh with a module tree that has fs/ too ---
KDEB=$(ls "$VMCACHE"/debs/linux-image-[0-9]*.deb | head -n1)
kkey=$(echo "$KDEB" "${MODS[*]}" | cat - "$ROOT/hack/vm/build-initramfs.sh" "$ROOT/hack/lib/modules.sh" "$ROOT/hack/vm/init" \
  "$ROOT/hack/vm/moddeps.py" "$(command -v ip)" | sha256sum | cut -c1-16)
BASE=$NODECACHE/base-$kkey.cpio.gz
if [ ! -f "$BASE" ]; then
  rm -rf "$NODECACHE/kernel" "$NODECACHE/vmcache" "$NODECACHE"/base-*.cpio.gz
  mkdir -p "$NODECACHE/kernel" "$NODECACHE/vmcache"
  dpkg-deb --fsys-tarfile "$KDEB" | tar -x -C "$NODECACHE/kernel" --wildcards './lib/modules/*/kernel/net/*' \
    './lib/modules/*/kernel/lib/*' './lib/modules/*/kernel/crypto/*' './lib/modules/*/kernel/drivers/net/*' \
    './lib/modules/*/kernel/drivers/virtio/*' './lib/modules/*/kernel/fs/*'
  # build-initramfs.sh reads $VMCACHE/env.sh: the same kernel, QEMU and userland, this module tree
  sed "s#^MODDIR=.*#MODDIR=$(ls -d "$NODECACHE"/kernel/lib/modules/*)#" "$VMCACHE/env.sh" > "$NODECACHE/vmcache/env.sh"
  VMCACHE=$NODECACHE/vmcache "$ROOT/hack/vm/build-initramfs.sh" "$BASE.tmp" "${MODS[@]}"
  mv "$BASE.tmp" "$BASE"
fi

# --- the node's userland: Debian packages + the kubelet ---
mapfile -t closure < <(deb_closure "${PKGS[@]}" | grep -vx -e libgcc-s1 -e gcc-12-base $(printf -- "-e %s " "${NOT_RUN[@]}"))
deb_fetch "$NODECACHE/debs" "${closure[@]}"
debs=()
for p in "${closure[@]}"; do debs+=("$(ls "$NODECACHE/debs/${p}"_*.deb | head -n1)"); done
rkey=$( (printf '%s\n' "${debs[@]}"; sha256sum "$KUBELET" "$0") | sha256sum | cut -c1-16)
ROOTFS=$NODECACHE/root-$rkey.cpio
if [ ! -f "$ROOTFS" ]; then
  rm -f "$NODECACHE"/root-*.cpio
  R=$(mktemp -d); trap 'rm -rf "$R"' EXIT
  for d in "${debs[@]}"; do dpkg -x "$d" "$R"; done
  rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bug} "$R"/usr/lib/x86_64-linux-gnu/gconv "$R"/etc/init.d \
    "$R"/lib/systemd "$R"/usr/lib/systemd "$R"/usr/bin/containerd-shim "$R"/usr/bin/containerd-shim-runc-v1
  # the CNI plugins the configuration names (tests/node/guest/cni.conflist) and the one containerd adds
  find "$R/usr/lib/cni" -type f ! -name bridge ! -name host-local ! -name loopback ! -name portmap -delete
  # what iptables' postinst does with update-alternatives (Debian's default: the nf_tables backend)
  for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf "${c/iptables/iptables-nft}" "$R/usr/sbin/$c"
  done
  install -D -m755 "$KUBELET" "$R/usr/local/bin/kubelet"
  (cd "$R" && find . | "$VMCACHE/userland/bin/busybox" cpio -o -H newc 2>/dev/null) > "$ROOTFS.tmp"
  mv "$ROOTFS.tmp" "$ROOTFS"
  echo "node: userland $(du -h "$ROOTFS" | cut -f1) ($(echo "${closure[@]}"), kubelet)" >&2
fi
echo "$BASE"
echo "$ROOTFS"
