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

cargo test --all-targets "$@"
