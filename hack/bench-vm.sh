#!/bin/bash
# Real-kernel programming benchmark: in one VM boot, program BENCH_SERVICES (10000) ClusterIP Services
# with BENCH_ENDPOINTS (2) endpoints each into an empty IPVS table with `ipvsadm -R` and with
# `kipvs-proxier run --once`, and print the ratio (issue 12 target: at most 1.0) with the proxier's time per step.
# The proxier is the image's (static release build); KIPVS_PROXIER may point at another build.
set -euo pipefail
# The emulated VM on a loaded machine took ~9 min for this boot (the suite's default limit is 10).
export VMTIMEOUT=${VMTIMEOUT:-1800}
exec "$(dirname "$0")/test-vm.sh" --bench
