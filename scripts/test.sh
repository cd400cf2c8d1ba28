#!/usr/bin/env bash
# Runs gantry's whole test suite: unit tests and the integration tests against a private
# containerd, runc and crun. Needs root (namespaces, mounts, cgroups); installs what is missing.
#
#   scripts/test.sh [CARGO TEST ARGS]   the host suite
#   scripts/test.sh --node              the production-shaped node lane: the tests whose
#                                       behaviour depends on the host's shape, run inside the
#                                       Debian guest of scripts/node-vm.sh (systemd, cgroup v2,
#                                       AppArmor, full capabilities)
#
# Each mode ends with one line "tests: N passed, N failed, N skipped". Tests that need the
# node are ignored on the host (cargo prints the reason) and counted as skipped there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: the integration tests create containers; run as root" >&2
  exit 1
fi
scripts/deps.sh

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# One closing line for everything cargo's harness printed into $log (one "test result:" line
# per test binary).
summary() {
  awk '/test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
       END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$1"
}

if [ "${1:-}" = --node ]; then
  shift
  set +e
  scripts/node-lane.sh "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  summary "$log"
  exit "$status"
fi

# This project's VMs run a hybrid cgroup layout whose unified hierarchy holds only hugetlb;
# crun refuses that layout until hugetlb is bound to a v1 hierarchy.
if [ -d /sys/fs/cgroup/unified ] && [ ! -e /sys/fs/cgroup/hugetlb/tasks ]; then
  mkdir -p /sys/fs/cgroup/hugetlb 2>/dev/null || true
  mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb 2>/dev/null || true
fi

set +e
# --no-fail-fast: one failing test binary must not hide the results of the others.
cargo test --no-fail-fast --all-targets "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
summary "$log"
exit "$status"
