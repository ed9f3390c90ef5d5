# The test VM's clock against this machine's, for latencies measured across the two (sourced, bash):
#
#   guest_clock_offset   sets OFFSET (the guest's `agent clock`, seconds since its boot, minus this
#                        machine's `date +%s.%N`, 4 decimals) and RTT (s) from the fastest of 10 round trips
#                        to the caller's `agent clock`; the guest's clock is read at the round trip's middle.
# A guest time G is then this machine's G - OFFSET, to within RTT / 2 and the guest clock's 10 ms steps.
guest_clock_offset() {
  local t1 t2 g r
  RTT=""
  for _ in $(seq 10); do
    t1=$(date +%s.%N); g=$(agent clock); t2=$(date +%s.%N)
    r=$(awk "BEGIN{print $t2 - $t1}")
    if [ -z "$RTT" ] || awk "BEGIN{exit !($r < $RTT)}"; then RTT=$r; OFFSET=$(awk "BEGIN{printf \"%.4f\", $g - ($t1 + $t2) / 2}"); fi
  done
}
