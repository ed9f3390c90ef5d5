#!/bin/sh
# Guest half of the end to end (hack/test-e2e.sh drives it from the host; run.sh e2e starts it after the
# example topology, whose client netns it uses). The VM has one QEMU user-mode NIC: the guest is 10.0.2.15
# and routes only 10.0.2.2/32, which QEMU maps to the host's loopback, where etcd and kube-apiserver
# listen: the proxier watches that apiserver. The host drives everything through agent.sh, served as CGI by
# busybox httpd on port 7000 (QEMU forwards a host loopback port to it). The host ends the run with
# `agent finish RC`; this script then prints the result line hack/test-vm.sh looks for.
. /payload/tests/lib.sh
TEST=e2e
ip addr add 10.0.2.15/32 dev eth0 && ip link set eth0 up && ip route add 10.0.2.2/32 dev eth0 ||
  { echo "FAIL e2e: no user-mode NIC (eth0)"; exit 1; }
httpd -p 7000 -h /payload/tests/e2e/www
echo "E2E-AGENT-READY uptime=$(now)"
while [ ! -f "$W/e2e.done" ]; do sleep 1; done # the host decides when the run ends (VMTIMEOUT bounds it)
p=$(proxier_pid); [ -n "$p" ] && alive "$p" && kill "$p"
rc=$(cat "$W/e2e.done")
errs=$(grep -hE '(ERROR|WARN)' "$W"/proxier.*.log 2>/dev/null | head -n 40)
[ -z "$errs" ] || { echo "--- proxier ERROR/WARN lines (up to 40)"; echo "$errs"; }
if [ "$rc" = 0 ]; then echo "PASS e2e"; else
  for l in "$W"/proxier.*.log; do echo "--- $l (last 60 lines)"; tail -n 60 "$l"; done
  echo "--- load client log (last 40 lines)"; tail -n 40 "$W/load.log" 2>/dev/null
  echo "FAIL e2e: the host reported failures (hack/test-e2e.sh output)"; exit 1
fi
