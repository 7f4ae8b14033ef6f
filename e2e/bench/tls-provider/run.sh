#!/usr/bin/env bash
# The client side of TLS with rustls' ring and aws-lc-rs providers (issue 43):
# builds src/main.rs (release, its own workspace and target folder), makes an
# ECDSA P-256 and an RSA-2048 chain for upstream.bench with the openssl CLI
# as bench.py's scenario 8 does, and runs ROUNDS interleaved rounds.
#
#   e2e/bench/tls-provider/run.sh [ROUNDS [SCALE]]
#
# CARGO_TARGET_DIR, when set, is used as is; taskset -c ${BENCH_CPU:-1} pins it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
cargo build --release --locked --quiet --manifest-path "$here/Cargo.toml"
certs="$(mktemp -d)"
trap 'rm -rf "$certs"' EXIT
ossl() { openssl "$@" >/dev/null 2>&1; }
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:upstream.bench\n' >"$certs/leaf.ext"
serial=1
for kind in ecdsa rsa; do
  case $kind in
    ecdsa) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256) ;;
    rsa) newkey=(-newkey rsa:2048) ;;
  esac
  ossl req -x509 "${newkey[@]}" -nodes -keyout "$certs/$kind-ca.key" -out "$certs/$kind-ca.pem" -days 7 \
    -subj "/CN=reprise-bench $kind CA" -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
  ossl req "${newkey[@]}" -nodes -keyout "$certs/$kind.key" -out "$certs/$kind.csr" -subj /CN=upstream.bench
  ossl x509 -req -in "$certs/$kind.csr" -CA "$certs/$kind-ca.pem" -CAkey "$certs/$kind-ca.key" \
    -set_serial $serial -days 7 -sha256 -extfile "$certs/leaf.ext" -out "$certs/$kind.pem"
  serial=$((serial + 1))
done
taskset -c "${BENCH_CPU:-1}" "$CARGO_TARGET_DIR/release/reprise-bench-tls-provider" "$certs" "${1:-7}" "${2:-1}"
