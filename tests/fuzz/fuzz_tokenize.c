/* libFuzzer target for encoding and decoding arbitrary bytes with the real vocabularies: the
 * Qwen3 tokenizer.json of tests/fixtures (Qwen2 pre-tokenizer) and the default model's GGUF
 * vocabulary (Qwen3.5 pre-tokenizer). A prompt file (`floe run -f`) reaches the tokenizer as raw
 * bytes, invalid UTF-8 included.
 * Input: byte 0 picks the vocabulary (bit 0) and whether added tokens are parsed (bit 1); the
 * rest is the text. Asserted: encoding succeeds; every id is in range; decode(encode(x)) == x
 * byte for byte; the streaming detokenizer fed the ids one at a time gives valid UTF-8, equal to
 * x when x is valid UTF-8. Built only with -DFLOE_FUZZ=ON (clang); run by tests/run_fuzz.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "tok/tokenizer.h"

#define FAIL() (fprintf(stderr, "fuzz_tokenize: the check at line %d failed\n", __LINE__), abort())

static tok_vocab *g_tv[2];

/* tests/fuzz/fuzz_tokenize.c -> the tree's root + rel */
static void root_path(char *out, size_t cap, const char *rel) {
  snprintf(out, cap, "%s", __FILE__);
  for (int up = 0; up < 3; up++) {
    char *sl = strrchr(out, '/');
    if (sl) *sl = 0;
    else snprintf(out, cap, ".");
  }
  strncat(out, rel, cap - strlen(out) - 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char path[4096], err[512];
  root_path(path, sizeof path, "/tests/fixtures/tokenizer/qwen3-tokenizer.json");
  if (tok_load_json(path, &g_tv[0], err, sizeof err)) {
    fprintf(stderr, "fuzz_tokenize: %s: %s\n", path, err);
    exit(1);
  }
  root_path(path, sizeof path, "/models/default.gguf");
  gguf_file *g = NULL;
  if (gguf_open(path, &g, err, sizeof err) || tok_load_gguf(g, &g_tv[1], err, sizeof err)) {
    fprintf(stderr, "fuzz_tokenize: %s: %s\n", path, err);
    exit(1);
  }
  gguf_close(g);
  return 0;
}

/* valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF) */
static bool utf8_ok(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i], len, cp;
    if (c < 0x80) { i++; continue; }
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
    else return false;
    if (n - i < len) return false;
    for (unsigned k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const tok_vocab *t = g_tv[data[0] & 1];
  const bool special = data[0] & 2;
  const char *text = (const char *)data + 1;
  const size_t n = size - 1;
  char err[512];
  tok_ids ids = {0};
  if (tok_encode(t, text, n, special, &ids, err, sizeof err)) FAIL();
  const int32_t nv = tok_n_vocab(t);
  for (size_t i = 0; i < ids.n; i++)
    if (ids.v[i] < 0 || ids.v[i] >= nv) FAIL();
  tok_buf back = {0}, st = {0};
  if (tok_decode(t, ids.v, ids.n, false, &back, err, sizeof err)) FAIL();
  if (back.n != n || (n && memcmp(back.p, text, n))) FAIL();
  tok_stream s;
  tok_stream_init(&s);
  for (size_t i = 0; i < ids.n; i++)
    if (tok_stream_push(&s, t, ids.v[i], &st, err, sizeof err)) FAIL();
  if (tok_stream_flush(&s, &st)) FAIL();
  if (!utf8_ok((const unsigned char *)st.p, st.n)) FAIL();
  if (utf8_ok((const unsigned char *)text, n) && (st.n != n || (n && memcmp(st.p, text, n)))) FAIL();
  tok_ids_free(&ids);
  tok_buf_free(&back);
  tok_buf_free(&st);
  return 0;
}
