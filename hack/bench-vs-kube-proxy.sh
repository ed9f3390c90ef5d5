#!/usr/bin/env bash
# kube-proxy (IPVS mode) against kipvs, speed and cost side by side in one boot of the test VM, on the
# same objects in the same real kube-apiserver and the same kernel (hack/lib/kube-proxy-vm.sh: kube-proxy
# of Debian's 1.20.2 build or KIPVS_K8S_BIN's, the proxier image's kipvs-proxier, as
# hack/parity-kube-proxy.sh runs them). The tables name the kube-proxy release, from its --version.
# For each size N: N ClusterIP Services with an EndpointSlice of two ready endpoints each
# (tests/kube-proxy/corpus.py --scale, four `kubectl create` at once) and the Service bench-churn
# (10.96.250.1:80). Then, for each minSyncPeriod setting, BENCH_RUNS runs, each proxier in turn (kipvs first in
# odd runs, last in even ones; the kernel flushed between them), with ipvs.syncPeriod BENCH_SYNC_PERIOD for all:
#   - cold start: the process started, until the end of its first completed sync (the guest's wall clock and
#     kubeproxy_sync_proxy_rules_last_timestamp_seconds, which kube-proxy and kipvs set at a sync's end; both
#     sync first once their lists are complete); the IPVS proxiers must then hold every virtual and real server;
#   - churn: CHURN_SECONDS of RATE EndpointSlice writes a second to bench-churn's slice
#     (tests/kube-proxy/churn.py, one keep-alive connection), each replacing one endpoint; the latency of a
#     write is from the apiserver's answer to the guest's first poll (every ~0.1 s) of the kernel showing it or a
#     later write (IPVS: `ipvsadm -Ln -t 10.96.250.1:80`; kube-proxy's nftables mode: its endpoint chains and
#     sync metric; guest clock mapped to this machine's: hack/lib/guest-clock.sh). Every write's outcome:
#     applied within the window (the writes and 3 s), later (polls go on up to BENCH_LATE s: when), or never;
#     p50, p99, max over all writes (a write never applied counts as more than its time to the last poll);
#     the full syncs made during the window;
#   - periodic full sync (first setting only): BENCH_SYNC_PERIOD x 2 + 5 s without changes; the full syncs
#     made meanwhile, count and mean, from a histogram of full syncs only (agent.sh usage: kipvs's, kube-proxy
#     1.28+'s; kube-proxy's IPVS mode makes only full syncs, its every-sync histogram is read and so named);
#   - CPU seconds (user + system, waited-for children included: kube-proxy's iptables-restore and ipset) at
#     each step, and the peak RSS (VmHWM) of the process over the whole run.
# Prints per size a table (markdown, also BENCH_OUT/table.md) of each figure's median (min-max) over the runs
# and the ratio of the medians, kube-proxy / kipvs, with the bound a ratio rests on stated; then the targets
# (issue 32) with PASS/FAIL: at 10,000 Services under 100 writes/s, every run, full syncs included, every write
# reaches the kernel, p99 <= 100 ms, max <= 1 s; at 50,000 the same with p99 <= 250 ms. A proxier that does not
# converge within BENCH_LIMIT is reported as "> LIMIT s" and its other steps are left out. When the kube-proxy
# has an nftables mode (1.29 and later) it runs as a third proxier, kube-proxy-nft. The VM is QEMU software
# emulation on one vCPU: absolute figures are that machine's, the ratios are what carries over.
#
# --e2e: failed requests instead, side by side: hack/test-e2e.sh's phases (readiness flap, rolling updates,
# proxier restart, apiserver outage, latency writes) under its load, once with E2E_PROXIER=kube-proxy and once
# with kipvs (two VM boots), printed as one table: requests sent / failed, long-lived connections broken.
# E2E_SAMPLES latency writes (20 here: kube-proxy takes ~10 s for each).
#
# usage: hack/bench-vs-kube-proxy.sh [N...]            (default: 1000 10000)
#        hack/bench-vs-kube-proxy.sh --e2e
# env:   BENCH_RUNS (3), BENCH_PROXIERS ("kube-proxy kipvs", kube-proxy-nft added when the release has that
#        mode; "kipvs" for kipvs alone), BENCH_ONCE (proxiers run in the first run only: "kube-proxy" for its
#        cold start to BENCH_LIMIT once where it does not fit the budget), BENCH_ALONE_FROM (the size from which
#        kipvs runs alone, but for BENCH_ONCE's proxiers), BENCH_UNTIL (a time, `date -d`'s: a run after the
#        first is not started when one more, as long as the last, would end after it, nor a size after it),
#        BENCH_MIN_SYNC ("0 1s": the minSyncPeriod settings; 0 is kube-proxy's
#        default for IPVS mode (1.20-1.24 default only iptables mode's to 1 s); kipvs's is 0 too),
#        BENCH_MIN_SYNC_UP_TO (1000: the settings after the first run at sizes up to this only),
#        BENCH_RATES ("10 100"), CHURN_SECONDS (15), BENCH_SYNC_PERIOD (10s), BENCH_LATE (BENCH_SYNC_PERIOD x 2
#        + 5 s), BENCH_LIMIT (600 s per cold start), BENCH_OUT (target/bench-vs-kube-proxy/DATE: results.txt,
#        report.txt, table.md), VMMEM (3072), and hack/lib/kube-proxy-vm.sh's; KEEP=1 keeps the state dir
#        (logs, writes, polls)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/host-tools.sh && host_tools # kubectl, curl, ...
. hack/lib/kube-proxy-vm.sh            # kpvm_*, agent
export CP_PORT=${CP_PORT:-27443} CP_ETCD_PORT=${CP_ETCD_PORT:-27790}
export VMMEM=${VMMEM:-3072}
[ $# -gt 0 ] || set -- 1000 10000
# the sizes of one run share the test apiserver's Service range (10.96.0.0/16) and bench-churn's 10.96.250.1:
# 50,000 runs alone (`hack/bench-vs-kube-proxy.sh 50000`)
[ "${1:-}" = --e2e ] || [ $(( $(tr ' ' '+' <<<"$*") )) -le 60000 ] ||
  { echo "bench: $* Services in one run do not fit the apiserver's 10.96.0.0/16 (at most 60,000 in all)" >&2; exit 2; }
MIN_SYNC=${BENCH_MIN_SYNC:-0 1s}
RATES=${BENCH_RATES:-10 100}
MIN_SYNC_UP_TO=${BENCH_MIN_SYNC_UP_TO:-1000}
SECONDS_EACH=${CHURN_SECONDS:-15}
SYNC_PERIOD=${BENCH_SYNC_PERIOD:-10s}
LATE=${BENCH_LATE:-$(( 2 * ${SYNC_PERIOD%s} + 5 ))}
LIMIT=${BENCH_LIMIT:-600}
RUNS=${BENCH_RUNS:-3}
ONCE=${BENCH_ONCE:-}
ALONE_FROM=${BENCH_ALONE_FROM:-1000000000}
UNTIL=${BENCH_UNTIL:-}
OUT=${BENCH_OUT:-target/bench-vs-kube-proxy/$(date -u +%Y%m%dT%H%M%SZ)}
say() { printf 'bench: %s\n' "$*"; }
kpvm_require
PROXIERS=${BENCH_PROXIERS:-kube-proxy kipvs$([ "$KPVM_MINOR" -lt 29 ] || echo ' kube-proxy-nft')}
T0=$(date +%s)
DATE0=$(date -u '+%Y-%m-%d %H:%M')
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- proxier hack/bench-vs-kube-proxy.sh tests/kube-proxy hack/lib || echo '+changes')
say "$PROXIERS (kube-proxy $KPVM_RELEASE), $RUNS runs; load average at start: $LOAD0"
STATE=$(mktemp -d /tmp/kipvs-bench-kp.XXXXXX)

if [ "${1:-}" = --e2e ]; then
  rc=0
  for p in kube-proxy kipvs; do
    say "hack/test-e2e.sh with E2E_PROXIER=$p (log: $STATE/e2e-$p.log)"
    E2E_SAMPLES=${E2E_SAMPLES:-20} E2E_PROXIER=$p E2E_FIGURES=$STATE/e2e-$p.figures hack/test-e2e.sh > "$STATE/e2e-$p.log" 2>&1 ||
      { say "$p: hack/test-e2e.sh failed checks:"; grep -E '^  not ok|FAIL' "$STATE/e2e-$p.log" | head -n 20; rc=1; }
    sed -n '/^=== end to end/,/machine load/p' "$STATE/e2e-$p.log"
  done
  echo
  echo "=== failed requests, kube-proxy $KPVM_RELEASE (IPVS) and kipvs, hack/test-e2e.sh's phases under its load (25 TCP" \
    "connections/s, 5 UDP queries/s, 4 long-lived connections); load average at start $LOAD0, at end $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 - "$STATE/e2e-kube-proxy.figures" "$STATE/e2e-kipvs.figures" <<'PY'
import os, sys
figs = []
for f in sys.argv[1:]:
    d = {}
    for line in open(f) if os.path.exists(f) else []:
        phase, v = line.rstrip("\n").split("|")
        d[phase] = v.split()
    figs.append(d)
phases = list(dict.fromkeys(list(figs[1]) + list(figs[0])))
print(f"  {'phase':26} {'kube-proxy: TCP sent/failed  UDP sent/failed  long-lived broken':62} {'kipvs: TCP  UDP  long-lived':30}")
def cell(v):
    return "-" if v is None else f"{v[0]:>5}/{v[1]:<4} {v[2]:>5}/{v[3]:<4} {v[4]:>3}"
for ph in phases:
    print(f"  {ph:26} {cell(figs[0].get(ph)):62} {cell(figs[1].get(ph)):30}")
PY
  say "state: $STATE"
  exit "$rc"
fi
R=$STATE/results
mkdir -p "$R" "$OUT"
: > "$OUT/results.txt"
put() { echo "$*" >> "$OUT/results.txt"; } # SIZE SETTING PROXIER RUN KEY VALUE

# ---- the clusters: one per size and minSyncPeriod setting ----------------------------------------------
CORPUS=$STATE/corpus
python3 tests/kube-proxy/corpus.py "$CORPUS" --minor "$KPVM_MINOR" --scale "$(tr ' ' ',' <<<"$*")"
setting_dir() { echo "scale-$1.min-$2"; } # SIZE SETTING
settings() { # SIZE: the minSyncPeriod settings run at that size
  if [ "$1" -le "$MIN_SYNC_UP_TO" ]; then echo "$MIN_SYNC"; else echo "${MIN_SYNC%% *}"; fi
}
for n in "$@"; do
  for m in $(settings "$n"); do
    d=$CORPUS/$(setting_dir "$n" "$m")
    cp -r "$CORPUS/scale-$n" "$d"
    python3 - "$d" "$SYNC_PERIOD" "$m" <<'PY'
import copy, sys, yaml
d, period, min_sync = sys.argv[1:]
for f in ("kube-proxy.yaml", "kipvs.yaml"):
    conf = yaml.safe_load(open(f"{d}/{f}"))
    conf["ipvs"]["syncPeriod"] = period
    conf["ipvs"]["minSyncPeriod"] = min_sync
    yaml.safe_dump(conf, open(f"{d}/{f}", "w"), sort_keys=False)
    if f == "kube-proxy.yaml":  # its nftables mode (1.29 and later), for kube-proxy-nft
        nft = copy.deepcopy(conf)
        nft["mode"] = "nftables"
        nft["nftables"] = {"syncPeriod": period, "minSyncPeriod": min_sync}
        yaml.safe_dump(nft, open(f"{d}/kube-proxy-nft.yaml", "w"), sort_keys=False)
PY
  done
done

# ---- control plane, guest, VM ----------------------------------------------------------------------------
kpvm_init "$STATE"
for n in "$@"; do for m in $(settings "$n"); do
  kpvm_cluster "$CORPUS" "$(setting_dir "$n" "$m")"
  cp "$CORPUS/$(setting_dir "$n" "$m")/kube-proxy-nft.yaml" "$G/clusters/$(setting_dir "$n" "$m")/"
done; done
kpvm_boot || exit 1

field() { sed -n "s/^$1 //p" "$2" | tail -n1; }
order() { # RUN: the proxiers in that run's order, kipvs first in odd runs
  local others
  others=$(tr ' ' '\n' <<<"$PROXIERS" | grep -vx kipvs | tr '\n' ' ')
  if ! grep -qw kipvs <<<"$PROXIERS"; then echo "$others"
  elif [ $(( $1 % 2 )) = 1 ]; then echo "kipvs $others"; else echo "$others kipvs"; fi
}
view() { [ "$1" = kube-proxy-nft ] && echo nft || echo ipvs; } # PROXIER: how the kernel's state is read

for n in "$@"; do
  if [ -n "$UNTIL" ] && [ "$(date +%s)" -gt "$(date -d "$UNTIL" +%s)" ]; then
    say "$n Services: not run (after BENCH_UNTIL $UNTIL)"; continue
  fi
  mkdir -p "$R/$n"
  t=$(date +%s.%N)
  kpvm_apply "$CORPUS" "scale-$n" "$R/$n"
  kpvm_churn_service scale0
  created=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t}")
  say "$n Services: created through the apiserver in $created s ($(wc -l < "$R/$n/rejected-objects") rejected)"
  put "$n" - - - created "$created"
  first=1
  for m in $(settings "$n"); do
    c=$(setting_dir "$n" "$m")
    for run in $(seq "$RUNS"); do
      if [ "$run" -gt 1 ] && [ -n "$UNTIL" ] && [ $(( $(date +%s) + $(date +%s) - run_t )) -gt "$(date -d "$UNTIL" +%s)" ]; then
        say "$n Services, minSyncPeriod $m: run $run and later not started (one more would end after BENCH_UNTIL $UNTIL)"
        break
      fi
      run_t=$(date +%s)
      for p in $(order "$run"); do
        [ "$run" = 1 ] || ! grep -qw -- "$p" <<<"$ONCE" || continue
        [ "$n" -lt "$ALONE_FROM" ] || [ "$p" = kipvs ] || grep -qw -- "$p" <<<"$ONCE" || continue
        o=$R/$n/$m/$p/$run
        mkdir -p "$o"
        P() { put "$n" "$m" "$p" "$run" "$@"; }
        if ! AGENT_TIMEOUT=$((LIMIT + 100)) agent start "$p" "$c" $((n + 1)) $((2 * n + 2)) "$LIMIT" > "$o/start"; then
          say "$n Services, minSyncPeriod $m, run $run: $p did not converge:"; sed 's/^/    /' "$o/start" | tail -n 20
          if grep -q 'did not converge in' "$o/start"; then P start ">$LIMIT"; else P start failed; fi
          continue
        fi
        P load "$(cut -d' ' -f1 /proc/loadavg)"
        P start "$(field seconds "$o/start")"
        P cpu_start "$(field cpu "$o/start")"
        say "$n Services, minSyncPeriod $m, run $run: $p's first sync ended $(field seconds "$o/start") s after its start" \
          "(seen $(field seen "$o/start") s; $(field counts "$o/start") virtual and real servers), $(field cpu "$o/start") CPU s;" \
          "load average $(cut -d' ' -f1-3 /proc/loadavg)"
        for rate in $RATES; do
          agent usage > "$o/usage-churn$rate-0" || true
          kpvm_churn "$(view "$p")" "$rate" "$SECONDS_EACH" "$LATE" "$o"
          agent usage > "$o/usage-churn$rate-1" || true
          full=$(( $(field full_sync_count "$o/usage-churn$rate-1" | grep . || echo 0) - $(field full_sync_count "$o/usage-churn$rate-0" | grep . || echo 0) ))
          P "churn${rate}_full" "$full"
          python3 -c 'import json, sys
for k, v in json.load(open(sys.argv[1])).items():
    print(k, "-" if v is None else v)' "$o/latency-$rate" | while read -r key value; do P "churn${rate}_$key" "$value"; done || true
          say "  churn $rate/s ($(cat "$o/summary-$rate")): $(tr -d '{}"' < "$o/latency-$rate"); full syncs meanwhile: $full"
        done
        if [ "$first" = 1 ]; then
          agent usage > "$o/usage-idle-0" || true
          sleep $(( 2 * ${SYNC_PERIOD%s} + 5 )) # on purpose: the window of the periodic syncs
          agent usage > "$o/usage-idle-1" || true
          syncs=$(( $(field full_sync_count "$o/usage-idle-1" | grep . || echo 0) - $(field full_sync_count "$o/usage-idle-0" | grep . || echo 0) ))
          mean=$(awk -v a="$(field full_sync_sum "$o/usage-idle-0")" -v b="$(field full_sync_sum "$o/usage-idle-1")" -v n="$syncs" \
            'BEGIN { if (n > 0) printf "%.3f", (b - a) / n; else print "-" }')
          P resync_mean "$mean"; P resync_count "$syncs"; P resync_metric "$(field full_sync_metric "$o/usage-idle-1")"
          P cpu_idle "$(awk -v a="$(field cpu "$o/usage-idle-0")" -v b="$(field cpu "$o/usage-idle-1")" 'BEGIN{printf "%.2f", b - a}')"
          say "  full syncs while idle: $syncs, mean $mean s ($(field full_sync_metric "$o/usage-idle-1"))"
        fi
        agent stop > "$o/stop" || { say "$p: stop failed:"; sed 's/^/    /' "$o/stop" | tail -n 20; }
        P cpu_total "$(field cpu "$o/stop")"
        P vmhwm_kb "$(field maxrss "$o/stop")"
        say "  whole run: $(field cpu "$o/stop") CPU s, peak RSS (VmHWM) $(field maxrss "$o/stop") KiB"
      done
    done
    first=0
  done
done
kpvm_finish 0 || say "the VM run failed (its log: $STATE/vm.log)"

# ---- the tables ------------------------------------------------------------------------------------------
{
  echo "\`hack/bench-vs-kube-proxy.sh $*\` (BENCH_RUNS=$RUNS, BENCH_PROXIERS=\"$PROXIERS\"${ONCE:+, BENCH_ONCE=\"$ONCE\"}${UNTIL:+, BENCH_UNTIL=$UNTIL}$([ "$ALONE_FROM" -ge 1000000000 ] || echo ", BENCH_ALONE_FROM=$ALONE_FROM"), BENCH_RATES=\"$RATES\"," \
    "CHURN_SECONDS=$SECONDS_EACH, BENCH_SYNC_PERIOD=$SYNC_PERIOD, BENCH_LATE=$LATE), $DATE0 UTC, $(( $(date +%s) - T0 )) s;" \
    "load average $LOAD0 at start, $(cut -d' ' -f1-3 /proc/loadavg) at end; kipvs of $COMMIT (the proxier image, release)," \
    "kube-proxy $KPVM_RELEASE; one VM boot (QEMU TCG, 1 vCPU, ${VMMEM} MiB)"
  python3 tests/kube-proxy/churn.py table "$OUT/results.txt" "$LATE"
} | tee "$OUT/report.txt"
cp "$OUT/report.txt" "$OUT/table.md"
say "report: $OUT/table.md; state: $STATE$([ "${KEEP:-0}" = 1 ] || echo ' (removed; KEEP=1 keeps it)')"
