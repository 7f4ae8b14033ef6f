# shellcheck shell=bash
# Sourced by the e2e scripts (test.sh, images.sh, cluster.sh, bench/run.sh):
# Debian packages installed when missing. CI starts from a bare machine, so
# each script installs what it needs itself instead of trusting an earlier one.

# apt_install WHY PKG...: `apt-get install` the packages, without
# recommends. A bare machine's package lists may be missing or stale, so a
# failed install refreshes them once and retries. Needs root and apt-get;
# otherwise, or when the retry fails too, it says what is missing and why on
# stderr and returns 1 (callers decide whether that is fatal).
apt_install() {
  local why="$1" out
  shift
  (($#)) || return 0
  if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$* needed ($why): install as root (apt-get install $*)" >&2
    return 1
  fi
  echo "== apt-get install $* ($why)" >&2
  out="$(DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" 2>&1)" && return 0
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 || true
  out="$(DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" 2>&1)" && return 0
  echo "apt-get install $* failed: $(tail -n 5 <<<"$out")" >&2
  return 1
}

# need_make: jemalloc, the sidecar binary's allocator, builds from source
# with cc (which rustc links with) and make.
need_make() {
  command -v make >/dev/null 2>&1 || apt_install "jemalloc, the sidecar's allocator, builds from source" make
}
