#!/usr/bin/env bash
# Runs gantry's fuzz targets (fuzz/main.rs, proptest over the seeds in fuzz/corpus/) for
# GANTRY_FUZZ_SECS seconds each (default 60), all targets at once. A failure prints the shrunk
# input and records it in fuzz/regressions/, which every later run (and `cargo test`) replays:
# commit that file with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
export GANTRY_FUZZ_SECS=${GANTRY_FUZZ_SECS:-60}
# Root: the spec target makes fake device nodes with mknod.
if [ "$(id -u)" != 0 ]; then
  echo "fuzz.sh: the spec target makes device nodes; run as root" >&2
  exit 1
fi
echo "== fuzz: ${GANTRY_FUZZ_SECS} s per target"
cargo test --test fuzz -- --nocapture --test-threads=8 2>&1 | grep -a -E '^fuzz |^test |test result|panicked|minimal failing' 
exit "${PIPESTATUS[0]}"
