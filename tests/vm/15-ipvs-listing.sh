#!/bin/sh
# The proxier reads every real server from one read of /proc/net/ip_vs (ipvs-rs procfs) and the virtual
# servers from the netlink service dump. On a table with both families, SCTP, a firewall-mark service,
# weights 0 and live connections, in a network namespace of its own, what `kipvs-proxier inspect`
# reports through that path (weights, active and inactive connections) must equal what ipvsadm reads
# over netlink, and the proxier must have read no virtual server's real servers over netlink.
# The virtual IP on lo is also its own real server, reached through IPVS from the namespace; it carries
# the connections: one held open (active), one closed (inactive, FIN_WAIT for 2 minutes).
. /payload/tests/lib.sh
N=ipvs-listing
VIP=198.51.100.77
in_ns() { nsenter --net=/run/netns/$N "$@"; }
ip netns add $N
printf 'link set lo up\naddress add %s/32 dev lo\naddress add 2001:db8::77/128 dev lo nodad\n' $VIP |
  ip -n $N -batch -
check "ipvsadm -R programmed the table" in_ns ipvsadm -R <<EOF
-A -t $VIP:8080 -s rr
-a -t $VIP:8080 -r $VIP:8080 -m -w 1
-a -t $VIP:8080 -r 192.0.2.9:8080 -m -w 0
-A -t [2001:db8::77]:8080 -s wrr
-a -t [2001:db8::77]:8080 -r [2001:db8::5]:8080 -m -w 2
-a -t [2001:db8::77]:8080 -r [2001:db8::9]:8080 -m -w 0
-A -u [2001:db8::77]:53 -s rr -p 600
-a -u [2001:db8::77]:53 -r [2001:db8::6]:53 -m -w 5
-a -u [2001:db8::77]:53 -r [2001:db8::7]:53 -m -w 0
-A --sctp-service 192.0.2.77:3868 -s rr
-A -f 119 -s wrr
-a -f 119 -r 192.0.2.8:0 -g -w 3
EOF

mkdir -p "$W/listing-www"; echo listing > "$W/listing-www/index.html"
in_ns httpd -p $VIP:8080 -h "$W/listing-www"
rm -f "$W/listing.fifo"; mkfifo "$W/listing.fifo"
in_ns nc -w 60 $VIP 8080 < "$W/listing.fifo" > /dev/null 2>&1 &
held=$!
exec 3> "$W/listing.fifo"
a=$(printf 'GET / HTTP/1.0\r\n\r\n' | in_ns nc -w 3 $VIP 8080 2>/dev/null | tail -n1)
[ "$a" = listing ] && ok "a request through IPVS to the virtual IP's own real server was answered" ||
  bad "no answer through IPVS from $VIP:8080 (got '$a')"
counted() { in_ns ipvsadm -Ln -t $VIP:8080 | grep -qE "^  -> $VIP:8080 +[A-Za-z]+ +1 +1 +[1-9]"; }
wait_for 10 "an active and an inactive connection on $VIP:8080" counted 2>/dev/null
check "IPVS counts the held connection as active and the closed one as inactive" counted

# netlink (ipvsadm) and the proxier's observation, as "VS" and "VS -> RS weight active inactive" lines
in_ns ipvsadm -Ln > "$W/listing.ipvsadm"
awk '/^(TCP|UDP|SCTP) / { vs = $1 " " $2; print vs; next }
     /^FWM / { vs = ""; next }
     /^  -> / && vs != "" && $2 != "RemoteAddress:Port" { print vs " -> " $2 " " $4 " " $5 " " $6 }' \
  "$W/listing.ipvsadm" | sort > "$W/listing.netlink"
mkdir -p "$W/listing-empty"
NO_COLOR=1 RUST_LOG=warn,kipvs_proxier::dataplane::kernel=debug in_ns "$KIPVS" inspect --node "$NODE" \
  --manifests "$W/listing-empty" > "$W/listing.inspect" 2> "$W/listing.log" ||
  bad "kipvs-proxier inspect failed: $(tail -n 3 "$W/listing.log")"
awk '/^  (TCP|UDP|SCTP) / { vs = $1 " " $2; print vs; next }
     /^    -> / { print vs " -> " $2 " " $6 " " $8 " " $10 }' "$W/listing.inspect" | sort > "$W/listing.proxier"
if cmp -s "$W/listing.netlink" "$W/listing.proxier"; then
  ok "the proxier's observation equals ipvsadm's netlink reading ($(grep -c ' -> ' "$W/listing.proxier") real servers)"
else
  bad "the proxier's observation differs from ipvsadm's netlink reading"
  diff -u "$W/listing.netlink" "$W/listing.proxier" | indent
fi
check "both families, weights 0 and connections are compared" sh -c \
  "grep -q '^TCP \[2001:db8::77\]:8080 -> .* 0 0 0\$' '$W/listing.proxier' &&
   grep -q '^TCP $VIP:8080 -> $VIP:8080 1 1 [1-9]' '$W/listing.proxier' && grep -q '^SCTP 192.0.2.77:3868\$' '$W/listing.proxier'"
check "the real servers of all 4 virtual servers came from the listing, none over netlink" \
  grep -q 'observed the kernel.* virtual_servers=4 from_listing=4 destination_requests=0' "$W/listing.log"
say "/proc/net/ip_vs:"; in_ns cat /proc/net/ip_vs | indent

exec 3>&-
kill "$held" 2>/dev/null
for p in $(ip netns pids $N); do kill "$p"; done
ip netns del $N
finish
