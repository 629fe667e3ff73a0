/* Minimal test harness shared by tests/test_*.c.
 * CHECK(cond, fmt, ...) records one check and prints it when it fails (or always with
 * FLOE_TEST_VERBOSE=1); TEST_DONE() prints "N passed, N failed" and returns the exit code. */
#ifndef FLOE_TEST_H
#define FLOE_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static int test_passed, test_failed;

#define CHECK(cond, ...)                                                             \
  do {                                                                               \
    if (cond) {                                                                      \
      test_passed++;                                                                 \
      if (getenv("FLOE_TEST_VERBOSE")) {                                             \
        printf("ok   %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); \
      }                                                                              \
    } else {                                                                         \
      test_failed++;                                                                 \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); \
    }                                                                                \
  } while (0)

/* A section header, so the log says what is being checked. */
#define SECTION(...) do { printf("== "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

#define TEST_DONE() (printf("%d passed, %d failed\n", test_passed, test_failed), test_failed ? 1 : 0)

/* Path of a fixture file: $FLOE_FIXTURES/name (falls back to tests/fixtures). */
static inline const char *test_fixture(const char *name) {
  static char buf[4][4096];
  static int k;
  const char *dir = getenv("FLOE_FIXTURES");
  char *b = buf[k++ & 3];
  snprintf(b, sizeof buf[0], "%s/%s", dir ? dir : "tests/fixtures", name);
  return b;
}

/* Whole file, malloc'ed and NUL-terminated (floe_read_file, up to 1 GiB); NULL when it cannot be
 * read. len may be NULL. */
static inline char *test_read_all(const char *path, size_t *len) {
  char *buf = NULL, err[256];
  if (floe_read_file(path, (size_t)1 << 30, &buf, len, err, sizeof err) != 0) return NULL;
  return buf;
}

/* Multiplies the f16 at p by a factor in [0.5, 2) drawn from r (rounded back to f16).
 * quant_fill_random gives every block of a call the same f16 super-scales, so a kernel that took
 * one block's (or one row's) scales for another's would pass on its weights: the kernel tests
 * vary each block's with this, from a generator of their own (their other draws stay the same). */
static inline void test_vary_f16(floe_rng *r, uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  h = floe_f32_to_f16(floe_f16_to_f32(h) * (0.5f + 1.5f * floe_rng_uniform(r)));
  memcpy(p, &h, 2);
}

/* A scratch path under $FLOE_TMP (or /tmp). */
static inline const char *test_tmp(const char *name) {
  static char buf[4][4096];
  static int k;
  const char *dir = getenv("FLOE_TMP");
  char *b = buf[k++ & 3];
  snprintf(b, sizeof buf[0], "%s/%s", dir ? dir : "/tmp", name);
  return b;
}
#endif
