#!/usr/bin/env bash
# kube-proxy (IPVS mode) against kipvs, speed and cost side by side in one boot of the test VM, on the
# same objects in the same real kube-apiserver and the same kernel (hack/lib/kube-proxy-vm.sh: kube-proxy
# of Debian's 1.20.2 build or KIPVS_K8S_BIN's, the proxier image's kipvs-proxier, as
# hack/parity-kube-proxy.sh runs them). The tables name the kube-proxy release, from its --version.
# For each size N: N ClusterIP Services with an EndpointSlice of two ready endpoints each
# (tests/kube-proxy/corpus.py --scale, four `kubectl create` at once) and the Service bench-churn
# (10.96.250.1:80). Then, for each minSyncPeriod setting and each proxier in turn (the kernel flushed
# between them), with ipvs.syncPeriod BENCH_SYNC_PERIOD for both:
#   - cold start: the process started, until the kernel holds every virtual and real server
#     (/proc/net/ip_vs, polled every 0.5 s);
#   - churn: CHURN_SECONDS of RATE EndpointSlice writes a second to bench-churn's slice
#     (tests/kube-proxy/churn.py, one keep-alive connection), each replacing one endpoint; the latency of a
#     write is from the apiserver's answer to the first poll of `ipvsadm -Ln -t 10.96.250.1:80` in the guest
#     (every ~0.1 s) whose weighted real servers show it or a later write (guest clock mapped to this
#     machine's: hack/lib/guest-clock.sh); p50, p99, max;
#   - periodic full resync (first setting only): BENCH_SYNC_PERIOD x 2 + 5 s without changes; the syncs made
#     meanwhile, from kubeproxy_sync_proxy_rules_duration_seconds (kube-proxy's histogram; kipvs exports the
#     same one for its own syncs): count and mean;
#   - CPU seconds (user + system, waited-for children included: kube-proxy's iptables-restore and ipset) at
#     each step, and the peak RSS (VmHWM) of the process over the whole run.
# Prints one table per size with kube-proxy / kipvs as ratios. A proxier that does not converge within
# BENCH_LIMIT is reported as such and the size's other steps are left out for it. The VM is QEMU software
# emulation on one vCPU: absolute figures are that machine's, the ratios are what carries over.
#
# --e2e: failed requests instead, side by side: hack/test-e2e.sh's phases (readiness flap, rolling updates,
# proxier restart, apiserver outage, latency writes) under its load, once with E2E_PROXIER=kube-proxy and once
# with kipvs (two VM boots), printed as one table: requests sent / failed, long-lived connections broken.
# E2E_SAMPLES latency writes (20 here: kube-proxy takes ~10 s for each).
#
# usage: hack/bench-vs-kube-proxy.sh [N...]            (default: 1000 10000)
#        hack/bench-vs-kube-proxy.sh --e2e
# env:   BENCH_MIN_SYNC ("0 1s": the minSyncPeriod settings; 0 is kube-proxy's default for IPVS mode
#        (1.20-1.24 default only iptables mode's to 1 s); kipvs's is 0 too), BENCH_MIN_SYNC_UP_TO (1000: the settings
#        after the first run at sizes up to this only, each is another cold start of both),
#        BENCH_RATES ("10 100"), CHURN_SECONDS (15), BENCH_SYNC_PERIOD (10s), BENCH_LIMIT (600 s per cold
#        start), VMMEM (3072), and
#        hack/lib/kube-proxy-vm.sh's; KEEP=1 keeps the state dir (logs, writes, polls, results.txt)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. hack/lib/host-tools.sh && host_tools # kubectl, curl, ...
. hack/lib/kube-proxy-vm.sh            # kpvm_*, agent
. hack/lib/guest-clock.sh              # guest_clock_offset
export CP_PORT=${CP_PORT:-27443} CP_ETCD_PORT=${CP_ETCD_PORT:-27790}
export VMMEM=${VMMEM:-3072}
[ $# -gt 0 ] || set -- 1000 10000
MIN_SYNC=${BENCH_MIN_SYNC:-0 1s}
RATES=${BENCH_RATES:-10 100}
MIN_SYNC_UP_TO=${BENCH_MIN_SYNC_UP_TO:-1000}
SECONDS_EACH=${CHURN_SECONDS:-15}
SYNC_PERIOD=${BENCH_SYNC_PERIOD:-10s}
LIMIT=${BENCH_LIMIT:-600}
CHURN_VS=10.96.250.1:80
say() { printf 'bench: %s\n' "$*"; }
kpvm_require
T0=$(date +%s)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
say "kube-proxy $KPVM_RELEASE (IPVS mode) against kipvs; load average at start: $LOAD0"
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
mkdir -p "$R"
: > "$R/results.txt"
put() { echo "$*" >> "$R/results.txt"; } # SIZE SETTING PROXIER KEY VALUE

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
import sys, yaml
d, period, min_sync = sys.argv[1:]
for f in ("kube-proxy.yaml", "kipvs.yaml"):
    conf = yaml.safe_load(open(f"{d}/{f}"))
    conf["ipvs"]["syncPeriod"] = period
    conf["ipvs"]["minSyncPeriod"] = min_sync
    yaml.safe_dump(conf, open(f"{d}/{f}", "w"), sort_keys=False)
PY
  done
done

# ---- control plane, guest, VM ----------------------------------------------------------------------------
kpvm_init "$STATE"
k() { kubectl --kubeconfig "$KC" "$@"; }
TOKEN=$(k config view --minify --raw -o jsonpath='{.users[0].user.token}')
SERVER=https://127.0.0.1:$CP_PORT
for n in "$@"; do for m in $(settings "$n"); do kpvm_cluster "$CORPUS" "$(setting_dir "$n" "$m")"; done; done
kpvm_boot || exit 1

SEQ=0 # the churn's next sequence number (tests/kube-proxy/churn.py address)
churn() { # RATE SECONDS OUT: writes, prints churn.py's summary
  python3 tests/kube-proxy/churn.py write "$KPVM_MINOR" "$SERVER" "$TOKEN" scale0 bench-churn "$SEQ" "$1" "$2" "$3"
  SEQ=$(( SEQ + $(wc -l < "$3") ))
}
field() { sed -n "s/^$1 //p" "$2" | tail -n1; }

for n in "$@"; do
  mkdir -p "$R/$n"
  t=$(date +%s.%N)
  kpvm_apply "$CORPUS" "scale-$n" "$R/$n"
  k apply -f - > /dev/null <<EOF
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bench-churn", "namespace": "scale0", "labels": {"kipvs-parity": "1"}},
 "spec": {"clusterIP": "${CHURN_VS%:*}", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}
EOF
  churn 1 1 "$R/$n/initial-write" > /dev/null
  created=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t}")
  say "$n Services: created through the apiserver in $created s ($(wc -l < "$R/$n/rejected-objects") rejected)"
  put "$n" - - created "$created"
  first=1
  for m in $(settings "$n"); do
    c=$(setting_dir "$n" "$m")
    for p in kube-proxy kipvs; do
      o=$R/$n/$m/$p
      mkdir -p "$o"
      if ! AGENT_TIMEOUT=$((LIMIT + 100)) agent start "$p" "$c" $((n + 1)) $((2 * n + 2)) "$LIMIT" > "$o/start"; then
        say "$n Services, minSyncPeriod $m: $p did not converge:"; sed 's/^/    /' "$o/start" | tail -n 20
        put "$n" "$m" "$p" start "failed"
        continue
      fi
      put "$n" "$m" "$p" start "$(field seconds "$o/start")"
      put "$n" "$m" "$p" cpu_start "$(field cpu "$o/start")"
      say "$n Services, minSyncPeriod $m: $p converged after $(field seconds "$o/start") s, $(field cpu "$o/start") CPU s"
      for rate in $RATES; do
        agent watch-start "$CHURN_VS" > /dev/null || say "  the guest's poll of $CHURN_VS did not start"
        churn "$rate" "$SECONDS_EACH" "$o/writes-$rate" > "$o/summary-$rate" || echo "the writes failed" > "$o/summary-$rate"
        summary=$(cat "$o/summary-$rate")
        sleep 3 # on purpose: the last writes' time to reach the kernel
        agent watch-stop > "$o/watch-$rate" || true
        guest_clock_offset
        read -r p50 p99 max seen total < <(python3 tests/kube-proxy/churn.py latency "$o/writes-$rate" "$o/watch-$rate" "$OFFSET") || true
        agent usage > "$o/usage-$rate" || true
        put "$n" "$m" "$p" "churn${rate}_p50" "$p50"; put "$n" "$m" "$p" "churn${rate}_p99" "$p99"
        put "$n" "$m" "$p" "churn${rate}_seen" "$seen/$total"
        say "  churn $rate/s ($summary): write -> kernel p50 $p50 s, p99 $p99 s, max $max s ($seen of $total seen; clock round trip $RTT s)"
      done
      if [ "$first" = 1 ]; then
        agent usage > "$o/usage-idle-0" || true
        sleep $(( 2 * ${SYNC_PERIOD%s} + 5 )) # on purpose: the window of the periodic syncs
        agent usage > "$o/usage-idle-1" || true
        syncs=$(( $(field sync_count "$o/usage-idle-1" | grep . || echo 0) - $(field sync_count "$o/usage-idle-0" | grep . || echo 0) ))
        mean=$(awk -v a="$(field sync_sum "$o/usage-idle-0")" -v b="$(field sync_sum "$o/usage-idle-1")" -v n="$syncs" \
          'BEGIN { if (n > 0) printf "%.3f", (b - a) / n; else print "-" }')
        put "$n" "$m" "$p" resync_mean "$mean"; put "$n" "$m" "$p" resync_count "$syncs"
        put "$n" "$m" "$p" cpu_idle "$(awk -v a="$(field cpu "$o/usage-idle-0")" -v b="$(field cpu "$o/usage-idle-1")" 'BEGIN{printf "%.2f", b - a}')"
        say "  periodic syncs while idle: $syncs, mean $mean s"
      fi
      agent stop > "$o/stop" || { say "$p: stop failed:"; sed 's/^/    /' "$o/stop" | tail -n 20; }
      put "$n" "$m" "$p" cpu_total "$(field cpu "$o/stop")"
      put "$n" "$m" "$p" maxrss_kb "$(field maxrss "$o/stop")"
      say "  whole run: $(field cpu "$o/stop") CPU s, peak RSS $(field maxrss "$o/stop") KiB"
    done
    first=0
  done
done
kpvm_finish 0 || say "the VM run failed (its log: $STATE/vm.log)"

# ---- the tables ------------------------------------------------------------------------------------------
echo
echo "=== kube-proxy $KPVM_RELEASE (IPVS) / kipvs, one VM boot (QEMU TCG, 1 vCPU, ${VMMEM} MiB), syncPeriod $SYNC_PERIOD," \
  "churn $SECONDS_EACH s per rate; load average at start $LOAD0, at end $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$(( $(date +%s) - T0 )) s"
python3 - "$R/results.txt" <<'PY' | tee "$STATE/report"
import sys
rows = {}
for line in open(sys.argv[1]):
    n, m, p, key, value = line.split()
    rows.setdefault(n, {})[(m, p, key)] = value
def num(v):
    try:
        return float(v)
    except ValueError:
        return None
for n, r in rows.items():
    print(f"\n{n} Services (created through the apiserver in {r.get(('-', '-', 'created'), '?')} s)")
    print(f"  {'':44} {'kube-proxy':>12} {'kipvs':>10} {'kube-proxy/kipvs':>17}")
    settings = sorted({m for m, _, _ in r if m != "-"}, key=lambda s: s != "0")
    labels = [("start", "cold start to converged table, s"), ("cpu_start", "  CPU s to converge")]
    for rate in sorted({k[5:k.index("_")] for _, _, k in r if k.startswith("churn")}, key=int):
        labels += [(f"churn{rate}_p50", f"churn {rate}/s: write -> kernel p50, s"), (f"churn{rate}_p99", f"churn {rate}/s: p99, s"),
                   (f"churn{rate}_seen", f"churn {rate}/s: writes seen in the kernel")]
    labels += [("resync_mean", "periodic full sync, mean s"), ("resync_count", "  syncs in the idle window"),
               ("cpu_idle", "  CPU s in the idle window"), ("cpu_total", "CPU s, whole run"), ("maxrss_kb", "peak RSS, MiB")]
    for m in settings:
        print(f"  minSyncPeriod {m}:")
        for key, label in labels:
            kp, kv = r.get((m, "kube-proxy", key)), r.get((m, "kipvs", key))
            if kp is None and kv is None:
                continue
            if key == "maxrss_kb":
                kp = f"{int(kp) / 1024:.0f}" if kp and kp.isdigit() else kp
                kv = f"{int(kv) / 1024:.0f}" if kv and kv.isdigit() else kv
            a, b = num(kp or "-"), num(kv or "-")
            ratio = f"{a / b:.1f}x" if a is not None and b not in (None, 0.0) else "-"
            print(f"    {label:42} {kp or '-':>12} {kv or '-':>10} {ratio:>17}")
PY
say "state: $STATE$([ "${KEEP:-0}" = 1 ] || echo ' (removed; KEEP=1 keeps it)')"
