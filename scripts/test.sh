#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs the bounded fuzzers, then every ctest test.
# ctest's summary is the last thing printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [ -f tests/run_fuzz.sh ]; then
  FUZZ_SECONDS="${FUZZ_SECONDS:-30}" bash tests/run_fuzz.sh
fi
ctest --test-dir build -j"$(nproc)" --output-on-failure
