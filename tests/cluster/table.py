#!/usr/bin/env python3
"""The fake dataplane's table, replayed from a `kipvs-proxier run --dataplane fake` log.

The proxier logs every kernel operation it applies (`op=AddRealServer vs="TCP 10.96.0.60:80"
rs=10.244.1.10:8080 weight=1`, ...; at debug level: the suite runs it with
`RUST_LOG=info,kipvs_proxier::ops=debug`) and every failed one (`failed op=...`); replaying the
applied ones in order gives what its dataplane holds.

usage: table.py LOG [VS]   prints "VS -> RS weight" lines, sorted; with VS ("TCP 10.96.0.60:80"),
                           only that virtual server's real servers as "RS=WEIGHT ..." on one line
"""
import re
import signal
import sys

# A reader that stops early (`grep -q`) is not an error.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

OP = re.compile(r'(?<!failed )op=(\w+)(?: vs="([^"]+)")?(?: scheduler=\S+)?(?: persistence=\S+)?'
                r'(?: rs=(\S+))?(?: weight=(\d+))?')
table = {}
for line in open(sys.argv[1], errors="replace"):
    m = OP.search(line)
    if not m or "failed op=" in line:
        continue
    op, vs, rs, weight = m.groups()
    if op == "AddVirtualServer":
        table.setdefault(vs, {})
    elif op == "DeleteVirtualServer":
        table.pop(vs, None)
    elif op in ("AddRealServer", "UpdateRealServer"):
        table.setdefault(vs, {})[rs] = weight
    elif op == "DeleteRealServer":
        table.get(vs, {}).pop(rs, None)
if len(sys.argv) > 2:
    print(" ".join(f"{rs}={w}" for rs, w in sorted(table.get(sys.argv[2], {}).items())))
else:
    for vs in sorted(table):
        for rs, w in sorted(table[vs].items()):
            print(f"{vs} -> {rs} {w}")
        if not table[vs]:
            print(f"{vs} (no real server)")
