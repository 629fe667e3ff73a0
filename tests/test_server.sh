#!/usr/bin/env bash
# floe serve end to end: the official openai and @anthropic-ai/sdk npm clients (tests/js/server,
# pinned in package.json) against real servers on 127.0.0.1 — chat / completions / responses /
# Anthropic messages / streaming / usage / stop /
# seeds / logprobs / errors / prefix reuse / disconnects, scripted models that really generate
# Qwen3 JSON and Qwen3.5 XML tool calls and <think> blocks, 32x20 concurrent load, bounded fuzz.
# `npm ci` runs when node_modules is missing; if it fails (offline) the test FAILS.
# FLOE_SERVER_BIN overrides the floe binary (e.g. an AddressSanitizer build, see test_server_asan.sh).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
bin="${FLOE_SERVER_BIN:-${FLOE_BIN:-$here/../build/bin/floe}}"
script_model="$(dirname "$bin")/floe_script_model"
[ -x "$bin" ] || fail "floe binary $bin not built"
[ -x "$script_model" ] || fail "$script_model not built"
command -v node >/dev/null || fail "node not found"
cd "$here/js/server" || fail "no tests/js/server"
tmp="${FLOE_TMP:-/tmp}"
mkdir -p "$tmp"
have() { [ -f node_modules/openai/package.json ] && [ -f node_modules/@anthropic-ai/sdk/package.json ]; }
if ! have; then
  ( flock 9; have || npm ci --no-audit --no-fund --loglevel=error ) 9>"$tmp/floe-npm-ci-server.lock" \
    || fail "npm ci in tests/js/server failed"
fi
FLOE_BIN="$bin" FLOE_SCRIPT_MODEL="$script_model" FLOE_TMP="$tmp" FLOE_FIXTURES="${FLOE_FIXTURES:-$here/fixtures}" \
  timeout 300 node run.mjs
