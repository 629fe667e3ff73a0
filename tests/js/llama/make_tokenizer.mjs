// Writes a small byte-level BPE tokenizer.json of exactly N tokens (argv[2] = N, argv[3] = path)
// for the HF fixtures, which carry none: ids 0..255 are GPT-2's byte->unicode characters, then
// merges of common letter pairs and words, then <|endoftext|> as the last id. floe convert turns
// it into llama.cpp's "gpt2" tokenizer keys, which llama.cpp needs to load a file at all.
import { writeFileSync } from "node:fs";

const n = Number(process.argv[2]);
const out = process.argv[3];
function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let k = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + k++); }
  const m = new Map();
  bs.forEach((b, i) => m.set(b, String.fromCodePoint(cs[i])));
  return m;
}
const b2u = bytesToUnicode();
const vocab = {};
const order = [];
for (let b = 0; b < 256; b++) order.push(b2u.get(b));
order.forEach((t, i) => { vocab[t] = i; });
const merges = [];
const words = ["Ġthe", "Ġand", "Ġdef", "Ġreturn", "Ġworld", "hello", "Ġhello", "Ġfor", "Ġin", "Ġif", "self", "ing", "er", "on"];
const add = (a, b) => {
  const t = a + b;
  if (t in vocab || order.length >= n - 1) return;
  merges.push([a, b]); vocab[t] = order.length; order.push(t);
};
for (const w of words) { let cur = w[0]; for (const ch of w.slice(1)) { add(cur, ch); cur += ch; } }
const letters = "etaoinshrdlcumwfgypbvk".split("");
for (const a of ["Ġ", ...letters]) for (const b of letters) add(a, b);
for (let i = 0; order.length < n - 1; i++) add(order[97 + (i % 26)], order[97 + ((i * 7) % 26)] + String(i));
const eot = "<|endoftext|>";
const tok = {
  version: "1.0",
  added_tokens: [{ id: n - 1, content: eot, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
};
writeFileSync(out, JSON.stringify(tok));
