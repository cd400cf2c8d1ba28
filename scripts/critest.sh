#!/usr/bin/env bash
# critest (cri-tools' CRI validation suite) through one engine, twice in one run: once with the
# gantry handler, once with the engine's default runc path; then the parity check
# (scripts/critest-parity.py against integration/critest/<engine>.expected).
#
#   scripts/critest.sh containerd   containerd 2.3 from scripts/stack.sh, gantry as the
#                                   `gantry` runtime entry (io.containerd.gantry.v2)
#   scripts/critest.sh crio         CRI-O from scripts/stack.sh (cgroupfs manager on hosts
#                                   without systemd as PID 1), gantry as the `gantry` handler of
#                                   `runtime_type = "vm"`, runc through conmon as the default
#
# Everything is private: the engine's root, state, socket and config live in a temporary
# directory, its images come from scripts/registry.py on 127.0.0.1 (the engine's mirror
# settings send registry.k8s.io, k8s.gcr.io and gcr.io there), and pods get a bridge of their
# own with addresses only they hold. Removed on exit, whatever happened.
# critest's reports and output and the engine's log are copied to target/critest/<engine>/.
# GANTRY_CRITEST_FOCUS: a Ginkgo focus regexp, to run part of the suite by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD

engine=${1:?usage: critest.sh containerd|crio}
case "$engine" in containerd | crio) ;; *) echo "critest.sh: unknown engine $engine" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "critest.sh: run as root" >&2; exit 1; }

scripts/stack.sh >/dev/null
bin=$(scripts/stack.sh --dir)
cni_bin=$(dirname "$bin")/cni
cargo build --quiet --bin containerd-shim-gantry-v2
shim_dir=$here/target/debug
[ -x "$shim_dir/containerd-shim-gantry-v2" ] ||
  shim_dir=$here/$(dirname "$(find target -name containerd-shim-gantry-v2 -path '*debug*' -type f | head -1)")

work=$(mktemp -d /var/tmp/gantry-critest.XXXXXX)
# As /run/containerd is: a user-namespace pod's root must reach its bundle's rootfs.
chmod 0711 "$work"
pids=()
cleanup() {
  local status=$?
  # What a failure needs looking at stays behind: the reports, critest's output, the engine's log.
  mkdir -p "$here/target/critest/$engine"
  cp "$work"/*.json "$work"/*.out "$work/engine.log" "$here/target/critest/$engine/" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # Shims and their containers outlive the engine; take down whatever ran from this root.
  pkill -9 -f "$work" 2>/dev/null || true
  # (gantry's runtime root is the shipped one, shared: only containers bundled here go.)
  for root in "$work"/runc-root "$work"/run/runc /run/gantry/runtime/k8s.io; do
    [ -d "$root" ] || continue
    "$bin/runc" --root "$root" list --format json 2>/dev/null |
      python3 -c 'import json,sys; [print(c["id"]) for c in json.load(sys.stdin) or [] if c["bundle"].startswith(sys.argv[1])]' "$work" |
      while read -r c; do "$bin/runc" --root "$root" delete -f "$c" >/dev/null 2>&1 || true; done
  done
  ip link del "$bridge" 2>/dev/null || true
  grep -o " $work[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
bridge=gcrit$$

# The images critest pulls, served from this machine.
mkdir "$work/bin"
for prog in pause nnp; do cc -static -Os -o "$work/bin/$prog" "integration/fixtures/$prog.c"; done
scripts/registry.py "$work/registry.port" "$work/bin" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/registry.port" ] && break; sleep 0.1; done
port=$(cat "$work/registry.port")

mkdir -p "$work/cni-conf" "$work/runc-root"
cat >"$work/cni-conf/10-critest.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "gantry-critest", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.231.$(( $$ % 250 )).0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
# gantry runs as shipped: runtime-conf/gantry.toml, which holds the defaults.

# The engine just started in the background (its pid in $!) answers CRI on SOCK: it becomes
# the endpoint, and is stopped on exit.
engine_started() {
  pids+=($!)
  for _ in $(seq 300); do
    "$bin/crictl" --runtime-endpoint "unix://$1" version >/dev/null 2>&1 && break
    sleep 0.1
  done
  endpoint=unix://$1
}

start_containerd() {
  local sock=$work/containerd.sock
  for host in registry.k8s.io k8s.gcr.io gcr.io; do
    mkdir -p "$work/hosts/$host"
    printf 'server = "http://127.0.0.1:%s"\n' "$port" >"$work/hosts/$host/hosts.toml"
  done
  # Its own oom_score_adj is the floor: hosts without CAP_SYS_RESOURCE refuse a lower one.
  cat >"$work/containerd.toml" <<TOML
version = 3
root = "$work/root"
state = "$work/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$work/opt"
# NRI on, at a socket of its own: critest's NRI specs connect a plugin there.
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "$work/nri.sock"
[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "$work/hosts"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$bin/runc"
        Root = "$work/runc-root"
    # No options table: with one (a ConfigPath), containerd 2.3's CRI cannot start a
    # user-namespace container on any shim but runc's (docs/engines.md#user-namespaces).
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.gantry]
      runtime_type = "io.containerd.gantry.v2"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$cni_bin"]
    conf_dir = "$work/cni-conf"
TOML
  PATH=$shim_dir:$bin:$PATH GANTRY_CONFIG=$here/runtime-conf/gantry.toml "$bin/containerd" --config "$work/containerd.toml" >"$work/engine.log" 2>&1 &
  engine_started "$sock"
  nri_socket=$work/nri.sock
}

# CRI-O, as a node runs it but private: its own storage, run directories and socket. gantry
# runs its shipped config plus restrict_oom_score_adj where this host may not lower
# oom_score_adj (CRI-O asks -998 for every infra container; conmon + runc has none to run).
start_crio() {
  local sock=$work/crio.sock run=$work/run
  mkdir -p "$run" "$work/logs"
  echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$work/policy.json"
  for host in registry.k8s.io k8s.gcr.io gcr.io; do
    printf '[[registry]]\nprefix = "%s"\nlocation = "127.0.0.1:%s"\ninsecure = true\n' "$host" "$port"
  done >"$work/registries.conf"
  cp runtime-conf/gantry.toml "$work/gantry.toml"
  if ! sh -c 'echo -998 >/proc/self/oom_score_adj' 2>/dev/null; then
    sed -i 's/^restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$work/gantry.toml"
  fi
  local manager=cgroupfs
  [ -d /run/systemd/system ] && manager=systemd
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
cgroup_manager = "$manager"
pinns_path = "$bin/pinns"
namespaces_dir = "$run/ns"
container_exits_dir = "$run/exits"
container_attach_socket_dir = "$run/attach"
[crio.runtime.runtimes.runc]
runtime_path = "$bin/runc"
runtime_type = "oci"
runtime_root = "$run/runc"
[crio.runtime.runtimes.gantry]
runtime_type = "vm"
runtime_path = "$shim_dir/containerd-shim-gantry-v2"
runtime_root = "$run/gantry"
runtime_config_path = "$work/gantry.toml"
privileged_without_host_devices = true
[crio.image]
pause_image = "registry.k8s.io/pause:3.9"
signature_policy = "$work/policy.json"
[crio.network]
network_dir = "$work/cni-conf"
plugin_dirs = ["$cni_bin"]
[crio.nri]
enable_nri = true
nri_listen = "$work/nri.sock"
CONF
  nri_socket=$work/nri.sock
  mkdir -p "$work/registries.conf.d"
  PATH=$bin:$PATH "$bin/crio" --config "$work/crio.conf" --registries-conf "$work/registries.conf" \
    --registries-conf-dir "$work/registries.conf.d" --log-level info >"$work/engine.log" 2>&1 &
  engine_started "$sock"
}

start_"$engine"
echo "critest: $engine $("$bin/crictl" --runtime-endpoint "$endpoint" version 2>/dev/null | awk '/RuntimeVersion/{print $2}'), runc $("$bin/runc" --version | awk 'NR==1{print $3}')"

run_critest() {
  local handler=$1 t0=$SECONDS
  local args=(--runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --nri-socket "$nri_socket"
              "--ginkgo.json-report=$work/$handler.json" --ginkgo.no-color --ginkgo.timeout=40m)
  [ "$handler" = gantry ] && args+=(--runtime-handler gantry)
  [ -n "${GANTRY_CRITEST_FOCUS:-}" ] && args+=("--ginkgo.focus=$GANTRY_CRITEST_FOCUS")
  # critest's exit status is its failures; the parity check below judges them.
  (cd "$work" && PATH=$bin:$PATH "$bin/critest" "${args[@]}" >"$work/$handler.out" 2>&1) || true
  echo "critest: $handler: $(grep -E '^(Ran|PASS|FAIL)' "$work/$handler.out" | tr '\n' ' ')($((SECONDS - t0)) s)"
}
run_critest gantry
run_critest runc

expected=integration/critest/$engine.expected
if ! scripts/critest-parity.py "$expected" "$work/gantry.json" "$work/runc.json"; then
  echo "critest: the last lines of the engine's log:" >&2
  tail -40 "$work/engine.log" >&2
  exit 1
fi
