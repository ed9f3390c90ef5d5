# Kernel modules for a guest, for the scripts that assemble what the test VM loads: sourced by
# hack/vm/build-initramfs.sh (the base initramfs) and hack/vm/kube-proxy-userland.sh (kube-proxy's extra
# modules). The caches keyed on build-initramfs.sh hash this file with it (hack/test-vm.sh, hack/node/fetch.sh).
#
# usage: unpack_modules MODDIR DIR MODULE...
#   Copies MODULE... and the modules they depend on (hack/vm/moddeps.py reads MODDIR's modules.dep) into DIR,
#   decompressing .ko.xz, and writes DIR/order: their file names, dependencies first, the order the guest
#   loads them in.
unpack_modules() {
  local moddir=$1 dir=$2 ko m
  shift 2
  : > "$dir/order"
  for ko in $(python3 "$(dirname "${BASH_SOURCE[0]}")/../vm/moddeps.py" "$moddir" "$@"); do
    m=$(basename "$ko" .xz)
    case $ko in *.xz) xz -dc "$ko" > "$dir/$m" ;; *) cp "$ko" "$dir/$m" ;; esac
    echo "$m" >> "$dir/order"
  done
}
