#!/bin/bash
# The demo: build kipvs-proxier, boot Debian's kernel with IPVS under QEMU (everything it needs is
# fetched through apt into ~/.cache/kipvs-vm on first use), run `kipvs-proxier run` on the example
# cluster (tests/manifests/cluster) and print the IPVS table, the addresses bound on kube-ipvs0 and
# where real TCP/UDP connections from a client network namespace land.
#
# usage: hack/demo.sh        (same environment knobs as hack/test-vm.sh)
set -euo pipefail
exec "$(dirname "$0")/test-vm.sh" --demo
