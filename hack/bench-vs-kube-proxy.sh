#!/usr/bin/env bash
# kube-proxy 1.24 (IPVS mode) against kipvs, side by side in one boot of the test VM, on the same objects in
# the same real kube-apiserver and the same kernel: for each size, N ClusterIP Services with two endpoints
# each are created, then each proxier is started cold and runs until its table is converged (kube-proxy: the
# state it keeps once synced; kipvs: `run --once`), and the two tables are compared as the parity check
# compares them. Prints, per size, the time from start to the converged table, the CPU seconds (user +
# system) and the peak RSS of each process, and kube-proxy / kipvs as ratios (hack/parity-kube-proxy.sh
# --bench does the work; the VM is QEMU software emulation, so only the ratios carry over to a node).
#
# usage: hack/bench-vs-kube-proxy.sh [N...]      (default: 1000 10000)   env: as hack/parity-kube-proxy.sh
set -euo pipefail
[ $# -gt 0 ] || set -- 1000 10000
exec "$(dirname "$0")/parity-kube-proxy.sh" --bench "$@"
