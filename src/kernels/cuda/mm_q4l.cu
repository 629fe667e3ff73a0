/* Quantized-activation matmuls of the "16-lane model" types (kernels_internal.h): Q8_0, Q4_0,
 * IQ4_NL, MXFP4 (A32 activations), Q6_K, IQ4_XS (A256), MLX 4-bit and 8-bit (MLX activations),
 * with 4 lanes per thread.
 *
 * The CPU's order, per output (weight row r, activation row b): 16 lane accumulators; per step s
 * each lane adds P = (float)L * S (L the exact integer lane sum, S = weight scale * activation
 * scale); then the fixed reduce16 (plus the Q6_K min lanes, the MLX bias lanes). Here 4 threads
 * compute one weight row (a warp: 8 rows): thread j owns lanes 4j .. 4j+3 (and Q6_K min lanes
 * 2j, 2j+1) for every step, in step order, so each lane's sequence of adds is the CPU's in one
 * thread. A thread's 4 lanes of a step are 16 consecutive code bytes of one block (A32: half a
 * block; Q6_K: 4 runs of 16 values with one 6-bit scale each; IQ4_XS: 16 bytes of two sub-blocks;
 * MLX: 32 or 16 values of one group), so one scale S serves the 4 lanes. The end is kred16's
 * tree: a[i] = v[i] + v[i+8] (threads j and j+2), b[i] = a[i] + a[i+4] (threads 0 and 1), then
 * c and the last add inside thread 0. U steps are loaded before any is added, to keep loads in
 * flight. The weights are decoded once per step for all the activation rows of the tile. */
#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace {

enum { T_MLX4 = 1004, T_MLX8 = 1008 };

template <int T> __host__ __device__ constexpr bool is_a32() {
  return T == FLOE_TYPE_Q8_0 || T == FLOE_TYPE_Q4_0 || T == FLOE_TYPE_IQ4_NL || T == FLOE_TYPE_MXFP4;
}

template <int T> __device__ __forceinline__ int l4_nsteps(const KArgs &a) {
  if (is_a32<T>()) return (int)((a.nblk + 1) / 2);
  if (T == T_MLX4) return (int)((a.cols + 127) / 128);
  if (T == T_MLX8) return (int)((a.cols + 63) / 64);
  return (int)(a.cols / 256);
}

/* 16 bytes at a 2-byte aligned address, as 4 words */
__device__ __forceinline__ void ld16_a2(const uint8_t *p, uint32_t w[4]) {
  const uint16_t *h = (const uint16_t *)p;
#pragma unroll
  for (int i = 0; i < 4; i++) w[i] = (uint32_t)h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
}

/* Thread j's 4 lane products of step s for activation rows b < nb: P[b][c] (lane 4j + c), and
 * the Q6_K min lanes M[b][c] (lane 2j + c). Returns false when the step covers none of the
 * thread's lanes (they are left untouched). */
template <int T, int NB>
__device__ __forceinline__ bool l4_step(const KArgs &a, const uint8_t *row, const uint8_t *scr, const uint8_t *xq,
                                        size_t xs, int nb, int s, int j, float P[NB][4], float M[NB][2]) {
  if constexpr (is_a32<T>()) {
    const int blk = 2 * s + (j >> 1), half = j & 1;
    if (blk >= a.nblk) return false;
    uint32_t w[4];
    float dw;
    if constexpr (T == FLOE_TYPE_Q8_0) {
      const uint8_t *b = row + (size_t)blk * 34;
      ld16_a2(b + 2 + 16 * half, w);
      dw = mm_f16(ld_u16(b));
    } else if constexpr (T == FLOE_TYPE_MXFP4) {
      const uint8_t *b = row + (size_t)blk * 17;
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const uint32_t q = ld_u32_a1(b + 1 + 4 * c);
        w[c] = lut16(half ? (q >> 4) & 0x0F0F0F0Fu : q & 0x0F0F0F0Fu, a.kv);
      }
      dw = mm_e8m0_half(b[0]);
    } else {
      const uint8_t *b = row + (size_t)blk * 18;
      uint32_t q[4];
      ld16_a2(b + 2, q);
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const uint32_t nib = half ? (q[c] >> 4) & 0x0F0F0F0Fu : q[c] & 0x0F0F0F0Fu;
        w[c] = T == FLOE_TYPE_Q4_0 ? __vsub4(nib, 0x08080808u) : lut16(nib, a.kv);
      }
      dw = mm_f16(ld_u16(b));
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nb) break;
      const uint8_t *x = xq + (size_t)b * xs;
      const uint4 xv = *(const uint4 *)(x + 32 * (size_t)blk + 16 * half);
      const float S = dw * ((const float *)(x + a.off_d))[blk];
      P[b][0] = (float)dp4(w[0], xv.x, 0) * S;
      P[b][1] = (float)dp4(w[1], xv.y, 0) * S;
      P[b][2] = (float)dp4(w[2], xv.z, 0) * S;
      P[b][3] = (float)dp4(w[3], xv.w, 0) * S;
    }
    return true;
  } else if constexpr (T == FLOE_TYPE_Q6_K) {
    /* lane 4j + t: for p = 0, 1 the 8 values 64a + 16j + 8 (t & 1) .. with a = 2p + (t >> 1),
     * times sc[4a + j]. Values 64a + 16j .. + 15 (h = a / 2): ql bytes 64h + 32 ((j / 2) & 1) +
     * 16 (j % 2) .., nibble a % 2; qh bytes 32h + 16 (j % 2) .., bits 2 (2 (a % 2) + j / 2). */
    const uint8_t *b = row + (size_t)s * 210;
    const float d = mm_f16(ld_u16(b + 208));
    const int8_t *sc = (const int8_t *)(b + 192);
    uint32_t cw[4][4]; /* codes of the 16 values of run a */
#pragma unroll
    for (int h = 0; h < 2; h++) {
      uint32_t ql[4], qh[4];
      ld16_a2(b + 64 * h + 32 * ((j >> 1) & 1) + 16 * (j & 1), ql);
      ld16_a2(b + 128 + 32 * h + 16 * (j & 1), qh);
#pragma unroll
      for (int odd = 0; odd < 2; odd++) {
        const int ap = 2 * h + odd, qq = 2 * odd + (j >> 1);
#pragma unroll
        for (int c = 0; c < 4; c++)
          cw[ap][c] = ((ql[c] >> (4 * odd)) & 0x0F0F0F0Fu) | (((qh[c] >> (2 * qq)) & 0x03030303u) << 4);
      }
    }
    int sca[4];
#pragma unroll
    for (int ap = 0; ap < 4; ap++) sca[ap] = sc[4 * ap + j];
    const int sm0 = sc[4 * j], sm1 = sc[4 * j + 1], sm2 = sc[4 * j + 2], sm3 = sc[4 * j + 3];
#pragma unroll
    for (int bb = 0; bb < NB; bb++) {
      if (bb >= nb) break;
      const uint8_t *x = xq + (size_t)bb * xs;
      const uint8_t *xv = x + 256 * (size_t)s + 16 * j;
      int D[4][2]; /* run a, half */
#pragma unroll
      for (int ap = 0; ap < 4; ap++) {
        const uint4 x4 = *(const uint4 *)(xv + 64 * ap);
        D[ap][0] = dp4(cw[ap][1], x4.y, dp4(cw[ap][0], x4.x, 0));
        D[ap][1] = dp4(cw[ap][3], x4.w, dp4(cw[ap][2], x4.z, 0));
      }
      const float S = d * ((const float *)(x + a.off_d))[s];
#pragma unroll
      for (int t = 0; t < 4; t++) {
        const int a0 = t >> 1, a1 = 2 + (t >> 1), hf = t & 1;
        P[bb][t] = (float)(sca[a0] * D[a0][hf] + sca[a1] * D[a1][hf]) * S;
      }
      /* min lanes 2j, 2j + 1: 32 (sc[2jj] bsum[2jj] + sc[2jj+1] bsum[2jj+1]) */
      const uint2 bw = *(const uint2 *)(x + a.off_s + 32 * (size_t)s + 8 * j); /* bsum[4j .. 4j+3] */
      const int b0 = (int16_t)(bw.x & 0xFFFF), b1 = (int16_t)(bw.x >> 16), b2 = (int16_t)(bw.y & 0xFFFF),
                b3 = (int16_t)(bw.y >> 16);
      M[bb][0] = (float)(32 * (sm0 * b0 + sm1 * b1)) * S;
      M[bb][1] = (float)(32 * (sm2 * b2 + sm3 * b3)) * S;
    }
    return true;
  } else if constexpr (T == FLOE_TYPE_IQ4_XS) {
    /* lane 4j + t, sub-step ss: qs word t of sub-block j (ss < 2) or 4 + j, low nibbles for even
     * ss; activations at 64 ss + 16j + 4t */
    const uint8_t *b = row + (size_t)s * 136;
    const float d = mm_f16(ld_u16(b));
    const uint32_t sh = ld_u16(b + 2);
    const int ib0 = j, ib1 = 4 + j;
    const int ls0 = (int)(((b[4 + ib0 / 2] >> (4 * (ib0 % 2))) & 0xF) | (((sh >> (2 * ib0)) & 3) << 4)) - 32;
    const int ls1 = (int)(((b[4 + ib1 / 2] >> (4 * (ib1 % 2))) & 0xF) | (((sh >> (2 * ib1)) & 3) << 4)) - 32;
    const uint2 q0a = *(const uint2 *)(b + 8 + 16 * ib0), q0b = *(const uint2 *)(b + 16 + 16 * ib0);
    const uint2 q1a = *(const uint2 *)(b + 8 + 16 * ib1), q1b = *(const uint2 *)(b + 16 + 16 * ib1);
    const uint32_t q0[4] = {q0a.x, q0a.y, q0b.x, q0b.y}, q1[4] = {q1a.x, q1a.y, q1b.x, q1b.y};
    uint32_t w[4][4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
      w[0][t] = lut16(q0[t] & 0x0F0F0F0Fu, a.kv);
      w[1][t] = lut16((q0[t] >> 4) & 0x0F0F0F0Fu, a.kv);
      w[2][t] = lut16(q1[t] & 0x0F0F0F0Fu, a.kv);
      w[3][t] = lut16((q1[t] >> 4) & 0x0F0F0F0Fu, a.kv);
    }
#pragma unroll
    for (int bb = 0; bb < NB; bb++) {
      if (bb >= nb) break;
      const uint8_t *x = xq + (size_t)bb * xs;
      const uint8_t *xv = x + 256 * (size_t)s + 16 * j;
      const uint4 x0 = *(const uint4 *)xv, x1 = *(const uint4 *)(xv + 64), x2 = *(const uint4 *)(xv + 128),
                  x3 = *(const uint4 *)(xv + 192);
      const uint32_t xa[4][4] = {{x0.x, x0.y, x0.z, x0.w}, {x1.x, x1.y, x1.z, x1.w}, {x2.x, x2.y, x2.z, x2.w},
                                 {x3.x, x3.y, x3.z, x3.w}};
      const float S = d * ((const float *)(x + a.off_d))[s];
#pragma unroll
      for (int t = 0; t < 4; t++) {
        const int L = ls0 * dp4(w[1][t], xa[1][t], dp4(w[0][t], xa[0][t], 0)) +
                      ls1 * dp4(w[3][t], xa[3][t], dp4(w[2][t], xa[2][t], 0));
        P[bb][t] = (float)L * S;
      }
    }
    return true;
  } else { /* MLX 4-bit / 8-bit */
    constexpr int STEP = T == T_MLX4 ? 128 : 64, PER = STEP / 16; /* values per step, per lane */
    const int64_t c = (int64_t)STEP * s, e0 = c + 4 * PER * j;   /* first value of lane 4j */
    if (e0 >= a.cols) return false; /* whole groups of >= 32 values: the 4 lanes go together */
    const uint4 cw = *(const uint4 *)(row + (T == T_MLX4 ? c / 2 : c) + 16 * j);
    const uint32_t codes[4] = {cw.x, cw.y, cw.z, cw.w};
    const int64_t grp = e0 / a.group;
    const float scale = mm_sb(a.sb_type, scr, grp);
#pragma unroll
    for (int bb = 0; bb < NB; bb++) {
      if (bb >= nb) break;
      const uint8_t *x = xq + (size_t)bb * xs;
      const int4 nc = *(const int4 *)(x + a.off_c + 4 * (16 * (size_t)s + 4 * j));
      const int ncv[4] = {nc.x, nc.y, nc.z, nc.w};
      const float S = scale * ((const float *)(x + a.off_d))[grp];
      if constexpr (T == T_MLX4) {
        const uint4 xl = *(const uint4 *)(x + c + 16 * j), xh = *(const uint4 *)(x + c + 64 + 16 * j);
        const uint32_t xlv[4] = {xl.x, xl.y, xl.z, xl.w}, xhv[4] = {xh.x, xh.y, xh.z, xh.w};
#pragma unroll
        for (int t = 0; t < 4; t++)
          P[bb][t] = (float)dp4((codes[t] >> 4) & 0x0F0F0F0Fu, xhv[t], dp4(codes[t] & 0x0F0F0F0Fu, xlv[t], ncv[t])) * S;
      } else {
        const uint4 xl = *(const uint4 *)(x + c + 16 * j);
        const uint32_t xlv[4] = {xl.x, xl.y, xl.z, xl.w};
#pragma unroll
        for (int t = 0; t < 4; t++) P[bb][t] = (float)dp4us(codes[t], xlv[t], ncv[t]) * S;
      }
    }
    return true;
  }
}

/* kred16 over 4 threads j of 4 lanes v[4j + c]; result in thread 0 */
__device__ __forceinline__ float red16_4x4(const float v[4]) {
  float a[4], b[4];
#pragma unroll
  for (int c = 0; c < 4; c++) a[c] = v[c] + __shfl_down_sync(MM_FULL, v[c], 2); /* a[4j + c], j < 2 */
#pragma unroll
  for (int c = 0; c < 4; c++) b[c] = a[c] + __shfl_down_sync(MM_FULL, a[c], 1); /* b[c], j = 0 */
  const float c0 = b[0] + b[2], c1 = b[1] + b[3];
  return c0 + c1;
}
/* kred8 over 4 threads j of 2 lanes v[2j + c]; result in thread 0 */
__device__ __forceinline__ float red8_4x2(const float v[2]) {
  float a[2], b[2];
#pragma unroll
  for (int c = 0; c < 2; c++) a[c] = v[c] + __shfl_down_sync(MM_FULL, v[c], 2); /* a[2j + c], j < 2 */
#pragma unroll
  for (int c = 0; c < 2; c++) b[c] = a[c] + __shfl_down_sync(MM_FULL, a[c], 1); /* b[c], j = 0 */
  return b[0] + b[1];
}

/* One weight row . nb (<= NB) activation rows by its 4 threads; y valid in thread j = 0. */
template <int T, int NB>
__device__ __forceinline__ void l4_dot(const KArgs &a, const uint8_t *row, const uint8_t *scr, const uint8_t *bir,
                                       const uint8_t *xq, size_t xs, int nb, int j, float y[NB]) {
  constexpr int U = NB == 1 ? 4 : NB <= 4 ? 2 : 1; /* steps loaded per round */
  float acc[NB][4], macc[NB][4];
#pragma unroll
  for (int b = 0; b < NB; b++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc[b][c] = macc[b][c] = 0.0f;
  const int ns = l4_nsteps<T>(a);
  for (int s0 = 0; s0 < ns; s0 += U) {
    float P[U][NB][4], M[U][NB][2];
    bool v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = s0 + u < ns && l4_step<T, NB>(a, row, scr, xq, xs, nb, s0 + u, j, P[u], M[u]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (!v[u]) continue;
#pragma unroll
      for (int b = 0; b < NB; b++) {
        if (b >= nb) break;
#pragma unroll
        for (int c = 0; c < 4; c++) acc[b][c] = acc[b][c] + P[u][b][c];
        if constexpr (T == FLOE_TYPE_Q6_K) {
          macc[b][0] = macc[b][0] + M[u][b][0];
          macc[b][1] = macc[b][1] + M[u][b][1];
        }
      }
    }
  }
  if constexpr (T == T_MLX4 || T == T_MLX8) {
    /* bias lanes: bacc[k % 16] += (bias_k + o * scale_k) * s_k over the groups k in order;
     * thread j owns slots 4j .. 4j+3 */
    const float off = (float)(1 << ((T == T_MLX4 ? 4 : 8) - 1));
    for (int64_t k0 = 0; k0 < a.nblk; k0 += 16)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int64_t k = k0 + 4 * j + c;
        if (k >= a.nblk) break;
        const float wk = mm_sb(a.sb_type, bir, k) + off * mm_sb(a.sb_type, scr, k);
#pragma unroll
        for (int b = 0; b < NB; b++)
          if (b < nb) macc[b][c] = macc[b][c] + wk * ((const float *)(xq + (size_t)b * xs + a.off_s))[k];
      }
  }
#pragma unroll
  for (int b = 0; b < NB; b++) {
    const float r16 = red16_4x4(acc[b]);
    if constexpr (T == FLOE_TYPE_Q6_K) y[b] = r16 - red8_4x2(macc[b]);
    else if constexpr (T == FLOE_TYPE_IQ4_XS) y[b] = r16 - 0.0f; /* kred16(acc) - kred8(0) */
    else if constexpr (T == T_MLX4 || T == T_MLX8) y[b] = r16 + red16_4x4(macc[b]);
    else y[b] = r16 + 0.0f;
  }
}

#define RPB 32 /* rows per block: 4 warps x 8 rows of 4 threads */

template <int T, int NB, int MODE>
__global__ void __launch_bounds__(128) k_l4(KArgs a, KArgs a2, int64_t nb, int K, const int32_t *ids,
                                            const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  PDL_ENTER();
  const int j = threadIdx.x & 3;
  const int64_t r0 = (int64_t)blockIdx.x * RPB + (threadIdx.x >> 2);
  const bool live = r0 < a.rows; /* dead rows still take part in the shuffles */
  const int64_t r = live ? r0 : a.rows - 1;
  if constexpr (MODE == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * NB;
    const int nbt = (int)(nb - b0 < NB ? nb - b0 : NB);
    const uint8_t *scr = a.sc ? a.sc + (size_t)r * a.sb_row_bytes : nullptr;
    const uint8_t *bir = a.bi ? a.bi + (size_t)r * a.sb_row_bytes : nullptr;
    float y[NB];
    l4_dot<T, NB>(a, mm_row(a, 0, r), scr, bir, xq + (size_t)b0 * xs, xs, nbt, j, y);
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
    const size_t so = (size_t)e * a.sb_estride + (size_t)r * a.sb_row_bytes;
    float g[1];
    l4_dot<T, 1>(a, mm_row(a, e, r), a.sc ? a.sc + so : nullptr, a.bi ? a.bi + so : nullptr, x, xs, 1, j, g);
    if constexpr (MODE == MM_GLU) {
      const size_t so2 = (size_t)e * a2.sb_estride + (size_t)r * a2.sb_row_bytes;
      float u[1];
      l4_dot<T, 1>(a2, mm_row(a2, e, r), a2.sc ? a2.sc + so2 : nullptr, a2.bi ? a2.bi + so2 : nullptr, x, xs, 1, j, u);
      if (live && j == 0) Y[slot * ldy + r] = floe_siluf(g[0]) * u[0];
    } else {
      if (live && j == 0) Y[slot * ldy + r] = g[0];
    }
  }
}

template <int T>
void launch_t(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids, const uint8_t *xq,
              size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  const unsigned gx = (unsigned)((a.rows + RPB - 1) / RPB);
  if (mode == MM_GLU) {
    pdl_launch(k_l4<T, 1, MM_GLU>, dim3(dim3(gx, (unsigned)nb)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (mode == MM_DOWN) {
    pdl_launch(k_l4<T, 1, MM_DOWN>, dim3(dim3(gx, (unsigned)nb)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (nb == 1) {
    pdl_launch(k_l4<T, 1, MM_PLAIN>, dim3(dim3(gx, 1)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (nb <= 4) {
    pdl_launch(k_l4<T, 4, MM_PLAIN>, dim3(dim3(gx, 1)), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else {
    pdl_launch(k_l4<T, 16, MM_PLAIN>, dim3(dim3(gx, (unsigned)((nb + 15) / 16))), dim3(128), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, Y, ldy);
  }
}

} // namespace

bool mm_q4l_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                   const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  switch (a.type) {
    case FLOE_TYPE_Q8_0: launch_t<FLOE_TYPE_Q8_0>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_Q4_0: launch_t<FLOE_TYPE_Q4_0>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_IQ4_NL: launch_t<FLOE_TYPE_IQ4_NL>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_MXFP4: launch_t<FLOE_TYPE_MXFP4>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_Q6_K: launch_t<FLOE_TYPE_Q6_K>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_IQ4_XS: launch_t<FLOE_TYPE_IQ4_XS>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_MLX:
      if (a.bits == 4) launch_t<T_MLX4>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st);
      else if (a.bits == 8) launch_t<T_MLX8>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st);
      else return false;
      return true;
    default: return false;
  }
}
