/* Synthetic byte-level BPE vocabularies (see synth_vocab.h for the layout and the invariants). */
#include "tok/synth_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tok/tokenizer.h"

/* Qwen2/3 special tokens in id order (151643..151668 in Qwen3's vocab); `control` = the
 * tokenizer's "special": true, which llama.cpp's converter maps to CONTROL, else USER_DEFINED. */
static const struct { const char *text; bool control; } qwen_specials[] = {
    {"<|endoftext|>", true},      {"<|im_start|>", true},     {"<|im_end|>", true},
    {"<|object_ref_start|>", true}, {"<|object_ref_end|>", true}, {"<|box_start|>", true},
    {"<|box_end|>", true},        {"<|quad_start|>", true},   {"<|quad_end|>", true},
    {"<|vision_start|>", true},   {"<|vision_end|>", true},   {"<|vision_pad|>", true},
    {"<|image_pad|>", true},      {"<|video_pad|>", true},    {"<tool_call>", false},
    {"</tool_call>", false},      {"<|fim_prefix|>", true},   {"<|fim_middle|>", true},
    {"<|fim_suffix|>", true},     {"<|fim_pad|>", true},      {"<|repo_name|>", true},
    {"<|file_sep|>", true},       {"<tool_response>", false}, {"</tool_response>", false},
    {"<think>", false},           {"</think>", false},
};
#define N_SPECIALS (sizeof qwen_specials / sizeof qwen_specials[0])

/* ChatML, the format of every Qwen chat model (reference/qwen-models.md §2f). */
static const char default_chat_template[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/* Words whose tokens the generated merges build first: frequent English words, Python
 * keywords and idioms, whitespace and punctuation runs. Each is added with a leading space
 * (GPT-2 style "Ġword") and without. */
static const char *const seed_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "at",
    "this", "are", "from", "or", "an", "have", "not", "but", "which", "you", "they", "his", "he", "she",
    "we", "can", "will", "all", "one", "has", "there", "their", "been", "more", "if", "would", "when",
    "who", "so", "what", "no", "out", "up", "about", "into", "than", "its", "only", "other", "some",
    "time", "could", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like",
    "our", "over", "also", "new", "me", "even", "most", "made", "after", "did", "many", "before", "must",
    "through", "back", "years", "where", "much", "your", "way", "well", "should", "because", "each",
    "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still",
    "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under",
    "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year",
    "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "I", "The", "A",
    "In", "It", "This", "We", "You", "model", "token", "value", "data", "file", "error", "result",
    "def", "return", "import", "class", "self", "None", "True", "False", "elif", "else", "while",
    "lambda", "try", "except", "finally", "raise", "yield", "pass", "break", "continue", "print", "len",
    "range", "list", "dict", "str", "int", "float", "__init__", "__name__", "__main__", "append",
    "items", "keys", "values", "isinstance", "assert", "global", "async", "await", "args", "kwargs",
    "ing", "ed", "er", "es", "ly", "tion", "ation", "ment", "ness", "able", "al", "ic", "ous", "ive",
    "s", "e", "y", "d", "t", "n", "r", "0", "1", "2", "00", "000", "10", "20", "2024", "http",
    "https", "://", "www", ".com", "json", "()", "):", "():", "==", "!=", "<=", ">=", "->", "+=",
    "-=", "//", "**", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "...", ",", ".", ":", ";", "\"\"\"",
    "  ", "    ", "        ", "\n", "\n\n", "\n    ", "\n        ", "\t", "\t\t",
};
#define N_SEED_WORDS (sizeof seed_words / sizeof seed_words[0])

/* ---- GPT-2 byte <-> unicode ---- */

/* Token id i (< 256) is the i-th byte in bytes_to_unicode() order: the bytes that spell
 * themselves (33..126, 161..172, 174..255), then the remapped ones (code point >= 256). */
static void byte_order(uint8_t order[256]) {
  int n = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int b = 0; b < 256; b++)
      if ((tok_byte_codepoint((uint8_t)b) >= 256) == (pass == 1)) order[n++] = (uint8_t)b;
}

/* ---- string -> id hash (open addressing, FNV-1a) ---- */

typedef struct vbuild {
  synth_vocab *v;
  uint64_t cap;    /* token slots (n_vocab) */
  uint64_t count;  /* tokens filled so far (generation) */
  uint64_t merge_cap;
  int64_t *slots;  /* id or -1 */
  uint64_t mask;
} vbuild;

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static int64_t lookup(const vbuild *b, const char *s) {
  for (uint64_t i = fnv(s) & b->mask;; i = (i + 1) & b->mask) {
    int64_t id = b->slots[i];
    if (id < 0) return -1;
    if (!strcmp(b->v->tokens[id], s)) return id;
  }
}

static void hash_insert(vbuild *b, int64_t id) {
  uint64_t i = fnv(b->v->tokens[id]) & b->mask;
  while (b->slots[i] >= 0) i = (i + 1) & b->mask;
  b->slots[i] = id;
}

static int vbuild_init(vbuild *b, synth_vocab *v, uint64_t n_vocab, uint64_t merge_cap) {
  memset(v, 0, sizeof *v);
  memset(b, 0, sizeof *b);
  b->v = v;
  v->bos = v->eos = v->pad = -1;
  v->n = n_vocab;
  b->cap = n_vocab;
  b->merge_cap = merge_cap;
  uint64_t hcap = 1024;
  while (hcap < 2 * n_vocab) hcap *= 2;
  b->mask = hcap - 1;
  v->tokens = calloc(n_vocab, sizeof *v->tokens);
  v->types = calloc(n_vocab, sizeof *v->types);
  v->merges = merge_cap ? calloc(merge_cap, sizeof *v->merges) : NULL;
  b->slots = malloc(hcap * sizeof *b->slots);
  if (!v->tokens || !v->types || (merge_cap && !v->merges) || !b->slots) return FLOE_E_NOMEM;
  memset(b->slots, 0xff, hcap * sizeof *b->slots);
  return 0;
}

/* Appends a token (takes ownership of s). Returns its id or -1 on OOM. */
static int64_t push_token(vbuild *b, char *s, int32_t type) {
  if (!s || b->count >= b->cap) {
    free(s);
    return -1;
  }
  int64_t id = (int64_t)b->count++;
  b->v->tokens[id] = s;
  b->v->types[id] = type;
  hash_insert(b, id);
  return id;
}

static char *join_merge(const char *l, const char *r) {
  size_t nl = strlen(l), nr = strlen(r);
  char *m = malloc(nl + nr + 2);
  if (!m) return NULL;
  memcpy(m, l, nl);
  m[nl] = ' ';
  memcpy(m + nl + 1, r, nr + 1);
  return m;
}

/* Adds the merge (l, r) -> l+r if l+r is not a token yet. 1 = added, 0 = exists, <0 = OOM. */
static int try_merge(vbuild *b, int64_t l, int64_t r) {
  const char *ls = b->v->tokens[l], *rs = b->v->tokens[r];
  size_t nl = strlen(ls), nr = strlen(rs);
  char *cat = malloc(nl + nr + 1);
  if (!cat) return FLOE_E_NOMEM;
  memcpy(cat, ls, nl);
  memcpy(cat + nl, rs, nr + 1);
  if (lookup(b, cat) >= 0) {
    free(cat);
    return 0;
  }
  char *m = join_merge(ls, rs);
  if (!m) {
    free(cat);
    return FLOE_E_NOMEM;
  }
  if (push_token(b, cat, SYNTH_TOK_NORMAL) < 0) {
    free(m);
    return FLOE_E_NOMEM;
  }
  b->v->merges[b->v->n_merges++] = m;
  return 1;
}

void synth_vocab_free(synth_vocab *v) {
  if (!v) return;
  if (v->tokens)
    for (uint64_t i = 0; i < v->n; i++) free(v->tokens[i]);
  if (v->merges)
    for (uint64_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
  free(v->tokens);
  free(v->types);
  free(v->merges);
  free(v->chat_template);
  memset(v, 0, sizeof *v);
  v->bos = v->eos = v->pad = -1;
}

int synth_vocab_generate(int64_t n_vocab, synth_vocab *v, char *err, size_t errlen) {
  if (n_vocab < 512 || n_vocab > ((int64_t)1 << 24))
    return floe_err(err, errlen, FLOE_E_INVALID, "vocab size %lld out of range 512..16M for a generated vocabulary",
                    (long long)n_vocab);
  /* Layout: 256 bytes | merges | specials | pads. Pads: 1/64 of the vocabulary, like the
   * unused tail of Qwen's padded embedding. */
  const uint64_t n_pad = (uint64_t)n_vocab / 64;
  const uint64_t n_merges = (uint64_t)n_vocab - 256 - N_SPECIALS - n_pad;
  vbuild b;
  int rc = vbuild_init(&b, v, (uint64_t)n_vocab, n_merges);
  if (rc) goto oom;
  uint8_t order[256];
  byte_order(order);
  for (int i = 0; i < 256; i++)
    if (push_token(&b, tok_bytelevel_encode((const char *)&order[i], 1), SYNTH_TOK_NORMAL) < 0) goto oom;
  int64_t byte_id[256];
  for (int i = 0; i < 256; i++) byte_id[order[i]] = i;

  /* Phase A: seed words, each built left to right: (prefix, next byte) -> longer prefix. */
  for (size_t w = 0; w < 2 * N_SEED_WORDS && v->n_merges < n_merges; w++) {
    const char *word = seed_words[w / 2];
    const bool spaced = (w % 2) == 0;
    if (spaced && (word[0] == ' ' || word[0] == '\n' || word[0] == '\t')) continue;
    uint8_t buf[64];
    size_t len = 0;
    if (spaced) buf[len++] = ' ';
    size_t wl = strlen(word);
    if (wl + len > sizeof buf) continue;
    memcpy(buf + len, word, wl);
    len += wl;
    int64_t cur = byte_id[buf[0]];
    for (size_t i = 1; i < len && v->n_merges < n_merges; i++) {
      int r = try_merge(&b, cur, byte_id[buf[i]]);
      if (r < 0) goto oom;
      char *enc = tok_bytelevel_encode((const char *)buf, i + 1);
      if (!enc) goto oom;
      cur = lookup(&b, enc);
      free(enc);
      FLOE_ASSERT(cur >= 0);
    }
  }
  /* Phase B: pairs of tokens in diagonal order over the merged tokens (then the bytes),
   * skipping pairs whose concatenation is already a token or longer than 24 bytes. */
  {
    const uint64_t first = 256;
    uint64_t tries = 0;
    for (uint64_t s = 0; v->n_merges < n_merges; s++) {
      for (uint64_t i = 0; i <= s && v->n_merges < n_merges; i++) {
        uint64_t j = s - i;
        /* index k of the pair list: merged tokens first (ids 256..), then the bytes */
        uint64_t n_list = b.count;
        if (i >= n_list || j >= n_list) continue;
        int64_t li = (int64_t)(i < n_list - first ? first + i : i - (n_list - first));
        int64_t ri = (int64_t)(j < n_list - first ? first + j : j - (n_list - first));
        if (strlen(v->tokens[li]) + strlen(v->tokens[ri]) > 24) continue;
        int r = try_merge(&b, li, ri);
        if (r < 0) goto oom;
        if (++tries > 64ull * (uint64_t)n_vocab + 1000000ull) {
          synth_vocab_free(v);
          free(b.slots);
          return floe_err(err, errlen, FLOE_E_INVALID, "could not generate %llu merges", (unsigned long long)n_merges);
        }
      }
    }
  }
  for (size_t i = 0; i < N_SPECIALS; i++) {
    char *s = strdup(qwen_specials[i].text);
    if (push_token(&b, s, qwen_specials[i].control ? SYNTH_TOK_CONTROL : SYNTH_TOK_USER_DEFINED) < 0) goto oom;
  }
  while (b.count < b.cap) {
    char name[32];
    snprintf(name, sizeof name, "[PAD%llu]", (unsigned long long)b.count);
    if (push_token(&b, strdup(name), SYNTH_TOK_UNUSED) < 0) goto oom;
  }
  v->bos = lookup(&b, "<|endoftext|>");
  v->pad = v->bos;
  v->eos = lookup(&b, "<|im_end|>");
  v->chat_template = strdup(default_chat_template);
  free(b.slots);
  if (!v->chat_template) {
    synth_vocab_free(v);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  return 0;
oom:
  free(b.slots);
  synth_vocab_free(v);
  return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory generating the vocabulary");
}

/* ---- tokenizer.json ---- */

/* A sibling file of path (same directory). */
/* Through tok_json_parse (tokenizer.h states the rules), so the GGUF gets the tokens, types and
 * special ids that floe's own tokenizer reads from the same file. */
int synth_vocab_from_tokenizer_json(const char *path, int64_t n_vocab, synth_vocab *v, char *err, size_t errlen) {
  memset(v, 0, sizeof *v);
  v->bos = v->eos = v->pad = -1;
  if (n_vocab < 1 || n_vocab > ((int64_t)1 << 24))
    return floe_err(err, errlen, FLOE_E_INVALID, "vocab size %lld out of range", (long long)n_vocab);
  size_t len = 0;
  char *text;
  int rc = floe_read_file(path, (size_t)1 << 30, &text, &len, err, errlen);
  if (rc) return rc == FLOE_E_NOTFOUND ? FLOE_E_IO : rc; /* kept: test_model_meta expects FLOE_E_IO for a missing file */
  tok_json j;
  rc = tok_json_parse(text, len, path, path, &j, err, errlen);
  free(text);
  if (rc) return rc;
  char nm[200];
  floe_show(nm, sizeof nm, path);
  if (j.n > n_vocab) {
    int32_t hi = j.n - 1;
    char s1[64];
    rc = floe_err(err, errlen, FLOE_E_INVALID, "%s: token '%s' has id %d, outside the model's vocabulary of %lld", nm,
                  floe_show(s1, sizeof s1, j.text[hi]), (int)hi, (long long)n_vocab);
    goto done;
  }
  v->n = (uint64_t)n_vocab;
  v->tokens = calloc((size_t)n_vocab, sizeof *v->tokens);
  v->types = calloc((size_t)n_vocab, sizeof *v->types);
  v->merges = calloc((size_t)(j.n_merges ? j.n_merges : 1), sizeof *v->merges);
  if (!v->tokens || !v->types || !v->merges) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  for (int64_t i = 0; i < n_vocab; i++) {
    char pad[32];
    const bool named = i < j.n && j.text[i];
    if (!named) snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
    v->tokens[i] = strdup(named ? j.text[i] : pad);
    v->types[i] = named ? j.type[i] : SYNTH_TOK_UNUSED; /* enum tok_type and synth_token_type share values */
    if (!v->tokens[i]) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      goto done;
    }
  }
  for (int32_t r = 0; r < j.n_merges; r++) {
    const tok_json_merge *m = &j.merges[r];
    char *s = malloc(m->na + m->nb + 2);
    if (!s) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      goto done;
    }
    memcpy(s, m->a, m->na);
    s[m->na] = ' ';
    memcpy(s + m->na + 1, m->b, m->nb);
    s[m->na + 1 + m->nb] = 0;
    v->merges[v->n_merges++] = s;
  }
  v->eos = j.eos, v->pad = j.pad, v->bos = j.bos;
  v->chat_template = j.chat_template ? j.chat_template : strdup(default_chat_template);
  j.chat_template = NULL;
  if (!v->chat_template) rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
done:
  tok_json_free(&j);
  if (rc) synth_vocab_free(v);
  return rc;
}

int synth_vocab_to_gguf(gguf_writer *w, const synth_vocab *v, const char *pre) {
  int rc;
  if ((rc = gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2"))) return rc;
  if ((rc = gguf_writer_add_str(w, "tokenizer.ggml.pre", pre))) return rc;
  if ((rc = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->n))) return rc;
  if ((rc = gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, v->n))) return rc;
  if ((rc = gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, v->n_merges))) return rc;
  if (v->eos >= 0 && (rc = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos))) return rc;
  if (v->pad >= 0 && (rc = gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad))) return rc;
  if (v->bos >= 0 && (rc = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos))) return rc;
  if ((rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false))) return rc;
  if (v->chat_template && (rc = gguf_writer_add_str(w, "tokenizer.chat_template", v->chat_template))) return rc;
  return 0;
}
