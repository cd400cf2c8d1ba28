#!/usr/bin/env bash
# gantry side by side with containerd's Go runc shim (containerd-shim-runc-v2), on one private
# containerd, with runc and with crun, the two shims interleaved run by run so that machine
# noise hits both alike. Every number printed comes from this run.
#
#   scripts/bench.sh [--quick] [--out PATH] [--mem N] [--compare BINARY]
#
# Measures, per OCI runtime (runc, crun) and shim (io.containerd.runc.v2, io.containerd.gantry.v2):
#   - start latency: `ctr run --rm` of /bin/true, p50 and p90;
#   - memory per shim: idle containers (`ctr run -d ... sleep`), RSS, PSS, anonymous memory
#     (smaps_rollup) and threads of each shim daemon, medians;
#   - density: containers started concurrently in batches, total shim PSS, time to all running;
#   - exec round trip: `ctr task exec` of /bin/true, p50;
#   - stdout throughput: a container writing to stdout through the FIFOs (busybox `head -c`, and
#     `dd bs=1M`), ctr's stdout to /dev/null;
#   - the shims alone, without containerd: examples/shim_driver.rs starts each shim as containerd
#     does and times start → Create → Start → Wait → Delete → Shutdown until the daemon exits,
#     and the shim's CPU time for that lifecycle (`start` process + daemon, user + system); the
#     OCI runtime alone on the same container is timed too, as the floor under any shim;
#   - seccomp notify's cost: Create RPC p50 with two syscalls watched against the profile alone;
#     one watched call's round trip, and recording a profile (scripts/bench-seccomp.sh);
#   - the event log's cost: gantry's Create RPC p50 with the event log off against on (with
#     `metrics --listen` running and scraped meanwhile), interleaved, through the same driver;
#   - pod start (driver --pod): a pause sandbox and one container joining its namespaces
#     through one daemon, as the CRI engines start a pod: the Go shim, gantry with the sandbox
#     fast path, and gantry starting the pause container through runc.
# Prints one table (metric, Go shim, gantry, ratio gantry/Go, target) and writes it as JSON
# (default target/bench/results.json). --quick runs a few of each (the CI smoke mode); targets
# are reported, never enforced: the exit status is non-zero only when something breaks.
# --mem N sets the idle containers per shim. --compare BINARY adds another gantry build (e.g.
# one linked without PIE) to the memory phase, interleaved with this one, and prints its idle
# RSS and PSS against this build's.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
export LC_ALL=C RUST_BACKTRACE=0

quick=0
mem_override=""
compare=""
out="$repo/target/bench/results.json"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --out) out=${2:?--out needs a path}; shift ;;
    --mem) mem_override=${2:?--mem needs a count}; shift ;;
    --compare) compare=${2:?--compare needs a gantry binary}; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$out" in /*) ;; *) out="$repo/$out" ;; esac

if [ "$(id -u)" != 0 ]; then
  echo "bench.sh: containers need root; run it as root" >&2
  exit 1
fi

if [ "$quick" = 1 ]; then
  N_START=3 N_MEM=3 N_DENS=6 BATCH=3 N_EXEC=3 STDOUT_MIB=16 N_STDOUT=1 N_DRV=3
else
  N_START=50 N_MEM=50 N_DENS=200 BATCH=20 N_EXEC=100 STDOUT_MIB=512 N_STDOUT=7 N_DRV=50
fi
[ -n "$mem_override" ] && N_MEM=$mem_override
if [ -n "$compare" ] && [ ! -x "$compare" ]; then
  echo "bench.sh: --compare $compare is not an executable" >&2
  exit 2
fi
RUNTIMES=(runc crun)
KINDS=(go gantry)

scripts/deps.sh

echo "== building gantry and the shim driver (release)"
cargo build --release --quiet
cargo build --release --quiet --example shim_driver
# .cargo/config.toml names the target, so release artifacts live under target/<host triple>/.
rel="$repo/target/$(rustc -vV | sed -n "s/^host: //p")/release"
gantry_bin="$rel/containerd-shim-gantry-v2"
driver="$rel/examples/shim_driver"
go_bin=$(command -v containerd-shim-runc-v2) || { echo "bench.sh: containerd-shim-runc-v2 not found" >&2; exit 1; }

work=$(mktemp -d /tmp/gantry-bench.XXXXXX)
ns="gbench-$$"
sock="$work/containerd.sock"
image=docker.io/gantry/busybox:latest
cd_pid=""

ctr_() { ctr --address "$sock" -n "$ns" "$@"; }

# Prints "PID KIND ID" for every shim daemon of this run's containerd.
list_shims() {
  local p kind id addr serving i
  local -a args
  for p in /proc/[0-9]*; do
    mapfile -d '' -t args <"$p/cmdline" 2>/dev/null || continue
    [ "${#args[@]}" -gt 0 ] || continue
    case "${args[0]##*/}" in
      containerd-shim-runc-v2) kind=go ;;
      containerd-shim-gantry-v2) kind=gantry ;;
      containerd-shim-gantrycmp-v2) kind=cmp ;;
      *) continue ;;
    esac
    id="" addr="" serving=1
    for ((i = 1; i < ${#args[@]}; i++)); do
      case "${args[i]}" in
        -id) id=${args[i + 1]:-} ;;
        -address) addr=${args[i + 1]:-} ;;
        start | delete) serving=0 ;;
      esac
    done
    if [ "$serving" = 1 ] && [ "$addr" = "$sock" ]; then echo "${p#/proc/} $kind $id"; fi
  done
}

# Removes containers (and their tasks) whose id starts with $1, in parallel.
rm_containers() {
  local prefix=$1
  # shellcheck disable=SC2016 # $1.. expand in the inner sh
  ctr_ containers ls -q 2>/dev/null | grep "^$prefix" |
    xargs -r -P 8 -I{} sh -c 'ctr --address "$1" -n "$2" tasks rm -f "$3" >/dev/null 2>&1; ctr --address "$1" -n "$2" containers rm "$3" >/dev/null 2>&1 || true' _ "$sock" "$ns" {} || true
  local left
  for _ in $(seq 100); do
    left=$(list_shims | awk -v p="$prefix" 'index($3, p) == 1' | wc -l)
    [ "$left" = 0 ] && return 0
    sleep 0.2
  done
  echo "bench.sh: $left shim daemons for $prefix* still running after removal" >&2
  return 1
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$cd_pid" ] && kill -0 "$cd_pid" 2>/dev/null; then
    for n in "$ns" "$ns-drv" "$ns-sec"; do
      # shellcheck disable=SC2016 # $1.. expand in the inner sh
      ctr --address "$sock" -n "$n" containers ls -q 2>/dev/null |
        xargs -r -P 8 -I{} sh -c 'timeout 20 ctr --address "$1" -n "$2" tasks rm -f "$3" >/dev/null 2>&1; timeout 20 ctr --address "$1" -n "$2" containers rm "$3" >/dev/null 2>&1' _ "$sock" "$n" {}
    done
    kill "$cd_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$cd_pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$cd_pid" 2>/dev/null
    wait "$cd_pid" 2>/dev/null
  fi
  # Whatever survived: shim daemons (and the sockets they leave), runtime state, mounts, cgroups.
  local addrs
  addrs=$(cat "$work"/state/io.containerd.runtime.v2.task/*/*/address "$work"/drv-*/*/address "$work"/sec-*/*/address 2>/dev/null)
  list_shims | awk '{print $1}' | xargs -r kill -9 2>/dev/null
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q -- "$work"; then kill -9 "${p#/proc/}" 2>/dev/null; fi
  done
  for a in $addrs; do
    a=${a#unix://}
    [ -S "$a" ] && rm -f "$a"
  done
  for n in "$ns" "$ns-drv" "$ns-sec" "$ns-pod"; do
    for r in "/run/containerd/runc/$n" "$work/rt/$n"; do
      for rt in runc crun; do
        [ -d "$r" ] || continue
        "$rt" --root "$r" list -q 2>/dev/null | xargs -r -n1 "$rt" --root "$r" delete --force 2>/dev/null
      done
    done
    rm -rf "/run/containerd/runc/$n"
  done
  grep " $work" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
  # The pod phase's namespace too: its per-namespace parent cgroup is the runtime's to make and
  # nobody's to remove.
  for n in "$ns" "$ns-drv" "$ns-sec" "$ns-pod"; do
    find /sys/fs/cgroup/*/"$n" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  if [ -n "${GANTRY_BENCH_KEEP:-}" ]; then echo "bench.sh: kept $work"; else rm -rf "$work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== busybox image and a private containerd ($(containerd --version | awk '{print $3}'))"
scripts/busybox-image.sh "$work/image" "$image" >/dev/null
for rt in "${RUNTIMES[@]}"; do
  cat >"$work/gantry-$rt.toml" <<TOML
[shim]
socket_dir = "$work/s"
[runtime]
binary = "$rt"
root = "$work/rt"
[events]
log = "$work/events/events.jsonl"
TOML
done
# The same without the event log, for the event-log cost phase.
sed 's|^log = .*|log = ""|' "$work/gantry-runc.toml" >"$work/gantry-runc-off.toml"
private_containerd_config "$work" "$sock"
# The --compare build, under a runtime type of its own (containerd finds it by that name).
mkdir -p "$work/cmpbin"
[ -n "$compare" ] && cp "$compare" "$work/cmpbin/containerd-shim-gantrycmp-v2"
PATH="$rel:$work/cmpbin:$PATH" GANTRY_CONFIG="$work/gantry-runc.toml" \
  containerd --config "$work/containerd.toml" >"$work/containerd.log" 2>&1 &
cd_pid=$!
for _ in $(seq 100); do ctr_ version >/dev/null 2>&1 && break; sleep 0.1; done
ctr_ version >/dev/null || { echo "bench.sh: containerd did not start" >&2; tail -20 "$work/containerd.log" >&2; exit 1; }
ctr_ images import "$work/image/image.tar" >/dev/null

# `ctr run` flags selecting a shim and an OCI runtime.
run_args() {
  case "$1/$2" in
    go/runc) echo "--runtime io.containerd.runc.v2" ;;
    go/crun) echo "--runtime io.containerd.runc.v2 --runc-binary crun" ;;
    gantry/*) echo "--runtime io.containerd.gantry.v2 --runtime-config-path $work/gantry-$2.toml" ;;
    cmp/*) echo "--runtime io.containerd.gantrycmp.v2 --runtime-config-path $work/gantry-$2.toml" ;;
  esac
}
# The two shims in alternating order: go gantry, then gantry go, ...
order() { if [ $(($1 % 2)) = 0 ]; then echo go gantry; else echo gantry go; fi; }
ms_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f\n", (b - a) * 1000 }'; }
samples() { echo "$work/samples/$1"; }
mkdir -p "$work/samples"
: >"$work/results.tsv"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$work/results.tsv"; } # KEY KIND VALUE
# p50/p90/mean/median of a sample file (nearest rank).
stat_of() {
  sort -g "$1" | awk -v q="$2" '{ v[NR] = $1; s += $1 }
    END { if (NR == 0) exit 1
          if (q == "mean") { printf "%.3f", s / NR; exit }
          r = int(q / 100 * NR); if (r < q / 100 * NR) r++; if (r < 1) r = 1
          printf "%.3f", v[r] }'
}

phase() { echo "== [$((SECONDS - t_begin))s] $*"; }
t_begin=$SECONDS
phase "start latency: ctr run --rm /bin/true, $N_START runs per shim and runtime"
for rt in "${RUNTIMES[@]}"; do
  for k in "${KINDS[@]}"; do # warm-up, untimed
    # shellcheck disable=SC2046
    ctr_ run --rm $(run_args "$k" "$rt") "$image" "warm-$k-$rt" /bin/true >/dev/null
  done
done
for ((i = 0; i < N_START; i++)); do
  for rt in "${RUNTIMES[@]}"; do
    for k in $(order "$i"); do
      t0=$EPOCHREALTIME
      # shellcheck disable=SC2046
      ctr_ run --rm $(run_args "$k" "$rt") "$image" "lat-$k-$rt-$i" /bin/true >/dev/null
      ms_since "$t0" >>"$(samples "start-$k-$rt")"
    done
  done
done
for rt in "${RUNTIMES[@]}"; do
  for k in "${KINDS[@]}"; do
    record "start_p50.$rt" "$k" "$(stat_of "$(samples "start-$k-$rt")" 50)"
    record "start_p90.$rt" "$k" "$(stat_of "$(samples "start-$k-$rt")" 90)"
  done
done

# Memory of the shim daemons of containers whose id starts with $1: one "KIND RSS PSS ANON THREADS"
# line per daemon (KiB), into $2.
shim_memory() {
  local pid kind id
  list_shims | awk -v p="$1" 'index($3, p) == 1' | while read -r pid kind id; do
    awk -v k="$kind" '/^Rss:/ { r = $2 } /^Pss:/ { p = $2 } /^Anonymous:/ { a = $2 }
      END { printf "%s %d %d %d", k, r, p, a }' "/proc/$pid/smaps_rollup"
    awk '/^Threads:/ { printf " %d\n", $2 }' "/proc/$pid/status"
  done >"$2"
}
mib() { awk '{ printf "%.3f\n", $1 / 1024 }'; }

phase "memory per shim: $N_MEM idle containers per shim and runtime"
for rt in "${RUNTIMES[@]}"; do
  for ((i = 0; i < N_MEM; i++)); do
    for k in $(order "$i") ${compare:+cmp}; do
      # shellcheck disable=SC2046
      ctr_ run -d $(run_args "$k" "$rt") "$image" "mem-$rt-$k-$i" sleep 100000 >/dev/null
    done
  done
  sleep 4 # past gantry's settling (src/settle.rs, 2 s after a Start): the daemons idle
  shim_memory "mem-$rt-" "$work/mem-$rt.txt"
  for k in "${KINDS[@]}" ${compare:+cmp}; do
    n=$(awk -v k="$k" '$1 == k' "$work/mem-$rt.txt" | wc -l)
    if [ "$n" != "$N_MEM" ]; then
      echo "bench.sh: found $n $k shim daemons for $N_MEM containers ($rt)" >&2
      exit 1
    fi
    awk -v k="$k" '$1 == k { print $2 }' "$work/mem-$rt.txt" | mib >"$(samples "rss-$k-$rt")"
    awk -v k="$k" '$1 == k { print $3 }' "$work/mem-$rt.txt" | mib >"$(samples "pss-$k-$rt")"
    awk -v k="$k" '$1 == k { print $4 }' "$work/mem-$rt.txt" | mib >"$(samples "anon-$k-$rt")"
    awk -v k="$k" '$1 == k { print $5 }' "$work/mem-$rt.txt" >"$(samples "threads-$k-$rt")"
    for m in rss pss anon threads; do
      record "$m.$rt" "$k" "$(stat_of "$(samples "$m-$k-$rt")" 50)"
    done
  done
  rm_containers "mem-$rt-"
done

phase "density: $N_DENS containers per shim and runtime, $BATCH at a time"
for rt in "${RUNTIMES[@]}"; do
  declare -A dens_ms=([go]=0 [gantry]=0)
  b=0
  for ((first = 0; first < N_DENS; first += BATCH)); do
    for k in $(order "$b"); do
      t0=$EPOCHREALTIME
      pids=()
      for ((j = first; j < first + BATCH && j < N_DENS; j++)); do
        # shellcheck disable=SC2046
        ctr_ run -d $(run_args "$k" "$rt") "$image" "dens-$rt-$k-$j" sleep 100000 >/dev/null &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p"; done
      dens_ms[$k]=$(awk -v s="${dens_ms[$k]}" -v d="$(ms_since "$t0")" 'BEGIN { printf "%.3f", s + d }')
    done
    b=$((b + 1))
  done
  shim_memory "dens-$rt-" "$work/dens-$rt.txt"
  running=$(ctr_ tasks ls | awk -v p="dens-$rt-" 'index($1, p) == 1 && $3 == "RUNNING"' | wc -l)
  if [ "$running" != $((2 * N_DENS)) ]; then
    echo "bench.sh: $running of $((2 * N_DENS)) density containers running ($rt)" >&2
    exit 1
  fi
  for k in "${KINDS[@]}"; do
    n=$(awk -v k="$k" '$1 == k' "$work/dens-$rt.txt" | wc -l)
    [ "$n" = "$N_DENS" ] || { echo "bench.sh: $n $k daemons for $N_DENS containers ($rt)" >&2; exit 1; }
    record "dens_pss.$rt" "$k" "$(awk -v k="$k" '$1 == k { s += $3 } END { printf "%.3f", s / 1024 }' "$work/dens-$rt.txt")"
    record "dens_s.$rt" "$k" "$(awk -v v="${dens_ms[$k]}" 'BEGIN { printf "%.3f", v / 1000 }')"
  done
  rm_containers "dens-$rt-"
  unset dens_ms
done

phase "exec round trip: ctr task exec /bin/true, $N_EXEC runs per shim and runtime"
for rt in "${RUNTIMES[@]}"; do
  for k in "${KINDS[@]}"; do
    # shellcheck disable=SC2046
    ctr_ run -d $(run_args "$k" "$rt") "$image" "exec-$rt-$k" sleep 100000 >/dev/null
    ctr_ tasks exec --exec-id warm "exec-$rt-$k" /bin/true
  done
done
for ((i = 0; i < N_EXEC; i++)); do
  for rt in "${RUNTIMES[@]}"; do
    for k in $(order "$i"); do
      t0=$EPOCHREALTIME
      ctr_ tasks exec --exec-id "e$i" "exec-$rt-$k" /bin/true
      ms_since "$t0" >>"$(samples "exec-$k-$rt")"
    done
  done
done
for rt in "${RUNTIMES[@]}"; do
  for k in "${KINDS[@]}"; do
    record "exec_p50.$rt" "$k" "$(stat_of "$(samples "exec-$k-$rt")" 50)"
  done
done
rm_containers "exec-"

phase "stdout throughput: $STDOUT_MIB MiB through the FIFOs, $N_STDOUT runs per shim, runtime and writer"
# Two writers: busybox `head -c` (4 KiB writes: what the issue names) and `dd bs=1M` (large
# writes), so that a writer-bound result is visible as such. ctr's stdout goes to /dev/null.
bytes=$((STDOUT_MIB * 1024 * 1024))
for ((i = 0; i < N_STDOUT; i++)); do
  for rt in "${RUNTIMES[@]}"; do
    for w in head dd; do
      case $w in
        head) wcmd="head -c $bytes /dev/zero" ;;
        dd) wcmd="dd if=/dev/zero bs=1048576 count=$STDOUT_MIB 2>/dev/null" ;;
      esac
      for k in $(order "$i"); do
        t0=$EPOCHREALTIME
        # shellcheck disable=SC2046
        ctr_ run --rm $(run_args "$k" "$rt") "$image" "out-$w-$k-$rt-$i" sh -c "$wcmd" >/dev/null
        awk -v m="$STDOUT_MIB" -v ms="$(ms_since "$t0")" 'BEGIN { printf "%.3f\n", m / (ms / 1000) }' >>"$(samples "stdout-$w-$k-$rt")"
      done
    done
  done
done
for rt in "${RUNTIMES[@]}"; do
  for k in "${KINDS[@]}"; do
    for w in head dd; do
      record "stdout_$w.$rt" "$k" "$(stat_of "$(samples "stdout-$w-$k-$rt")" 50)"
    done
  done
done

phase "the shims alone (examples/shim_driver.rs): $N_DRV lifecycles per shim and runtime"
for rt in "${RUNTIMES[@]}"; do
  rt_flag=()
  [ "$rt" = runc ] || rt_flag=(--runtime-binary "$rt")
  GANTRY_CONFIG="$work/gantry-runc.toml" "$driver" \
    --shim "go=$go_bin" --shim "gantry=$gantry_bin" \
    --rootfs "$work/image/rootfs" --workdir "$work/drv-$rt" \
    --address "$sock" --ttrpc-address "$sock.ttrpc" --namespace "$ns-drv" \
    --runs "$N_DRV" --runtime-floor "${rt_flag[@]}" --summary "$work/drv-$rt.tsv" >"$work/drv-$rt.json"
  while IFS=$'\t' read -r k key v; do
    case "$key" in
      lifecycle_p50) record "life_p50.$rt" "$k" "$v" ;;
      lifecycle_p90) record "life_p90.$rt" "$k" "$v" ;;
      cpu_p50) record "cpu_p50.$rt" "$k" "$v" ;;
      cpu_mean) record "cpu_mean.$rt" "$k" "$v" ;;
      start_cmd_p50) record "startcmd_p50.$rt" "$k" "$v" ;;
      create_p50) record "create_p50.$rt" "$k" "$v" ;;
    esac
  done <"$work/drv-$rt.tsv"
done

phase "event log cost: gantry Create RPC with the event log off and on (exporter scraped), $N_DRV each"
# Two names for the same binary, differing only in the config their daemons read.
for v in off on; do
  conf="$work/gantry-runc.toml"; [ "$v" = off ] && conf="$work/gantry-runc-off.toml"
  printf '#!/bin/sh\nGANTRY_CONFIG=%s exec %s "$@"\n' "$conf" "$gantry_bin" >"$work/gantry-events-$v"
  chmod +x "$work/gantry-events-$v"
done
"$gantry_bin" metrics --listen 127.0.0.1:0 --log "$work/events/events.jsonl" 2>"$work/exporter.log" &
exp_pid=$!
sleep 0.3
exp_addr=$(sed -n 's|.*http://\([^/]*\)/metrics.*|\1|p' "$work/exporter.log")
( while kill -0 "$exp_pid" 2>/dev/null; do
    exec 3<>"/dev/tcp/${exp_addr%:*}/${exp_addr##*:}" && printf 'GET /metrics HTTP/1.1\r\n\r\n' >&3 && cat <&3 >/dev/null
    exec 3>&-; sleep 0.2
  done ) 2>/dev/null &
scrape_pid=$!
"$driver" --shim "off=$work/gantry-events-off" --shim "on=$work/gantry-events-on" \
  --rootfs "$work/image/rootfs" --workdir "$work/drv-events" \
  --address "$sock" --ttrpc-address "$sock.ttrpc" --namespace "$ns-drv" \
  --runs "$N_DRV" --summary "$work/drv-events.tsv" >/dev/null
created_counted=$("$gantry_bin" metrics --log "$work/events/events.jsonl" | awk '/^gantry_containers_created_total/ { s += $2 } END { print s + 0 }')
kill "$exp_pid" "$scrape_pid" 2>/dev/null || true
wait "$exp_pid" "$scrape_pid" 2>/dev/null || true

phase "Create with gantry's runtime-default seccomp profile against none (driver, gantry alone)"
# A second gantry whose config adds the policy, interleaved run by run with the plain one. The
# profile is generated and validated once per daemon; the runtime loads it on every create.
{ cat "$work/gantry-runc.toml"; printf '[security]\nseccomp_default = "runtime-default"\n'; } >"$work/gantry-seccomp.toml"
printf '#!/bin/sh\nGANTRY_CONFIG=%s exec %s "$@"\n' "$work/gantry-seccomp.toml" "$gantry_bin" >"$work/gantry-seccomp"
chmod +x "$work/gantry-seccomp"
# A third with two syscalls watched (seccomp notify): its Create binds the listener, runc sends
# the notification fd during create, and the daemon starts serving it.
{ cat "$work/gantry-seccomp.toml"; printf 'seccomp_notify = ["unshare", "mount"]\nseccomp_notify_action = "deny"\n'; } >"$work/gantry-notify.toml"
printf '#!/bin/sh\nGANTRY_CONFIG=%s exec %s "$@"\n' "$work/gantry-notify.toml" "$gantry_bin" >"$work/gantry-notify"
chmod +x "$work/gantry-notify"
for rt in "${RUNTIMES[@]}"; do
  rt_flag=()
  [ "$rt" = runc ] || rt_flag=(--runtime-binary "$rt")
  GANTRY_CONFIG="$work/gantry-runc.toml" "$driver" \
    --shim "gantry=$gantry_bin" --shim "seccomp=$work/gantry-seccomp" --shim "notify=$work/gantry-notify" \
    --rootfs "$work/image/rootfs" --workdir "$work/sec-$rt" \
    --address "$sock" --ttrpc-address "$sock.ttrpc" --namespace "$ns-sec" \
    --runs "$N_DRV" "${rt_flag[@]}" --summary "$work/sec-$rt.tsv" >"$work/sec-$rt.json"
  while IFS=$'\t' read -r k key v; do
    [ "$key" = create_p50 ] && record "create_seccomp.$rt" "$k" "$v"
  done <"$work/sec-$rt.tsv"
done

phase "seccomp notify's round trip and recording's cost, in containers (scripts/bench-seccomp.sh)"
GANTRY_BENCH_CHDIRS=$([ "$quick" = 1 ] && echo 2000 || echo 20000) scripts/bench-seccomp.sh \
  "$sock" "$ns" "$work" "$work/gantry-runc.toml" "$image" "$([ "$quick" = 1 ] && echo 1 || echo 5)" >"$work/seccomp-bench.txt"

phase "pod start: a pause sandbox and one container through one daemon (driver --pod), $N_DRV each"
# Three starters of the same pod, interleaved: the Go shim, gantry with the sandbox fast path
# (the default), and gantry with it off (the pause container through runc like any other).
scripts/busybox-image.sh "$work/pause" docker.io/gantry/pause:latest /pause >/dev/null
sed 's|^\[runtime\]$|[runtime]\nsandbox_fast_path = false|' "$work/gantry-runc.toml" >"$work/gantry-nofast.toml"
"$driver" --shim "go=$go_bin" --shim "gantry=$gantry_bin" --shim "gantry_runc=$gantry_bin" \
  --config "gantry=$work/gantry-runc.toml" --config "gantry_runc=$work/gantry-nofast.toml" \
  --pod "$work/pause/rootfs" --rootfs "$work/image/rootfs" --workdir "$work/drv-pod" \
  --address "$sock" --ttrpc-address "$sock.ttrpc" --namespace "$ns-pod" \
  --runs "$N_DRV" --summary "$work/drv-pod.tsv" >"$work/drv-pod.json"
while IFS=$'\t' read -r k key v; do
  case "$key" in
    sandbox_p50) record "sandbox_p50.runc" "$k" "$v" ;;
    pod_p50) record "pod_start_p50.runc" "$k" "$v" ;;
  esac
done <"$work/drv-pod.tsv"

# ---- the table and the JSON ----------------------------------------------------------------
# KEY|LABEL|UNIT|TARGET   (TARGET: r<=X or r>=X on the ratio gantry/Go, a<=X on gantry's value)
rows=()
for rt in "${RUNTIMES[@]}"; do
  t_start=""; [ "$rt" = crun ] && t_start="r<=0.75"
  rows+=(
    "start_p50.$rt|ctr run --rm /bin/true p50|ms|$t_start"
    "start_p90.$rt|ctr run --rm /bin/true p90|ms|"
    "life_p50.$rt|shim-only lifecycle p50 (driver)|ms|r<=0.5"
    "life_p90.$rt|shim-only lifecycle p90 (driver)|ms|"
    "startcmd_p50.$rt|shim start command p50 (driver)|ms|"
    "create_p50.$rt|Create RPC p50 (driver)|ms|"
    "cpu_p50.$rt|shim CPU per lifecycle p50|ms|"
    "cpu_mean.$rt|shim CPU per lifecycle mean|ms|"
    "exec_p50.$rt|ctr task exec /bin/true p50|ms|r<=1.0"
    "stdout_head.$rt|stdout $STDOUT_MIB MiB, head -c (4 KiB writes)|MiB/s|r>=1.0"
    "stdout_dd.$rt|stdout $STDOUT_MIB MiB, dd bs=1M|MiB/s|r>=1.0"
    "pss.$rt|PSS per shim, $N_MEM idle (median)|MiB|r<=0.25"
    "rss.$rt|RSS per shim, $N_MEM idle (median)|MiB|a<=2.861"
    "anon.$rt|anonymous per shim (median)|MiB|"
    "threads.$rt|threads per shim (median)|count|"
    "dens_pss.$rt|total shim PSS, $N_DENS containers|MiB|r<=0.25"
    "dens_s.$rt|time to $N_DENS running ($BATCH at once)|s|"
  )
done
rows+=(
  "sandbox_p50.runc|sandbox (pause) start p50 (driver --pod)|ms|"
  "pod_start_p50.runc|pod start p50: sandbox + container (driver --pod)|ms|"
)
mkdir -p "$(dirname "$out")"
machine="$(nproc) cores ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
# How an idle CPU waits decides what a cross-CPU wakeup costs (a VM's halt exits, or polls first),
# and small-write stdout is little else: record it with the figures.
idle_driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
if [ -r /sys/module/haltpoll/parameters/guest_halt_poll_ns ]; then
  idle_driver="$idle_driver, guest_halt_poll_ns=$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns)"
fi
machine="$machine, cpuidle $idle_driver"
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || echo -dirty)"
when=$(date -u +%Y-%m-%dT%H:%M:%SZ)
runs_json="{\"start\":$N_START,\"memory\":$N_MEM,\"density\":$N_DENS,\"density_batch\":$BATCH,\"exec\":$N_EXEC,\"stdout_mib\":$STDOUT_MIB,\"stdout_runs\":$N_STDOUT,\"driver\":$N_DRV}"
versions="containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR == 1 { print $3 }'), crun $(crun --version | awk 'NR == 1 { print $3 }')"
printf '%s\n' "${rows[@]}" | awk -F'|' -v res="$work/results.tsv" -v json="$out.tmp" \
  -v machine="$machine" -v when="$when" -v rev="$rev" -v quick="$quick" \
  -v versions="$versions" -v runs="$runs_json" '
  function jstr(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
  BEGIN {
    while ((getline line < res) > 0) { split(line, f, "\t"); val[f[1] "," f[2]] = f[3] }
    printf "%-46s %-5s %11s %11s %7s  %s\n", "metric", "rt", "Go shim", "gantry", "ratio", "target"
    n = 0
  }
  {
    key = $1; split(key, kr, "."); rt = kr[2]
    g = val[key ",go"]; r = val[key ",gantry"]
    if (g == "" || r == "") { print "bench.sh: no value for " key > "/dev/stderr"; bad = 1; next }
    ratio = (g + 0 != 0) ? r / g : 0
    tgt = ""; met = "null"
    if ($4 ~ /^r<=/) { x = substr($4, 4) + 0; tgt = sprintf("<= %gx", x); met = (ratio <= x) ? "true" : "false" }
    else if ($4 ~ /^r>=/) { x = substr($4, 4) + 0; tgt = sprintf(">= %gx", x); met = (ratio >= x) ? "true" : "false" }
    else if ($4 ~ /^a<=/) { x = substr($4, 4) + 0; tgt = sprintf("<= %g %s (3 MB)", x, $3); met = (r <= x) ? "true" : "false" }
    mark = (met == "true") ? "  pass" : (met == "false") ? "  MISS" : ""
    label = $2 " [" $3 "]"
    printf "%-46s %-5s %11.3f %11.3f %6.2fx  %s%s\n", label, rt, g, r, ratio, tgt, mark
    m[n++] = sprintf("{\"metric\":%s,\"runtime\":%s,\"unit\":%s,\"go\":%s,\"gantry\":%s,\"ratio\":%.4f,\"target\":%s,\"met\":%s}",
      jstr($2), jstr(rt), jstr($3), g + 0, r + 0, ratio, (tgt == "" ? "null" : jstr(tgt)), met)
  }
  END {
    printf "{\"date\":%s,\"machine\":%s,\"versions\":%s,\"gantry_revision\":%s,\"quick\":%s,\"runs\":%s,\"metrics\":[\n", \
      jstr(when), jstr(machine), jstr(versions), jstr(rev), (quick ? "true" : "false"), runs > json
    for (i = 0; i < n; i++) printf "  %s%s\n", m[i], (i < n - 1 ? "," : "") > json
    printf "],\n\"driver\":{" > json
    exit bad
  }'
first=1
for rt in "${RUNTIMES[@]}"; do
  [ "$first" = 1 ] || printf ',' >>"$out.tmp"
  first=0
  printf '"%s":' "$rt" >>"$out.tmp"
  cat "$work/drv-$rt.json" >>"$out.tmp"
done
printf '}}\n' >>"$out.tmp"
mv "$out.tmp" "$out"
echo "machine: $machine; $versions"
# The floor under any shim: the same container run by the OCI runtime alone.
for rt in "${RUNTIMES[@]}"; do
  awk -F'\t' -v rt="$rt" '$1 == "life_p50." rt { v[$2] = $3 }
    END { printf "reference, %s alone (create, start, wait, delete; no shim): lifecycle p50 %.3f ms = %.2fx the Go shim'"'"'s, %.2fx gantry'"'"'s\n",
            rt, v["oci-runtime"], v["oci-runtime"] / v["go"], v["oci-runtime"] / v["gantry"] }' "$work/results.tsv"
  # What `ctr run --rm` would take with a shim adding nothing over the runtime: gantry's time
  # less gantry's own share of the lifecycle (driver lifecycle minus the runtime alone).
  awk -F'\t' -v rt="$rt" '$1 == "life_p50." rt { l[$2] = $3 } $1 == "start_p50." rt { c[$2] = $3 }
    END { z = c["gantry"] - (l["gantry"] - l["oci-runtime"])
          printf "reference, ctr run --rm with a zero-cost shim on %s: about %.1f ms = %.2fx the Go shim'"'"'s (containerd and ctr: %.1f ms)\n",
            rt, z, z / c["go"], c["gantry"] - l["gantry"] }' "$work/results.tsv"
  awk -F'\t' -v rt="$rt" '$1 == "create_seccomp." rt { v[$2] = $3 }
    END { printf "reference, Create RPC p50 (driver) on %s with seccomp_default = runtime-default: %.3f ms against %.3f ms without (%+.3f ms, the runtime loading the filter included)\n",
            rt, v["seccomp"], v["gantry"], v["seccomp"] - v["gantry"]
          d = v["notify"] - v["seccomp"]
          printf "seccomp notify: Create RPC p50 (driver) on %s with unshare and mount watched %.3f ms against %.3f ms with the profile alone, %+.3f ms  target <= +1 ms  %s\n",
            rt, v["notify"], v["seccomp"], d, (d <= 1.0 ? "pass" : "MISS") }' "$work/results.tsv"
done
cat "$work/seccomp-bench.txt"
# The sandbox fast path against the same gantry starting the pause container through runc.
awk -F'\t' '$1 ~ /^(sandbox|pod_start)_p50\.runc$/ { v[$1 "," $2] = $3 }
  END { printf "sandbox fast path: pause start p50 %.3f ms vs %.3f ms through runc (%.2fx); pod start p50 %.3f vs %.3f ms (%.2fx); the Go shim %.3f / %.3f ms\n",
          v["sandbox_p50.runc,gantry"], v["sandbox_p50.runc,gantry_runc"], v["sandbox_p50.runc,gantry"] / v["sandbox_p50.runc,gantry_runc"],
          v["pod_start_p50.runc,gantry"], v["pod_start_p50.runc,gantry_runc"], v["pod_start_p50.runc,gantry"] / v["pod_start_p50.runc,gantry_runc"],
          v["sandbox_p50.runc,go"], v["pod_start_p50.runc,go"] }' "$work/results.tsv"
# The event log's cost on the request path (target: Create p50 within 0.5 ms of off).
awk -F'\t' -v created="$created_counted" '$2 == "create_p50" { v[$1] = $3 }
  END { d = v["on"] - v["off"]
        printf "event log + exporter: Create RPC p50 (driver, runc) off %.3f ms, on %.3f ms, %+.3f ms  target <= +0.5 ms  %s (%d creates counted by the exporter)\n",
          v["off"], v["on"], d, (d <= 0.5 ? "pass" : "MISS"), created }' "$work/drv-events.tsv"
# Idle memory of this build against the --compare build (measured side by side above).
if [ -n "$compare" ]; then
  for rt in "${RUNTIMES[@]}"; do
    awk -F'\t' -v rt="$rt" -v n="$N_MEM" '$1 == "pss." rt || $1 == "rss." rt { split($1, m, "."); v[m[1] "," $2] = $3 }
      END { printf "this build vs --compare build, %d idle each on %s: PSS %.3f vs %.3f MiB (%+.3f), RSS %.3f vs %.3f MiB (%+.3f)\n",
              n, rt, v["pss,gantry"], v["pss,cmp"], v["pss,gantry"] - v["pss,cmp"], v["rss,gantry"], v["rss,cmp"], v["rss,gantry"] - v["rss,cmp"] }' "$work/results.tsv"
  done
fi
phase "done"
echo "date: $when; gantry $rev; mode: $([ "$quick" = 1 ] && echo quick || echo full)"
echo "results: $out"
