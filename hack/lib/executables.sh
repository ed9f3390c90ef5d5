# Sourced by hack/*.sh: paths of workspace executables, built by the same `cargo test --workspace`
# build as the tests (so nothing is compiled twice: a plain `cargo build` unifies features
# differently, without dev-dependencies, and would rebuild half the tree).
# usage: executables NAME... -> prints "NAME PATH" per built binary, test or example target NAME
executables() {
  cargo test --workspace --no-run --message-format=json-render-diagnostics | executables_built "$@"
}
# usage: cargo build ... --message-format=json-render-diagnostics | executables_built NAME...
#   -> prints "NAME PATH" per binary, test or example target NAME that cargo reports built
#   (for scripts that need another profile or fewer targets than the test build)
executables_built() {
  python3 -c 'import json, sys
want = set(sys.argv[1:])
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or m["target"]["name"] not in want:
        continue
    if m["profile"]["test"] and "test" not in m["target"]["kind"]:
        continue  # the unit-test harness of a bin or lib, not the program itself
    print(m["target"]["name"], m["executable"])' "$@"
}
# usage: executable NAME -> the path of one of them (empty if not built)
executable() { executables "$1" | awk -v n="$1" '$1 == n {p = $2} END {print p}'; }
