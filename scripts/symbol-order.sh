#!/usr/bin/env bash
# Regenerates link/symbol-order.txt, the list of functions a gantry `start` and daemon actually
# run over containers' lives. build.rs hands it to the linker (lld's --symbol-ordering-file),
# which lays those functions out first and contiguously. A daemon then maps a dense run of hot
# code instead of touching (and, through the kernel's 64 KiB fault-around, mapping) pages all
# over the executable: resident memory per shim and page faults at every exec drop.
#
#   scripts/symbol-order.sh
#
# How: builds the release binary without the list (the release profile keeps symbols; install.sh
# strips what it installs, so names here are exactly the shipped build's), starts a private containerd,
# runs containers through gantry with runc and crun (run, exec, metrics, pause/resume, kill,
# delete, failing create) while valgrind's callgrind follows `start` into the daemon, and
# collects every function executed. Names are the linker's (mangled): rerun after dependency
# or toolchain updates; a stale list only orders less, it never breaks a build.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
[ "$(id -u)" = 0 ] || { echo "symbol-order.sh: run as root (containers)" >&2; exit 1; }
scripts/deps.sh
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }

echo "== release build without the list"
GANTRY_SYMBOL_ORDER=off cargo build --release --quiet --bin containerd-shim-gantry-v2
bin="$repo/target/$(rustc -vV | sed -n 's/^host: //p')/release/containerd-shim-gantry-v2"

work=$(mktemp -d /tmp/gantry-order.XXXXXX)
sock=$work/containerd.sock
ns=order
cd_pid=""
cleanup() {
  set +e
  for c in $(ctr --address "$sock" -n $ns containers ls -q 2>/dev/null); do
    ctr --address "$sock" -n $ns tasks rm -f "$c" >/dev/null 2>&1
    ctr --address "$sock" -n $ns containers rm "$c" >/dev/null 2>&1
  done
  [ -n "$cd_pid" ] && kill "$cd_pid" 2>/dev/null && wait "$cd_pid" 2>/dev/null
  grep " $work" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
  find /sys/fs/cgroup/*/$ns -depth -type d -exec rmdir {} \; 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/bin" "$work/cg"
cat >"$work/bin/containerd-shim-gantry-v2" <<SH
#!/bin/sh
exec valgrind -q --log-file=$work/vg.%p.log --vgdb=no --tool=callgrind --trace-children=yes --trace-children-skip='*runc*,*crun*' \\
  --demangle=no --compress-strings=no --compress-pos=no --callgrind-out-file=$work/cg/cg.%p \\
  $bin "\$@"
SH
chmod +x "$work/bin/containerd-shim-gantry-v2"
for rt in runc crun; do
  printf '[shim]\nsocket_dir = "%s/s"\n[runtime]\nbinary = "%s"\nroot = "%s/rt"\n' "$work" "$rt" "$work" >"$work/$rt.toml"
done
private_containerd_config "$work" "$sock"
# Under valgrind /proc/self/exe names valgrind: the daemon re-executes the real binary (itself
# traced) for its mount helper and sandbox-init instead.
GANTRY_SELF_EXE="$bin" PATH="$work/bin:$PATH" containerd --config "$work/containerd.toml" >"$work/containerd.log" 2>&1 &
cd_pid=$!
c() { ctr --address "$sock" -n $ns "$@"; }
for _ in $(seq 100); do c version >/dev/null 2>&1 && break; sleep 0.1; done
scripts/busybox-image.sh "$work/image" docker.io/gantry/busybox:latest >/dev/null
c images import "$work/image/image.tar" >/dev/null
img=docker.io/gantry/busybox:latest

echo "== containers under callgrind"
for rt in runc crun; do
  opts=(--runtime io.containerd.gantry.v2 --runtime-config-path "$work/$rt.toml")
  c run --rm "${opts[@]}" $img "once-$rt" sh -c 'echo hello; echo oops >&2; exit 3' >/dev/null 2>&1 || true
  c run -d "${opts[@]}" $img "long-$rt" sleep 600 >/dev/null
  c task exec --exec-id e1 "long-$rt" sh -c 'echo exec' >/dev/null
  c task exec --exec-id e2 "long-$rt" false >/dev/null || true
  c task metrics "long-$rt" >/dev/null
  c task pause "long-$rt" && c task resume "long-$rt"
  c task ps "long-$rt" >/dev/null
  c task kill -s KILL "long-$rt"
  for _ in $(seq 100); do c task ls | grep -q "long-$rt.*STOPPED" && break; sleep 0.2; done
  c task rm "long-$rt" >/dev/null
  c containers rm "long-$rt"
  c run --rm "${opts[@]}" $img "bad-$rt" /no/such/binary >/dev/null 2>&1 || true
done
c containers ls -q | while read -r id; do c tasks rm -f "$id" >/dev/null 2>&1 || true; c containers rm "$id" 2>/dev/null || true; done
for _ in $(seq 100); do pgrep -f "valgrind.*$work" >/dev/null || break; sleep 0.2; done

echo "== writing link/symbol-order.txt"
mkdir -p "$repo/link"
# Every function with a cost line, hottest first (by instructions, summed over all runs).
awk '/^fn=/ { fn = substr($0, 4); sub(/\047[0-9]+$/, "", fn); next }
     /^[0-9+-]/ && fn != "" { n = split($0, f, " "); if (n >= 2) cost[fn] += f[2] }
     /^(cfn|cfi|cob|calls)=/ { next }
     END { for (k in cost) print cost[k], k }' "$work"/cg/cg.* |
  sort -k1,1nr -k2 | awk '{print $2}' | grep -v -e '^0x' -e '^(' >"$repo/link/symbol-order.txt"
echo "$(wc -l <"$repo/link/symbol-order.txt") functions from $(ls "$work"/cg | wc -l) processes"
echo "== relinking with the list"
cargo build --release --quiet --bin containerd-shim-gantry-v2
