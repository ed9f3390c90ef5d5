# Waiting for a condition, for every shell of the harness: sourced by hack/*.sh and tests/**/*.sh on the
# host (bash) and, copied into the VM's payload, by tests/vm/lib.sh in the guest (POSIX sh, busybox).
#
# usage: wait_for SECONDS WHAT COMMAND...
#   Runs COMMAND (its output and status untouched) until it succeeds, every WAIT_STEP seconds (0.25);
#   returns 0 as soon as it does. After SECONDS (a whole number; measured on /proc/uptime, to 10 ms) prints
#   "timed out after SECONDS s waiting for: WHAT" on stderr and returns 1. COMMAND runs at least once, and
#   once more at the deadline, so a condition met just in time is not missed.
# A fixed `sleep` elsewhere in the harness is a wait on purpose (a timeout waited out, a window in which a
# wrong change would show, a pace); each says why.
wait_for() {
  _wait_limit=$1 _wait_what=$2
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
