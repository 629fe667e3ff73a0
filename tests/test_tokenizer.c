/* Tokenizer tests: llama.cpp's qwen2 vectors on the Qwen3 tokenizer.json, JS-tokenizer (HF port)
 * vectors for qwen2 and for the qwen35 regex, round trips, the streaming detokenizer, added-token
 * splitting, the GGUF loading path (a GGUF written from the same vocabulary), hostile inputs, and
 * the speed of a ~100k-token prompt. */
#include <stdint.h>

#include "base/base.h"
#include "format/gguf.h"
#include "test.h"
#include "tok/tokenizer.h"

#include <cjson/cJSON.h>

static const char *SEP = "\n__ggml_vocab_test__\n";

/* Splits the .inp file into cases (pointers into buf, NUL-terminated in place). */
static int split_cases(char *buf, char **cases, int max) {
  int n = 0;
  char *p = buf;
  for (;;) {
    char *q = strstr(p, SEP);
    if (!q) break;
    *q = 0;
    if (n < max) cases[n++] = p;
    p = q + strlen(SEP);
  }
  return n;
}

static bool ids_eq_line(const tok_ids *ids, const char *line, char *got, size_t gotn) {
  size_t o = 0;
  got[0] = 0;
  for (size_t i = 0; i < ids->n && o + 16 < gotn; i++) o += (size_t)snprintf(got + o, gotn - o, " %d", (int)ids->v[i]);
  const char *a = got, *b = line;
  while (*a == ' ') a++;
  while (*b == ' ') b++;
  return strcmp(a, b) == 0;
}

static bool utf8_valid(const char *s, size_t n) {
  size_t i = 0;
  const unsigned char *u = (const unsigned char *)s;
  while (i < n) {
    unsigned c = u[i];
    int l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (!l || i + (size_t)l > n) return false;
    for (int k = 1; k < l; k++)
      if ((u[i + k] & 0xC0) != 0x80) return false;
    if (l == 3 && ((c == 0xE0 && u[i + 1] < 0xA0) || (c == 0xED && u[i + 1] > 0x9F))) return false;
    if (l == 4 && ((c == 0xF0 && u[i + 1] < 0x90) || (c == 0xF4 && u[i + 1] > 0x8F))) return false;
    i += (size_t)l;
  }
  return true;
}

/* Encodes, compares with the expected ids, checks decode == text and the streamed text == text. */
static void check_case(const tok_vocab *t, const char *label, int idx, const char *text, size_t len, const int32_t *exp,
                       size_t nexp, const char *expline, bool parse_special) {
  char err[256];
  tok_ids ids = {0};
  int rc = tok_encode(t, text, len, parse_special, &ids, err, sizeof err);
  bool same;
  static char got[65536];
  if (expline) {
    same = rc == 0 && ids_eq_line(&ids, expline, got, sizeof got);
  } else {
    same = rc == 0 && ids.n == nexp && (nexp == 0 || memcmp(ids.v, exp, nexp * sizeof *exp) == 0);
    size_t o = 0;
    got[0] = 0;
    for (size_t i = 0; i < ids.n && o + 16 < sizeof got; i++) o += (size_t)snprintf(got + o, sizeof got - o, " %d", (int)ids.v[i]);
  }
  CHECK(same, "%s case %d encode matches (text '%.60s'; got%s)", label, idx, text, got);
  tok_buf dec = {0};
  rc = tok_decode(t, ids.v, ids.n, false, &dec, err, sizeof err);
  CHECK(rc == 0 && dec.n == len && memcmp(dec.p, text, len) == 0, "%s case %d decode(encode(x)) == x", label, idx);
  tok_buf_free(&dec);
  /* streaming: every chunk valid UTF-8, concatenation == text (text is valid UTF-8) */
  if (utf8_valid(text, len)) {
    tok_stream st;
    tok_stream_init(&st);
    tok_buf sb = {0};
    bool chunks_ok = true;
    for (size_t i = 0; i < ids.n; i++) {
      size_t before = sb.n;
      if (tok_stream_push(&st, t, ids.v[i], &sb, err, sizeof err)) chunks_ok = false;
      if (!utf8_valid(sb.p + before, sb.n - before)) chunks_ok = false;
    }
    tok_stream_flush(&st, &sb);
    CHECK(chunks_ok && sb.n == len && (len == 0 || memcmp(sb.p, text, len) == 0), "%s case %d streamed text == x, every piece valid UTF-8",
          label, idx);
    tok_buf_free(&sb);
  }
  tok_ids_free(&ids);
}

static void run_json_vectors(const tok_vocab *t, const char *file, const char *label) {
  size_t n;
  char *buf = test_read_all(test_fixture(file), &n);
  CHECK(buf != NULL, "read %s", file);
  if (!buf) return;
  cJSON *root = cJSON_ParseWithLength(buf, n);
  const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
  CHECK(cJSON_GetArraySize(cases) >= 100, "%s has >= 100 cases", file);
  int i = 0;
  int32_t exp[4096];
  for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next, i++) {
    const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "ids");
    size_t ne = 0;
    for (const cJSON *e = ids->child; e && ne < 4096; e = e->next) exp[ne++] = (int32_t)e->valuedouble;
    check_case(t, label, i, text, strlen(text), exp, ne, NULL, true);
  }
  cJSON_Delete(root);
  free(buf);
}

static void run_llama_vectors(const tok_vocab *t, const char *label) {
  size_t n1, n2;
  char *inp = test_read_all(test_fixture("vocab/ggml-vocab-qwen2.gguf.inp"), &n1);
  char *out = test_read_all(test_fixture("vocab/ggml-vocab-qwen2.gguf.out"), &n2);
  CHECK(inp && out, "read qwen2 .inp/.out");
  if (!inp || !out) { free(inp); free(out); return; }
  char *cases[128];
  int nc = split_cases(inp, cases, 128);
  char *lines[128];
  int nl = 0;
  for (char *p = out; nl < 128;) {
    char *q = strchr(p, '\n');
    if (!q) break;
    *q = 0;
    lines[nl++] = p;
    p = q + 1;
  }
  CHECK(nc == 46 && nl == 46, "%s: 46 qwen2 cases (got %d inputs, %d outputs)", label, nc, nl);
  for (int i = 0; i < nc && i < nl; i++) check_case(t, label, i, cases[i], strlen(cases[i]), NULL, 0, lines[i], false);
  free(inp);
  free(out);
}

/* ---- GGUF written from a loaded vocabulary (byte-level re-encoding of the raw pieces) ---- */
static void bytes_to_unicode_table(uint32_t tab[256]) {
  int k = 0;
  for (int b = 0; b < 256; b++) {
    bool pr = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    tab[b] = pr ? (uint32_t)b : (uint32_t)(256 + k++);
  }
}

static char *bytelevel(const char *s, size_t n, const uint32_t tab[256]) {
  char *o = malloc(n * 2 + 1), *p = o;
  for (size_t i = 0; i < n; i++) {
    uint32_t c = tab[(unsigned char)s[i]];
    if (c < 0x80) *p++ = (char)c;
    else { *p++ = (char)(0xC0 | (c >> 6)); *p++ = (char)(0x80 | (c & 0x3F)); }
  }
  *p = 0;
  return o;
}

typedef struct gguf_opts {
  int drop_type;       /* write token_type with one entry missing */
  int bad_merge;       /* a merge referencing an unknown token */
  int bad_merge_form;  /* a merge without a space */
  int bos_out_of_range;
  const char *pre;
} gguf_opts;

/* Writes a vocab-only GGUF from the JSON vocabulary + the merges of the tokenizer.json. */
static int write_gguf(const tok_vocab *t, const char *json_path, const char *path, gguf_opts o) {
  uint32_t tab[256];
  bytes_to_unicode_table(tab);
  int32_t n = tok_n_vocab(t);
  char **toks = malloc((size_t)n * sizeof *toks);
  int32_t *types = malloc((size_t)n * sizeof *types);
  for (int32_t i = 0; i < n; i++) {
    size_t l;
    const char *p = tok_piece(t, i, &l);
    int ty = tok_token_type(t, i);
    types[i] = ty;
    if (ty == TOK_TYPE_NORMAL) toks[i] = bytelevel(p, l, tab);
    else { toks[i] = malloc(l + 1); memcpy(toks[i], p, l); toks[i][l] = 0; }
  }
  size_t jn;
  char *js = test_read_all(json_path, &jn);
  cJSON *root = cJSON_ParseWithLength(js, jn);
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "merges");
  int nm = cJSON_GetArraySize(merges);
  char **ms = malloc((size_t)nm * sizeof *ms);
  int k = 0;
  for (const cJSON *m = merges->child; m; m = m->next, k++) {
    const char *a = m->child->valuestring, *b = m->child->next->valuestring;
    ms[k] = malloc(strlen(a) + strlen(b) + 2);
    sprintf(ms[k], "%s %s", a, b);
  }
  if (o.bad_merge) { free(ms[5]); ms[5] = strdup("zzzqqq\xC4\xA0 xyzzy"); }
  if (o.bad_merge_form) { free(ms[7]); ms[7] = strdup("abc"); }
  gguf_writer *w;
  char err[256];
  int rc = gguf_writer_open(path, &w, err, sizeof err);
  if (rc) return rc;
  gguf_writer_add_str(w, "general.architecture", "qwen3moe");
  gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
  gguf_writer_add_str(w, "tokenizer.ggml.pre", o.pre ? o.pre : "qwen2");
  gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n);
  gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n - (o.drop_type ? 1 : 0));
  gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)ms, (uint64_t)nm);
  gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 151645);
  gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", 151643);
  gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", o.bos_out_of_range ? (uint32_t)n : 151643);
  gguf_writer_add_str(w, "tokenizer.chat_template", "{{ messages }}");
  rc = gguf_writer_finish(w);
  for (int32_t i = 0; i < n; i++) free(toks[i]);
  for (int i = 0; i < nm; i++) free(ms[i]);
  free(toks);
  free(types);
  free(ms);
  cJSON_Delete(root);
  free(js);
  return rc;
}

static int load_gguf_file(const char *path, tok_vocab **t, char *err, size_t errlen) {
  gguf_file *g;
  int rc = gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  rc = tok_load_gguf(g, t, err, errlen);
  gguf_close(g);
  return rc;
}

/* Replaces the first occurrence of `from` with `to` in a heap string. */
static char *replace_once(const char *s, const char *from, const char *to) {
  const char *p = strstr(s, from);
  if (!p) return NULL;
  size_t a = (size_t)(p - s), nf = strlen(from), nt = strlen(to), n = strlen(s);
  char *o = malloc(n - nf + nt + 1);
  memcpy(o, s, a);
  memcpy(o + a, to, nt);
  memcpy(o + a + nt, p + nf, n - a - nf + 1);
  return o;
}

int main(void) {
  char err[512];
  tok_vocab *t = NULL;
  char json_path[4096]; /* test_fixture() reuses its buffers */
  snprintf(json_path, sizeof json_path, "%s", test_fixture("tokenizer/qwen3-tokenizer.json"));
  double t0 = floe_time_s();
  int rc = tok_load_json(json_path, &t, err, sizeof err);
  double tload = floe_time_s() - t0;
  CHECK(rc == 0, "load Qwen3 tokenizer.json: %s", rc ? err : "ok");
  if (rc) return TEST_DONE();
  printf("loaded tokenizer.json in %.3f s\n", tload);

  SECTION("properties and special ids");
  CHECK(tok_n_vocab(t) == 151669, "n_vocab %d == 151669", tok_n_vocab(t));
  CHECK(tok_pre_type(t) == TOK_PRE_QWEN2, "pre-tokenizer is qwen2");
  CHECK(tok_find(t, "<|endoftext|>") == 151643 && tok_find(t, "<|im_start|>") == 151644 && tok_find(t, "<|im_end|>") == 151645,
        "ChatML ids");
  CHECK(tok_find(t, "<tool_call>") == 151657 && tok_find(t, "</tool_call>") == 151658, "tool_call ids");
  CHECK(tok_find(t, "<tool_response>") == 151665 && tok_find(t, "</tool_response>") == 151666, "tool_response ids");
  CHECK(tok_find(t, "<think>") == 151667 && tok_find(t, "</think>") == 151668, "think ids");
  CHECK(tok_find(t, " Hello") == 21927 && tok_find(t, "no-such-token-xyz") == -1, "byte-level token lookup by text");
  CHECK(tok_token_type(t, 151645) == TOK_TYPE_CONTROL && tok_token_type(t, 151667) == TOK_TYPE_USER_DEFINED &&
            tok_token_type(t, 100) == TOK_TYPE_NORMAL && tok_token_type(t, -1) == -1 && tok_token_type(t, 151669) == -1,
        "token types");
  CHECK(tok_is_eog(t, 151645) && tok_is_eog(t, 151643) && !tok_is_eog(t, 151644) && !tok_is_eog(t, 9707), "end-of-generation ids");
  CHECK(tok_eos(t) == 151645 && tok_pad(t) == 151643 && tok_bos(t) == 151643, "eos/pad/bos from tokenizer.json defaults (the GGUF's ids)");
  size_t pl;
  const char *pp = tok_piece(t, 21927, &pl);
  CHECK(pp && pl == 6 && memcmp(pp, " Hello", 6) == 0, "piece 21927 is ' Hello'");
  CHECK(tok_piece(t, 151669, &pl) == NULL && tok_piece(t, -5, &pl) == NULL, "piece of an out-of-range id is NULL");

  SECTION("llama.cpp qwen2 vectors (add_special=false, parse_special=false)");
  run_llama_vectors(t, "qwen2/json");

  SECTION("JS tokenizer (HF port) vectors: qwen2 regex, parse_special=true");
  run_json_vectors(t, "tokenizer/tok-vectors-qwen2.json", "js-qwen2");

  SECTION("added tokens");
  {
    const char *s = "<|im_start|>user\nhi<think>x</think><|im_end|>";
    tok_ids a = {0}, b = {0};
    tok_encode(t, s, strlen(s), true, &a, err, sizeof err);
    tok_encode(t, s, strlen(s), false, &b, err, sizeof err);
    CHECK(a.n > 2 && a.v[0] == 151644 && a.v[a.n - 1] == 151645, "parse_special=true: control tokens split out");
    bool has_ctrl = false, has_think = false;
    for (size_t i = 0; i < b.n; i++) {
      has_ctrl |= b.v[i] == 151644 || b.v[i] == 151645;
      has_think |= b.v[i] == 151667;
    }
    CHECK(!has_ctrl, "parse_special=false: <|im_start|>/<|im_end|> stay text");
    CHECK(has_think, "parse_special=false: USER_DEFINED <think> is still one token (HF added-token semantics)");
    tok_buf d = {0};
    tok_decode(t, b.v, b.n, false, &d, err, sizeof err);
    CHECK(d.n == strlen(s) && memcmp(d.p, s, d.n) == 0, "decode of the parse_special=false ids gives the text back");
    tok_buf_free(&d);
    tok_decode(t, a.v, a.n, true, &d, err, sizeof err);
    CHECK(d.p && strcmp(d.p, "user\nhi<think>x</think>") == 0, "skip_special drops control tokens only ('%s')", d.p ? d.p : "");
    tok_buf_free(&d);
    tok_ids_free(&a);
    tok_ids_free(&b);
    int32_t bad = 151669;
    CHECK(tok_decode(t, &bad, 1, false, &d, err, sizeof err) == FLOE_E_INVALID, "decode of an out-of-range id fails: %s", err);
    tok_buf_free(&d);
  }

  SECTION("invalid UTF-8 input round-trips byte for byte");
  {
    const char s[] = "ab\xff\xfe c\xe2\x82 \xc3\x28 \xf0\x9f\xa6 \xed\xa0\x80 z\x80\x80";
    tok_ids a = {0};
    rc = tok_encode(t, s, sizeof s - 1, false, &a, err, sizeof err);
    tok_buf d = {0};
    tok_decode(t, a.v, a.n, false, &d, err, sizeof err);
    CHECK(rc == 0 && d.n == sizeof s - 1 && memcmp(d.p, s, d.n) == 0, "invalid bytes survive encode/decode (%zu ids)", a.n);
    tok_buf_free(&d);
    tok_ids_free(&a);
  }

  SECTION("streaming detokenizer");
  {
    /* " this is 🦙.cpp" -> 419 374 11162 99 247 13 10821: the llama is split over three tokens */
    int32_t ids[] = { 419, 374, 11162, 99, 247, 13, 10821 };
    tok_stream st;
    tok_stream_init(&st);
    tok_buf b = {0};
    size_t lens[7];
    for (int i = 0; i < 7; i++) {
      tok_stream_push(&st, t, ids[i], &b, err, sizeof err);
      lens[i] = b.n;
    }
    tok_stream_flush(&st, &b);
    CHECK(lens[1] == 8 && lens[2] == 9 && lens[3] == 9 && lens[4] == 13, "partial 🦙 held back until complete (%zu %zu %zu %zu)",
          lens[1], lens[2], lens[3], lens[4]);
    CHECK(b.p && strcmp(b.p, " this is \xf0\x9f\xa6\x99.cpp") == 0, "streamed text");
    tok_buf_free(&b);
    struct { const char *in[3]; const char *out; } cs[] = {
      { { "\xff", NULL }, "\xef\xbf\xbd" },
      { { "a\xe2\x82", NULL }, "a\xef\xbf\xbd" },                  /* incomplete at the end -> U+FFFD at flush */
      { { "\xe2\x82" "A", NULL }, "\xef\xbf\xbd" "A" },             /* broken sequence: one U+FFFD, then A */
      { { "\xf0\x9f", "\xa6\x99", NULL }, "\xf0\x9f\xa6\x99" },     /* split across pushes */
      { { "\xf0", "\x9f", "\xa6\x99!" }, "\xf0\x9f\xa6\x99!" },
      { { "\xe0\x80\x80", NULL }, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" }, /* overlong: 3 maximal subparts */
      { { "\xed\xa0\x80", NULL }, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" }, /* surrogate */
      { { "\xc3", "\xc3\xa9", NULL }, "\xef\xbf\xbd\xc3\xa9" },
      { { "\x80" "abc\xc3\xa9", NULL }, "\xef\xbf\xbd" "abc\xc3\xa9" },
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
      tok_stream_init(&st);
      tok_buf o = {0};
      bool hold_ok = true;
      for (int j = 0; j < 3 && cs[k].in[j]; j++) {
        size_t before = o.n;
        tok_stream_bytes(&st, cs[k].in[j], strlen(cs[k].in[j]), &o);
        if (!utf8_valid(o.p + before, o.n - before)) hold_ok = false;
      }
      tok_stream_flush(&st, &o);
      CHECK(hold_ok && o.p && strcmp(o.p, cs[k].out) == 0, "stream bytes case %zu", k);
      tok_buf_free(&o);
    }
  }

  SECTION("qwen35 regex (combining marks) on the Qwen3 vocabulary");
  {
    size_t n;
    char *js = test_read_all(json_path, &n);
    /* the regex as it appears JSON-escaped in the file */
    const char *q2 = "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+";
    const char *q35 = "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+";
    char *js35 = js ? replace_once(js, q2, q35) : NULL;
    CHECK(js35 != NULL, "made a qwen35-regex variant of tokenizer.json");
    tok_vocab *t35 = NULL;
    if (js35) {
      rc = tok_load_json_buffer(js35, strlen(js35), "qwen35-variant", &t35, err, sizeof err);
      CHECK(rc == 0 && tok_pre_type(t35) == TOK_PRE_QWEN35, "qwen35 regex identified: %s", rc ? err : "ok");
    }
    if (t35) {
      run_json_vectors(t35, "tokenizer/tok-vectors-qwen35re.json", "js-qwen35re");
      /* the difference itself: with \p{M} in the letter classes a combining mark stays in its word */
      size_t nv;
      char *vb = test_read_all(test_fixture("tokenizer/tok-vectors-qwen35re.json"), &nv);
      cJSON *vr = vb ? cJSON_ParseWithLength(vb, nv) : NULL;
      int differ = 0, marks = 0;
      for (const cJSON *c = cJSON_GetObjectItemCaseSensitive(vr, "cases") ? cJSON_GetObjectItemCaseSensitive(vr, "cases")->child : NULL; c; c = c->next) {
        const char *s = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        if (!strstr(s, "\xcc")) continue; /* U+0300..U+033F */
        marks++;
        tok_ids a = {0}, b = {0};
        tok_encode(t, s, strlen(s), true, &a, err, sizeof err);
        tok_encode(t35, s, strlen(s), true, &b, err, sizeof err);
        differ += a.n != b.n || memcmp(a.v, b.v, a.n * sizeof *a.v) != 0;
        tok_ids_free(&a);
        tok_ids_free(&b);
      }
      /* Few differ: the Qwen3 merges were learnt with marks split off, so they rarely join letter+mark. */
      CHECK(differ >= 1, "qwen2 and qwen35 regexes tokenize %d of %d combining-mark cases differently", differ, marks);
      cJSON_Delete(vr);
      free(vb);
      tok_free(t35);
    }
    free(js35);
    free(js);
  }

  SECTION("GGUF loading path");
  {
    char gp[4096];
    snprintf(gp, sizeof gp, "%s", test_tmp("tok_qwen2_vocab.gguf"));
    rc = write_gguf(t, json_path, gp, (gguf_opts){0});
    CHECK(rc == 0, "wrote a vocab-only GGUF");
    tok_vocab *tg = NULL;
    rc = load_gguf_file(gp, &tg, err, sizeof err);
    CHECK(rc == 0, "tok_load_gguf: %s", rc ? err : "ok");
    if (tg) {
      CHECK(tok_n_vocab(tg) == tok_n_vocab(t) && tok_pre_type(tg) == TOK_PRE_QWEN2, "same size and pre-tokenizer");
      CHECK(tok_bos(tg) == 151643 && tok_eos(tg) == 151645 && tok_pad(tg) == 151643, "special ids from GGUF metadata");
      CHECK(tok_chat_template(tg) && strcmp(tok_chat_template(tg), "{{ messages }}") == 0, "chat template from GGUF");
      run_llama_vectors(tg, "qwen2/gguf");
      tok_free(tg);
    }
    struct { gguf_opts o; const char *what; } bad[] = {
      { { .drop_type = 1 }, "token_type shorter than tokens" },
      { { .bad_merge = 1 }, "merge referencing an unknown token" },
      { { .bad_merge_form = 1 }, "merge without a space" },
      { { .bos_out_of_range = 1 }, "bos id out of range" },
      { { .pre = "llama-bpe" }, "unsupported pre-tokenizer" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
      char bp[4096];
      snprintf(bp, sizeof bp, "%s", test_tmp("tok_bad.gguf"));
      write_gguf(t, json_path, bp, bad[k].o);
      tok_vocab *tb = NULL;
      rc = load_gguf_file(bp, &tb, err, sizeof err);
      CHECK(rc < 0 && tb == NULL, "rejects %s: %s", bad[k].what, rc ? err : "(accepted!)");
      tok_free(tb);
      remove(bp);
    }
    remove(gp);
  }

  SECTION("hostile tokenizer.json");
  {
    const char *bad[] = {
      "{}",
      "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
      "not json",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
      tok_vocab *tb = NULL;
      rc = tok_load_json_buffer(bad[k], strlen(bad[k]), "hostile", &tb, err, sizeof err);
      CHECK(rc < 0 && !tb, "rejects hostile json %zu: %s", k, err);
    }
    size_t n;
    char *js = test_read_all(json_path, &n);
    /* a merge whose parts exist but whose result does not / an id far out of range */
    char *m1 = replace_once(js, "[\"\xc4\xa0\",\"\xc4\xa0\"]", "[\"\xc4\xa0\",\"\\u0001\"]");
    char *m2 = replace_once(js, "\"id\":151645", "\"id\":99999999999");
    char *m3 = replace_once(js, "\"merges\":[", "\"merges\":[\"a\",");
    const char *vs[] = { m1, m2, m3 };
    for (int k = 0; k < 3; k++) {
      tok_vocab *tb = NULL;
      rc = vs[k] ? tok_load_json_buffer(vs[k], strlen(vs[k]), "hostile", &tb, err, sizeof err) : 0;
      CHECK(vs[k] && rc < 0 && !tb, "rejects modified tokenizer.json %d: %s", k, rc ? err : "(accepted!)");
      tok_free(tb);
    }
    free(m1);
    free(m2);
    free(m3);
    free(js);
  }

  SECTION("speed: a ~100k-token prompt");
  {
    size_t n1;
    char *inp = test_read_all(test_fixture("vocab/ggml-vocab-qwen2.gguf.inp"), &n1);
    tok_buf big = {0};
    while (big.n < 420000) tok_buf_append(&big, inp, n1);
    /* plus one pathological pre-token: 20k letters without a break */
    for (int i = 0; i < 2000; i++) tok_buf_append(&big, "abcdefghij", 10);
    tok_ids a = {0};
    t0 = floe_time_s();
    rc = tok_encode(t, big.p, big.n, false, &a, err, sizeof err);
    double dt = floe_time_s() - t0;
    printf("encoded %zu bytes -> %zu tokens in %.3f s (%.0f tok/s)\n", big.n, a.n, dt, a.n / dt);
    CHECK(rc == 0 && a.n > 100000, "encoded %zu tokens", a.n);
    CHECK(dt < 3.0, "100k-token prompt encodes in under 3 s (%.3f s)", dt);
    tok_buf d = {0};
    tok_decode(t, a.v, a.n, false, &d, err, sizeof err);
    CHECK(d.n == big.n && memcmp(d.p, big.p, d.n) == 0, "big round trip");
    tok_buf_free(&d);
    tok_ids_free(&a);
    tok_buf_free(&big);
    free(inp);
  }
  tok_free(t);
  return TEST_DONE();
}
