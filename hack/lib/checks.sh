# The pass/fail tally of the host-side suites (hack/test-cluster.sh, hack/test-e2e.sh, hack/test-node.sh).
# Sourced after the suite defines say(); the suite prints "$pass passed, $fail failed" at its end.
#   ok WHAT / bad WHAT      count and print one result
#   check WHAT COMMAND...   ok or bad by the command's status
pass=0 fail=0
ok() { pass=$((pass + 1)); say "ok   $*"; }
bad() { fail=$((fail + 1)); say "FAIL $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
