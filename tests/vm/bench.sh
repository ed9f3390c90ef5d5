#!/bin/sh
# VM benchmark (hack/bench-vm.sh): program the same table of N Services into an empty kernel twice,
# side by side in one boot — once with `ipvsadm -R` (libipvs: one netlink round trip per command),
# once with `kipvs-proxier run --once` (pipelined netlink) — and print the ratio.
. /payload/tests/lib.sh
B=/payload/manifests/bench
sysctl -qw net.ipv4.vs.conntrack=1 2>/dev/null
t0=$(now); "$KIPVS" plan --node bench-node --manifests "$B" > "$W/table"; t1=$(now)
vs=$(grep -c '^-A' "$W/table"); rs=$(grep -c '^-a' "$W/table")
say "plan: $vs virtual servers, $rs real servers in $(awk "BEGIN{print $t1 - $t0}") s"

t0=$(now); ipvsadm -R < "$W/table"; t1=$(now)
restore=$(awk "BEGIN{print $t1 - $t0}")
check "ipvsadm -R programmed the whole table" sh -c "[ \$(ipvsadm -Sn | wc -l) -eq $((vs + rs)) ]"
say "ipvsadm -R: $restore s"
ipvsadm -C

t0=$(now)
NO_COLOR=1 RUST_LOG=info,kipvs_proxier::dataplane=debug "$KIPVS" run --once --node bench-node \
  --manifests "$B" > "$W/bench.log" 2>&1
t1=$(now)
total=$(awk "BEGIN{print $t1 - $t0}")
check "kipvs-proxier programmed the same table" sh -c "ipvsadm -Sn | sort | cmp -s - \$(sort $W/table > $W/t.sorted; echo $W/t.sorted)"
stage_s() { # STAGE: seconds the kernel dataplane spent applying that stage
  awk -v st="stage=$1" '/applied stage/ { for (i = 1; i <= NF; i++) { if ($i == st) s = 1; if ($i ~ /^duration_us=/) { sub("duration_us=", "", $i); d = $i } }
    if (s) { t += d; s = 0 } } END { printf "%.3f", t / 1e6 }' "$W/bench.log"
}
vss=$(stage_s 3); rss=$(stage_s 4); bind=$(stage_s 5)
ipvs=$(awk "BEGIN{print $vss + $rss}")
sync=$(sed -n 's/.*sync complete.*duration_us=\([0-9]*\).*/\1/p' "$W/bench.log" | tail -n1)
say "kipvs-proxier: virtual servers $vss s + real servers $rss s = $ipvs s of IPVS programming;"
say "  binding $vs addresses on kube-ipvs0 $bind s; whole sync $(awk "BEGIN{print $sync / 1e6}") s;"
say "  whole process (start, parse, plan, sysctls, sync) $total s"
echo "RATIO kipvs/ipvsadm-R (IPVS programming) = $(awk "BEGIN{printf \"%.2f\", $ipvs / $restore}")"
echo "RATIO kipvs/ipvsadm-R (whole process, incl. binding) = $(awk "BEGIN{printf \"%.2f\", $total / $restore}")"
finish
