#!/bin/sh
# (a) `kipvs-proxier run` programs exactly the planned table: `ipvsadm -Sn` equals `kipvs-proxier plan`
# for the example cluster, kube-ipvs0 holds exactly the planned bind addresses, and the plan is the
# table the brief's semantics give for this cluster (tests/vm/expected/, so that a plan and a kernel
# that agree on something wrong, or on nothing, cannot pass).
. /payload/tests/lib.sh
[ -x "$KIPVS" ] || { bad "no $KIPVS"; finish; }
proxier_ensure
check "ipvsadm -Sn equals kipvs-proxier plan" wait_converged 30
say "ipvsadm -Sn:"; ipvsadm -Sn | indent
sort "$T/expected/cluster.ipvsadm" > "$W/expected.sorted"
if plan | sort | cmp -s - "$W/expected.sorted"; then ok "plan is the expected table for the example cluster"
else bad "plan differs from tests/vm/expected/cluster.ipvsadm"; plan | sort | diff -u "$W/expected.sorted" - | indent; fi

plan_bind > "$W/bind.plan"; kernel_bind > "$W/bind.kernel"
check "plan --format json lists bind addresses" [ -s "$W/bind.plan" ]
say "kube-ipvs0: $(tr '\n' ' ' < "$W/bind.kernel")"
check "kube-ipvs0 holds exactly the planned bind addresses" cmp -s "$W/bind.plan" "$W/bind.kernel"
cmp -s "$W/bind.plan" "$W/bind.kernel" || diff -u "$W/bind.plan" "$W/bind.kernel" | indent
check "planned bind addresses are the expected ones" cmp -s "$W/bind.plan" "$T/expected/cluster.bind"
check "kube-ipvs0 is a dummy link" sh -c "/sbin/ip -d link show kube-ipvs0 | grep -q dummy"
# the proxier sets these itself (NAT from the root netns and forwarding for outside clients need them)
for s in net.ipv4.ip_forward net.ipv4.vs.conntrack; do
  check "sysctl $s = 1" [ "$(sysctl -n $s)" = 1 ]
done
finish
