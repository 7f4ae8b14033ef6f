#!/usr/bin/env bash
# Builds the images the e2e node runs, as OCI image archives, without Docker
# or a registry, and loads them into the node's containerd when it runs:
#
#   ghcr.io/reprise-dev/reprise-controller:dev  reprise-controller (release, static)
#   ghcr.io/reprise-dev/reprise-sidecar:dev     reprise-sidecar (release, static)
#   reprise.local/e2e-app:dev                   the tests' app (e2e/src/bin/reprise-e2e-app.rs)
#   reprise.local/pause:dev                     the pod sandbox (e2e/src/bin/reprise-pause.rs)
#   jaegertracing/jaeger:<chart tag>            Jaeger v2 as e2e/build-tools.sh builds it
#
# The first two are tagged as the chart's default repositories, so
# `helm install ... --set image.controller.tag=dev --set image.sidecar.tag=dev`
# uses them; Jaeger gets the chart's image.jaeger tag. Each image is one
# layer on no base: the static binary, /etc/passwd and /etc/group with the
# user 65532 (nonroot) the Dockerfiles' distroless runtime stage has, the
# host's CA bundle, and /tmp. User, entrypoint, command, ports and binary path
# are those of the Dockerfiles' runtime stage (e2e/tests/images.rs checks it
# against `e2e/images.sh --spec`).
#
# Usage:
#   e2e/images.sh [DIR]          build into DIR/images/*.tar, import into the
#                                node of the cluster in DIR if it runs
#                                (DIR: as e2e/cluster.sh, default
#                                ${REPRISE_E2E_DIR:-/tmp/reprise-e2e})
#   e2e/images.sh --spec         print the image definitions as JSON, build nothing
#   e2e/images.sh --binaries     only build the static binaries (e2e/test.sh does
#                                it in the background while the Rust tests run)
#
# The archives are OCI image layouts (oci-layout, index.json, blobs/) that
# also carry a Docker `manifest.json`, so `docker load`, `podman load`,
# `ctr images import` and `kind load image-archive` all take them. Layers are
# reproducible: fixed mtimes and owners, sorted entries, gzip without a
# timestamp; the same binaries give the same digests.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }
log() { printf '[images %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$E2E_DIR/.." && pwd)"
TARGET="${REPRISE_IMAGES_TARGET:-x86_64-unknown-linux-gnu}"
BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/$TARGET/release"

# The chart's Jaeger tag, so jaeger.enabled=true finds the image.
jaeger_tag() {
  awk '/^  jaeger:/ {j=1} j && /^    tag:/ {gsub(/"/, "", $2); print $2; exit}' "$ROOT/charts/reprise/values.yaml"
}

# name|reference|binary (in the image)|user|entrypoint JSON|cmd JSON|exposed ports
spec_lines() {
  cat <<EOF
reprise-controller|ghcr.io/reprise-dev/reprise-controller:dev|/usr/local/bin/reprise-controller|65532:65532|["/usr/local/bin/reprise-controller"]|["run"]|15010 15020
reprise-sidecar|ghcr.io/reprise-dev/reprise-sidecar:dev|/usr/local/bin/reprise-sidecar|65532:65532|["/usr/local/bin/reprise-sidecar"]|[]|15001
reprise-e2e-app|reprise.local/e2e-app:dev|/usr/local/bin/reprise-e2e-app|65532:65532|["/usr/local/bin/reprise-e2e-app"]|[]|8080
pause|reprise.local/pause:dev|/pause|65535:65535|["/pause"]|[]|
jaeger|jaegertracing/jaeger:$(jaeger_tag)|/usr/local/bin/jaeger|65532:65532|["/usr/local/bin/jaeger"]|[]|4317 4318 16686 13133
EOF
}

spec_json() {
  spec_lines | python3 -c '
import json, sys
out = []
for line in sys.stdin:
    name, ref, binary, user, ep, cmd, ports = line.rstrip("\n").split("|")
    out.append({"name": name, "reference": ref, "binary": binary, "user": user,
                "entrypoint": json.loads(ep), "cmd": json.loads(cmd),
                "ports": [int(p) for p in ports.split()]})
print(json.dumps(out, indent=2))'
}

BINARIES_ONLY=0
case "${1:-}" in
  --spec)
    spec_json
    exit 0
    ;;
  --binaries)
    BINARIES_ONLY=1
    shift
    ;;
  -h | --help)
    usage
    exit 0
    ;;
  -*) die "unknown option $1" ;;
esac
(($# <= 1)) || die "too many arguments: $*"
command -v python3 >/dev/null || die "python3 is required"
command -v cargo >/dev/null || die "cargo is required"

# is_static FILE: ldd names no library and no dynamic loader (static and
# static-pie binaries: "statically linked" / "not a dynamic executable").
is_static() {
  ! ldd "$1" 2>&1 | grep -qE '=>|ld-linux'
}

# --- Binaries ----------------------------------------------------------------------
# Static glibc binaries (+crt-static): no libraries needed in the image. With
# --target, RUSTFLAGS apply to the binaries only, not to build scripts and
# proc macros, and the output goes to target/<triple>/release.
t0=$SECONDS
log "building release binaries (static, $TARGET): reprise-controller, reprise-sidecar, reprise-e2e-app, reprise-pause"
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --release --locked --quiet --target "$TARGET" \
  -p reprise-controller -p reprise-sidecar -p reprise-e2e \
  --bin reprise-controller --bin reprise-sidecar --bin reprise-e2e-app --bin reprise-pause ||
  die "cargo build failed"
log "binaries built in $((SECONDS - t0))s"
for b in reprise-controller reprise-sidecar reprise-e2e-app reprise-pause; do
  [[ -x "$BIN_DIR/$b" ]] || die "$BIN_DIR/$b missing after the build"
  is_static "$BIN_DIR/$b" || die "$BIN_DIR/$b is dynamically linked: $(ldd "$BIN_DIR/$b" 2>&1 | tr '\n' ' ')"
done
((BINARIES_ONLY == 0)) || exit 0
DIR="${1:-${REPRISE_E2E_DIR:-/tmp/reprise-e2e}}"
mkdir -p "$DIR/images"
DIR="$(cd "$DIR" && pwd)"
OUT="$DIR/images"

envfile="$("$E2E_DIR/build-tools.sh" --env-file --api-only)" || die "e2e/build-tools.sh failed"
# shellcheck disable=SC1090
source "$envfile"
[[ -x "${JAEGER:-}" ]] || die "no Jaeger binary from e2e/build-tools.sh"
is_static "$JAEGER" || die "$JAEGER is dynamically linked"

CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
[[ -s "$CA_BUNDLE" ]] || die "$CA_BUNDLE missing (apt-get install ca-certificates)"

# --- Archives ------------------------------------------------------------------------
# source path for each image's binary
declare -A SRC=(
  [reprise-controller]="$BIN_DIR/reprise-controller"
  [reprise-sidecar]="$BIN_DIR/reprise-sidecar"
  [reprise-e2e-app]="$BIN_DIR/reprise-e2e-app"
  [pause]="$BIN_DIR/reprise-pause"
  [jaeger]="$JAEGER"
)
spec="$(spec_json)"
ARCHIVES=()
while IFS= read -r name; do
  archive="$OUT/$name.tar"
  SPEC_JSON="$spec" python3 - "$name" "${SRC[$name]}" "$CA_BUNDLE" "$archive" <<'PY' || die "writing $archive failed"
import gzip, hashlib, io, json, os, sys, tarfile

name, src, ca_bundle, archive = sys.argv[1:5]
spec = next(s for s in json.loads(os.environ["SPEC_JSON"]) if s["name"] == name)
uid, gid = (int(x) for x in spec["user"].split(":"))

# --- the one layer --------------------------------------------------------------
entries = {}  # path -> (TarInfo, bytes or None)
def add_dir(path, mode=0o755, owner=0):
    parts = path.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent not in entries:
            t = tarfile.TarInfo(parent)
            t.type, t.mode = tarfile.DIRTYPE, 0o755
            entries[parent] = (t, None)
    t = tarfile.TarInfo(path)
    t.type, t.mode, t.uid, t.gid = tarfile.DIRTYPE, mode, owner, owner
    entries[path] = (t, None)
def add_file(path, data, mode=0o644):
    if "/" in path and os.path.dirname(path) not in entries:
        add_dir(os.path.dirname(path))
    t = tarfile.TarInfo(path)
    t.size, t.mode = len(data), mode
    entries[path] = (t, data)

passwd = ("root:x:0:0:root:/root:/sbin/nologin\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
          f"nonroot:x:{uid}:{gid}:nonroot:/home/nonroot:/sbin/nologin\n")
group = f"root:x:0:\nnobody:x:65534:\nnonroot:x:{gid}:\n"
add_dir("etc")
add_file("etc/passwd", passwd.encode())
add_file("etc/group", group.encode())
add_file("etc/nsswitch.conf", b"hosts: files dns\n")
add_dir("etc/ssl/certs")
with open(ca_bundle, "rb") as f:
    add_file("etc/ssl/certs/ca-certificates.crt", f.read())
add_dir("tmp", 0o1777)
add_dir("home/nonroot", 0o700, uid)
binary = spec["binary"].lstrip("/")
with open(src, "rb") as f:
    add_file(binary, f.read(), 0o755)

raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for path in sorted(entries):
        t, data = entries[path]
        t.mtime = 0
        t.uname = t.gname = ""
        tar.addfile(t, io.BytesIO(data) if data is not None else None)
layer_tar = raw.getvalue()
gz = io.BytesIO()
with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as g:
    g.write(layer_tar)
layer_gz = gz.getvalue()

def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()

config = {
    "architecture": "amd64",
    "os": "linux",
    "created": "1970-01-01T00:00:00Z",
    "config": {
        "User": spec["user"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
        "Entrypoint": spec["entrypoint"],
        "WorkingDir": "/",
        "Labels": {"org.opencontainers.image.source": "reprise e2e/images.sh"},
    },
    "rootfs": {"type": "layers", "diff_ids": [sha(layer_tar)]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "e2e/images.sh"}],
}
if spec["cmd"]:
    config["config"]["Cmd"] = spec["cmd"]
if spec["ports"]:
    config["config"]["ExposedPorts"] = {f"{p}/tcp": {} for p in spec["ports"]}
config_b = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
               "digest": sha(config_b), "size": len(config_b)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": sha(layer_gz), "size": len(layer_gz)}],
}
manifest_b = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
ref = spec["reference"]
# The CRI looks images up by their normalized name: a reference without a
# registry host is a Docker Hub one (jaegertracing/jaeger -> docker.io/...).
first = ref.split("/", 1)[0]
if "/" not in ref:
    ref = "docker.io/library/" + ref
elif "." not in first and ":" not in first and first != "localhost":
    ref = "docker.io/" + ref
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha(manifest_b), "size": len(manifest_b),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
    }],
}
blob = lambda b: "blobs/sha256/" + hashlib.sha256(b).hexdigest()
docker_manifest = [{"Config": blob(config_b), "RepoTags": [ref], "Layers": [blob(layer_gz)]}]
files = [("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
         ("index.json", json.dumps(index, sort_keys=True).encode()),
         ("manifest.json", json.dumps(docker_manifest).encode()),
         (blob(config_b), config_b), (blob(manifest_b), manifest_b), (blob(layer_gz), layer_gz)]
tmp = archive + ".tmp"
with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for d in ("blobs", "blobs/sha256"):
        t = tarfile.TarInfo(d)
        t.type, t.mode, t.mtime = tarfile.DIRTYPE, 0o755, 0
        tar.addfile(t)
    for path, data in files:
        t = tarfile.TarInfo(path)
        t.size, t.mode, t.mtime = len(data), 0o644, 0
        tar.addfile(t, io.BytesIO(data))
os.replace(tmp, archive)
print(f"{ref} {sha(manifest_b)} {len(layer_gz) / 1e6:.1f} MB")
PY
  log "$name: $archive ($(du -h "$archive" | cut -f1))"
  ARCHIVES+=("$archive")
done < <(python3 -c 'import json,sys; [print(s["name"]) for s in json.load(sys.stdin)]' <<<"$spec")
log "archives in $OUT"

# --- Load into the node ----------------------------------------------------------------
if bash "$E2E_DIR/cluster.sh" status "$DIR" >/dev/null 2>&1 || [[ -S "$DIR/node/containerd/containerd.sock" ]]; then
  bash "$E2E_DIR/cluster.sh" import "$DIR" "${ARCHIVES[@]}"
else
  log "no node runs in $DIR; load them later with: e2e/cluster.sh import $DIR ${ARCHIVES[*]}"
fi
log "done in $((SECONDS - t0))s"
