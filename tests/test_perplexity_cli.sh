#!/usr/bin/env bash
# floe perplexity end to end on the default model (test_perplexity.c checks the value itself):
# a base compared with itself gives KLD 0, agreement 1 and delta ppl 0; a floe-quantized copy of
# the model gives KLD > 0; bad input (missing files, a text shorter than one window, a base from
# another window, text or vocabulary, a corrupt base) fails with one line and a non-zero exit;
# no progress output when stderr is not a terminal, a bar when it is (script(1) gives a pty).
set -u
B="${FLOE_BIN:?}"
FX="${FLOE_FIXTURES:?}"
M="$FX/../../models/default.gguf"
TXT="$FX/text/heldout_wsgiref_util.py.txt"
T="${FLOE_TMP:-/tmp}/ppl.$$"
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $1"; fi; }
num() { sed -n "s/.*\"$1\":\([-0-9.e]*\).*/\1/p" "$2" | tail -1; }
# one line on stderr, starting "floe: ", and a non-zero exit
one_line_error() { [ "$1" -ne 0 ] && [ "$(wc -l <"$2")" -eq 1 ] && grep -q '^floe: ' "$2"; }

P=(perplexity -m "$M" -f "$TXT" -c 128 --chunks 2)
"$B" "${P[@]}" --json --save-logits "$T/base.lgp" >"$T/base.out" 2>"$T/base.err"
ok "base run exits 0 and writes the logits file" '[ $? -eq 0 ] && [ -s "$T/base.lgp" ]'
ok "prints the final estimate" 'grep -Eq "^Final estimate: PPL = [0-9]+\.[0-9]+ \+/- [0-9]+\.[0-9]+$" "$T/base.out"'
ok "--json: the last line has ppl, ppl_err, tokens" 'tail -1 "$T/base.out" | grep -Eq "^\{\"ppl\":[0-9.]+,\"ppl_err\":[0-9.]+,\"tokens\":126,"'
ok "stderr holds no progress bar when it is not a terminal" '! grep -q $'"'"'\r'"'"' "$T/base.err" && [ "$(wc -l <"$T/base.err")" -le 1 ]'
ok "no temporary file left behind" '[ -z "$(ls "$T" | grep tmp)" ]'

"$B" "${P[@]}" --json --kld-base "$T/base.lgp" >"$T/self.out" 2>"$T/self.err"
ok "against itself: exit 0" '[ $? -eq 0 ]'
ok "against itself: KLD 0" '[ "$(num kld "$T/self.out")" = "0.00000000" ]'
ok "against itself: top-1 agreement 1" '[ "$(num top1 "$T/self.out")" = "1.000000" ]'
ok "against itself: delta ppl 0, base ppl = ppl" '[ "$(num dppl "$T/self.out")" = "0.000000" ] && [ "$(num base_ppl "$T/self.out")" = "$(num ppl "$T/base.out")" ]'
ok "text output names the figures" 'grep -q "^Mean KLD = " "$T/self.out" && grep -q "^Same top-1 = " "$T/self.out" && grep -q "^Delta PPL = " "$T/self.out"'
# -c taken from the base when not given
"$B" perplexity -m "$M" -f "$TXT" --kld-base "$T/base.lgp" --json >"$T/self2.out" 2>/dev/null
ok "-c defaults to the base's window" '[ "$(num ctx "$T/self2.out")" = "128" ] && [ "$(num kld "$T/self2.out")" = "0.00000000" ]'

"$B" quantize "$M" -o "$T/q4.gguf" --type q4_K >/dev/null 2>&1
ok "floe quantize --type q4_K" '[ -s "$T/q4.gguf" ]'
"$B" perplexity -m "$T/q4.gguf" -f "$TXT" --kld-base "$T/base.lgp" --json >"$T/q4.out" 2>"$T/q4.err"
ok "quantized against the base: exit 0" '[ $? -eq 0 ]'
ok "quantized against the base: KLD > 0" 'awk -v k="$(num kld "$T/q4.out")" "BEGIN { exit !(k > 0 && k < 1) }"'
ok "quantized against the base: base ppl is the base's" '[ "$(num base_ppl "$T/q4.out")" = "$(num ppl "$T/base.out")" ]'
echo "q4_K vs Q8_0: $(tail -1 "$T/q4.out")"

# bad input
"$B" perplexity -m "$M" -f "$T/missing.txt" 2>"$T/e1"; rc=$?
ok "missing text file: one-line error" 'one_line_error $rc "$T/e1"'
"$B" perplexity -m "$T/missing.gguf" -f "$TXT" 2>"$T/e2"; rc=$?
ok "missing model: one-line error" 'one_line_error $rc "$T/e2"'
head -c 200 "$TXT" >"$T/short.txt"
"$B" perplexity -m "$M" -f "$T/short.txt" -c 128 2>"$T/e3"; rc=$?
ok "text shorter than one window: one-line error" 'one_line_error $rc "$T/e3" && grep -q "fewer than one window" "$T/e3"'
"$B" perplexity -m "$M" -f "$TXT" -c 64 --kld-base "$T/base.lgp" 2>"$T/e4"; rc=$?
ok "base of another window: one-line error" 'one_line_error $rc "$T/e4" && grep -q "made with -c 128" "$T/e4"'
tail -c 3000 "$TXT" >"$T/other.txt"
"$B" perplexity -m "$M" -f "$T/other.txt" --kld-base "$T/base.lgp" 2>"$T/e5"; rc=$?
ok "base of another text: one-line error" 'one_line_error $rc "$T/e5" && grep -q "differs" "$T/e5"'
"$B" perplexity -m "$M" -f "$TXT" --chunks 5 --kld-base "$T/base.lgp" 2>"$T/e6"; rc=$?
ok "more windows than the base holds: one-line error" 'one_line_error $rc "$T/e6"'
"$B" synth --preset tiny-qwen35moe --seed 5 -o "$T/tiny.gguf" >/dev/null 2>&1
"$B" perplexity -m "$T/tiny.gguf" -f "$TXT" --kld-base "$T/base.lgp" 2>"$T/e7"; rc=$?
ok "base of another vocabulary: one-line error" 'one_line_error $rc "$T/e7"'
head -c 1000 "$T/base.lgp" >"$T/trunc.lgp"
"$B" perplexity -m "$M" -f "$TXT" --kld-base "$T/trunc.lgp" 2>"$T/e8"; rc=$?
ok "truncated base: one-line error" 'one_line_error $rc "$T/e8" && grep -q "truncated" "$T/e8"'
"$B" perplexity -m "$M" -f "$TXT" --kld-base "$TXT" 2>"$T/e9"; rc=$?
ok "a text file as base: one-line error" 'one_line_error $rc "$T/e9"'
"$B" perplexity -m "$M" -f "$TXT" -c 2 2>"$T/e10"; rc=$?
ok "-c 2: refused" '[ $rc -eq 2 ]'

# a progress bar on a terminal: bars appear after half a second, so the run must last longer
# (the text five times over, ~8k tokens: seconds even on a fast machine)
for k in 1 2 3 4 5; do cat "$TXT"; done >"$T/long.txt"
if script -qec true /dev/null >/dev/null 2>&1; then
  script -qec "\"$B\" perplexity -m \"$M\" -f \"$T/long.txt\" -c 512 -t 1" "$T/tty.log" >/dev/null 2>&1 </dev/null
  ok "on a terminal: a perplexity bar with a rate" 'grep -aq "perplexity \[" "$T/tty.log" && grep -aq "tok/s" "$T/tty.log"'
  grep -aq "perplexity \[" "$T/tty.log" || tail -c 600 "$T/tty.log"
else
  echo "skip: script(1) cannot open a pty here"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
