# Sourced by the README's commands (hack/demo.sh, hack/test.sh) and every script they run: everything
# the demo and the tests need on the host, so that a fresh Debian 12 machine with a Rust toolchain needs
# no manual step.
#
# host_tools: puts $TOOLSCACHE/bin first on PATH and makes sure these commands are there:
#   - nft (nftables: the proxier's nftables dataplane and its host tests), umoci (writes and unpacks the
#     OCI images, hack/build-images.sh) and kubectl (kubernetes-client: the control-plane suites), when the
#     machine has none, are fetched as Debian packages with `apt-get download` and unpacked with `dpkg -x`
#     into $TOOLSCACHE, with the libraries they need that the machine lacks; a wrapper in $TOOLSCACHE/bin
#     runs each with its libraries (LD_LIBRARY_PATH set for that process only). Nothing is installed.
#   - python3, file, strip, curl, openssl (base tools every script uses) are installed with apt-get when
#     missing (needs root, as the tests do).
# deb_closure PKG...: the packages PKG needs at run time (Depends, recursively; virtual ones dropped),
#   one per line, PKG included: what a root filesystem without anything else needs (hack/build-images.sh).
# deb_fetch DIR PKG...: `apt-get download` the packages into DIR (reusing debs already there).
#
# env: TOOLSCACHE (~/.cache/kipvs-tools), KIPVS_FETCH_TOOLS=all (fetch nft/umoci/kubectl even when the
#      machine has them: what a fresh machine does)
TOOLSCACHE=${TOOLSCACHE:-$HOME/.cache/kipvs-tools}

deb_closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances "$@" 2>/dev/null | grep -v -e '^ ' -e '^<' | sort -u
}

deb_fetch() { # DIR PKG...
  local dir=$1 p missing=()
  shift
  mkdir -p "$dir"
  for p in "$@"; do compgen -G "$dir/${p}_*.deb" >/dev/null || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update -qq
  chmod 777 "$dir" # apt-get download drops to the _apt user when it can
  (cd "$dir" && apt-get download -qq "${missing[@]}" 2>&1 || { apt-get update -qq && apt-get download -qq "${missing[@]}"; }) |
    grep -v -e unsandboxed -e '^Get:' >&2 || true
  for p in "${missing[@]}"; do
    compgen -G "$dir/${p}_*.deb" >/dev/null || { echo "host-tools: could not download $p" >&2; return 1; }
  done
}

# fetch_tool CMD PKG PATH: unpack PKG and what it needs that the machine lacks; wrapper $TOOLSCACHE/bin/CMD
fetch_tool() {
  local cmd=$1 pkg=$2 path=$3 root=$TOOLSCACHE/root p need=()
  for p in $(deb_closure "$pkg"); do
    [ "$p" = "$pkg" ] || [ "${KIPVS_FETCH_TOOLS:-}" = all ] ||
      ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || continue
    # a fresh root filesystem would need libc6 and its kin; the host's are the ones that run
    case $p in libc6 | libgcc-s1 | gcc-12-base) continue ;; esac
    need+=("$p")
  done
  echo "host-tools: fetching $cmd (Debian ${need[*]}) into $TOOLSCACHE" >&2
  deb_fetch "$TOOLSCACHE/debs" "${need[@]}"
  for p in "${need[@]}"; do dpkg -x "$(ls "$TOOLSCACHE/debs/${p}"_*.deb | head -n1)" "$root"; done
  mkdir -p "$TOOLSCACHE/bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' \
    "$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu" "$root/$path" > "$TOOLSCACHE/bin/$cmd.tmp"
  chmod +x "$TOOLSCACHE/bin/$cmd.tmp" && mv "$TOOLSCACHE/bin/$cmd.tmp" "$TOOLSCACHE/bin/$cmd"
  "$TOOLSCACHE/bin/$cmd" --version >/dev/null 2>&1 || "$TOOLSCACHE/bin/$cmd" version --client >/dev/null 2>&1 ||
    { echo "host-tools: the fetched $cmd does not run" >&2; return 1; }
}

host_tools() {
  local spec cmd pkg missing=()
  case ":$PATH:" in *":$TOOLSCACHE/bin:"*) ;; *) export PATH="$TOOLSCACHE/bin:$PATH" ;; esac
  for spec in python3:python3 file:file strip:binutils curl:curl openssl:openssl; do
    command -v "${spec%%:*}" >/dev/null 2>&1 || missing+=("${spec#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "host-tools: installing ${missing[*]} with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
      { echo "host-tools: apt-get install ${missing[*]} failed (run as root)" >&2; return 1; }
  fi
  for spec in nft:nftables:usr/sbin/nft umoci:umoci:usr/bin/umoci kubectl:kubernetes-client:usr/bin/kubectl; do
    cmd=${spec%%:*}; pkg=${spec#*:}; pkg=${pkg%%:*}
    [ -x "$TOOLSCACHE/bin/$cmd" ] && continue
    [ "${KIPVS_FETCH_TOOLS:-}" != all ] && command -v "$cmd" >/dev/null 2>&1 && continue
    fetch_tool "$cmd" "$pkg" "${spec##*:}"
  done
}
