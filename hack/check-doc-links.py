#!/usr/bin/env python3
"""Checks the repository's Markdown: every relative link names a file that exists (and, with a
#fragment, a heading of it, as GitHub makes anchors), and no document names a path outside the
repository. Run by hack/test.sh's lint stage.

usage: hack/check-doc-links.py        (exit status 1 and one line per problem when any)
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# [text](target) outside code spans; images too. Targets with a scheme are not checked.
LINK = re.compile(r"(?<!`)\[[^\]]*\]\(([^)\s]+)\)")
# Paths of one machine or of a checkout's neighbours.
OUTSIDE = re.compile(r"(/work/|\.\./shared\b|\bheavy\b|/tmp/kipvs|/home/\w+|/root/)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of `path`: lower case, punctuation dropped, spaces to '-'."""
    found, seen, fence = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def main() -> int:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    problems = []
    for name in files:
        doc = ROOT / name
        if not doc.exists():
            continue
        fence = False
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{name}:{number}"
            if OUTSIDE.search(line):
                problems.append(f"{where}: names a path outside the repository: {line.strip()}")
            if line.startswith("```"):
                fence = not fence
            if fence:
                continue
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, fragment = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                if not dest.exists():
                    problems.append(f"{where}: no such file: {target}")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    problems.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
