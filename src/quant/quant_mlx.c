/* MLX affine quantization (mlx.core.quantize, mode "affine"): the scalar reference.
 *
 * A row of n weights is cut into groups of `group` elements; group g has a scale s and a bias b
 * (F32, F16 or BF16) and each weight is w = s * q + b with q an unsigned `bits`-wide code. The
 * codes form one LSB-first bit stream per row, stored as little-endian uint32 words: code k
 * occupies bits [k*bits, (k+1)*bits) of the stream. For 2/4/8 bits that is "value k at bit
 * (k % (32/bits))*bits of word k/(32/bits)"; for 3/5/6 bits codes straddle bytes and words,
 * which is exactly mlx's extract_bits (3 bits: 8 codes per 3 bytes, 5: 8 per 5, 6: 4 per 3).
 * group*bits is always a multiple of 32, so every group starts on a word boundary.
 *
 * Dequantization computes s*q + b in float32 (scale and bias widened first). The quantizer is
 * mlx's quantize() in backend/cpu/quantized.cpp: min/max per group; the scale takes the sign
 * that makes the larger-magnitude edge (min or max) the zero code, and the scale is then
 * adjusted so that this edge is exactly representable (bias = edge). */
#include <math.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_internal.h"

bool quant_mlx_fmt_valid(const quant_mlx_fmt *f) {
  if (!f) return false;
  const bool bits_ok = f->bits == 2 || f->bits == 3 || f->bits == 4 || f->bits == 5 || f->bits == 6 || f->bits == 8;
  const bool group_ok = f->group == 32 || f->group == 64 || f->group == 128;
  const bool sb_ok = f->sb_type == FLOE_TYPE_F32 || f->sb_type == FLOE_TYPE_F16 || f->sb_type == FLOE_TYPE_BF16;
  return bits_ok && group_ok && sb_ok;
}

size_t quant_mlx_row_bytes(const quant_mlx_fmt *f, int64_t n) {
  if (!quant_mlx_fmt_valid(f) || n < 0 || n % f->group) return 0;
  uint64_t bits;
  if (!floe_mul_ok((uint64_t)n, (uint64_t)f->bits, &bits) || bits / 8 > SIZE_MAX) return 0;
  return (size_t)(bits / 8);
}

static float sb_get(uint32_t t, const void *p, int64_t i) {
  const uint8_t *b = p;
  if (t == FLOE_TYPE_F32) {
    float v;
    memcpy(&v, b + 4 * i, 4);
    return v;
  }
  const uint16_t h = rd_u16(b + 2 * i);
  return t == FLOE_TYPE_F16 ? floe_f16_to_f32(h) : floe_bf16_to_f32(h);
}

static void sb_put(uint32_t t, void *p, int64_t i, float v) {
  uint8_t *b = p;
  if (t == FLOE_TYPE_F32) memcpy(b + 4 * i, &v, 4);
  else wr_u16(b + 2 * i, t == FLOE_TYPE_F16 ? floe_f32_to_f16(v) : floe_f32_to_bf16(v));
}

/* Code k of a bit stream (bits <= 8, so a code spans at most two bytes). */
static inline uint32_t get_code(const uint8_t *q, int64_t k, int bits) {
  const uint64_t o = (uint64_t)k * (uint64_t)bits;
  const uint8_t *p = q + (o >> 3);
  const unsigned sh = (unsigned)(o & 7);
  uint32_t v = p[0];
  if (sh + (unsigned)bits > 8) v |= (uint32_t)p[1] << 8;
  return (v >> sh) & ((1u << bits) - 1);
}

static inline void put_code(uint8_t *q, int64_t k, int bits, uint32_t c) {
  const uint64_t o = (uint64_t)k * (uint64_t)bits;
  uint8_t *p = q + (o >> 3);
  const unsigned sh = (unsigned)(o & 7);
  const uint32_t v = c << sh;
  p[0] |= (uint8_t)v;
  if (sh + (unsigned)bits > 8) p[1] |= (uint8_t)(v >> 8);
}

void quant_mlx_dequant_row(const quant_mlx_fmt *f, const void *q, const void *scales, const void *biases,
                           float *dst, int64_t n) {
  FLOE_ASSERT(quant_mlx_fmt_valid(f) && n % f->group == 0);
  const uint8_t *qb = q;
  for (int64_t g = 0; g < n / f->group; g++) {
    const float s = sb_get(f->sb_type, scales, g), b = sb_get(f->sb_type, biases, g);
    const int64_t k0 = g * f->group;
    if (f->bits == 4 || f->bits == 8 || f->bits == 2) {
      /* Byte-aligned fast path: each byte holds 8/bits whole codes. */
      const int per = 8 / f->bits;
      const uint8_t *p = qb + k0 / per;
      const uint32_t mask = (1u << f->bits) - 1;
      for (int j = 0; j < f->group; j++) dst[k0 + j] = s * (float)((p[j / per] >> ((j % per) * f->bits)) & mask) + b;
    } else {
      for (int j = 0; j < f->group; j++) dst[k0 + j] = s * (float)get_code(qb, k0 + j, f->bits) + b;
    }
  }
}

float quant_mlx_dot_ref(const quant_mlx_fmt *f, const void *q, const void *scales, const void *biases,
                        const float *x, int64_t n) {
  FLOE_ASSERT(quant_mlx_fmt_valid(f) && n % f->group == 0);
  float buf[128];
  float sum = 0.0f;
  const quant_mlx_fmt one = *f;
  const uint32_t sbw = f->sb_type == FLOE_TYPE_F32 ? 4 : 2;
  for (int64_t g = 0; g < n / f->group; g++) {
    const int64_t k0 = g * f->group;
    quant_mlx_dequant_row(&one, (const uint8_t *)q + k0 * f->bits / 8, (const uint8_t *)scales + g * sbw,
                          (const uint8_t *)biases + g * sbw, buf, f->group);
    for (int j = 0; j < f->group; j++) sum += buf[j] * x[k0 + j];
  }
  return sum;
}

void quant_mlx_quantize_row(const quant_mlx_fmt *f, const float *src, void *q, void *scales, void *biases, int64_t n) {
  FLOE_ASSERT(quant_mlx_fmt_valid(f) && n % f->group == 0);
  const float n_bins = (float)((1 << f->bits) - 1);
  const float eps = 1e-7f;
  uint8_t *qb = q;
  memset(qb, 0, quant_mlx_row_bytes(f, n));
  for (int64_t g = 0; g < n / f->group; g++) {
    const float *w = src + g * f->group;
    float w_min = INFINITY, w_max = -INFINITY;
    for (int j = 0; j < f->group; j++) {
      w_max = fmaxf(w_max, w[j]);
      w_min = fminf(w_min, w[j]);
    }
    const bool mask = fabsf(w_min) > fabsf(w_max);
    float scale = fmaxf((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = rintf(edge / scale);
    float bias = 0;
    if (q0 != 0) {
      scale = edge / q0;
      bias = edge;
    }
    for (int j = 0; j < f->group; j++) {
      float c = rintf((w[j] - bias) / scale);
      c = fminf(fmaxf(c, 0.0f), n_bins);
      put_code(qb, g * f->group + j, f->bits, (uint32_t)c);
    }
    sb_put(f->sb_type, scales, g, scale);
    sb_put(f->sb_type, biases, g, bias);
  }
}
