# The end to end's host half, shared by the suites that drive the VM's e2e agent (tests/vm/e2e/agent.sh)
# under load: hack/test-e2e.sh and hack/test-takeover.sh. Sourced after hack/lib/checks.sh (ok, bad,
# check); the caller sets AGENT_PORT (the host loopback port QEMU forwards to the agent), CP_PORT, ES_API (the
# EndpointSlice group/version the release serves, tests/lib/k8s_api.py), STATE (its
# state dir), vm_pid (the VM's hack/test-vm.sh, once started) and defines say and now.
vm_gone() { ! kill -0 "$vm_pid" 2>/dev/null; }
# stop_vm_and_control_plane: the caller's EXIT trap: the VM told to finish (killed after 5 s), the control plane
# stopped, STATE removed unless KEEP=1
stop_vm_and_control_plane() {
  if [ -n "$vm_pid" ] && kill -0 "$vm_pid" 2>/dev/null; then
    agent finish 1 > /dev/null 2>&1 || true
    wait_for 5 "the VM to exit" vm_gone 2> /dev/null || kill "$vm_pid" 2>/dev/null || true
  fi
  hack/control-plane.sh stop "$STATE" || true
  if [ "${KEEP:-0}" = 1 ]; then say "state kept in $STATE"; else rm -rf "$STATE"; fi
}
# guest_kubeconfig KUBECONFIG > FILE: the guest's kubeconfig: the host's loopback as QEMU shows it (10.0.2.2), and
# the apiserver's self-signed certificate as CA (the guest has no CA bundle, and kube's rustls client loads one
# unless the kubeconfig names a CA; client-go ignores it beside insecure-skip-tls-verify; the certificate does
# not name 10.0.2.2, so verification stays off as on the host)
guest_kubeconfig() {
  sed -e "s#https://127.0.0.1:$CP_PORT#https://10.0.2.2:$CP_PORT#" \
    -e "s#insecure-skip-tls-verify: true#insecure-skip-tls-verify: true, certificate-authority-data: $(base64 -w0 "$STATE/certs/apiserver.crt")#" \
    "$1"
}
# ---- the guest agent ------------------------------------------------------------------------------------
# agent CMD ARGS...: prints the answer without its AGENT-RC line; fails when the command did (`wait` may take
# its SECONDS argument: the request's timeout follows it)
agent() {
  local out limit=${AGENT_TIMEOUT:-60}
  [ "$1" != wait ] || limit=$(( ${6:-30} + 30 ))
  # -g: an IPv6 address's brackets ([fd00::1]:80) are not curl's URL globbing
  out=$(curl -gs -m "$limit" "http://127.0.0.1:$AGENT_PORT/cgi-bin/agent?$(tr ' ' '+' <<<"$*")") || return 1
  sed '$d' <<<"$out"
  [ "$(tail -n1 <<<"$out")" = AGENT-RC=0 ]
}
must() { # must CMD ARGS...: an agent command the run cannot go on without
  local out
  out=$(agent "$@") || { say "agent $*: failed: $out"; exit 1; }
}

# ---- API writes: server-side apply through curl, so that the write's own time is known ----------------
api_apply() { # PATH < JSON: prints nothing; fails unless 200/201
  local code
  code=$(curl -sk -m 10 -o "$STATE/api.out" -w '%{http_code}' -X PATCH -H 'Authorization: Bearer kipvs-test-token' \
    -H 'Content-Type: application/apply-patch+yaml' --data-binary @- \
    "https://127.0.0.1:$CP_PORT$1?fieldManager=kipvs-e2e&force=true")
  [ "$code" = 200 ] || [ "$code" = 201 ] || { say "apply $1: HTTP $code $(head -c 300 "$STATE/api.out")"; return 1; }
}
# slice NAME SERVICE ENDPOINT...: the EndpointSlice NAME of SERVICE with these endpoints (IP:ready or
# IP:terminating, i.e. serving+terminating; IP of either family, the slice's addressType follows the first),
# ports http/TCP and udp/UDP 8080, and the ports of SLICE_EXTRA_PORTS (JSON objects, each with a leading comma)
# when set
slice() {
  local eps="" e c family=IPv4
  case ${3%:*} in *:*) family=IPv6 ;; esac
  for e in "${@:3}"; do
    case ${e##*:} in
      ready) c='"ready":true,"serving":true,"terminating":false' ;;
      terminating) c='"ready":false,"serving":true,"terminating":true' ;;
    esac
    eps="$eps${eps:+,}{\"addresses\":[\"${e%:*}\"],\"conditions\":{$c},\"nodeName\":\"test-node\"}"
  done
  printf '{"apiVersion":"%s","kind":"EndpointSlice","metadata":{"name":"%s","namespace":"default",
"labels":{"kubernetes.io/service-name":"%s"}},"addressType":"%s","ports":[{"name":"http","port":8080,"protocol":"TCP"},
{"name":"udp","port":8080,"protocol":"UDP"}%s],"endpoints":[%s]}' "$ES_API" "$1" "$2" "$family" "${SLICE_EXTRA_PORTS:-}" "$eps" |
    api_apply "/apis/$ES_API/namespaces/default/endpointslices/$1"
}

agent_up() {
  ! vm_gone || { tail -n 40 "$STATE/vm.log"; say "the VM exited before its agent answered"; exit 1; }
  [ "$(AGENT_TIMEOUT=5 agent ping 2>/dev/null)" = pong ]
}
quiet() { "$@" > /dev/null; }

# ---- load and its phases ---------------------------------------------------------------------------------
stats() { agent load-stats | tail -n1; }
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
begin() { PHASE=$1; LAST=$(stats); say "== $PHASE"; echo "$(now) begin $PHASE" >> "$STATE/phases"; }
zeros() { local v; for v in "$@"; do [ "$v" = 0 ] || return 1; done; }
end_phase() { # [failures|figures]: prints the phase's figures and appends them to E2E_FIGURES (when set: one
  # line PHASE|TCP-sent TCP-failed UDP-sent UDP-failed long-broken reconnects-failed slow pauses); any failure
  # fails the check (with "failures": the phase must show some, a negative control; with "figures": the
  # failures are the measurement, not checked)
  local s d=()
  s=$(stats)
  for f in tcp_sent tcp_failed udp_sent udp_failed long_broken long_connect_failed slow pauses; do
    d+=("$(( $(field "$s" "$f") - $(field "$LAST" "$f") ))")
  done
  FIG+=("$(printf '%-24s TCP sent %5d failed %d | UDP sent %4d failed %d | long-lived broken %d (reconnects failed %d) | slower than 1 s %d | load paused %d' \
    "$PHASE" "${d[@]}")")
  say "${FIG[-1]}"
  echo "$(now) end $PHASE" >> "$STATE/phases"
  [ -z "${E2E_FIGURES:-}" ] || echo "$PHASE|${d[*]}" >> "$E2E_FIGURES"
  case ${1:-} in
    failures)
      local seen=$(( d[1] + d[3] + d[4] ))
      check "$PHASE: the harness sees the failures ($seen failed requests and broken connections)" [ "$seen" -gt 0 ] ;;
    figures) ;;
    *) check "$PHASE: no failed request, no broken long-lived connection" zeros "${d[1]}" "${d[3]}" "${d[4]}" "${d[5]}" ;;
  esac
}
