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
# user 65532 (nonroot) the Dockerfiles' runtime stages have, the host's CA
# bundle, and /tmp. The sidecar image has a second layer: the Debian packages
# its Dockerfile installs (iptables, for transparent pods' reprise-init) and
# their dependency closure, computed with apt-cache, fetched with
# `apt-get download` (cached in ${REPRISE_TOOLS_DIR:-~/.cache/reprise-tools}/debs-*),
# unpacked with dpkg-deb into a merged-/usr tree, plus the links the
# package's update-alternatives would make (iptables -> iptables-nft, ...).
# User, entrypoint, command, ports, binary path and packages are those of the
# Dockerfiles' runtime stage (e2e/tests/images.rs checks it against
# `e2e/images.sh --spec`).
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

# name|reference|binary (in the image)|user|entrypoint JSON|cmd JSON|exposed ports|Debian packages
spec_lines() {
  cat <<EOF
reprise-controller|ghcr.io/reprise-dev/reprise-controller:dev|/usr/local/bin/reprise-controller|65532:65532|["/usr/local/bin/reprise-controller"]|["run"]|15010 15020|
reprise-sidecar|ghcr.io/reprise-dev/reprise-sidecar:dev|/usr/local/bin/reprise-sidecar|65532:65532|["/usr/local/bin/reprise-sidecar"]|[]|15001|iptables
reprise-e2e-app|reprise.local/e2e-app:dev|/usr/local/bin/reprise-e2e-app|65532:65532|["/usr/local/bin/reprise-e2e-app"]|[]|8080|
pause|reprise.local/pause:dev|/pause|65535:65535|["/pause"]|[]||
jaeger|jaegertracing/jaeger:$(jaeger_tag)|/usr/local/bin/jaeger|65532:65532|["/usr/local/bin/jaeger"]|[]|4317 4318 16686 13133|
EOF
}

spec_json() {
  spec_lines | python3 -c '
import json, sys
out = []
for line in sys.stdin:
    name, ref, binary, user, ep, cmd, ports, packages = line.rstrip("\n").split("|")
    out.append({"name": name, "reference": ref, "binary": binary, "user": user,
                "entrypoint": json.loads(ep), "cmd": json.loads(cmd),
                "ports": [int(p) for p in ports.split()],
                "packages": packages.split()})
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
# Debian packages are installed when missing (lib/apt.sh); jemalloc needs make.
source "$E2E_DIR/lib/apt.sh"
need_make || die "make is required to build the sidecar"

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

# --- Debian packages -----------------------------------------------------------------
# An image's package layer: the Debian packages its spec names and their
# dependency closure, unpacked. Only Debian's package registry is needed
# (the host's apt sources, so the host's release), no container image.
DEB_CACHE="${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}/debs-$(dpkg --print-architecture 2>/dev/null || echo amd64)"

# closure PACKAGE...: every package PACKAGE needs (Depends and Pre-Depends,
# recursively; of alternatives the first real package, of a virtual package
# its first provider) as NAME=VERSION lines, sorted.
closure() {
  python3 - "$@" <<'PY'
import subprocess, sys

def apt_cache(*args):
    return subprocess.run(["apt-cache", *args], capture_output=True, text=True, check=True).stdout

def depends(pkgs):
    """The packages each of pkgs needs directly, in one apt-cache call."""
    lines = apt_cache("depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                      "--no-breaks", "--no-replaces", "--no-enhances", *pkgs).splitlines()
    sections, groups, group = {}, None, []
    for line in lines:
        if not line.startswith(" "):
            groups = sections.setdefault(line.strip(), [])
            continue
        if line.startswith("    "):
            # A provider of the virtual package on the line above.
            if group and group[-1][1] is not None:
                group[-1][1].append(line.strip())
            continue
        kind, _, name = line.strip().partition(": ")
        if kind.lstrip("|") not in ("Depends", "PreDepends"):
            continue
        group.append((name, [] if name.startswith("<") else None))
        if not kind.startswith("|"):
            groups.append(group)
            group = []
    picked = []
    for pkg, groups in sections.items():
        for g in groups:
            real = [n for n, p in g if p is None]
            provided = [x for n, p in g if p for x in p]
            if not real and not provided:
                sys.exit(f"{pkg}: nothing satisfies {[n for n, _ in g]}")
            picked.append((real or provided)[0])
    return picked

seen, level = set(), set(sys.argv[1:])
while level:
    seen |= level
    level = set(depends(sorted(level))) - seen
versions = {}
for para in apt_cache("show", "--no-all-versions", *sorted(seen)).split("\n\n"):
    fields = dict(l.split(": ", 1) for l in para.splitlines() if ": " in l and not l.startswith(" "))
    if "Package" in fields:
        versions[fields["Package"]] = fields["Version"]
for p in sorted(seen):
    print(f"{p}={versions[p]}")
PY
}

# package_root NAME PACKAGE...: unpacks the closure of the PACKAGEs into a
# fresh $OUT/rootfs-NAME, merged-/usr as Debian's own images are, and prints
# that directory.
package_root() {
  local name="$1" root="$OUT/rootfs-$1" pkgs pv pkg ver deb d f
  shift
  for d in apt-cache apt-get dpkg-deb; do
    command -v "$d" >/dev/null || die "$name needs Debian packages ($*): $d is missing"
  done
  pkgs="$(closure "$@")" || die "cannot compute the dependency closure of $* (apt-get update?)"
  mkdir -p "$DEB_CACHE"
  rm -rf "$root"
  mkdir -p "$root"
  for pv in $pkgs; do
    pkg="${pv%%=*}" ver="${pv#*=}"
    # apt-get download names it NAME_VERSION_ARCH.deb, an epoch's colon as %3a.
    deb="$(find "$DEB_CACHE" -maxdepth 1 -name "${pkg}_${ver//:/%3a}_*.deb" | head -1)"
    if [[ -z "$deb" ]]; then
      (cd "$DEB_CACHE" && apt-get download -q "$pv" >/dev/null 2>&1) ||
        (apt-get update -q >/dev/null 2>&1 && cd "$DEB_CACHE" && apt-get download -q "$pv" >/dev/null 2>&1) ||
        die "apt-get download $pv failed"
      deb="$(find "$DEB_CACHE" -maxdepth 1 -name "${pkg}_${ver//:/%3a}_*.deb" | head -1)"
      [[ -n "$deb" ]] || die "apt-get download $pv left no ${pkg}_*.deb in $DEB_CACHE"
    fi
    dpkg-deb -x "$deb" "$root" || die "dpkg-deb -x $deb failed"
  done
  # Merged /usr: /lib, /bin, ... are links into /usr, so /lib64/ld-linux and
  # /usr/lib/... agree whichever path a package used.
  for d in bin sbin lib lib64; do
    if [[ -d "$root/$d" && ! -L "$root/$d" ]]; then
      mkdir -p "$root/usr/$d"
      cp -a "$root/$d/." "$root/usr/$d/"
      rm -rf "${root:?}/$d"
    fi
    ln -s "usr/$d" "$root/$d"
  done
  # What maintainer scripts would have done: update-alternatives' links to
  # the nft variants, the default of Debian's iptables (iptables ->
  # iptables-nft -> xtables-nft-multi; the -legacy ones stay callable).
  for f in "$root"/usr/sbin/*-nft "$root"/usr/sbin/*-nft-save "$root"/usr/sbin/*-nft-restore; do
    [[ -e "$f" || -L "$f" ]] || continue
    f="${f##*/}"
    [[ -e "$root/usr/sbin/${f/-nft/}" ]] || ln -s "$f" "$root/usr/sbin/${f/-nft/}"
  done
  # The mount point of reprise-init's emptyDir: iptables-legacy's lock is
  # /run/xtables.lock, and the root filesystem is read-only in the pod.
  mkdir -p "$root/run"
  # Documentation is dropped, the licences kept.
  find "$root/usr/share/doc" -type f ! -name copyright -delete 2>/dev/null || true
  rm -rf "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/lintian" "$root/usr/share/locale"
  log "$name: $(wc -l <<<"$pkgs") Debian packages for $*: $(cut -d= -f1 <<<"$pkgs" | xargs)"
  echo "$root"
}

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
  packages="$(python3 -c 'import json,sys; print(" ".join(next(s for s in json.load(sys.stdin) if s["name"] == sys.argv[1])["packages"]))' "$name" <<<"$spec")"
  root=""
  if [[ -n "$packages" ]]; then
    # shellcheck disable=SC2086
    root="$(package_root "$name" $packages)" || exit 1
  fi
  SPEC_JSON="$spec" python3 - "$name" "${SRC[$name]}" "$CA_BUNDLE" "$archive" "$root" <<'PY' || die "writing $archive failed"
import gzip, hashlib, io, json, os, stat, sys, tarfile

name, src, ca_bundle, archive, package_root = sys.argv[1:6]
spec = next(s for s in json.loads(os.environ["SPEC_JSON"]) if s["name"] == name)
uid, gid = (int(x) for x in spec["user"].split(":"))

# --- the packages' layer (only with packages), beneath the binary's ---------------
packages = {}  # path -> (TarInfo, bytes or None)
if package_root:
    for top, dirs, files in os.walk(package_root):
        dirs.sort()
        for n in dirs + sorted(files):
            full = os.path.join(top, n)
            path = os.path.relpath(full, package_root)
            st = os.lstat(full)
            t = tarfile.TarInfo(path)
            t.mode = stat.S_IMODE(st.st_mode)
            data = None
            if stat.S_ISLNK(st.st_mode):
                t.type, t.linkname = tarfile.SYMTYPE, os.readlink(full)
            elif stat.S_ISDIR(st.st_mode):
                t.type = tarfile.DIRTYPE
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    data = f.read()
                t.size = len(data)
            else:
                sys.exit(f"{path}: neither a file, a directory nor a link")
            packages[path] = (t, data)

# --- the binary's layer -----------------------------------------------------------
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

def layer(entries):
    """(tar, tar.gz) of entries: sorted, mtime 0, root-owned unless set."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entries):
            t, data = entries[path]
            t.mtime = 0
            t.uname = t.gname = ""
            tar.addfile(t, io.BytesIO(data) if data is not None else None)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as g:
        g.write(raw.getvalue())
    return raw.getvalue(), gz.getvalue()

layers = ([layer(packages)] if packages else []) + [layer(entries)]

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
    "rootfs": {"type": "layers", "diff_ids": [sha(t) for t, _ in layers]},
    "history": ([{"created": "1970-01-01T00:00:00Z",
                  "created_by": "e2e/images.sh: Debian packages " + " ".join(spec["packages"])}]
                if packages else [])
               + [{"created": "1970-01-01T00:00:00Z", "created_by": "e2e/images.sh"}],
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
                "digest": sha(gz), "size": len(gz)} for _, gz in layers],
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
docker_manifest = [{"Config": blob(config_b), "RepoTags": [ref], "Layers": [blob(gz) for _, gz in layers]}]
files = [("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
         ("index.json", json.dumps(index, sort_keys=True).encode()),
         ("manifest.json", json.dumps(docker_manifest).encode()),
         (blob(config_b), config_b), (blob(manifest_b), manifest_b)] + [(blob(gz), gz) for _, gz in layers]
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
print(f"{ref} {sha(manifest_b)} {' + '.join(f'{len(gz) / 1e6:.1f}' for _, gz in layers)} MB")
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
