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
# delete, failing create) and, through examples/shim_driver.rs, pods started as CRI-O starts
# them (sandbox fast path, no event publisher), while valgrind's callgrind follows `start` into
# the daemon, and collects every function executed. What a daemon runs once it has settled
# and dropped its code pages comes first (the pages a pod's daemon keeps mapped while its containers
# run), then the rest of the daemon's functions (Create, Start), then those only `start` runs,
# then those only the mount helper runs: code a daemon never runs stays out of its pages.
# `sandbox-init` is not traced (under valgrind it may not raise a container's rlimits): its
# code stays out of the ordered block altogether. Names are the linker's (mangled): rerun after dependency
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
# Apart: built together, the example's dev-dependency features (tokio's) would be unified into
# the binary's build, and every mangled name's hash would differ from the shipped build's.
cargo build --release --quiet --example shim_driver
driver="$repo/target/$(rustc -vV | sed -n 's/^host: //p')/release/examples/shim_driver"
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
exec valgrind -q --log-file=$work/vg.%p.log --vgdb=no --tool=callgrind --dump-after='*release_code_pages*' --dump-before='*shim_ttrpc_async..*Method\$u20\$as\$u20\$ttrpc*' --trace-children=yes --trace-children-skip='*runc*,*crun*' --trace-children-skip-by-arg=sandbox-init \\
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
  # Long enough for the daemon to settle (settle::SETTLE_AFTER, slower under callgrind): what
  # it runs from then on is what a running pod's daemon keeps mapped.
  c task ls >/dev/null; sleep 6
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

echo "== CRI-O-style pods under callgrind (shim_driver --pod --engine crio)"
scripts/busybox-image.sh "$work/pause" docker.io/gantry/pause:latest /pause >/dev/null
for rt in runc crun; do
  GANTRY_SELF_EXE="$bin" "$driver" --shim "gantry=$work/bin/containerd-shim-gantry-v2" \
    --config "gantry=$work/$rt.toml" --engine crio --pod "$work/pause/rootfs" \
    --rootfs "$work/image/rootfs" --workdir "$work/pod-$rt" --address "$sock" \
    --ttrpc-address "$sock.ttrpc" --namespace "$ns-pod" --runs 2 --warmup 0 >/dev/null
done
for _ in $(seq 100); do pgrep -f "valgrind.*$work" >/dev/null || break; sleep 0.2; done

echo "== writing link/symbol-order.txt"
mkdir -p "$repo/link"
# Every function with a cost line, by role, then within a role those more of its processes ran
# first (what every daemon runs, then what the daemons of one engine's path run), hottest first
# among equals (instructions, summed). Roles: 1, what a daemon runs while its containers run,
# after it has settled and dropped its code pages (settle.rs, sys::release_code_pages) and
# before a request other than Wait, State, Stats, Pids or Connect: the pages a running pod's
# daemon keeps mapped;
# 2, the rest of what a daemon runs (Create, Start, Exec, Delete, and what `start` ran before
# forking it); 3, what only `start` runs; 4, the mount helper's. Callgrind starts a new part of
# a process's file at each return from the release and at each entry to a ttrpc method, and
# names that trigger in the part it ends. A process is a helper by its command line, and the
# daemon when it ran the daemon's serve loop.
python3 - "$work/cg" >"$repo/link/symbol-order.txt" <<'PY'
import collections, os, re, sys
d = sys.argv[1]
IDLE = {'Wait', 'State', 'Stats', 'Pids', 'Connect'}
parts = collections.defaultdict(list)
for name in os.listdir(d):
    m = re.match(r'cg\.(\d+)(?:\.\d+)?$', name)
    if not m:
        continue
    text = open(os.path.join(d, name), errors='replace').read()
    part = re.search(r'^part: *(\d+)', text, re.M)
    trigger = re.search(r'^desc: Trigger: (.*)$', text, re.M)
    parts[m.group(1)].append((int(part.group(1)) if part else 0, trigger.group(1) if trigger else '', text))
cost = collections.defaultdict(int)
procs = collections.defaultdict(set)
for pid, ps in parts.items():
    ps.sort(key=lambda p: p[0])
    every = ''.join(p[2] for p in ps)
    if re.search(r'^cmd:.* mount-helper', every, re.M):
        kind = 4
    elif re.search(r'^fn=.*6daemon(5serve|3run)', every, re.M):
        kind = 2
    else:
        kind = 3
    idle = False
    for _, trigger, text in ps:
        role = 1 if kind == 2 and idle else kind
        fn, inclusive = None, False
        for line in text.splitlines():
            if line.startswith('fn='):
                fn = re.sub(r"'\d+$", '', line[3:])
            elif line.startswith('calls='):
                inclusive = True  # the next cost line is the callee's, not this function's
            elif re.match(r'(cfn|cfi|cob)=', line):
                continue
            elif inclusive:
                inclusive = False
            elif fn and re.match(r'[0-9+-]', line):
                f = line.split()
                if len(f) >= 2:
                    cost[(role, fn)] += int(f[1])
                    procs[(role, fn)].add(pid)
        method = re.search(r'shim_ttrpc_async\.\.([A-Za-z]+)Method\$u20\$as', trigger)
        if 'release_code_pages' in trigger:
            idle = True
        elif method and method.group(1) not in IDLE:
            idle = False
seen, roles = set(), collections.Counter()
for role, fn in sorted(cost, key=lambda k: (k[0], -len(procs[k]), -cost[k], k[1])):
    if fn in seen or fn.startswith(('0x', '(')):
        continue
    seen.add(fn)
    roles[role] += 1
    print(fn)
print(f"{len(seen)} functions from {len(parts)} processes: {roles[1]} run while containers run, "
      f"{roles[2]} the rest of the daemon's, {roles[3]} start's, {roles[4]} the mount helper's",
      file=sys.stderr)
if os.environ.get('GANTRY_ORDER_DEBUG'):
    for k in sorted(cost):
        print(k[0], len(procs[k]), cost[k], k[1], file=open(os.environ['GANTRY_ORDER_DEBUG'], 'a'))
PY
echo "== relinking with the list"
cargo build --release --quiet --bin containerd-shim-gantry-v2
