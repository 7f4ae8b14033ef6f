#!/usr/bin/env bash
# A Python with grpcio (gRPC's own C-core implementation, which nobody on this
# project wrote) for the gRPC interoperability tests, in a virtualenv cached
# outside the clone, keyed by version:
#
#   ${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}/py-grpcio-<version>/bin/python
#
# Prints that path on stdout (progress on stderr). Installs from PyPI when missing.
set -euo pipefail
VERSION="${REPRISE_GRPCIO_VERSION:-1.85.3}"
DIR="${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}/py-grpcio-$VERSION"
PY="$DIR/bin/python"
if ! "$PY" -c "import grpc; assert grpc.__version__ == '$VERSION'" 2>/dev/null; then
  command -v python3 >/dev/null || { echo "python-grpc: python3 is required" >&2; exit 1; }
  echo "python-grpc: installing grpcio $VERSION into $DIR" >&2
  rm -rf "$DIR.tmp"
  python3 -m venv "$DIR.tmp" >&2
  "$DIR.tmp/bin/pip" install --quiet --disable-pip-version-check "grpcio==$VERSION" >&2
  rm -rf "$DIR"
  mv "$DIR.tmp" "$DIR"
  # The venv's scripts name their own directory; it moved.
  PY="$DIR/bin/python"
  "$PY" -c "import grpc" >&2 || { python3 -m venv --upgrade "$DIR" >&2; }
fi
printf '%s\n' "$PY"
