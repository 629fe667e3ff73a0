#!/usr/bin/env bash
# GGUF files written by llama.cpp's own converter (convert_hf_to_gguf.py) from the HF fixtures
# (tests/fixtures/models/{qwen3moe,qwen35moe,qwen3next}), so floe's tests can check that floe
# reads what llama.cpp writes. Run where torch and transformers are installed (the GPU machine).
#
# llama.cpp is not part of floe: put its convert_hf_to_gguf.py, its conversion/ package and its
# gguf-py/ in an ignored folder (default .llama/ at the repository root), e.g. from a checkout:
#   git --git-dir=LLAMA.git archive HEAD convert_hf_to_gguf.py conversion gguf-py | tar -x -C .llama
#
# The HF fixtures carry no tokenizer, and the converter refuses a directory without one, so each is
# copied with tests/fixtures/llama_gguf/tokenizer-512.json (a 512-token byte-level BPE made by
# tests/js/llama/make_tokenizer.mjs). The converter identifies pre-tokenizers by hashing a test
# string's tokens; this made-up tokenizer is in no table, so the wrapper below names it "qwen2"
# (the Qwen byte-level pre-tokenizer, which is what floe's convert writes for these models too).
#
# Usage: tools/reference/llama_convert.sh [OUT_DIR]   (default tests/fixtures/llama_gguf)
# Writes OUT_DIR/{qwen3moe,qwen35moe,qwen3next}-{f32,q8_0}.gguf, OUT_DIR/versions.txt (converter
# and library versions, and which conversions failed) and OUT_DIR/convert.log (the converter's
# output). A failed conversion is recorded and the others still run; the exit status is 1 if any
# failed.
#
# On the GPU machine (through the device tool), from a worktree holding the converter in .llama/:
#   run  command: bash tools/reference/llama_convert.sh $OUT     carry: [".llama"]
# (7 files come back, each well under the tool's 16 MiB; copy the GGUFs into tests/fixtures/llama_gguf.)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LLAMA=${LLAMA_DIR:-$ROOT/.llama}
OUT=${1:-$ROOT/tests/fixtures/llama_gguf}
PY=${PYTHON:-python3}
for f in convert_hf_to_gguf.py gguf-py/gguf/__init__.py; do
  [ -e "$LLAMA/$f" ] || { echo "llama_convert.sh: $LLAMA/$f missing (see the header)" >&2; exit 1; }
done
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LOG=$OUT/convert.log
: >"$LOG"
failed=()

for a in qwen3moe qwen35moe qwen3next; do
  d="$TMP/$a"
  mkdir -p "$d"
  cp "$ROOT/tests/fixtures/models/$a/"{config.json,generation_config.json,model.safetensors} "$d/"
  cp "$ROOT/tests/fixtures/llama_gguf/tokenizer-512.json" "$d/tokenizer.json"
  printf '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "add_bos_token": false}\n' \
    >"$d/tokenizer_config.json"
  for t in f32 q8_0; do
    echo "== $a $t" >>"$LOG"
    "$PY" - "$LLAMA" "$d" "$OUT/$a-$t.gguf" "$t" >>"$LOG" 2>&1 <<'PYEOF'
import sys
llama, model_dir, out, outtype = sys.argv[1:5]
sys.path.insert(0, llama)
sys.path.insert(1, llama + "/gguf-py")
import convert_hf_to_gguf as conv
# The made-up fixture tokenizer is in none of the converter's pre-tokenizer hash tables.
bases = [getattr(conv, "TextModel", None)]
try:
    import conversion.base as cb
    bases.append(getattr(cb, "TextModel", None))
except ImportError:
    pass
for b in bases:
    if b is not None:
        b.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
import json, os
argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", outtype]
# The fixtures have no MTP layers; the converter asserts on Qwen3.5 / Qwen3-Next configs without
# mtp_num_hidden_layers unless told so (and refuses the flag for architectures without MTP).
cfg = json.load(open(os.path.join(model_dir, "config.json")))
if not cfg.get("mtp_num_hidden_layers") and any("Qwen3_5" in a or "Qwen3Next" in a for a in cfg.get("architectures", [])):
    argv.append("--no-mtp")
sys.argv = argv
conv.main()
PYEOF
    if [ $? -ne 0 ] || [ ! -s "$OUT/$a-$t.gguf" ]; then
      failed+=("$a-$t")
      rm -f "$OUT/$a-$t.gguf"
      echo "llama_convert.sh: $a $t FAILED (see $LOG)" >&2
    fi
  done
done
{
  # a commit only from the converter's own checkout (inside floe's tree, git would name floe's)
  if [ -e "$LLAMA/.git" ]; then v=$(git -C "$LLAMA" rev-parse HEAD)
  else v="convert_hf_to_gguf.py sha256 $(sha256sum "$LLAMA/convert_hf_to_gguf.py" | cut -c1-16)"; fi
  echo "llama.cpp converter: $v"
  "$PY" -c 'import torch, transformers, numpy; print("torch", torch.__version__, "transformers", transformers.__version__, "numpy", numpy.__version__)'
  echo "failed: ${failed[*]:-none}"
} >"$OUT/versions.txt" 2>&1
ls -la "$OUT"
[ ${#failed[@]} -eq 0 ]
