#!/usr/bin/env bash
# Builds the user guide into docs/book/html and checks every link between
# its pages, offline (mdbook-linkcheck as a second backend; web links are
# never fetched; anchors are e2e/tests/docs.rs's). Exits non-zero on a broken link or
# a page missing from SUMMARY.md. The pinned mdBook and mdbook-linkcheck come
# from e2e/build-tools.sh --docs-only (built once with cargo, then cached).
#
#   bash docs/build.sh           # then open docs/book/html/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1090
source "$(bash e2e/build-tools.sh --docs-only --env-file)"
# mdBook runs each backend by its command name on PATH.
PATH="$(dirname "$MDBOOK_LINKCHECK"):$PATH"
rm -rf docs/book
"$MDBOOK" build docs
echo "docs: built docs/book/html/index.html; every link checked"
