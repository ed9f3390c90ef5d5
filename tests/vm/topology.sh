# The example cluster's pods and a client, as network namespaces of the VM (sourced by run.sh).
# Mirrors tests/manifests/cluster: every endpoint address there is a netns here, answering with its pod
# name. Each pod gets a veth pair routed calico-style: the pod has IP/32 and a default route via
# 10.244.0.1 (on every host-side veth), the root netns has a /32 route per pod. No bridge needed.
# The client netns 192.168.100.2 reaches the node at 192.168.100.1 (the Node's InternalIP, where
# NodePorts live) and routes everything else through the node too, like an outside client would.
# Dual stack: every pod also has fd00:10:244:X::Y (ip6_of 10.244.X.Y) behind fd00:10:244::1 on each host-side
# veth; the client is fd00:192:168:100::2, the node fd00:192:168:100::1 (its IPv6 InternalIP). IPv6
# addresses are added nodad (no duplicate detection delay) and the node forwards IPv6, as a dual-stack CNI
# sets it (kube-proxy and kipvs set only net.ipv4.ip_forward). Every http pod serves /cgi-bin/peer: the
# client address it sees.
PODS="coredns-76f75df574-4kd8w=10.244.1.5=dns coredns-76f75df574-9xq7z=10.244.2.6=dns
  web-0=10.244.1.2=http web-1=10.244.2.3=http web-2=10.244.3.4=http
  shop-5c9d7f8b4-kq2vw=10.244.1.7=http shop-5c9d7f8b4-t8mxn=10.244.3.8=http"

# Every exec of the dynamic `ip` costs ~0.1 s under emulation, so the plumbing goes through
# `ip -batch` (one for the root netns, one per pod) and commands enter a netns with busybox's nsenter.
field() { # ENTRY N: the Nth =-separated field of a PODS entry
  echo "$1" | cut -d= -f"$2"
}
NODE_IP6=fd00:192:168:100::1 CLIENT_IP6=fd00:192:168:100::2
ip6_of() { # POD_IPV4: the pod's IPv6 address (10.244.X.Y -> fd00:10:244:X::Y), without an exec
  a=${1#10.244.}; echo "fd00:10:244:${a%.*}::${a#*.}"
}
topology_up() {
  i=0
  { # root netns: one namespace, veth pair and /32 route per pod; the client's veth holds the node IP
    for p in $PODS; do
      i=$((i + 1)); n=$(field "$p" 1)
      echo "netns add $n"; echo "link add vpod$i type veth peer name eth0 netns $n"
      echo "addr add 10.244.0.1/32 dev vpod$i"; echo "link set vpod$i up"; echo "route add $(field "$p" 2)/32 dev vpod$i"
    done
    echo "netns add client"; echo "link add vclient type veth peer name eth0 netns client"
    echo "addr add $NODE_IP/24 dev vclient"; echo "link set vclient up"
  } > "$W/topo.root"
  /sbin/ip -batch "$W/topo.root"
  # IPv6 in batches of its own, after IPv4's (ip -batch stops at its first error)
  i=0
  for p in $PODS; do
    i=$((i + 1)); echo "addr add fd00:10:244::1/128 dev vpod$i nodad"; echo "route add $(ip6_of "$(field "$p" 2)")/128 dev vpod$i"
  done > "$W/topo.root6"
  echo "addr add $NODE_IP6/64 dev vclient nodad" >> "$W/topo.root6"
  echo 1 > /proc/sys/net/ipv6/conf/all/forwarding
  /sbin/ip -batch "$W/topo.root6"
  for p in $PODS; do
    n=$(field "$p" 1); ns="nsenter --net=/run/netns/$n"
    printf 'link set lo up\naddr add %s/32 dev eth0\nlink set eth0 up\nroute add 10.244.0.1 dev eth0\nroute add default via 10.244.0.1 dev eth0\naddr add %s/128 dev eth0 nodad\nroute add fd00:10:244::1 dev eth0\nroute add default via fd00:10:244::1 dev eth0\n' \
      "$(field "$p" 2)" "$(ip6_of "$(field "$p" 2)")" | /sbin/ip -n "$n" -batch -
    mkdir -p "/tmp/www/$n/cgi-bin"; echo "$n" > "/tmp/www/$n/index.html"
    printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\necho "$REMOTE_ADDR"\n' > "/tmp/www/$n/cgi-bin/peer"
    chmod +x "/tmp/www/$n/cgi-bin/peer"
    case $(field "$p" 3) in
      http) $ns httpd -p 8080 -h "/tmp/www/$n" ;;
      dns) # CoreDNS stand-in: TCP 53 and metrics 9153 over HTTP, UDP 53 answers each datagram
        $ns httpd -p 53 -h "/tmp/www/$n"; $ns httpd -p 9153 -h "/tmp/www/$n"
        # netcat-traditional serves one peer per run: restart it for the next query
        $ns sh -c "while :; do nc.traditional -u -l -p 53 -c 'echo $n'; done" </dev/null >/dev/null 2>&1 &
        ;;
    esac
  done
  printf 'link set lo up\naddr add 192.168.100.2/24 dev eth0\nlink set eth0 up\nroute add default via %s\naddr add %s/64 dev eth0 nodad\nroute add default via %s\n' \
    "$NODE_IP" "$CLIENT_IP6" "$NODE_IP6" | /sbin/ip -n client -batch -
}

# every backend answers directly from the root netns (needs no forwarding, no IPVS), on both families
topology_check() {
  rc=0
  for p in $PODS; do
    name=$(field "$p" 1); port=8080
    [ "$(field "$p" 3)" = dns ] && port=53
    for addr in "$(field "$p" 2)" "$(ip6_of "$(field "$p" 2)")"; do
      a=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$addr" "$port" 2>/dev/null | tail -n1)
      [ "$a" = "$name" ] || { echo "  backend $name ($addr:$port) answered '$a'"; rc=1; }
    done
  done
  return $rc
}
