#!/usr/bin/env bash
# The production-shaped node lane (run it as `scripts/test.sh --node`): builds the test
# binaries here, then runs inside the Debian guest of scripts/node-vm.sh every unit test (they
# take about a minute there, and the live cgroup and AppArmor ones read the host) and every
# integration test whose behaviour depends on the host's shape. Extra arguments replace the
# default integration test filters (e.g. `scripts/test.sh --node node::`); `--no-unit` leaves
# the unit tests out.
set -euo pipefail
cd "$(dirname "$0")/.."

# Modules and tests whose behaviour depends on the host's shape (cgroups, systemd,
# capabilities, AppArmor, OOM, the engines' cgroup drivers); the `node::` tests and a few
# others exist only for the guest (ignored elsewhere). Tests of the daemon's own behaviour
# (stdio forms, event order, cancellation, shutdown, the fifty-container leak check) read
# nothing of the host's shape and run in the host suite only: under TCG they took two thirds
# of the lane's time.
FILTERS=(node:: node_fleet:: crio_node:: daemon_cgroup:: gpu:: task_api::pause_and_resume stats_oom::oom stats_oom::crio_oom security:: cri:: sandbox::
         containerd::a_notify_socket containerd::crun_selected_by_config
         containerd::killed_daemon_is_cleaned_up_through_delete
         crio::crio_lifecycle_grouping_and_shutdown
         cri_exec::cri_exec_with_a_terminal cri_restart:: faults::containerd_restart
         seccomp_notify::watched_calls seccomp_notify::the_crio_annotation seccomp_notify::a_)
unit=1
if [ "${1:-}" = --no-unit ]; then unit=0; shift; fi
[ $# -gt 0 ] && FILTERS=("$@")

echo "== node lane: building the test binaries on the host"
exe=$(cargo test --no-run --test integration --message-format=json 2>/dev/null |
  grep '"kind":\["test"\]' | grep '"name":"integration"' |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$exe" ] || { echo "node-lane: no integration test binary found" >&2; exit 1; }
lib=$(cargo test --no-run --lib --message-format=json 2>/dev/null |
  grep '"kind":\["lib"\]' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$lib" ] || { echo "node-lane: no unit test binary found" >&2; exit 1; }
units=""
[ "$unit" = 1 ] && units="$lib --test-threads=2"
# The guest has no C compiler: the pause program the sandbox tests use is built here.
mkdir -p target/node
cc -static -Os -o target/node/pause integration/fixtures/pause.c
# The installer images of the fleet test, version N (this build) and N+1 (the same build
# with a trailer: another binary, so another version directory), built here where gzip is fast.
shim=target/$(rustc -vV | sed -n 's/^host: //p')/debug/containerd-shim-gantry-v2
mkdir -p target/node/n1
cp "$shim" target/node/n1/containerd-shim-gantry-v2
printf '\0gantry node lane: version N+1\0' >>target/node/n1/containerd-shim-gantry-v2
scripts/image.sh --binary "$shim" --output target/node/installer-n.tar --name docker.io/gantry/installer:n >/dev/null
scripts/image.sh --binary target/node/n1/containerd-shim-gantry-v2 --output target/node/installer-n1.tar \
  --name docker.io/gantry/installer:n1 >/dev/null

# The pinned stack's CRI-O, runc, crictl and CNI plugins for crio_node:: (the guest reaches
# only the checkout), and CRI-O's image store filled here with the pause and busybox images.
scripts/stack.sh >/dev/null
rm -rf target/node/stack && mkdir -p target/node/stack/bin
stack=$(scripts/stack.sh --dir)
cp "$stack"/{crio,pinns,runc,crictl} target/node/stack/bin/
cp -r "$stack/../cni" target/node/stack/cni
if [ ! -s target/node/crio-storage.tar ] || [ scripts/busybox-image.sh -nt target/node/crio-storage.tar ]; then
  st=$(mktemp -d /var/tmp/gantry-node-storage.XXXXXX)
  GANTRY_PAUSE_BIN=target/node/pause scripts/busybox-image.sh "$st/pause" localhost/gantry/pause:latest /pause >/dev/null
  scripts/busybox-image.sh "$st/busybox" localhost/gantry/busybox:latest >/dev/null
  for img in pause busybox; do
    skopeo copy -q "oci-archive:$st/$img/image.tar" \
      "containers-storage:[overlay@$st/storage+$st/run]localhost/gantry/$img:latest"
  done
  grep -o " $st/[^ ]*" /proc/self/mountinfo | xargs -r -n1 umount -l 2>/dev/null || true
  tar -C "$st" -cf target/node/crio-storage.tar storage
  rm -rf "$st"
fi

echo "== node lane: ${FILTERS[*]} in the guest"
guest="set -e
export GANTRY_PAUSE_BIN=$PWD/target/node/pause GANTRY_INSTALLER_IMAGES=$PWD/target/node RUST_BACKTRACE=1
export GANTRY_STACK_BIN=$PWD/target/node/stack/bin GANTRY_CRIO_STORAGE=$PWD/target/node/crio-storage.tar
echo \"node: \$(uname -r), \$(stat -fc %T /sys/fs/cgroup), apparmor=\$(cat /sys/module/apparmor/parameters/enabled), pid1=\$(cat /proc/1/comm)\"
status=0
${units:-true} || status=\$?
$exe --include-ignored --test-threads=2 ${FILTERS[*]} || status=\$?
exit \$status"
exec scripts/node-vm.sh run --timeout "${GANTRY_NODE_TIMEOUT:-2700}" -- "$guest"
