#!/usr/bin/env python3
"""The result of upstream's e2e.test run (hack/test-node.sh --conformance) as a Markdown table.

usage: hack/node/e2e-table.py JUNIT_XML...

Reads the JUnit reports ginkgo writes in --report-dir (junit_*.xml) and prints one row per test that was in
the focus: passed, failed (with the first line of the failure message) or skipped at run time (with the skip's
message: the test's own reason, e.g. too few nodes). Tests outside the focus are reported skipped without a
message and are left out. The last line sums the rows and their time.

Errors: a file that is not a JUnit report (exit status 1, message on stderr).
"""
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


def main(paths):
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
