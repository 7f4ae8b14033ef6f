#!/usr/bin/env bash
# Builds the third-party binaries the e2e tests need, from their Go modules,
# at the versions pinned in e2e/tools/**/go.mod, and caches them outside the
# clone, keyed by version:
#
#   ${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}/<name>-<version>/<name>
#
#   kube-apiserver, kube-controller-manager  e2e/tools/go.mod        (k8s.io/kubernetes)
#   etcd                                     e2e/tools/etcd/go.mod   (go.etcd.io/etcd/server/v3)
#   jaeger (v2, cmd/jaeger)                  e2e/tools/jaeger/go.mod (github.com/jaegertracing/jaeger)
#   helm                                     e2e/tools/helm/go.mod   (helm.sh/helm/v3)
#   promtool (charts/test.sh's rule tests)   e2e/tools/prometheus/   (github.com/prometheus/prometheus)
# and, for the node (skipped with --api-only):
#   kubelet, kube-proxy, kube-scheduler      e2e/tools/go.mod        (k8s.io/kubernetes)
#   coredns (kubernetes, cache, ... only)    e2e/tools/coredns/      (github.com/coredns/coredns)
#   prometheus (Kubernetes SD only)          e2e/tools/prometheus/   (github.com/prometheus/prometheus)
#   crictl                                   e2e/tools/cri-tools/    (sigs.k8s.io/cri-tools)
# and, not built but downloaded (its CRD manifests, for the node's TLS test
# and the guide's examples):
#   Gateway API                              e2e/tools/gateway-api/  (sigs.k8s.io/gateway-api)
# and, with --docs-only and nothing else, from crates.io with `cargo install
# --locked` (the user guide's, for docs/build.sh):
#   mdbook, mdbook-linkcheck                 pinned below (DOCS_TOOLS), a pair that builds together
#
# A binary already in the cache is not rebuilt, so running this again is cheap.
# Progress goes to stderr. stdout gets one NAME=/abs/path line per tool
# (KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, ETCD, JAEGER, HELM, PROMTOOL, and KUBELET,
# KUBE_PROXY, KUBE_SCHEDULER, COREDNS, PROMETHEUS, CRICTL unless --api-only;
# GATEWAY_API_CRD_DIR, the pinned module's config/crd with its standard/ and
# experimental/ channels, always) and a last line REPRISE_TOOLS_ENV=<cache>/env-<hash>.sh naming a file
# that exports them; with --docs-only, MDBOOK and MDBOOK_LINKCHECK only.
#
# Usage:
#   e2e/build-tools.sh [--api-only]    # build what is missing, print NAME=path lines
#   source "$(e2e/build-tools.sh --env-file [--api-only])"   # build, then export the variables
#   e2e/build-tools.sh --docs-only [--env-file]   # only mdbook and mdbook-linkcheck (no Go needed)
#
# Cold builds on 2 cores (empty Go caches) take about 20 minutes for the
# control plane and helm, plus the node's tools, plus promtool (seconds after
# Prometheus, several minutes without it; figures in e2e/tools/README.md).
#
# To bump Kubernetes: e2e/tools/gen-kube-gomod.sh v1.32.N (rewrites go.mod/go.sum).
# To bump the others: cd e2e/tools/<tool> && go get <module>@<version> && go mod tidy
# (Jaeger v2 tags have no /v2 module suffix: use the v1.x tag cut from the same
# commit as the v2 release, e.g. v1.76.0 == v2.13.0, or a pseudo-version.)
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }

PRINT_ENV_FILE=0 API_ONLY=0 DOCS_ONLY=0
while (($#)); do
  case "$1" in
    --env-file) PRINT_ENV_FILE=1 ;;
    --api-only) API_ONLY=1 ;;
    --docs-only) DOCS_ONLY=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage; exit 2 ;;
  esac
  shift
done

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS_DIR="$E2E_DIR/tools"
CACHE_DIR="${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}"

log() { printf '[build-tools %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

((DOCS_ONLY)) || command -v go >/dev/null 2>&1 || die "go is not on PATH (need Go >= 1.26 for helm)"

# Reproducible, self-contained builds: the toolchain on the machine, the
# committed go.mod/go.sum only, no cgo, no VCS stamping, no go.work. Module and
# build caches stay at their defaults (outside the clone).
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"

mkdir -p "$CACHE_DIR"
# One builder at a time per cache (two concurrent go builds would thrash a
# 2-core machine, and both would produce the same files anyway).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE_DIR/.lock"
  if ! flock -n 9; then
    log "waiting for another build-tools.sh run holding $CACHE_DIR/.lock"
    flock 9
  fi
fi

HEARTBEAT_PID=""
TMP_OUT=""
CARGO_TMP_TARGET=""
cleanup() {
  if [[ -n "$HEARTBEAT_PID" ]]; then kill "$HEARTBEAT_PID" 2>/dev/null || true; fi
  if [[ -n "$TMP_OUT" ]]; then rm -f "$TMP_OUT"; fi
  if [[ -n "$CARGO_TMP_TARGET" ]]; then rm -rf "$CARGO_TMP_TARGET"; fi
}
trap cleanup EXIT

# module_version <module dir> <module path>: the version go.mod requires.
module_version() {
  local v
  v="$(awk -v m="$2" '
      $1 == "require" && $2 == m { print $3; exit }
      $1 == m && $2 ~ /^v/       { print $2; exit }' "$1/go.mod")"
  [[ -n "$v" ]] || die "$1/go.mod does not require $2"
  printf '%s\n' "$v"
}

# module_time <module dir> <module path>: the module version's commit time,
# used as a reproducible build date.
module_time() {
  (cd "$1" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2" 2>/dev/null) ||
    true
}

TOTAL_START=$SECONDS
BUILT=()
declare -A PATHS=()

# build_tool VAR NAME VERSION MODULE_DIR PACKAGE LDFLAGS VERSION_ARGS...
# (BUILD_TAGS, if set, is passed as -tags.)
build_tool() {
  local var="$1" name="$2" version="$3" moddir="$4" pkg="$5" ldflags="$6"
  shift 6
  local tags="${BUILD_TAGS:-}"
  local dir="$CACHE_DIR/$name-$version"
  local bin="$dir/$name"
  PATHS[$var]="$bin"
  if [[ -x "$bin" ]]; then
    log "$name $version: cached at $bin"
    return 0
  fi

  mkdir -p "$dir"
  TMP_OUT="$dir/.$name.tmp.$$"
  local start=$SECONDS
  log "$name $version: building $pkg (first build downloads modules; can take 10+ min on 2 cores)"
  (
    while sleep 60; do
      log "$name $version: still building ($((SECONDS - start))s)"
    done
  ) &
  HEARTBEAT_PID=$!

  local rc=0
  (cd "$moddir" &&
    nice -n 19 go build -trimpath ${tags:+-tags="$tags"} -ldflags="-s -w $ldflags" -o "$TMP_OUT" "$pkg") || rc=$?
  kill "$HEARTBEAT_PID" 2>/dev/null || true
  wait "$HEARTBEAT_PID" 2>/dev/null || true
  HEARTBEAT_PID=""
  ((rc == 0)) || die "$name $version: go build failed (exit $rc) after $((SECONDS - start))s"

  local out
  out="$("$TMP_OUT" "$@" 2>&1)" || die "$name $version: '$name $*' failed on the new binary: $out"
  out="$(head -n 3 <<<"$out")"
  mv -f "$TMP_OUT" "$bin"
  TMP_OUT=""
  log "$name $version: built in $((SECONDS - start))s -> $bin ($(du -h "$bin" | cut -f1)); $name $*: $(tr '\n' ' ' <<<"$out")"
  BUILT+=("$name")
}

# --- The user guide's tools (crates.io) ---------------------------------------
# mdBook renders docs/src; mdbook-linkcheck checks its links offline as a second
# backend. mdbook-linkcheck 0.7.7 (the latest) reads the book with mdBook 0.4's
# library and refuses to run under any mdBook outside ^0.4.0 (its
# COMPATIBLE_MDBOOK_VERSIONS), so the pair is mdBook 0.4.52, the last 0.4. Search only, none of mdBook's `serve`/`watch` (a web
# server and a file watcher the CI build never uses, and most of its build time).
DOCS_TOOLS=(
  "MDBOOK mdbook 0.4.52 --no-default-features --features search"
  "MDBOOK_LINKCHECK mdbook-linkcheck 0.7.7"
)
# cargo_tool VAR CRATE VERSION [cargo install args...]: cargo install --locked
# into <cache>/<crate>-<version>/bin, with its own target directory (removed
# after), so a workspace's CARGO_TARGET_DIR is never touched.
cargo_tool() {
  local var="$1" crate="$2" version="$3"
  shift 3
  local dir="$CACHE_DIR/$crate-$version"
  local bin="$dir/bin/$crate"
  PATHS[$var]="$bin"
  if [[ -x "$bin" ]]; then
    log "$crate $version: cached at $bin"
    return 0
  fi
  command -v cargo >/dev/null 2>&1 || die "cargo is not on PATH (needed for $crate)"
  local start=$SECONDS
  CARGO_TMP_TARGET="$CACHE_DIR/.cargo-target-$crate.$$"
  log "$crate $version: cargo install --locked (several minutes on 2 cores)"
  local rc=0
  CARGO_TARGET_DIR="$CARGO_TMP_TARGET" nice -n 19 cargo install --quiet --locked --root "$dir" \
    "$crate" --version "$version" "$@" >&2 || rc=$?
  rm -rf "$CARGO_TMP_TARGET"
  CARGO_TMP_TARGET=""
  ((rc == 0)) || die "$crate $version: cargo install failed (exit $rc) after $((SECONDS - start))s"
  log "$crate $version: built in $((SECONDS - start))s -> $bin; $("$bin" --version 2>&1 | head -n 1)"
  BUILT+=("$crate")
}
if ((DOCS_ONLY)); then
  for spec in "${DOCS_TOOLS[@]}"; do
    # shellcheck disable=SC2086
    cargo_tool $spec
  done
  for v in MDBOOK MDBOOK_LINKCHECK; do
    if ((PRINT_ENV_FILE)); then :; else printf '%s=%s\n' "$v" "${PATHS[$v]}"; fi
  done
  if ((PRINT_ENV_FILE)); then
    ENV_FILE="$CACHE_DIR/env-docs.sh"
    printf 'export MDBOOK=%q\nexport MDBOOK_LINKCHECK=%q\n' "${PATHS[MDBOOK]}" "${PATHS[MDBOOK_LINKCHECK]}" >"$ENV_FILE.tmp.$$"
    mv -f "$ENV_FILE.tmp.$$" "$ENV_FILE"
    printf '%s\n' "$ENV_FILE"
  fi
  exit 0
fi

# --- Kubernetes control plane -------------------------------------------------
KUBE_VERSION="$(module_version "$TOOLS_DIR" k8s.io/kubernetes)"
[[ "$KUBE_VERSION" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "unexpected kubernetes version $KUBE_VERSION"
KUBE_MAJOR="${BASH_REMATCH[1]}" KUBE_MINOR="${BASH_REMATCH[2]}"
kube_ldflags() {
  local date
  date="$(module_time "$TOOLS_DIR" k8s.io/kubernetes)"
  local -a kv=(
    "gitVersion=$KUBE_VERSION"
    "gitMajor=$KUBE_MAJOR"
    "gitMinor=$KUBE_MINOR"
    "gitTreeState=clean"
    "buildDate=${date:-1970-01-01T00:00:00Z}"
  )
  local f="" x
  for x in "${kv[@]}"; do
    f+=" -X k8s.io/component-base/version.$x -X k8s.io/client-go/pkg/version.$x"
  done
  printf '%s' "$f"
}
KUBE_BINS=(kube-apiserver kube-controller-manager)
((API_ONLY)) || KUBE_BINS+=(kubelet kube-proxy kube-scheduler)
KUBE_LDFLAGS=""
for b in "${KUBE_BINS[@]}"; do
  if [[ ! -x "$CACHE_DIR/$b-$KUBE_VERSION/$b" ]]; then
    KUBE_LDFLAGS="$(kube_ldflags)"
    break
  fi
done
for b in "${KUBE_BINS[@]}"; do
  var="$(tr 'a-z-' 'A-Z_' <<<"$b")"
  build_tool "$var" "$b" "$KUBE_VERSION" "$TOOLS_DIR" "k8s.io/kubernetes/cmd/$b" "$KUBE_LDFLAGS" --version
done

# --- etcd (its version string is compiled in) ---------------------------------
ETCD_VERSION="$(module_version "$TOOLS_DIR/etcd" go.etcd.io/etcd/server/v3)"
build_tool ETCD etcd "$ETCD_VERSION" "$TOOLS_DIR/etcd" go.etcd.io/etcd/server/v3 "" --version

# --- Jaeger v2 ----------------------------------------------------------------
# Jaeger tags each release twice on one commit, v1.N.P and v2.(N-63).P; only
# the v1 tag is a valid Go module version for github.com/jaegertracing/jaeger.
JAEGER_MOD_VERSION="$(module_version "$TOOLS_DIR/jaeger" github.com/jaegertracing/jaeger)"
JAEGER_VERSION="$JAEGER_MOD_VERSION"
if [[ "$JAEGER_MOD_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 63)); then
  JAEGER_VERSION="v2.$((BASH_REMATCH[1] - 63)).${BASH_REMATCH[2]}"
fi
JAEGER_LDFLAGS=""
if [[ ! -x "$CACHE_DIR/jaeger-$JAEGER_VERSION/jaeger" ]]; then
  JAEGER_LDFLAGS="-X github.com/jaegertracing/jaeger/internal/version.latestVersion=$JAEGER_VERSION"
  jdate="$(module_time "$TOOLS_DIR/jaeger" github.com/jaegertracing/jaeger)"
  [[ -z "$jdate" ]] || JAEGER_LDFLAGS+=" -X github.com/jaegertracing/jaeger/internal/version.date=$jdate"
fi
build_tool JAEGER jaeger "$JAEGER_VERSION" "$TOOLS_DIR/jaeger" \
  github.com/jaegertracing/jaeger/cmd/jaeger "$JAEGER_LDFLAGS" version

# --- Helm ---------------------------------------------------------------------
HELM_VERSION="$(module_version "$TOOLS_DIR/helm" helm.sh/helm/v3)"
build_tool HELM helm "$HELM_VERSION" "$TOOLS_DIR/helm" helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
  version --short

# --- Prometheus: the server for the node, promtool always ---------------------
PROMETHEUS_VERSION="$(module_version "$TOOLS_DIR/prometheus" github.com/prometheus/prometheus)"
# Module v0.X.Y is Prometheus 3.X.Y (its own version scheme for Go).
PROMETHEUS_RELEASE="$PROMETHEUS_VERSION"
if [[ "$PROMETHEUS_VERSION" =~ ^v0\.([0-9]+)\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 300)); then
  PROMETHEUS_RELEASE="v3.$((BASH_REMATCH[1] - 300)).${BASH_REMATCH[2]}"
fi
PROMETHEUS_LDFLAGS="-X github.com/prometheus/common/version.Version=${PROMETHEUS_RELEASE#v} -X github.com/prometheus/common/version.Branch=release"

if ((API_ONLY == 0)); then
  # --- CoreDNS: a main of our own with only the plugins the node uses ---------
  COREDNS_VERSION="$(module_version "$TOOLS_DIR/coredns" github.com/coredns/coredns)"
  build_tool COREDNS coredns "$COREDNS_VERSION" "$TOOLS_DIR/coredns" . "" -version

  # --- Prometheus, Kubernetes service discovery only ---------------------------
  BUILD_TAGS=remove_all_sd,enable_kubernetes_sd build_tool PROMETHEUS prometheus "$PROMETHEUS_RELEASE" \
    "$TOOLS_DIR/prometheus" github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_LDFLAGS" --version

  # --- crictl: the node's CRI client (sandbox teardown on `down`) -------------
  CRICTL_VERSION="$(module_version "$TOOLS_DIR/cri-tools" sigs.k8s.io/cri-tools)"
  build_tool CRICTL crictl "$CRICTL_VERSION" "$TOOLS_DIR/cri-tools" sigs.k8s.io/cri-tools/cmd/crictl \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" --version
fi

# --- promtool: charts/test.sh checks and unit-tests the chart's alerts ---------
# Built after the server, with its tags, so that on a node build it reuses
# the server's compiled packages and adds little more than its own.
BUILD_TAGS=remove_all_sd,enable_kubernetes_sd build_tool PROMTOOL promtool "$PROMETHEUS_RELEASE" \
  "$TOOLS_DIR/prometheus" github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_LDFLAGS" --version

# --- Gateway API CRDs (downloaded, not built) ---------------------------------
# The tests apply the CRDs Gateway API publishes rather than copies written by
# hand: the module's own files, from the module cache, at the pinned version
# (go.sum checks the download).
# Gateway API v1.7.0's go.mod asks for Go 1.27: for this module alone the go
# command fetches that toolchain through the module proxy (once, about 76 MB)
# instead of the machine's (GOTOOLCHAIN=local above); nothing is built with it.
GATEWAY_API_VERSION="$(module_version "$TOOLS_DIR/gateway-api" sigs.k8s.io/gateway-api)"
gateway_api_dir="$(cd "$TOOLS_DIR/gateway-api" &&
  GOTOOLCHAIN=go1.27.3 go mod download -json sigs.k8s.io/gateway-api | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')" ||
  die "gateway-api $GATEWAY_API_VERSION: go mod download failed"
# Both channels: standard/ and experimental/ (XBackendTrafficPolicy).
PATHS[GATEWAY_API_CRD_DIR]="$gateway_api_dir/config/crd"
for f in standard/gateway.networking.k8s.io_httproutes.yaml experimental/gateway.networking.x-k8s.io_xbackendtrafficpolicies.yaml; do
  [[ -f "${PATHS[GATEWAY_API_CRD_DIR]}/$f" ]] ||
    die "gateway-api $GATEWAY_API_VERSION: no ${PATHS[GATEWAY_API_CRD_DIR]}/$f"
done
log "gateway-api $GATEWAY_API_VERSION: CRDs (standard and experimental channels) in ${PATHS[GATEWAY_API_CRD_DIR]}"

# --- Output -------------------------------------------------------------------
VARS=(KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD JAEGER HELM PROMTOOL)
((API_ONLY)) || VARS+=(KUBELET KUBE_PROXY KUBE_SCHEDULER COREDNS PROMETHEUS CRICTL)
VARS+=(GATEWAY_API_CRD_DIR)
lines=""
for v in "${VARS[@]}"; do
  lines+="$v=${PATHS[$v]}"$'\n'
done
hash="$(printf '%s' "$lines" | sha256sum | cut -c1-12)"
ENV_FILE="$CACHE_DIR/env-$hash.sh"
if [[ ! -f "$ENV_FILE" ]]; then
  {
    echo "# Generated by e2e/build-tools.sh; source this file."
    for v in "${VARS[@]}"; do
      printf 'export %s=%q\n' "$v" "${PATHS[$v]}"
    done
  } >"$ENV_FILE.tmp.$$"
  mv -f "$ENV_FILE.tmp.$$" "$ENV_FILE"
fi

if ((${#BUILT[@]})); then
  log "built ${BUILT[*]} in $((SECONDS - TOTAL_START))s total"
else
  log "all tools cached"
fi
log "env file: $ENV_FILE"

if ((PRINT_ENV_FILE)); then
  printf '%s\n' "$ENV_FILE"
else
  printf '%s' "$lines"
  printf 'REPRISE_TOOLS_ENV=%s\n' "$ENV_FILE"
fi
