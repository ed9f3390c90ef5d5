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
stage_s() { # PATTERN: seconds the kernel dataplane spent in the logged steps matching PATTERN
  awk -v pat="$1" '$0 ~ pat { for (i = 1; i <= NF; i++) if ($i ~ /^duration_us=/) { sub("duration_us=", "", $i); t += $i } }
    END { printf "%.3f", t / 1e6 }' "$W/bench.log"
}
field_s() { # FIELD: seconds in that field of the last `sync complete` line
  sed -n "s/.*sync complete.* $1=\([0-9]*\).*/\1/p" "$W/bench.log" | tail -n1 | awk '{ printf "%.3f", $1 / 1e6 }'
}
vss=$(stage_s 'applied stage stage=4'); rss=$(stage_s 'applied stage stage=5'); bind=$(stage_s 'applied stage stage=6')
nft=$(stage_s 'applied nftables transaction')
ipvs=$(awk "BEGIN{print $vss + $rss}")
sync=$(field_s duration_us); apply=$(field_s apply_us); ct=$(field_s conntrack_us)
say "kipvs-proxier: virtual servers $vss s + real servers $rss s = $ipvs s of IPVS programming;"
say "  binding $vs addresses on kube-ipvs0 $bind s; nftables $nft s; whole apply $apply s;"
say "  observe + diff + op log $(awk "BEGIN{print $sync - $apply - $ct}") s; conntrack cleanup $ct s; whole sync $sync s;"
say "  whole process $total s: outside the sync (start, parse, plan, sysctls, exit) $(awk "BEGIN{print $total - $sync}") s"
echo "RATIO kipvs/ipvsadm-R (IPVS programming) = $(awk "BEGIN{printf \"%.2f\", $ipvs / $restore}")"
echo "RATIO kipvs/ipvsadm-R (whole process, incl. binding) = $(awk "BEGIN{printf \"%.2f\", $total / $restore}")"
finish
