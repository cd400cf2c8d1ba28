#!/usr/bin/env bash
# Runs gantry's whole test suite as root, installing what is missing:
#   1. the host suite: unit tests and the integration tests against a private containerd,
#      runc and crun on this machine;
#   2. the production-shaped node lane: the tests whose behaviour depends on the host's shape
#      (cgroup v2, systemd, capabilities, a Type=notify containerd), run inside the Debian
#      guest of scripts/node-vm.sh (scripts/node-lane.sh).
#
#   scripts/test.sh                     both, then one closing line for both
#   scripts/test.sh --host [CARGO ARGS] the host suite only
#   scripts/test.sh --node [FILTERS]    the node lane only
#
# Each part ends with "tests: N passed, N failed, N skipped". Tests that need the node are
# ignored on the host (cargo prints the reason) and counted as skipped there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: the integration tests create containers; run as root" >&2
  exit 1
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# One closing line for everything cargo's harness printed into the given logs (one
# "test result:" line per test binary).
summary() {
  awk '/test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
       END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$@"
}

host_suite() {
  scripts/deps.sh
  # (deps.sh also binds hugetlb to a v1 hierarchy on a hybrid host, for crun.)
  # --no-fail-fast: one failing test binary must not hide the results of the others.
  cargo test --no-fail-fast --all-targets "$@"
}

# Runs one part with its output teed into $logs/$1; returns its exit status.
part() {
  local name=$1
  shift
  set +e
  "$@" 2>&1 | tee "$logs/$name"
  local status=${PIPESTATUS[0]}
  set -e
  summary "$logs/$name"
  return "$status"
}

case "${1:-}" in
  --host) shift; part host host_suite "$@" ;;
  --node) shift; scripts/deps.sh; part node scripts/node-lane.sh "$@" ;;
  *)
    host=0 node=0
    echo "== host suite"
    part host host_suite "$@" || host=$?
    echo "== production-shaped node lane"
    part node scripts/node-lane.sh || node=$?
    echo "== whole suite (host + node lane)"
    summary "$logs/host" "$logs/node"
    [ "$host" = 0 ] && [ "$node" = 0 ]
    ;;
esac
