#!/usr/bin/env bash
# Pod start and per-pod memory through a real CRI-O: its default handler (conmon + runc, infra
# container dropped) against gantry (runtime_type "vm", sandbox fast path on), pods interleaved
# handler by handler so machine noise hits both alike. Every number printed comes from this run.
#
#   scripts/bench-crio.sh --crio BIN --crictl BIN --pinns BIN [--pods N] [--mem-pods M] [--keep]
#                         [--cgroup-manager cgroupfs|systemd] [--gantry-config FILE]
#
# `--gantry-config FILE` appends FILE to gantry's config (runtime_config_path), say a
# `[security]` policy, so that memory and latency are measured with it.
#
# Memory: M pods per handler (default 10) run at once, first with one app container each, then
# with three; with all of them running, the PSS, RSS and anonymous memory of every process that
# serves them (gantry's daemons; CRI-O's conmons) is read from /proc/PID/smaps_rollup and summed
# per pod (scripts/pod-memory.py). `--pods 0` skips the latency part, `--mem-pods 0` this one.
#
# CRI-O is not in this project's package sources, so the binaries are given (built from CRI-O's
# and cri-tools' release tags, say); conmon, runc, skopeo and the CNI loopback plugin come from
# Debian's packages (installed when missing). CRI-O runs privately: its own config, storage
# under a temporary directory, socket, state and CNI config (one loopback network), the
# cgroupfs driver (or, with `--cgroup-manager systemd`, CRI-O's default systemd driver, which
# gantry follows from the cgroupsPath, and kubelet's pod slices), pods with a kubelet-style cgroup parent. Each pod is `crictl runp`, one
# busybox container `create` and `start` (pid namespace per container, as kubelet asks), timed
# by wall clock around crictl; `runp (CRI-O)` is the same step from CRI-O's own log (RunPodSandbox
# received to answered), without crictl's process start. Prints p50s and the ratio gantry/default.
#
# Hosts without CAP_SYS_RESOURCE (this project's VMs) refuse the oomScoreAdj of -998 CRI-O
# gives every infra container: the default handler never creates one (it drops it), gantry
# does, so there CRI-O must be built with that value at 0 (server/sandbox_run.go,
# PodInfraOOMAdj) for the comparison to run at all. The script checks and says so.
#
# `--cgroup-manager systemd` on a host without systemd as PID 1 (this project's VMs) runs the
# whole bench in a mount namespace made to look like a systemd host on cgroup v2, as the
# systemd-driver sandbox test does (integration/sandbox_systemd.rs): `/sys/fs/cgroup` is the
# cgroup2 hierarchy, `/run/systemd/system` exists, and root's `systemd --user` manager, in a
# cgroup of its own, answers on the system bus path through its own D-Bus daemon. With the
# controllers bound to v1 here that view has none, so neither handler applies limits.
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$0")/.."
repo=$(pwd)
export LC_ALL=C

crio='' crictl='' pinns='' pods=30 mem_pods=10 keep=0 cgm=cgroupfs extra_config=
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --cgroup-manager) cgm=${2:?}; shift ;;
    --crio) crio=${2:?}; shift ;;
    --crictl) crictl=${2:?}; shift ;;
    --pinns) pinns=${2:?}; shift ;;
    --pods) pods=${2:?}; shift ;;
    --mem-pods) mem_pods=${2:?}; shift ;;
    --keep) keep=1 ;;
    --gantry-config) extra_config=$(realpath "${2:?}"); shift ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-crio.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for b in "$crio" "$crictl" "$pinns"; do
  [ -x "$b" ] || { echo "bench-crio.sh: --crio, --crictl and --pinns must name executables" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "bench-crio.sh: run it as root" >&2; exit 1; }
case "$cgm" in cgroupfs | systemd) ;; *) echo "bench-crio.sh: --cgroup-manager cgroupfs|systemd" >&2; exit 2 ;; esac

# systemd driver without a systemd host: re-run inside a namespace that is one (see the header).
if [ "$cgm" = systemd ] && [ ! -d /run/systemd/system ] && [ -z "${GANTRY_BENCH_SYSTEMD_NS:-}" ]; then
  if ! command -v systemctl >/dev/null || ! dpkg -s dbus-user-session >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd dbus dbus-user-session >/dev/null
  fi
  rt=$(mktemp -d /tmp/gantry-crio-systemd.XXXXXX)
  export GANTRY_BENCH_SYSTEMD_NS=$rt
  # shellcheck disable=SC2016 # expanded by the inner shell
  exec unshare -m --propagation private bash -c '
    rt=$GANTRY_BENCH_SYSTEMD_NS cg=/sys/fs/cgroup/${GANTRY_BENCH_SYSTEMD_NS##*/} sd="" rc=1
    mount -t cgroup2 none /sys/fs/cgroup
    mkdir -p "$cg" && echo $$ >"$cg/cgroup.procs"
    if mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd && mkdir -p /run/systemd/system &&
      mount -t tmpfs tmpfs "$rt"; then
      XDG_RUNTIME_DIR=$rt /lib/systemd/systemd --user >/dev/null 2>&1 &
      sd=$!
      for _ in $(seq 200); do [ -S "$rt/systemd/private" ] && break; sleep 0.05; done
      XDG_RUNTIME_DIR=$rt timeout 20 systemctl --user is-system-running --wait >/dev/null
      for _ in $(seq 200); do [ -S "$rt/bus" ] && break; sleep 0.05; done
    fi
    if [ -S "$rt/bus" ] && mkdir -p /run/dbus && mount -t tmpfs tmpfs /run/dbus &&
      touch /run/dbus/system_bus_socket && mount --bind "$rt/bus" /run/dbus/system_bus_socket; then
      "$0" "$@"; rc=$?
    else
      echo "bench-crio.sh: could not start a systemd manager with a D-Bus (dbus-user-session)" >&2
    fi
    echo $$ >/sys/fs/cgroup/cgroup.procs # out of the tree systemd manages, before that is emptied
    [ -n "$sd" ] && kill "$sd"
    for _ in $(seq 50); do kill -0 "$sd" 2>/dev/null || break; sleep 0.1; done
    find "$cg" -name cgroup.procs -exec cat {} + | xargs -r kill -9 2>/dev/null
    [ -n "$sd" ] && wait "$sd"
    for _ in $(seq 50); do [ -z "$(find "$cg" -name cgroup.procs -exec cat {} +)" ] && break; sleep 0.1; done
    for _ in $(seq 50); do find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null; [ -d "$cg" ] || break; sleep 0.1; done
    umount -l "$rt"; rmdir "$rt"
    exit $rc' "$self" "${args[@]}"
fi

missing=()
for p in conmon:conmon runc:runc skopeo:skopeo /usr/lib/cni/loopback:containernetworking-plugins busybox:busybox-static; do
  command -v "${p%%:*}" >/dev/null 2>&1 || [ -x "${p%%:*}" ] || missing+=("${p#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! sh -c 'echo -998 > /proc/self/oom_score_adj' 2>/dev/null; then
  echo "bench-crio.sh: this host refuses oom_score_adj -998 (no CAP_SYS_RESOURCE); CRI-O must be" >&2
  echo "  built with PodInfraOOMAdj = 0 or gantry's infra containers fail (see the header)." >&2
fi

echo "== building gantry (release)"
cargo build --release --quiet
shim="$repo/target/$(rustc -vV | sed -n 's/^host: //p')/release/containerd-shim-gantry-v2"

work=$(mktemp -d /var/tmp/gantry-crio.XXXXXX)
run=/run/gantry-bench-crio
sock="$run/crio.sock"
storage="overlay@$work/storage+$run/storage"
cleanup() {
  set +e
  if [ -S "$sock" ]; then
    "$crictl" -r "unix://$sock" rmp -fa >/dev/null 2>&1
  fi
  [ -n "${crio_pid:-}" ] && kill "$crio_pid" 2>/dev/null && wait "$crio_pid" 2>/dev/null
  grep -o " $work/[^ ]*\| $run/[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null
  [ "$keep" = 1 ] && { echo "kept $work (CRI-O log: $work/crio.log)"; return; }
  rm -rf "$work" "$run"
}
trap cleanup EXIT

mkdir -p "$work/cni" "$work/logs" "$run"
echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$work/policy.json"
echo '{"cniVersion":"0.4.0","name":"lo-only","plugins":[{"type":"loopback"}]}' >"$work/cni/10-lo.conflist"
: >"$work/gantry.toml" # the shipped defaults: the driver follows each cgroupsPath
[ -z "$extra_config" ] || cat "$extra_config" >>"$work/gantry.toml"
cat >"$work/crio.conf" <<CONF
[crio]
root = "$work/storage"
runroot = "$run/storage"
storage_driver = "overlay"
log_dir = "$work/logs"
version_file = "$run/version"
version_file_persist = "$work/version"
clean_shutdown_file = "$work/clean.shutdown"
[crio.api]
listen = "$sock"
[crio.runtime]
default_runtime = "runc"
conmon = "$(command -v conmon)"
cgroup_manager = "$cgm"
conmon_cgroup = "pod"
pinns_path = "$pinns"
namespaces_dir = "$run/ns"
container_exits_dir = "$run/exits"
container_attach_socket_dir = "$run/attach"
[crio.runtime.runtimes.runc]
runtime_path = "$(command -v runc)"
runtime_type = "oci"
runtime_root = "$run/runc"
[crio.runtime.runtimes.gantry]
runtime_type = "vm"
runtime_path = "$shim"
runtime_root = "$run/gantry"
runtime_config_path = "$work/gantry.toml"
privileged_without_host_devices = true
[crio.image]
pause_image = "localhost/gantry/pause:latest"
pause_command = "/pause"
signature_policy = "$work/policy.json"
[crio.network]
network_dir = "$work/cni"
plugin_dirs = ["/usr/lib/cni"]
CONF

echo "== images (busybox-static, gantry's pause program) into CRI-O's storage"
scripts/busybox-image.sh "$work/img/pause" localhost/gantry/pause:latest /pause >/dev/null
scripts/busybox-image.sh "$work/img/busybox" localhost/gantry/busybox:latest >/dev/null
skopeo copy -q "oci-archive:$work/img/pause/image.tar" "containers-storage:[$storage]localhost/gantry/pause:latest"
skopeo copy -q "oci-archive:$work/img/busybox/image.tar" "containers-storage:[$storage]localhost/gantry/busybox:latest"

echo "== CRI-O $("$crio" --version 2>/dev/null | sed -n 's/^crio version //p;s/^Version: *//p')"
"$crio" --config "$work/crio.conf" --log-level info >"$work/crio.log" 2>&1 &
crio_pid=$!
: >"$work/crictl.yaml" # crictl warns on every call without one
C=("$crictl" --config "$work/crictl.yaml" -r "unix://$sock" -i "unix://$sock" -t 30s)
for _ in $(seq 100); do "${C[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done

cat >"$work/ctr.json" <<'JSON'
{"metadata":{"name":"c"},"image":{"image":"localhost/gantry/busybox:latest"},"command":["sleep","3600"],"log_path":"c.log","linux":{"security_context":{"namespace_options":{"pid":1}}}}
JSON
ms() { echo $(( ($2 - $1) / 1000 )); }
pod_json() { # HANDLER NAME -> $work/pod.json
  # kubelet's parent for a BestEffort pod: a path (cgroupfs) or a slice (systemd, the uid's
  # dashes as underscores).
  local parent="/kubepods/besteffort/podu-$1-$2"
  [ "$cgm" = systemd ] && parent="kubepods-besteffort-podu_${1}_$2.slice"
  printf '{"metadata":{"name":"p-%s-%s","namespace":"default","uid":"u-%s-%s"},"log_directory":"%s","linux":{"cgroup_parent":"%s","security_context":{"namespace_options":{"pid":1}}}}' \
    "$1" "$2" "$1" "$2" "$work/logs" "$parent" >"$work/pod.json"
}
one_pod() { # HANDLER INDEX -> appends "handler runp create start total" (µs) to times
  local h=$1 i=$2 t0 t1 t2 t3 p c
  pod_json "$h" "$i"
  t0=$(date +%s%N); p=$("${C[@]}" runp --runtime "$h" "$work/pod.json")
  t1=$(date +%s%N); c=$("${C[@]}" create "$p" "$work/ctr.json" "$work/pod.json")
  t2=$(date +%s%N); "${C[@]}" start "$c" >/dev/null
  t3=$(date +%s%N)
  echo "$h $(ms "$t0" "$t1") $(ms "$t1" "$t2") $(ms "$t2" "$t3") $(ms "$t0" "$t3")" >>"$work/times"
  "${C[@]}" stop -t 0 "$c" >/dev/null
  "${C[@]}" stopp "$p" >/dev/null
  "${C[@]}" rmp "$p" >/dev/null
}
echo "== warm-up, then $pods pods per handler, interleaved"
one_pod runc 0; one_pod gantry 0; : >"$work/times"
for i in $(seq 1 "$pods"); do one_pod runc "$i"; one_pod gantry "$i"; done
taken=$(grep -c '"oci_runtime":"gantry-sandbox-init"' "$work/crio.log" || true)
fallback=$(grep -c 'sandbox fast path not taken' "$work/crio.log" || true)

[ "$pods" -eq 0 ] || python3 - "$work/times" "$work/crio.log" "$taken" "$fallback" "$cgm" <<'PY'
import datetime, re, statistics, sys
times, log, taken, fallback, cgm = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
rows = [l.split() for l in open(times)]
def p50(h, i): return statistics.median(int(r[i]) for r in rows if r[0] == h) / 1000
def ts(s):
    d, f = s.replace('T', ' ').rstrip('Z').split('.')
    return datetime.datetime.strptime(d, '%Y-%m-%d %H:%M:%S').timestamp() + float('0.' + f)
began, runp = {}, {'runc': [], 'gantry': []}
for l in open(log):
    m = re.search(r'time="([^"]+)".*msg="Running pod sandbox: default/p-(\w+)-(\d+)/POD', l)
    if m and m.group(3) != '0': began[(m.group(2), m.group(3))] = ts(m.group(1))
    m = re.search(r'time="([^"]+)".*msg="Ran pod sandbox .*default/p-(\w+)-(\d+)/POD', l)
    if m and (m.group(2), m.group(3)) in began:
        runp[m.group(2)].append((ts(m.group(1)) - began.pop((m.group(2), m.group(3)))) * 1000)
n = sum(1 for r in rows if r[0] == 'gantry')
print(f"\npod start through CRI-O ({cgm} cgroup manager), p50 of {n} pods each (ms); gantry's "
      f"sandbox fast path taken {taken} times, fallbacks logged {fallback}")
print(f"{'step':<18}{'conmon+runc':>12}{'gantry':>10}{'ratio':>8}")
for i, name in enumerate(['runp', 'create', 'start', 'pod start'], 1):
    a, b = p50('runc', i), p50('gantry', i)
    print(f"{name:<18}{a:>12.1f}{b:>10.1f}{b / a:>8.2f}")
if runp['runc'] and runp['gantry']:
    a, b = statistics.median(runp['runc']), statistics.median(runp['gantry'])
    print(f"{'runp (CRI-O)':<18}{a:>12.1f}{b:>10.1f}{b / a:>8.2f}")
PY

[ "$mem_pods" -gt 0 ] || exit 0
mem_pod() { # HANDLER NAME CONTAINERS: a pod left running with CONTAINERS busybox containers
  local p j
  pod_json "$1" "$2"
  p=$("${C[@]}" runp --runtime "$1" "$work/pod.json")
  for j in $(seq 1 "$3"); do
    sed "s/\"name\":\"c\"/\"name\":\"c$j\"/" "$work/ctr.json" >"$work/ctr-$j.json"
    "${C[@]}" start "$("${C[@]}" create "$p" "$work/ctr-$j.json" "$work/pod.json")" >/dev/null
  done
}
for k in 1 3; do
  echo "== memory: $mem_pods pods per handler with $k app container(s) each, all running"
  for i in $(seq 1 "$mem_pods"); do mem_pod runc "m$k-$i" "$k"; mem_pod gantry "m$k-$i" "$k"; done
  # What a pod costs for its life, not in its first seconds: helper threads that end, end.
  sleep "${GANTRY_BENCH_SETTLE:-12}"
  python3 "$repo/scripts/pod-memory.py" --pods "$mem_pods" --containers "$k" \
    "gantry=$shim" "conmon+runc=$(command -v conmon)"
  "${C[@]}" rmp -fa >/dev/null
done
