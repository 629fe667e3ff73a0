/* The activation quantizer's device helpers (mm_act.cu's comment says what they compute): the
 * CPU's per-unit 127 / amax arithmetic, the Q4_K / Q5_K / IQ4_XS position permutations, and
 * act_row_warp, a row's A32 / A256 bytes with a warp per 256-value chunk. In a header so that a
 * matmul kernel can quantize its own input row (k_k4s's MoE down projection) with the same code
 * as k_act. */
#ifndef FLOE_CUDA_MM_ACT_CUH
#define FLOE_CUDA_MM_ACT_CUH
#include "kernels/cuda/mm_common.cuh"

/* A kernel that ends a block and quantizes its own output for the next matmul, in its launch
 * (cuda_mm_act_quantize's bytes for that matrix): the row layout's kind (KACT_A32 / KACT_A256;
 * -1: none, the caller quantizes), the matrix type (the A256 position permutation), the regions of
 * a quantized row (codes at 0, scales at off_d, the A256 16-value sums / the A32 repeated scales
 * at off_s), the row length, and the rows (xq, xs bytes apart). */
struct ActOut {
  uint8_t *xq;
  size_t xs, off_d, off_s;
  int64_t cols;
  int kind, type;
};
/* mm_act.cu: W's layout when it is A32 or A256 (kind -1 otherwise, or W NULL) */
ActOut mm_act_out(const cuda_mat *W, void *xq, size_t xs);

namespace {

__device__ __forceinline__ int q8v(float x, float amax) {
  if (!(amax > 0)) return 0;
  const float id = 127.0f / amax;
  const float v = rintf(x * id);
  return (int)(v > 127 ? 127 : v < -127 ? -127 : v);
}
__device__ __forceinline__ float d8(float amax) { return amax > 0 ? amax / 127.0f : 0.0f; }

/* the unit's reciprocal for q8i: 127 / amax as q8v computes it, -1 where q8v returns 0 (amax not
 * > 0; 127 / amax is >= 0 otherwise, +inf included) */
__device__ __forceinline__ float id8(float amax) { return amax > 0 ? 127.0f / amax : -1.0f; }
/* q8v(x, amax) from id = id8(amax): the same operations on the same values */
__device__ __forceinline__ int q8i(float x, float id) {
  if (!(id >= 0)) return 0;
  const float v = rintf(x * id);
  return (int)(v > 127 ? 127 : v < -127 ? -127 : v);
}

/* kact_perm256's inverse: the activation position (within a superblock) of natural index j. The
 * permutations move aligned runs of 16, so 4 consecutive values from a multiple of 4 stay
 * consecutive. */
__device__ __forceinline__ int iperm256(int type, int j) {
  if (type == FLOE_TYPE_Q4_K || type == FLOE_TYPE_Q5_K) { /* swaps bits 0 and 1 of the 32-run: its own inverse */
    const int t = j >> 5, pt = (t & 4) | ((t & 1) << 1) | ((t >> 1) & 1);
    return pt * 32 + (j & 31);
  }
  if (type == FLOE_TYPE_IQ4_XS) {
    const int h = j / 128, r = j % 128, k = r / 32, hi = (r % 32) / 16;
    return h * 128 + hi * 64 + k * 16 + r % 16;
  }
  return j;
}

__device__ __forceinline__ uint32_t pack4(const int v[4]) {
  return (uint32_t)(v[0] & 255) | (uint32_t)(v[1] & 255) << 8 | (uint32_t)(v[2] & 255) << 16 | (uint32_t)(v[3] & 255) << 24;
}

/* kact_perm256: natural index (within a superblock) of activation position p */
__device__ __forceinline__ int perm256(int type, int p) {
  if (type == FLOE_TYPE_Q4_K || type == FLOE_TYPE_Q5_K) {
    const int t = p >> 5, pt = (t & 4) | ((t & 1) << 1) | ((t >> 1) & 1); /* 0,2,1,3,4,6,5,7 */
    return pt * 32 + (p & 31);
  }
  if (type == FLOE_TYPE_IQ4_XS) {
    const int h = p / 128, r = p % 128, hi = r / 64, k = (r % 64) / 16;
    return h * 128 + k * 32 + hi * 16 + r % 16;
  }
  return p;
}

/* act_row for KACT_A32 / KACT_A256 (kind), a warp per 256-value chunk: lane l holds values
 * 4l..4l+3 and 128+4l..128+4l+3 of its chunk (one A256 unit; eight A32 units of 8 lanes each).
 * Needs no shared memory and no barrier; x: shared or global memory. act_row_warp_at: n values
 * of x (a multiple of 256 unless they end the row) into the row's parts at q (codes), d (scales)
 * and sp (the A256 16-value sums / the A32 scales repeated), each already moved to the first
 * chunk written: act_row_warp's bytes for those chunks of a longer row. */
__device__ __forceinline__ void act_row_warp_at(int type, int kind, const float *x, int8_t *q, float *d, uint8_t *sp,
                                                int n) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int c = warp; c * 256 < n; c += nw) {
    const int j0 = c * 256 + 4 * lane, j1 = j0 + 128;
    const bool in0 = j0 < n, in1 = j1 < n; /* n is a multiple of 32: 4-runs are wholly in or out */
    float v0[4], v1[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v0[i] = in0 ? x[j0 + i] : 0.0f;
      v1[i] = in1 ? x[j1 + i] : 0.0f;
    }
    float m0 = 0.0f, m1 = 0.0f; /* a maximum does not depend on the order it is taken in */
#pragma unroll
    for (int i = 0; i < 4; i++) {
      m0 = fmaxf(m0, fabsf(v0[i]));
      m1 = fmaxf(m1, fabsf(v1[i]));
    }
    int q0[4], q1[4];
    if (kind == KACT_A256) {
      float m = fmaxf(m0, m1);
#pragma unroll
      for (int s = 1; s < 32; s <<= 1) m = fmaxf(m, __shfl_xor_sync(MM_FULL, m, s));
      const float id = id8(m);
      int s0 = 0, s1 = 0;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        q0[i] = q8i(v0[i], id);
        q1[i] = q8i(v1[i], id);
        s0 += q0[i];
        s1 += q1[i];
      }
      /* the 16-value sums (natural order): 4 lanes each, an exact integer sum */
      s0 += __shfl_xor_sync(MM_FULL, s0, 1);
      s1 += __shfl_xor_sync(MM_FULL, s1, 1);
      s0 += __shfl_xor_sync(MM_FULL, s0, 2);
      s1 += __shfl_xor_sync(MM_FULL, s1, 2);
      int8_t *qc = q + c * 256;
      *(uint32_t *)(qc + iperm256(type, 4 * lane)) = pack4(q0);
      *(uint32_t *)(qc + iperm256(type, 128 + 4 * lane)) = pack4(q1);
      int16_t *bs = (int16_t *)sp + c * 16;
      if ((lane & 3) == 0) {
        bs[lane >> 2] = (int16_t)s0;
        bs[8 + (lane >> 2)] = (int16_t)s1;
      }
      if (lane == 0) d[c] = d8(m);
    } else { /* KACT_A32: units of 8 lanes */
#pragma unroll
      for (int s = 1; s < 8; s <<= 1) {
        m0 = fmaxf(m0, __shfl_xor_sync(MM_FULL, m0, s));
        m1 = fmaxf(m1, __shfl_xor_sync(MM_FULL, m1, s));
      }
      const float id0 = id8(m0), id1 = id8(m1);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        q0[i] = q8i(v0[i], id0);
        q1[i] = q8i(v1[i], id1);
      }
      float *dexp = (float *)sp;
      const int u0 = c * 8 + (lane >> 3), u1 = u0 + 4, i8 = lane & 7;
      if (in0) {
        *(uint32_t *)(q + j0) = pack4(q0);
        const float dk = d8(m0);
        dexp[8 * u0 + i8] = dk;
        if (i8 == 0) d[u0] = dk;
      }
      if (in1) {
        *(uint32_t *)(q + j1) = pack4(q1);
        const float dk = d8(m1);
        dexp[8 * u1 + i8] = dk;
        if (i8 == 0) d[u1] = dk;
      }
    }
  }
}
__device__ void act_row_warp(const KArgs &a, int kind, const float *x, uint8_t *o) {
  act_row_warp_at(a.type, kind, x, (int8_t *)o, (float *)(o + a.off_d), o + a.off_s, (int)a.cols);
}
/* Values from unit k on (A256: 256 values a unit, A32: 32) of the row at o (scales at off_d, sums /
 * repeated scales at off_s) from x (n values; a multiple of 256, or n ends the row; A32: of 32),
 * called by whole warps (a warp a chunk): act_row_warp's bytes for those values. */
__device__ __forceinline__ void act_row_warp_units(int type, int kind, size_t off_d, size_t off_s, uint8_t *o,
                                                   size_t k, const float *x, int n) {
  const bool u = kind == KACT_A256;
  act_row_warp_at(type, kind, x, (int8_t *)o + k * (u ? 256 : 32), (float *)(o + off_d) + k,
                  o + off_s + (u ? k * 16 * 2 : k * 8 * 4), n);
}
/* chunks c0.. of the row at o (256 values each) from x */
__device__ __forceinline__ void act_row_warp_from(const KArgs &a, int kind, const float *x, uint8_t *o, int n, int c0) {
  act_row_warp_units(a.type, kind, a.off_d, a.off_s, o, (size_t)c0 * (kind == KACT_A256 ? 1 : 8), x, n);
}
/* values [v0, v0 + n) of a row quantized for qo into its row o (v0 a multiple of the unit) */
__device__ __forceinline__ void act_out_range(const ActOut &qo, uint8_t *o, int64_t v0, const float *x, int n) {
  act_row_warp_units(qo.type, qo.kind, qo.off_d, qo.off_s, o, (size_t)(v0 / (qo.kind == KACT_A256 ? 256 : 32)), x, n);
}

/* The absolute maximum of x[0..n) (n <= 128; a maximum does not depend on the order it is taken
 * in), in every lane of the calling warp: lane l takes values 4l..4l+3. */
__device__ __forceinline__ float act_amax128(const float *x, int n) {
  const int lane = threadIdx.x & 31;
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++)
    if (4 * lane + i < n) m = fmaxf(m, fabsf(x[4 * lane + i]));
#pragma unroll
  for (int s = 1; s < 32; s <<= 1) m = fmaxf(m, __shfl_xor_sync(MM_FULL, m, s));
  return m;
}

/* A part of an A256 chunk whose maximum amax is known (the chunk's other values are another
 * block's): natural values j0 .. j0 + n of chunk c (j0 and n multiples of 16, n <= 128) from x,
 * into row o's codes and 16-value sums; the chunk's scale too when j0 is 0. Called by a whole
 * warp; act_row_warp's bytes for those values. */
__device__ __forceinline__ void act_out_a256_part(const ActOut &qo, uint8_t *o, int64_t c, int j0, const float *x,
                                                  int n, float amax) {
  const int lane = threadIdx.x & 31;
  const bool in = 4 * lane < n;
  const float id = id8(amax);
  int q[4], s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    q[i] = in ? q8i(x[4 * lane + i], id) : 0;
    s += q[i];
  }
  s += __shfl_xor_sync(MM_FULL, s, 1); /* the 16-value sums: 4 lanes each, an exact integer sum */
  s += __shfl_xor_sync(MM_FULL, s, 2);
  if (in) {
    *(uint32_t *)(o + c * 256 + iperm256(qo.type, j0 + 4 * lane)) = pack4(q);
    if ((lane & 3) == 0) ((int16_t *)(o + qo.off_s))[c * 16 + (j0 + 4 * lane) / 16] = (int16_t)s;
  }
  if (j0 == 0 && lane == 0) ((float *)(o + qo.off_d))[c] = d8(amax);
}

} // namespace
#endif
