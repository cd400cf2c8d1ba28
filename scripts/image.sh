#!/usr/bin/env bash
# Builds gantry's fleet installer image (the DaemonSet image, like kata-deploy's): an OCI
# image archive holding only the static shim binary and the runtime-conf/ tree,
#
#   /gantry/containerd-shim-gantry-v2       0755 (runs as `install --host /host --payload /gantry`)
#   /gantry/runtime-conf/...                files 0644, directories 0755
#   /host (0755), /tmp (1777)               empty
#
# and nothing else: the binary is static-pie, so the image needs no libc and has no shell.
# It is written by hand (tar, gzip, sha256sum) instead of with `docker build`: no Docker daemon
# or registry is needed, and the result is reproducible: the same binary and runtime-conf/
# (and the same tar and gzip) give the same bytes and manifest digest. Modes, owners and
# mtimes are set explicitly (SOURCE_DATE_EPOCH, default 0), so umask and checkout time do not
# leak in. The output is an `oci-archive` that `ctr images import` and
# `skopeo copy oci-archive:FILE ...` take. Run with --help for the options.
set -euo pipefail
shopt -s inherit_errexit
umask 022

readonly SHIM_NAME=containerd-shim-gantry-v2
readonly PROG=${0##*/}
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)
readonly SCRIPT_DIR REPO_ROOT
readonly CONF_SRC=$REPO_ROOT/runtime-conf

# .cargo/config.toml names the target: release artifacts live under target/<host triple>/.
BINARY=$REPO_ROOT/target/$( (rustc -vV 2>/dev/null || true) | sed -n "s/^host: //p")/release/$SHIM_NAME
OUTPUT=$REPO_ROOT/target/gantry-image.tar
NAME=

usage() {
    cat <<EOF
Usage: $PROG [--binary PATH] [--output FILE] [--name REF]

Builds gantry's installer image as a reproducible OCI image archive, without a Docker daemon.

Options:
  --binary PATH   the static shim binary to ship
                  (default: <repo>/target/<host triple>/release/$SHIM_NAME)
  --output FILE   the archive to write (default: <repo>/target/gantry-image.tar)
  --name REF      the image name, with a tag (default: docker.io/gantry/installer:VERSION,
                  VERSION from the binary's '-v' output, else from Cargo.toml)
  -h, --help      show this help

Environment:
  SOURCE_DATE_EPOCH   the time stamped on the files and in the config's 'created'
                      (default: 0, 1970-01-01T00:00:00Z)

Then: ctr -n k8s.io images import FILE, or
      skopeo copy oci-archive:FILE docker://REGISTRY/gantry/installer:TAG
EOF
}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case $1 in
        --binary) [ $# -ge 2 ] || die "$1 needs a value"; BINARY=$2; shift 2 ;;
        --output) [ $# -ge 2 ] || die "$1 needs a value"; OUTPUT=$2; shift 2 ;;
        --name) [ $# -ge 2 ] || die "$1 needs a value"; NAME=$2; shift 2 ;;
        --binary=*) BINARY=${1#*=}; shift ;;
        --output=*) OUTPUT=${1#*=}; shift ;;
        --name=*) NAME=${1#*=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

for tool in tar gzip sha256sum stat timeout find awk od; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is needed"
done
[ -f "$BINARY" ] || die "no binary at $BINARY (build it with 'cargo build --release', or pass --binary)"
[ -d "$CONF_SRC" ] || die "no runtime-conf/ at $CONF_SRC"
# The image has no libc or loader: a dynamically linked binary could not start in it.
if command -v ldd >/dev/null 2>&1; then
    linkage=$(ldd "$BINARY" 2>&1 || true)
    case $linkage in
        *"statically linked"* | *"not a dynamic executable"*) ;;
        *) die "$BINARY is dynamically linked (ldd lists its libraries); the image has no libc or loader" ;;
    esac
fi

epoch=${SOURCE_DATE_EPOCH:-0}
[[ $epoch =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH must be a number of seconds, not '$epoch'"
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

# Version (and revision) as the binary reports them; it may not run here (another
# architecture), then Cargo.toml's version. Only plain characters go into the JSON.
probe=$(timeout 10 "$BINARY" -v </dev/null 2>/dev/null || true)
version=$(printf '%s\n' "$probe" | sed -n 's/^[[:space:]]*Version:[[:space:]]*//p' | head -n1)
revision=$(printf '%s\n' "$probe" | sed -n 's/^[[:space:]]*Revision:[[:space:]]*//p' | head -n1)
[[ $version =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || version=
[[ $revision =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || revision=
if [ -z "$version" ]; then
    version=$(sed -n 's/^version[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$REPO_ROOT/Cargo.toml" | head -n1)
    [[ $version =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || die "no usable version in $REPO_ROOT/Cargo.toml"
fi

# The name: [registry/]path:tag. A tag is required (a reference by digest cannot name an image
# that is being built); '+' is not allowed in tags, so a version's build metadata becomes '_'.
NAME=${NAME:-docker.io/gantry/installer:${version//+/_}}
if ! [[ $NAME =~ ^[a-z0-9][a-z0-9._/:-]*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ && ${NAME##*/} == *:* ]]; then
    die "--name '$NAME' is not of the form [registry/]path:tag (lower-case path, a tag)"
fi
tag=${NAME##*:}

arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
# The image is labelled with this host's architecture: refuse a binary built for another one
# (read from its little-endian ELF header's e_machine) rather than mislabel it.
elf=$(od -An -tx1 -N20 "$BINARY" | tr -d ' \n')
case ${elf:0:8}${elf:10:2}:${elf:36:4} in
    7f454c4601:3e00) bin_arch=amd64 ;;
    7f454c4601:b700) bin_arch=arm64 ;;
    7f454c4601:1500) bin_arch=ppc64el ;;
    7f454c4601:f300) bin_arch=riscv64 ;;
    *) bin_arch=$arch ;;
esac
[ "$bin_arch" = "$arch" ] || die "$BINARY is built for $bin_arch, this host is $arch (dpkg); build the image on a host of that architecture"

work=$(mktemp -d "${TMPDIR:-/tmp}/gantry-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/rootfs
layout=$work/layout

# A deterministic tar: sorted names, fixed mtime, root-owned, numeric ids, GNU format (which
# stores no atime/ctime and no pax headers with the process id in them).
det_tar() {
    tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=gnu "$@"
}

# blob FILE: moves FILE into the layout's blobs by its digest; prints "DIGEST SIZE".
blob() {
    local sha size
    sha=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    mv "$1" "$layout/blobs/sha256/$sha"
    chmod 0644 "$layout/blobs/sha256/$sha"
    echo "sha256:$sha $size"
}

# The root filesystem, every mode explicit.
mkdir -p "$stage/gantry" "$stage/host" "$stage/tmp"
cp "$BINARY" "$stage/gantry/$SHIM_NAME"
cp -R "$CONF_SRC" "$stage/gantry/runtime-conf"
find "$stage" -type d -exec chmod 0755 {} +
find "$stage/gantry/runtime-conf" -type f -exec chmod 0644 {} +
chmod 0755 "$stage/gantry/$SHIM_NAME"
chmod 1777 "$stage/tmp"

mkdir -p "$layout/blobs/sha256"
# Entries named without a leading "./" and without an entry for "/" itself (whose mode
# would otherwise be the temporary directory's).
det_tar -C "$stage" -cf "$work/layer.tar" gantry host tmp
diff_id=sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
layer_raw_size=$(stat -c %s "$work/layer.tar")
gzip -n -9 -c "$work/layer.tar" >"$work/layer.tar.gz"
rm -f "$work/layer.tar"
desc=$(blob "$work/layer.tar.gz")
read -r layer_digest layer_size <<<"$desc"

labels="\"org.opencontainers.image.title\":\"gantry-installer\""
labels+=",\"org.opencontainers.image.description\":\"Installs the gantry containerd shim v2 runtime handler on a node (DaemonSet payload)\""
labels+=",\"org.opencontainers.image.version\":\"$version\""
[ -z "$revision" ] || labels+=",\"org.opencontainers.image.revision\":\"$revision\""
cmd_json="[\"/gantry/$SHIM_NAME\",\"install\",\"--host\",\"/host\",\"--payload\",\"/gantry\"]"
path_env="PATH=/gantry:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
printf '%s\n' "{\"architecture\":\"$arch\",\"os\":\"linux\",\"created\":\"$created\",\"config\":{\"Env\":[\"$path_env\"],\"Cmd\":$cmd_json,\"WorkingDir\":\"/\",\"Labels\":{$labels}},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"$diff_id\"]},\"history\":[{\"created\":\"$created\",\"created_by\":\"gantry scripts/image.sh\"}]}" \
    >"$work/config.json"
desc=$(blob "$work/config.json")
read -r config_digest config_size <<<"$desc"

printf '%s\n' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"$config_digest\",\"size\":$config_size},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"$layer_digest\",\"size\":$layer_size}]}" \
    >"$work/manifest.json"
desc=$(blob "$work/manifest.json")
read -r manifest_digest manifest_size <<<"$desc"

printf '%s\n' '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
# io.containerd.image.name names the image on `ctr images import`; ref.name (the tag) is what
# `skopeo ... oci-archive:FILE:TAG` selects.
printf '%s\n' "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"$manifest_digest\",\"size\":$manifest_size,\"annotations\":{\"io.containerd.image.name\":\"$NAME\",\"org.opencontainers.image.ref.name\":\"$tag\"},\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"}}]}" \
    >"$layout/index.json"
chmod 0644 "$layout/oci-layout" "$layout/index.json"
chmod 0755 "$layout/blobs" "$layout/blobs/sha256"

# Written next to OUTPUT and renamed: a reader never sees half an archive.
mkdir -p "$(dirname -- "$OUTPUT")"
partial=$OUTPUT.partial.$$
trap 'rm -rf "$work" "$partial"' EXIT
det_tar -C "$layout" -cf "$partial" oci-layout index.json blobs
chmod 0644 "$partial"
mv -f "$partial" "$OUTPUT"

mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
archive_size=$(stat -c %s "$OUTPUT")
printf 'image:           %s\n' "$NAME"
printf 'archive:         %s\n' "$OUTPUT"
printf 'manifest digest: %s\n' "$manifest_digest"
printf 'layer digest:    %s\n' "$layer_digest"
printf 'archive size:    %s bytes (%s)\n' "$archive_size" "$(mib "$archive_size")"
printf 'layer size:      %s bytes (%s) compressed, %s bytes (%s) uncompressed\n' \
    "$layer_size" "$(mib "$layer_size")" "$layer_raw_size" "$(mib "$layer_raw_size")"
