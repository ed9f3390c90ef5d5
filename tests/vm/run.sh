#!/bin/sh
# Guest-side entry point of the VM suite (called by /payload/run.sh, see hack/test-vm.sh).
# usage: run.sh [test|demo|bench]
#   test: build the example cluster's pods as netns, run every NN-*.sh in order (each prints one
#         PASS/FAIL/SKIP line), exit 1 if any failed.
#   demo: same set-up, then demo.sh prints the table, the addresses and the traffic results.
#   e2e:  same set-up, then e2e/guest.sh: the proxier against the host's apiserver, driven by hack/test-e2e.sh.
#   kube-proxy: /payload/kube-proxy/guest.sh (tests/kube-proxy), without the example cluster: kube-proxy and
#         kipvs in turn against the host's apiserver, driven by hack/parity-kube-proxy.sh.
MODE=${1:-test}
. /payload/tests/lib.sh
# The proxier image's root filesystem (hack/test-vm.sh): kipvs-proxier and nft run chrooted in it
# (/payload/bin wrappers) and see the VM's /proc, /sys, /dev, /run, /tmp and /payload at the same paths.
for d in proc sys dev run tmp payload; do
  mkdir -p "/payload/image/$d" && mount --bind "/$d" "/payload/image/$d" || echo "run.sh: cannot bind /$d into the image"
done
if [ "$MODE" = bench ]; then mkdir -p "$W"; sh "$T/bench.sh"; exit; fi
[ "$MODE" = kube-proxy ] && exec sh /payload/kube-proxy/guest.sh
. /payload/tests/topology.sh
mkdir -p "$W" && cp -r /payload/manifests/cluster "$M"
echo "--- topology: $(echo $PODS | wc -w) pods + client netns (uptime $(now))"
topology_up
failed=0
if topology_check; then echo "PASS topology"; else echo "FAIL topology: a backend does not answer directly"; failed=1; fi

[ "$MODE" = demo ] && exec sh "$T/demo.sh"
[ "$MODE" = e2e ] && exec sh "$T/e2e/guest.sh"

for t in "$T"/[0-9][0-9]-*.sh; do
  echo "=== $(basename "$t") (uptime $(now))"; t0=$(now)
  sh "$t" || failed=$((failed + 1))
  n=$(basename "$t" .sh); echo "TIME ${n#[0-9][0-9]-} $(awk "BEGIN{print $(now) - $t0}")"
done
p=$(proxier_pid); [ -n "$p" ] && alive "$p" && kill "$p"
# errors the proxier recovered from do not fail a test, but must not go unnoticed
errs=$(grep -hE '(ERROR|WARN)' "$W"/proxier.*.log 2>/dev/null)
[ -z "$errs" ] || { echo "--- proxier ERROR/WARN lines"; echo "$errs"; }
if [ "$failed" -gt 0 ]; then
  for l in "$W"/proxier.*.log; do
    [ -f "$l" ] || continue
    echo "--- $l (up to 200 lines)"; head -n 200 "$l"
  done
fi
echo "=== $failed test(s) failed (uptime $(now))"
[ "$failed" -eq 0 ]
