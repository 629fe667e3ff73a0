#!/usr/bin/env bash
# test_server.sh again, with floe built with AddressSanitizer + UBSan (-DFLOE_ASAN=ON) and
# LeakSanitizer on: every server must exit 0 on SIGTERM with no sanitizer report (run.mjs checks
# each server's stderr). The ASan tree is built here (floe and floe_script_model only) in
# $FLOE_ASAN_BUILD (default: build-asan-server beside the sources), or give a built floe in
# FLOE_ASAN_BIN. The load and fuzz groups run in their smaller form (FLOE_SERVER_QUICK=1).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/.." && pwd)"
fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
bin="${FLOE_ASAN_BIN:-}"
if [ -z "$bin" ]; then
  build="${FLOE_ASAN_BUILD:-$src/build-asan-server}"
  ( flock 9
    cmake -S "$src" -B "$build" -DFLOE_ASAN=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
      cmake --build "$build" -j"$(nproc)" --target floe_cli floe_script_model >/dev/null
  ) 9>"${TMPDIR:-/tmp}/floe-asan-server-build.lock" || fail "AddressSanitizer build in $build failed"
  bin="$build/bin/floe"
fi
[ -x "$bin" ] || fail "no ASan floe binary at $bin"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$here/lsan_server.supp:print_suppressions=0"
FLOE_SERVER_BIN="$bin" FLOE_SERVER_QUICK=1 exec bash "$here/test_server.sh"
