/* Random but valid blocks for synthetic models (quant_fill_random).
 *
 * Speed matters (tens of GB of synthetic weights), so the code bits are whole 64-bit words from a
 * xorshift64* generator, and only the scale fields of each block are then overwritten. Every
 * code pattern of every supported type is valid (grid indices cover their whole table), so the
 * random bytes need no fixing beyond the scales.
 *
 * Scales: each type has a patch function that writes the block's f16 super-scale d (and, for
 * types with a min, dmin or m chosen so the values are roughly centred). Dequantized values are
 * linear in d, so the d that gives a target standard deviation is target / std_unit, where
 * std_unit is measured once per type on blocks patched with d = 1 (deterministic, cached).
 * MXFP4's E8M0 scale is a power of two, so its std lands within a factor sqrt(2) of the target.
 * F32/F16/BF16 get finite values built from bits: random sign and mantissa, exponent e0 - r with
 * r in 0..3, e0 chosen from the target (std within ~sqrt(2) of it). Integer types get raw random
 * bytes (scale ignored); Q8_1, Q8_K and F64, which floe never stores, are not supported. */
#include <math.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_internal.h"

static inline uint64_t xs_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

static void fill_words(uint64_t *state, uint8_t *dst, size_t nbytes) {
  size_t i = 0;
  for (; i + 8 <= nbytes; i += 8) {
    const uint64_t v = xs_next(state);
    memcpy(dst + i, &v, 8);
  }
  if (i < nbytes) {
    const uint64_t v = xs_next(state);
    memcpy(dst + i, &v, nbytes - i);
  }
}

/* Field layout per type: offset of d, offset of the second scale (dmin / m) or -1, and the
 * factor c with second = c * d (negative c for q4_1/q5_1, whose m is added). */
typedef struct { int d_off, m_off; float m_factor; } rnd_layout;

static bool rnd_layout_for(uint32_t type, rnd_layout *l) {
  switch (type) {
  case FLOE_TYPE_Q4_0: case FLOE_TYPE_Q5_0: case FLOE_TYPE_Q8_0: case FLOE_TYPE_IQ4_NL:
  case FLOE_TYPE_IQ4_XS: case FLOE_TYPE_IQ2_XXS: case FLOE_TYPE_IQ2_XS: case FLOE_TYPE_IQ2_S:
  case FLOE_TYPE_IQ3_XXS: case FLOE_TYPE_IQ3_S: case FLOE_TYPE_IQ1_S:
    *l = (rnd_layout){ 0, -1, 0 }; return true;
  case FLOE_TYPE_Q4_1: *l = (rnd_layout){ 0, 2, -7.5f }; return true;
  case FLOE_TYPE_Q5_1: *l = (rnd_layout){ 0, 2, -15.5f }; return true;
  case FLOE_TYPE_Q2_K: *l = (rnd_layout){ 80, 82, 1.5f }; return true;   /* E[sc*q] = 7.5*1.5 */
  case FLOE_TYPE_Q3_K: *l = (rnd_layout){ 108, -1, 0 }; return true;
  case FLOE_TYPE_Q4_K: *l = (rnd_layout){ 0, 2, 7.5f }; return true;
  case FLOE_TYPE_Q5_K: *l = (rnd_layout){ 0, 2, 15.5f }; return true;
  case FLOE_TYPE_Q6_K: *l = (rnd_layout){ 208, -1, 0 }; return true;
  case FLOE_TYPE_IQ1_M: *l = (rnd_layout){ -1, -1, 0 }; return true; /* d in scale nibbles */
  default: return false;
  }
}

static void patch_block(uint32_t type, const rnd_layout *l, uint8_t *b, uint16_t dh, uint16_t mh) {
  if (type == FLOE_TYPE_IQ1_M) {
    for (int k = 0; k < 4; k++) {
      uint16_t s = rd_u16(b + 48 + 2 * k);
      s = (uint16_t)((s & 0x0FFF) | (((dh >> (4 * k)) & 0xF) << 12));
      wr_u16(b + 48 + 2 * k, s);
    }
    return;
  }
  wr_u16(b + l->d_off, dh);
  if (l->m_off >= 0) wr_u16(b + l->m_off, mh);
}

/* Standard deviation of the dequantized values of random blocks patched with d = 1. */
static float unit_std(uint32_t type, const rnd_layout *l, const floe_type_traits *tt) {
  static uint32_t cache[FLOE_TYPE_COUNT_GGML]; /* float bits; 0 = not yet measured */
  uint32_t bits = __atomic_load_n(&cache[type], __ATOMIC_RELAXED);
  float v;
  if (bits) {
    memcpy(&v, &bits, 4);
    return v;
  }
  /* 4096 values: 16 super-blocks or 128 small blocks; deterministic, independent of the caller. */
  uint8_t blocks[8192];
  float vals[4096];
  const int nb = 4096 / tt->blck;
  uint64_t s = 0x9E3779B97F4A7C15ULL ^ type;
  fill_words(&s, blocks, (size_t)nb * (size_t)tt->bytes);
  const uint16_t one = floe_f32_to_f16(1.0f), m = floe_f32_to_f16(l->m_factor);
  for (int i = 0; i < nb; i++) patch_block(type, l, blocks + i * tt->bytes, one, m);
  const int64_t n = 4096;
  quant_dequant_row(type, blocks, vals, n);
  double sum = 0, sum2 = 0;
  for (int64_t i = 0; i < n; i++) sum += vals[i];
  const double mean = sum / n;
  for (int64_t i = 0; i < n; i++) sum2 += (vals[i] - mean) * (vals[i] - mean);
  v = (float)sqrt(sum2 / n);
  memcpy(&bits, &v, 4);
  __atomic_store_n(&cache[type], bits, __ATOMIC_RELAXED);
  return v;
}

/* Plain floats: sign and mantissa random, exponent e0 - (0..3). Values have rms ~0.88 * 2^e0. */
static void fill_plain(uint32_t type, uint64_t *s, uint8_t *dst, int64_t n, float scale) {
  int e0 = (int)lrintf(log2f(scale / 0.88f));
  if (type == FLOE_TYPE_F16) {
    e0 = e0 < -11 ? -11 : e0 > 15 ? 15 : e0; /* keep e0 - 3 a normal half exponent */
    for (int64_t i = 0; i < n; i += 4) {
      const uint64_t r = xs_next(s);
      for (int k = 0; k < 4 && i + k < n; k++) {
        const uint32_t w = (uint32_t)(r >> (16 * k));
        const uint32_t e = (uint32_t)(e0 + 15 - (int)((w >> 10) & 3));
        wr_u16(dst + 2 * (i + k), (uint16_t)((w & 0x8000) | (e << 10) | (w & 0x3FF)));
      }
    }
    return;
  }
  e0 = e0 < -120 ? -120 : e0 > 127 ? 127 : e0;
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t r = xs_next(s);
    for (int k = 0; k < 2 && i + k < n; k++) {
      const uint32_t w = (uint32_t)(r >> (32 * k));
      const uint32_t e = (uint32_t)(e0 + 127 - (int)((w >> 23) & 3));
      const uint32_t f = (w & 0x80000000u) | (e << 23) | (w & 0x7FFFFFu);
      if (type == FLOE_TYPE_F32) memcpy(dst + 4 * (i + k), &f, 4);
      else wr_u16(dst + 2 * (i + k), (uint16_t)(f >> 16));
    }
  }
}

void quant_fill_random(uint32_t type, floe_rng *rng, void *dst, int64_t nblocks, float scale) {
  const floe_type_traits *tt = floe_type_info(type);
  FLOE_ASSERT(tt && nblocks >= 0);
  uint64_t s = floe_rng_u64(rng) | 1;
  uint8_t *b = dst;
  if (type == FLOE_TYPE_F32 || type == FLOE_TYPE_F16 || type == FLOE_TYPE_BF16) {
    fill_plain(type, &s, b, nblocks, scale);
    return;
  }
  fill_words(&s, b, (size_t)nblocks * (size_t)tt->bytes);
  if (type == FLOE_TYPE_I8 || type == FLOE_TYPE_I16 || type == FLOE_TYPE_I32 || type == FLOE_TYPE_I64) return;
  if (type == FLOE_TYPE_MXFP4) {
    /* kvalues_mxfp4 (doubled E2M1) have rms 5.85 over uniform nibbles: e = 128 + log2(target/5.85). */
    int e = 128 + (int)lrintf(log2f(scale / 5.85f));
    e = e < 1 ? 1 : e > 254 ? 254 : e;
    for (int64_t i = 0; i < nblocks; i++) b[i * 17] = (uint8_t)e;
    return;
  }
  rnd_layout l;
  FLOE_ASSERT(rnd_layout_for(type, &l));
  const float d = scale / unit_std(type, &l, tt);
  const uint16_t dh = floe_f32_to_f16(d), mh = floe_f32_to_f16(l.m_factor * d);
  for (int64_t i = 0; i < nblocks; i++) patch_block(type, &l, b + i * tt->bytes, dh, mh);
}
