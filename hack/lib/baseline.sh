# Sourced by the side-by-side benchmarks (hack/bench-engine.sh, hack/bench-api.sh): a baseline commit
# checked out in a `git worktree` of its own, to build in its own target dir (two worktrees of this
# workspace get equal cargo metadata hashes, and a shared target dir would hand both the same binary).
# baseline_checkout COMMIT TREE: check COMMIT out at TREE (reused when TREE is at COMMIT already), and
#   remember TREE for baseline_cleanup.
# baseline_cleanup: remove that worktree, unless KEEP_BASELINE=1 (the next run then reuses it and its
#   build).
baseline_checkout() {
    baseline_tree=$2
    if [ ! -e "$baseline_tree/.git" ] ||
        [ "$(git -C "$baseline_tree" rev-parse HEAD 2>/dev/null)" != "$(git rev-parse "$1^{commit}")" ]; then
        git worktree remove --force "$baseline_tree" >/dev/null 2>&1 || true
        mkdir -p "$(dirname "$baseline_tree")"
        git worktree add --detach "$baseline_tree" "$1" >/dev/null
    fi
}
baseline_cleanup() {
    [ "${KEEP_BASELINE:-0}" = 1 ] || [ -z "${baseline_tree:-}" ] ||
        git worktree remove --force "$baseline_tree" >/dev/null 2>&1 || true
}
