#!/usr/bin/env bash
# Dependency policy (deny.toml): licences, banned/duplicate crates and sources,
# for the main workspace and the fuzz workspace. Exits non-zero on a violation
# (a licence outside the allow list, a crate from anywhere but crates.io).
#
#   e2e/deny.sh               licenses, bans, sources
#   e2e/deny.sh --advisories  also RustSec advisories
#
# Advisories need the RustSec database, a git repository on GitHub. Machines
# that reach only package registries cannot fetch it, so it is opt-in: with
# --advisories, the database is fetched (or, when that fails, read from
# $CARGO_HOME/advisory-dbs if a copy is already there) and a failure to get it
# fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

checks=(licenses bans sources)
advisories=0
for arg in "$@"; do
  case "$arg" in
    --advisories) advisories=1 ;;
    *) echo "usage: e2e/deny.sh [--advisories]" >&2; exit 2 ;;
  esac
done

if ! cargo deny --version >/dev/null 2>&1; then
  echo "== installing cargo-deny"
  cargo install cargo-deny --locked
fi

status=0
for manifest in Cargo.toml fuzz/libfuzzer/Cargo.toml; do
  # The main lock must be current (as for every build here); fuzz/libfuzzer/Cargo.lock
  # follows the sidecar's dependencies, so it is brought up to date instead.
  locked=()
  [ "$manifest" = Cargo.toml ] && locked=(--locked)
  deny=(cargo deny --manifest-path "$manifest" --config deny.toml "${locked[@]}")
  echo "== cargo deny: $manifest (${checks[*]})"
  "${deny[@]}" check "${checks[@]}" || status=1
  if [ "$advisories" = 1 ]; then
    echo "== cargo deny: $manifest (advisories)"
    if ! "${deny[@]}" check advisories; then
      echo "== fetching the advisory database failed; trying a local copy" >&2
      "${deny[@]}" --offline check advisories || status=1
    fi
  fi
done
exit "$status"
