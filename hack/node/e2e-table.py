#!/usr/bin/env python3
"""The result of upstream's e2e.test run (hack/test-node.sh --conformance) as a Markdown table.

usage: hack/node/e2e-table.py [--log E2E_LOG] JUNIT_XML...

Reads the JUnit reports ginkgo writes in --report-dir (junit_*.xml) and prints one row per test that was in
the focus: passed, failed (with the first line of the failure message) or skipped at run time (with the skip's
message: the test's own reason, e.g. too few nodes). Tests outside the focus are reported skipped without a
message and are left out. Ginkgo 1 writes a run-time skip without its message too: with --log, the skips
ginkgo's output (E2E_LOG) prints as `S [SKIPPING]` with their message are rows. The last line sums the rows and
their time.

Errors: a file that is not a JUnit report (exit status 1, message on stderr).
"""
import re
import sys
import xml.etree.ElementTree as ET


def reason(element):
    """The first line of a failure's or skip's message that says something (ginkgo puts the location first)."""
    text = (element.get("message") or element.text or "").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if not line.startswith("/") and not line.startswith("_output") and not line.endswith(".go"):
            return line.replace("|", "\\|")[:240]
    return (lines[0] if lines else "").replace("|", "\\|")[:240]


def logged_skips(path):
    """{test name: message} of each `S [SKIPPING]` block of ginkgo's output: its container lines and the test's
    (ending in its node, e.g. [It] or [BeforeEach]) joined as JUnit names them, then the first message line."""
    skips, block = {}, None

    def close():
        for i, text in enumerate(block or []):
            if re.search(r" \[(It|BeforeEach|JustBeforeEach|AfterEach)\]$", text) and i + 1 < len(block):
                skips[" ".join(block[:i] + [text.rsplit(" [", 1)[0]])] = block[i + 1]
                return

    with open(path, errors="replace") as f:
        for line in f:
            text = line.strip()
            if line.startswith("S [SKIPPING]"):
                close()
                block = []
            elif block is not None and line.startswith("---"):
                close()
                block = None
            elif block is not None and text and not text.startswith(("/", "_output")):
                block.append(text)
    close()
    return skips


def main(paths):
    log = {}
    if paths[:1] == ["--log"]:
        log, paths = logged_skips(paths[1]), paths[2:]
    rows = []
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError) as e:
            print(f"e2e-table: {path}: {e}", file=sys.stderr)
            return 1
        for case in root.iter("testcase"):
            name = case.get("name", "")
            seconds = float(case.get("time") or 0)
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            skipped = case.find("skipped")
            if failure is not None:
                rows.append((name, "failed", seconds, reason(failure)))
            elif skipped is not None:
                if skipped.get("message") or (skipped.text or "").strip():
                    rows.append((name, "skipped", seconds, reason(skipped)))
                elif name in log:
                    rows.append((name, "skipped", seconds, log[name].replace("|", "\\|")[:240]))
            elif not name.startswith("[SynchronizedBeforeSuite]") and not name.startswith("[SynchronizedAfterSuite]"):
                rows.append((name, "passed", seconds, ""))
    print("| test | result | time (s) | reason |")
    print("|---|---|---|---|")
    for name, result, seconds, why in sorted(rows, key=lambda r: r[0]):
        name = name.replace("|", "\\|")
        print(f"| {name} | {result} | {seconds:.0f} | {why} |")
    count = {r: sum(1 for row in rows if row[1] == r) for r in ("passed", "failed", "skipped")}
    total = sum(row[2] for row in rows)
    print(f"\n{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped ({total:.0f} s in tests)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
