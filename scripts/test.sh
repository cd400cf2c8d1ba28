#!/usr/bin/env bash
# Runs gantry's whole test suite: unit tests and the integration tests against a private
# containerd, runc and crun. Needs root (namespaces, mounts, cgroups); installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: the integration tests create containers; run as root" >&2
  exit 1
fi
scripts/deps.sh

# This project's VMs run a hybrid cgroup layout whose unified hierarchy holds only hugetlb;
# crun refuses that layout until hugetlb is bound to a v1 hierarchy.
if [ -d /sys/fs/cgroup/unified ] && [ ! -e /sys/fs/cgroup/hugetlb/tasks ]; then
  mkdir -p /sys/fs/cgroup/hugetlb 2>/dev/null || true
  mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb 2>/dev/null || true
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --all-targets "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole suite (cargo prints one per test binary, the last of which is
# an example with no tests).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
