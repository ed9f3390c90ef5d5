#!/bin/sh
# (p) A table that cannot be read is an error, never an empty table (issue 13, defect 4). The proxier is
# restarted after a Service was deleted while it was down, with an `nft` that fails to list the table
# (as a kernel under memory pressure or a broken nft would): the first sync must fail and be retried —
# not read "no elements" and go on, which re-adds what exists and never deletes the deleted Service's
# set elements until the next full sync (a whole syncPeriod, 5 min here). Once `nft` can list again, the
# stale element is gone within one retry.
. /payload/tests/lib.sh
proxier_ensure; wait_converged 30 >/dev/null
cat > "$M/stale.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: stale, namespace: default}
spec:
  clusterIP: 10.96.0.77
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
YAML
has_element() { nft list set inet kipvs cluster-ips 2>/dev/null | grep -q '10\.96\.0\.77 '; } # nft prints port 80 as http
no_element() { ! has_element; }
wait_converged 30 >/dev/null
check "the Service's cluster-ips element 10.96.0.77 . tcp . 80 is programmed" has_element
check "proxier stopped" proxier_stop
rm "$M/stale.yaml" # deleted while the proxier is down

# nft as the proxier's image runs it (chrooted: /tmp is shared), failing `list` while the flag file exists
cp /bin/busybox "$W/busybox"
cat > "$W/nft-flaky" <<'SH'
#!/tmp/kipvs/busybox sh
case " $* " in *" list "*) [ -e /tmp/kipvs/nft-list-fails ] && { echo "Error: Could not receive from netlink: Cannot allocate memory" >&2; exit 1; } ;; esac
exec nft "$@" # the image's (chrooted) or /payload/bin/nft (KIPVS_PROXIER)
SH
chmod +x "$W/nft-flaky"; touch "$W/nft-list-fails"
printf 'apiVersion: kipvs.io/v1alpha1\nkind: ProxierConfiguration\nipvs: {syncPeriod: 5m}\n' > "$W/nft-read-config.yaml"
NFT=$W/nft-flaky KIPVS_CONFIG=$W/nft-read-config.yaml proxier_start
log=$(proxier_log)
wait_for 15 "a failed sync" grep -q 'sync failed' "$log" 2>/dev/null
line=$(grep -m1 'sync failed' "$log")
say "first sync: ${line:-$(grep -m1 -E 'sync complete|nftables' "$log")}"
check "the first sync fails on the unreadable table and is retried" [ -n "$line" ]
check "no sync completed while the table cannot be read" sh -c "! grep -q 'sync complete' $log"
check "the element is still there (nothing was decided from an empty read)" has_element

rm "$W/nft-list-fails"; t0=$(now)
wait_for 20 "the deleted Service's element to go" no_element 2>/dev/null
t=$(awk "BEGIN{print $(now) - $t0}")
check "once the table reads again, the deleted Service's element is gone (after $t s; at most 20 s)" sh -c "! nft list set inet kipvs cluster-ips | grep -q '10\.96\.0\.77 '"
wait_converged 30 >/dev/null || bad "not converged after the table read again"
proxier_stop && proxier_start
finish
