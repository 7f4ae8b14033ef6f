#!/usr/bin/env bash
# The test command: formatting, lints, then every unit and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs); this machine kind ships it" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
