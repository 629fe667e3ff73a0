/* Base utilities: errors, assertions, logging, aligned allocation, CPU features, time, RNG,
 * half/bfloat conversions, size parsing. See base.h. */
#include "base/base.h"

#include <cpuid.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

const char *floe_strerror(int code) {
  switch (code) {
    case FLOE_OK: return "ok";
    case FLOE_E_IO: return "I/O error";
    case FLOE_E_FORMAT: return "malformed file";
    case FLOE_E_UNSUPPORTED: return "unsupported";
    case FLOE_E_INVALID: return "invalid argument";
    case FLOE_E_NOMEM: return "out of memory";
    case FLOE_E_NOTFOUND: return "not found";
    case FLOE_E_OVERFLOW: return "size overflow";
  }
  return "unknown error";
}

int floe_err(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    /* one line: a message must never carry a newline from file content */
    for (char *p = err; *p; p++)
      if (*p == '\n' || *p == '\r') *p = ' ';
  }
  return code;
}

void floe_assert_fail(const char *file, int line, const char *expr) {
  fprintf(stderr, "floe: internal error at %s:%d: assertion '%s' failed\n", file, line, expr);
  abort();
}

void floe_log(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
}

void *floe_aligned_alloc(size_t align, size_t size) {
  void *p = NULL;
  if (size == 0) size = align;
  if (posix_memalign(&p, align, size) != 0) return NULL;
  return p;
}

void floe_aligned_free(void *p) { free(p); }

void *floe_huge_alloc(size_t size) {
  const size_t huge = (size_t)2 << 20;
  if (size < huge) return floe_aligned_alloc(64, size);
  const size_t r = (size + huge - 1) / huge * huge;
  void *p = floe_aligned_alloc(huge, r);
  if (p) madvise(p, r, MADV_HUGEPAGE); /* best effort: THP may be "madvise" only, or off */
  return p;
}

/* CPUID + XGETBV: a feature counts only if the OS saves its registers (XCR0). */
static floe_cpu g_cpu;
static int g_cpu_done;

const floe_cpu *floe_cpu_features(void) {
  if (g_cpu_done) return &g_cpu;
  unsigned a, b, c, d;
  floe_cpu f = {0};
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    bool osxsave = c & (1u << 27);
    f.fma = c & (1u << 12);
    f.f16c = c & (1u << 29);
    unsigned long long xcr0 = 0;
    if (osxsave) {
      unsigned lo, hi;
      __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    bool ymm = (xcr0 & 6) == 6, zmm = (xcr0 & 0xe6) == 0xe6;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      f.avx2 = ymm && (b & (1u << 5));
      f.avx512f = zmm && (b & (1u << 16));
      f.avx512dq = zmm && (b & (1u << 17));
      f.avx512bw = zmm && (b & (1u << 30));
      f.avx512vl = zmm && (b & (1u << 31));
      f.avx512vbmi = zmm && (c & (1u << 1));
      f.avx512vnni = zmm && (c & (1u << 11));
      if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = zmm && (a & (1u << 5));
    }
    f.fma = f.fma && ymm;
    f.f16c = f.f16c && ymm;
  }
  g_cpu = f;
  __atomic_store_n(&g_cpu_done, 1, __ATOMIC_RELEASE);
  return &g_cpu;
}

double floe_time_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void floe_rng_seed(floe_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t floe_rng_u64(floe_rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

float floe_rng_uniform(floe_rng *r) { return (float)(floe_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float floe_rng_normal(floe_rng *r) {
  /* Box-Muller; u1 in (0,1] so log is finite */
  double u1 = ((double)(floe_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(floe_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

float floe_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13); /* inf / nan */
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  union { uint32_t u; float f; } v = { u };
  return v.f;
}

uint16_t floe_f32_to_f16(float f) {
  union { float f; uint32_t u; } v = { f };
  uint32_t x = v.u, sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
  if (ax < 0x38800000u) {                                   /* result subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;            /* < 2^-25: rounds to 0 */
    uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    int shift = 126 - (int)e; /* value = m * 2^(e-150); f16 subnormal unit is 2^-24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((ax - 0x38000000u) >> 13), rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return (uint16_t)(sign | r);
}

uint16_t floe_f32_to_bf16(float f) {
  union { float f; uint32_t u; } v = { f };
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
  return (uint16_t)((v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16);
}

const char *floe_show_n(char *buf, size_t cap, const char *p, size_t len) {
  size_t max = cap - 4, k = 0;
  for (size_t i = 0; i < len && k < max; i++) {
    unsigned char c = (unsigned char)p[i];
    buf[k++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
  }
  if (len > max) { memcpy(buf + k, "...", 3); k += 3; }
  buf[k] = 0;
  return buf;
}

const char *floe_show(char *buf, size_t cap, const char *s) { return floe_show_n(buf, cap, s, strlen(s)); }

int floe_read_file(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    return floe_err(err, errlen, e == ENOENT ? FLOE_E_NOTFOUND : FLOE_E_IO, "%s: cannot open: %s", path, strerror(e));
  }
  if (max > SIZE_MAX / 4) max = SIZE_MAX / 4; /* so that max + 2 cannot wrap */
  char *buf = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (n == cap) { /* full: grow (one byte more than cap for the terminator), up to max + 1 to see EOF */
      if (cap > max) { rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: larger than %zu bytes", path, max); break; }
      size_t nc = cap ? cap * 2 : (size_t)1 << 16;
      if (nc > max + 1) nc = max + 1;
      char *nb = realloc(buf, nc + 1);
      if (!nb) { rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", path); break; }
      buf = nb;
      cap = nc;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    n += k;
    if (k == 0) break;
  }
  if (rc == 0 && ferror(f)) rc = floe_err(err, errlen, FLOE_E_IO, "%s: read error: %s", path, strerror(errno));
  fclose(f);
  if (rc) { free(buf); return rc; }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return 0;
}

int floe_parse_size(const char *s, uint64_t *out) {
  if (!s || !*s) return FLOE_E_INVALID;
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || v > 1.8e19) return FLOE_E_INVALID;
  while (*end == ' ') end++;
  double mul = 1;
  switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    case 'B': break;
    default: return FLOE_E_INVALID;
  }
  if (*end == 'i' || *end == 'I') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return FLOE_E_INVALID;
  double r = v * mul;
  if (r > 1.8e19) return FLOE_E_OVERFLOW;
  *out = (uint64_t)r;
  return 0;
}
