#!/usr/bin/env bash
# The main job: build floe, then generate text with the embedded default model,
# models/default.gguf (a 23M-parameter Qwen3.5-MoE coder trained for floe, see models/MODEL_CARD.md).
# If that file is missing (a partial checkout), a small random-weight qwen35moe from `floe synth`
# stands in, so every stage still runs (its text is gibberish).
# Extra arguments go to `floe run` (e.g. -p "text" -n 64 --temp 0.7).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >&2
model=models/default.gguf
if [ ! -f "$model" ]; then
  model=build/default-synth.gguf
  [ -f "$model" ] || build/bin/floe synth --preset tiny-qwen35moe --seed 1 -o "$model" >&2
fi
if [ $# -eq 0 ]; then set -- -p "def fibonacci(n):" -n 64; fi
exec build/bin/floe run -m "$model" "$@"
