#!/bin/bash
# What kube-proxy's IPVS mode needs in the test VM besides the kernel's IPVS: Debian's iptables (legacy
# backend), ipset and conntrack with their libraries, and the iptables/ipset kernel modules. The packages are
# `apt-get download`ed (hack/lib/host-tools.sh deb_fetch, cached in $VMCACHE/kube-proxy-debs) and unpacked
# with `dpkg -x`; nothing is installed.
#
# usage: hack/vm/kube-proxy-userland.sh DIR        env: VMCACHE (hack/vm/fetch.sh's; run first, a no-op when cached)
# Writes, for the guest at /payload/kube-proxy (hack/test-vm.sh --kube-proxy copies DIR there):
#   DIR/root/       the unpacked packages
#   DIR/bin/        iptables, iptables-save, iptables-restore, the ip6tables trio (xtables-legacy-multi),
#                   ipset, conntrack: wrappers that run them with the unpacked libraries and iptables'
#                   extensions (XTABLES_LIBDIR); kube-proxy finds them on PATH
#   DIR/modules/    the modules (decompressed), and DIR/modules/order, dependencies first (moddeps.py); the
#                   guest loads those not loaded yet
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export VMCACHE=${VMCACHE:-$HOME/.cache/kipvs-vm}
"$HERE/fetch.sh" # the kernel's modules (MODDIR); on a fresh cache this runs before hack/test-vm.sh does
# shellcheck source=/dev/null
. "$VMCACHE/env.sh" # MODDIR
. "$HERE/../lib/host-tools.sh"
. "$HERE/../lib/modules.sh"
OUT=$(realpath -m "$1")
# pkg/proxy/ipvs (CanUseIPVSProxier, the ipsets and the iptables rules of the IPVS proxier; xt_physdev for
# 1.20's external-IP rule, `-m physdev ! --physdev-is-in`, proxier.go:1744: without it every
# iptables-restore of a sync with an external IP fails), and the ipv6
# tables: with both families' iptables present kube-proxy runs its dual-stack proxier (1.20: with the
# IPv6DualStack gate, which tests/kube-proxy/corpus.py gives it). The iptables mode's too (hack/test-takeover.sh
# phase 0): `-m statistic --mode random` between endpoints, `-m recent` for session affinity and `-j REJECT` for
# Services without endpoints; without them every iptables-restore of its sync fails and only its jump chains
# are made (no KUBE-SVC-*, KUBE-SEP-*, KUBE-NODEPORTS).
MODS="x_tables ip_tables ip6_tables iptable_nat iptable_filter ip6table_nat ip6table_filter nf_nat xt_nat
  xt_comment xt_mark xt_addrtype xt_conntrack xt_MASQUERADE xt_set xt_tcpudp xt_multiport xt_sctp xt_physdev
  xt_statistic xt_recent nf_reject_ipv4 ipt_REJECT nf_reject_ipv6 ip6t_REJECT
  ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_ipportip ip_set_hash_ipportnet ip_set_hash_net
  ip_set_bitmap_port"
# The run-time closure of the three, without what the VM's base already has (glibc, libgcc) or needs not
PKGS=$(deb_closure iptables ipset conntrack | grep -vx -e libc6 -e libgcc-s1 -e gcc-12-base -e netbase)
# shellcheck disable=SC2086
deb_fetch "$VMCACHE/kube-proxy-debs" $PKGS
rm -rf "$OUT" && mkdir -p "$OUT/root" "$OUT/bin" "$OUT/modules"
for p in $PKGS; do dpkg -x "$(ls "$VMCACHE/kube-proxy-debs/${p}"_*.deb | head -n1)" "$OUT/root"; done
rm -rf "$OUT/root/usr/share" # documentation and manual pages
G=/payload/kube-proxy/root
wrap() { # NAME EXECUTABLE [ARG]: bin/NAME runs the guest's root/EXECUTABLE [ARG] "$@"
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s XTABLES_LIBDIR=%s exec %s %s "$@"\n' \
    "$G/usr/lib/x86_64-linux-gnu:$G/lib/x86_64-linux-gnu" "$G/usr/lib/x86_64-linux-gnu/xtables" "$G$2" "${3:-}" > "$OUT/bin/$1"
  chmod +x "$OUT/bin/$1"
}
for t in iptables ip6tables; do
  for s in "" -save -restore; do wrap "$t$s" /usr/sbin/xtables-legacy-multi "$t$s"; done
done
wrap ipset /usr/sbin/ipset
wrap conntrack /usr/sbin/conntrack
# shellcheck disable=SC2086
unpack_modules "$MODDIR" "$OUT/modules" $MODS
echo "kube-proxy userland: $(echo $PKGS | wc -w) packages, modules: $(tr '\n' ' ' < "$OUT/modules/order")" >&2
