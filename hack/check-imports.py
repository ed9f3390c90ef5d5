#!/usr/bin/env python3
"""Module layering of every crate in the workspace, checked from the source.

For each crate's `src/` (the workspace members of Cargo.toml and their examples that are folders,
or the folders given), reads every `crate::a::b` path (outside comment lines) and `super::x` path
and fails when the module graph has a cycle, between files or between top-level modules (a folder
and what it holds count as one). Edges between a folder's `mod.rs` and its own files count like any
other: a child naming an item of its parent (`super::SourceHandle`), and a `mod.rs` naming its
child (`use store::Store`, `pub use keys::VirtualServerKey`), so a file that imports its parent
while the parent imports it back is a cycle (a `mod` line alone is not an import). Groups
(`super::{a, b::{c}}`) and globs (`a::*`) are read as the paths they name. A file's unit tests
(from its `#[cfg(test)]` line on) and the `tests.rs` files of test modules are left out: a test
module is a leaf nothing imports. The crate roots (`lib.rs`, `main.rs`, `bin/`) declare and
re-export modules and are not nodes of the graph.

The proxier adds its layers (ARCHITECTURE.md, "Folders (`proxier/src`)"): `plan/` does not import
`dataplane/`, `model/` imports nothing outside itself, and neither `plan/` nor `model/` names a
Kubernetes crate (`k8s_openapi`, `kube`: the planning core reads only the domain values of
`model/objects.rs`, converted at the store's boundary by `source/convert.rs`). `model/` holds no
encoding: it names no crate of a kernel interface (`nftables`, `ipvs`, `rtnetlink`, `netlink_*`).
In `dataplane/`, the pure side on top (`mod.rs`, `diff.rs`, `isolate.rs`, `fake.rs`) imports
neither the real dataplane (`kernel/mod.rs`) nor `host/`, and `host/` (the node's tools and
kube-proxy) imports nothing else of `dataplane/`.
Usage: hack/check-imports.py [CRATE/src ...] [-v: print the edges between top-level modules]
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def modules(root):
    """The crate's modules below its roots: name (`a::b`) -> path relative to `root`."""
    mods = {}
    for d, dirs, files in os.walk(root):
        if d == root:
            dirs[:] = [x for x in dirs if x != "bin"]
        for f in files:
            path = os.path.relpath(os.path.join(d, f), root)
            if f.endswith(".rs") and path not in ("lib.rs", "main.rs") and f != "tests.rs":
                mods[path[:-3].replace("/mod", "").replace("/", "::")] = path
    return mods

def resolve(mods, path):
    """The longest module prefix of a `a::b::c` path."""
    parts = path.split("::")
    while parts:
        if "::".join(parts) in mods:
            return "::".join(parts)
        parts.pop()
    return None


def top(m):
    return m.split("::")[0]


def group(text):
    """The paths of a use group's body, `a, b::c, d::{e, f::*}` -> a, b::c, d::e, d::f (a glob
    names the module it is in; `self` and `x as y` read as the path before them)."""
    items, depth, item = [], 0, ""
    for ch in text:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    paths = []
    for item in items + [item]:
        item = item.strip()
        nested = re.match(r"((?:\w+::)*)\{(.*)\}$", item, re.S)
        if nested:
            paths += [nested.group(1) + p for p in group(nested.group(2))]
        elif re.match(r"\w", item):
            paths.append(re.match(r"(?:\w+::)*\w+", item).group(0))
        elif item == "*":
            paths.append("")
    return [p.rstrip(":") for p in paths]


def uses(code, prefix):
    """The paths named after `prefix::` (a regex) in `code`: `a::b` as "a::b", a group
    `a::{b, c::{d}}` as its paths ("a::b", "a::c::d"), and a glob `a::*` as "a" (`*` alone: "")."""
    found = []
    for m in re.finditer(prefix + r"::((?:\w+::)*)(\{|\*|\w+)", code):
        head, last = m.group(1), m.group(2)
        if last == "{":
            depth, i = 1, m.end()
            while depth and i < len(code):
                depth += {"{": 1, "}": -1}.get(code[i], 0)
                i += 1
            found += [head + p if p else head.rstrip(":") for p in group(code[m.end():i - 1])]
        elif last == "*":
            found.append(head.rstrip(":"))
        else:
            found.append(head + last)
    return found


def under(base, paths):
    return [base + "::" + p if p else base for p in paths]


KUBE_CRATES = ("k8s_openapi", "kube")
# The crates a layer may be kept from naming: Kubernetes', and those of a kernel interface. A path
# inside the crate (`crate::dataplane::nftables::...`, `super::nftables`) is not the crate.
CRATES = r"(?<![\w:])(k8s_openapi|kube|nftables|ipvs|rtnetlink|netlink_\w+)::"


def imports(root, mods):
    """The edges (module, module it imports) and the (module, crate of `CRATES`) pairs it names."""
    edges, crates = set(), set()
    for name, path in mods.items():
        with open(os.path.join(root, path)) as f:
            lines = f.read().split("\n#[cfg(test)]")[0].splitlines()
            code = "\n".join(l for l in lines if not l.lstrip().startswith("//"))
        crates.update((name, m.group(1)) for m in re.finditer(CRATES, code))
        parent = name.rsplit("::", 1)[0] if "::" in name else None
        targets = [p for p in uses(code, r"\bcrate") if p]
        if parent:
            targets += under(parent, uses(code, r"\bsuper"))
        if path.endswith("mod.rs"):  # a folder's module naming its own files by their bare names
            for child in (c for c in mods if c.rsplit("::", 1)[0] == name and "::" in c):
                bare = child.rsplit("::", 1)[1]
                targets += under(child, uses(code, r"(?<![\w:])(?:self::)?" + bare))
        for t in filter(None, (resolve(mods, t) for t in targets)):
            if t != name:
                edges.add((name, t))
    return edges, crates


def cycles(graph_edges):
    graph = {}
    for a, b in graph_edges:
        graph.setdefault(a, set()).add(b)
    found, seen = [], set()

    def walk(node, stack):
        for nxt in sorted(graph.get(node, ())):
            if nxt in stack:
                cycle = stack[stack.index(nxt):]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    found.append(cycle + [nxt])
            else:
                walk(nxt, stack + [nxt])

    for node in sorted(graph):
        walk(node, [node])
    return found



DATAPLANE_PURE = ("dataplane", "dataplane::diff", "dataplane::isolate", "dataplane::fake")


def proxier_layers(edges, crates):
    """The proxier's layers: plan/ below dataplane/, model/ closed and without encoding, no
    Kubernetes crate in either; in dataplane/, the pure side above the real dataplane and host/,
    host/ at the bottom."""
    problems = [f"{a} imports {b}" for a, b in sorted(edges) if top(a) == "plan" and top(b) == "dataplane"]
    problems += [f"{a} imports {b}" for a, b in sorted(edges) if top(a) == "model" and top(b) != "model"]
    problems += [f"{a} names the Kubernetes crate {c}" for a, c in sorted(crates)
                 if top(a) in ("plan", "model") and c in KUBE_CRATES]
    problems += [f"{a} names the kernel interface crate {c} (model/ holds no encoding)"
                 for a, c in sorted(crates) if top(a) == "model" and c not in KUBE_CRATES]
    host = lambda m: m == "dataplane::host" or m.startswith("dataplane::host::")
    problems += [f"{a} (the pure side of dataplane/) imports {b}" for a, b in sorted(edges)
                 if a in DATAPLANE_PURE and (b == "dataplane::kernel" or host(b))]
    problems += [f"{a} (dataplane/host/) imports {b}" for a, b in sorted(edges)
                 if host(a) and top(b) == "dataplane" and not host(b)]
    return problems


LAYERS = {"proxier": proxier_layers}


def check(src, verbose):
    """The problems of the crate whose sources are in `src`, printed with a summary line."""
    path = os.path.abspath(src)
    crate = (os.path.basename(os.path.dirname(path)) if os.path.basename(path) == "src"
             else os.path.relpath(path, ROOT))
    mods = modules(src)
    edges, crates = imports(src, mods)
    folders = {(top(a), top(b)) for a, b in edges if top(a) != top(b)}
    if verbose:
        for a, b in sorted(folders):
            print(f"  {crate}: {a} -> {b}")
    file_cycles = cycles(edges)
    problems = [f"file cycle: {' -> '.join(c)}" for c in file_cycles]
    problems += [f"top-level cycle: {' -> '.join(c)}" for c in cycles(folders)
                 if set(c) not in [set(f) for f in file_cycles]]
    problems += LAYERS.get(crate, lambda *_: [])(edges, crates)
    for p in problems:
        print(f"{crate}: {p}")
    print(f"{crate}: {len(mods)} modules, {len(edges)} imports between them: "
          + ("FAILED" if problems else "no cycle"))
    return problems


def workspace_sources():
    """The `src/` of each workspace member (Cargo.toml `members = [...]`), and each of its
    examples that is a folder (`examples/NAME/main.rs`, a crate of its own)."""
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        listed = re.search(r"(?m)^members\s*=\s*\[([^\]]*)\]", f.read()).group(1)
    members = re.findall(r'"([^"]+)"', listed)
    sources = [os.path.join(ROOT, m, "src") for m in members]
    for m in members:
        examples = os.path.join(ROOT, m, "examples")
        if os.path.isdir(examples):
            sources += [os.path.join(examples, e) for e in sorted(os.listdir(examples))
                        if os.path.isfile(os.path.join(examples, e, "main.rs"))]
    return sources


args = [a for a in sys.argv[1:] if a != "-v"]
failed = [p for src in (args or workspace_sources()) for p in check(src, "-v" in sys.argv)]
sys.exit(1 if failed else 0)
