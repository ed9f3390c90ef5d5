#!/usr/bin/env python3
"""Resolve kernel module load order from an unpacked Debian kernel, without depmod/modprobe.

Debian's kernel package ships no modules.dep (depmod runs at install time), so this reads each module's
.modinfo section: `depends=` and `softdep=pre:` (softdeps matter: nf_conntrack needs libcrc32c, whose
softdep names the alias `crc32c`, which resolves to crc32c_generic). Names may be aliases.

usage: moddeps.py MODDIR MODULE...   prints module file paths, dependencies first, one per line.
Modules that do not exist (built-in, or absent like ip_vs_mh on old kernels) are noted on stderr.
"""
import lzma
import os
import re
import sys

moddir, wanted = sys.argv[1], sys.argv[2:]
index, info, alias = {}, {}, {}
for root, _, files in os.walk(moddir):
    for f in files:
        m = re.match(r'(.*)\.ko(\.xz)?$', f)
        if m:
            index[m.group(1).replace('-', '_')] = os.path.join(root, f)


def modinfo(name):
    if name not in info:
        path = index[name]
        data = lzma.open(path).read() if path.endswith('.xz') else open(path, 'rb').read()
        info[name] = [m.decode(errors='replace')
                      for m in re.findall(rb'(?<=\x00)(?:depends|softdep|alias)=[^\x00]*', data)]
    return info[name]


def resolve(name):
    name = name.replace('-', '_')
    if name in index:
        return name
    if not alias:  # built lazily: exact aliases only, preferring *_generic (no CPU feature needs)
        for n in index:
            for kv in modinfo(n):
                if kv.startswith('alias=') and not any(c in kv for c in '*?['):
                    a = kv[6:].replace('-', '_')
                    if a not in alias or 'generic' in n:
                        alias[a] = n
    return alias.get(name)


order, seen = [], set()


def visit(req):
    name = resolve(req)
    if name is None:
        print(f'moddeps: {req}: no such module (built-in or absent)', file=sys.stderr)
        return
    if name in seen:
        return
    seen.add(name)
    for kv in modinfo(name):
        if kv.startswith('depends='):
            for dep in filter(None, kv[8:].split(',')):
                visit(dep)
        elif kv.startswith('softdep='):
            m = re.search(r'pre:\s*(.*?)(?:\s*post:|$)', kv[8:])
            for dep in (m.group(1).split() if m else []):
                visit(dep)
    order.append(index[name])


for w in wanted:
    visit(w)
print('\n'.join(order))
