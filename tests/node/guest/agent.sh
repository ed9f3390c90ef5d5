#!/bin/sh
# The test node's agent (tests/node/guest/run.sh serves it as busybox httpd CGI on NODE_IP:7000; hack/test-node.sh
# calls `node_agent CMD ARG...`). The node as a user's shell on it would see it:
#   ipvs                 the kernel's IPVS table (ipvsadm -Sn, sorted)
#   addrs                the addresses on kube-ipvs0
#   get URL [SECONDS]    an HTTP GET from the node's own network namespace: the body
#   status URL           the HTTP status code of a GET from the node (000 when none came)
#   log NAME [N]         the last N (100) lines of /var/log/node/NAME.log (kubelet, containerd, milestones: what
#                        run.sh did when, in seconds of the guest's uptime)
#   free                 memory (free -m) and the load average
#   trace URL            the node's network state while a GET of URL from the node is pending: the route to the
#                        destination, IPVS's connections, the conntrack entries, the sysctls that decide node-local
#                        service traffic, a packet capture on every interface, then the answer
#   sh CMD...            CMD run by sh on the node (debugging a kept cluster: hack/test-node.sh with KEEP=1)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# http URL SECONDS: an HTTP/1.0 GET of http://IP[:PORT]/PATH through netcat-traditional, the answer as it comes
# (busybox's static wget dies of a segmentation fault on this node, whatever the URL)
http() {
  u=${1#http://}; hp=${u%%/*}; p=/${u#*/}; [ "$u" != "$hp" ] || p=/
  h=${hp%:*}; port=${hp##*:}; [ "$port" != "$hp" ] || port=80
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$p" "$hp" | nc.traditional -w "$2" "$h" "$port"
}
cmd=$1; shift
case $cmd in
  ipvs) ipvsadm -Sn | sort ;;
  addrs) /sbin/ip -o addr show dev kube-ipvs0 2>/dev/null | awk '{print $4}' | sort ;;
  get) http "$1" "${2:-5}" | sed '1,/^\r*$/d' ;;
  status) c=$(http "$1" 5 | head -n1 | cut -d' ' -f2); echo "${c:-000}" ;;
  log) tail -n "${2:-100}" "/var/log/node/$1.log" ;;
  free) free -m; cat /proc/loadavg ;;
  trace)
    u=${1#http://}; h=${u%%/*}; h=${h%:*}
    tcpdump -Z root -nli any -c 40 -w /tmp/trace.pcap 'tcp and not port 7000 and not port 10250 and not port 16443' 2>/dev/null &
    d=$!; sleep 1
    http "$1" 5 > /tmp/trace.out 2>&1 &
    p=$!; sleep 2
    echo "--- ip route get $h"; ip route get "$h"
    echo "--- ipvsadm -Lnc"; ipvsadm -Lnc
    echo "--- conntrack -L (tcp)"; conntrack -L -p tcp 2>/dev/null | grep -v -e 'dport=7000 ' -e 'dport=16443 ' -e 'dport=10250 '
    echo "--- sysctls"
    for s in net/ipv4/vs/conntrack net/bridge/bridge-nf-call-iptables net/ipv4/ip_forward net/ipv4/conf/all/rp_filter \
      net/ipv4/conf/cni0/rp_filter net/ipv4/conf/all/route_localnet net/ipv4/vs/conn_reuse_mode; do
      echo "$s = $(cat /proc/sys/$s 2>/dev/null)"; done
    wait $p; sleep 1; kill $d 2>/dev/null; wait $d
    echo "--- tcpdump"; tcpdump -nr /tmp/trace.pcap 2>/dev/null
    echo "--- answer"; sed '1,/^\r*$/d' /tmp/trace.out ;;
  sh) sh -c "$*" ;;
  *) echo "unknown command $cmd"; exit 2 ;;
esac
