/* libFuzzer target for the server's output parser (src/server/output_parse.c): whatever text a
 * model generates is split into reasoning, content and tool calls without leaving the parser's
 * buffers, in every mode and at any cut points.
 *
 * Input: byte 0 picks the mode (bit 0 incremental, bit 1 the prompt opened <think>, bit 2 tool
 * calls parsed, bits 3-5 the request's tools: none, typed schemas, odd schemas), byte 1 the cut
 * points (0: whole, 1: byte by byte, else pieces of 1..16 bytes from a generator seeded by it,
 * never inside a UTF-8 sequence, as floe_generate releases text); the rest is the text.
 * Asserted: no crash or overread (ASan / UBSan); tool calls numbered 0, 1, ... in order; arguments
 * only for a call already started; every emitted byte readable. Seeds: tests/fixtures/fuzz
 * (outp_*.txt, run_fuzz.sh). Built only with -DFLOE_FUZZ=ON (clang). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/output_parse.h"

static cJSON *g_tools[4];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  g_tools[1] = cJSON_Parse(
      "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\",\"properties\":{"
      "\"path\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},\"x\":{\"type\":\"number\"},\"all\":{\"type\":\"boolean\"},"
      "\"opt\":{\"type\":\"object\"},\"list\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"z\":{\"type\":\"null\"},"
      "\"u\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]},\"t\":{\"type\":[\"integer\",\"null\"]}}}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]");
  g_tools[2] = cJSON_Parse(
      "[1,\"x\",null,{\"type\":\"function\"},{\"function\":{\"name\":7}},{\"type\":\"function\",\"function\":{\"name\":"
      "\"g\",\"parameters\":{\"properties\":[1,2]}}},{\"type\":\"function\",\"function\":{\"name\":\"h\",\"parameters\":"
      "{\"properties\":{\"a\":{\"type\":5},\"b\":\"integer\",\"c\":{\"type\":[]}}}}}]");
  g_tools[3] = cJSON_Parse("{\"not\":\"an array\"}");
  return 0;
}

typedef struct seen {
  int n_calls;
  uint32_t sum; /* every emitted byte read */
} seen;

static void touch(seen *s, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) s->sum = s->sum * 31u + (uint8_t)p[i];
}
static void on_content(void *u, const char *p, size_t n) { touch(u, p, n); }
static void on_reasoning(void *u, const char *p, size_t n) { touch(u, p, n); }
static void on_start(void *u, int index, const char *id, const char *name) {
  seen *s = u;
  if (index != s->n_calls || !id || !name) __builtin_trap();
  touch(s, id, strlen(id));
  touch(s, name, strlen(name));
  s->n_calls++;
}
static void on_args(void *u, int index, const char *p, size_t n) {
  seen *s = u;
  if (index < 0 || index >= s->n_calls) __builtin_trap();
  touch(s, p, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0], cuts = data[1];
  const char *text = (const char *)data + 2;
  const size_t n = size - 2;
  seen s = {0};
  outp p;
  const outp_sink sink = {&s, on_content, on_reasoning, on_start, on_args};
  outp_init(&p, mode & 4, mode & 1, mode & 2, g_tools[(mode >> 3) & 3], sink);
  uint32_t rng = cuts * 2654435761u + 1;
  for (size_t at = 0; at < n;) {
    size_t len = n - at;
    if (cuts == 1) {
      len = 1;
    } else if (cuts > 1) {
      rng = rng * 1103515245u + 12345u;
      len = 1 + (rng >> 16) % 16;
    }
    size_t end = at + len < n ? at + len : n;
    while (end < n && ((uint8_t)text[end] & 0xC0) == 0x80) end++; /* not inside a UTF-8 sequence */
    (void)outp_mode(&p);
    outp_feed(&p, text + at, end - at);
    at = end;
  }
  outp_finish(&p);
  outp_free(&p);
  return 0;
}
