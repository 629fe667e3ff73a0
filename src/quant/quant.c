/* Exact scalar dequantization and the reference dot product for every ggml block type floe reads.
 *
 * Each dq_* function decodes one block into float32, performing the same float operations in the
 * same order as ggml's dequantize_row_* (ggml/src/ggml-quants.c), e.g. Q4_K computes d1 = d*sc and
 * m1 = dmin*m once, then y = d1*q - m1. With -ffp-contract=off this reproduces ggml bit for bit
 * (tests/test_quant_golden.c checks all 22 formats against ggml's own output). Blocks are read
 * as bytes (no struct overlay), all multi-byte fields little-endian; floe only targets LE hosts.
 *
 * The quantizers live in quant_quantize.c, random-block generation in quant_random.c, MLX affine
 * in quant_mlx.c, and the type table in quant_types.c. */
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_internal.h"
#include "quant/tables.h"

/* ---- plain and 32-element blocks ---- */

static void dq_q4_0(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint8_t *qs = b + 2;
  for (int j = 0; j < 16; j++) {
    const int x0 = (qs[j] & 0x0F) - 8, x1 = (qs[j] >> 4) - 8;
    y[j] = x0 * d;
    y[j + 16] = x1 * d;
  }
}

static void dq_q4_1(const uint8_t *b, float *y) {
  const float d = rd_f16(b), m = rd_f16(b + 2);
  const uint8_t *qs = b + 4;
  for (int j = 0; j < 16; j++) {
    const int x0 = qs[j] & 0x0F, x1 = qs[j] >> 4;
    y[j] = x0 * d + m;
    y[j + 16] = x1 * d + m;
  }
}

static void dq_q5_0(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint32_t qh = rd_u32(b + 2);
  const uint8_t *qs = b + 6;
  for (int j = 0; j < 16; j++) {
    const int x0 = ((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
    const int x1 = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
    y[j] = x0 * d;
    y[j + 16] = x1 * d;
  }
}

static void dq_q5_1(const uint8_t *b, float *y) {
  const float d = rd_f16(b), m = rd_f16(b + 2);
  const uint32_t qh = rd_u32(b + 4);
  const uint8_t *qs = b + 8;
  for (int j = 0; j < 16; j++) {
    const int x0 = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = x0 * d + m;
    y[j + 16] = x1 * d + m;
  }
}

static void dq_q8_0(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const int8_t *qs = (const int8_t *)(b + 2);
  for (int j = 0; j < 32; j++) y[j] = qs[j] * d;
}

static void dq_mxfp4(const uint8_t *b, float *y) {
  const float d = e8m0_half(b[0]);
  const uint8_t *qs = b + 1;
  for (int j = 0; j < 16; j++) {
    y[j] = kvalues_mxfp4[qs[j] & 0x0F] * d;
    y[j + 16] = kvalues_mxfp4[qs[j] >> 4] * d;
  }
}

static void dq_iq4_nl(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint8_t *qs = b + 2;
  for (int j = 0; j < 16; j++) {
    y[j] = d * kvalues_iq4nl[qs[j] & 0x0F];
    y[j + 16] = d * kvalues_iq4nl[qs[j] >> 4];
  }
}

/* ---- K-quants (256-element super-blocks) ---- */

/* Q4_K/Q5_K scales[12]: 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4). */
void quant_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/* Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82. */
static void dq_q2_k(const uint8_t *b, float *y) {
  const uint8_t *sc = b, *q = b + 16;
  const float d = rd_f16(b + 80), min = rd_f16(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; half++) {
        const uint8_t s = sc[is++];
        const float dl = d * (s & 0xF), ml = min * (s >> 4);
        for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

/* Q3_K 6-bit scales (bias 32) unpacked from the 12 packed bytes. */
void quant_q3k_scales(const uint8_t *p, int8_t out[16]) {
  for (int j = 0; j < 16; j++) {
    const int lo = j < 8 ? (p[j] & 0xF) : (p[j - 8] >> 4);
    const int hi = (p[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

/* Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108. */
static void dq_q3_k(const uint8_t *b, float *y) {
  const uint8_t *hm = b, *q = b + 32;
  int8_t sc[16];
  quant_q3k_scales(b + 96, sc);
  const float d_all = rd_f16(b + 108);
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; half++) {
        const float dl = d_all * sc[is++];
        for (int l = 0; l < 16; l++) {
          const int k = l + 16 * half;
          *y++ = dl * (((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
        }
      }
      m <<= 1;
    }
    q += 32;
  }
}

/* Q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16. */
static void dq_q4_k(const uint8_t *b, float *y) {
  const float d = rd_f16(b), min = rd_f16(b + 2);
  const uint8_t *scales = b + 4, *q = b + 16;
  uint8_t sc, m;
  for (int is = 0; is < 8; is += 2) {
    quant_k4_scale_min(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    quant_k4_scale_min(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    q += 32;
  }
}

/* Q5_K: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48. */
static void dq_q5_k(const uint8_t *b, float *y) {
  const float d = rd_f16(b), min = rd_f16(b + 2);
  const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
  uint8_t sc, m, u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2) {
    quant_k4_scale_min(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    quant_k4_scale_min(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    u1 <<= 2;
    u2 <<= 2;
  }
}

/* Q6_K: ql[128] @0, qh[64] @128, scales[16] int8 @192, d @208. y = d*sc*q, left to right. */
static void dq_q6_k(const uint8_t *b, float *y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  const float d = rd_f16(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; l++) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

/* IQ4_XS: d @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8. */
static void dq_iq4_xs(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint16_t sh = rd_u16(b + 2);
  const uint8_t *sl = b + 4, *qs = b + 8;
  for (int ib = 0; ib < 8; ib++) {
    const int ls = ((sl[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((sh >> 2 * ib) & 3) << 4);
    const float dl = d * (ls - 32);
    for (int j = 0; j < 16; j++) {
      y[j] = dl * kvalues_iq4nl[qs[j] & 0xF];
      y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
    }
    y += 32;
    qs += 16;
  }
}

/* ---- i-quants on lattice grids ---- */

/* 8 grid magnitudes times db with the signs applied: ggml's y = db * grid[j] * (+-1.f). */
static inline void put8(float *y, float db, const uint8_t *grid, uint8_t signs) {
  for (int j = 0; j < 8; j++) y[j] = db * grid[j] * (signs & kmask_iq2xs[j] ? -1.f : 1.f);
}

/* IQ2_XXS: d @0, then per 32 elements two u32: 4 grid bytes; 4x7 sign bits + 4-bit scale. */
static void dq_iq2_xxs(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  for (int ib = 0; ib < 8; ib++) {
    const uint8_t *g = b + 2 + 8 * ib;
    const uint32_t a1 = rd_u32(g + 4);
    const float db = d * (0.5f + (a1 >> 28)) * 0.25f;
    for (int l = 0; l < 4; l++) {
      const uint8_t *grid = (const uint8_t *)(iq2xxs_grid + g[l]);
      put8(y, db, grid, ksigns_iq2xs[(a1 >> 7 * l) & 127]);
      y += 8;
    }
  }
}

/* IQ2_XS: d @0, qs u16[32] @2 (9-bit grid index, 7-bit sign index), scales[8] @66. */
static void dq_iq2_xs(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint8_t *scales = b + 66;
  for (int ib = 0; ib < 8; ib++) {
    const float db0 = d * (0.5f + (scales[ib] & 0xF)) * 0.25f;
    const float db1 = d * (0.5f + (scales[ib] >> 4)) * 0.25f;
    for (int l = 0; l < 4; l++) {
      const uint16_t q = rd_u16(b + 2 + 2 * (4 * ib + l));
      put8(y, l < 2 ? db0 : db1, (const uint8_t *)(iq2xs_grid + (q & 511)), ksigns_iq2xs[q >> 9]);
      y += 8;
    }
  }
}

/* IQ2_S: d @0, qs[32] @2, signs[32] @34, qh[8] @66, scales[8] @74. */
static void dq_iq2_s(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
  for (int ib = 0; ib < 8; ib++) {
    const float db0 = d * (0.5f + (scales[ib] & 0xF)) * 0.25f;
    const float db1 = d * (0.5f + (scales[ib] >> 4)) * 0.25f;
    for (int l = 0; l < 4; l++) {
      const int idx = qs[l] | ((qh[ib] << (8 - 2 * l)) & 0x300);
      put8(y, l < 2 ? db0 : db1, (const uint8_t *)(iq2s_grid + idx), signs[l]);
      y += 8;
    }
    qs += 4;
    signs += 4;
  }
}

/* IQ3_XXS: d @0, qs[64] grid indices @2, 8 u32 (4x7 sign bits + 4-bit scale) @66. */
static void dq_iq3_xxs(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint8_t *qs = b + 2;
  for (int ib = 0; ib < 8; ib++) {
    const uint32_t a = rd_u32(b + 66 + 4 * ib);
    const float db = d * (0.5f + (a >> 28)) * 0.5f;
    for (int l = 0; l < 4; l++) {
      const uint8_t s = ksigns_iq2xs[(a >> 7 * l) & 127];
      const uint8_t *g1 = (const uint8_t *)(iq3xxs_grid + qs[2 * l]);
      const uint8_t *g2 = (const uint8_t *)(iq3xxs_grid + qs[2 * l + 1]);
      for (int j = 0; j < 4; j++) {
        y[j] = db * g1[j] * (s & kmask_iq2xs[j] ? -1.f : 1.f);
        y[j + 4] = db * g2[j] * (s & kmask_iq2xs[j + 4] ? -1.f : 1.f);
      }
      y += 8;
    }
    qs += 8;
  }
}

/* IQ3_S: d @0, qs[64] @2, qh[8] @66, signs[32] @74, scales[4] @106. */
static void dq_iq3_s(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
  for (int ib = 0; ib < 8; ib++) {
    const int s4 = ib % 2 ? scales[ib / 2] >> 4 : scales[ib / 2] & 0xF;
    const float db = d * (1 + 2 * s4);
    for (int l = 0; l < 4; l++) {
      const uint8_t *g1 = (const uint8_t *)(iq3s_grid + (qs[2 * l] | ((qh[ib] << (8 - 2 * l)) & 256)));
      const uint8_t *g2 = (const uint8_t *)(iq3s_grid + (qs[2 * l + 1] | ((qh[ib] << (7 - 2 * l)) & 256)));
      for (int j = 0; j < 4; j++) {
        y[j] = db * g1[j] * (signs[l] & kmask_iq2xs[j] ? -1.f : 1.f);
        y[j + 4] = db * g2[j] * (signs[l] & kmask_iq2xs[j + 4] ? -1.f : 1.f);
      }
      y += 8;
    }
    qs += 8;
    signs += 4;
  }
}

#define IQ1_DELTA 0.125f

/* IQ1_S: d @0, qs[32] @2, qh u16[8] @34 (4x3 index bits, 3-bit scale, delta sign). */
static void dq_iq1_s(const uint8_t *b, float *y) {
  const float d = rd_f16(b);
  const uint8_t *qs = b + 2;
  for (int ib = 0; ib < 8; ib++) {
    const uint16_t qh = rd_u16(b + 34 + 2 * ib);
    const float dl = d * (2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -IQ1_DELTA : IQ1_DELTA;
    for (int l = 0; l < 4; l++) {
      const int8_t *grid = (const int8_t *)(iq1s_grid + (qs[l] | (((qh >> 3 * l) & 7) << 8)));
      for (int j = 0; j < 8; j++) y[j] = dl * (grid[j] + delta);
      y += 8;
    }
    qs += 4;
  }
}

/* IQ1_M: qs[32] @0, qh[16] @32, scales u16[4] @48 (3-bit scales; f16 d in the top nibbles). */
static void dq_iq1_m(const uint8_t *b, float *y) {
  const uint8_t *qs = b, *qh = b + 32;
  uint16_t sc[4];
  for (int k = 0; k < 4; k++) sc[k] = rd_u16(b + 48 + 2 * k);
  const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) |
                                    (sc[3] & 0xF000));
  const float d = floe_f16_to_f32(dbits);
  for (int ib = 0; ib < 8; ib++) {
    const float dl1 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 7) + 1);
    const float dl2 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1);
    const int idx[4] = { qs[0] | ((qh[0] << 8) & 0x700), qs[1] | ((qh[0] << 4) & 0x700),
                         qs[2] | ((qh[1] << 8) & 0x700), qs[3] | ((qh[1] << 4) & 0x700) };
    const float delta[4] = { qh[0] & 0x08 ? -IQ1_DELTA : IQ1_DELTA, qh[0] & 0x80 ? -IQ1_DELTA : IQ1_DELTA,
                             qh[1] & 0x08 ? -IQ1_DELTA : IQ1_DELTA, qh[1] & 0x80 ? -IQ1_DELTA : IQ1_DELTA };
    for (int l = 0; l < 4; l++) {
      const int8_t *grid = (const int8_t *)(iq1s_grid + idx[l]);
      const float dl = l < 2 ? dl1 : dl2;
      for (int j = 0; j < 8; j++) y[j] = dl * (grid[j] + delta[l]);
      y += 8;
    }
    qs += 4;
    qh += 2;
  }
}

/* ---- plain types: one "block" is one element ---- */
static void dq_f32(const uint8_t *b, float *y) { memcpy(y, b, 4); }
static void dq_f16(const uint8_t *b, float *y) { *y = rd_f16(b); }
static void dq_bf16(const uint8_t *b, float *y) { *y = floe_bf16_to_f32(rd_u16(b)); }

typedef void (*dq_fn)(const uint8_t *b, float *y);

static dq_fn dq_for(uint32_t type) {
  switch (type) {
  case FLOE_TYPE_F32: return dq_f32;
  case FLOE_TYPE_F16: return dq_f16;
  case FLOE_TYPE_BF16: return dq_bf16;
  case FLOE_TYPE_Q4_0: return dq_q4_0;
  case FLOE_TYPE_Q4_1: return dq_q4_1;
  case FLOE_TYPE_Q5_0: return dq_q5_0;
  case FLOE_TYPE_Q5_1: return dq_q5_1;
  case FLOE_TYPE_Q8_0: return dq_q8_0;
  case FLOE_TYPE_MXFP4: return dq_mxfp4;
  case FLOE_TYPE_IQ4_NL: return dq_iq4_nl;
  case FLOE_TYPE_Q2_K: return dq_q2_k;
  case FLOE_TYPE_Q3_K: return dq_q3_k;
  case FLOE_TYPE_Q4_K: return dq_q4_k;
  case FLOE_TYPE_Q5_K: return dq_q5_k;
  case FLOE_TYPE_Q6_K: return dq_q6_k;
  case FLOE_TYPE_IQ4_XS: return dq_iq4_xs;
  case FLOE_TYPE_IQ2_XXS: return dq_iq2_xxs;
  case FLOE_TYPE_IQ2_XS: return dq_iq2_xs;
  case FLOE_TYPE_IQ2_S: return dq_iq2_s;
  case FLOE_TYPE_IQ3_XXS: return dq_iq3_xxs;
  case FLOE_TYPE_IQ3_S: return dq_iq3_s;
  case FLOE_TYPE_IQ1_S: return dq_iq1_s;
  case FLOE_TYPE_IQ1_M: return dq_iq1_m;
  default: return NULL;
  }
}

void quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
  const floe_type_traits *tt = floe_type_info(type);
  const dq_fn fn = dq_for(type);
  FLOE_ASSERT(tt && fn && n % tt->blck == 0);
  const uint8_t *b = src;
  switch (type) { /* plain types: straight loops, no call per element */
  case FLOE_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
  case FLOE_TYPE_F16: for (int64_t i = 0; i < n; i++) dst[i] = rd_f16(b + 2 * i); return;
  case FLOE_TYPE_BF16: for (int64_t i = 0; i < n; i++) dst[i] = floe_bf16_to_f32(rd_u16(b + 2 * i)); return;
  default: break;
  }
  for (int64_t i = 0; i < n; i += tt->blck, b += tt->bytes) fn(b, dst + i);
}

float quant_dot_ref(uint32_t type, const void *w, const float *x, int64_t n) {
  const floe_type_traits *tt = floe_type_info(type);
  const dq_fn fn = dq_for(type);
  FLOE_ASSERT(tt && fn && n % tt->blck == 0);
  float buf[256];
  float sum = 0.0f;
  const uint8_t *b = w;
  /* Decode 256 elements (one super-block, 8 small blocks or 256 plain values) at a time. */
  for (int64_t i = 0; i < n; i += 256) {
    const int64_t m = n - i < 256 ? n - i : 256;
    quant_dequant_row(type, b, buf, m);
    b += (m / tt->blck) * tt->bytes;
    for (int64_t j = 0; j < m; j++) sum += buf[j] * x[i + j];
  }
  return sum;
}
