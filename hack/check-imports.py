#!/usr/bin/env python3
"""The proxier's module layering (ARCHITECTURE.md, "Proxier: folders"), checked from the source.

Reads every `crate::a::b` path (outside comments) and `super::x` path in proxier/src and fails
when the module graph has a cycle, between files or between the top-level folders, when `plan/`
imports `dataplane/`, when `model/` imports anything outside itself, or when `plan/` or `model/`
names a Kubernetes crate (`k8s_openapi`, `kube`: the planning core reads only the domain values
of `model/objects.rs`, converted at the store's boundary by `source/convert.rs`). Edges between a
folder's `mod.rs` and its own files count like any other: a child naming an item of its parent
(`super::SourceHandle`), and a `mod.rs` naming its child (`use store::Store`, `pub use
keys::VirtualServerKey`), so a file that imports its parent while the parent imports it back is a
cycle (a `mod` line alone is not an import). Groups (`super::{a, b::{c}}`) and globs (`a::*`) are
read as the paths they name. A file's unit tests (from its `#[cfg(test)]` line on) are left out: a test module is a
leaf nothing imports, and may build its fixtures from Kubernetes objects through the converter.
Usage: hack/check-imports.py [proxier/src] [-v: print the edges]
"""
import os
import re
import sys

args = [a for a in sys.argv[1:] if a != "-v"]
root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "proxier", "src")
mods = {}
for d, _, files in os.walk(root):
    for f in files:
        if f.endswith(".rs") and f != "main.rs":
            path = os.path.relpath(os.path.join(d, f), root)
            name = path[:-3].replace("/mod", "").replace("/", "::")
            if name != "lib":
                mods[name] = path


def resolve(path):
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


edges, kube_crates = set(), set()
for name, path in mods.items():
    with open(os.path.join(root, path)) as f:
        lines = f.read().split("\n#[cfg(test)]")[0].splitlines()
        code = "\n".join(l for l in lines if not l.lstrip().startswith("//"))
    if top(name) in ("plan", "model"):
        kube_crates.update(
            (name, m.group(1)) for m in re.finditer(r"\b(k8s_openapi|kube)::", code))
    parent = name.rsplit("::", 1)[0] if "::" in name else None
    targets = [p for p in uses(code, r"\bcrate") if p]
    if parent:
        targets += under(parent, uses(code, r"\bsuper"))
    if path.endswith("mod.rs"):  # a folder's module naming its own files by their bare names
        for child in (c for c in mods if c.rsplit("::", 1)[0] == name and "::" in c):
            bare = child.rsplit("::", 1)[1]
            targets += under(child, uses(code, r"(?<![\w:])(?:self::)?" + bare))
    for t in filter(None, map(resolve, targets)):
        if t != name:
            edges.add((name, t))


folders = {(top(a), top(b)) for a, b in edges if top(a) != top(b)}


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


if "-v" in sys.argv:
    for a, b in sorted(folders):
        print(f"{a}/ -> {b}/")
problems = [f"folder cycle: {' -> '.join(c)}" for c in cycles(folders)]
problems += [f"file cycle: {' -> '.join(c)}" for c in cycles(edges)]
problems += [f"{a} imports {b}" for a, b in sorted(edges) if top(a) == "plan" and top(b) == "dataplane"]
problems += [f"{a} imports {b}" for a, b in sorted(edges) if top(a) == "model" and top(b) != "model"]
problems += [f"{a} names the Kubernetes crate {c}" for a, c in sorted(kube_crates)]
for p in problems:
    print(p)
print(f"{len(mods)} modules, {len(edges)} imports between them: " + ("FAILED" if problems else "no cycle"))
sys.exit(1 if problems else 0)
