# Helpers both operator suites share (tests/operator/e2e.sh, e2e-proxiers.sh; bash). The suite sets PC (the
# ProxyConfig it rolls out) and OUT (its log directory) before sourcing this, and adds the pids of what it
# starts to PIDS: they are stopped on exit; a failed run (fatal) dumps the ProxyConfig, the NodeProxyConfigs
# and the logs.
. "$(dirname "${BASH_SOURCE[0]}")/../../hack/lib/init.sh"         # ok, fatal, step, wait_for
. "$(dirname "${BASH_SOURCE[0]}")/../../hack/lib/kube-status.sh"  # patch_status

PIDS=()
stop_pids() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
on_exit stop_pids
on_exit '[ "$EXIT_STATUS" = 0 ] || dump'
dump() {
  echo "---- kubectl get proxyconfig $PC -o yaml"; kubectl get proxyconfig "$PC" -o yaml 2>&1 | sed -n '/^status:/,$p' || true
  echo "---- nodeproxyconfigs"; kubectl get nodeproxyconfigs 2>&1 || true
  for f in "$OUT"/*.log; do echo "---- $f (last 30 lines)"; tail -n 30 "$f"; done
}
quietly() { "$@" > /dev/null 2>&1; }
# wait_until SECONDS WHAT COMMAND...: polls COMMAND (output discarded) every 0.5 s; fails the suite on timeout
wait_until() { WAIT_STEP=0.5 wait_for "$1" "$2" quietly "${@:3}" 2> /dev/null || fatal "timed out after $1 s waiting for: $2"; }
pc() { kubectl get proxyconfig "$PC" -o jsonpath="$1"; }
reason() { pc "{.status.conditions[?(@.type==\"$1\")].reason}"; }

# follow_stages SECONDS [OPERATOR_LOG]: waits until the rollout of the current spec completes or fails, then
# prints its stage sequence (each stage once, in order): from OPERATOR_LOG's "stage X started for revision R"
# lines when given (race-free: a fast stage can start and finish between two polls of status.stage), else as
# polled. Each stage seen is snapshotted (`kubectl get proxyconfig`) into $OUT/snapshots.log.
follow_stages() {
  _stages_seen=""
  if WAIT_STEP=0.3 wait_for "$1" "the rollout's end" rollout_ended 2> /dev/null; then
    if [ -n "${2:-}" ]; then
      grep -o "stage [a-z0-9-]* started for revision $(pc '{.status.revision}')" "$2" | awk '{print $2}' | paste -sd' '
    else
      echo "${_stages_seen# }"
    fi
    return 0
  fi
  echo "${_stages_seen# } (timeout)"; return 1
}
# rollout_ended: records the stage in progress in _stages_seen; true once the current generation's rollout is
# complete, rolled back or halted.
rollout_ended() {
  local generation observed stage progressing
  # one read: fields read one by one can mix the previous rollout's end with the new generation
  IFS='|' read -r generation observed stage progressing <<<"$(pc '{.metadata.generation}|{.status.observedGeneration}|{.status.stage}|{.status.conditions[?(@.type=="Progressing")].reason}')"
  if [ -n "$stage" ] && [ "${_stages_seen##* }" != "$stage" ]; then
    _stages_seen="$_stages_seen $stage"
    { echo "# stage $stage"; kubectl get proxyconfig; } >> "$OUT/snapshots.log"
  fi
  [ "$observed" = "$generation" ] && [ -z "$stage" ] && [[ "$progressing" =~ ^(RolloutComplete|RolledBack|Halted)$ ]]
}
