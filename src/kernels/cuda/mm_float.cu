/* The exact float path and exact row dequantization on the GPU, for every type floe reads, and
 * the lookup tables (uploaded from src/quant/tables.c by cuda_mm_init).
 *
 * dq_block() decodes one block with the float operations of src/quant/quant.c (dq_*) in the same
 * order, so a dequantized value is the CPU's bit for bit (the file is built with --fmad=false,
 * like quant.c with -ffp-contract=off). The float matmul is the CPU's scalar float path
 * (kernels.c mm_float_scalar = quant_dot_ref): per output, a = a + w[j] * x[j] for j in element
 * order, one thread per output. A warp takes 32 weight rows; per 256-value chunk the warp decodes
 * the 32 rows' blocks into shared memory (on chip; the weights are never expanded in device
 * memory), then each thread runs its row's sequential sum for every activation row of the tile.
 * This path is for the types without a quantized-activation kernel (Q4_1, Q5_0, Q5_1, Q2_K,
 * Q3_K, IQ1/IQ2/IQ3, MLX 2/3/5/6-bit); one sequential chain per output limits it. F32/F16/BF16
 * (k_plain below) instead follow the CPU's AVX-512 float order, 64 lanes a row. */
#include <stdlib.h>

#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/pdl.cuh"

namespace {

__device__ uint8_t d_kmask_iq2xs[8];
__device__ uint8_t d_ksigns_iq2xs[128];
__device__ uint64_t d_iq2xxs_grid[256];
__device__ uint64_t d_iq2xs_grid[512];
__device__ uint64_t d_iq2s_grid[1024];
__device__ uint32_t d_iq3xxs_grid[256];
__device__ uint32_t d_iq3s_grid[512];
__device__ uint64_t d_iq1s_grid[2048];
__device__ int8_t d_kvalues_iq4nl[16];
__device__ int8_t d_kvalues_mxfp4[16];

__device__ __forceinline__ float rdf16(const uint8_t *p) { return mm_f16((uint32_t)p[0] | ((uint32_t)p[1] << 8)); }
__device__ __forceinline__ uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
__device__ __forceinline__ uint32_t rd32(const uint8_t *p) { return rd16(p) | (rd16(p + 2) << 16); }

__device__ __forceinline__ void put8(float *y, float db, const uint8_t *grid, uint8_t signs) {
  for (int j = 0; j < 8; j++) y[j] = db * grid[j] * (signs & d_kmask_iq2xs[j] ? -1.f : 1.f);
}

#define IQ1_DELTA 0.125f

/* One block of a block type (quant.c dq_*), same operations in the same order. */
__device__ void dq_block(int type, const uint8_t *b, float *y) {
  switch (type) {
    case FLOE_TYPE_Q4_0: {
      const float d = rdf16(b);
      for (int j = 0; j < 16; j++) {
        const int x0 = (b[2 + j] & 0x0F) - 8, x1 = (b[2 + j] >> 4) - 8;
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
      }
      return;
    }
    case FLOE_TYPE_Q4_1: {
      const float d = rdf16(b), m = rdf16(b + 2);
      for (int j = 0; j < 16; j++) {
        const int x0 = b[4 + j] & 0x0F, x1 = b[4 + j] >> 4;
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
      }
      return;
    }
    case FLOE_TYPE_Q5_0: {
      const float d = rdf16(b);
      const uint32_t qh = rd32(b + 2);
      for (int j = 0; j < 16; j++) {
        const int x0 = ((b[6 + j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
        const int x1 = ((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
      }
      return;
    }
    case FLOE_TYPE_Q5_1: {
      const float d = rdf16(b), m = rdf16(b + 2);
      const uint32_t qh = rd32(b + 4);
      for (int j = 0; j < 16; j++) {
        const int x0 = (b[8 + j] & 0x0F) | (((qh >> j) & 1) << 4);
        const int x1 = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
      }
      return;
    }
    case FLOE_TYPE_Q8_0: {
      const float d = rdf16(b);
      for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
      return;
    }
    case FLOE_TYPE_MXFP4: {
      const float d = mm_e8m0_half(b[0]);
      for (int j = 0; j < 16; j++) {
        y[j] = d_kvalues_mxfp4[b[1 + j] & 0x0F] * d;
        y[j + 16] = d_kvalues_mxfp4[b[1 + j] >> 4] * d;
      }
      return;
    }
    case FLOE_TYPE_IQ4_NL: {
      const float d = rdf16(b);
      for (int j = 0; j < 16; j++) {
        y[j] = d * d_kvalues_iq4nl[b[2 + j] & 0x0F];
        y[j + 16] = d * d_kvalues_iq4nl[b[2 + j] >> 4];
      }
      return;
    }
    case FLOE_TYPE_Q2_K: {
      const uint8_t *sc = b, *q = b + 16;
      const float d = rdf16(b + 80), mn = rdf16(b + 82);
      int is = 0;
      for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2)
          for (int half = 0; half < 2; half++) {
            const uint8_t s = sc[is++];
            const float dl = d * (s & 0xF), ml = mn * (s >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
          }
        q += 32;
      }
      return;
    }
    case FLOE_TYPE_Q3_K: {
      const uint8_t *hm = b, *q = b + 32, *p = b + 96;
      int8_t sc[16];
      for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (p[j] & 0xF) : (p[j - 8] >> 4);
        const int hi = (p[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)((lo | (hi << 4)) - 32);
      }
      const float d_all = rdf16(b + 108);
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
      return;
    }
    case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K: {
      const float d = rdf16(b), mn = rdf16(b + 2);
      const uint8_t *s = b + 4, *qh = b + 16, *q = b + (type == FLOE_TYPE_Q4_K ? 16 : 48);
      uint8_t u1 = 1, u2 = 2;
      for (int is = 0; is < 8; is += 2) {
        int sc[2], m[2];
        for (int h = 0; h < 2; h++) {
          const int j = is + h;
          sc[h] = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
          m[h] = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        const float d1 = d * sc[0], m1 = mn * m[0], d2 = d * sc[1], m2 = mn * m[1];
        if (type == FLOE_TYPE_Q4_K) {
          for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
          for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        } else {
          for (int l = 0; l < 32; l++) *y++ = d1 * ((q[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
          for (int l = 0; l < 32; l++) *y++ = d2 * ((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
          u1 <<= 2;
          u2 <<= 2;
        }
        q += 32;
      }
      return;
    }
    case FLOE_TYPE_Q6_K: {
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t *sc = (const int8_t *)(b + 192);
      const float d = rdf16(b + 208);
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
      return;
    }
    case FLOE_TYPE_IQ4_XS: {
      const float d = rdf16(b);
      const uint32_t sh = rd16(b + 2);
      const uint8_t *sl = b + 4, *qs = b + 8;
      for (int ib = 0; ib < 8; ib++) {
        const int ls = ((sl[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((sh >> 2 * ib) & 3) << 4);
        const float dl = d * (ls - 32);
        for (int j = 0; j < 16; j++) {
          y[j] = dl * d_kvalues_iq4nl[qs[j] & 0xF];
          y[j + 16] = dl * d_kvalues_iq4nl[qs[j] >> 4];
        }
        y += 32;
        qs += 16;
      }
      return;
    }
    case FLOE_TYPE_IQ2_XXS: {
      const float d = rdf16(b);
      for (int ib = 0; ib < 8; ib++) {
        const uint8_t *g = b + 2 + 8 * ib;
        const uint32_t a1 = rd32(g + 4);
        const float db = d * (0.5f + (a1 >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
          const uint64_t gv = d_iq2xxs_grid[g[l]];
          put8(y, db, (const uint8_t *)&gv, d_ksigns_iq2xs[(a1 >> 7 * l) & 127]);
          y += 8;
        }
      }
      return;
    }
    case FLOE_TYPE_IQ2_XS: {
      const float d = rdf16(b);
      const uint8_t *scales = b + 66;
      for (int ib = 0; ib < 8; ib++) {
        const float db0 = d * (0.5f + (scales[ib] & 0xF)) * 0.25f;
        const float db1 = d * (0.5f + (scales[ib] >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
          const uint32_t q = rd16(b + 2 + 2 * (4 * ib + l));
          const uint64_t gv = d_iq2xs_grid[q & 511];
          put8(y, l < 2 ? db0 : db1, (const uint8_t *)&gv, d_ksigns_iq2xs[q >> 9]);
          y += 8;
        }
      }
      return;
    }
    case FLOE_TYPE_IQ2_S: {
      const float d = rdf16(b);
      const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
      for (int ib = 0; ib < 8; ib++) {
        const float db0 = d * (0.5f + (scales[ib] & 0xF)) * 0.25f;
        const float db1 = d * (0.5f + (scales[ib] >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
          const int idx = qs[l] | ((qh[ib] << (8 - 2 * l)) & 0x300);
          const uint64_t gv = d_iq2s_grid[idx];
          put8(y, l < 2 ? db0 : db1, (const uint8_t *)&gv, signs[l]);
          y += 8;
        }
        qs += 4;
        signs += 4;
      }
      return;
    }
    case FLOE_TYPE_IQ3_XXS: {
      const float d = rdf16(b);
      const uint8_t *qs = b + 2;
      for (int ib = 0; ib < 8; ib++) {
        const uint32_t a = rd32(b + 66 + 4 * ib);
        const float db = d * (0.5f + (a >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
          const uint8_t s = d_ksigns_iq2xs[(a >> 7 * l) & 127];
          const uint32_t g1v = d_iq3xxs_grid[qs[2 * l]], g2v = d_iq3xxs_grid[qs[2 * l + 1]];
          const uint8_t *g1 = (const uint8_t *)&g1v, *g2 = (const uint8_t *)&g2v;
          for (int j = 0; j < 4; j++) {
            y[j] = db * g1[j] * (s & d_kmask_iq2xs[j] ? -1.f : 1.f);
            y[j + 4] = db * g2[j] * (s & d_kmask_iq2xs[j + 4] ? -1.f : 1.f);
          }
          y += 8;
        }
        qs += 8;
      }
      return;
    }
    case FLOE_TYPE_IQ3_S: {
      const float d = rdf16(b);
      const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
      for (int ib = 0; ib < 8; ib++) {
        const int s4 = ib % 2 ? scales[ib / 2] >> 4 : scales[ib / 2] & 0xF;
        const float db = d * (1 + 2 * s4);
        for (int l = 0; l < 4; l++) {
          const uint32_t g1v = d_iq3s_grid[qs[2 * l] | ((qh[ib] << (8 - 2 * l)) & 256)];
          const uint32_t g2v = d_iq3s_grid[qs[2 * l + 1] | ((qh[ib] << (7 - 2 * l)) & 256)];
          const uint8_t *g1 = (const uint8_t *)&g1v, *g2 = (const uint8_t *)&g2v;
          for (int j = 0; j < 4; j++) {
            y[j] = db * g1[j] * (signs[l] & d_kmask_iq2xs[j] ? -1.f : 1.f);
            y[j + 4] = db * g2[j] * (signs[l] & d_kmask_iq2xs[j + 4] ? -1.f : 1.f);
          }
          y += 8;
        }
        qs += 8;
        signs += 4;
      }
      return;
    }
    case FLOE_TYPE_IQ1_S: {
      const float d = rdf16(b);
      const uint8_t *qs = b + 2;
      for (int ib = 0; ib < 8; ib++) {
        const uint32_t qh = rd16(b + 34 + 2 * ib);
        const float dl = d * (2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -IQ1_DELTA : IQ1_DELTA;
        for (int l = 0; l < 4; l++) {
          const uint64_t gv = d_iq1s_grid[qs[l] | (((qh >> 3 * l) & 7) << 8)];
          const int8_t *grid = (const int8_t *)&gv;
          for (int j = 0; j < 8; j++) y[j] = dl * (grid[j] + delta);
          y += 8;
        }
        qs += 4;
      }
      return;
    }
    case FLOE_TYPE_IQ1_M: {
      const uint8_t *qs = b, *qh = b + 32;
      uint32_t sc[4];
      for (int k = 0; k < 4; k++) sc[k] = rd16(b + 48 + 2 * k);
      const uint32_t dbits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
      const float d = mm_f16(dbits);
      for (int ib = 0; ib < 8; ib++) {
        const float dl1 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 7) + 1);
        const float dl2 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1);
        const int idx[4] = {qs[0] | ((qh[0] << 8) & 0x700), qs[1] | ((qh[0] << 4) & 0x700),
                            qs[2] | ((qh[1] << 8) & 0x700), qs[3] | ((qh[1] << 4) & 0x700)};
        const float delta[4] = {qh[0] & 0x08 ? -IQ1_DELTA : IQ1_DELTA, qh[0] & 0x80 ? -IQ1_DELTA : IQ1_DELTA,
                                qh[1] & 0x08 ? -IQ1_DELTA : IQ1_DELTA, qh[1] & 0x80 ? -IQ1_DELTA : IQ1_DELTA};
        for (int l = 0; l < 4; l++) {
          const uint64_t gv = d_iq1s_grid[idx[l]];
          const int8_t *grid = (const int8_t *)&gv;
          const float dl = l < 2 ? dl1 : dl2;
          for (int j = 0; j < 8; j++) y[j] = dl * (grid[j] + delta[l]);
          y += 8;
        }
        qs += 4;
        qh += 2;
      }
      return;
    }
    default:
      return;
  }
}

/* The decode unit of a row: a block (block types), 8 values (plain types) or an MLX group. */
__device__ __forceinline__ int unit_vals(const KArgs &a, int blck) {
  return a.type == FLOE_TYPE_MLX ? a.group : blck == 1 ? 8 : blck;
}

/* Unit u (values u * uv .. + uv) of row `row` (expert e, row r) into y. */
__device__ __forceinline__ void dq_unit(const KArgs &a, int blck, int bbytes, int e, int64_t r, int64_t u, int uv,
                                        float *y) {
  const uint8_t *row = mm_row(a, e, r);
  switch (a.type) {
    case FLOE_TYPE_F32: /* plain types: 8 values, the row's tail cut at cols */
      for (int j = 0; j < 8 && u * 8 + j < a.cols; j++) y[j] = ((const float *)row)[u * 8 + j];
      return;
    case FLOE_TYPE_F16:
      for (int j = 0; j < 8 && u * 8 + j < a.cols; j++) y[j] = mm_f16(((const uint16_t *)row)[u * 8 + j]);
      return;
    case FLOE_TYPE_BF16:
      for (int j = 0; j < 8 && u * 8 + j < a.cols; j++) y[j] = mm_bf16(((const uint16_t *)row)[u * 8 + j]);
      return;
    case FLOE_TYPE_MLX: {
      const size_t so = (size_t)e * a.sb_estride + (size_t)r * a.sb_row_bytes;
      const float s = mm_sb(a.sb_type, a.sc + so, u), bb = mm_sb(a.sb_type, a.bi + so, u);
      const int bits = a.bits;
      const uint32_t mask = (1u << bits) - 1;
      for (int j = 0; j < uv; j++) { /* code k of the row's LSB-first bit stream */
        const uint64_t o = (uint64_t)(u * uv + j) * (uint64_t)bits;
        const uint8_t *p = row + (o >> 3);
        const unsigned sh = (unsigned)(o & 7);
        uint32_t v = p[0];
        if (sh + (unsigned)bits > 8) v |= (uint32_t)p[1] << 8;
        y[j] = s * (float)((v >> sh) & mask) + bb;
      }
      return;
    }
    default:
      dq_block(a.type, row + (size_t)u * (size_t)bbytes, y);
      (void)blck;
  }
}

#define FCH 256 /* values per chunk */

/* acc[b] += sum over the row's values, in order, for the nbt rows of x (ldx apart). */
__device__ void float_pass(const KArgs &a, int blck, int bbytes, int e, int64_t r0, const float *x, int64_t ldx,
                           int nbt, float acc[16], float (*buf)[FCH + 1]) {
  const int t = threadIdx.x;
  const int uv = unit_vals(a, blck);
  const int64_t r = r0 + t;
  for (int64_t j0 = 0; j0 < a.cols; j0 += FCH) {
    const int n = (int)(a.cols - j0 < FCH ? a.cols - j0 : FCH), upr = (n + uv - 1) / uv;
    for (int u = t; u < 32 * upr; u += 32) {
      const int rr = u / upr, uu = u % upr;
      if (r0 + rr < a.rows) dq_unit(a, blck, bbytes, e, r0 + rr, j0 / uv + uu, uv, &buf[rr][uu * uv]);
    }
    __syncwarp();
    if (r < a.rows)
#pragma unroll
      for (int b = 0; b < 16; b++) {
        if (b >= nbt) break;
        const float *xa = x + b * ldx + j0;
        float s = acc[b];
        for (int j = 0; j < n; j++) s += buf[t][j] * xa[j];
        acc[b] = s;
      }
    __syncwarp();
  }
}

__global__ void __launch_bounds__(32) k_float(KArgs a, KArgs a2, int mode, int blck, int bbytes, int64_t nb, int K,
                                              const int32_t *ids, const float *X, int64_t ldx, float *Y, int64_t ldy) {
  PDL_ENTER();
  __shared__ float buf[32][FCH + 1];
  const int64_t r0 = (int64_t)blockIdx.x * 32, r = r0 + threadIdx.x;
  float acc[16];
  for (int b = 0; b < 16; b++) acc[b] = 0.0f;
  if (mode == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * 16;
    const int nbt = (int)(nb - b0 < 16 ? nb - b0 : 16);
    float_pass(a, blck, bbytes, 0, r0, X + b0 * ldx, ldx, nbt, acc, buf);
    if (r < a.rows)
#pragma unroll
      for (int b = 0; b < 16; b++)
        if (b < nbt) Y[(b0 + b) * ldy + r] = acc[b];
    return;
  }
  const int64_t slot = blockIdx.y;
  const int e = ids ? ids[slot] : 0;
  if (e < 0 || e >= a.n_expert) {
    if (r < a.rows) Y[slot * ldy + r] = __int_as_float(0x7fc00000);
    return;
  }
  const float *x = X + (mode == MM_GLU ? slot / K : slot) * ldx;
  float_pass(a, blck, bbytes, e, r0, x, ldx, 1, acc, buf);
  if (mode == MM_GLU) {
    float acc2[16];
    for (int b = 0; b < 16; b++) acc2[b] = 0.0f;
    float_pass(a2, blck, bbytes, e, r0, x, ldx, 1, acc2, buf);
    if (r < a.rows) Y[slot * ldy + r] = floe_siluf(acc[0]) * acc2[0];
  } else if (r < a.rows) {
    Y[slot * ldy + r] = acc[0];
  }
}

__global__ void __launch_bounds__(128) k_dequant(KArgs a, int blck, int bbytes, const int32_t *rows, float *out,
                                                 int64_t ldo) {
  PDL_ENTER();
  const int64_t i = blockIdx.x;
  const int64_t r = rows ? rows[i] : i;
  float *y = out + i * ldo;
  if (r < 0 || r >= a.rows) {
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) y[j] = __int_as_float(0x7fc00000);
    return;
  }
  const int uv = unit_vals(a, blck);
  for (int64_t u = threadIdx.x; u < (a.cols + uv - 1) / uv; u += blockDim.x) dq_unit(a, blck, bbytes, 0, r, u, uv, y + u * uv);
}

/* F32 / F16 / BF16: the AVX-512 float path's order (kern_mm_float_lanes_ref in kernels.h), one
 * warp per weight row. The CPU kernel sums a row in 64 lanes of fused multiply-adds (value j of
 * the first cols & ~63 to lane j % 64; the last cols % 64 values in 16-value steps to lanes j % 16,
 * a masked lane adding fma(0, 0, a) = a + 0), then (a0 + a1) + (a2 + a3) per 16 lanes, then the 16
 * lanes by halves. Here thread t owns lanes 2t and 2t + 1: each is the CPU lane's own chain of
 * fmaf, in the same element order, and the final sums are warp shuffles pairing the same lanes
 * (a float sum does not depend on its operands' order). So every output equals the CPU's AVX-512
 * result bit for bit, and a row's bits do not depend on nb. One 64-value step reads 256 bytes of
 * an F32 row (128 of F16/BF16) across the warp: coalesced. */
__device__ __forceinline__ void plain2(int type, const uint8_t *row, int64_t j, bool al, float &w0, float &w1) {
  if (type == FLOE_TYPE_F32) {
    if (al) {
      const float2 p = *(const float2 *)(row + 4 * j);
      w0 = p.x, w1 = p.y;
    } else {
      w0 = ((const float *)row)[j], w1 = ((const float *)row)[j + 1];
    }
    return;
  }
  uint32_t h0, h1;
  if (al) {
    const uint32_t p = *(const uint32_t *)(row + 2 * j);
    h0 = p & 0xFFFF, h1 = p >> 16;
  } else {
    h0 = ((const uint16_t *)row)[j], h1 = ((const uint16_t *)row)[j + 1];
  }
  w0 = type == FLOE_TYPE_F16 ? mm_f16(h0) : mm_bf16(h0);
  w1 = type == FLOE_TYPE_F16 ? mm_f16(h1) : mm_bf16(h1);
}

__device__ __forceinline__ float plain_at(int type, const uint8_t *row, int64_t j) {
  if (type == FLOE_TYPE_F32) return ((const float *)row)[j];
  const uint32_t h = ((const uint16_t *)row)[j];
  return type == FLOE_TYPE_F16 ? mm_f16(h) : mm_bf16(h);
}

/* The x values of lanes 2t, 2t + 1 at j (x rows need not be 8-byte aligned) */
__device__ __forceinline__ float2 x2(const float *x, int64_t j, bool al) {
  if (al) return *(const float2 *)(x + j);
  return make_float2(x[j], x[j + 1]);
}

#define PL_STEPS 16 /* 64-value steps whose loads are issued together (one memory round trip) */

/* acc0[b], acc1[b]: lanes 2t, 2t + 1 of activation row b (nbt rows of x, ldx apart). A decode
 * GEMV of a few rows is latency-bound: the loads of PL_STEPS steps are issued before their fused
 * multiply-adds, which then run in element order per lane. */
__device__ __forceinline__ void lanes_pass(const KArgs &a, const uint8_t *__restrict__ row, const float *__restrict__ x,
                                           int64_t ldx, int nbt, float acc0[16], float acc1[16]) {
  const int t = threadIdx.x & 31;
  const int64_t n = a.cols, m64 = n & ~(int64_t)63;
  const bool al = ((uintptr_t)row & (a.type == FLOE_TYPE_F32 ? 7 : 3)) == 0;
  int64_t j = 0;
  for (; j + 64 * PL_STEPS <= m64; j += 64 * PL_STEPS) {
    float2 w[PL_STEPS];
#pragma unroll
    for (int u = 0; u < PL_STEPS; u++) plain2(a.type, row, j + 64 * u + 2 * t, al, w[u].x, w[u].y);
#pragma unroll
    for (int b = 0; b < 16; b++) {
      if (b >= nbt) break;
      const float *xb = x + b * ldx;
      const bool xa = ((uintptr_t)xb & 7) == 0;
      float2 xv[PL_STEPS];
#pragma unroll
      for (int u = 0; u < PL_STEPS; u++) xv[u] = x2(xb, j + 64 * u + 2 * t, xa);
      float s0 = acc0[b], s1 = acc1[b];
#pragma unroll
      for (int u = 0; u < PL_STEPS; u++) {
        s0 = __fmaf_rn(w[u].x, xv[u].x, s0);
        s1 = __fmaf_rn(w[u].y, xv[u].y, s1);
      }
      acc0[b] = s0, acc1[b] = s1;
    }
  }
  for (; j < m64; j += 64) {
    float w0, w1;
    plain2(a.type, row, j + 2 * t, al, w0, w1);
#pragma unroll
    for (int b = 0; b < 16; b++) {
      if (b >= nbt) break;
      const float *xb = x + b * ldx + j + 2 * t;
      acc0[b] = __fmaf_rn(w0, xb[0], acc0[b]);
      acc1[b] = __fmaf_rn(w1, xb[1], acc1[b]);
    }
  }
  for (; j < n; j += 16) { /* lanes 0..15: threads 0..7 */
    if (t >= 8) continue;
    const int64_t e = j + 2 * t;
    const float w0 = e < n ? plain_at(a.type, row, e) : 0.0f, w1 = e + 1 < n ? plain_at(a.type, row, e + 1) : 0.0f;
#pragma unroll
    for (int b = 0; b < 16; b++) {
      if (b >= nbt) break;
      const float *xb = x + b * ldx;
      acc0[b] = e < n ? __fmaf_rn(w0, xb[e], acc0[b]) : acc0[b] + 0.0f;
      acc1[b] = e + 1 < n ? __fmaf_rn(w1, xb[e + 1], acc1[b]) : acc1[b] + 0.0f;
    }
  }
}

/* The CPU's final sums of one activation row's 64 lanes; the result is valid in every thread. */
__device__ __forceinline__ float lanes_sum(float v0, float v1) {
  v0 += __shfl_xor_sync(0xffffffffu, v0, 8); /* a0 + a1, a2 + a3 */
  v1 += __shfl_xor_sync(0xffffffffu, v1, 8);
  v0 += __shfl_xor_sync(0xffffffffu, v0, 16); /* (a0 + a1) + (a2 + a3): threads 0..7 hold lanes 2t, 2t + 1 */
  v1 += __shfl_xor_sync(0xffffffffu, v1, 16);
  v0 += __shfl_xor_sync(0xffffffffu, v0, 4); /* lane i + 8 */
  v1 += __shfl_xor_sync(0xffffffffu, v1, 4);
  v0 += __shfl_xor_sync(0xffffffffu, v0, 2); /* lane i + 4 */
  v1 += __shfl_xor_sync(0xffffffffu, v1, 2);
  v0 += __shfl_xor_sync(0xffffffffu, v0, 1); /* lane i + 2 */
  v1 += __shfl_xor_sync(0xffffffffu, v1, 1);
  return v0 + v1; /* lane i + 1 */
}

#define PL_WARPS 4 /* rows (warps) per block */

__global__ void __launch_bounds__(32 * PL_WARPS) k_plain(KArgs a, KArgs a2, int mode, int64_t nb, int K,
                                                         const int32_t *ids, const float *X, int64_t ldx, float *Y,
                                                         int64_t ldy) {
  PDL_ENTER();
  const int64_t r = (int64_t)blockIdx.x * PL_WARPS + (threadIdx.x >> 5);
  const bool w = (threadIdx.x & 31) == 0;
  if (r >= a.rows) return;
  float acc0[16], acc1[16];
#pragma unroll
  for (int b = 0; b < 16; b++) acc0[b] = acc1[b] = 0.0f;
  if (mode == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * 16;
    const int nbt = (int)(nb - b0 < 16 ? nb - b0 : 16);
    lanes_pass(a, mm_row(a, 0, r), X + b0 * ldx, ldx, nbt, acc0, acc1);
#pragma unroll
    for (int b = 0; b < 16; b++) {
      if (b >= nbt) break;
      const float y = lanes_sum(acc0[b], acc1[b]);
      if (w) Y[(b0 + b) * ldy + r] = y;
    }
    return;
  }
  const int64_t slot = blockIdx.y;
  const int e = ids ? ids[slot] : 0;
  if (e < 0 || e >= a.n_expert) {
    if (w) Y[slot * ldy + r] = __int_as_float(0x7fc00000);
    return;
  }
  const float *x = X + (mode == MM_GLU ? slot / K : slot) * ldx;
  lanes_pass(a, mm_row(a, e, r), x, ldx, 1, acc0, acc1);
  const float g = lanes_sum(acc0[0], acc1[0]);
  if (mode == MM_GLU) {
    float u0[16], u1[16];
    u0[0] = u1[0] = 0.0f;
    lanes_pass(a2, mm_row(a2, e, r), x, ldx, 1, u0, u1);
    const float u = lanes_sum(u0[0], u1[0]);
    if (w) Y[slot * ldy + r] = floe_siluf(g) * u;
  } else if (w) {
    Y[slot * ldy + r] = g;
  }
}

/* One activation row (the decode step's router and gates), type T fixed at compile time: the
 * same lanes and order as k_plain with nb = 1, in a small kernel (no activation-row loop, no type
 * switch per load). FLOE_CUDA_PLAIN1=0 sends these calls to k_plain instead (A/B). */
template <int T>
__device__ __forceinline__ float2 ld2(const uint8_t *__restrict__ row, int64_t j, bool al) {
  float2 w;
  plain2(T, row, j, al, w.x, w.y);
  return w;
}

/* Row r's dot with x (valid in every lane of the warp). */
template <int T>
__device__ __forceinline__ float plain1_row(const KArgs &a, int64_t r, const float *__restrict__ x) {
  const int t = threadIdx.x & 31;
  const uint8_t *__restrict__ row = mm_row(a, 0, r);
  const int64_t n = a.cols, m64 = n & ~(int64_t)63;
  const bool al = ((uintptr_t)row & (T == FLOE_TYPE_F32 ? 7 : 3)) == 0, xa = ((uintptr_t)x & 7) == 0;
  float s0 = 0.0f, s1 = 0.0f;
  int64_t j = 0;
  for (; j + 64 * PL_STEPS <= m64; j += 64 * PL_STEPS) {
    float2 w[PL_STEPS], xv[PL_STEPS];
#pragma unroll
    for (int u = 0; u < PL_STEPS; u++) {
      w[u] = ld2<T>(row, j + 64 * u + 2 * t, al);
      xv[u] = x2(x, j + 64 * u + 2 * t, xa);
    }
#pragma unroll
    for (int u = 0; u < PL_STEPS; u++) {
      s0 = __fmaf_rn(w[u].x, xv[u].x, s0);
      s1 = __fmaf_rn(w[u].y, xv[u].y, s1);
    }
  }
  for (; j < m64; j += 64) {
    const float2 w = ld2<T>(row, j + 2 * t, al), xv = x2(x, j + 2 * t, xa);
    s0 = __fmaf_rn(w.x, xv.x, s0);
    s1 = __fmaf_rn(w.y, xv.y, s1);
  }
  for (; j < n; j += 16) { /* lanes 0..15: threads 0..7 */
    if (t >= 8) continue;
    const int64_t e = j + 2 * t;
    s0 = e < n ? __fmaf_rn(plain_at(T, row, e), x[e], s0) : s0 + 0.0f;
    s1 = e + 1 < n ? __fmaf_rn(plain_at(T, row, e + 1), x[e + 1], s1) : s1 + 0.0f;
  }
  return lanes_sum(s0, s1);
}

template <int T>
__global__ void __launch_bounds__(128) k_plain1(KArgs a, const float *__restrict__ x, float *__restrict__ Y, int pf) {
  const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (pf && r < a.rows) mm_pf_l2(mm_row(a, 0, r), a.row_bytes, threadIdx.x & 31); /* the row, before the wait */
  PDL_ENTER();
  if (r >= a.rows) return;
  const float y = plain1_row<T>(a, r, x);
  if ((threadIdx.x & 31) == 0) Y[r] = y;
}

/* A few activation rows (2..PN_NB: a speculative verify, a small batch) with k_plain1's shape: a
 * warp per weight row, whose values are loaded once per 64-value step and used for every
 * activation row; each (weight row, activation row) output is plain1_row's chain (lanes 2t / 2t+1
 * of thread t, fmaf in element order, the 16-value tail, lanes_sum): the bits of k_plain1 and
 * k_plain_tile. k_plain_tile gives a 256-row router 16 blocks, ~36 us at 4 rows (the decode step's
 * k_plain1: ~4 us); here a block per 4 rows. */
#define PN_NB 8

template <int T, int NB>
__global__ void __launch_bounds__(128) k_plainn(KArgs a, int nb, const float *__restrict__ X, int64_t ldx, MMOut o,
                                                int pf) {
  const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (pf && r < a.rows) mm_pf_l2(mm_row(a, 0, r), a.row_bytes, threadIdx.x & 31);
  PDL_ENTER();
  if (r >= a.rows) return;
  const int t = threadIdx.x & 31;
  const uint8_t *__restrict__ row = mm_row(a, 0, r);
  const int64_t n = a.cols, m64 = n & ~(int64_t)63;
  const bool al = ((uintptr_t)row & (T == FLOE_TYPE_F32 ? 7 : 3)) == 0;
  bool xa = true;
  for (int b = 0; b < nb; b++) xa = xa && ((uintptr_t)(X + b * ldx) & 7) == 0;
  float s0[NB], s1[NB];
#pragma unroll
  for (int b = 0; b < NB; b++) s0[b] = s1[b] = 0.0f;
  /* 64-value steps in flight: the weights and every row's x of ST steps loaded before their fmas
   * (one memory round trip a round; 2048 values: 2 rounds at 2 rows, 8 at 8) */
  constexpr int ST = NB <= 2 ? PL_STEPS : NB <= 4 ? PL_STEPS / 2 : PL_STEPS / 4;
  int64_t j = 0;
  for (; j + 64 * ST <= m64; j += 64 * ST) {
    float2 w[ST], xv[NB][ST];
#pragma unroll
    for (int u = 0; u < ST; u++) w[u] = ld2<T>(row, j + 64 * u + 2 * t, al);
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
      for (int u = 0; u < ST; u++) xv[b][u] = b < nb ? x2(X + b * ldx, j + 64 * u + 2 * t, xa) : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nb) break;
#pragma unroll
      for (int u = 0; u < ST; u++) {
        s0[b] = __fmaf_rn(w[u].x, xv[b][u].x, s0[b]);
        s1[b] = __fmaf_rn(w[u].y, xv[b][u].y, s1[b]);
      }
    }
  }
  for (; j < m64; j += 64) {
    const float2 w = ld2<T>(row, j + 2 * t, al);
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nb) break;
      const float2 xv = x2(X + b * ldx, j + 2 * t, xa);
      s0[b] = __fmaf_rn(w.x, xv.x, s0[b]);
      s1[b] = __fmaf_rn(w.y, xv.y, s1[b]);
    }
  }
  for (; j < n; j += 16) { /* lanes 0..15: threads 0..7 */
    if (t >= 8) continue;
    const int64_t e = j + 2 * t;
    const float w0 = e < n ? plain_at(T, row, e) : 0.0f, w1 = e + 1 < n ? plain_at(T, row, e + 1) : 0.0f;
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nb) break;
      const float *xb = X + b * ldx;
      s0[b] = e < n ? __fmaf_rn(w0, xb[e], s0[b]) : s0[b] + 0.0f;
      s1[b] = e + 1 < n ? __fmaf_rn(w1, xb[e + 1], s1[b]) : s1[b] + 0.0f;
    }
  }
#pragma unroll
  for (int b = 0; b < NB; b++) {
    const float y = lanes_sum(s0[b], s1[b]); /* the whole warp shuffles, for every b */
    if (t == 0 && b < nb) *mm_out(o, b, r) = y;
  }
}

/* A few activation rows as k_plain1 runs one: a block per 4 weight rows and activation row
 * (blockIdx.y), so each output is plain1_row's chain (the bits of k_plain1 and k_plainn) and the
 * serial path is one row's. k_plainn loads a weight row's values once for every activation row,
 * but in rounds of PL_STEPS / 2 (4 rows) steps: the router of 2048 columns takes 4 dependent
 * round trips there where k_plain1 takes 2, and one of 256 columns (fewer than a round) takes one
 * a 64-value step. Here the weights come from L2 once per activation row (the first row's blocks
 * prefetch them before the wait). cuda_mm_set_plain1n / FLOE_CUDA_PLAIN1N=0: k_plainn. */
template <int T>
__global__ void __launch_bounds__(128) k_plain1n(KArgs a, const float *__restrict__ X, int64_t ldx, MMOut o, int pf) {
  const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (pf && blockIdx.y == 0 && r < a.rows) mm_pf_l2(mm_row(a, 0, r), a.row_bytes, threadIdx.x & 31);
  PDL_ENTER();
  if (r >= a.rows) return;
  const float y = plain1_row<T>(a, r, X + (int64_t)blockIdx.y * ldx);
  if ((threadIdx.x & 31) == 0) *mm_out(o, blockIdx.y, r) = y;
}

/* The decode step's router: the logits as k_plain1 (a warp a row, 4 a block, the row prefetched
 * into L2 before the wait), then the grid's last block to finish (an atomic count of finished
 * blocks, ctr back to 0 after it) routes them with its first warp as k_moe_route_warp does
 * (moe_route.cuh moe_route_warp), reading the other blocks' logits from L2. One launch instead of
 * two. (The first form ran 256-thread blocks without the prefetch and routed with the block
 * kernel's rank count: 390-398 vs 431 tok/s on the H200, 35B-A3B.) */
#define RT_MAXE (32 * ROUTE_RMAX) /* experts the fused router takes */

template <int T, int R>
__global__ void __launch_bounds__(128) k_router(KArgs a, const float *__restrict__ x, float *Y, int NE, int K,
                                                int norm_topk, int sh_id, int32_t *sel, float *wout, unsigned *ctr,
                                                int pf) {
  const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (pf && r < a.rows) mm_pf_l2(mm_row(a, 0, r), a.row_bytes, threadIdx.x & 31); /* the row, before the wait */
  PDL_ENTER();
  __shared__ bool last;
  if (r < a.rows) { /* warp-uniform; every thread reaches the barriers below */
    const float y = plain1_row<T>(a, r, x);
    if ((threadIdx.x & 31) == 0) Y[r] = y;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ctr, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last || threadIdx.x >= 32) return;
  __threadfence();
  moe_route_warp<R>([&](int e) { return __ldcg(Y + e); }, [&]() { return __ldcg(Y + NE); }, sh_id >= 0, NE, K,
                    norm_topk, sh_id, sel, wout);
  if (threadIdx.x == 0) *ctr = 0;
}

/* Several activation rows (prefill: the router and the shared-expert gate of a chunk): k_plain
 * reads every activation value from L2 once per weight row (~1 GB a layer for a 512-token
 * chunk of the 35B-A3B router), which holds it to ~300 us. Here a block of PT_WARPS warps takes
 * PT_ROWS weight rows a warp and PT_NB activation rows, and stages PT_CH-value chunks of the
 * activation rows in shared memory, read by all its warps; the weight values of a chunk are
 * loaded into registers together. Every output is the same chains as lanes_pass (lane 2t / 2t+1
 * of thread t, fmaf in element order, then the tail in 16-value steps and lanes_sum): the same
 * bits as k_plain and the CPU's AVX-512 order. */
#define PT_WARPS 8
#define PT_ROWS 2
#define PT_NB 16
#define PT_CH 512 /* values a chunk: 8 steps of 64 */

template <int T>
__global__ void __launch_bounds__(32 * PT_WARPS, 2) k_plain_tile(KArgs a, int64_t nb, const float *__restrict__ X,
                                                              int64_t ldx, float *__restrict__ Y, int64_t ldy, int vec) {
  __shared__ __align__(16) float xs[PT_NB][PT_CH];
  PDL_ENTER();
  const int t = threadIdx.x & 31, wp = threadIdx.x >> 5;
  const int64_t r0 = ((int64_t)blockIdx.x * PT_WARPS + wp) * PT_ROWS;
  const int64_t b0 = (int64_t)blockIdx.y * PT_NB;
  const int nbt = (int)(nb - b0 < PT_NB ? nb - b0 : PT_NB);
  const int64_t n = a.cols, m64 = n & ~(int64_t)63;
  const uint8_t *row[PT_ROWS];
  bool al[PT_ROWS];
#pragma unroll
  for (int q = 0; q < PT_ROWS; q++) {
    row[q] = mm_row(a, 0, r0 + q < a.rows ? r0 + q : a.rows - 1); /* past the end: computed, not written */
    al[q] = ((uintptr_t)row[q] & (T == FLOE_TYPE_F32 ? 7 : 3)) == 0;
  }
  float acc0[PT_ROWS][PT_NB], acc1[PT_ROWS][PT_NB];
#pragma unroll
  for (int q = 0; q < PT_ROWS; q++)
#pragma unroll
    for (int b = 0; b < PT_NB; b++) acc0[q][b] = acc1[q][b] = 0.0f;
  for (int64_t j0 = 0; j0 < m64; j0 += PT_CH) {
    const int ch = (int)(m64 - j0 < PT_CH ? m64 - j0 : PT_CH); /* a multiple of 64 */
    __syncthreads(); /* the previous chunk is consumed */
    if (vec && ch == PT_CH) { /* a whole chunk, 16-byte aligned rows: a thread's loads in two batches of NV */
      constexpr int NV = PT_NB * PT_CH / 4 / (32 * PT_WARPS) / 2;
      static_assert(2 * NV * 4 * 32 * PT_WARPS == PT_NB * PT_CH, "whole float4 rounds");
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float4 v[NV];
#pragma unroll
        for (int k = 0; k < NV; k++) {
          const int i = threadIdx.x + (h * NV + k) * 32 * PT_WARPS, b = i / (PT_CH / 4), c = 4 * (i % (PT_CH / 4));
          v[k] = b < nbt ? *(const float4 *)(X + (b0 + b) * ldx + j0 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < NV; k++) {
          const int i = threadIdx.x + (h * NV + k) * 32 * PT_WARPS, b = i / (PT_CH / 4), c = 4 * (i % (PT_CH / 4));
          *(float4 *)&xs[b][c] = v[k];
        }
      }
    } else
      for (int i = threadIdx.x; i < PT_NB * ch; i += blockDim.x) {
        const int b = i / ch, c = i - b * ch;
        xs[b][c] = b < nbt ? X[(b0 + b) * ldx + j0 + c] : 0.0f;
      }
    __syncthreads();
    float2 w[PT_ROWS][PT_CH / 64];
#pragma unroll
    for (int u = 0; u < PT_CH / 64; u++)
#pragma unroll
      for (int q = 0; q < PT_ROWS; q++)
        if (64 * u < ch) plain2(T, row[q], j0 + 64 * u + 2 * t, al[q], w[q][u].x, w[q][u].y);
#pragma unroll
    for (int u = 0; u < PT_CH / 64; u++) {
      if (64 * u >= ch) break;
#pragma unroll
      for (int b = 0; b < PT_NB; b++) {
        const float2 xv = *(const float2 *)&xs[b][64 * u + 2 * t];
#pragma unroll
        for (int q = 0; q < PT_ROWS; q++) {
          acc0[q][b] = __fmaf_rn(w[q][u].x, xv.x, acc0[q][b]);
          acc1[q][b] = __fmaf_rn(w[q][u].y, xv.y, acc1[q][b]);
        }
      }
    }
  }
  for (int64_t j = m64; j < n; j += 16) { /* lanes 0..15: threads 0..7, as lanes_pass */
    if (t >= 8) continue;
    const int64_t e = j + 2 * t;
#pragma unroll
    for (int q = 0; q < PT_ROWS; q++) {
      const float w0 = e < n ? plain_at(T, row[q], e) : 0.0f, w1 = e + 1 < n ? plain_at(T, row[q], e + 1) : 0.0f;
#pragma unroll
      for (int b = 0; b < PT_NB; b++) {
        if (b >= nbt) break;
        const float *xb = X + (b0 + b) * ldx;
        acc0[q][b] = e < n ? __fmaf_rn(w0, xb[e], acc0[q][b]) : acc0[q][b] + 0.0f;
        acc1[q][b] = e + 1 < n ? __fmaf_rn(w1, xb[e + 1], acc1[q][b]) : acc1[q][b] + 0.0f;
      }
    }
  }
#pragma unroll
  for (int q = 0; q < PT_ROWS; q++)
#pragma unroll
    for (int b = 0; b < PT_NB; b++) {
      const float y = lanes_sum(acc0[q][b], acc1[q][b]); /* every thread takes part in the shuffles */
      if (t == 0 && b < nbt && r0 + q < a.rows) Y[(b0 + b) * ldy + r0 + q] = y;
    }
}

/* k_plain_tile for activation rows >= PT_MIN_NB (FLOE_CUDA_PLAIN_TILE=0 / cuda_mm_set_plain_tile(0):
 * k_plain, the same bits) */
#define PT_MIN_NB 2
static int g_plain_tile = -1;

static int plain_tile_on(void) {
  if (g_plain_tile < 0) {
    const char *e = getenv("FLOE_CUDA_PLAIN_TILE");
    g_plain_tile = !(e && e[0] == '0');
  }
  return g_plain_tile;
}

/* k_plain1n for 2..PN_NB activation rows (FLOE_CUDA_PLAIN1N=0 / cuda_mm_set_plain1n(0): k_plainn,
 * the same bits) */
static int g_plain1n = -1;

static int plain1n_on(void) {
  if (g_plain1n < 0) g_plain1n = mm_env_int("FLOE_CUDA_PLAIN1N", 1) != 0;
  return g_plain1n;
}

/* k_plain_tile stages whole chunks of 16-byte aligned activation rows with float4 loads, all
 * issued before the stores (FLOE_CUDA_PT_VEC=0: one float at a time, the first form; the same
 * values either way) */
static int pt_vec_on(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("FLOE_CUDA_PT_VEC");
    on = !(e && e[0] == '0');
  }
  return on;
}

static int plain1_on(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("FLOE_CUDA_PLAIN1");
    on = !(e && e[0] == '0');
  }
  return on;
}

void type_block(int type, int *blck, int *bbytes) {
  const floe_type_traits *tt = type == FLOE_TYPE_MLX ? nullptr : floe_type_info((uint32_t)type);
  *blck = tt ? tt->blck : 1;
  *bbytes = tt ? tt->bytes : 0;
}

} // namespace

void cuda_mm_set_plain_tile(int on) { g_plain_tile = on ? 1 : 0; }
void cuda_mm_set_plain1n(int on) { g_plain1n = on ? 1 : 0; }

int router_route_launch(const KArgs &a, const float *x, float *logits, int NE, int K, int norm_topk, int sh_id,
                        int32_t *sel, float *w, unsigned *ctr, cudaStream_t st) {
  if ((a.type != FLOE_TYPE_F32 && a.type != FLOE_TYPE_F16 && a.type != FLOE_TYPE_BF16) || NE < 1 || NE > RT_MAXE ||
      K < 1 || K > 32 || K > NE || a.rows != NE + (sh_id >= 0 ? 1 : 0))
    return FLOE_E_UNSUPPORTED;
  const dim3 g((unsigned)((a.rows + 3) / 4));
  const int pf = mm_pf_on();
#define RT_LAUNCH(T, R) \
  pdl_launch(k_router<T, R>, g, dim3(128), (size_t)0, st, a, x, logits, NE, K, norm_topk, sh_id, sel, w, ctr, pf)
#define RT_TYPE(R)                                     \
  do {                                                 \
    if (a.type == FLOE_TYPE_F32) RT_LAUNCH(FLOE_TYPE_F32, R);      \
    else if (a.type == FLOE_TYPE_F16) RT_LAUNCH(FLOE_TYPE_F16, R); \
    else RT_LAUNCH(FLOE_TYPE_BF16, R);                             \
  } while (0)
  if (NE <= 256) RT_TYPE(8);
  else if (NE <= 512) RT_TYPE(16);
  else RT_TYPE(32);
#undef RT_TYPE
#undef RT_LAUNCH
  return 0;
}

bool mm_float_few_launch(const KArgs &a, int64_t nb, const float *X, int64_t ldx, const MMOut &o, cudaStream_t st) {
  if ((a.type != FLOE_TYPE_F32 && a.type != FLOE_TYPE_F16 && a.type != FLOE_TYPE_BF16) || nb < 2 || nb > PN_NB ||
      !mm_few_on())
    return false;
  const int pf = mm_pf_on(), n = (int)nb;
  if (plain1n_on()) {
    const dim3 g1((unsigned)((a.rows + 3) / 4), (unsigned)nb);
    if (a.type == FLOE_TYPE_F32) pdl_launch(k_plain1n<FLOE_TYPE_F32>, g1, dim3(128), (size_t)0, st, a, X, ldx, o, pf);
    else if (a.type == FLOE_TYPE_F16) pdl_launch(k_plain1n<FLOE_TYPE_F16>, g1, dim3(128), (size_t)0, st, a, X, ldx, o, pf);
    else pdl_launch(k_plain1n<FLOE_TYPE_BF16>, g1, dim3(128), (size_t)0, st, a, X, ldx, o, pf);
    return true;
  }
  const dim3 g((unsigned)((a.rows + 3) / 4));
#define PN_LAUNCH(NB)                                                                                              \
  do {                                                                                                             \
    if (a.type == FLOE_TYPE_F32) pdl_launch(k_plainn<FLOE_TYPE_F32, NB>, g, dim3(128), (size_t)0, st, a, n, X, ldx, o, pf); \
    else if (a.type == FLOE_TYPE_F16) pdl_launch(k_plainn<FLOE_TYPE_F16, NB>, g, dim3(128), (size_t)0, st, a, n, X, ldx, o, pf); \
    else pdl_launch(k_plainn<FLOE_TYPE_BF16, NB>, g, dim3(128), (size_t)0, st, a, n, X, ldx, o, pf); \
  } while (0)
  if (nb <= 2) PN_LAUNCH(2);
  else if (nb <= 4) PN_LAUNCH(4);
  else PN_LAUNCH(8);
#undef PN_LAUNCH
  return true;
}

void mm_float_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                     const float *X, int64_t ldx, float *Y, int64_t ldy, cudaStream_t st) {
  int blck, bbytes;
  type_block(a.type, &blck, &bbytes);
  const unsigned gy = (unsigned)(mode == MM_PLAIN ? (nb + 15) / 16 : nb);
  if (a.type == FLOE_TYPE_F32 || a.type == FLOE_TYPE_F16 || a.type == FLOE_TYPE_BF16) {
    if (mode == MM_PLAIN && nb == 1 && plain1_on()) {
      const dim3 g((unsigned)((a.rows + 3) / 4));
      const int pf = mm_pf_on();
      if (a.type == FLOE_TYPE_F32) pdl_launch(k_plain1<FLOE_TYPE_F32>, g, dim3(128), (size_t)0, st, a, X, Y, pf);
      else if (a.type == FLOE_TYPE_F16) pdl_launch(k_plain1<FLOE_TYPE_F16>, g, dim3(128), (size_t)0, st, a, X, Y, pf);
      else pdl_launch(k_plain1<FLOE_TYPE_BF16>, g, dim3(128), (size_t)0, st, a, X, Y, pf);
      return;
    }
    if (mode == MM_PLAIN && nb >= 2) {
      const MMOut o = mm_out_all(Y, ldy, a.rows);
      if (mm_float_few_launch(a, nb, X, ldx, o, st)) return;
    }
    if (mode == MM_PLAIN && nb >= PT_MIN_NB && plain_tile_on()) {
      const dim3 g((unsigned)((a.rows + PT_WARPS * PT_ROWS - 1) / (PT_WARPS * PT_ROWS)), (unsigned)((nb + PT_NB - 1) / PT_NB));
      const int vec = pt_vec_on() && (ldx & 3) == 0 && ((uintptr_t)X & 15) == 0;
      if (a.type == FLOE_TYPE_F32) pdl_launch(k_plain_tile<FLOE_TYPE_F32>, g, dim3(32 * PT_WARPS), (size_t)0, st, a, nb, X, ldx, Y, ldy, vec);
      else if (a.type == FLOE_TYPE_F16) pdl_launch(k_plain_tile<FLOE_TYPE_F16>, g, dim3(32 * PT_WARPS), (size_t)0, st, a, nb, X, ldx, Y, ldy, vec);
      else pdl_launch(k_plain_tile<FLOE_TYPE_BF16>, g, dim3(32 * PT_WARPS), (size_t)0, st, a, nb, X, ldx, Y, ldy, vec);
      return;
    }
    pdl_launch(k_plain, dim3(dim3((unsigned)((a.rows + PL_WARPS - 1) / PL_WARPS), gy)), dim3(32 * PL_WARPS), (size_t)(0), st, a, a2, mode, nb, K, ids, X, ldx, Y, ldy);
    return;
  }
  const unsigned gx = (unsigned)((a.rows + 31) / 32);
  pdl_launch(k_float, dim3(dim3(gx, gy)), dim3(32), (size_t)(0), st, a, a2, mode, blck, bbytes, nb, K, ids, X, ldx, Y, ldy);
}

void mm_dequant_launch(const KArgs &a, const int32_t *rows, int64_t n, float *out, int64_t ldo, cudaStream_t st) {
  int blck, bbytes;
  type_block(a.type, &blck, &bbytes);
  if (n > 0) pdl_launch(k_dequant, dim3((unsigned)n), dim3(128), (size_t)(0), st, a, blck, bbytes, rows, out, ldo);
}

/* ---- tables ---- */

static int g_inited[64];

int cuda_mm_init(char *err, size_t errlen) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess && dev >= 0 && dev < 64 && g_inited[dev]) return 0;
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_kmask_iq2xs, kmask_iq2xs, sizeof d_kmask_iq2xs);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_ksigns_iq2xs, ksigns_iq2xs, sizeof d_ksigns_iq2xs);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_iq2xxs_grid, iq2xxs_grid, sizeof d_iq2xxs_grid);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_iq2xs_grid, iq2xs_grid, sizeof d_iq2xs_grid);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_iq2s_grid, iq2s_grid, sizeof d_iq2s_grid);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_iq3xxs_grid, iq3xxs_grid, sizeof d_iq3xxs_grid);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_iq3s_grid, iq3s_grid, sizeof d_iq3s_grid);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_iq1s_grid, iq1s_grid, sizeof d_iq1s_grid);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_kvalues_iq4nl, kvalues_iq4nl, 16);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_kvalues_mxfp4, kvalues_mxfp4, 16);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA: uploading the quantization tables: %s",
                    cudaGetErrorString(e));
  }
  if (dev >= 0 && dev < 64) g_inited[dev] = 1;
  return 0;
}
