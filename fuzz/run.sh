#!/usr/bin/env bash
# Runs every fuzz target for SECONDS_PER_TARGET seconds (default 30) and fails
# if any of them finds a crash (a panic, a failed invariant, a sanitizer report,
# a timeout or an out-of-memory).
#
#   fuzz/run.sh [SECONDS_PER_TARGET]
#
# Needs cargo-fuzz (installed here if missing) and a nightly toolchain; without
# `cargo +nightly` it builds with the default (stable) toolchain and
# RUSTC_BOOTSTRAP=1, which lets stable accept the -Z flags cargo-fuzz passes.
# FUZZ_STABLE=1 forces that fallback (to test it).
#
# The committed seeds in fuzz/corpus/<target> are read-only inputs; what a run
# discovers goes to fuzz/work/<target> (ignored by git), so the committed corpus
# stays small. Crash inputs land in fuzz/libfuzzer/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: fuzz/run.sh [SECONDS_PER_TARGET]" >&2
  exit 2
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

fuzz=(cargo +nightly fuzz)
# The targets are in fuzz/libfuzzer; their inputs and invariants in fuzz/src.
dir=(--fuzz-dir fuzz/libfuzzer)
if [ "${FUZZ_STABLE:-0}" = 1 ] || ! cargo +nightly --version >/dev/null 2>&1; then
  echo "== using $(rustc --version) with RUSTC_BOOTSTRAP=1 (no nightly, or FUZZ_STABLE=1)"
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi

targets=(config_file snapshot retry_after classifier http1_response http1_request)
echo "== building ${targets[*]}"
"${fuzz[@]}" build "${dir[@]}"

failed=()
summary=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/work/$t"
  log="fuzz/work/$t.log"
  echo "== fuzzing $t for ${seconds}s"
  # -timeout: one input running over 10 s counts as a hang (a crash).
  if "${fuzz[@]}" run "${dir[@]}" "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 >"$log" 2>&1; then
    status=ok
  else
    status=CRASH
    failed+=("$t")
    tail -n 40 "$log" >&2
  fi
  runs="$(awk '/^stat::number_of_executed_units/ { print $NF }' "$log" | tail -n 1)"
  corpus="$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -n 1 | cut -d' ' -f2)"
  summary+=("$(printf '%-12s %-5s runs=%s corpus=%s seeds=%s' "$t" "$status" "${runs:-?}" \
    "${corpus:-?}" "$(find "fuzz/corpus/$t" -type f | wc -l)")")
done

echo "== summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: crash in ${failed[*]}; inputs are in fuzz/libfuzzer/artifacts/ (reproduce with: cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer TARGET FILE)" >&2
  exit 1
fi
