# The example cluster's pods and a client, as network namespaces of the VM (sourced by run.sh).
# Mirrors tests/manifests/cluster: every endpoint address there is a netns here, answering with its pod
# name. Each pod gets a veth pair routed calico-style: the pod has IP/32 and a default route via
# 10.244.0.1 (on every host-side veth), the root netns has a /32 route per pod. No bridge needed.
# The client netns 192.168.100.2 reaches the node at 192.168.100.1 (the Node's InternalIP, where
# NodePorts live) and routes everything else through the node too, like an outside client would.
PODS="coredns-76f75df574-4kd8w=10.244.1.5=dns coredns-76f75df574-9xq7z=10.244.2.6=dns
  web-0=10.244.1.2=http web-1=10.244.2.3=http web-2=10.244.3.4=http
  shop-5c9d7f8b4-kq2vw=10.244.1.7=http shop-5c9d7f8b4-t8mxn=10.244.3.8=http"

pod_up() { # NAME IP KIND IDX
  ip netns add "$1"
  ip link add "vpod$4" type veth peer name eth0 netns "$1"
  ip addr add 10.244.0.1/32 dev "vpod$4"; ip link set "vpod$4" up; ip route add "$2/32" dev "vpod$4"
  ip -n "$1" link set lo up; ip -n "$1" addr add "$2/32" dev eth0; ip -n "$1" link set eth0 up
  ip -n "$1" route add 10.244.0.1 dev eth0; ip -n "$1" route add default via 10.244.0.1 dev eth0
  mkdir -p "/tmp/www/$1"; echo "$1" > "/tmp/www/$1/index.html"
  case $3 in
    http) ip netns exec "$1" httpd -p 8080 -h "/tmp/www/$1" ;;
    dns) # CoreDNS stand-in: TCP 53 and metrics 9153 over HTTP, UDP 53 answers each datagram
      ip netns exec "$1" httpd -p 53 -h "/tmp/www/$1"
      ip netns exec "$1" httpd -p 9153 -h "/tmp/www/$1"
      # netcat-traditional serves one peer per run: restart it for the next query
      ip netns exec "$1" sh -c "while :; do nc.traditional -u -l -p 53 -c 'echo $1'; done" \
        </dev/null >/dev/null 2>&1 &
      ;;
  esac
}

topology_up() {
  i=0
  for p in $PODS; do
    i=$((i + 1))
    pod_up "$(echo "$p" | cut -d= -f1)" "$(echo "$p" | cut -d= -f2)" "$(echo "$p" | cut -d= -f3)" $i
  done
  ip netns add client
  ip link add vclient type veth peer name eth0 netns client
  ip addr add "$NODE_IP/24" dev vclient; ip link set vclient up
  ip -n client link set lo up; ip -n client addr add 192.168.100.2/24 dev eth0
  ip -n client link set eth0 up; ip -n client route add default via "$NODE_IP"
}

# every backend answers directly from the root netns (needs no forwarding, no IPVS)
topology_check() {
  rc=0
  for p in $PODS; do
    name=$(echo "$p" | cut -d= -f1); addr=$(echo "$p" | cut -d= -f2); port=8080
    [ "$(echo "$p" | cut -d= -f3)" = dns ] && port=53
    a=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$addr" "$port" 2>/dev/null | tail -n1)
    [ "$a" = "$name" ] || { echo "  backend $name ($addr:$port) answered '$a'"; rc=1; }
  done
  return $rc
}
