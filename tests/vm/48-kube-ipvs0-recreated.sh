#!/bin/sh
# kube-ipvs0 deleted while the proxier runs (an administrator's `ip link del`, a kube-proxy cleanup): the proxier
# hears of it through rtnetlink notifications, makes the link again (a new index) and binds every address of
# the plan again in a full sync, without a restart:
#  1. control: kube-ipvs0 holds the plan's addresses;
#  2. deleted: within 20 s kube-ipvs0 is back with the plan's addresses (with the index resolved once at start,
#     every bind would fail with ENODEV until a restart), the table equals the plan, the web ClusterIP answers
#     again, and the proxier is the same process.
. /payload/tests/lib.sh
proxier_ensure
check "converged before" wait_converged 30
bound() { [ -e /sys/class/net/kube-ipvs0 ] && [ "$(kernel_bind)" = "$(plan_bind 2>/dev/null)" ]; }
check "control: kube-ipvs0 holds the plan's addresses" bound
pid=$(proxier_pid)
old=$(cat /sys/class/net/kube-ipvs0/ifindex)
ip link del kube-ipvs0
t0=$(now)
check "kube-ipvs0 is back with the plan's addresses within 20 s" wait_for 20 "kube-ipvs0's addresses" bound
say "kube-ipvs0 back (index $old -> $(cat /sys/class/net/kube-ipvs0/ifindex 2>/dev/null)) with its addresses after $(awk "BEGIN{print $(now) - $t0}") s"
check "ipvsadm -Sn equals the plan" wait_converged 30
a=$(many 6 http_get 10.96.0.20 80)
say "answers from 10.96.0.20:80: $(echo "$a" | tr '\n' ' ')"
check "the web ClusterIP answers again (6 of 6 by web-*)" [ "$(echo "$a" | grep -c '^web-')" = 6 ]
check "the same proxier process" alive "$pid"
finish
