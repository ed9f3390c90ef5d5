# The example cluster's pods and a client, as network namespaces of the VM (sourced by run.sh).
# Mirrors tests/manifests/cluster: every endpoint address there is a netns here, answering with its pod
# name. Each pod gets a veth pair routed calico-style: the pod has IP/32 and a default route via
# 10.244.0.1 (on every host-side veth), the root netns has a /32 route per pod. No bridge needed.
# The client netns 192.168.100.2 reaches the node at 192.168.100.1 (the Node's InternalIP, where
# NodePorts live) and routes everything else through the node too, like an outside client would.
PODS="coredns-76f75df574-4kd8w=10.244.1.5=dns coredns-76f75df574-9xq7z=10.244.2.6=dns
  web-0=10.244.1.2=http web-1=10.244.2.3=http web-2=10.244.3.4=http
  shop-5c9d7f8b4-kq2vw=10.244.1.7=http shop-5c9d7f8b4-t8mxn=10.244.3.8=http"

# Every exec of the dynamic `ip` costs ~0.1 s under emulation, so the plumbing goes through
# `ip -batch` (one for the root netns, one per pod) and commands enter a netns with busybox's nsenter.
field() { # ENTRY N: the Nth =-separated field of a PODS entry
  echo "$1" | cut -d= -f"$2"
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
  for p in $PODS; do
    n=$(field "$p" 1); ns="nsenter --net=/run/netns/$n"
    printf 'link set lo up\naddr add %s/32 dev eth0\nlink set eth0 up\nroute add 10.244.0.1 dev eth0\nroute add default via 10.244.0.1 dev eth0\n' \
      "$(field "$p" 2)" | /sbin/ip -n "$n" -batch -
    mkdir -p "/tmp/www/$n"; echo "$n" > "/tmp/www/$n/index.html"
    case $(field "$p" 3) in
      http) $ns httpd -p 8080 -h "/tmp/www/$n" ;;
      dns) # CoreDNS stand-in: TCP 53 and metrics 9153 over HTTP, UDP 53 answers each datagram
        $ns httpd -p 53 -h "/tmp/www/$n"; $ns httpd -p 9153 -h "/tmp/www/$n"
        # netcat-traditional serves one peer per run: restart it for the next query
        $ns sh -c "while :; do nc.traditional -u -l -p 53 -c 'echo $n'; done" </dev/null >/dev/null 2>&1 &
        ;;
    esac
  done
  printf 'link set lo up\naddr add 192.168.100.2/24 dev eth0\nlink set eth0 up\nroute add default via %s\n' \
    "$NODE_IP" | /sbin/ip -n client -batch -
}

# every backend answers directly from the root netns (needs no forwarding, no IPVS)
topology_check() {
  rc=0
  for p in $PODS; do
    name=$(field "$p" 1); addr=$(field "$p" 2); port=8080
    [ "$(field "$p" 3)" = dns ] && port=53
    a=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$addr" "$port" 2>/dev/null | tail -n1)
    [ "$a" = "$name" ] || { echo "  backend $name ($addr:$port) answered '$a'"; rc=1; }
  done
  return $rc
}
