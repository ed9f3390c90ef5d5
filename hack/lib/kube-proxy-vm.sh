# kube-proxy (Debian's 1.20.2 build or KIPVS_K8S_BIN's: hack/lib/k8s-build.sh) and kipvs in one boot of the
# test VM against a real kube-apiserver of the same release on this machine: the
# harness of hack/parity-kube-proxy.sh and hack/bench-vs-kube-proxy.sh (sourced, bash; run from the
# repository's root with hack/lib/host-tools.sh's host_tools done). The guest half is tests/kube-proxy/
# (guest.sh, agent.sh); the kube-apiserver is reached through QEMU's user-mode network as in
# hack/test-e2e.sh.
#
#   kpvm_require             python3-yaml installed when missing; sets KPVM_MINOR (the release under test,
#                            1.MINOR: k8s_minor) and KPVM_RELEASE (kube-proxy's version, e.g. v1.20.2, from
#                            its --version); fails when kube-proxy and kube-apiserver are not of one minor
#   kpvm_init STATE          the control plane started in STATE/cp, the guest's files in STATE/guest
#                            (hack/lib/kube-proxy-payload.sh, the agent, kipvs's kubeconfig);
#                            sets KC (the host's kubeconfig) and G (the guest's /payload/kube-proxy); installs
#                            the EXIT trap that stops the VM and the control plane (and removes STATE unless KEEP=1)
#   kpvm_cluster CORPUS C    copies cluster C of a corpus (tests/kube-proxy/corpus.py) into the guest's files
#   kpvm_apply CORPUS C DIR  replaces the objects of the previous cluster by those of cluster C in the API (four
#                            `kubectl create` at once for a scale cluster), patches their status; writes
#                            DIR/apply.log and DIR/rejected-objects (what the apiserver refused)
#   kpvm_boot                boots the VM (hack/test-vm.sh --kube-proxy, log in STATE/vm.log; env VMMEM,
#                            VMTIMEOUT) and waits for the guest agent
#   kpvm_finish RC           ends the guest's run with RC, waits for the VM; fails when the VM run did
#   kpvm_churn_service NS    the Service bench-churn (KPVM_CHURN_VS, 10.96.250.1:80) in namespace NS and its
#                            EndpointSlice's first write
#   kpvm_churn VIEW RATE SECONDS LATE DIR  RATE EndpointSlice writes a second for SECONDS to bench-churn's slice
#                            (tests/kube-proxy/churn.py write) while the guest polls the kernel (agent watch-start
#                            with VIEW: ipvs, ipvs+sync (the sync metric too) or nft with the sync metric); after
#                            the window (the writes and 3 s) the polls go on until every write is applied (for
#                            ipvs+sync and nft: by a sync that has ended) or LATE s have passed. DIR gets
#                            writes-RATE, watch-RATE, latency-RATE (churn.py latency's JSON: kernel detection
#                            for ipvs, sync for ipvs+sync and nft) and summary-RATE (churn.py write's, the
#                            clock's round trip).
#                            Not in a subshell: it counts the writes' sequence numbers on (KPVM_SEQ)
#   kpvm_detection_check CORPUS C DIR  (hack/parity-kube-proxy.sh) the bench's detection path through the
#                            proxiers' sync metric, the one kube-proxy's nftables mode needs, checked in IPVS mode
#                            where the kernel can be read too: cluster C (its `agent run` outputs in DIR) and
#                            bench-churn applied, each proxier started (`agent start` with no counts: converged on
#                            its sync metric alone) must then hold C's table and bench-churn's; 20 churn writes
#                            at 10/s must each be applied by both paths in agreement (churn.py check-detection).
#                            Prints what it checked, fails when a check did
#   agent CMD ARGS...        one agent command (tests/kube-proxy/agent.sh); prints the answer without its
#                            AGENT-RC line, fails when the command did; AGENT_TIMEOUT (300) bounds it
# env: CP_PORT/CP_ETCD_PORT (the caller's defaults), PARITY_AGENT_PORT (27100), KEEP=1, VMCACHE, CPCACHE
. hack/lib/kube-proxy-payload.sh # kube_proxy_payload
. hack/lib/kube-status.sh # patch_status
. hack/lib/guest-clock.sh # guest_clock_offset
KPVM_AGENT_PORT=${PARITY_AGENT_PORT:-27100}
KPVM_STATE="" vm_pid=""
KPVM_CHURN_VS=10.96.250.1:80
KPVM_SEQ=0 # the churn's next sequence number (tests/kube-proxy/churn.py address)

agent() {
  local out
  out=$(curl -s -m "${AGENT_TIMEOUT:-300}" "http://127.0.0.1:$KPVM_AGENT_PORT/cgi-bin/agent?$(tr ' ' '+' <<<"$*")") || return 1
  sed '$d' <<<"$out"
  [ "$(tail -n1 <<<"$out")" = AGENT-RC=0 ]
}

kpvm_cleanup() {
  if [ -n "$vm_pid" ] && kill -0 "$vm_pid" 2>/dev/null; then
    AGENT_TIMEOUT=5 agent finish 1 > /dev/null 2>&1 || true
    sleep 5; kill "$vm_pid" 2>/dev/null || true
  fi
  [ -z "$KPVM_STATE" ] || hack/control-plane.sh stop "$KPVM_STATE/cp" || true
  if [ "${KEEP:-0}" = 1 ]; then echo "state kept in $KPVM_STATE"; else rm -rf "$KPVM_STATE"; fi
}

# kpvm_require: what the harness needs before it starts: python3's yaml module for the corpus and the
# comparison, the release under test
kpvm_require() {
  local kp
  python3 -c 'import yaml' 2> /dev/null || apt-get install -y -qq python3-yaml > /dev/null
  KPVM_MINOR=$(k8s_minor) || return 1
  kp=$(k8s_bin kube-proxy) || return 1
  KPVM_RELEASE=$("$kp" --version | grep -o 'v1\.[0-9]*\.[0-9a-z.+-]*' | head -n1 || true)
  [ "$(k8s_minor_of "$kp")" = "$KPVM_MINOR" ] ||
    { echo "kube-proxy $kp is ${KPVM_RELEASE:-of no version}, kube-apiserver 1.$KPVM_MINOR: one release is needed" >&2; return 1; }
}

kpvm_init() {
  KPVM_STATE=$1
  trap kpvm_cleanup EXIT
  hack/control-plane.sh start "$KPVM_STATE/cp"
  KC=$KPVM_STATE/cp/kubeconfig
  KPVM_TOKEN=$(kubectl --kubeconfig "$KC" config view --minify --raw -o jsonpath='{.users[0].user.token}')
  KPVM_SERVER=https://127.0.0.1:$CP_PORT
  G=$KPVM_STATE/guest
  kube_proxy_payload "$G" "$KC"
  mkdir -p "$G/clusters"
  cp tests/kube-proxy/guest.sh tests/kube-proxy/agent.sh "$G/" && cp -r tests/kube-proxy/www "$G/"
  # kipvs's rustls client also gets the apiserver's certificate as CA (it loads a CA bundle otherwise, and the
  # guest has none); client-go (kube-proxy) refuses a CA together with insecure-skip-tls-verify (the
  # certificate does not name 10.0.2.2).
  sed "s#insecure-skip-tls-verify: true#insecure-skip-tls-verify: true, certificate-authority-data: $(base64 -w0 "$KPVM_STATE/cp/certs/apiserver.crt")#" \
    "$G/kubeconfig" > "$G/kipvs-kubeconfig"
}

kpvm_cluster() {
  mkdir -p "$G/clusters/$2" && cp "$1/$2"/{kube-proxy.yaml,kipvs.yaml,addrs} "$G/clusters/$2/"
}

kpvm_apply() {
  local creates=() f path body
  kubectl --kubeconfig "$KC" delete svc,endpointslices -A -l kipvs-parity=1 --wait=false > /dev/null 2>&1
  kubectl --kubeconfig "$KC" delete node test-node --ignore-not-found --wait=false > /dev/null
  # The apiserver's validation stands: an object it rejects (an invalid vector input, a second Service on one
  # ClusterIP) is left out and named in the report; fields the release does not know (trafficDistribution) are
  # pruned, as a cluster of that release does (--validate=false: no client-side schema check; 1.20 prunes
  # internalTrafficPolicy, EndpointSlice hints and ipMode too).
  kubectl --kubeconfig "$KC" apply --validate=false -f "$1/$2/objects.yaml" > "$3/apply.log" 2>&1 || true
  if [ -f "$1/$2/create-0.json" ]; then # a scale cluster: four kubectl at once
    for f in "$1/$2"/create-*.json; do
      { kubectl --kubeconfig "$KC" create -f "$f" 2>&1 | grep -v ' created$' >> "$3/apply.log"; } &
      creates+=($!)
    done
    wait "${creates[@]}" || true # (not the VM, the other background job)
  fi
  grep -E '^(Error|error)|is invalid' "$3/apply.log" | sed 's/^Error from server ([A-Za-z]*): error when [a-z]* "[^"]*": //' > "$3/rejected-objects" || true
  while read -r path body; do
    KUBECONFIG=$KC patch_status "$path" "$body" > /dev/null
  done < "$1/$2/status.txt"
}

kpvm_churn_service() {
  kubectl --kubeconfig "$KC" apply -f - > /dev/null <<EOF
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bench-churn", "namespace": "$1", "labels": {"kipvs-parity": "1"}},
 "spec": {"clusterIP": "${KPVM_CHURN_VS%:*}", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}
EOF
  KPVM_CHURN_NS=$1
  kpvm_churn_writes 1 1 "$KPVM_STATE/initial-write" > /dev/null
}

kpvm_churn_writes() { # RATE SECONDS OUT
  python3 tests/kube-proxy/churn.py write "$KPVM_MINOR" "$KPVM_SERVER" "$KPVM_TOKEN" "$KPVM_CHURN_NS" bench-churn "$KPVM_SEQ" "$1" "$2" "$3"
  KPVM_SEQ=$(( KPVM_SEQ + $(wc -l < "$3") ))
}

kpvm_churn() {
  local view=$1 rate=$2 secs=$3 late=$4 d=$5 sync=0 detect=kernel summary end t
  case $view in ipvs) ;; ipvs+sync) view=ipvs sync=1 detect=sync ;; *) sync=1 detect=sync ;; esac
  agent watch-start "$KPVM_CHURN_VS" bench-churn "$view" "$sync" > /dev/null || echo "the guest's poll of bench-churn did not start" >&2
  summary=$(kpvm_churn_writes "$rate" "$secs" "$d/writes-$rate") || summary="the writes failed"
  sleep 3 # on purpose: the window's end, the last writes' time to reach the kernel
  end=$(date +%s.%N); t=$(date +%s)
  guest_clock_offset # (the guest's clock against this machine's: hack/lib/guest-clock.sh)
  while [ $(( $(date +%s) - t )) -lt "$late" ]; do
    agent watch-peek > "$d/watch-$rate" || break
    python3 tests/kube-proxy/churn.py latency "$d/writes-$rate" "$d/watch-$rate" "$OFFSET" "$end" "$detect" |
      python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)["never"] > 0)' && break
    sleep 2
  done
  agent watch-stop > "$d/watch-$rate" || true
  python3 tests/kube-proxy/churn.py latency "$d/writes-$rate" "$d/watch-$rate" "$OFFSET" "$end" "$detect" > "$d/latency-$rate" ||
    echo '{}' > "$d/latency-$rate"
  echo "$summary; clock round trip $RTT s" > "$d/summary-$rate"
}

kpvm_detection_check() {
  local c=$2 d=$3/detection p want got rc=0
  mkdir -p "$d"
  kpvm_apply "$1" "$c" "$d"
  kpvm_churn_service default
  for p in kube-proxy kipvs; do
    [ -f "$3/$p.out" ] || { echo "detection check: no converged state of $p on $c to compare with"; rc=1; continue; }
    # C's virtual and real servers as `agent run` left them, and bench-churn's one with its two endpoints
    want="$(( $(grep -c '^ipvs -A' "$3/$p.out") + 1 )) $(( $(grep -c '^ipvs -a' "$3/$p.out") + 2 ))"
    if ! agent start "$p" "$c" 0 0 60 > "$d/$p.start"; then
      echo "detection check: $p did not converge on its sync metric:"; sed 's/^/    /' "$d/$p.start" | tail -n 20; rc=1; continue
    fi
    got=$(sed -n 's/^counts //p' "$d/$p.start")
    if [ "$got" = "$want" ]; then
      echo "detection check: $p's first completed sync (its sync metric) holds the table: $got virtual and real servers"
    else echo "detection check: $p's first completed sync holds $got virtual and real servers, not $want"; rc=1; fi
    kpvm_churn ipvs+sync 10 2 10 "$d"
    mv "$d/writes-10" "$d/$p.writes"; mv "$d/watch-10" "$d/$p.watch"
    got=$(python3 tests/kube-proxy/churn.py check-detection "$d/$p.writes" "$d/$p.watch" "$OFFSET") || rc=1
    echo "detection check: $p: $got"
    agent stop > "$d/$p.stop" || { echo "detection check: $p: stop failed"; rc=1; }
  done
  return "$rc"
}

kpvm_boot() {
  echo "starting the VM (hack/test-vm.sh --kube-proxy; console log in target/vm/console.log)"
  KIPVS_KUBE_PROXY_DIR=$G VMTIMEOUT=${VMTIMEOUT:-3600} VMNET="net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:$KPVM_AGENT_PORT-10.0.2.15:7000" \
    hack/test-vm.sh --kube-proxy > "$KPVM_STATE/vm.log" 2>&1 &
  vm_pid=$!
  local t
  t=$(date +%s)
  until [ "$(AGENT_TIMEOUT=5 agent ping 2>/dev/null)" = pong ]; do
    kill -0 "$vm_pid" 2>/dev/null || { tail -n 40 "$KPVM_STATE/vm.log"; echo "the VM exited before its agent answered"; return 1; }
    [ $(( $(date +%s) - t )) -lt 900 ] || { tail -n 40 "$KPVM_STATE/vm.log"; echo "no agent after 900 s"; return 1; }
    sleep 2
  done
  echo "guest agent up after $(( $(date +%s) - t )) s"
}

kpvm_finish() {
  local vrc=0
  agent finish "$1" > /dev/null || true
  wait "$vm_pid" || vrc=$?
  vm_pid=""
  grep -E '^(PASS|FAIL|SKIP) kube-proxy' "$KPVM_STATE/vm.log" || true
  [ "$vrc" = 0 ] || { tail -n 30 "$KPVM_STATE/vm.log"; return 1; }
}
