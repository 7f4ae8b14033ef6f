#!/usr/bin/env bash
# The quick-start demo: reprise-sidecar in front of a 50%-flaky endpoint and a
# healthy one, on loopback. Prints requests, retries, recovered and exhausted.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p reprise-sidecar -p reprise-e2e
exec target/release/reprise-demo
