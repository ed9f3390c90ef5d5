#!/bin/sh
# The test node: PID 1 (hack/vm/init) runs this after loading the modules. It turns the VM into a Kubernetes
# node of the host's control plane (hack/test-node.sh): cgroup v2, the NIC on the host's tap (node.env: NODE_IP,
# HOST_IP, SANDBOX_IMAGE, KUBELET_ARGS), containerd with the images of /payload/images loaded offline, Debian's CNI bridge for pods, and a
# kubelet registered with the host's kube-apiserver. Then it serves the agent (agent.sh, busybox httpd CGI on
# NODE_IP:7000) and runs until the host stops the VM. Milestones go to the console as `NODE <what> uptime=<s>`.
# A node of several (hack/test-node.sh with NODES > 1) gets its identity on the kernel command line, since all
# boot the same initrd: kipvs.node=NAME,IP,POD_CIDR (its Node's name, its address, its pods' /24) and
# kipvs.routes=CIDR@IP,... (the other nodes' pod CIDRs, each routed to its node on the shared link). Its pods
# are then not masqueraded (the CNI bridge's ipMasq off): a pod's own address reaches the other nodes' pods.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
. /payload/node.env
POD_CIDR="" ROUTES=""
for a in $(cat /proc/cmdline); do
  case $a in
    kipvs.node=*) v=${a#kipvs.node=}; NODE_NAME=${v%%,*}; v=${v#*,}; NODE_IP=${v%%,*}; POD_CIDR=${v#*,} ;;
    kipvs.routes=*) ROUTES=$(echo "${a#kipvs.routes=}" | tr , ' ') ;;
  esac
done
L=/var/log/node
up() { cut -d' ' -f1 /proc/uptime; }
mark() { echo "NODE $* uptime=$(up)" | tee -a "$L/milestones.log"; }
ip() { /sbin/ip "$@"; } # iproute2, not busybox's applet
fail() { echo "NODE FAILED: $*"; for f in "$L"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 40 "$f"; }; done; exit 1; }

hostname "$NODE_NAME"
printf '127.0.0.1 localhost\n%s %s\n' "$NODE_IP" "$NODE_NAME" > /etc/hosts
printf 'nameserver %s\n' "$HOST_IP" > /etc/resolv.conf
echo "$NODE_NAME" | md5sum | cut -d' ' -f1 > /etc/machine-id
mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail "no cgroup2"
for c in cpuset cpu io memory pids hugetlb; do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control; done
for c in cpuset cpu memory pids; do # what the kubelet requires
  grep -qw "$c" /sys/fs/cgroup/cgroup.subtree_control || fail "cgroup controller $c missing"
done
# containerd's and the kubelet's state on a file system of their own (the root is the initramfs)
mkdir -p /var/lib /var/log /etc/cni/net.d /etc/containerd /etc/kubernetes
mount -t tmpfs -o mode=755 varlib /var/lib
mount -t tmpfs -o mode=755 varlog /var/log && mkdir -p "$L"
mount --make-rshared / 2>/dev/null # the kubelet's volume mounts propagate into containers
echo 1 > /proc/sys/net/ipv4/ip_forward
echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
ip link set eth0 up && ip addr add "$NODE_IP/24" dev eth0 && ip route add default via "$HOST_IP" ||
  fail "no NIC (eth0)"
for r in $ROUTES; do ip route add "${r%@*}" via "${r#*@}" || fail "no route $r"; done
mark network
sed "s#@SANDBOX_IMAGE@#$SANDBOX_IMAGE#" /payload/node/containerd.toml > /etc/containerd/config.toml
if [ -n "$POD_CIDR" ]; then # this node's pod CIDR (gateway .1), unmasqueraded
  sed -e "s#10.244.0.0/24#$POD_CIDR#" -e "s#10.244.0.1#${POD_CIDR%.*/*}.1#" -e 's#"ipMasq": true#"ipMasq": false#' \
    /payload/node/cni.conflist > /etc/cni/net.d/10-kipvs-node.conflist
else
  cp /payload/node/cni.conflist /etc/cni/net.d/10-kipvs-node.conflist
fi
cp /payload/node/kubelet.yaml /etc/kubernetes/kubelet.yaml
printf 'clusterDNS: [%s]\nclusterDomain: cluster.local\n' "$HOST_IP" >> /etc/kubernetes/kubelet.yaml # the host's dnsmasq
cp /payload/node/kubeconfig /etc/kubernetes/kubelet.kubeconfig

containerd --config /etc/containerd/config.toml > "$L/containerd.log" 2>&1 &
i=0; until ctr version > /dev/null 2>&1; do i=$((i + 1)); [ $i -lt 300 ] || fail "containerd does not answer"; sleep 0.2; done
mark containerd
# each line: FILE REF [REF...]; the archive's image is imported as REF's repository with the archive's tag,
# then tagged with each REF
while read -r file refs; do
  first=${refs%% *}
  got=$(ctr -n k8s.io images import --base-name "${first%:*}" "/payload/images/$file" |
    sed -n 's/^unpacking \([^ ]*\) .*/\1/p' | head -n1)
  [ -n "$got" ] || fail "import $file"
  for r in $refs; do [ "$r" = "$got" ] || ctr -n k8s.io images tag --force "$got" "$r" > /dev/null || fail "tag $r"; done
  case " $refs " in *" $got "*) ;; *) ctr -n k8s.io images rm "$got" > /dev/null ;; esac
  for r in $refs; do ctr -n k8s.io images ls -q | grep -qxF "$r" || fail "import $file: $r not listed"; done
done < /payload/images/list
mark images "$(ctr -n k8s.io images ls -q | grep -v sha256 | tr '\n' ' ')"

# KUBELET_ARGS: the flags this kubelet's release takes (node.env, from hack/test-node.sh)
# shellcheck disable=SC2086
kubelet --config=/etc/kubernetes/kubelet.yaml --kubeconfig=/etc/kubernetes/kubelet.kubeconfig \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" $KUBELET_ARGS \
  --v="${KUBELET_V:-1}" > "$L/kubelet.log" 2>&1 &
echo $! > /run/kubelet.pid
mark kubelet
httpd -p "$NODE_IP:7000" -h /payload/www
mark agent
while :; do
  sleep 5
  kill -0 "$(cat /run/kubelet.pid)" 2>/dev/null || fail "the kubelet exited"
done
