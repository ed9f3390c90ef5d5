#!/bin/sh
# ipvs-rs against the real kernel: its integration test binary (ipvs-rs/tests/kernel.rs), run in a
# network namespace of its own so that it sees an empty IPVS table and cannot disturb the proxier's.
. /payload/tests/lib.sh
B=/payload/bin/ipvs-rs-kernel
[ -x "$B" ] || skip "no ipvs-rs kernel test binary in the payload (ipvs-rs/tests/kernel.rs absent at build time)"
ip netns add ipvs-rs-test && ip -n ipvs-rs-test link set lo up
ip netns exec ipvs-rs-test env KIPVS_REQUIRE_KERNEL=1 RUST_BACKTRACE=1 "$B" --test-threads=1 > "$W/ipvs-rs.out" 2>&1
rc=$?
indent < "$W/ipvs-rs.out"
ip netns del ipvs-rs-test
check "test binary exit status 0 (got $rc)" [ $rc -eq 0 ]
result=$(grep '^test result:' "$W/ipvs-rs.out" | tail -n1)
case $result in "test result: ok. "[1-9]*) ok "$result" ;; *) bad "no passing tests (${result:-no result line})" ;; esac
finish
