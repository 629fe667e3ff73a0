/* Quantized-activation matmuls of the "16-lane model" types (kernels_internal.h): Q8_0, Q4_0,
 * IQ4_NL, MXFP4 (A32 activations), Q6_K, IQ4_XS (A256), MLX 4-bit and 8-bit (MLX activations).
 *
 * The CPU's order, per output (weight row r, activation row b): 16 lane accumulators; per step s
 * each lane adds P = (float)L * S (L the exact integer lane sum, S = weight scale * activation
 * scale); then the fixed reduce16 (plus the Q6_K min lanes, the MLX bias lanes). Here one warp
 * computes one weight row for up to NB activation rows: thread t computes the products of lane
 * i = t % 16 for the steps of parity t / 16 (U pairs of steps per round, loads first), then
 * thread i adds its own product and thread i + 16's (by shuffle) to acc[i] in step order. So each
 * lane's sequence of adds is the CPU's, in one thread; the weights are decoded once per round
 * and used for every activation row of the tile. */
#include <type_traits>

#include "kernels/cuda/amk.cuh"
#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace {

enum { T_MLX4 = 1004, T_MLX8 = 1008 };

template <int T> __host__ __device__ constexpr bool is_a32() {
  return T == FLOE_TYPE_Q8_0 || T == FLOE_TYPE_Q4_0 || T == FLOE_TYPE_IQ4_NL || T == FLOE_TYPE_MXFP4;
}

template <int T> __device__ __forceinline__ int q16_nsteps(const KArgs &a) {
  if (is_a32<T>()) return (int)((a.nblk + 1) / 2);
  if (T == T_MLX4) return (int)((a.cols + 127) / 128);
  if (T == T_MLX8) return (int)((a.cols + 63) / 64);
  return (int)(a.cols / 256); /* Q6_K, IQ4_XS: one step per superblock */
}

/* Lanes a step does not cover (an odd last block, a partial last MLX chunk) are left untouched. */
template <int T> __device__ __forceinline__ bool q16_covered(const KArgs &a, int s, int i) {
  if (is_a32<T>()) return 2 * s + (i >> 3) < a.nblk;
  if (T == T_MLX4) return 128 * (int64_t)s + 8 * i < a.cols;
  if (T == T_MLX8) return 64 * (int64_t)s + 4 * i < a.cols;
  return true;
}

/* Products of lane i, step s, for activation rows b < nb (rows xs bytes apart from xq):
 * P[b] = (float)L * S; M[b]: the Q6_K min lanes (i < 8). */
template <int T, int NB>
__device__ __forceinline__ void q16_lane(const KArgs &a, const uint8_t *row, const uint8_t *scr, const uint8_t *xq,
                                         size_t xs, int nb, int s, int i, float P[NB], float M[NB]) {
  if constexpr (is_a32<T>()) {
    const int blk = 2 * s + (i >> 3), e = 4 * (i & 7);
    uint32_t w;
    float dw;
    if constexpr (T == FLOE_TYPE_Q8_0) {
      const uint8_t *b = row + (size_t)blk * 34;
      w = ld_u32_a2(b + 2 + e);
      dw = mm_f16(ld_u16(b));
    } else if constexpr (T == FLOE_TYPE_MXFP4) {
      const uint8_t *b = row + (size_t)blk * 17;
      const uint32_t q = ld_u32_a1(b + 1 + (e & 15));
      w = lut16(e < 16 ? q & 0x0F0F0F0Fu : (q >> 4) & 0x0F0F0F0Fu, a.kv);
      dw = mm_e8m0_half(b[0]);
    } else {
      const uint8_t *b = row + (size_t)blk * 18;
      const uint32_t q = ld_u32_a2(b + 2 + (e & 15));
      const uint32_t nib = e < 16 ? q & 0x0F0F0F0Fu : (q >> 4) & 0x0F0F0F0Fu;
      w = T == FLOE_TYPE_Q4_0 ? __vsub4(nib, 0x08080808u) : lut16(nib, a.kv);
      dw = mm_f16(ld_u16(b));
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b >= nb) break;
      const uint8_t *x = xq + (size_t)b * xs;
      const float dx = ((const float *)(x + a.off_d))[blk];
      const float S = dw * dx;
      P[b] = (float)dp4(w, ld_u32(x + 32 * blk + e), 0) * S;
    }
  } else if constexpr (T == FLOE_TYPE_Q6_K) {
    const uint8_t *b = row + (size_t)s * 210;
    const float d = mm_f16(ld_u16(b + 208));
    const int8_t *sc = (const int8_t *)(b + 192);
    const int t = i & 3, j = i >> 2;
    uint32_t cw[2][2];
    int scp[2], n0[2];
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const int ap = 2 * p + (t >= 2), i0 = 4 * j + 2 * (t & 1);
      n0[p] = 64 * ap + 4 * i0; /* natural position of the lane's 8 values */
      scp[p] = sc[4 * ap + j];
      const int h = n0[p] >> 7, r = n0[p] & 127, qq = r >> 5, l0 = r & 31;
      const uint8_t *ql = b + 64 * h + 32 * (qq & 1) + l0, *qh = b + 128 + 32 * h + l0;
#pragma unroll
      for (int k = 0; k < 2; k++) {
        const uint32_t lo = (ld_u32_a2(ql + 4 * k) >> (4 * (qq >> 1))) & 0x0F0F0F0Fu;
        const uint32_t hi = (ld_u32_a2(qh + 4 * k) >> (2 * qq)) & 0x03030303u;
        cw[p][k] = lo | (hi << 4);
      }
    }
    int scm0 = 0, scm1 = 0;
    if (i < 8) {
      scm0 = sc[2 * i];
      scm1 = sc[2 * i + 1];
    }
#pragma unroll
    for (int bb = 0; bb < NB; bb++) {
      if (bb >= nb) break;
      const uint8_t *x = xq + (size_t)bb * xs;
      const uint8_t *xv = x + 256 * (size_t)s;
      int L = 0;
#pragma unroll
      for (int p = 0; p < 2; p++) {
        const uint2 xw = *(const uint2 *)(xv + n0[p]);
        L += scp[p] * dp4(cw[p][1], xw.y, dp4(cw[p][0], xw.x, 0));
      }
      const float S = d * ((const float *)(x + a.off_d))[s];
      P[bb] = (float)L * S;
      if (i < 8) {
        const int16_t *bs = (const int16_t *)(x + a.off_s) + 16 * (size_t)s;
        const int Mi = 32 * (scm0 * bs[2 * i] + scm1 * bs[2 * i + 1]);
        M[bb] = (float)Mi * S;
      }
    }
  } else if constexpr (T == FLOE_TYPE_IQ4_XS) {
    const uint8_t *b = row + (size_t)s * 136;
    const float d = mm_f16(ld_u16(b));
    const uint32_t sh = ld_u16(b + 2);
    const int ib0 = i >> 2, ib1 = 4 + (i >> 2);
    const int ls0 = (int)(((b[4 + ib0 / 2] >> (4 * (ib0 % 2))) & 0xF) | (((sh >> (2 * ib0)) & 3) << 4)) - 32;
    const int ls1 = (int)(((b[4 + ib1 / 2] >> (4 * (ib1 % 2))) & 0xF) | (((sh >> (2 * ib1)) & 3) << 4)) - 32;
    const uint32_t q0 = ld_u32(b + 8 + 16 * ib0 + 4 * (i & 3)), q1 = ld_u32(b + 8 + 16 * ib1 + 4 * (i & 3));
    const uint32_t w0 = lut16(q0 & 0x0F0F0F0Fu, a.kv), w1 = lut16((q0 >> 4) & 0x0F0F0F0Fu, a.kv);
    const uint32_t w2 = lut16(q1 & 0x0F0F0F0Fu, a.kv), w3 = lut16((q1 >> 4) & 0x0F0F0F0Fu, a.kv);
#pragma unroll
    for (int bb = 0; bb < NB; bb++) {
      if (bb >= nb) break;
      const uint8_t *x = xq + (size_t)bb * xs;
      const uint8_t *xv = x + 256 * (size_t)s + 4 * i;
      const int L = ls0 * dp4(w1, ld_u32(xv + 64), dp4(w0, ld_u32(xv), 0)) +
                    ls1 * dp4(w3, ld_u32(xv + 192), dp4(w2, ld_u32(xv + 128), 0));
      P[bb] = (float)L * (d * ((const float *)(x + a.off_d))[s]);
    }
  } else if constexpr (T == T_MLX4 || T == T_MLX8) {
    const int64_t c = (T == T_MLX4 ? 128 : 64) * (int64_t)s;
    const int64_t e0 = c + (T == T_MLX4 ? 8 : 4) * i; /* first value of the lane */
    const uint32_t codes = ld_u32(row + (T == T_MLX4 ? c / 2 : c) + 4 * i);
    const int64_t grp = e0 / a.group;
    const float scale = mm_sb(a.sb_type, scr, grp);
#pragma unroll
    for (int bb = 0; bb < NB; bb++) {
      if (bb >= nb) break;
      const uint8_t *x = xq + (size_t)bb * xs;
      const int nc = ((const int32_t *)(x + a.off_c))[16 * (int64_t)s + i];
      int L;
      if constexpr (T == T_MLX4)
        L = dp4((codes >> 4) & 0x0F0F0F0Fu, ld_u32(x + c + 64 + 4 * i), dp4(codes & 0x0F0F0F0Fu, ld_u32(x + c + 4 * i), nc));
      else
        L = dp4us(codes, ld_u32(x + c + 4 * i), nc);
      P[bb] = (float)L * (scale * ((const float *)(x + a.off_d))[grp]);
    }
  }
}

/* One weight row . nb (<= NB) activation rows; results in lane 0. */
template <int T, int NB>
__device__ __forceinline__ void q16_dot(const KArgs &a, const uint8_t *row, const uint8_t *scr, const uint8_t *bir,
                                        const uint8_t *xq, size_t xs, int nb, float y[NB]) {
  constexpr int U = NB == 1 ? 4 : NB <= 4 ? 2 : 1; /* pairs of steps per round */
  const int lane = threadIdx.x & 31, i = lane & 15, par = lane >> 4;
  float acc[NB], macc[NB];
#pragma unroll
  for (int b = 0; b < NB; b++) acc[b] = macc[b] = 0.0f;
  const int ns = q16_nsteps<T>(a);
  for (int s0 = 0; s0 < ns; s0 += 2 * U) {
    float P[U][NB], M[U][NB];
    bool v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
      for (int b = 0; b < NB; b++) P[u][b] = M[u][b] = 0.0f;
      const int s = s0 + 2 * u + par;
      v[u] = s < ns && q16_covered<T>(a, s, i);
      if (v[u]) q16_lane<T, NB>(a, row, scr, xq, xs, nb, s, i, P[u], M[u]);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const bool vo = __shfl_down_sync(MM_FULL, (int)v[u], 16) != 0; /* lane i + 16: step s0 + 2u + 1 */
#pragma unroll
      for (int b = 0; b < NB; b++) {
        const float po = __shfl_down_sync(MM_FULL, P[u][b], 16);
        if (par == 0 && b < nb) {
          if (v[u]) acc[b] = acc[b] + P[u][b];
          if (vo) acc[b] = acc[b] + po;
        }
        if constexpr (T == FLOE_TYPE_Q6_K) {
          const float mo = __shfl_down_sync(MM_FULL, M[u][b], 16);
          if (par == 0 && i < 8 && b < nb) {
            if (v[u]) macc[b] = macc[b] + M[u][b];
            if (vo) macc[b] = macc[b] + mo;
          }
        }
      }
    }
  }
  if constexpr (T == T_MLX4 || T == T_MLX8) {
    /* bias lanes: bacc[k % 16] += (bias_k + o * scale_k) * s_k over the groups k in order */
    const float off = (float)(1 << ((T == T_MLX4 ? 4 : 8) - 1));
    if (par == 0)
      for (int64_t k = i; k < a.nblk; k += 16) {
        const float wk = mm_sb(a.sb_type, bir, k) + off * mm_sb(a.sb_type, scr, k);
#pragma unroll
        for (int b = 0; b < NB; b++)
          if (b < nb) macc[b] = macc[b] + wk * ((const float *)(xq + (size_t)b * xs + a.off_s))[k];
      }
  }
#pragma unroll
  for (int b = 0; b < NB; b++) {
    const float r16 = warp_red16(acc[b]);
    if constexpr (T == FLOE_TYPE_Q6_K || T == FLOE_TYPE_IQ4_XS) y[b] = r16 - warp_red8(macc[b]);
    else if constexpr (T == T_MLX4 || T == T_MLX8) y[b] = r16 + warp_red16(macc[b]);
    else y[b] = r16 + 0.0f;
  }
}

#define WPB 4 /* warps (weight rows) per block */

template <int T, int NB, int MODE>
__global__ void __launch_bounds__(32 * WPB) k_q16(KArgs a, KArgs a2, int64_t nb, int K, const int32_t *ids,
                                                  const uint8_t *xq, size_t xs, MMOut o) {
  PDL_ENTER();
  float *const Y = o.y[0]; /* the MoE modes: one output */
  const int64_t ldy = o.ld[0];
  const int64_t r = (int64_t)blockIdx.x * WPB + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= a.rows) return; /* the whole warp */
  if constexpr (MODE == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * NB;
    const int nbt = (int)(nb - b0 < NB ? nb - b0 : NB);
    const uint8_t *scr = a.sc ? a.sc + (size_t)r * a.sb_row_bytes : nullptr;
    const uint8_t *bir = a.bi ? a.bi + (size_t)r * a.sb_row_bytes : nullptr;
    float y[NB];
    q16_dot<T, NB>(a, mm_row(a, 0, r), scr, bir, xq + (size_t)b0 * xs, xs, nbt, y);
    if (lane == 0)
#pragma unroll
      for (int b = 0; b < NB; b++)
        if (b < nbt) {
          *mm_out(o, b0 + b, r) = y[b];
          if (o.keys) amk_put(o.keys + (size_t)(b0 + b) * CUDA_AMK_ROW, (uint32_t)r, y[b]);
        }
  } else {
    const int64_t slot = blockIdx.y;
    const int e = ids ? ids[slot] : 0;
    if (e < 0 || e >= a.n_expert) {
      if (lane == 0) Y[slot * ldy + r] = __int_as_float(0x7fc00000);
      return;
    }
    const uint8_t *x = xq + (size_t)(MODE == MM_GLU ? slot / K : slot) * xs;
    const size_t so = (size_t)e * a.sb_estride + (size_t)r * a.sb_row_bytes;
    float g[1];
    q16_dot<T, 1>(a, mm_row(a, e, r), a.sc ? a.sc + so : nullptr, a.bi ? a.bi + so : nullptr, x, xs, 1, g);
    if constexpr (MODE == MM_GLU) {
      const size_t so2 = (size_t)e * a2.sb_estride + (size_t)r * a2.sb_row_bytes;
      float u[1];
      q16_dot<T, 1>(a2, mm_row(a2, e, r), a2.sc ? a2.sc + so2 : nullptr, a2.bi ? a2.bi + so2 : nullptr, x, xs, 1, u);
      if (lane == 0) Y[slot * ldy + r] = floe_siluf(g[0]) * u[0];
    } else {
      if (lane == 0) Y[slot * ldy + r] = g[0];
    }
  }
}

/* Activation rows a warp takes in a launch of 2..4 rows (a verify's; FLOE_CUDA_Q16_FEW_NB=1 / 2 / 4
 * at the first call): 2, the default, gives the launch ceil(nb / 2) warps a weight row (blockIdx.y
 * picks the rows, the weights read again from L2), each half the chain of one warp for all of them
 * (4). Each output's operations do not depend on the rows beside it: the same bits. Session 27, the
 * default model's --mtp 3 (verify of 4 rows), three alternated rounds, 4 / 1 / 2: 1.685 / 1.740 /
 * 1.744, 1.676 / 1.709 / 1.751, 1.709 / 1.736 / 1.722 x. */
static int g_q16_few_nb = -1;
static int q16_few_nb(void) {
  if (g_q16_few_nb < 0) {
    const int v = mm_env_int("FLOE_CUDA_Q16_FEW_NB", 2);
    g_q16_few_nb = v == 1 || v == 4 ? v : 2;
  }
  return g_q16_few_nb;
}

/* MM_PLAIN with nb >= 2 activation rows: NB = 4 (or q16_few_nb()'s 1 / 2) or 16 rows a block, each
 * output row written where o says (a plain matmul, or a joined matrix's parts: cuda_mm_matmul_parts) */
template <int T>
void rows_t(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st) {
  const unsigned gx = (unsigned)((a.rows + WPB - 1) / WPB);
  const int fnb = nb <= 4 ? q16_few_nb() : 4;
  if (fnb == 1)
    pdl_launch(k_q16<T, 1, MM_PLAIN>, dim3(gx, (unsigned)nb), dim3(32 * WPB), (size_t)0, st, a, a, nb, 1, nullptr, xq, xs,
               o);
  else if (fnb == 2)
    pdl_launch(k_q16<T, 2, MM_PLAIN>, dim3(gx, (unsigned)((nb + 1) / 2)), dim3(32 * WPB), (size_t)0, st, a, a, nb, 1,
               nullptr, xq, xs, o);
  else if (nb <= 4)
    pdl_launch(k_q16<T, 4, MM_PLAIN>, dim3(gx, 1), dim3(32 * WPB), (size_t)0, st, a, a, nb, 1, nullptr, xq, xs, o);
  else
    pdl_launch(k_q16<T, 16, MM_PLAIN>, dim3(gx, (unsigned)((nb + 15) / 16)), dim3(32 * WPB), (size_t)0, st, a, a, nb, 1,
               nullptr, xq, xs, o);
}

template <int T>
void launch_t(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids, const uint8_t *xq,
              size_t xs, float *Y, int64_t ldy, cudaStream_t st, unsigned long long *keys = nullptr) {
  const unsigned gx = (unsigned)((a.rows + WPB - 1) / WPB);
  MMOut o = mm_out_all(Y, ldy, a.rows);
  o.keys = mode == MM_PLAIN ? keys : nullptr;
  if (mode == MM_GLU) {
    pdl_launch(k_q16<T, 1, MM_GLU>, dim3(dim3(gx, (unsigned)nb)), dim3(32 * WPB), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, o);
  } else if (mode == MM_DOWN) {
    pdl_launch(k_q16<T, 1, MM_DOWN>, dim3(dim3(gx, (unsigned)nb)), dim3(32 * WPB), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, o);
  } else if (nb == 1) {
    pdl_launch(k_q16<T, 1, MM_PLAIN>, dim3(dim3(gx, 1)), dim3(32 * WPB), (size_t)(0), st, a, a2, nb, K, ids, xq, xs, o);
  } else {
    rows_t<T>(a, nb, xq, xs, o, st);
  }
}

/* f(std::integral_constant<int, T>) for the type k_q16 computes a's with; false: none */
template <typename F>
bool q16_type(const KArgs &a, F f) {
  switch (a.type) {
    case FLOE_TYPE_Q8_0: f(std::integral_constant<int, FLOE_TYPE_Q8_0>()); return true;
    case FLOE_TYPE_Q4_0: f(std::integral_constant<int, FLOE_TYPE_Q4_0>()); return true;
    case FLOE_TYPE_IQ4_NL: f(std::integral_constant<int, FLOE_TYPE_IQ4_NL>()); return true;
    case FLOE_TYPE_MXFP4: f(std::integral_constant<int, FLOE_TYPE_MXFP4>()); return true;
    case FLOE_TYPE_Q6_K: f(std::integral_constant<int, FLOE_TYPE_Q6_K>()); return true;
    case FLOE_TYPE_IQ4_XS: f(std::integral_constant<int, FLOE_TYPE_IQ4_XS>()); return true;
    case FLOE_TYPE_MLX:
      if (a.bits == 4) f(std::integral_constant<int, T_MLX4>());
      else if (a.bits == 8) f(std::integral_constant<int, T_MLX8>());
      else return false;
      return true;
    default: return false;
  }
}

} // namespace

extern "C" void cuda_mm_set_q16_few_nb(int nb) { g_q16_few_nb = nb == 1 || nb == 4 ? nb : 2; }

bool mm_q16_few_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st) {
  if (!mm_few_on() || nb < 2 || nb > 15) return false;
  return q16_type(a, [&](auto t) { rows_t<decltype(t)::value>(a, nb, xq, xs, o, st); });
}

bool mm_q16_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                   const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  return q16_type(a, [&](auto t) { launch_t<decltype(t)::value>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); });
}

bool mm_q16_has_type(const KArgs &a) {
  return q16_type(a, [](auto) {});
}

bool mm_q16_amax_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, float *Y, int64_t ldy,
                        unsigned long long *keys, cudaStream_t st) {
  return q16_type(a, [&](auto t) {
    launch_t<decltype(t)::value>(a, a, MM_PLAIN, nb, 1, nullptr, xq, xs, Y, ldy, st, keys);
  });
}
