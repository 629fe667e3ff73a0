#!/usr/bin/env bash
# On the GPU machine: unpack the build dependencies ($D: folder of .deb files), build floe with the
# CUDA kernels for sm_90 only, run the cuda-labelled tests and the CUDA ops benchmark. Logs go to
# $OUT (or ./gpu-out). Prints a short summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
P=/tmp/deps
if [ -n "${D:-}" ]; then for d in "$D"/*.deb; do dpkg -x "$d" "$P"; done; fi
export LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFLOE_CUDA=ON -DFLOE_CUDA_ARCHS=90-real \
  -DCMAKE_PREFIX_PATH=$P/usr > "$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j16 --target test_cuda_ops bench_cuda_ops >> "$OUT/build.log" 2>&1
echo "build rc=$?"
(cd build-gpu && timeout 300 ./bin/test_cuda_ops) > "$OUT/test.log" 2>&1
echo "test rc=$?"
timeout 200 ./build-gpu/bin/bench_cuda_ops > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -E "FAIL|passed" "$OUT/test.log" | tail -40
grep -E "max \|diff\|" "$OUT/test.log" | head
cat "$OUT/bench.log"
