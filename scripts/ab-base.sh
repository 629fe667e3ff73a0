#!/usr/bin/env bash
# Run HERE: writes the sources of revision REV (default main) into .ab-base (ignored by git), for
# scripts/gpu-test.sh's build-base / abb35 sections (the device tool's `carry` takes .ab-base to
# the GPU machine beside the working tree): the same benchmark on two revisions in one call.
#   bash scripts/ab-base.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-main}
rm -rf .ab-base
mkdir -p .ab-base
git archive "$rev" CMakeLists.txt floe.pc.in include src bench tools examples tests/CMakeLists.txt tests/fuzz \
  $(git ls-tree --name-only "$rev" tests/ | grep -E '\.(c|h|sh)$') | tar -x -C .ab-base
git rev-parse "$rev" > .ab-base/REV
du -sh .ab-base
