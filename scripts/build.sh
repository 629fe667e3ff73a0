#!/usr/bin/env bash
# Configures and builds floe in ./build (Release). The binary lands at build/bin/floe.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
