/* Base utilities shared by every module: error reporting, checked size arithmetic, assertions,
 * logging, CPU features, timers, a seeded RNG, and the thread pool.
 *
 * Errors: library code never exits. A fallible function returns 0 or a negative FLOE_E_* and
 * writes one line (no trailing newline) into (err, errlen) with floe_err(). */
#ifndef FLOE_BASE_H
#define FLOE_BASE_H
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "floe.h"

/* ---- errors ---- */
/* Formats a message into err (if non-NULL) and returns code, so callers write
 *   return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s' ends past EOF", path, name); */
int floe_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Internal invariant broken (never bad input): print file:line and abort. */
#define FLOE_ASSERT(x)                                                   \
  do {                                                                   \
    if (!(x)) floe_assert_fail(__FILE__, __LINE__, #x);                  \
  } while (0)
void floe_assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));

/* ---- checked arithmetic: return false on overflow ---- */
static inline bool floe_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static inline bool floe_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

/* ---- logging (stderr) ---- */
void floe_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- allocation: 64-byte aligned, NULL on failure ---- */
void *floe_aligned_alloc(size_t align, size_t size);
void floe_aligned_free(void *p);
/* size >= 2 MiB: 2 MiB-aligned, rounded up to whole 2 MiB, and transparent huge pages asked for
 * (best effort); smaller: floe_aligned_alloc(64, size). For buffers re-read after the weight
 * stream has evicted their TLB entries. Free with floe_aligned_free. */
void *floe_huge_alloc(size_t size);

/* ---- CPU features (detected once, cached) ---- */
typedef struct floe_cpu {
  bool avx2, fma, f16c;
  bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, avx512vbmi;
} floe_cpu;
const floe_cpu *floe_cpu_features(void);

/* ---- time ---- */
double floe_time_s(void); /* monotonic seconds */

/* ---- RNG: splitmix64-seeded xoshiro256**, deterministic for a seed ---- */
typedef struct floe_rng { uint64_t s[4]; } floe_rng;
void floe_rng_seed(floe_rng *r, uint64_t seed);
uint64_t floe_rng_u64(floe_rng *r);
float floe_rng_uniform(floe_rng *r); /* [0,1) */
float floe_rng_normal(floe_rng *r);  /* N(0,1) */

/* ---- thread pool ----
 * A fixed set of workers. floe_pool_run(p, fn, ctx) calls fn(ctx, ith, nth) on nth = p's thread
 * count (the caller is thread 0) and returns when all are done. Not re-entrant. */
typedef struct floe_pool floe_pool;
typedef void (*floe_pool_fn)(void *ctx, int ith, int nth);
floe_pool *floe_pool_create(int n_threads); /* n_threads >= 1; NULL on failure */
void floe_pool_free(floe_pool *p);
int floe_pool_size(const floe_pool *p);
void floe_pool_run(floe_pool *p, floe_pool_fn fn, void *ctx);
/* How long an idle worker spins (pause instructions, ~13 ns each here) before it blocks; the
 * default bridges the gaps between the parallel regions of one evaluation (~25 us). */
void floe_pool_set_spin(floe_pool *p, int pauses);
/* ---- spin-then-sleep waiting (pool.c) ----
 * A thread waits for a word another thread stores: it spins `spin` pause instructions (~13 ns
 * each here), then sleeps on a condition variable. The storer calls floe_waiter_wake after its
 * sequentially consistent store; it takes the mutex only when someone sleeps. A waiter announces
 * that it sleeps (seq_cst) before it re-checks the word under the mutex, so no wake-up is lost. */
typedef struct floe_waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int sleepers;
} floe_waiter;
void floe_waiter_init(floe_waiter *w);
void floe_waiter_destroy(floe_waiter *w);
/* Returns once *gen != seen, or *quit != 0 (quit may be NULL). */
void floe_waiter_wait_change(floe_waiter *w, const uint64_t *gen, uint64_t seen, const int *quit, int spin);
/* Returns once *count == 0. */
void floe_waiter_wait_zero(floe_waiter *w, const int *count, int spin);
void floe_waiter_wake(floe_waiter *w);

/* Rows [0,n) split into nth contiguous ranges aligned to `align` rows; range of thread ith. */
void floe_split_range(int64_t n, int64_t align, int ith, int nth, int64_t *r0, int64_t *r1);

/* ---- half/bfloat conversions (exact, scalar) ---- */
float floe_f16_to_f32(uint16_t h);
uint16_t floe_f32_to_f16(float f); /* round to nearest even */
static inline float floe_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
  return v.f;
}
uint16_t floe_f32_to_bf16(float f); /* round to nearest even, NaN kept quiet */

/* ---- file-provided strings in one-line messages ---- */
/* Copies p[0..len) into buf (cap >= 4) with control bytes as '?', cut with "..." when it does not
 * fit; returns buf. floe_show is the same for a NUL-terminated s. */
const char *floe_show_n(char *buf, size_t cap, const char *p, size_t len);
const char *floe_show(char *buf, size_t cap, const char *s);

/* ---- whole small files (JSON configs, tokenizers, templates) ---- */
/* Reads all of path (at most max bytes) into *out, malloc'ed and NUL-terminated; *len = bytes read
 * (len may be NULL). Errors name the path: FLOE_E_NOTFOUND (no such file), FLOE_E_IO (cannot
 * open or read), FLOE_E_FORMAT (larger than max), FLOE_E_NOMEM. *out is NULL on error. */
int floe_read_file(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen);

/* ---- whole model files (mapfile.c) ----
 * A read-only view of the first size bytes of fd: a file mapping (copy false), or a copy read
 * into anonymous memory on 2 MiB huge pages (copy true; see mapfile.c for why). Returns 0 or
 * FLOE_E_IO / FLOE_E_NOMEM with a one-line message naming path. floe_unmap_file(*map, *map_len)
 * releases either. */
int floe_map_file(int fd, uint64_t size, bool copy, const char *path, const uint8_t **map, size_t *map_len,
                  char *err, size_t errlen);
void floe_unmap_file(const uint8_t *map, size_t map_len);
/* Progress of long operations on this thread: floe_map_file's copies (bytes read of the file's
 * size) and xpack_write (bytes written of the pack's size) call fn(user, done, total) from this
 * thread only, after each chunk and once at the end. NULL fn: none (the default). Per thread, so
 * work in one thread never reports into another's callback; the caller sets it around the call
 * and clears it after (floe_engine_open does so for floe_engine_params.progress). */
typedef void (*floe_progress_fn)(void *user, uint64_t done, uint64_t total);
void floe_thread_progress_set(floe_progress_fn fn, void *user);
void floe_thread_progress(uint64_t done, uint64_t total); /* reports, when set */
/* Whether a copy of `bytes` fits comfortably: huge pages usable and bytes <= MemAvailable minus
 * max(2 GiB, 20 %). The default load (FLOE_LOAD_AUTO) copies when this holds. */
bool floe_copy_fits(uint64_t bytes);

/* ---- human sizes: "2G", "512M", "1.5GiB", "123" (bytes) ---- */
int floe_parse_size(const char *s, uint64_t *out);
#endif
