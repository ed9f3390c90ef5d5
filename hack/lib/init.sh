# The harness's one vocabulary: sourced by every script of hack/ and tests/ on the host (bash) and, copied into
# the VM's payload by hack/test-vm.sh, by tests/vm/lib.sh in the guest (POSIX sh, busybox). docs/testing.md
# says how a suite uses it.
#
#   say MSG...                 a progress line, "SUITE: MSG" ("  MSG" where SUITE is unset: the guest's tests)
#   ok WHAT / bad WHAT         one check passed / failed: counted in pass / fail, printed "ok   WHAT" / "FAIL WHAT"
#                              (the first failure is kept in FIRST_FAILURE)
#   check WHAT COMMAND...      ok or bad by COMMAND's status
#   skipped WHY WHAT...        the SKIPPED line of a check that cannot run here, and why
#   fatal WHAT...              a failure the run cannot go on from: bad WHAT (on stderr: it may run inside $(...)),
#                              exit 1
#   step TITLE...              a section's heading, "==> TITLE" after a blank line
#   wait_for SECONDS WHAT COMMAND...
#                              COMMAND (output and status untouched) until it succeeds, every WAIT_STEP s
#                              (0.25); after SECONDS (whole; /proc/uptime, to 10 ms) "timed out after SECONDS s
#                              waiting for: WHAT" on stderr and status 1. COMMAND runs at least once, and once
#                              more at the deadline.
#   until_ SECONDS COMMAND...  wait_for every POLL s (0.2), COMMAND its own WHAT
#   is VALUE COMMAND...        COMMAND prints VALUE
#   now / elapsed T            seconds (bash: the epoch, to 1 µs; the guest's sh: since boot, to 10 ms) / since T,
#                              one decimal
#   load                       the load average (1, 5, 15 min)
#   k ARGS...                  kubectl against the suite's apiserver ($KC; inside the netns $K_NETNS when set)
# The suite skeleton (host, bash):
#   suite NAME                 SUITE=NAME, say's prefix (T0 and LOAD0, for suite_end, are set when sourced)
#   state_dir NAME [DIR]       STATE=DIR, else a new /tmp/kipvs-NAME.XXXXXX; at exit removed, or kept with KEEP=1
#   on_exit COMMAND            the EXIT trap runs COMMAND (the last registered first; the script's exit status in
#                              EXIT_STATUS), then removes STATE
#   suite_end [TITLE]          "  load average: at start ..., at end ..." and "[TITLE: ]N passed, M failed (T s)";
#                              status 1 if any check failed
# Helpers' locals start with _: bash's scoping is dynamic, and COMMAND sees them.
# A fixed `sleep` elsewhere in the harness is a wait on purpose (a timeout waited out, a window in which a wrong
# change would show, a pace); each says why.
pass=0 fail=0 FIRST_FAILURE="" T0=$(date +%s) LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

say() { if [ -n "${SUITE:-}" ]; then printf '%s: %s\n' "$SUITE" "$*"; else printf '  %s\n' "$*"; fi; }
ok() { pass=$((pass + 1)); say "ok   $*"; }
bad() { fail=$((fail + 1)); [ -n "$FIRST_FAILURE" ] || FIRST_FAILURE=$*; say "FAIL $*"; }
check() { local _check_what=$1; shift; if "$@"; then ok "$_check_what"; else bad "$_check_what"; fi; }
skipped() { local _skip_why=$1; shift; say "SKIPPED ($_skip_why): $*"; }
fatal() { bad "$*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*"; }

wait_for() {
  local _wait_limit=$1 _wait_what=$2 _wait_end _wait_up
  shift 2
  _wait_end=$(( $(_wait_centiseconds) + _wait_limit * 100 ))
  until "$@"; do
    if [ "$(_wait_centiseconds)" -ge "$_wait_end" ]; then
      "$@" && return 0
      echo "timed out after $_wait_limit s waiting for: $_wait_what" >&2
      return 1
    fi
    sleep "${WAIT_STEP:-0.25}"
  done
}
# the time since boot in centiseconds (/proc/uptime: "12345.67 ...")
_wait_centiseconds() {
  read -r _wait_up _ < /proc/uptime
  echo "${_wait_up%.*}${_wait_up#*.}"
}
until_() { local _until_limit=$1; shift; WAIT_STEP=${POLL:-0.2} wait_for "$_until_limit" "$*" "$@"; }
is() { local _is_want=$1; shift; [ "$("$@")" = "$_is_want" ]; }

now() { if [ -n "${BASH_VERSION:-}" ]; then echo "$EPOCHREALTIME"; else cut -d' ' -f1 /proc/uptime; fi; }
elapsed() { awk "BEGIN{printf \"%.1f\", $(now) - $1}"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
k() {
  if [ -n "${K_NETNS:-}" ]; then ip netns exec "$K_NETNS" kubectl --kubeconfig "$KC" "$@"
  else kubectl --kubeconfig "$KC" "$@"; fi
}

suite() { SUITE=$1; }
state_dir() {
  STATE=${2:-$(mktemp -d "/tmp/kipvs-$1.XXXXXX")}
  mkdir -p "$STATE"
  trap _on_exit EXIT
}
_exit_cmds=""
on_exit() { _exit_cmds="$1${_exit_cmds:+; $_exit_cmds}"; trap _on_exit EXIT; }
_on_exit() {
  EXIT_STATUS=$?
  set +e
  eval "$_exit_cmds"
  if [ -n "${STATE:-}" ]; then
    if [ "${KEEP:-0}" = 1 ]; then say "state kept in $STATE"; else rm -rf "$STATE"; fi
  fi
  exit "$EXIT_STATUS"
}
suite_end() {
  echo "  load average: at start $LOAD0, at end $(load)"
  echo "${1:+$1: }$pass passed, $fail failed ($(( $(date +%s) - T0 )) s)"
  [ "$fail" = 0 ]
}
