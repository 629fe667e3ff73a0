#!/usr/bin/env bash
# Chat templates: floe's C renderer (test_chat_render) against the models' own Jinja templates rendered
# by @huggingface/jinja, byte for byte, on tests/fixtures/tokenizer/chat_conversations.json.
# Installs the pinned node dependency with `npm ci` when tests/js/node_modules is missing; if that
# fails (no network, no npm) the test FAILS rather than skipping.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
fixtures="${FLOE_FIXTURES:-$here/fixtures}"
bin="$(dirname "${FLOE_BIN:-$here/../build/bin/floe}")/test_chat_render"
fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
[ -x "$bin" ] || fail "renderer binary $bin not built"
command -v node >/dev/null || fail "node not found"
cd "$here/js" || fail "no tests/js"
if [ ! -f node_modules/@huggingface/jinja/package.json ]; then
  # serialise concurrent installs (ctest -j) with a lock; npm ci is idempotent
  ( flock 9; [ -f node_modules/@huggingface/jinja/package.json ] || npm ci --no-audit --no-fund --loglevel=error ) 9>"${FLOE_TMP:-/tmp}/floe-npm-ci.lock" \
    || fail "npm ci in tests/js failed"
fi
node chat_oracle.mjs "$bin" "$fixtures/tokenizer/chat_conversations.json"
