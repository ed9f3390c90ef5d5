# kube-proxy (Debian's 1.20.2 build, or KIPVS_K8S_BIN's: hack/lib/k8s-build.sh) for the test VM (sourced, bash; from the repository's root): the guest's
# /payload/kube-proxy, as tests/vm/lib.sh (KP, kube_proxy_modules, proxier_start) and tests/kube-proxy/ use it.
#
#   kube_proxy_payload DIR KUBECONFIG   DIR gets kube-proxy (k8s_bin kube-proxy), its
#       userland (hack/vm/kube-proxy-userland.sh: iptables, ipset, conntrack, modules) and DIR/kubeconfig,
#       KUBECONFIG (the host's, https://127.0.0.1:$CP_PORT) with the host's loopback as the guest sees it
#       through QEMU's user-mode network (10.0.2.2)
. hack/lib/k8s-build.sh
kube_proxy_payload() {
  local bin
  bin=$(k8s_bin kube-proxy)
  hack/vm/kube-proxy-userland.sh "$1"
  cp "$bin" "$1/kube-proxy"
  sed "s#https://127.0.0.1:$CP_PORT#https://10.0.2.2:$CP_PORT#" "$2" > "$1/kubeconfig"
}
