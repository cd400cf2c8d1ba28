#!/usr/bin/env bash
# Soak with leak accounting: N cycles (default 1000) of container lifecycles through gantry on
# a private containerd and CRI-O style (examples/soak.rs says what one cycle is), sampling the
# long-lived daemon's fds/threads/anonymous RSS and the node's mounts, cgroups, zombies, sockets, runtime
# files and bundles at the start, middle and end. Prints one table; exits non-zero when
# anything grew beyond its noise bound.
#
#   scripts/soak.sh [--quick] [--cycles N]      (--quick: 100 cycles, what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

cycles=1000
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) cycles=100 ;;
    --cycles) cycles=${2:?--cycles needs a number}; shift ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" != 0 ]; then
  echo "soak.sh: containers need root; run it as root" >&2
  exit 1
fi
scripts/deps.sh

echo "== building gantry and the soak driver (release)"
cargo build --release --quiet
cargo build --release --quiet --example soak
rel="$repo/target/$(rustc -vV | sed -n "s/^host: //p")/release"

work=$(mktemp -d /tmp/gantry-soak.XXXXXX)
ns="gsoak-$$"
sock="$work/containerd.sock"
image=docker.io/gantry/busybox:latest
cd_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$cd_pid" ]; then
    ctr --address "$sock" -n "$ns" containers ls -q 2>/dev/null | while read -r id; do
      ctr --address "$sock" -n "$ns" tasks rm -f "$id" >/dev/null 2>&1
      ctr --address "$sock" -n "$ns" containers rm "$id" >/dev/null 2>&1
    done
    kill "$cd_pid" 2>/dev/null
    wait "$cd_pid" 2>/dev/null
  fi
  for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/cwd" 2>/dev/null)" != "" ] && readlink "$p/cwd" | grep -q "^$work"; then
      kill -9 "${p#/proc/}" 2>/dev/null
    fi
  done
  for r in "$work/rt/$ns" "$work/rt/default"; do
    for id in $(runc --root "$r" list -q 2>/dev/null); do runc --root "$r" delete -f "$id" >/dev/null 2>&1; done
  done
  grep -o " $work[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  for c in /sys/fs/cgroup/*/"$ns"; do find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null; done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT INT TERM

private_containerd_config "$work" "$sock"
cat >"$work/gantry.toml" <<TOML
[shim]
socket_dir = "$work/s"
[runtime]
root = "$work/rt"
TOML
PATH="$rel:$PATH" GANTRY_CONFIG="$work/gantry.toml" containerd --config "$work/containerd.toml" >"$work/containerd.log" 2>&1 &
cd_pid=$!
for _ in $(seq 100); do ctr --address "$sock" version >/dev/null 2>&1 && break; sleep 0.1; done
bash scripts/busybox-image.sh "$work/image" "$image" >/dev/null
ctr --address "$sock" -n "$ns" images import "$work/image/image.tar" >/dev/null

echo "== soak: $cycles cycles"
"$rel/examples/soak" --cycles "$cycles" --shim "$rel/containerd-shim-gantry-v2" --config "$work/gantry.toml" \
  --address "$sock" --namespace "$ns" --image "$image" --rootfs "$work/image/rootfs" \
  --workdir "$work/crio" --socket-dir "$work/s" --runtime-root "$work/rt" --state "$work/state"
