#!/bin/sh
# Guest half of the kube-proxy parity check (hack/parity-kube-proxy.sh drives it from the host; run.sh
# kube-proxy starts it). As in the end to end (tests/vm/e2e/guest.sh) the VM's one QEMU user-mode NIC reaches
# the host's kube-apiserver at 10.0.2.2, and the host drives the guest through agent.sh, served as CGI by
# busybox httpd on port 7000. First it loads the modules kube-proxy needs (iptables, ipset: modules/order,
# those not loaded yet). The host ends the run with `agent finish RC`; this script then prints the result
# line hack/test-vm.sh looks for.
. /payload/tests/lib.sh
TEST=kube-proxy
kube_proxy_modules
ip addr add 10.0.2.15/32 dev eth0 && ip link set eth0 up && ip route add 10.0.2.2/32 dev eth0 ||
  { echo "FAIL kube-proxy: no user-mode NIC (eth0)"; exit 1; }
mkdir -p "$W"
httpd -p 7000 -h "$KP/www"
echo "KUBE-PROXY-AGENT-READY uptime=$(now)"
while [ ! -f "$W/kube-proxy.done" ]; do sleep 1; done
rc=$(cat "$W/kube-proxy.done")
if [ "$rc" = 0 ]; then echo "PASS kube-proxy"; else
  echo "FAIL kube-proxy: the host reported failures (hack/parity-kube-proxy.sh output)"; exit 1
fi
