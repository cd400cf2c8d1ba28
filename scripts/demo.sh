#!/usr/bin/env bash
# gantry end to end on a fresh machine: installs what is missing, builds the shim, starts a
# private containerd, and runs a real container through it with `ctr run --runtime
# io.containerd.gantry.v2`, printing what happened (output, exit code, events, shim log).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: containers need root; run it as root" >&2
  exit 1
fi
scripts/deps.sh
echo "== building gantry (release)"
cargo build --release --quiet
# .cargo/config.toml names the target, so release artifacts live under target/<host triple>/.
bin="$repo/target/$(rustc -vV | sed -n "s/^host: //p")/release"

work=$(mktemp -d /tmp/gantry-demo.XXXXXX)
cd_pid=""
ev_pid=""
cleanup() {
  [ -n "$ev_pid" ] && kill "$ev_pid" 2>/dev/null || true
  if [ -n "$cd_pid" ]; then kill "$cd_pid" 2>/dev/null || true; wait "$cd_pid" 2>/dev/null || true; fi
  grep " $work" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
[ -n "${GANTRY_DEMO_KEEP:-}" ] && trap - EXIT

echo "== building a busybox image"
scripts/busybox-image.sh "$work/image" docker.io/gantry/busybox:latest >/dev/null
cat > "$work/gantry.toml" <<TOML
[shim]
socket_dir = "$work/s"
log_level = "debug"
[runtime]
root = "$work/rt"
[events]
log = "$work/events/events.jsonl"
TOML
private_containerd_config "$work" "$work/containerd.sock"
echo "== starting a private containerd ($(containerd --version | awk '{print $3}'))"
PATH="$bin:$PATH" GANTRY_CONFIG="$work/gantry.toml" containerd --config "$work/containerd.toml" >"$work/containerd.log" 2>&1 &
cd_pid=$!
ctr=(ctr --address "$work/containerd.sock" -n demo)
for _ in $(seq 100); do "${ctr[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
"${ctr[@]}" images import "$work/image/image.tar" >/dev/null
"${ctr[@]}" events >"$work/events.log" 2>&1 &
ev_pid=$!
sleep 0.3

echo "== ctr run --runtime io.containerd.gantry.v2 docker.io/gantry/busybox:latest demo"
set +e
"${ctr[@]}" run --rm --runtime io.containerd.gantry.v2 docker.io/gantry/busybox:latest demo \
  sh -c 'echo "hello from a container run by gantry"; echo "pid in container: $$"; echo "hostname: $(hostname)"; exit 3'
status=$?
set -e
sleep 0.3
echo "== container exit status: $status (the command exits 3)"
echo "== task events seen by containerd"
grep -E '/tasks/' "$work/events.log" | sed -E 's/^[0-9-]+ [0-9:.]+ [+0-9]+ UTC //' || true
echo "== gantry daemon log lines (from the bundle's log FIFO, via containerd's log)"
grep '^{"msg"' "$work/containerd.log" | sed -E 's/"time":"[^"]*",//; s/,"runtime":"io.containerd.gantry.v2"//; s/^/  /' | head -20 || true
echo "== gantry's event log (what a CRI-O node gets instead of containerd events)"
sed -E 's/^/  /' "$work/events/events.jsonl" 2>/dev/null | head -8 || true
echo "== a few of the node's metrics (containerd-shim-gantry-v2 metrics --log ...)"
"$bin/containerd-shim-gantry-v2" metrics --log "$work/events/events.jsonl" |
  grep -E '^gantry_(containers_created_total|containers_started_total|exits_total|request_duration_seconds_count|build_info)' |
  sed -E 's/^/  /' || true
left=$(ls "$work/s" 2>/dev/null | wc -l)
echo "== after the run: $left daemon sockets left, $(pgrep -fc "containerd-shim-gantry-v2.*$work" || true) gantry processes left"
[ "$status" = 3 ] && echo "demo OK" || { echo "demo FAILED"; exit 1; }
