#!/bin/bash
# Full plan + sync and peak memory at cluster scale, today's tree against a baseline commit,
# side by side in one run (issue 12). Builds BASELINE (default da92c81, before the compact
# store) in a temporary `git worktree` with its own target dir under target/, copies the same
# benchmark program (proxier/examples/scale/) into it, runs it on both for BENCH_SERVICES
# (default 50000) Services x 10 endpoints x 2 ports, and prints a table: figure, baseline,
# now, ratio (baseline / now for times and memory: above 1 means now is better).
# Each side runs in its own process, one after the other, ROUNDS (3) full plan + sync rounds
# each; the figures are medians. Peak RSS is the process's VmHWM after holding and planning
# (before any sync) and after the first sync into the in-memory FakeDataplane.
# Usage: hack/bench-engine.sh [SERVICES [ROUNDS]]   (BASELINE=<commit> to compare another;
# KEEP_BASELINE=1 keeps the baseline worktree and its build for the next run)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
baseline=${BASELINE:-da92c81}
services=${1:-${BENCH_SERVICES:-50000}}
rounds=${2:-3}
out=$root/target/bench-engine
base_tree=$out/tree

. hack/lib/baseline.sh
trap baseline_cleanup EXIT
baseline_checkout "$baseline" "$base_tree"
mkdir -p "$base_tree/proxier/examples/scale"
for f in proxier/examples/scale/*.rs; do # copy only on change (keeps the build's fingerprints)
    cmp -s "$f" "$base_tree/$f" || cp "$f" "$base_tree/$f"
done

build() { # tree target-dir name
    (cd "$1" && CARGO_TARGET_DIR=$2 cargo build -q --release -p kipvs-proxier --example scale)
    cp "$2/release/examples/scale" "$out/scale-$3"
}
echo "building baseline $(git rev-parse --short "$baseline") and now ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- proxier || echo +changes))" >&2
build "$base_tree" "$out/target" baseline
build "$root" "$root/target" now

echo "running: scale $services Services, $rounds rounds, baseline then now" >&2
"$out/scale-baseline" "$services" "$rounds" >"$out/baseline.out"
"$out/scale-now" "$services" "$rounds" >"$out/now.out"

python3 - "$out/baseline.out" "$out/now.out" "$services" <<'EOF'
import sys
def read(path):
    return {f: (float(v), u) for f, v, u in (l.split() for l in open(path) if l.strip())}
base, now, n = read(sys.argv[1]), read(sys.argv[2]), sys.argv[3]
print(f"{'figure (' + n + ' Services)':<34} {'baseline':>12} {'now':>12} {'ratio':>7}")
for figure, (b, unit) in base.items():
    v = now[figure][0]
    ratio = f"{b / v:.2f}" if v else "-"
    fmt = (lambda x: f"{x:.0f} {unit}") if unit != "ms" else (lambda x: f"{x:.1f} {unit}")
    print(f"{figure:<34} {fmt(b):>12} {fmt(v):>12} {ratio:>7}")
EOF
