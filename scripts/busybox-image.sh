#!/usr/bin/env bash
# Builds the test/demo image from Debian's busybox-static: a rootfs directory and an OCI
# image archive that `ctr images import` takes. No network needed.
#
#   scripts/busybox-image.sh OUTDIR [IMAGE_NAME] [COMMAND...]
#
# Writes OUTDIR/rootfs/ and OUTDIR/image.tar (named IMAGE_NAME, default
# docker.io/gantry/busybox:latest; its default command is COMMAND, default `sh`; with the
# command `/pause` the image also holds a pause program built from integration/fixtures).
set -euo pipefail

out=${1:?usage: busybox-image.sh OUTDIR [IMAGE_NAME] [COMMAND...]}
name=${2:-docker.io/gantry/busybox:latest}
shift $(( $# >= 2 ? 2 : $# ))
cmd_json='["sh"]'
if [ $# -gt 0 ]; then
  cmd_json="[$(printf '"%s",' "$@" | sed 's/,$//')]"
fi

bb=/bin/busybox
[ -x "$bb" ] || bb=$(command -v busybox || true)
if [ -z "$bb" ] || ! { ldd "$bb" 2>&1 || true; } | grep -q 'not a dynamic'; then
  echo "busybox-image.sh: a static busybox is needed (apt-get install busybox-static)" >&2
  exit 1
fi

mkdir -p "$out"
rootfs="$out/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,etc,root,var/run}
cp "$bb" "$rootfs/bin/busybox"
for applet in $("$rootfs/bin/busybox" --list); do
  [ "$applet" = busybox ] && continue
  ln -sf busybox "$rootfs/bin/$applet"
done
chmod 1777 "$rootfs/tmp"
# A pause image (COMMAND /pause) gets a real pause program, built from the test fixture.
if [ "$cmd_json" = '["/pause"]' ]; then
  here=$(cd "$(dirname "$0")/.." && pwd)
  # GANTRY_PAUSE_BIN: one built beforehand (the node lane's guest has no compiler).
  if [ -n "${GANTRY_PAUSE_BIN:-}" ]; then
    cp "$GANTRY_PAUSE_BIN" "$rootfs/pause"
  else
    cc -static -Os -o "$rootfs/pause" "$here/integration/fixtures/pause.c"
  fi
fi
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$rootfs/etc/group"

# OCI image layout, then a tar of it.
layout=$(mktemp -d)
trap 'rm -rf "$layout"' EXIT
mkdir -p "$layout/blobs/sha256"
tar -C "$rootfs" --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -cf "$layout/layer.tar" .
layer_sha=$(sha256sum "$layout/layer.tar" | cut -d' ' -f1)
layer_size=$(stat -c %s "$layout/layer.tar")
mv "$layout/layer.tar" "$layout/blobs/sha256/$layer_sha"

arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
cat > "$layout/config.json" <<JSON
{"architecture":"$arch","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":$cmd_json,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:$layer_sha"]},"history":[{"created_by":"gantry busybox-image.sh"}]}
JSON
config_sha=$(sha256sum "$layout/config.json" | cut -d' ' -f1)
config_size=$(stat -c %s "$layout/config.json")
mv "$layout/config.json" "$layout/blobs/sha256/$config_sha"

cat > "$layout/manifest.json" <<JSON
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config_sha","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:$layer_sha","size":$layer_size}]}
JSON
manifest_sha=$(sha256sum "$layout/manifest.json" | cut -d' ' -f1)
manifest_size=$(stat -c %s "$layout/manifest.json")
mv "$layout/manifest.json" "$layout/blobs/sha256/$manifest_sha"

echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
cat > "$layout/index.json" <<JSON
{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest_sha","size":$manifest_size,"annotations":{"io.containerd.image.name":"$name","org.opencontainers.image.ref.name":"${name##*:}"},"platform":{"architecture":"$arch","os":"linux"}}]}
JSON
tar -C "$layout" -cf "$out/image.tar" oci-layout index.json blobs
echo "$out/image.tar"
