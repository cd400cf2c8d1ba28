#!/usr/bin/env bash
# Runs gantry's whole test suite as root, installing what is missing (Debian's packages:
# scripts/deps.sh; the pinned upstream stack: scripts/stack.sh):
#   1. the host suite: unit tests and the integration tests against a private containerd
#      (Debian's 1.6), runc and crun on this machine; then the tests that run through
#      containerd's CRI once more, against containerd 2.3 and runc 1.4 from the stack;
#   2. critest through containerd 2.3 and through CRI-O, each for gantry and for the engine's
#      runc path, parity enforced (scripts/critest.sh);
#   3. the production-shaped node lane: the tests whose behaviour depends on the host's shape
#      (cgroup v2, systemd, capabilities, a Type=notify containerd), run inside the Debian
#      guest of scripts/node-vm.sh (scripts/node-lane.sh).
#
#   scripts/test.sh                     all three, then one closing line for the cargo tests
#   scripts/test.sh --host [CARGO ARGS] the host suite only (with CARGO ARGS: only those)
#   scripts/test.sh --critest           critest only
#   scripts/test.sh --node [FILTERS]    the node lane only
#
# Each cargo part ends with "tests: N passed, N failed, N skipped". Tests that need the node
# are ignored on the host (cargo prints the reason) and counted as skipped there.
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
  scripts/stack.sh
  # --no-fail-fast: one failing test binary must not hide the results of the others.
  if [ $# -gt 0 ]; then
    cargo test --no-fail-fast --all-targets "$@"
    return
  fi
  local status=0
  cargo test --no-fail-fast --all-targets || status=$?
  echo "== the CRI tests again, through containerd 2.3 and runc 1.4 (scripts/stack.sh)"
  GANTRY_TEST_ENGINE_BIN=$(scripts/stack.sh --dir) \
    cargo test --no-fail-fast --test integration -- cri:: cri_exec:: cri_restart:: || status=$?
  return "$status"
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
  --critest) scripts/deps.sh; scripts/critest.sh containerd && scripts/critest.sh crio ;;
  *)
    host=0 critest=0 node=0
    echo "== host suite"
    part host host_suite "$@" || host=$?
    echo "== critest through containerd 2.3, then CRI-O: gantry and runc, parity enforced"
    scripts/critest.sh containerd || critest=$?
    scripts/critest.sh crio || critest=$?
    echo "== production-shaped node lane"
    part node scripts/node-lane.sh || node=$?
    echo "== whole suite (host + node lane; critest: $([ "$critest" = 0 ] && echo parity held || echo FAILED))"
    summary "$logs/host" "$logs/node"
    [ "$host" = 0 ] && [ "$critest" = 0 ] && [ "$node" = 0 ]
    ;;
esac
