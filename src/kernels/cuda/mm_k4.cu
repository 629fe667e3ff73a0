/* Quantized-activation matmuls of Q4_K and Q5_K: the "superblock model" (kernels_internal.h).
 *
 * The CPU's order, per output: acc[16] = 0; for each superblock k the exact integers
 * S1 = sum w * x * sc (over the 256 positions) and S2 = sum_j m[j] * (bsum[2j] + bsum[2j+1]),
 * t = (float)S1 * (d * dx) - (float)S2 * (dmin * dx), acc[k % 16] = acc[k % 16] + t; then
 * reduce16. Here 8 threads compute one weight row (a warp: 4 rows) for up to NB activation rows:
 * thread j takes whole superblocks k = j, j+8, j+16, ... in order (9 loads of 16 bytes each,
 * all in flight), so it owns slots j (k % 16 = j) and j + 8 and adds their terms in superblock
 * order; S1 and S2 need no cross-thread sums. The end is kred16's tree: a[j] = slot j + slot j+8
 * in thread j, then b, c and the last add across threads 4, 2, 1 apart.
 *
 * Code byte q of a superblock (qs[q], q < 128): its low nibble is natural value 64 (q / 32) +
 * q % 32 (sub-block 2 (q / 32)) at activation position 128 (q / 64) + q % 64, its high nibble
 * natural 64 (q / 32) + 32 + q % 32 (sub-block 2 (q / 32) + 1) at position 128 (q / 64) + 64 +
 * q % 64 (the activation order 0,2,1,3 of 32-runs). Q5_K's fifth bit of both comes from
 * qh[q % 32], bits 2 (q / 32) and 2 (q / 32) + 1. */
#include <stdlib.h>

#include "kernels/cuda/mm_act.cuh"
#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/pdl.cuh"

namespace {

/* Code bytes 16w..16w+15 of a superblock (q) as 4-bit values (Q5_K: 5-bit, the fifth bits from
 * qh = qh[q % 32]'s uint4 of this w): lo = the low nibbles (sub-block 2 (w / 2)), hi = the high
 * ones (sub-block 2 (w / 2) + 1), 4 values a word. */
template <int T>
__device__ __forceinline__ void k4_unpack(const uint4 &q, const uint4 &qh, int w, uint32_t lo[4], uint32_t hi[4]) {
  lo[0] = q.x & 0x0F0F0F0Fu, lo[1] = q.y & 0x0F0F0F0Fu, lo[2] = q.z & 0x0F0F0F0Fu, lo[3] = q.w & 0x0F0F0F0Fu;
  hi[0] = (q.x >> 4) & 0x0F0F0F0Fu, hi[1] = (q.y >> 4) & 0x0F0F0F0Fu, hi[2] = (q.z >> 4) & 0x0F0F0F0Fu;
  hi[3] = (q.w >> 4) & 0x0F0F0F0Fu;
  if constexpr (T == FLOE_TYPE_Q5_K) {
    const uint32_t h4[4] = {qh.x, qh.y, qh.z, qh.w};
    const int sh = 2 * (w >> 1);
#pragma unroll
    for (int t = 0; t < 4; t++) {
      lo[t] |= ((h4[t] >> sh) & 0x01010101u) << 4;
      hi[t] |= ((h4[t] >> (sh + 1)) & 0x01010101u) << 4;
    }
  }
}

/* Row `row` . nb (<= NB) activation rows by the 8 threads j = 0..7 of its group; y valid in
 * thread j = 0. */
template <int T, int NB>
__device__ __forceinline__ void k4_dot(const KArgs &a, const uint8_t *row, const uint8_t *xq, size_t xs, int nb, int j,
                                       float y[NB]) {
  constexpr int BB = T == FLOE_TYPE_Q4_K ? 144 : 176; /* block bytes */
  constexpr int QS = T == FLOE_TYPE_Q4_K ? 16 : 48;   /* offset of qs */
  const int nsb = (int)(a.cols / 256);
  float acc0[NB], acc1[NB]; /* slots j and j + 8 */
#pragma unroll
  for (int b = 0; b < NB; b++) acc0[b] = acc1[b] = 0.0f;
  for (int k = j; k < nsb; k += 8) {
    const uint4 *blk = (const uint4 *)(row + (size_t)k * BB);
    const uint4 h = blk[0]; /* d, dmin, scales[12] */
    uint4 q[8];
#pragma unroll
    for (int w = 0; w < 8; w++) q[w] = blk[QS / 16 + w];
    uint4 qh0, qh1;
    if constexpr (T == FLOE_TYPE_Q5_K) {
      qh0 = blk[1];
      qh1 = blk[2];
    }
    const float d = mm_f16(h.x & 0xFFFF), dmin = mm_f16(h.x >> 16);
    /* get_scale_min_k4 on the 12 scale bytes (h.y, h.z, h.w) */
    int sc[8], mn[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int qi = (h.y >> (8 * i)) & 0xFF, qi4 = (h.z >> (8 * i)) & 0xFF, qi8 = (h.w >> (8 * i)) & 0xFF;
      sc[i] = qi & 63;
      mn[i] = qi4 & 63;
      sc[i + 4] = (qi8 & 0xF) | ((qi >> 6) << 4);
      mn[i + 4] = (qi8 >> 4) | ((qi4 >> 6) << 4);
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nb) break;
      const uint8_t *x = xq + (size_t)b * xs;
      const uint4 *xv = (const uint4 *)(x + 256 * (size_t)k);
      int S1 = 0;
#pragma unroll
      for (int w = 0; w < 8; w++) { /* code bytes 16w .. 16w+15: sub-blocks 2(w/2), 2(w/2)+1 */
        uint32_t lo[4], hi[4];
        uint4 qh = make_uint4(0, 0, 0, 0);
        if constexpr (T == FLOE_TYPE_Q5_K) qh = (w & 1) ? qh1 : qh0; /* qh[q % 32] */
        k4_unpack<T>(q[w], qh, w, lo, hi);
        const uint4 xl = xv[8 * (w >> 2) + (w & 3)], xh = xv[8 * (w >> 2) + 4 + (w & 3)];
        const int sl = dp4(lo[3], xl.w, dp4(lo[2], xl.z, dp4(lo[1], xl.y, dp4(lo[0], xl.x, 0))));
        const int shv = dp4(hi[3], xh.w, dp4(hi[2], xh.z, dp4(hi[1], xh.y, dp4(hi[0], xh.x, 0))));
        S1 += sc[2 * (w >> 1)] * sl + sc[2 * (w >> 1) + 1] * shv;
      }
      const uint4 *bs4 = (const uint4 *)(x + a.off_s + 32 * (size_t)k); /* int16 bsum[16] */
      const uint4 b0 = bs4[0], b1 = bs4[1];
      const uint32_t bw[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      int S2 = 0;
#pragma unroll
      for (int i = 0; i < 8; i++) S2 += mn[i] * ((int)(int16_t)(bw[i] & 0xFFFF) + (int)(int16_t)(bw[i] >> 16));
      const float dx = ((const float *)(x + a.off_d))[k];
      const float dd = d * dx, dm = dmin * dx;
      const float t = (float)S1 * dd - (float)S2 * dm;
      if ((k >> 3) & 1) acc1[b] = acc1[b] + t;
      else acc0[b] = acc0[b] + t;
    }
  }
  /* kred16: a[j] = v[j] + v[j+8] here; b[i] = a[i] + a[i+4]; c[i] = b[i] + b[i+2]; c[0] + c[1] */
#pragma unroll
  for (int b = 0; b < NB; b++) {
    float v = acc0[b] + acc1[b];
    v = v + __shfl_down_sync(MM_FULL, v, 4);
    v = v + __shfl_down_sync(MM_FULL, v, 2);
    y[b] = v + __shfl_down_sync(MM_FULL, v, 1);
  }
}

#define RPB 16 /* rows per block: 4 warps x 4 rows of 8 threads */

template <int T, int NB, int MODE>
__global__ void __launch_bounds__(128) k_k4(KArgs a, KArgs a2, int64_t nb, int K, const int32_t *ids,
                                            const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  PDL_ENTER();
  const int j = threadIdx.x & 7;
  const int64_t r0 = (int64_t)blockIdx.x * RPB + (threadIdx.x >> 3);
  const bool live = r0 < a.rows; /* dead groups still take part in the shuffles */
  const int64_t r = live ? r0 : a.rows - 1;
  if constexpr (MODE == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * NB;
    const int nbt = (int)(nb - b0 < NB ? nb - b0 : NB);
    float y[NB];
    k4_dot<T, NB>(a, mm_row(a, 0, r), xq + (size_t)b0 * xs, xs, nbt, j, y);
    if (live && j == 0)
#pragma unroll
      for (int b = 0; b < NB; b++)
        if (b < nbt) Y[(b0 + b) * ldy + r] = y[b];
  } else {
    const int64_t slot = blockIdx.y;
    const int e = ids ? ids[slot] : 0;
    if (e < 0 || e >= a.n_expert) { /* uniform over the block */
      if (live && j == 0) Y[slot * ldy + r] = __int_as_float(0x7fc00000);
      return;
    }
    const uint8_t *x = xq + (size_t)(MODE == MM_GLU ? slot / K : slot) * xs;
    float g[1];
    k4_dot<T, 1>(a, mm_row(a, e, r), x, xs, 1, j, g);
    if constexpr (MODE == MM_GLU) {
      float up[1];
      k4_dot<T, 1>(a2, mm_row(a2, e, r), x, xs, 1, j, up);
      if (live && j == 0) Y[slot * ldy + r] = floe_siluf(g[0]) * up[0];
    } else {
      if (live && j == 0) Y[slot * ldy + r] = g[0];
    }
  }
}

/* One activation row (decode: MM_PLAIN with nb = 1, and the MoE modes), a warp per weight row.
 * k_k4 gives a row 8 threads and each thread whole superblocks: at decode the GPU then runs ~2
 * warps per scheduler, each a long chain of L1 loads and integer ops (ncu: 17 cycles per issued
 * instruction, 87 % of cycles with no eligible warp). Here a row has 32 threads: superblocks
 * k = s, s+4, ... go to the 8 threads of group s = lane / 8, thread w of a group takes the code
 * bytes 16w..16w+15 (one sub-block pair, as one step of k4_dot's w loop) and the bsum word w.
 * S1 and S2 are exact integer sums, so summing the 8 partials by shuffles gives k4_dot's S1 and S2
 * exactly; every thread of the group then forms the same t with the same float operations, and
 * adds it to slot k % 16 = s + 4 ((k / 4) % 4) in superblock order. The group holds slots s,
 * s+4, s+8, s+12, so kred16's tree is: a[s] = v[s] + v[s+8], a[s+4] = v[s+4] + v[s+12], b[s] =
 * a[s] + a[s+4] in the group, then c[i] = b[i] + b[i+2] and c[0] + c[1] across groups. Every
 * output is k4_dot's bit for bit. */
/* k4w_term's loads (the round's inputs of one thread) and its arithmetic on them, apart so that a
 * warp can have several rounds' loads in flight before the first use (k4w_dot with NR > 1) */
struct K4In {
  uint4 h, q, qh, xl, xh;
  uint32_t bw;
  float dx;
};
template <int T>
__device__ __forceinline__ void k4w_load(const KArgs &a, const uint8_t *__restrict__ row, const uint8_t *__restrict__ x,
                                         int k, int w, K4In &in) {
  constexpr int BB = T == FLOE_TYPE_Q4_K ? 144 : 176;
  constexpr int QS = T == FLOE_TYPE_Q4_K ? 16 : 48;
  const uint4 *blk = (const uint4 *)(row + (size_t)k * BB);
  in.h = blk[0];
  in.q = blk[QS / 16 + w];
  in.qh = make_uint4(0, 0, 0, 0);
  if constexpr (T == FLOE_TYPE_Q5_K) in.qh = blk[1 + (w & 1)]; /* qh[q % 32] */
  const uint4 *xv = (const uint4 *)(x + 256 * (size_t)k);
  in.xl = xv[8 * (w >> 2) + (w & 3)];
  in.xh = xv[8 * (w >> 2) + 4 + (w & 3)];
  in.bw = ((const uint32_t *)(x + a.off_s + 32 * (size_t)k))[w];
  in.dx = ((const float *)(x + a.off_d))[k];
}
template <int T>
__device__ __forceinline__ float k4w_calc(const K4In &in, int w) {
  const uint4 h = in.h, q = in.q, qh = in.qh, xl = in.xl, xh = in.xh;
  const uint32_t bw = in.bw;
  const float dx = in.dx;
  /* get_scale_min_k4: the two scales of this thread's sub-blocks 2 (w / 2), 2 (w / 2) + 1 and min w */
  uint32_t lo[4], hi[4];
  k4_unpack<T>(q, qh, w, lo, hi);
  const int sl = dp4(lo[3], xl.w, dp4(lo[2], xl.z, dp4(lo[1], xl.y, dp4(lo[0], xl.x, 0))));
  const int shv = dp4(hi[3], xh.w, dp4(hi[2], xh.z, dp4(hi[1], xh.y, dp4(hi[0], xh.x, 0))));
  int S1 = k4_scale(h, 2 * (w >> 1)) * sl + k4_scale(h, 2 * (w >> 1) + 1) * shv;
  int S2 = k4_min(h, w) * ((int)(int16_t)(bw & 0xFFFF) + (int)(int16_t)(bw >> 16));
#pragma unroll
  for (int o = 4; o >= 1; o >>= 1) { /* the group's 8 partials: exact integer sums */
    S1 += __shfl_xor_sync(MM_FULL, S1, o);
    S2 += __shfl_xor_sync(MM_FULL, S2, o);
  }
  const float d = mm_f16(h.x & 0xFFFF), dmin = mm_f16(h.x >> 16);
  const float dd = d * dx, dm = dmin * dx;
  return (float)S1 * dd - (float)S2 * dm;
}
template <int T>
__device__ __forceinline__ float k4w_term(const KArgs &a, const uint8_t *__restrict__ row, const uint8_t *__restrict__ x,
                                          int k, int w) {
  K4In in;
  k4w_load<T>(a, row, x, k, w, in);
  return k4w_calc<T>(in, w);
}

/* kred16's tail from a group's four slots (valid in lane 0) */
__device__ __forceinline__ float k4w_red(const float acc[4]) {
  float v = (acc[0] + acc[2]) + (acc[1] + acc[3]); /* b[s] = a[s] + a[s+4] */
  v = v + __shfl_down_sync(MM_FULL, v, 16);        /* c[i] = b[i] + b[i+2] */
  return v + __shfl_down_sync(MM_FULL, v, 8);      /* c[0] + c[1] */
}

/* The dot of row (and, when TWO, of row2 of a2: the GLU's up row, its loads in flight together
 * with the gate's) with x; valid in lane 0. NR > 1: the rounds go in batches of NR, every load of
 * a batch issued before the first round's arithmetic (one memory latency a batch instead of one a
 * round), the rounds then computed and added in the same order: the same bits. */
template <int T, bool TWO, int NR = 1>
__device__ __forceinline__ void k4w_dot(const KArgs &a, const uint8_t *__restrict__ row, const KArgs &a2,
                                        const uint8_t *__restrict__ row2, const uint8_t *__restrict__ x, float *y,
                                        float *y2) {
  const int lane = threadIdx.x & 31, s = lane >> 3, w = lane & 7;
  const int nsb = (int)(a.cols / 256);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* slots s, s+4, s+8, s+12 */
  if constexpr (NR > 1) {
    for (int k00 = 0; k00 < nsb; k00 += 4 * NR) {
      K4In in[NR], in2[TWO ? NR : 1];
#pragma unroll
      for (int b = 0; b < NR; b++) {
        const int k0 = k00 + 4 * b, k = k0 + s;
        if (k0 < nsb) { /* warp-uniform */
          k4w_load<T>(a, row, x, k < nsb ? k : k0, w, in[b]);
          if constexpr (TWO) k4w_load<T>(a2, row2, x, k < nsb ? k : k0, w, in2[TWO ? b : 0]);
        }
      }
#pragma unroll
      for (int b = 0; b < NR; b++) {
        const int k0 = k00 + 4 * b, k = k0 + s, i = (k >> 2) & 3;
        if (k0 < nsb) { /* warp-uniform */
          const bool ok = k < nsb;
          const float t = k4w_calc<T>(in[b], w);
          float t2 = 0.0f;
          if constexpr (TWO) t2 = k4w_calc<T>(in2[TWO ? b : 0], w);
#pragma unroll
          for (int u = 0; u < 4; u++)
            if (ok && u == i) {
              acc[u] = acc[u] + t;
              if constexpr (TWO) acc2[u] = acc2[u] + t2;
            }
        }
      }
    }
  } else {
    /* every lane runs every round (the shuffles of k4w_term need the whole warp); a group past the
     * last superblock reads round k0's (valid, cached) and adds nothing */
    for (int k0 = 0; k0 < nsb; k0 += 4) {
      const int k = k0 + s, i = (k >> 2) & 3;
      const bool ok = k < nsb;
      const float t = k4w_term<T>(a, row, x, ok ? k : k0, w);
      float t2 = 0.0f;
      if constexpr (TWO) t2 = k4w_term<T>(a2, row2, x, ok ? k : k0, w);
#pragma unroll
      for (int u = 0; u < 4; u++) /* static indices: the slots stay in registers */
        if (ok && u == i) {
          acc[u] = acc[u] + t;
          if constexpr (TWO) acc2[u] = acc2[u] + t2;
        }
    }
  }
  *y = k4w_red(acc);
  if constexpr (TWO) *y2 = k4w_red(acc2);
}

/* k4w_dot with 4 lanes a superblock (k_k4w<..., V = true>; cuda_mm_set_k4v): ncu puts k_k4w's
 * decode launches at ~0.6 issued instructions a cycle per scheduler with DRAM at 12-20 %, i.e.
 * bound by instructions (~160 a lane a round: 8 lanes redo each superblock's scale and float
 * work, three shuffle levels, the slot choice by predicates). Here lane p = lane & 3 of group
 * g = lane >> 2 takes k4w's chunks w = 2p and 2p + 1 (code bytes 32p..32p+31: sub-blocks 2p and
 * 2p + 1 whole, their two bsum words); a round covers 8 superblocks, k = k0 + g, its loads all
 * issued before the arithmetic; S1 / S2 summed over the group by two shuffle levels (exact
 * integers); t formed by each lane with k4w_calc's float operations; slot k % 16 is g in even
 * rounds (acc0) and g + 8 in odd ones (acc1), in superblock order. kred16's tree: a[g] = acc0 +
 * acc1, b[g] = a[g] + a[g+4] (16 lanes on), c[g] = b[g] + b[g+2] (8 on), c[0] + c[1] (4 on).
 * Every output is k4w_dot's, and the CPU's, bit for bit. */
struct K4VW { /* one row's weights for a lane */
  uint4 h, q0, q1, qh0, qh1;
};
struct K4VX { /* the activation's share of a lane (one per superblock, shared by TWO's rows) */
  uint4 x0, x1, x2, x3;
  uint2 bs;
  float dx;
};
template <int T>
__device__ __forceinline__ void k4v_load_w(const uint8_t *__restrict__ row, int k, int p, K4VW &in) {
  constexpr int BB = T == FLOE_TYPE_Q4_K ? 144 : 176;
  constexpr int QS = T == FLOE_TYPE_Q4_K ? 16 : 48;
  const uint4 *blk = (const uint4 *)(row + (size_t)k * BB);
  in.h = blk[0];
  in.q0 = blk[QS / 16 + 2 * p];
  in.q1 = blk[QS / 16 + 2 * p + 1];
  in.qh0 = in.qh1 = make_uint4(0, 0, 0, 0);
  if constexpr (T == FLOE_TYPE_Q5_K) { /* qh[q % 32] of chunks 2p (q % 32 < 16) and 2p + 1 */
    in.qh0 = blk[1];
    in.qh1 = blk[2];
  }
}
__device__ __forceinline__ void k4v_load_x(const KArgs &a, const uint8_t *__restrict__ x, int k, int p, K4VX &in) {
  /* k4w's xl / xh of chunks w = 2p, 2p + 1: xv[8 (w / 4) + w % 4] and 4 on */
  const uint4 *xv = (const uint4 *)(x + 256 * (size_t)k) + 8 * (p >> 1) + 2 * (p & 1);
  in.x0 = xv[0];
  in.x1 = xv[4];
  in.x2 = xv[1];
  in.x3 = xv[5];
  in.bs = ((const uint2 *)(x + a.off_s + 32 * (size_t)k))[p]; /* bsum words 2p, 2p + 1 */
  in.dx = ((const float *)(x + a.off_d))[k];
}
template <int T>
__device__ __forceinline__ float k4v_calc(const K4VW &in, const K4VX &xi, int p) {
  uint32_t lo0[4], hi0[4], lo1[4], hi1[4];
  k4_unpack<T>(in.q0, in.qh0, 2 * p, lo0, hi0);
  k4_unpack<T>(in.q1, in.qh1, 2 * p + 1, lo1, hi1);
  int sl = dp4(lo0[3], xi.x0.w, dp4(lo0[2], xi.x0.z, dp4(lo0[1], xi.x0.y, dp4(lo0[0], xi.x0.x, 0))));
  sl = dp4(lo1[3], xi.x2.w, dp4(lo1[2], xi.x2.z, dp4(lo1[1], xi.x2.y, dp4(lo1[0], xi.x2.x, sl))));
  int shv = dp4(hi0[3], xi.x1.w, dp4(hi0[2], xi.x1.z, dp4(hi0[1], xi.x1.y, dp4(hi0[0], xi.x1.x, 0))));
  shv = dp4(hi1[3], xi.x3.w, dp4(hi1[2], xi.x3.z, dp4(hi1[1], xi.x3.y, dp4(hi1[0], xi.x3.x, shv))));
  const uint4 h = in.h;
  /* get_scale_min_k4 of sub-blocks j = 2p, 2p + 1 (k4_scale / k4_min without the selects): byte
   * b = 8 (j % 4) of A & m1, or'ed with bits 6-7 of that byte of h.y (h.z) moved to bits 4-5 where
   * j >= 4; A = h.y (h.z) for j < 4, else h.w (h.w >> 4); m1 = 63 / 15, m2 = 0 / 0x30 */
  const bool up = p >= 2;
  const int b0 = 16 * (p & 1), b1 = b0 + 8;
  const uint32_t m1 = up ? 15u : 63u, m2 = up ? 0x30u : 0u;
  const uint32_t As = up ? h.w : h.y, Am = up ? h.w >> 4 : h.z;
  const int sc0 = (int)(((As >> b0) & m1) | ((h.y >> (b0 + 2)) & m2));
  const int sc1 = (int)(((As >> b1) & m1) | ((h.y >> (b1 + 2)) & m2));
  const int mn0 = (int)(((Am >> b0) & m1) | ((h.z >> (b0 + 2)) & m2));
  const int mn1 = (int)(((Am >> b1) & m1) | ((h.z >> (b1 + 2)) & m2));
  int S1 = sc0 * sl + sc1 * shv;
  int S2 = mn0 * ((int)(int16_t)(xi.bs.x & 0xFFFF) + (int)(int16_t)(xi.bs.x >> 16)) +
           mn1 * ((int)(int16_t)(xi.bs.y & 0xFFFF) + (int)(int16_t)(xi.bs.y >> 16));
#pragma unroll
  for (int o = 2; o >= 1; o >>= 1) { /* the group's 4 partials: exact integer sums */
    S1 += __shfl_xor_sync(MM_FULL, S1, o);
    S2 += __shfl_xor_sync(MM_FULL, S2, o);
  }
  float d, dmin;
  mm_f16x2(h.x, &d, &dmin);
  const float dd = d * xi.dx, dm = dmin * xi.dx;
  return (float)S1 * dd - (float)S2 * dm;
}
/* Superblock k's term of row (t) and, when TWO, of row2 (t2, the same activation loads) by lane p */
template <int T, bool TWO>
__device__ __forceinline__ void k4v_terms(const KArgs &a, const uint8_t *__restrict__ row,
                                          const uint8_t *__restrict__ row2, const uint8_t *__restrict__ x, int k, int p,
                                          float *t, float *t2) {
  K4VW in, in2;
  K4VX xi;
  k4v_load_w<T>(row, k, p, in);
  if constexpr (TWO) k4v_load_w<T>(row2, k, p, in2);
  k4v_load_x(a, x, k, p, xi);
  *t = k4v_calc<T>(in, xi, p);
  if constexpr (TWO) *t2 = k4v_calc<T>(in2, xi, p);
}
/* kred16's tail from a group's two slots (valid in lane 0) */
__device__ __forceinline__ float k4v_red(float acc0, float acc1) {
  float v = acc0 + acc1;                      /* a[g] = slot g + slot g+8 */
  v = v + __shfl_down_sync(MM_FULL, v, 16);   /* b[g] = a[g] + a[g+4] */
  v = v + __shfl_down_sync(MM_FULL, v, 8);    /* c[g] = b[g] + b[g+2] */
  return v + __shfl_down_sync(MM_FULL, v, 4); /* c[0] + c[1] */
}
template <int T, bool TWO>
__device__ __forceinline__ void k4v_dot(const KArgs &a, const uint8_t *__restrict__ row, const KArgs &a2,
                                        const uint8_t *__restrict__ row2, const uint8_t *__restrict__ x, float *y,
                                        float *y2) {
  const int lane = threadIdx.x & 31, g = lane >> 2, p = lane & 3;
  const int nsb = (int)(a.cols / 256);
  float acc0 = 0.0f, acc1 = 0.0f, bcc0 = 0.0f, bcc1 = 0.0f; /* slots g, g + 8 (bcc: row2's) */
  for (int k0 = 0; k0 < nsb; k0 += 16) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) { /* static: the slot is acc0 or acc1 */
      const int kb = k0 + 8 * hf;
      if (kb >= nsb) break; /* warp-uniform */
      const int k = kb + g;
      const bool ok = k < nsb; /* past the last superblock: round kb's (valid, cached), nothing added */
      float t, t2 = 0.0f;
      k4v_terms<T, TWO>(a, row, row2, x, ok ? k : kb, p, &t, &t2);
      if (ok) {
        if (hf == 0) {
          acc0 = acc0 + t;
          if constexpr (TWO) bcc0 = bcc0 + t2;
        } else {
          acc1 = acc1 + t;
          if constexpr (TWO) bcc1 = bcc1 + t2;
        }
      }
    }
  }
  *y = k4v_red(acc0, acc1);
  if constexpr (TWO) *y2 = k4v_red(bcc0, bcc1);
}

/* Weight prefetch into L2 before griddepcontrol.wait (pf, from k4w_pf): a decode step is a chain
 * of small kernels, and with programmatic dependent launch this kernel's blocks are resident while
 * the previous kernel (often one latency-bound block: a norm, the routing) still runs. Weights do
 * not depend on it, so their HBM reads can start then; after the wait the rows come from L2.
 *   PF_ROWS: every row this warp will compute (the matrix fits in L2: PF_ALL_MAX), else its first.
 *   PF_IDS: the MoE modes may read their expert id before the wait; only where the caller knows
 *   the ids were written two or more launches earlier (then that launch has completed: this grid
 *   starts only after every block of the previous one has passed its own wait). Read through L2
 *   (ld.global.cg), which is coherent; L1 may hold an earlier step's ids.
 * Prefetching changes no arithmetic: every output is the same bits either way. */
enum { PF_ROWS = 1, PF_IDS = 2, PF_ALL = 4 };
#define PF_ALL_MAX ((size_t)24 << 20) /* bytes of a matrix prefetched whole (H100/H200 L2: 50 MB) */

/* The expert whose rows a MoE-mode block may prefetch before the wait (MM_PLAIN: 0): false when
 * its id may not be read yet (no PF_IDS) or is out of range. */
template <int MODE>
__device__ __forceinline__ bool pf_expert(const KArgs &a, const int32_t *ids, int64_t slot, int pf, int *e) {
  *e = 0;
  if (MODE == MM_PLAIN || !ids) return true;
  if (!(pf & PF_IDS)) return false;
  *e = __ldcg(ids + slot);
  return *e >= 0 && *e < a.n_expert;
}

/* Rows r0, r0 + step, ... of one weight matrix (expert e) and, for the GLU, of a2's. */
template <int MODE>
__device__ __forceinline__ void k4w_prefetch(const KArgs &a, const KArgs &a2, int e, int64_t r0, int64_t step,
                                             int pf, int lane) {
  for (int64_t r = r0; r < a.rows; r += step) {
    mm_pf_l2(mm_row(a, e, r), a.row_bytes, lane);
    if constexpr (MODE == MM_GLU) mm_pf_l2(mm_row(a2, e, r), a2.row_bytes, lane);
    if (!(pf & PF_ALL)) break;
  }
}

/* Slot slot of a MoE-mode k_k4w (expert e; out of range: NaN rows): the rows r0, r0 + step, ... of
 * this warp, each computed by the warp alone. */
template <int T, int MODE, int NR, bool V>
__device__ __forceinline__ void k4w_slot(const KArgs &a, const KArgs &a2, int K, int e, int64_t slot,
                                         const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t r0,
                                         int64_t step) {
  const bool l0 = (threadIdx.x & 31) == 0;
  if (e < 0 || e >= a.n_expert) {
    if (l0)
      for (int64_t r = r0; r < a.rows; r += step) Y[slot * ldy + r] = __int_as_float(0x7fc00000);
    return;
  }
  const uint8_t *x = xq + (size_t)(MODE == MM_GLU ? slot / K : slot) * xs;
  for (int64_t r = r0; r < a.rows; r += step) {
    float g, up;
    if constexpr (MODE == MM_GLU) {
      if constexpr (V) k4v_dot<T, true>(a, mm_row(a, e, r), a2, mm_row(a2, e, r), x, &g, &up);
      else k4w_dot<T, true, NR>(a, mm_row(a, e, r), a2, mm_row(a2, e, r), x, &g, &up);
      if (l0) Y[slot * ldy + r] = floe_siluf(g) * up;
    } else {
      if constexpr (V) k4v_dot<T, false>(a, mm_row(a, e, r), a, nullptr, x, &g, nullptr);
      else k4w_dot<T, false, NR>(a, mm_row(a, e, r), a, nullptr, x, &g, nullptr);
      if (l0) Y[slot * ldy + r] = g;
    }
  }
}

/* A warp per weight row; the grid may be smaller than one block per 4 rows (k4w_grid: no more
 * blocks than fit at once, so all of them prefetch), the warps then take rows r, r + 4 gridDim.x,
 * ... Each row is computed by one warp exactly as before. */
template <int T, int MODE, int NR = 1, bool V = false>
__global__ void __launch_bounds__(128) k_k4w(KArgs a, KArgs a2, int K, const int32_t *ids, const uint8_t *xq, size_t xs,
                                             float *Y, int64_t ldy, int pf) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5), step = (int64_t)gridDim.x * 4;
  const int64_t slot = MODE == MM_PLAIN ? 0 : blockIdx.y;
  if (pf) {
    int e = 0;
    const bool ok = pf_expert<MODE>(a, ids, slot, pf, &e);
    if (ok) k4w_prefetch<MODE>(a, a2, e, r0, step, pf, lane);
  }
  PDL_ENTER();
  const bool l0 = lane == 0;
  if constexpr (MODE == MM_PLAIN) {
    for (int64_t r = r0; r < a.rows; r += step) { /* warp-uniform */
      float y;
      if constexpr (V) k4v_dot<T, false>(a, mm_row(a, 0, r), a, nullptr, xq, &y, nullptr);
      else k4w_dot<T, false, NR>(a, mm_row(a, 0, r), a, nullptr, xq, &y, nullptr);
      if (l0) Y[r] = y;
    }
  } else {
    k4w_slot<T, MODE, NR, V>(a, a2, K, ids ? ids[slot] : 0, slot, xq, xs, Y, ldy, r0, step);
  }
}

/* The routing of one token and its experts' gate+up+GLU in one launch (the decode step's MoE:
 * cuda_mm_moe_gate_up_route): every block's first warp routes the router's logits as
 * k_moe_route_warp does (moe_route.cuh moe_route_warp, the same bits), the selections into shared
 * memory; block (0, 0) also stores them for the down projection and the combine. Then slot
 * blockIdx.y is k_k4w<T, MM_GLU, 1, true>'s slot: the same operations on the same values. The
 * routing is repeated by every block (a warp's work, ~1 KB of logits from L2) instead of a launch
 * of its own; the experts are not known before the wait, so nothing is prefetched. */
template <int T, int RR>
__global__ void __launch_bounds__(128) k_k4w_rt(KArgs a, KArgs a2, KRoute rt, const uint8_t *xq, float *Y,
                                                int64_t ldy) {
  PDL_ENTER();
  __shared__ int32_t s_sel[33];
  __shared__ float s_w[33];
  const int ks = rt.sh_id >= 0 ? rt.k + 1 : rt.k;
  if (threadIdx.x < 32)
    moe_route_warp<RR>([&](int e) { return rt.logits[e]; }, [&]() { return rt.logits[rt.ne]; }, rt.sh_id >= 0, rt.ne,
                       rt.k, rt.norm_topk, rt.sh_id, s_sel, s_w);
  __syncthreads();
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x < ks) {
    rt.sel[threadIdx.x] = s_sel[threadIdx.x];
    rt.w[threadIdx.x] = s_w[threadIdx.x];
  }
  const int64_t r0 = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5), step = (int64_t)gridDim.x * 4;
  const int64_t slot = blockIdx.y;
  k4w_slot<T, MM_GLU, 1, true>(a, a2, ks, s_sel[slot], slot, xq, 0, Y, ldy, r0, step);
}

/* k_k4w's MM_PLAIN form for matrices with more rows than its warps (the output head: 248320 rows
 * on 5280 warps): a warp takes its rows r, r + step two at a time, the second as the GLU's up row
 * (k4w_dot's / k4v_dot's (V) TWO: both rows' loads in flight together, twice the bytes a warp has
 * outstanding). Each row is still computed by one warp with the same operations in the same
 * order: k_k4w's bits. */
template <int T, bool V = false>
__global__ void __launch_bounds__(128) k_k4w2(KArgs a, const uint8_t *xq, float *Y, int pf) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5), step = (int64_t)gridDim.x * 4;
  if (pf) k4w_prefetch<MM_PLAIN>(a, a, 0, r0, step, pf, lane);
  PDL_ENTER();
  const bool l0 = lane == 0;
  for (int64_t r = r0; r < a.rows; r += 2 * step) { /* warp-uniform */
    const int64_t r2 = r + step;
    float y, y2;
    if (r2 < a.rows) {
      if constexpr (V) k4v_dot<T, true>(a, mm_row(a, 0, r), a, mm_row(a, 0, r2), xq, &y, &y2);
      else k4w_dot<T, true, 1>(a, mm_row(a, 0, r), a, mm_row(a, 0, r2), xq, &y, &y2);
      if (l0) Y[r] = y, Y[r2] = y2;
    } else {
      if constexpr (V) k4v_dot<T, false>(a, mm_row(a, 0, r), a, nullptr, xq, &y, nullptr);
      else k4w_dot<T, false, 1>(a, mm_row(a, 0, r), a, nullptr, xq, &y, nullptr);
      if (l0) Y[r] = y;
    }
  }
}

/* A few activation rows (MM_PLAIN, nb 2..15: a speculative verify, a small batch): k_k4w with NB
 * activation rows a block (gridDim.y blocks of rows). The warp loads a round's weight bytes once
 * (the block header, its 16 code bytes, Q5_K's qh word) and forms each activation row's term with
 * k4w_term's operations in its order: the same exact S1 and S2, the same float ops, the same slot
 * adds and kred16 tail - k_k4w's bits for every row. k_k4 with 4 or 16 rows a block ran the 35B-A3B
 * GatedDeltaNet input matrix at 4 rows in 34 us, k_k4w at one row in 7 us. */
template <int T, int NB, bool P = false>
__global__ void __launch_bounds__(128) k_k4wn(KArgs a, int64_t nb, const uint8_t *xq, size_t xs, MMOut o,
                                              int pf) {
  constexpr int BB = T == FLOE_TYPE_Q4_K ? 144 : 176;
  constexpr int QS = T == FLOE_TYPE_Q4_K ? 16 : 48;
  const int lane = threadIdx.x & 31, s = lane >> 3, w = lane & 7;
  const int64_t r0 = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5), step = (int64_t)gridDim.x * 4;
  const int64_t b0 = (int64_t)blockIdx.y * NB;
  const int nbt = (int)(nb - b0 < NB ? nb - b0 : NB);
  if (pf) k4w_prefetch<MM_PLAIN>(a, a, 0, r0, step, pf, lane);
  PDL_ENTER();
  const uint8_t *__restrict__ x0 = xq + (size_t)b0 * xs;
  const int nsb = (int)(a.cols / 256);
  for (int64_t r = r0; r < a.rows; r += step) { /* warp-uniform */
    const uint8_t *__restrict__ row = mm_row(a, 0, r);
    float acc[NB][4];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;
    /* the weight words of round k0's superblock for this lane (k0's own where the group is past
     * the last one); P: the next round's loaded while this round computes (the same values, the
     * same arithmetic: the same bits) */
    auto words = [&](int k0, uint4 &h, uint4 &q, uint4 &qh) {
      const int k = k0 + s;
      const uint4 *blk = (const uint4 *)(row + (size_t)(k < nsb ? k : k0) * BB);
      h = blk[0];
      q = blk[QS / 16 + w];
      if constexpr (T == FLOE_TYPE_Q5_K) qh = blk[1 + (w & 1)];
    };
    uint4 hn = make_uint4(0, 0, 0, 0), qn = hn, qhn = hn;
    if constexpr (P) words(0, hn, qn, qhn);
    for (int k0 = 0; k0 < nsb; k0 += 4) { /* every lane runs every round, as k4w_dot */
      const int k = k0 + s, i = (k >> 2) & 3;
      const bool ok = k < nsb;
      const int kk = ok ? k : k0;
      uint4 h, q, qh = make_uint4(0, 0, 0, 0);
      if constexpr (P) {
        h = hn, q = qn, qh = qhn;
        if (k0 + 4 < nsb) words(k0 + 4, hn, qn, qhn); /* warp-uniform */
      } else {
        words(k0, h, q, qh);
      }
      uint32_t lo[4], hi[4];
      k4_unpack<T>(q, qh, w, lo, hi);
      const int sc0 = k4_scale(h, 2 * (w >> 1)), sc1 = k4_scale(h, 2 * (w >> 1) + 1), mn = k4_min(h, w);
      const float d = mm_f16(h.x & 0xFFFF), dmin = mm_f16(h.x >> 16);
#pragma unroll
      for (int b = 0; b < NB; b++) {
        if (b >= nbt) break; /* block-uniform */
        const uint8_t *__restrict__ x = x0 + (size_t)b * xs;
        const uint4 *xv = (const uint4 *)(x + 256 * (size_t)kk);
        const uint4 xl = xv[8 * (w >> 2) + (w & 3)], xh = xv[8 * (w >> 2) + 4 + (w & 3)];
        const uint32_t bw = ((const uint32_t *)(x + a.off_s + 32 * (size_t)kk))[w];
        const float dx = ((const float *)(x + a.off_d))[kk];
        const int sl = dp4(lo[3], xl.w, dp4(lo[2], xl.z, dp4(lo[1], xl.y, dp4(lo[0], xl.x, 0))));
        const int shv = dp4(hi[3], xh.w, dp4(hi[2], xh.z, dp4(hi[1], xh.y, dp4(hi[0], xh.x, 0))));
        int S1 = sc0 * sl + sc1 * shv;
        int S2 = mn * ((int)(int16_t)(bw & 0xFFFF) + (int)(int16_t)(bw >> 16));
#pragma unroll
        for (int o = 4; o >= 1; o >>= 1) {
          S1 += __shfl_xor_sync(MM_FULL, S1, o);
          S2 += __shfl_xor_sync(MM_FULL, S2, o);
        }
        const float dd = d * dx, dm = dmin * dx;
        const float t = (float)S1 * dd - (float)S2 * dm;
#pragma unroll
        for (int u = 0; u < 4; u++)
          if (ok && u == i) acc[b][u] = acc[b][u] + t;
      }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nbt) break;
      const float y = k4w_red(acc[b]);
      if (lane == 0) *mm_out(o, b0 + b, r) = y;
    }
  }
}

/* k_k4wn with 4 lanes a superblock (cuda_mm_set_k4v level 3): a warp loads a round's weights once
 * (k4v_load_w: 8 superblocks, a lane's two chunks) and forms each activation row's term with
 * k4v_calc, the same slots and k4v_red tail as k4v_dot: k_k4w's 4-lane bits for every row, which
 * are the CPU's. */
template <int T, int NB>
__global__ void __launch_bounds__(128) k_k4vn(KArgs a, int64_t nb, const uint8_t *xq, size_t xs, MMOut o, int pf) {
  const int lane = threadIdx.x & 31, g = lane >> 2, p = lane & 3;
  const int64_t r0 = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5), step = (int64_t)gridDim.x * 4;
  const int64_t b0 = (int64_t)blockIdx.y * NB;
  const int nbt = (int)(nb - b0 < NB ? nb - b0 : NB);
  if (pf) k4w_prefetch<MM_PLAIN>(a, a, 0, r0, step, pf, lane);
  PDL_ENTER();
  const uint8_t *__restrict__ x0 = xq + (size_t)b0 * xs;
  const int nsb = (int)(a.cols / 256);
  for (int64_t r = r0; r < a.rows; r += step) { /* warp-uniform */
    const uint8_t *__restrict__ row = mm_row(a, 0, r);
    float acc[NB][2];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b][0] = acc[b][1] = 0.0f;
    for (int k0 = 0; k0 < nsb; k0 += 16) {
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int kb = k0 + 8 * hf;
        if (kb >= nsb) break; /* warp-uniform */
        const int k = kb + g;
        const bool ok = k < nsb;
        K4VW in;
        k4v_load_w<T>(row, ok ? k : kb, p, in);
#pragma unroll
        for (int b = 0; b < NB; b++) {
          if (b >= nbt) break; /* block-uniform */
          K4VX xi;
          k4v_load_x(a, x0 + (size_t)b * xs, ok ? k : kb, p, xi);
          const float t = k4v_calc<T>(in, xi, p);
          if (ok) acc[b][hf] = acc[b][hf] + t;
        }
      }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nbt) break;
      const float y = k4v_red(acc[b][0], acc[b][1]);
      if (lane == 0) *mm_out(o, b0 + b, r) = y;
    }
  }
}

/* A short row's output from its lane's term t (k_k4s's layout: G groups of GL lanes a row, group s
 * < nsb holding superblock s, ok = s < nsb): k_k4w's kred16 with the groups past the last
 * superblock at zeros, the same adds of the same values; valid in the row's first lane. Called by
 * the whole warp. */
template <int G, int GL>
__device__ __forceinline__ float k4s_fold(bool ok, float t) {
  const float acc0 = ok ? 0.0f + t : 0.0f;
  const float b = (acc0 + 0.0f) + (0.0f + 0.0f);
  const float c = b + 0.0f;
  const float c1 = G == 2 ? __shfl_down_sync(MM_FULL, c, GL) : 0.0f + 0.0f;
  return c + c1;
}

/* Short rows (one or two superblocks: the MoE down projection of the 35B-A3B and 80B-A3B shapes,
 * 512 columns): k_k4w would leave the groups past the last superblock idle, half or three quarters
 * of the warp, and need twice or four times the warps. Here a warp takes R = 4 / G rows with G
 * groups of 8 threads each (G = 1 or 2 >= nsb): group s of a row computes superblock k = s (one
 * round) with k4w_term, the same operations. kred16 then runs as in k_k4w, where the groups that
 * had no superblock held zeros: the group's b = ((0 + t) + 0) + (0 + 0), c[s] = b + b[s + 2] with
 * b[s + 2] = +0, and the row's c[0] + c[1] (c[1] = +0 when G = 1) - the same adds of the same
 * values, so every output is k_k4w's bit for bit.
 * QX (MM_DOWN only): the block quantizes its slot's activation row itself, H + slot * ldh (the
 * gate/up kernel's SiLU-GLU output), into shared memory with k_act's code (act_row_warp, the same
 * bytes as the k_act launch it replaces), and xq / xs are unused: one launch fewer a MoE block. */
#define K4S_QX_BYTES 1024 /* a quantized row of up to two superblocks (kern_act_bytes: ~600) */
/* V: groups of 4 lanes (k4v_dot's superblock layout and k4v_calc's operations), so R = 8 / G rows
 * a warp; the group past the last superblock and the tree as above, c[1] from 4 lanes on. */
template <int T, int MODE, int G, bool QX = false, bool V = false>
__global__ void __launch_bounds__(128) k_k4s(KArgs a, KArgs a2, int K, const int32_t *ids, const uint8_t *xq, size_t xs,
                                             float *Y, int64_t ldy, int pf, const float *H, int64_t ldh) {
  static_assert(!QX || MODE == MM_DOWN, "QX: the down projection only");
  constexpr int GL = V ? 4 : 8; /* lanes a superblock */
  constexpr int R = 32 / GL / G; /* rows a warp */
  const int lane = threadIdx.x & 31, gi = lane / GL, w = lane % GL, ri = gi / G, s = gi % G;
  const int64_t wr0 = ((int64_t)blockIdx.x * 4 + (threadIdx.x >> 5)) * R, step = (int64_t)gridDim.x * 4 * R;
  const int64_t slot = MODE == MM_PLAIN ? 0 : blockIdx.y;
  if (pf) { /* as k_k4w: the warp's first rows (all of them when PF_ALL) */
    int e = 0;
    const bool ok = pf_expert<MODE>(a, ids, slot, pf, &e);
    if (ok)
      for (int64_t r = wr0; r < a.rows; r += step) {
        const int64_t n = a.rows - r < R ? a.rows - r : R; /* R consecutive rows */
        mm_pf_l2(mm_row(a, e, r), (size_t)n * a.row_bytes, lane);
        if constexpr (MODE == MM_GLU) mm_pf_l2(mm_row(a2, e, r), (size_t)n * a2.row_bytes, lane);
        if (!(pf & PF_ALL)) break;
      }
  }
  PDL_ENTER();
  int e = 0;
  if constexpr (MODE != MM_PLAIN) {
    e = ids ? ids[slot] : 0;
    if (e < 0 || e >= a.n_expert) {
      for (int64_t r0 = wr0; r0 < a.rows; r0 += step) {
        const int64_t r = r0 + ri;
        if (s == 0 && w == 0 && r < a.rows) Y[slot * ldy + r] = __int_as_float(0x7fc00000);
      }
      return;
    }
  }
  const uint8_t *x = MODE == MM_PLAIN ? xq : xq + (size_t)(MODE == MM_GLU ? slot / K : slot) * xs;
  if constexpr (QX) {
    __shared__ __align__(16) uint8_t sx[K4S_QX_BYTES];
    act_row_warp(a, KACT_A256, H + slot * ldh, sx); /* warps 0 and 1: a 256-value chunk each */
    __syncthreads();
    x = sx;
  }
  const int nsb = (int)(a.cols / 256);
  const bool ok = s < nsb;
  for (int64_t r0 = wr0; r0 < a.rows; r0 += step) { /* warp-uniform */
    const int64_t r = r0 + ri, rc = r < a.rows ? r : a.rows - 1; /* past the end: computed, not written */
    float t, t2 = 0.0f;
    if constexpr (V) {
      k4v_terms<T, MODE == MM_GLU>(a, mm_row(a, e, rc), MODE == MM_GLU ? mm_row(a2, e, rc) : nullptr, x, ok ? s : 0, w,
                                   &t, &t2);
    } else {
      t = k4w_term<T>(a, mm_row(a, e, rc), x, ok ? s : 0, w);
      if constexpr (MODE == MM_GLU) t2 = k4w_term<T>(a2, mm_row(a2, e, rc), x, ok ? s : 0, w);
    }
    const float y = k4s_fold<G, GL>(ok, t), y2 = MODE == MM_GLU ? k4s_fold<G, GL>(ok, t2) : 0.0f;
    if (s == 0 && w == 0 && r < a.rows) {
      if constexpr (MODE == MM_GLU) Y[slot * ldy + r] = floe_siluf(y) * y2;
      else if constexpr (MODE == MM_DOWN) Y[slot * ldy + r] = y;
      else Y[r] = y;
    }
  }
}

/* k_k4w is the default for one activation row (H200: decode 252 -> 293 tok/s on the 35B-A3B
 * shape); FLOE_CUDA_K4W=0 (or cuda_mm_set_k4w(0)) selects k_k4, the same bits. */
static int g_k4w = -1;

static int k4w_on(void) {
  if (g_k4w < 0) {
    const char *e = getenv("FLOE_CUDA_K4W");
    g_k4w = !(e && e[0] == '0');
  }
  return g_k4w;
}

} // namespace

void cuda_mm_set_k4w(int on) { g_k4w = on ? 1 : 0; }

/* k_k4w's rounds in batches of NR with their loads issued together (cuda_mm_set_k4w_pipe; 1: one
 * round at a time, the default until measured; FLOE_CUDA_K4W_PIPE=2 / 4 at the first launch) */
static int g_k4w_pipe = -1;

void cuda_mm_set_k4w_pipe(int nr) { g_k4w_pipe = nr >= 4 ? 4 : nr >= 2 ? 2 : 1; }

static int k4w_pipe(void) {
  if (g_k4w_pipe < 0) {
    const char *e = getenv("FLOE_CUDA_K4W_PIPE");
    cuda_mm_set_k4w_pipe(e && e[0] ? atoi(e) : 1);
  }
  return g_k4w_pipe;
}

/* 4 lanes a superblock (k4v_dot): level 1 (35B decode +4.5 % on the H200) in k_k4w, level 2 in
 * k_k4s too (short rows: the MoE down; the default, +2.1 % more), level 3 in the few-row k_k4wn
 * too (k_k4vn: a verify's rows; opt-in until measured); 0: 8 lanes everywhere.
 * cuda_mm_set_k4v; FLOE_CUDA_K4V=0 / 1 / 2 at the first launch. */
static int g_k4v = -1;

void cuda_mm_set_k4v(int level) { g_k4v = level <= 0 ? 0 : level >= 3 ? 3 : level; }

static int k4v_on(void) {
  if (g_k4v < 0) cuda_mm_set_k4v(mm_env_int("FLOE_CUDA_K4V", 2));
  return g_k4v;
}

/* k_k4w2 for one-row MM_PLAIN calls whose warps each have two rows or more (cuda_mm_set_k4w_pair;
 * FLOE_CUDA_K4W_PAIR=0 at the first launch turns it off): 1-2 % slower on the H200 with the 8-lane
 * dot, +2-4 % with the 4-lane one (which it takes where cuda_mm_set_k4v says): the default */
static int g_k4w_pair = -1;

void cuda_mm_set_k4w_pair(int on) { g_k4w_pair = on ? 1 : 0; }

static int k4w_pair(void) {
  if (g_k4w_pair < 0) cuda_mm_set_k4w_pair(mm_env_int("FLOE_CUDA_K4W_PAIR", 1) == 1);
  return g_k4w_pair;
}

/* k_k4s for rows of one or two superblocks (the default with k_k4w; FLOE_CUDA_K4S=0 or
 * cuda_mm_set_k4s(0): k_k4w, the same bits) */
static int g_k4s = -1;

void cuda_mm_set_k4s(int on) { g_k4s = on ? 1 : 0; }

static int k4s_on(void) {
  if (g_k4s < 0) cuda_mm_set_k4s(mm_env_int("FLOE_CUDA_K4S", 1) != 0);
  return g_k4s;
}

/* k_k4w's prefetch (the default; FLOE_CUDA_PF=0 or cuda_mm_set_pf(0, 0) turns it off, the same
 * bits) and the test hook that caps its grid so the row loop runs more than once. */
static int g_pf = -1, g_pf_cap = 0;

void cuda_mm_set_pf(int on, int max_blocks) {
  g_pf = on ? 1 : 0;
  g_pf_cap = max_blocks;
}

int mm_pf_on(void) {
  if (g_pf < 0) {
    const char *e = getenv("FLOE_CUDA_PF");
    g_pf = !(e && e[0] == '0');
  }
  return g_pf;
}

/* the few-row kernels (k_k4wn here, k_plainn in mm_float.cu): on unless FLOE_CUDA_FEW=0 */
static int g_few = -1;

void cuda_mm_set_few(int on) { g_few = on ? 1 : 0; }

int mm_few_on(void) {
  if (g_few < 0) {
    const char *e = getenv("FLOE_CUDA_FEW");
    g_few = !(e && e[0] == '0');
  }
  return g_few;
}

unsigned mm_grid_capped(int64_t g4, unsigned gy, int cap) {
  int64_t lim = g_pf_cap > 0 ? g_pf_cap : cap;
  if (!mm_pf_on() || lim <= 0) return (unsigned)g4;
  lim = lim / (int64_t)gy;
  if (lim < 1) lim = 1;
  return (unsigned)(g4 < lim ? g4 : lim);
}

namespace {

/* The grids below (mm_grid_of): k_k4w's x blocks for g4 needed (a block per 4 rows) and gy slots:
 * without prefetch, g4; with it, at most what is resident at once over all slots (so every block
 * prefetches before the wait); the same for k_k4w_rt, k_k4w2, k_k4wn, k_k4vn and k_k4s. */

/* the pf argument: rows always; the whole matrix when it fits in L2; the expert ids of MM_DOWN
 * (cuda_mm_moe_down launches its quantized k_k4w right after the activation quantization, which
 * is launched after the ids were written, so their writer is two or more launches back) */
int k4w_pf(const KArgs &a, int mode, unsigned gy) {
  if (!mm_pf_on()) return 0;
  const size_t bytes = (size_t)a.rows * a.row_bytes * (mode == MM_GLU ? 2 : 1) * gy;
  return PF_ROWS | (bytes <= PF_ALL_MAX ? PF_ALL : 0) | (mode == MM_DOWN ? PF_IDS : 0);
}

} // namespace

namespace {

/* k_k4wn for 2..15 rows (with k_k4w and the few-row kernels on) */
template <int T>
bool few_t(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st) {
  if (!k4w_on() || !mm_few_on() || nb < 2 || nb > 15) return false;
  if (mm_mma_few_launch(a, nb, xq, xs, o, st)) return true; /* k_k4mn (mm_mma.cuh), the default */
  const int64_t g4 = (a.rows + 3) / 4;
#define K4WN_LAUNCH(NB)                                                                                          \
  do {                                                                                                           \
    const unsigned gy = (unsigned)((nb + (NB)-1) / (NB));                                                        \
    if (k4v_on() >= 3 && k4w_pipe() == 1)                                                                        \
      pdl_launch(k_k4vn<T, NB>, dim3(mm_grid_of<k_k4vn<T, NB>>(g4, gy), gy), dim3(128), (size_t)0, st, a, nb, xq, xs, o,   \
                 k4w_pf(a, MM_PLAIN, gy));                                                                       \
    else if (k4w_pipe() > 1)                                                                                     \
      pdl_launch(k_k4wn<T, NB, true>, dim3(mm_grid_of<k_k4wn<T, NB, true>>(g4, gy), gy), dim3(128), (size_t)0, st, a, nb, \
                 xq, xs, o, k4w_pf(a, MM_PLAIN, gy));                                                            \
    else                                                                                                         \
      pdl_launch(k_k4wn<T, NB>, dim3(mm_grid_of<k_k4wn<T, NB>>(g4, gy), gy), dim3(128), (size_t)0, st, a, nb, xq, xs, o,  \
                 k4w_pf(a, MM_PLAIN, gy));                                                                       \
  } while (0)
  if (nb <= 2) K4WN_LAUNCH(2);
  else if (nb <= 4) K4WN_LAUNCH(4);
  else K4WN_LAUNCH(8);
#undef K4WN_LAUNCH
  return true;
}

template <int T>
void launch_t(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids, const uint8_t *xq,
              size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  const int nsb = (int)(a.cols / 256);
  if (mode == MM_PLAIN && nb == 1 && k4w_on() && mm_mma_few_launch(a, 1, xq, xs, mm_out_all(Y, ldy, a.rows), st))
    return; /* k_k4mn for one row: opt-in (FLOE_CUDA_ONE_MMA=1) */
  if (k4w_on() && k4s_on() && nsb <= 2 && (mode != MM_PLAIN || nb == 1)) { /* short rows: R rows a warp */
    const bool v = k4v_on() >= 2;
    const int R = (v ? 8 : 4) / (nsb == 1 ? 1 : 2);
    const int64_t g4 = (a.rows + 4 * R - 1) / (4 * R);
    const unsigned gy = (unsigned)(mode == MM_PLAIN ? 1 : nb);
    const int pf = k4w_pf(a, mode, gy);
#define K4S_LAUNCH(M, G, V)                                                                                        \
  pdl_launch(k_k4s<T, M, G, false, V>, dim3(mm_grid_of<k_k4s<T, M, G, false, V>>(g4, gy), gy), dim3(128), (size_t)0, st, a, \
             a2, K, ids, xq, xs, Y, ldy, pf, (const float *)nullptr, (int64_t)0)
#define K4S_NSB(M, V)                 \
  do {                                \
    if (nsb == 1) K4S_LAUNCH(M, 1, V); \
    else K4S_LAUNCH(M, 2, V);          \
  } while (0)
#define K4S_MODES(V)                                 \
  do {                                               \
    if (mode == MM_GLU) K4S_NSB(MM_GLU, V);          \
    else if (mode == MM_DOWN) K4S_NSB(MM_DOWN, V);   \
    else K4S_NSB(MM_PLAIN, V);                       \
  } while (0)
    if (v) K4S_MODES(true);
    else K4S_MODES(false);
#undef K4S_MODES
#undef K4S_NSB
#undef K4S_LAUNCH
    return;
  }
  if (mode == MM_PLAIN && nb >= 2) {
    const MMOut o = mm_out_all(Y, ldy, a.rows);
    if (few_t<T>(a, nb, xq, xs, o, st)) return;
  }
  if (k4w_on() && (mode != MM_PLAIN || nb == 1)) { /* one activation row: a warp per weight row */
    const int64_t g4 = (a.rows + 3) / 4;
    const unsigned gy = (unsigned)(mode == MM_PLAIN ? 1 : nb);
    const int pf = k4w_pf(a, mode, gy);
    if (mode == MM_PLAIN && k4w_pair() && k4w_pipe() == 1) {
      const bool v = k4v_on() >= 1;
      const unsigned gx = v ? mm_grid_of<k_k4w2<T, true>>(g4, 1) : mm_grid_of<k_k4w2<T, false>>(g4, 1);
      if (gx < g4) { /* a warp has two rows or more */
        if (v) pdl_launch(k_k4w2<T, true>, dim3(gx), dim3(128), (size_t)0, st, a, xq, Y, pf);
        else pdl_launch(k_k4w2<T, false>, dim3(gx), dim3(128), (size_t)0, st, a, xq, Y, pf);
        return;
      }
    }
#define K4W_LAUNCH(M, NR, V)                                                                                     \
  pdl_launch(k_k4w<T, M, NR, V>, dim3(mm_grid_of<k_k4w<T, M, NR, V>>(g4, gy), gy), dim3(128), (size_t)0, st, a, a2, K, ids, xq, \
             xs, Y, ldy, pf)
#define K4W_MODES(NR, V)                                                                                         \
  do {                                                                                                           \
    if (mode == MM_GLU) K4W_LAUNCH(MM_GLU, NR, V);                                                               \
    else if (mode == MM_DOWN) K4W_LAUNCH(MM_DOWN, NR, V);                                                        \
    else K4W_LAUNCH(MM_PLAIN, NR, V);                                                                            \
  } while (0)
    const int nr = k4w_pipe();
    if (nr >= 4) K4W_MODES(4, false);
    else if (nr >= 2) K4W_MODES(2, false);
    else if (k4v_on()) K4W_MODES(1, true);
    else K4W_MODES(1, false);
#undef K4W_MODES
#undef K4W_LAUNCH
    return;
  }
  const unsigned gx = (unsigned)((a.rows + RPB - 1) / RPB);
  if (mode == MM_GLU) {
    pdl_launch(k_k4<T, 1, MM_GLU>, dim3(dim3(gx, (unsigned)nb)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (mode == MM_DOWN) {
    pdl_launch(k_k4<T, 1, MM_DOWN>, dim3(dim3(gx, (unsigned)nb)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (nb == 1) {
    pdl_launch(k_k4<T, 1, MM_PLAIN>, dim3(dim3(gx, 1)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (nb <= 4) {
    pdl_launch(k_k4<T, 4, MM_PLAIN>, dim3(dim3(gx, 1)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else {
    pdl_launch(k_k4<T, 16, MM_PLAIN>, dim3(dim3(gx, (unsigned)((nb + 15) / 16))), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  }
}

/* The MoE down projection of ns slots with its input quantization in the same launch (k_k4s<QX>):
 * false where k_k4s would not take it (k_k4w / k_k4s off, rows of more than two superblocks, the
 * quantizer's first form FLOE_CUDA_ACT2=0, FLOE_CUDA_DOWN_QX not 1), and the caller launches k_act and
 * the plain down kernel. */
static int g_down_qx = -1;
template <int T>
bool down_qx_t(const KArgs &a, int64_t ns, const int32_t *ids, const float *H, int64_t ldh, size_t xs, float *Y,
               int64_t ldy, cudaStream_t st) {
  if (g_down_qx < 0) {
    const char *e = getenv("FLOE_CUDA_DOWN_QX"); /* opt-in: no faster on the H200 (bench/results.tsv) */
    g_down_qx = e && e[0] == '1';
  }
  const int nsb = (int)(a.cols / 256);
  if (!g_down_qx || !k4w_on() || !k4s_on() || !mm_act2_on() || nsb < 1 || nsb > 2 || a.cols % 256 ||
      xs > K4S_QX_BYTES || ns > 65535)
    return false;
  const int R = nsb == 1 ? 4 : 2;
  const int64_t g4 = (a.rows + 4 * R - 1) / (4 * R);
  const unsigned gy = (unsigned)ns;
  const int pf = k4w_pf(a, MM_DOWN, gy);
  if (nsb == 1)
    pdl_launch(k_k4s<T, MM_DOWN, 1, true>, dim3(mm_grid_of<k_k4s<T, MM_DOWN, 1, true>>(g4, gy), gy), dim3(128), (size_t)0, st,
               a, a, 1, ids, (const uint8_t *)nullptr, (size_t)0, Y, ldy, pf, H, ldh);
  else
    pdl_launch(k_k4s<T, MM_DOWN, 2, true>, dim3(mm_grid_of<k_k4s<T, MM_DOWN, 2, true>>(g4, gy), gy), dim3(128), (size_t)0, st,
               a, a, 1, ids, (const uint8_t *)nullptr, (size_t)0, Y, ldy, pf, H, ldh);
  return true;
}

} // namespace

void cuda_mm_set_down_qx(int on) { g_down_qx = on ? 1 : 0; }

bool mm_k4_down_qx_launch(const KArgs &a, int64_t ns, const int32_t *ids, const float *H, int64_t ldh, size_t xs,
                          float *Y, int64_t ldy, cudaStream_t st) {
  switch (a.type) {
    case FLOE_TYPE_Q4_K: return down_qx_t<FLOE_TYPE_Q4_K>(a, ns, ids, H, ldh, xs, Y, ldy, st);
    case FLOE_TYPE_Q5_K: return down_qx_t<FLOE_TYPE_Q5_K>(a, ns, ids, H, ldh, xs, Y, ldy, st);
    default: return false;
  }
}

namespace {
template <int T>
void glu_route_t(const KArgs &a, const KArgs &a2, const KRoute &rt, const uint8_t *xq, float *Y, int64_t ldy,
                 cudaStream_t st) {
  const int64_t g4 = (a.rows + 3) / 4;
  const unsigned gy = (unsigned)(rt.sh_id >= 0 ? rt.k + 1 : rt.k);
#define RTG_LAUNCH(R) \
  pdl_launch(k_k4w_rt<T, R>, dim3(mm_grid_of<k_k4w_rt<T, R>>(g4, gy), gy), dim3(128), (size_t)0, st, a, a2, rt, xq, Y, ldy)
  if (rt.ne <= 256) RTG_LAUNCH(8);
  else if (rt.ne <= 512) RTG_LAUNCH(16);
  else RTG_LAUNCH(32);
#undef RTG_LAUNCH
}
} // namespace

/* the routing in the gate+up launch (FLOE_CUDA_ROUTE_GLU=0: two launches) */
static int g_route_glu = -1;
void cuda_mm_set_route_glu(int on) { g_route_glu = on ? 1 : 0; }

bool mm_k4_glu_route_launch(const KArgs &a, const KArgs &a2, const KRoute &rt, const uint8_t *xq, float *Y,
                            int64_t ldy, cudaStream_t st) {
  if (g_route_glu < 0) g_route_glu = mm_env_int("FLOE_CUDA_ROUTE_GLU", 1) != 0;
  /* only where the plain path would run k_k4w<T, MM_GLU, 1, true> (the same bits) */
  const int nsb = (int)(a.cols / 256);
  if (!g_route_glu || !k4w_on() || (k4s_on() && nsb <= 2) || k4w_pipe() != 1 || k4v_on() < 1 ||
      (a.type != FLOE_TYPE_Q4_K && a.type != FLOE_TYPE_Q5_K) || a2.type != a.type || rt.ne < 1 ||
      rt.ne > 32 * ROUTE_RMAX || rt.k < 1 || rt.k > 32 || rt.k > rt.ne)
    return false;
  if (a.type == FLOE_TYPE_Q4_K) glu_route_t<FLOE_TYPE_Q4_K>(a, a2, rt, xq, Y, ldy, st);
  else glu_route_t<FLOE_TYPE_Q5_K>(a, a2, rt, xq, Y, ldy, st);
  return true;
}

bool mm_k4_few_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st) {
  switch (a.type) {
    case FLOE_TYPE_Q4_K: return few_t<FLOE_TYPE_Q4_K>(a, nb, xq, xs, o, st);
    case FLOE_TYPE_Q5_K: return few_t<FLOE_TYPE_Q5_K>(a, nb, xq, xs, o, st);
    default: return false;
  }
}

bool mm_k4_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                  const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  switch (a.type) {
    case FLOE_TYPE_Q4_K: launch_t<FLOE_TYPE_Q4_K>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_Q5_K: launch_t<FLOE_TYPE_Q5_K>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    default: return false;
  }
}
