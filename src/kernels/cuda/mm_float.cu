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
 * This path is for the types without a quantized-activation kernel (F32/F16/BF16, Q4_1, Q5_0,
 * Q5_1, Q2_K, Q3_K, IQ1/IQ2/IQ3, MLX 2/3/5/6-bit); one sequential chain per output limits it. */
#include "kernels/cuda/mm_common.cuh"

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

/* F32 / F16 / BF16: one thread per row reads its own row (16-byte loads where the row is
 * aligned), no staging; the same element-order sums. */
__device__ __forceinline__ float plain_at(int type, const uint8_t *row, int64_t j) {
  if (type == FLOE_TYPE_F32) return ((const float *)row)[j];
  const uint32_t h = ((const uint16_t *)row)[j];
  return type == FLOE_TYPE_F16 ? mm_f16(h) : mm_bf16(h);
}

__device__ __forceinline__ void plain_pass(const KArgs &a, const uint8_t *row, const float *x, int64_t ldx, int nbt,
                                           float acc[16]) {
  const int64_t n = a.cols;
  int64_t j = 0;
  if (((uintptr_t)row & 15) == 0)
    for (; j + 8 <= n; j += 8) {
      float v[8];
      if (a.type == FLOE_TYPE_F32) {
        const float4 p0 = *(const float4 *)(row + 4 * j), p1 = *(const float4 *)(row + 4 * j + 16);
        v[0] = p0.x, v[1] = p0.y, v[2] = p0.z, v[3] = p0.w, v[4] = p1.x, v[5] = p1.y, v[6] = p1.z, v[7] = p1.w;
      } else {
        const uint4 p = *(const uint4 *)(row + 2 * j);
        const uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
          v[2 * k] = a.type == FLOE_TYPE_F16 ? mm_f16(w[k] & 0xFFFF) : mm_bf16(w[k] & 0xFFFF);
          v[2 * k + 1] = a.type == FLOE_TYPE_F16 ? mm_f16(w[k] >> 16) : mm_bf16(w[k] >> 16);
        }
      }
#pragma unroll
      for (int b = 0; b < 16; b++) {
        if (b >= nbt) break;
        const float *xb = x + b * ldx + j;
        float sacc = acc[b];
#pragma unroll
        for (int k = 0; k < 8; k++) sacc += v[k] * xb[k];
        acc[b] = sacc;
      }
    }
  for (; j < n; j++) {
    const float w = plain_at(a.type, row, j);
#pragma unroll
    for (int b = 0; b < 16; b++) {
      if (b >= nbt) break;
      acc[b] += w * x[b * ldx + j];
    }
  }
}

__global__ void __launch_bounds__(128) k_plain(KArgs a, KArgs a2, int mode, int64_t nb, int K, const int32_t *ids,
                                               const float *X, int64_t ldx, float *Y, int64_t ldy) {
  const int64_t r = (int64_t)blockIdx.x * 128 + threadIdx.x;
  if (r >= a.rows) return;
  float acc[16];
#pragma unroll
  for (int b = 0; b < 16; b++) acc[b] = 0.0f;
  if (mode == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * 16;
    const int nbt = (int)(nb - b0 < 16 ? nb - b0 : 16);
    plain_pass(a, mm_row(a, 0, r), X + b0 * ldx, ldx, nbt, acc);
#pragma unroll
    for (int b = 0; b < 16; b++)
      if (b < nbt) Y[(b0 + b) * ldy + r] = acc[b];
    return;
  }
  const int64_t slot = blockIdx.y;
  const int e = ids ? ids[slot] : 0;
  if (e < 0 || e >= a.n_expert) {
    Y[slot * ldy + r] = __int_as_float(0x7fc00000);
    return;
  }
  const float *x = X + (mode == MM_GLU ? slot / K : slot) * ldx;
  plain_pass(a, mm_row(a, e, r), x, ldx, 1, acc);
  if (mode == MM_GLU) {
    float acc2[16];
    for (int b = 0; b < 16; b++) acc2[b] = 0.0f;
    plain_pass(a2, mm_row(a2, e, r), x, ldx, 1, acc2);
    Y[slot * ldy + r] = floe_siluf(acc[0]) * acc2[0];
  } else {
    Y[slot * ldy + r] = acc[0];
  }
}

void type_block(int type, int *blck, int *bbytes) {
  const floe_type_traits *tt = type == FLOE_TYPE_MLX ? nullptr : floe_type_info((uint32_t)type);
  *blck = tt ? tt->blck : 1;
  *bbytes = tt ? tt->bytes : 0;
}

} // namespace

void mm_float_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                     const float *X, int64_t ldx, float *Y, int64_t ldy, cudaStream_t st) {
  int blck, bbytes;
  type_block(a.type, &blck, &bbytes);
  const unsigned gy = (unsigned)(mode == MM_PLAIN ? (nb + 15) / 16 : nb);
  if (a.type == FLOE_TYPE_F32 || a.type == FLOE_TYPE_F16 || a.type == FLOE_TYPE_BF16) {
    k_plain<<<dim3((unsigned)((a.rows + 127) / 128), gy), 128, 0, st>>>(a, a2, mode, nb, K, ids, X, ldx, Y, ldy);
    return;
  }
  const unsigned gx = (unsigned)((a.rows + 31) / 32);
  k_float<<<dim3(gx, gy), 32, 0, st>>>(a, a2, mode, blck, bbytes, nb, K, ids, X, ldx, Y, ldy);
}

void mm_dequant_launch(const KArgs &a, const int32_t *rows, int64_t n, float *out, int64_t ldo, cudaStream_t st) {
  int blck, bbytes;
  type_block(a.type, &blck, &bbytes);
  if (n > 0) k_dequant<<<(unsigned)n, 128, 0, st>>>(a, blck, bbytes, rows, out, ldo);
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
