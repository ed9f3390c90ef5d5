#!/bin/sh
# Conntrack sizing and timeouts from a KubeProxyConfiguration's conntrack section (issue 34 item 1), as kube-proxy
# 1.20 sets them (cmd/kube-proxy/app/conntrack.go): nf_conntrack_max = maxPerCore x CPUs, at least min; the hash
# size max/4 where the kernel's is lower; tcpEstablishedTimeout and tcpCloseWaitTimeout; each write logged
# ("conntrack: set for FIELD").
#  1. a fresh start (the kernel cleared by `kipvs-proxier cleanup`, the sysctls at the kernel's defaults): set
#     and logged, the table programmed;
#  2. a restart on the kernel the first run programmed (its table, kube-ipvs0 and inet kipvs in place), with the
#     section changed (a new ConfigMap, the pod restarted): set to the new values and logged again, the table
#     adopted;
#  3. a NodeProxyConfig revision with a conntrack section of its own, put in force live: set and logged;
#  4. a restart with that revision in force and the sysctls back at the kernel's defaults (the revision is
#     admitted at the switch to kipvs, before the first sync): set and logged again.
. /payload/tests/lib.sh
CT=/proc/sys/net/netfilter
HS=/sys/module/nf_conntrack/parameters/hashsize
cpus=$(grep -c '^processor' /proc/cpuinfo)
[ -w "$CT/nf_conntrack_max" ] || skip "no $CT/nf_conntrack_max (nf_conntrack not loaded)"
orig="$(cat "$CT/nf_conntrack_max") $(cat "$CT/nf_conntrack_tcp_timeout_established") $(cat "$CT/nf_conntrack_tcp_timeout_close_wait") $(cat "$HS")"
say "kernel before: nf_conntrack_max, established, close_wait, hashsize = $orig; $cpus CPU(s)"
kernel_defaults() { # the values a node has before any service proxy set them (6.1 and 5.10, 1 GiB)
  echo 65536 > "$CT/nf_conntrack_max"; echo 432000 > "$CT/nf_conntrack_tcp_timeout_established"
  echo 60 > "$CT/nf_conntrack_tcp_timeout_close_wait"; echo 16384 > "$HS"
}
config() { # FILE MAXPERCORE MIN ESTABLISHED CLOSE_WAIT: a KubeProxyConfiguration as kubeadm's ConfigMap has it
  cat > "$1" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
conntrack:
  maxPerCore: $2
  min: $3
  tcpEstablishedTimeout: $4
  tcpCloseWaitTimeout: $5
EOF
}
SINCE=0 # the proxier log's lines before the step
set_logged() { tail -n +$((SINCE + 1)) "$(proxier_log)" | grep -q "conntrack: set for $1"; } # FIELD
expect() { # WHAT MAX ESTABLISHED_S CLOSE_WAIT_S: the sysctls, and the log of the step
  for f in maxPerCore tcpEstablishedTimeout tcpCloseWaitTimeout; do
    wait_for 30 "conntrack.$f logged" set_logged "conntrack.$f" 2>/dev/null
    check "$1: 'conntrack: set for conntrack.$f' logged" set_logged "conntrack.$f"
  done
  got=$(cat "$CT/nf_conntrack_max")
  check "$1: nf_conntrack_max = $2 (got $got)" [ "$got" = "$2" ]
  got=$(cat "$HS")
  check "$1: hashsize >= max/4 = $(( $2 / 4 )) (got $got)" [ "$got" -ge $(( $2 / 4 )) ]
  got=$(cat "$CT/nf_conntrack_tcp_timeout_established")
  check "$1: nf_conntrack_tcp_timeout_established = $3 (got $got)" [ "$got" = "$3" ]
  got=$(cat "$CT/nf_conntrack_tcp_timeout_close_wait")
  check "$1: nf_conntrack_tcp_timeout_close_wait = $4 (got $got)" [ "$got" = "$4" ]
}
max_of() { m=$(( $1 * cpus )); [ "$m" -ge "$2" ] && echo "$m" || echo "$2"; } # MAXPERCORE MIN

say "1. fresh start: kernel cleared, conntrack at the kernel's defaults"
proxier_stop
"$KIPVS" cleanup > "$W/conntrack-cleanup.log" 2>&1 || bad "cleanup exited with $?: $(tail -n 3 "$W/conntrack-cleanup.log")"
kernel_defaults
config "$W/conntrack-1.yaml" 40000 300000 2h 30m
KIPVS_CONFIG=$W/conntrack-1.yaml proxier_start
check "fresh start: ipvsadm -Sn equals the plan" wait_converged 30
expect "fresh start" "$(max_of 40000 300000)" 7200 1800

say "2. restart on the kernel the first run programmed, the section changed"
proxier_stop
check "the table outlives the first run" sh -c "ipvsadm -Sn | grep -q -- '-A -t 10.96.0.20:80'"
config "$W/conntrack-2.yaml" 250000 100000 3h 45m
KIPVS_CONFIG=$W/conntrack-2.yaml proxier_start
check "restart: ipvsadm -Sn equals the plan" wait_converged 30
expect "restart" "$(max_of 250000 100000)" 10800 2700

say "3. a NodeProxyConfig revision with a conntrack section, put in force live"
SINCE=$(mark)
cat > "$W/npc.tmp" <<NPC
apiVersion: kipvs.io/v1alpha1
kind: NodeProxyConfig
metadata: {name: test-node}
spec:
  revision: r-conntrack
  assignedAt: "2026-11-22T05:00:00Z"
  config:
    conntrack: {maxPerCore: 120000, min: 0, tcpEstablishedTimeout: 5h, tcpCloseWaitTimeout: 10m}
NPC
mv "$W/npc.tmp" "$M/nodeproxyconfig.yaml"
applied r-conntrack || true
expect "revision live" "$(max_of 120000 0)" 18000 600

say "4. a restart with the revision in force, the sysctls at the kernel's defaults"
proxier_stop
kernel_defaults
SINCE=0
KIPVS_CONFIG=$W/conntrack-2.yaml proxier_start
check "restart on the revision: ipvsadm -Sn equals the plan" wait_converged 30
expect "restart on the revision" "$(max_of 120000 0)" 18000 600

say "back to the local configuration, the kernel's values as before"
proxier_stop
rm -f "$M/nodeproxyconfig.yaml"
set -- $orig
echo "$1" > "$CT/nf_conntrack_max"; echo "$2" > "$CT/nf_conntrack_tcp_timeout_established"
echo "$3" > "$CT/nf_conntrack_tcp_timeout_close_wait"; echo "$4" > "$HS"
proxier_start
check "ipvsadm -Sn equals the plan" wait_converged 30
finish
