#!/usr/bin/env bash
# `cmake --install` into a scratch prefix: bin/floe, lib/libfloe.so with a versioned SONAME (and
# the .so.N / .so.N.M.P names), lib/libfloe.a, include/floe.h, lib/pkgconfig/floe.pc; then
# examples/generate.c is built against the installed copy through pkg-config, linked both shared
# and static, and run on models/default.gguf: it must load the model and generate floe's greedy
# text (the same as `floe run` prints).
# Env: FLOE_BIN (its directory's parent is the build tree), FLOE_TMP.
set -u
BIN=${FLOE_BIN:?FLOE_BIN not set}
BUILD=$(cd "$(dirname "$BIN")/.." && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
TMP=${FLOE_TMP:-/tmp}/install_sh.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
check() { local what=$1; shift; if "$@"; then pass=$((pass + 1)); echo "ok   $what"; else fail=$((fail + 1)); echo "FAIL $what"; fi; }
P=$TMP/prefix

cmake --install "$BUILD" --prefix "$P" >"$TMP/install.log" 2>&1
check "cmake --install exits 0" [ $? -eq 0 ] || tail -5 "$TMP/install.log"
LIB=$P/lib
[ -d "$P/lib64" ] && LIB=$P/lib64
check "bin/floe installed and runs" "$P/bin/floe" --version
check "include/floe.h installed" cmp -s "$P/include/floe.h" "$SRC/include/floe.h"
check "libfloe.a installed" [ -f "$LIB/libfloe.a" ]
check "libfloe.so installed" [ -e "$LIB/libfloe.so" ]
ver=$(sed -n 's/^#define FLOE_VERSION "\(.*\)"/\1/p' "$SRC/include/floe.h")
soname=$(readelf -d "$LIB/libfloe.so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check "SONAME libfloe.so.${ver%%.*} (got '$soname')" [ "$soname" = "libfloe.so.${ver%%.*}" ]
check "libfloe.so.$ver is the real file" [ -f "$LIB/libfloe.so.$ver" ] && [ ! -L "$LIB/libfloe.so.$ver" ]
check "libfloe.so exports the public API" sh -c "nm -D --defined-only '$LIB/libfloe.so' | grep -q ' T floe_generate$'"
check "floe.pc installed" [ -f "$LIB/pkgconfig/floe.pc" ]
export PKG_CONFIG_PATH=$LIB/pkgconfig
check "pkg-config --modversion = $ver" [ "$(pkg-config --modversion floe 2>/dev/null)" = "$ver" ]
check "pkg-config points into the prefix" sh -c "pkg-config --cflags floe | grep -q -- '-I$P/'"

cc -O1 "$SRC/examples/generate.c" $(pkg-config --cflags --libs floe) -Wl,-rpath,"$LIB" -o "$TMP/gen_shared" 2>"$TMP/cc.log"
check "example builds against the shared library" [ $? -eq 0 ] || cat "$TMP/cc.log"
check "example links libfloe.so.${ver%%.*}" sh -c "readelf -d '$TMP/gen_shared' | grep -q 'libfloe.so.${ver%%.*}'"
cc -O1 "$SRC/examples/generate.c" $(pkg-config --cflags floe) -o "$TMP/gen_static" "$LIB/libfloe.a" \
  $(pkg-config --libs-only-other --static floe) $(pkg-config --static --libs floe | sed 's/-lfloe//') 2>"$TMP/cc2.log"
check "example builds against the static library" [ $? -eq 0 ] || cat "$TMP/cc2.log"

MODEL=$SRC/models/default.gguf
want=$("$BIN" run -m "$MODEL" -p "def fib(n):" -n 24 -t 2 2>/dev/null)
for kind in shared static; do
  [ -x "$TMP/gen_$kind" ] || continue
  got=$("$TMP/gen_$kind" "$MODEL" "def fib(n):" 24 2>"$TMP/run.log")
  check "example ($kind) generates on models/default.gguf" [ $? -eq 0 ] || cat "$TMP/run.log"
  check "example ($kind) text = floe run's greedy text" [ "$got" = "def fib(n):$want" ]
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
