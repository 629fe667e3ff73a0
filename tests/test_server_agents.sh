#!/usr/bin/env bash
# Real agent CLIs against floe serve on 127.0.0.1 (tests/js/agents/run.mjs): Codex (Responses API),
# Claude Code (Messages API) and Qwen Code (chat completions), pinned in tests/js/agents/package.json,
# each asking a scripted model for one tool call (read a file) and printing its answer.
# `npm install --no-save` (the committed lock) puts them in tests/js/agents/node_modules
# (git-ignored, kept between runs). Where the packages cannot be installed (no registry), the test
# is skipped (exit 77, ctest's skip code);
# any other failure fails it.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
bin="${FLOE_SERVER_BIN:-${FLOE_BIN:-$here/../build/bin/floe}}"
script_model="$(dirname "$bin")/floe_script_model"
[ -x "$bin" ] || fail "floe binary $bin not built"
[ -x "$script_model" ] || fail "$script_model not built"
command -v node >/dev/null || fail "node not found"
cd "$here/js/agents" || fail "no tests/js/agents"
tmp="${FLOE_TMP:-/tmp}"
mkdir -p "$tmp"
have() { for b in codex claude qwen; do [ -x "node_modules/.bin/$b" ] || return 1; done; }
if ! have; then
  # npm install with the committed lock, not npm ci: npm ci refuses this lock because an optional
  # per-platform dependency of one CLI (@teddyzhu/clipboard-*) cannot be resolved into it, which
  # made a fresh clone skip the test; npm install installs the locked versions and leaves the lock as is
  if ! ( flock 9; have || timeout 600 npm install --no-save --no-audit --no-fund --loglevel=error ) \
    9>"$tmp/floe-npm-ci-agents.lock"; then
    echo "skipped: npm install in tests/js/agents failed (the agent CLI packages cannot be installed here)"
    exit 77
  fi
fi
FLOE_BIN="$bin" FLOE_SCRIPT_MODEL="$script_model" FLOE_TMP="$tmp" FLOE_FIXTURES="${FLOE_FIXTURES:-$here/fixtures}" \
  timeout 500 node run.mjs
