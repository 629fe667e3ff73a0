/* Byte-level BPE tokenizer (see tokenizer.h for the contract).
 *
 * Layout of a loaded vocabulary:
 *   - every token's raw bytes live in one pool (NUL after each, so tok_find can strcmp);
 *   - `norm` is an open-addressing hash of the byte-level tokens (NORMAL/UNKNOWN/BYTE/UNDEFINED)
 *     keyed by raw bytes; BPE results and single bytes are looked up there;
 *   - `merges` maps the id pair (left, right) to (rank, merged id): the whole BPE runs on ids,
 *     never on strings;
 *   - added tokens (CONTROL, USER_DEFINED) are kept in per-first-byte buckets, longest first,
 *     for the leftmost-longest split before pre-tokenization. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/tokenizer.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define TOK_MAX_VOCAB (1 << 24) /* sanity bound on ids from files */

typedef struct merge_ent { uint64_t key; int32_t rank; int32_t result; } merge_ent;

struct tok_vocab {
  int32_t n;
  char *pool;          /* all pieces, NUL-separated */
  uint64_t *off;       /* [n] offset of piece i in pool */
  uint32_t *len;       /* [n] bytes */
  uint8_t *type;       /* [n] enum tok_type */
  int32_t *norm;       /* hash table of ids (-1 empty), size norm_cap (power of two) */
  uint64_t norm_cap;
  merge_ent *merges;   /* hash table (key 0 = empty; keys are (a+1)<<32 | (b+1)) */
  uint64_t merges_cap;
  int32_t n_merges;
  int32_t byte_id[256];
  int32_t *special;    /* ids of added tokens, grouped by first byte, longest first */
  int32_t special_start[257];
  int pre;
  pcre2_code *re;
  int32_t bos, eos, eot, pad, im_end, endoftext;
  char *chat_template;
};

/* ---------------------------------------------------------------------------------------------
 * small growable buffers */
void tok_ids_free(tok_ids *a) {
  free(a->v);
  a->v = NULL;
  a->n = a->cap = 0;
}

static int ids_push(tok_ids *a, int32_t id) {
  if (a->n == a->cap) {
    size_t nc = a->cap ? a->cap * 2 : 64;
    int32_t *v = realloc(a->v, nc * sizeof *v);
    if (!v) return FLOE_E_NOMEM;
    a->v = v;
    a->cap = nc;
  }
  a->v[a->n++] = id;
  return 0;
}

void tok_buf_free(tok_buf *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
}

int tok_buf_append(tok_buf *b, const void *data, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 64;
    while (nc < b->n + n + 1) nc *= 2;
    char *p = realloc(b->p, nc);
    if (!p) return FLOE_E_NOMEM;
    b->p = p;
    b->cap = nc;
  }
  if (n) memcpy(b->p + b->n, data, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * GPT-2 byte <-> unicode map: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in increasing byte order (bytes_to_unicode() in GPT-2's encoder.py). */
static uint16_t b2u[256];
static int16_t u2b[324];
static int map_ready;

static void byte_map_init(void) {
  if (__atomic_load_n(&map_ready, __ATOMIC_ACQUIRE)) return;
  uint16_t tb[256];
  int16_t tu[324];
  int k = 0;
  for (int i = 0; i < 324; i++) tu[i] = -1;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    tb[b] = printable ? (uint16_t)b : (uint16_t)(256 + k++);
    tu[tb[b]] = (int16_t)b;
  }
  memcpy(b2u, tb, sizeof tb);
  memcpy(u2b, tu, sizeof tu);
  __atomic_store_n(&map_ready, 1, __ATOMIC_RELEASE);
}

uint32_t tok_byte_codepoint(uint8_t b) {
  byte_map_init();
  return b2u[b];
}

char *tok_bytelevel_encode(const char *s, size_t n) {
  byte_map_init();
  if (n > (SIZE_MAX - 1) / 2) return NULL;
  char *out = malloc(2 * n + 1);
  if (!out) return NULL;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t c = b2u[(uint8_t)s[i]];
    if (c < 0x80) out[o++] = (char)c;
    else {
      out[o++] = (char)(0xC0 | (c >> 6));
      out[o++] = (char)(0x80 | (c & 0x3F));
    }
  }
  out[o] = 0;
  return out;
}

/* Decodes one UTF-8 code point; returns its length or 0 when invalid. */
static int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
  if (n == 0) return 0;
  uint8_t c = s[0];
  if (c < 0x80) { *cp = c; return 1; }
  int len;
  uint32_t v;
  if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; }
  else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0F; }
  else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07; }
  else return 0;
  if ((size_t)len > n) return 0;
  for (int i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if ((len == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)))
    return 0;
  *cp = v;
  return len;
}

/* Byte-level text -> raw bytes, into dst (capacity >= n). Returns the raw length or -1. */
static int64_t bytelevel_decode(const char *s, size_t n, char *dst) {
  size_t i = 0, o = 0;
  while (i < n) {
    uint32_t cp;
    int l = utf8_decode((const uint8_t *)s + i, n - i, &cp);
    if (!l || cp >= 324 || u2b[cp] < 0) return -1;
    dst[o++] = (char)u2b[cp];
    i += (size_t)l;
  }
  return (int64_t)o;
}

/* ---------------------------------------------------------------------------------------------
 * hashing */
static uint64_t hash_bytes(const void *p, size_t n) {
  const uint8_t *s = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static const char *piece(const tok_vocab *t, int32_t id) { return t->pool + t->off[id]; }

static bool is_bytelevel_type(uint8_t ty) {
  return ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_BYTE || ty == TOK_TYPE_UNDEFINED;
}

static int32_t norm_find(const tok_vocab *t, const char *s, size_t n) {
  uint64_t m = t->norm_cap - 1;
  for (uint64_t h = hash_bytes(s, n) & m;; h = (h + 1) & m) {
    int32_t id = t->norm[h];
    if (id < 0) return -1;
    if (t->len[id] == n && memcmp(piece(t, id), s, n) == 0) return id;
  }
}

/* Inserts id unless its bytes are already present (the first id wins). */
static void norm_insert(tok_vocab *t, int32_t id) {
  uint64_t m = t->norm_cap - 1;
  const char *s = piece(t, id);
  size_t n = t->len[id];
  for (uint64_t h = hash_bytes(s, n) & m;; h = (h + 1) & m) {
    int32_t o = t->norm[h];
    if (o < 0) { t->norm[h] = id; return; }
    if (t->len[o] == n && memcmp(piece(t, o), s, n) == 0) return;
  }
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1); }

static const merge_ent *merge_find(const tok_vocab *t, int32_t a, int32_t b) {
  uint64_t key = pair_key(a, b), m = t->merges_cap - 1;
  for (uint64_t h = hash_u64(key) & m;; h = (h + 1) & m) {
    const merge_ent *e = &t->merges[h];
    if (e->key == key) return e;
    if (e->key == 0) return NULL;
  }
}

/* Returns false when the pair was already present (the first, lowest rank, wins). */
static bool merge_insert(tok_vocab *t, int32_t a, int32_t b, int32_t rank, int32_t result) {
  uint64_t key = pair_key(a, b), m = t->merges_cap - 1;
  for (uint64_t h = hash_u64(key) & m;; h = (h + 1) & m) {
    merge_ent *e = &t->merges[h];
    if (e->key == key) return false;
    if (e->key == 0) {
      e->key = key;
      e->rank = rank;
      e->result = result;
      return true;
    }
  }
}

static uint64_t pow2_at_least(uint64_t x) {
  uint64_t c = 16;
  while (c < x) c <<= 1;
  return c;
}

/* ---------------------------------------------------------------------------------------------
 * pre-tokenizer regexes. `\s` is spelled out as the Unicode White_Space set (what HF tokenizers'
 * Oniguruma and llama.cpp use; PCRE2's UCP \s would miss U+0085), and (?i:'s|...) as explicit
 * ASCII case classes like llama.cpp (no Unicode case folding of 's' to U+017F). */
#define WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTRACTIONS "'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"
#define WS_TAIL "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
static const char *const RE_QWEN2 =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL;
static const char *const RE_QWEN35 =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" WS_TAIL;

static int compile_regex(tok_vocab *t, char *err, size_t errlen) {
  const char *pat = t->pre == TOK_PRE_QWEN35 ? RE_QWEN35 : RE_QWEN2;
  int ec;
  PCRE2_SIZE eo;
  t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                        &ec, &eo, NULL);
  if (!t->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "tokenizer: regex compile failed at %zu: %s", (size_t)eo,
                    (const char *)msg);
  }
  /* JIT is an optimisation only: without it pcre2_match interprets the same pattern. */
  (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * building a vocabulary from token texts as stored in files */
typedef struct raw_tok { const char *s; size_t n; } raw_tok;

void tok_free(tok_vocab *t) {
  if (!t) return;
  free(t->pool);
  free(t->off);
  free(t->len);
  free(t->type);
  free(t->norm);
  free(t->merges);
  free(t->special);
  if (t->re) pcre2_code_free(t->re);
  free(t->chat_template);
  free(t);
}

/* Stage 1: pieces and types. Byte-level tokens are decoded to raw bytes; added tokens and unused
 * ones keep their literal text. */
static int build_pieces(tok_vocab *t, const raw_tok *toks, const uint8_t *types, int32_t n, const char *name,
                        char *err, size_t errlen) {
  byte_map_init();
  if (n < 256 || n > TOK_MAX_VOCAB) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %d tokens is out of range", name, (int)n);
  uint64_t total = 0;
  for (int32_t i = 0; i < n; i++)
    if (!floe_add_ok(total, toks[i].n + 1, &total))
      return floe_err(err, errlen, FLOE_E_OVERFLOW, "%s: token text too large", name);
  t->n = n;
  t->pool = malloc(total ? total : 1);
  t->off = malloc((size_t)n * sizeof *t->off);
  t->len = malloc((size_t)n * sizeof *t->len);
  t->type = malloc((size_t)n);
  if (!t->pool || !t->off || !t->len || !t->type) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name);
  uint64_t o = 0;
  for (int32_t i = 0; i < n; i++) {
    uint8_t ty = types[i];
    if (ty > TOK_TYPE_BYTE)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: token %d has unknown type %u", name, (int)i, ty);
    t->type[i] = ty;
    t->off[i] = o;
    if (toks[i].n > UINT32_MAX) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: token %d too long", name, (int)i);
    if (is_bytelevel_type(ty)) {
      int64_t l = bytelevel_decode(toks[i].s, toks[i].n, t->pool + o);
      if (l < 0) { /* toks[i].s may be a GGUF string: not NUL-terminated, only n bytes are its own */
        char s1[48];
        return floe_err(err, errlen, FLOE_E_FORMAT,
                        "%s: token %d '%s' is not byte-level text (a character outside the GPT-2 byte map)", name,
                        (int)i, floe_show_n(s1, sizeof s1, toks[i].s, toks[i].n));
      }
      t->len[i] = (uint32_t)l;
    } else {
      if (toks[i].n) memcpy(t->pool + o, toks[i].s, toks[i].n);
      t->len[i] = (uint32_t)toks[i].n;
    }
    o += t->len[i];
    t->pool[o++] = 0;
  }
  /* byte-level lookup table */
  t->norm_cap = pow2_at_least((uint64_t)n * 2);
  t->norm = malloc(t->norm_cap * sizeof *t->norm);
  if (!t->norm) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name);
  for (uint64_t i = 0; i < t->norm_cap; i++) t->norm[i] = -1;
  for (int32_t i = 0; i < n; i++)
    if (is_bytelevel_type(t->type[i]) && t->len[i] > 0) norm_insert(t, i);
  for (int b = 0; b < 256; b++) {
    char c = (char)b;
    t->byte_id[b] = norm_find(t, &c, 1);
    if (t->byte_id[b] < 0)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: byte-level vocabulary lacks the token for byte 0x%02X", name, b);
  }
  /* added tokens, bucketed by first byte, longest first */
  int32_t cnt[256] = {0}, ns = 0;
  for (int32_t i = 0; i < n; i++)
    if ((t->type[i] == TOK_TYPE_CONTROL || t->type[i] == TOK_TYPE_USER_DEFINED) && t->len[i] > 0) {
      cnt[(uint8_t)piece(t, i)[0]]++;
      ns++;
    }
  t->special = malloc((size_t)(ns ? ns : 1) * sizeof *t->special);
  if (!t->special) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name);
  t->special_start[0] = 0;
  for (int b = 0; b < 256; b++) t->special_start[b + 1] = t->special_start[b] + cnt[b];
  int32_t fill[256];
  for (int b = 0; b < 256; b++) fill[b] = t->special_start[b];
  for (int32_t i = 0; i < n; i++)
    if ((t->type[i] == TOK_TYPE_CONTROL || t->type[i] == TOK_TYPE_USER_DEFINED) && t->len[i] > 0) {
      int b = (uint8_t)piece(t, i)[0];
      int32_t k = fill[b]++;
      /* insertion sort by length, descending (buckets are tiny) */
      while (k > t->special_start[b] && t->len[t->special[k - 1]] < t->len[i]) {
        t->special[k] = t->special[k - 1];
        k--;
      }
      t->special[k] = i;
    }
  return 0;
}

/* Stage 2: merges. a/b are byte-level texts. */
static int add_merge(tok_vocab *t, int32_t rank, const char *a, size_t na, const char *b, size_t nb, char *scratch,
                     const char *name, char *err, size_t errlen) {
  char sa[48], sb[48];
  int64_t la = bytelevel_decode(a, na, scratch);
  int64_t lb = la < 0 ? -1 : bytelevel_decode(b, nb, scratch + la);
  if (la < 0 || lb < 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %d '%s %s' is not byte-level text", name, (int)rank,
                    floe_show_n(sa, sizeof sa, a, na), floe_show_n(sb, sizeof sb, b, nb));
  int32_t ia = norm_find(t, scratch, (size_t)la), ib = norm_find(t, scratch + la, (size_t)lb);
  if (ia < 0 || ib < 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %d '%s %s' references a token not in the vocabulary", name, (int)rank,
                    floe_show_n(sa, sizeof sa, a, na), floe_show_n(sb, sizeof sb, b, nb));
  int32_t r = norm_find(t, scratch, (size_t)(la + lb));
  if (r < 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %d '%s %s' makes a token not in the vocabulary", name, (int)rank,
                    floe_show_n(sa, sizeof sa, a, na), floe_show_n(sb, sizeof sb, b, nb));
  merge_insert(t, ia, ib, rank, r);
  return 0;
}

static int alloc_merges(tok_vocab *t, uint64_t n, const char *name, char *err, size_t errlen) {
  if (n > (uint64_t)TOK_MAX_VOCAB * 4) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %llu merges is absurd", name, (unsigned long long)n);
  t->merges_cap = pow2_at_least(n * 2 + 2);
  t->merges = calloc(t->merges_cap, sizeof *t->merges);
  if (!t->merges) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name);
  t->n_merges = (int32_t)n;
  return 0;
}

static size_t max_piece_len(const tok_vocab *t) {
  size_t m = 0;
  for (int32_t i = 0; i < t->n; i++)
    if (t->len[i] > m) m = t->len[i];
  return m;
}

static void find_specials(tok_vocab *t) {
  t->im_end = tok_find(t, "<|im_end|>");
  t->endoftext = tok_find(t, "<|endoftext|>");
}

/* ---------------------------------------------------------------------------------------------
 * GGUF */
static int gguf_id(const gguf_file *g, const char *key, int32_t n, int32_t *out, char *err, size_t errlen) {
  uint32_t v;
  *out = -1;
  int rc = gguf_get_u32(g, key, &v);
  if (rc == FLOE_E_NOTFOUND) return 0;
  if (rc) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s is not a token id", g->path, key);
  if (v >= (uint32_t)n) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s = %u is out of range (%d tokens)", g->path, key, v, (int)n);
  *out = (int32_t)v;
  return 0;
}

int tok_load_gguf(const gguf_file *g, tok_vocab **out, char *err, size_t errlen) {
  *out = NULL;
  const char *name = g->path ? g->path : "gguf";
  gguf_str model;
  if (gguf_get_str(g, "tokenizer.ggml.model", &model))
    return floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: no tokenizer (tokenizer.ggml.model missing)", name);
  if (!gguf_str_eq(model, "gpt2"))
  {
    char sm[48];
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: tokenizer model '%s' is not supported (only gpt2 byte-level BPE)",
                    name, floe_show_n(sm, sizeof sm, model.ptr, model.len));
  }
  int pre = TOK_PRE_QWEN2;
  gguf_str ps;
  if (gguf_get_str(g, "tokenizer.ggml.pre", &ps) == 0) {
    if (gguf_str_eq(ps, "qwen2")) pre = TOK_PRE_QWEN2;
    else if (gguf_str_eq(ps, "qwen35")) pre = TOK_PRE_QWEN35;
    else {
      char sp[48];
      return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: pre-tokenizer '%s' is not supported (qwen2, qwen35)", name,
                      floe_show_n(sp, sizeof sp, ps.ptr, ps.len));
    }
  }
  uint32_t at;
  uint64_t n;
  const gguf_value *tv = gguf_get_arr(g, "tokenizer.ggml.tokens", &at, &n);
  if (!tv || at != GGUF_TYPE_STRING) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tokenizer.ggml.tokens missing or not a string array", name);
  if (n < 256 || n > TOK_MAX_VOCAB) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %llu tokens is out of range", name, (unsigned long long)n);
  uint64_t ntt = 0;
  uint32_t tt = 0;
  const gguf_value *tyv = gguf_get_arr(g, "tokenizer.ggml.token_type", &tt, &ntt);
  if (tyv && ntt != n)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", name,
                    (unsigned long long)ntt, (unsigned long long)n);
  if (tyv && (tt == GGUF_TYPE_STRING || tt == GGUF_TYPE_ARRAY || tt == GGUF_TYPE_FLOAT32 || tt == GGUF_TYPE_FLOAT64))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tokenizer.ggml.token_type is not an integer array", name);
  uint64_t nm = 0;
  uint32_t mt = 0;
  const gguf_value *mv = gguf_get_arr(g, "tokenizer.ggml.merges", &mt, &nm);
  if (!mv || mt != GGUF_TYPE_STRING) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tokenizer.ggml.merges missing or not a string array", name);

  tok_vocab *t = calloc(1, sizeof *t);
  raw_tok *toks = malloc(n * sizeof *toks);
  uint8_t *types = malloc(n);
  char *scratch = NULL;
  int rc = 0;
  if (!t || !toks || !types) { rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name); goto fail; }
  t->pre = pre;
  for (uint64_t i = 0; i < n; i++) {
    toks[i].s = tv->strs[i].ptr;
    toks[i].n = tv->strs[i].len;
    int64_t ty = TOK_TYPE_NORMAL;
    if (tyv && gguf_arr_i64(tyv, i, &ty)) { rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: bad token_type[%llu]", name, (unsigned long long)i); goto fail; }
    if (ty < 0 || ty > TOK_TYPE_BYTE) { rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: token %llu has unknown type %lld", name, (unsigned long long)i, (long long)ty); goto fail; }
    types[i] = (uint8_t)ty;
  }
  if ((rc = build_pieces(t, toks, types, (int32_t)n, name, err, errlen))) goto fail;
  if ((rc = alloc_merges(t, nm, name, err, errlen))) goto fail;
  size_t mpl = max_piece_len(t);
  scratch = malloc(2 * mpl + 8);
  if (!scratch) { rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name); goto fail; }
  for (uint64_t i = 0; i < nm; i++) {
    gguf_str m = mv->strs[i];
    const char *sp = memchr(m.ptr, ' ', m.len);
    if (!sp || sp == m.ptr || sp + 1 == m.ptr + m.len || memchr(sp + 1, ' ', (size_t)(m.ptr + m.len - sp - 1))) {
      char sm[48];
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %llu '%s' is not of the form 'a b'", name, (unsigned long long)i,
                    floe_show_n(sm, sizeof sm, m.ptr, m.len));
      goto fail;
    }
    size_t na = (size_t)(sp - m.ptr), nb = (size_t)(m.len - na - 1);
    if (na + nb > 2 * mpl + 8) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %llu references a token not in the vocabulary", name, (unsigned long long)i);
      goto fail;
    }
    if ((rc = add_merge(t, (int32_t)i, m.ptr, na, sp + 1, nb, scratch, name, err, errlen))) goto fail;
  }
  if ((rc = gguf_id(g, "tokenizer.ggml.bos_token_id", t->n, &t->bos, err, errlen)) ||
      (rc = gguf_id(g, "tokenizer.ggml.eos_token_id", t->n, &t->eos, err, errlen)) ||
      (rc = gguf_id(g, "tokenizer.ggml.eot_token_id", t->n, &t->eot, err, errlen)) ||
      (rc = gguf_id(g, "tokenizer.ggml.padding_token_id", t->n, &t->pad, err, errlen)))
    goto fail;
  gguf_str ct;
  if (gguf_get_str(g, "tokenizer.chat_template", &ct) == 0) {
    t->chat_template = malloc(ct.len + 1);
    if (!t->chat_template) { rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name); goto fail; }
    memcpy(t->chat_template, ct.ptr, ct.len);
    t->chat_template[ct.len] = 0;
  }
  find_specials(t);
  if ((rc = compile_regex(t, err, errlen))) goto fail;
  free(toks);
  free(types);
  free(scratch);
  *out = t;
  return 0;
fail:
  free(toks);
  free(types);
  free(scratch);
  tok_free(t);
  return rc;
}

/* ---------------------------------------------------------------------------------------------
 * tokenizer.json: parsed by tok_json_parse (tokenizer_json.c, which states the rules), then built
 * like a GGUF vocabulary. path: where tokenizer_config.json is looked for (NULL: nowhere). */
static int load_json(const char *json, size_t len, const char *name, const char *path, tok_vocab **out, char *err,
                     size_t errlen) {
  *out = NULL;
  tok_json j;
  int rc = tok_json_parse(json, len, name, path, &j, err, errlen);
  if (rc) return rc;
  tok_vocab *t = NULL;
  raw_tok *toks = NULL;
  uint8_t *types = NULL;
  char *scratch = NULL;
  char (*pads)[32] = NULL;
  char nm[200];
  floe_show(nm, sizeof nm, name);
  if (j.pre < 0) {
    rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s", j.pre_why);
    goto done;
  }
  const int32_t n = j.n;
  if (n < 256) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: vocabulary of %lld tokens is too small", nm, (long long)n);
    goto done;
  }
  t = calloc(1, sizeof *t);
  toks = calloc((size_t)n, sizeof *toks);
  types = calloc((size_t)n, 1);
  int32_t holes = 0;
  for (int32_t i = 0; i < n; i++) holes += j.text[i] == NULL;
  pads = malloc((size_t)(holes ? holes : 1) * sizeof *pads);
  if (!t || !toks || !types || !pads) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", nm);
    goto done;
  }
  t->pre = j.pre;
  t->bos = t->eos = t->eot = t->pad = -1;
  for (int32_t i = 0, k = 0; i < n; i++) {
    if (j.text[i]) {
      toks[i].s = j.text[i];
      types[i] = j.type[i];
    } else { /* ids nobody names (padding): "[PAD<id>]", UNUSED, as convert_hf_to_gguf writes them */
      snprintf(pads[k], sizeof pads[k], "[PAD%lld]", (long long)i);
      toks[i].s = pads[k++];
      types[i] = TOK_TYPE_UNUSED;
    }
    toks[i].n = strlen(toks[i].s);
  }
  if ((rc = build_pieces(t, toks, types, n, nm, err, errlen))) goto done;
  if ((rc = alloc_merges(t, (uint64_t)j.n_merges, nm, err, errlen))) goto done;
  const size_t mpl = max_piece_len(t);
  scratch = malloc(2 * mpl + 8);
  if (!scratch) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", nm);
    goto done;
  }
  for (int32_t r = 0; r < j.n_merges; r++) {
    const tok_json_merge *m = &j.merges[r];
    if (m->na + m->nb > 2 * mpl + 8) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %d references a token not in the vocabulary", nm, (int)r);
      goto done;
    }
    if ((rc = add_merge(t, r, m->a, m->na, m->b, m->nb, scratch, nm, err, errlen))) goto done;
  }
  find_specials(t);
  t->eos = j.eos;
  t->pad = j.pad;
  t->bos = j.bos;
  rc = compile_regex(t, err, errlen);
done:
  free(toks);
  free(types);
  free(pads);
  free(scratch);
  tok_json_free(&j);
  if (rc) tok_free(t);
  else *out = t;
  return rc;
}

int tok_load_json_buffer(const char *json, size_t len, const char *name, tok_vocab **out, char *err, size_t errlen) {
  return load_json(json, len, name, NULL, out, err, errlen);
}

int tok_load_json(const char *path, tok_vocab **out, char *err, size_t errlen) {
  *out = NULL;
  char *buf;
  size_t n = 0;
  int rc = floe_read_file(path, (size_t)1 << 30, &buf, &n, err, errlen); /* Qwen's is ~11 MB */
  if (rc) return rc;
  rc = load_json(buf, n, path, path, out, err, errlen);
  free(buf);
  return rc;
}

/* ---------------------------------------------------------------------------------------------
 * properties */
int32_t tok_n_vocab(const tok_vocab *t) { return t->n; }
int tok_pre_type(const tok_vocab *t) { return t->pre; }
int tok_token_type(const tok_vocab *t, int32_t id) { return id >= 0 && id < t->n ? t->type[id] : -1; }
int32_t tok_bos(const tok_vocab *t) { return t->bos; }
int32_t tok_eos(const tok_vocab *t) { return t->eos; }
int32_t tok_pad(const tok_vocab *t) { return t->pad; }
const char *tok_chat_template(const tok_vocab *t) { return t->chat_template; }

bool tok_is_eog(const tok_vocab *t, int32_t id) {
  return id >= 0 && (id == t->eos || id == t->eot || id == t->im_end || id == t->endoftext);
}

const char *tok_piece(const tok_vocab *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->n) return NULL;
  if (len) *len = t->len[id];
  return piece(t, id);
}

int32_t tok_find(const tok_vocab *t, const char *text) {
  size_t n = strlen(text);
  if (n == 0) return -1;
  int b = (uint8_t)text[0];
  for (int32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
    int32_t id = t->special[k];
    if (t->len[id] == n && memcmp(piece(t, id), text, n) == 0) return id;
  }
  return norm_find(t, text, n);
}

/* ---------------------------------------------------------------------------------------------
 * BPE over one pre-token */
typedef struct bpe_sym { int32_t id, prev, next; } bpe_sym;
typedef struct bpe_cand { int32_t rank, pos, left, right; } bpe_cand;

typedef struct enc_scratch {
  bpe_sym *sym;
  size_t sym_cap;
  bpe_cand *heap;
  size_t heap_n, heap_cap;
} enc_scratch;

static bool cand_less(const bpe_cand *a, const bpe_cand *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(enc_scratch *s, bpe_cand c) {
  if (s->heap_n == s->heap_cap) {
    size_t nc = s->heap_cap ? s->heap_cap * 2 : 64;
    bpe_cand *h = realloc(s->heap, nc * sizeof *h);
    if (!h) return FLOE_E_NOMEM;
    s->heap = h;
    s->heap_cap = nc;
  }
  size_t i = s->heap_n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!cand_less(&c, &s->heap[p])) break;
    s->heap[i] = s->heap[p];
    i = p;
  }
  s->heap[i] = c;
  return 0;
}

static bpe_cand heap_pop(enc_scratch *s) {
  bpe_cand top = s->heap[0], last = s->heap[--s->heap_n];
  size_t i = 0, n = s->heap_n;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const bpe_cand *best = &last;
    if (l < n && cand_less(&s->heap[l], best)) { m = l; best = &s->heap[l]; }
    if (r < n && cand_less(&s->heap[r], best)) m = r;
    if (m == i) break;
    s->heap[i] = s->heap[m];
    i = m;
  }
  if (n) s->heap[i] = last;
  return top;
}

static int try_pair(const tok_vocab *t, enc_scratch *s, int32_t pos) {
  int32_t nx = s->sym[pos].next;
  if (nx < 0) return 0;
  const merge_ent *e = merge_find(t, s->sym[pos].id, s->sym[nx].id);
  if (!e) return 0;
  bpe_cand c = { e->rank, pos, s->sym[pos].id, s->sym[nx].id };
  return heap_push(s, c);
}

static int bpe_word(const tok_vocab *t, enc_scratch *s, const uint8_t *w, size_t n, tok_ids *out) {
  if (n == 1) return ids_push(out, t->byte_id[w[0]]);
  if (n > s->sym_cap) {
    bpe_sym *p = realloc(s->sym, n * sizeof *p);
    if (!p) return FLOE_E_NOMEM;
    s->sym = p;
    s->sym_cap = n;
  }
  for (size_t i = 0; i < n; i++) {
    s->sym[i].id = t->byte_id[w[i]];
    s->sym[i].prev = (int32_t)i - 1;
    s->sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  s->heap_n = 0;
  int rc;
  for (size_t i = 0; i + 1 < n; i++)
    if ((rc = try_pair(t, s, (int32_t)i))) return rc;
  while (s->heap_n) {
    bpe_cand c = heap_pop(s);
    bpe_sym *a = &s->sym[c.pos];
    if (a->id != c.left || a->next < 0) continue; /* stale */
    bpe_sym *b = &s->sym[a->next];
    if (b->id != c.right) continue;
    a->id = merge_find(t, c.left, c.right)->result;
    b->id = -1;
    a->next = b->next;
    if (a->next >= 0) s->sym[a->next].prev = c.pos;
    if (a->prev >= 0 && (rc = try_pair(t, s, a->prev))) return rc;
    if ((rc = try_pair(t, s, c.pos))) return rc;
  }
  for (int32_t i = 0; i >= 0; i = s->sym[i].next)
    if ((rc = ids_push(out, s->sym[i].id))) return rc;
  return 0;
}

/* Pre-tokenizes one fragment (no added tokens inside) and BPE-encodes each piece. */
static int encode_fragment(const tok_vocab *t, enc_scratch *s, pcre2_match_data *md, const char *text, size_t len,
                           tok_ids *out, char *err, size_t errlen) {
  size_t off = 0;
  int rc;
  while (off < len) {
    int m = pcre2_match(t->re, (PCRE2_SPTR)text, len, off, 0, md, NULL);
    size_t ms = len, me = len;
    if (m >= 0) {
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      ms = ov[0];
      me = ov[1];
      if (me <= ms) me = ms + 1; /* cannot happen (no alternative matches empty); never loop */
    } else if (m != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(m, msg, sizeof msg);
      return floe_err(err, errlen, FLOE_E_INVALID, "tokenizer: regex match failed: %s", (const char *)msg);
    }
    /* bytes no alternative matched (invalid UTF-8) form their own pre-token */
    if (ms > off && (rc = bpe_word(t, s, (const uint8_t *)text + off, ms - off, out))) goto nomem;
    if (ms < len && (rc = bpe_word(t, s, (const uint8_t *)text + ms, me - ms, out))) goto nomem;
    off = me;
  }
  return 0;
nomem:
  return floe_err(err, errlen, rc, "tokenizer: out of memory");
}

/* Longest added token starting at text[i] that is allowed here, or -1. */
static int32_t special_at(const tok_vocab *t, const char *text, size_t len, size_t i, bool parse_special) {
  int b = (uint8_t)text[i];
  for (int32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
    int32_t id = t->special[k];
    if (!parse_special && t->type[id] == TOK_TYPE_CONTROL) continue;
    if (t->len[id] <= len - i && memcmp(piece(t, id), text + i, t->len[id]) == 0) return id;
  }
  return -1;
}

int tok_encode(const tok_vocab *t, const char *text, size_t len, bool parse_special, tok_ids *out, char *err,
               size_t errlen) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
  if (!md) return floe_err(err, errlen, FLOE_E_NOMEM, "tokenizer: out of memory");
  enc_scratch s = {0};
  int rc = 0;
  size_t start = 0;
  for (size_t i = 0; i < len; i++) {
    if (t->special_start[(uint8_t)text[i]] == t->special_start[(uint8_t)text[i] + 1]) continue;
    int32_t id = special_at(t, text, len, i, parse_special);
    if (id < 0) continue;
    if (i > start && (rc = encode_fragment(t, &s, md, text + start, i - start, out, err, errlen))) goto done;
    if ((rc = ids_push(out, id))) { rc = floe_err(err, errlen, rc, "tokenizer: out of memory"); goto done; }
    i += t->len[id] - 1;
    start = i + 1;
  }
  if (len > start) rc = encode_fragment(t, &s, md, text + start, len - start, out, err, errlen);
done:
  free(s.sym);
  free(s.heap);
  pcre2_match_data_free(md);
  return rc;
}

/* ---------------------------------------------------------------------------------------------
 * decode */
int tok_decode(const tok_vocab *t, const int32_t *ids, size_t n, bool skip_special, tok_buf *out, char *err,
               size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->n)
      return floe_err(err, errlen, FLOE_E_INVALID, "decode: token id %d out of range (%d tokens)", (int)ids[i], (int)t->n);
    if (skip_special && t->type[ids[i]] == TOK_TYPE_CONTROL) continue;
    if (tok_buf_append(out, piece(t, ids[i]), t->len[ids[i]])) return floe_err(err, errlen, FLOE_E_NOMEM, "decode: out of memory");
  }
  if (!out->p && tok_buf_append(out, "", 0)) return floe_err(err, errlen, FLOE_E_NOMEM, "decode: out of memory");
  return 0;
}

void tok_stream_init(tok_stream *s) { s->npend = 0; }

static const char FFFD[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

static int seq_len(uint8_t c) { return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2; }

/* Is c acceptable as byte number `pos` (1-based) of a sequence starting with lead? */
static bool cont_ok(uint8_t lead, int pos, uint8_t c) {
  if (pos == 1) {
    if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
    if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
    if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
    if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
  }
  return c >= 0x80 && c <= 0xBF;
}

int tok_stream_bytes(tok_stream *s, const char *data, size_t n, tok_buf *out) {
  const uint8_t *d = (const uint8_t *)data;
  size_t run = 0; /* start of a run of plain ASCII / complete sequences to copy at once */
  size_t i = 0;
#define FLUSH_RUN(end) do { if ((end) > run && tok_buf_append(out, d + run, (end) - run)) return FLOE_E_NOMEM; } while (0)
  while (i < n) {
    uint8_t c = d[i];
    if (s->npend == 0) {
      if (c < 0x80) { i++; continue; }
      if ((c >= 0xC2 && c <= 0xF4)) {
        /* try to take the whole sequence from this chunk */
        int l = seq_len(c);
        int k = 1;
        while (k < l && i + (size_t)k < n && cont_ok(c, k, d[i + k])) k++;
        if (k == l) { i += (size_t)l; continue; }
        FLUSH_RUN(i);
        if (i + (size_t)k == n) { /* incomplete at the end of the chunk: hold it */
          memcpy(s->pend, d + i, (size_t)k);
          s->npend = k;
          i = n;
          run = n;
          continue;
        }
        /* broken by d[i+k]: the maximal subpart d[i..i+k) becomes one U+FFFD */
        if (tok_buf_append(out, FFFD, 3)) return FLOE_E_NOMEM;
        i += (size_t)k;
        run = i;
        continue;
      }
      FLUSH_RUN(i);
      if (tok_buf_append(out, FFFD, 3)) return FLOE_E_NOMEM;
      i++;
      run = i;
      continue;
    }
    /* continuing a held sequence */
    uint8_t lead = s->pend[0];
    if (cont_ok(lead, s->npend, c)) {
      s->pend[s->npend++] = c;
      i++;
      run = i;
      if (s->npend == seq_len(lead)) {
        if (tok_buf_append(out, s->pend, (size_t)s->npend)) return FLOE_E_NOMEM;
        s->npend = 0;
      }
      continue;
    }
    if (tok_buf_append(out, FFFD, 3)) return FLOE_E_NOMEM;
    s->npend = 0; /* re-examine c as a fresh byte */
    run = i;
  }
  FLUSH_RUN(n);
#undef FLUSH_RUN
  if (!out->p && tok_buf_append(out, "", 0)) return FLOE_E_NOMEM;
  return 0;
}

int tok_stream_push(tok_stream *s, const tok_vocab *t, int32_t id, tok_buf *out, char *err, size_t errlen) {
  if (id < 0 || id >= t->n)
    return floe_err(err, errlen, FLOE_E_INVALID, "decode: token id %d out of range (%d tokens)", (int)id, (int)t->n);
  if (tok_stream_bytes(s, piece(t, id), t->len[id], out)) return floe_err(err, errlen, FLOE_E_NOMEM, "decode: out of memory");
  return 0;
}

int tok_stream_flush(tok_stream *s, tok_buf *out) {
  if (s->npend) {
    s->npend = 0;
    if (tok_buf_append(out, FFFD, 3)) return FLOE_E_NOMEM;
  }
  if (!out->p && tok_buf_append(out, "", 0)) return FLOE_E_NOMEM;
  return 0;
}
