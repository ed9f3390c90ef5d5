#!/bin/sh
# VM benchmark (hack/bench-vm.sh): program the same table of N Services into an empty kernel twice,
# side by side in one boot — once with `ipvsadm -R` (libipvs: one netlink round trip per command),
# once with `kipvs-proxier run --once` (pipelined netlink) — and print the ratio.
#
# Each runs in a network namespace of its own, as on a node that never ran IPVS: a namespace has its
# own IPVS table and its own trash of deleted real servers. The kernel keeps a deleted real server
# in that trash for one to two minutes (ip_vs_ctl.c, IP_VS_DEST_TRASH_PERIOD) and every
# AddRealServer first walks the trash for a match to reuse (ip_vs_trash_get_dest: the whole trash
# when there is none), so a table programmed right after `ipvsadm -C` pays for the 20k trashed real
# servers. The last step measures that: `ipvsadm -R` again into kipvs' namespace, flushed. Before it, a second
# `run --once` in kipvs' namespace is a full sync of the programmed table (what the periodic resync does), timed
# by part: IPVS read (the service dump, then /proc/net/ip_vs for the real servers), nftables table read, diff,
# UDP conntrack listing; once with the restore namespace's table in the kernel too, once alone.
. /payload/tests/lib.sh
B=/payload/manifests/bench
say "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
t0=$(now); "$KIPVS" plan --node bench-node --manifests "$B" > "$W/table" 2> "$W/plan.log" ||
  { bad "kipvs-proxier plan failed: $(tail -n 3 "$W/plan.log")"; finish; }
t1=$(now)
vs=$(grep -c '^-A' "$W/table"); rs=$(grep -c '^-a' "$W/table")
say "plan: $vs virtual servers, $rs real servers in $(awk "BEGIN{print $t1 - $t0}") s"
for ns in restore kipvs; do
  ip netns add "bench-$ns" && ip -n "bench-$ns" link set lo up
  ip netns exec "bench-$ns" sysctl -qw net.ipv4.vs.conntrack=1 2>/dev/null
done
in_ns() { ip netns exec "bench-$1" sh -c "$2"; } # NS COMMAND

t0=$(now); ip netns exec bench-restore ipvsadm -R < "$W/table"; t1=$(now)
restore=$(awk "BEGIN{print $t1 - $t0}")
check "ipvsadm -R programmed the whole table" in_ns restore "[ \$(ipvsadm -Sn | wc -l) -eq $((vs + rs)) ]"
say "ipvsadm -R: $restore s"

say "kipvs-proxier starts at $(date -u +%T.%N)"
t0=$(now)
NO_COLOR=1 RUST_LOG=info,kipvs_proxier::dataplane=debug,kipvs_proxier::engine=debug ip netns exec bench-kipvs "$KIPVS" run --once \
  --node bench-node --manifests "$B" > "$W/bench.log" 2>&1
t1=$(now)
total=$(awk "BEGIN{print $t1 - $t0}")
check "kipvs-proxier programmed the same table" \
  in_ns kipvs "ipvsadm -Sn | sort | cmp -s - \$(sort $W/table > $W/t.sorted; echo $W/t.sorted)"
check "kipvs-proxier bound the $vs ClusterIPs on kube-ipvs0" \
  in_ns kipvs "[ \$(ip -4 addr show dev kube-ipvs0 | grep -c ' inet ') -eq $vs ]"
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
say "  observe + diff $(awk "BEGIN{print $sync - $apply - $ct}") s; conntrack cleanup $ct s; whole sync $sync s;"
load=$(sed -n 's/.*loaded manifests.* duration_us=\([0-9]*\).*/\1/p' "$W/bench.log" | tail -n1 | awk '{ printf "%.3f", $1 / 1e6 }')
say "  whole process $total s: outside the sync (start, parse, plan, sysctls, exit) $(awk "BEGIN{print $total - $sync}") s,"
say "  of which reading the manifests $load s; its log:"
sed 's/^[0-9-]*T//' "$W/bench.log" | cut -c1-200 | indent
echo "RATIO kipvs/ipvsadm-R (IPVS programming) = $(awk "BEGIN{printf \"%.2f\", $ipvs / $restore}")"
echo "RATIO kipvs/ipvsadm-R (whole process, incl. binding) = $(awk "BEGIN{printf \"%.2f\", $total / $restore}")"

# A full sync of the programmed table, as the periodic resync does it: everything observed and diffed, nothing
# to change. Twice: with the restore namespace's table still in the kernel, then alone, as on a node. Every
# namespace's services share the kernel's one hash table, and the /proc/net/ip_vs of one namespace loses services
# between its read chunks while others' are in it (ip_vs_info_seq_next steps over every namespace's entries,
# ip_vs_info_array counts only its own): the proxier reads those over netlink.
observed_n() { # FIELD: the value of that field of the `observed the kernel` line
  sed -n "s/.*observed the kernel.* $1=\([0-9]*\).*/\1/p" "$W/bench.log" | tail -n1
}
observed() { # FIELD: seconds in that (microseconds) field of the `observed the kernel` line
  observed_n "$1" | awk '{ printf "%.3f", $1 / 1e6 }'
}
full_sync() { # WHEN: a second `run --once` in kipvs' namespace, timed by part
  NO_COLOR=1 RUST_LOG=info,kipvs_proxier::dataplane=debug ip netns exec bench-kipvs "$KIPVS" run --once \
    --node bench-node --manifests "$B" > "$W/bench.log" 2>&1
  check "the full sync of the programmed table changed nothing ($1)" grep -q 'sync complete.* ops=0 ' "$W/bench.log"
  sync=$(field_s duration_us); obs=$(observed duration_us); ct=$(field_s conntrack_us)
  say "full sync of the programmed table (the periodic resync's work), $1: $sync s: observe $obs s (IPVS $(observed ipvs_us) s:"
  say "  real servers of $(observed_n from_listing) virtual servers from /proc/net/ip_vs, of $(observed_n destination_requests) by netlink requests;"
  say "  nftables table read $(observed nft_us) s, addresses the rest); diff and the rest $(awk "BEGIN{print $sync - $obs - $ct}") s;"
  say "  UDP conntrack listing $ct s"
}
full_sync "the restore namespace's $vs virtual servers in the kernel too"
t0=$(now); in_ns restore "ipvsadm -C"; t1=$(now)
say "ipvsadm -C in the restore namespace: $(awk "BEGIN{print $t1 - $t0}") s"
full_sync "alone in the kernel"

in_ns kipvs "ipvsadm -C"
t0=$(now); ip netns exec bench-kipvs ipvsadm -R < "$W/table"; t1=$(now)
check "ipvsadm -R programmed the whole table again" in_ns kipvs "[ \$(ipvsadm -Sn | wc -l) -eq $((vs + rs)) ]"
say "ipvsadm -R again, into kipvs' namespace just flushed ($rs real servers in the kernel's trash): $(awk "BEGIN{print $t1 - $t0}") s"
finish
