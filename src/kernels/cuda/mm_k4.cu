/* Quantized-activation matmuls of Q4_K and Q5_K: the "superblock model" (kernels_internal.h).
 *
 * The CPU's order, per output: acc[16] = 0; for each superblock k the exact integers
 * S1 = sum w * x * sc (over the 256 positions) and S2 = sum_j m[j] * (bsum[2j] + bsum[2j+1]),
 * t = (float)S1 * (d * dx) - (float)S2 * (dmin * dx), acc[k % 16] = acc[k % 16] + t; then
 * reduce16. Here one warp computes one weight row for up to NB activation rows: the 4 groups of
 * 8 threads take superblocks 4m .. 4m+3 (group g: superblock 4m + g), each thread 16 code bytes
 * (32 positions), S1 and S2 summed over the group by shuffles (exact integers). Slot k % 16 of
 * superblock k = 4m + g is 4 (m % 4) + g, so every slot belongs to one group's first thread and
 * receives its terms in superblock order; the final reduce16 follows kred16's tree exactly.
 *
 * Code byte q of a superblock (qs[q], q < 128): its low nibble is natural value 64 (q / 32) +
 * q % 32 (sub-block 2 (q / 32)) at activation position 128 (q / 64) + q % 64, its high nibble
 * natural 64 (q / 32) + 32 + q % 32 (sub-block 2 (q / 32) + 1) at position 128 (q / 64) + 64 +
 * q % 64 (the activation order 0,2,1,3 of 32-runs). Q5_K's fifth bit of both comes from
 * qh[q % 32], bits 2 (q / 32) and 2 (q / 32) + 1. */
#include "kernels/cuda/mm_common.cuh"

namespace {

/* The exact S1, S2 parts of thread u (code bytes 16u .. 16u+15) of superblock k, for the nb
 * activation rows; d, dmin of the superblock. */
template <int T, int NB>
__device__ __forceinline__ void k4_part(const KArgs &a, const uint8_t *row, const uint8_t *xq, size_t xs, int nb, int k,
                                        int u, int S1[NB], int S2[NB], float *d, float *dmin) {
  constexpr int BB = T == FLOE_TYPE_Q4_K ? 144 : 176; /* block bytes */
  constexpr int QS = T == FLOE_TYPE_Q4_K ? 16 : 48;   /* offset of qs */
  const uint8_t *blk = row + (size_t)k * BB;
  const uint32_t dd = ld_u32(blk);
  *d = mm_f16(dd & 0xFFFF);
  *dmin = mm_f16(dd >> 16);
  /* 6-bit scales and mins (get_scale_min_k4): this thread needs sc[2j], sc[2j+1] (j = u / 2)
   * and m[u] */
  const uint32_t w0 = ld_u32(blk + 4), w1 = ld_u32(blk + 8), w2 = ld_u32(blk + 12);
  auto qb = [&](int i) -> int { /* scale byte q[i], i < 12 */
    const uint32_t w = i < 4 ? w0 : i < 8 ? w1 : w2;
    return (int)((w >> (8 * (i & 3))) & 0xFF);
  };
  auto scale = [&](int jj) -> int { return jj < 4 ? qb(jj) & 63 : (qb(jj + 4) & 0xF) | ((qb(jj - 4) >> 6) << 4); };
  auto minv = [&](int jj) -> int { return jj < 4 ? qb(jj + 4) & 63 : (qb(jj + 4) >> 4) | ((qb(jj) >> 6) << 4); };
  const int j = u >> 1;
  const int sc0 = scale(2 * j), sc1 = scale(2 * j + 1), mu = minv(u);
  const uint4 qs = *(const uint4 *)(blk + QS + 16 * u);
  uint32_t lo[4] = {qs.x & 0x0F0F0F0Fu, qs.y & 0x0F0F0F0Fu, qs.z & 0x0F0F0F0Fu, qs.w & 0x0F0F0F0Fu};
  uint32_t hi[4] = {(qs.x >> 4) & 0x0F0F0F0Fu, (qs.y >> 4) & 0x0F0F0F0Fu, (qs.z >> 4) & 0x0F0F0F0Fu,
                    (qs.w >> 4) & 0x0F0F0F0Fu};
  if constexpr (T == FLOE_TYPE_Q5_K) {
    const uint4 qh = *(const uint4 *)(blk + 16 + 16 * (u & 1));
    const uint32_t h4[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
      lo[w] |= ((h4[w] >> (2 * j)) & 0x01010101u) << 4;
      hi[w] |= ((h4[w] >> (2 * j + 1)) & 0x01010101u) << 4;
    }
  }
  const size_t xo = 256 * (size_t)k + 128 * (u >> 2) + 16 * (u & 3);
#pragma unroll
  for (int b = 0; b < NB; b++) {
    if (b >= nb) break;
    const uint8_t *x = xq + (size_t)b * xs;
    const uint4 xl = *(const uint4 *)(x + xo), xh = *(const uint4 *)(x + xo + 64);
    const int sl = dp4(lo[3], xl.w, dp4(lo[2], xl.z, dp4(lo[1], xl.y, dp4(lo[0], xl.x, 0))));
    const int sh = dp4(hi[3], xh.w, dp4(hi[2], xh.z, dp4(hi[1], xh.y, dp4(hi[0], xh.x, 0))));
    S1[b] = sc0 * sl + sc1 * sh;
    const int16_t *bs = (const int16_t *)(x + a.off_s) + 16 * (size_t)k;
    S2[b] = mu * (bs[2 * u] + bs[2 * u + 1]);
  }
}

template <int T, int NB>
__device__ __forceinline__ void k4_dot(const KArgs &a, const uint8_t *row, const uint8_t *xq, size_t xs, int nb,
                                       float y[NB]) {
  constexpr int UNR = NB == 1 ? 2 : 1; /* superblocks per group per round (loads in flight) */
  const int lane = threadIdx.x & 31, g = lane >> 3, u = lane & 7;
  const int nsb = (int)(a.cols / 256);
  float acc[NB][4];
#pragma unroll
  for (int b = 0; b < NB; b++)
#pragma unroll
    for (int q = 0; q < 4; q++) acc[b][q] = 0.0f;
  for (int m0 = 0; m0 < nsb; m0 += 4 * UNR) {
    int S1[UNR][NB], S2[UNR][NB];
    float d[UNR], dmin[UNR];
#pragma unroll
    for (int uu = 0; uu < UNR; uu++) {
#pragma unroll
      for (int b = 0; b < NB; b++) S1[uu][b] = S2[uu][b] = 0;
      d[uu] = dmin[uu] = 0.0f;
      const int k = m0 + 4 * uu + g;
      if (k < nsb) k4_part<T, NB>(a, row, xq, xs, nb, k, u, S1[uu], S2[uu], &d[uu], &dmin[uu]);
    }
#pragma unroll
    for (int uu = 0; uu < UNR; uu++) {
      /* superblock k = m0 + 4uu + g goes to slot k % 16 = 4 mm + g */
      const int k = m0 + 4 * uu + g, mm = ((m0 >> 2) + uu) & 3;
#pragma unroll
      for (int b = 0; b < NB; b++) {
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
          S1[uu][b] += __shfl_xor_sync(MM_FULL, S1[uu][b], o);
          S2[uu][b] += __shfl_xor_sync(MM_FULL, S2[uu][b], o);
        }
        if (k < nsb && u == 0 && b < nb) {
          const float dx = ((const float *)(xq + (size_t)b * xs + a.off_d))[k];
          const float dd = d[uu] * dx, dm = dmin[uu] * dx;
          const float t = (float)S1[uu][b] * dd - (float)S2[uu][b] * dm;
#pragma unroll
          for (int q = 0; q < 4; q++)
            if (q == mm) acc[b][q] = acc[b][q] + t;
        }
      }
    }
  }
  /* kred16 over slots 4q + g (thread 8g holds slots g, g+4, g+8, g+12 as acc[.][0..3]):
   * a[i] = v[i] + v[i+8] -> acc[0] + acc[2], acc[1] + acc[3]; b[i] = a[i] + a[i+4] -> their sum
   * (slot g, g+4); c[i] = b[i] + b[i+2]: groups 0,1 with 2,3; then c[0] + c[1]: groups 0 and 1 */
#pragma unroll
  for (int b = 0; b < NB; b++) {
    const float a0 = acc[b][0] + acc[b][2], a1 = acc[b][1] + acc[b][3];
    float c = a0 + a1;
    c = c + __shfl_down_sync(MM_FULL, c, 16);
    y[b] = c + __shfl_down_sync(MM_FULL, c, 8);
  }
}

#define WPB 4

template <int T, int NB, int MODE>
__global__ void __launch_bounds__(32 * WPB) k_k4(KArgs a, KArgs a2, int64_t nb, int K, const int32_t *ids,
                                                 const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  const int64_t r = (int64_t)blockIdx.x * WPB + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= a.rows) return;
  if constexpr (MODE == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * NB;
    const int nbt = (int)(nb - b0 < NB ? nb - b0 : NB);
    float y[NB];
    k4_dot<T, NB>(a, mm_row(a, 0, r), xq + (size_t)b0 * xs, xs, nbt, y);
    if (lane == 0)
#pragma unroll
      for (int b = 0; b < NB; b++)
        if (b < nbt) Y[(b0 + b) * ldy + r] = y[b];
  } else {
    const int64_t slot = blockIdx.y;
    const int e = ids ? ids[slot] : 0;
    if (e < 0 || e >= a.n_expert) {
      if (lane == 0) Y[slot * ldy + r] = __int_as_float(0x7fc00000);
      return;
    }
    const uint8_t *x = xq + (size_t)(MODE == MM_GLU ? slot / K : slot) * xs;
    float g[1];
    k4_dot<T, 1>(a, mm_row(a, e, r), x, xs, 1, g);
    if constexpr (MODE == MM_GLU) {
      float up[1];
      k4_dot<T, 1>(a2, mm_row(a2, e, r), x, xs, 1, up);
      if (lane == 0) Y[slot * ldy + r] = mm_siluf(g[0]) * up[0];
    } else {
      if (lane == 0) Y[slot * ldy + r] = g[0];
    }
  }
}

template <int T>
void launch_t(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids, const uint8_t *xq,
              size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  const unsigned gx = (unsigned)((a.rows + WPB - 1) / WPB);
  if (mode == MM_GLU) {
    k_k4<T, 1, MM_GLU><<<dim3(gx, (unsigned)nb), 32 * WPB, 0, st>>>(a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (mode == MM_DOWN) {
    k_k4<T, 1, MM_DOWN><<<dim3(gx, (unsigned)nb), 32 * WPB, 0, st>>>(a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (nb == 1) {
    k_k4<T, 1, MM_PLAIN><<<dim3(gx, 1), 32 * WPB, 0, st>>>(a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else if (nb <= 4) {
    k_k4<T, 4, MM_PLAIN><<<dim3(gx, 1), 32 * WPB, 0, st>>>(a, a2, nb, K, ids, xq, xs, Y, ldy);
  } else {
    k_k4<T, 16, MM_PLAIN><<<dim3(gx, (unsigned)((nb + 15) / 16)), 32 * WPB, 0, st>>>(a, a2, nb, K, ids, xq, xs, Y, ldy);
  }
}

} // namespace

bool mm_k4_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                  const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  switch (a.type) {
    case FLOE_TYPE_Q4_K: launch_t<FLOE_TYPE_Q4_K>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    case FLOE_TYPE_Q5_K: launch_t<FLOE_TYPE_Q5_K>(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st); return true;
    default: return false;
  }
}
