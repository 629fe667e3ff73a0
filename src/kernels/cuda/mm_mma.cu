/* Tensor-core matmuls of Q4_K / Q5_K weights with quantized activations, for many activation rows:
 * prefill's matrices, and its MoE with the slots grouped by expert so that each expert's weights
 * are read once per tile of slots instead of once per slot.
 *
 * Exactness: the same bits as k4_dot (mm_k4.cu) and the CPU's "superblock model"
 * (kernels_internal.h). Per output and superblock k, the CPU forms the exact integers
 * S1 = sum over sub-blocks j of sc[j] * (sum of q * x over the sub-block) and
 * S2 = sum_j m[j] * (bsum[2j] + bsum[2j+1]), then t = (float)S1 * (d * dx) - (float)S2 * (dmin * dx)
 * and acc[k % 16] = acc[k % 16] + t, then kred16's tree. Here each sub-block's integer dot comes
 * from an mma.sync m16n8k32 s8 x s8 -> s32 (exact: 4-bit codes times int8 activations, summed
 * in 32-bit integers with no overflow, so the order is irrelevant); S1, S2 and every float
 * operation after them are the CPU's. The tree is kept in registers as it fills: with at most 16
 * superblocks (4096 columns) each slot holds one term, v[k] = 0 + t_k, so a[i] = v[i] + v[i+8]
 * can be formed when t_{i+8} arrives (v[i] + 0 when it never does), then b, c and the result.
 * Wider rows (nsb > 16) are not taken here (mm_mma_launch returns false: k_k4 runs them).
 *
 * Work layout: a block is 4 warps, 64 weight rows (16 a warp: the mma's M) by 32 activation rows
 * (4 mma n-tiles of 8). The activation tile (int8 codes, the d's and the bsums of up to 8
 * superblocks) is staged in shared memory, its rows padded by 16 bytes so that the 8 rows one
 * fragment load touches fall in distinct banks; each thread loads its two weight rows' code words
 * straight from global memory into fragment order. Activation 32-run t of a superblock (the
 * 0,2,1,3 order of kact_perm256) holds natural sub-block sb = 2c + hi, whose codes are the low
 * (hi = 0) or high (hi = 1) nibbles of code bytes 32c .. 32c + 31, c = 2 (t / 4) + t % 2,
 * hi = (t / 2) % 2; element i of the run is code byte 32c + i.
 *
 * Grouping (cuda_mm_moe_group): the slots of a chunk are counted per expert, the counts scanned,
 * and the slot ids scattered into per-expert runs (the order inside a run depends on atomics,
 * which changes nothing: every output is computed on its own, wherever its slot sits in a tile).
 * Each run is cut into tiles of at most 32 slots; a launch has a block row per possible tile and
 * the blocks past the real count return at once, so nothing is read back to the host. Slots with
 * an id outside [0, n_expert) form one more run whose rows are written as NaN (the documented
 * result of the per-slot kernels). */
#include <stdlib.h>

#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define MMA_MT 64    /* weight rows a block */
#define MMA_NT 32    /* activation rows a block */
#define MMA_SBC 8    /* superblocks staged a round */
#define MMA_QROW (256 * MMA_SBC + 16) /* staged bytes of one activation row's codes */
#define MMA_SMEM (MMA_NT * MMA_QROW + MMA_NT * MMA_SBC * 4 + MMA_NT * MMA_SBC * 32)

namespace {

/* the group scratch (cuda_mm_moe_group_bytes): int32 words */
struct GrpLayout {
  int64_t cnt, off, fill, tiles, perm, max_tiles, total;
};

GrpLayout grp_layout(int64_t slots, int nep) {
  GrpLayout g;
  const int64_t n = nep + 1; /* + the run of out-of-range ids */
  g.max_tiles = slots / MMA_NT + n;
  g.cnt = 4;
  g.off = g.cnt + n;
  g.fill = g.off + n + 1;
  g.tiles = g.fill + n;
  g.perm = g.tiles + 3 * g.max_tiles;
  g.total = g.perm + slots;
  return g;
}

__global__ void k_grp_count(const int32_t *__restrict__ ids, int64_t slots, int nep, int32_t *__restrict__ grp,
                            GrpLayout L) {
  PDL_ENTER();
  const int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  const int e = ids[s];
  atomicAdd(&grp[L.cnt + (e >= 0 && e < nep ? e : nep)], 1);
}

/* one block: offsets, tiles (expert, first, count), the tile count in word 0, fill = 0 */
__global__ void k_grp_scan(int nep, int32_t *__restrict__ grp, GrpLayout L) {
  PDL_ENTER();
  const int n = nep + 1;
  __shared__ int32_t s_cnt[CUDA_MM_GROUP_MAX_EXPERT + 1], s_off[CUDA_MM_GROUP_MAX_EXPERT + 2],
      s_toff[CUDA_MM_GROUP_MAX_EXPERT + 2];
  /* the counts into shared memory by every thread first: a serial loop over global memory would
   * pay a load latency per expert (its stores may alias the next load) */
  for (int e = threadIdx.x; e < n; e += blockDim.x) s_cnt[e] = grp[L.cnt + e];
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t o = 0, to = 0;
    for (int e = 0; e < n; e++) {
      const int32_t c = s_cnt[e];
      s_off[e] = o;
      s_toff[e] = to;
      o += c;
      to += (c + MMA_NT - 1) / MMA_NT;
    }
    s_off[n] = o;
    s_toff[n] = to;
    grp[0] = to;
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= n; e += blockDim.x) grp[L.off + e] = s_off[e];
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int32_t c = s_cnt[e], o = s_off[e];
    grp[L.fill + e] = 0;
    for (int32_t i = 0, ti = s_toff[e]; i < c; i += MMA_NT, ti++) {
      grp[L.tiles + 3 * ti] = e;
      grp[L.tiles + 3 * ti + 1] = o + i;
      grp[L.tiles + 3 * ti + 2] = c - i < MMA_NT ? c - i : MMA_NT;
    }
  }
}

__global__ void k_grp_scatter(const int32_t *__restrict__ ids, int64_t slots, int nep, int32_t *__restrict__ grp,
                              GrpLayout L) {
  PDL_ENTER();
  const int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  int e = ids[s];
  if (e < 0 || e >= nep) e = nep;
  const int32_t p = grp[L.off + e] + atomicAdd(&grp[L.fill + e], 1);
  grp[L.perm + p] = (int32_t)s;
}

__device__ __forceinline__ void mma_s8(int c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One weight row's data for a superblock, in this thread's fragment order: the header (d, dmin,
 * scales), code words (bytes 32c + 4 tq .. + 3 in lo[c], 32c + 16 + 4 tq .. in hi[c]) and, for
 * Q5_K, the qh words of those bytes (qh[q % 32]). */
struct K4Row {
  uint4 h;
  uint32_t lo[4], hi[4];
  uint32_t qh0, qh1;
};

template <int T>
__device__ __forceinline__ void k4_load(K4Row &w, const uint8_t *__restrict__ row, int k, int tq) {
  constexpr int BB = T == FLOE_TYPE_Q4_K ? 144 : 176;
  constexpr int QS = T == FLOE_TYPE_Q4_K ? 16 : 48;
  const uint8_t *blk = row + (size_t)k * BB;
  w.h = *(const uint4 *)blk;
  const uint32_t *q = (const uint32_t *)(blk + QS);
#pragma unroll
  for (int c = 0; c < 4; c++) {
    w.lo[c] = q[8 * c + tq];
    w.hi[c] = q[8 * c + 4 + tq];
  }
  if constexpr (T == FLOE_TYPE_Q5_K) {
    const uint32_t *qh = (const uint32_t *)(blk + 16);
    w.qh0 = qh[tq];
    w.qh1 = qh[4 + tq];
  } else {
    w.qh0 = w.qh1 = 0;
  }
}

/* the 4 codes of word v for run c / hi (Q5_K: with their fifth bits from qh) */
template <int T>
__device__ __forceinline__ uint32_t k4_codes(uint32_t v, uint32_t qh, int c, int hi) {
  uint32_t r = (hi ? v >> 4 : v) & 0x0F0F0F0Fu;
  if constexpr (T == FLOE_TYPE_Q5_K) r |= ((qh >> (2 * c + hi)) & 0x01010101u) << 4;
  return r;
}

/* Staged activation tile: codes [MMA_NT][MMA_QROW], d [MMA_NT][MMA_SBC], bsum int16
 * [MMA_NT][MMA_SBC][16]. */
struct Stage {
  uint8_t *q;
  float *d;
  int16_t *bs;
};

__device__ __forceinline__ Stage stage_of(uint8_t *smem) {
  Stage s;
  s.q = smem;
  s.d = (float *)(smem + MMA_NT * MMA_QROW);
  s.bs = (int16_t *)(smem + MMA_NT * MMA_QROW + MMA_NT * MMA_SBC * 4);
  return s;
}

/* stage superblocks k0 .. k0 + nk - 1 of the tile's activation rows (xrow[n]: NULL = no row) */
__device__ __forceinline__ void stage_acts(const Stage &S, const KArgs &a, const uint8_t *const *xrow, int k0,
                                           int nk) {
  const int tid = threadIdx.x;
  const int nq = nk * 16; /* uint4 of codes a row */
  for (int i = tid; i < MMA_NT * nq; i += blockDim.x) {
    const int n = i / nq, u = i % nq;
    const uint8_t *x = xrow[n];
    *(uint4 *)(S.q + n * MMA_QROW + 16 * u) = x ? ((const uint4 *)(x + 256 * (size_t)k0))[u] : make_uint4(0, 0, 0, 0);
  }
  for (int i = tid; i < MMA_NT * nk; i += blockDim.x) {
    const int n = i / nk, kk = i % nk;
    const uint8_t *x = xrow[n];
    S.d[n * MMA_SBC + kk] = x ? ((const float *)(x + a.off_d))[k0 + kk] : 0.0f;
  }
  for (int i = tid; i < MMA_NT * nk * 2; i += blockDim.x) {
    const int n = i / (nk * 2), u = i % (nk * 2);
    const uint8_t *x = xrow[n];
    *(uint4 *)(S.bs + (n * MMA_SBC) * 16 + 8 * u) =
        x ? ((const uint4 *)(x + a.off_s + 32 * (size_t)k0))[u] : make_uint4(0, 0, 0, 0);
  }
}

/* The partial kred16 tree of the 16 outputs of a thread: v[i][o] = slot i (phase 1, k < 8) then
 * a[i] (phase 2, k >= 8). */
struct Acc {
  float v[8][16];
};

/* Superblocks k0 + kk, kk < nk (<= MMA_SBC), of this thread's 16 outputs (n-tile j, element e:
 * weight row g + 8 (e / 2) of the warp's 16, activation row 8 j + 2 tq + e % 2), staged in S, into
 * the tree slots: the first round (P2 false, k < 8) stores v[kk] = 0 + t, the second (k >= 8)
 * forms a[kk] = v[kk] + (0 + t). kk is a compile-time index (the loop is unrolled, guarded by
 * nk), so the slots stay in registers without selects. */
template <int T, bool P2>
__device__ __forceinline__ void k4mma_round(const uint8_t *row0, const uint8_t *row1, const Stage &S, int k0, int nk,
                                            float v[8][16]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int kk = 0; kk < MMA_SBC; kk++) {
    if (kk >= nk) break;
    const int k = k0 + kk;
    K4Row w0, w1;
    k4_load<T>(w0, row0, k, tq);
    k4_load<T>(w1, row1, k, tq);
    int S1[16];
#pragma unroll
    for (int o = 0; o < 16; o++) S1[o] = 0;
#pragma unroll
    for (int t = 0; t < 8; t++) {
      const int c = 2 * (t >> 2) + (t & 1), hi = (t >> 1) & 1, sb = 2 * c + hi;
      const uint32_t a0 = k4_codes<T>(w0.lo[c], w0.qh0, c, hi), a1 = k4_codes<T>(w1.lo[c], w1.qh0, c, hi);
      const uint32_t a2 = k4_codes<T>(w0.hi[c], w0.qh1, c, hi), a3 = k4_codes<T>(w1.hi[c], w1.qh1, c, hi);
      const int sc0 = k4_scale(w0.h, sb), sc1 = k4_scale(w1.h, sb);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint8_t *xb = S.q + (8 * j + g) * MMA_QROW + 256 * kk + 32 * t + 4 * tq;
        int cc[4] = {0, 0, 0, 0};
        mma_s8(cc, a0, a1, a2, a3, *(const uint32_t *)xb, *(const uint32_t *)(xb + 16));
        S1[4 * j + 0] += sc0 * cc[0];
        S1[4 * j + 1] += sc0 * cc[1];
        S1[4 * j + 2] += sc1 * cc[2];
        S1[4 * j + 3] += sc1 * cc[3];
      }
    }
    int mn0[8], mn1[8];
#pragma unroll
    for (int i = 0; i < 8; i++) mn0[i] = k4_min(w0.h, i), mn1[i] = k4_min(w1.h, i);
    const float d0 = mm_f16(w0.h.x & 0xFFFF), dm0 = mm_f16(w0.h.x >> 16);
    const float d1 = mm_f16(w1.h.x & 0xFFFF), dm1 = mm_f16(w1.h.x >> 16);
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int u = 0; u < 2; u++) { /* activation row n = 8 j + 2 tq + u: outputs 4 j + u (row 0), 4 j + 2 + u (row 1) */
        const int n = 8 * j + 2 * tq + u;
        const uint4 *bs = (const uint4 *)(S.bs + (n * MMA_SBC + kk) * 16);
        const uint4 q0 = bs[0], q1 = bs[1];
        const uint32_t bw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w}; /* bsum 2i | 2i+1 */
        int S2a = 0, S2b = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const int p = (int)(int16_t)(bw[i] & 0xFFFF) + (int)(int16_t)(bw[i] >> 16);
          S2a += mn0[i] * p;
          S2b += mn1[i] * p;
        }
        const float dx = S.d[n * MMA_SBC + kk];
        const float dd0 = d0 * dx, dmx0 = dm0 * dx, dd1 = d1 * dx, dmx1 = dm1 * dx;
        const float t0 = (float)S1[4 * j + u] * dd0 - (float)S2a * dmx0;
        const float t1 = (float)S1[4 * j + 2 + u] * dd1 - (float)S2b * dmx1;
        const int o0 = 4 * j + u, o1 = 4 * j + 2 + u;
        if constexpr (P2) {
          v[kk][o0] = v[kk][o0] + (0.0f + t0);
          v[kk][o1] = v[kk][o1] + (0.0f + t1);
        } else {
          v[kk][o0] = 0.0f + t0;
          v[kk][o1] = 0.0f + t1;
        }
      }
  }
}

/* This thread's 16 outputs of one matrix over all nsb (<= 16) superblocks, into y[16]: at most two
 * staged rounds (every thread of the block calls this; xrow: the tile's activation rows). */
template <int T>
__device__ __forceinline__ void k4mma_dot(const KArgs &a, const uint8_t *row0, const uint8_t *row1, const Stage &S,
                                          const uint8_t *const *xrow, float y[16]) {
  const int nsb = (int)(a.cols / 256);
  float v[8][16];
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int o = 0; o < 16; o++) v[i][o] = 0.0f;
  const int n1 = nsb < MMA_SBC ? nsb : MMA_SBC;
  __syncthreads(); /* the previous readers of the stage are done */
  stage_acts(S, a, xrow, 0, n1);
  __syncthreads();
  k4mma_round<T, false>(row0, row1, S, 0, n1, v);
  if (nsb > MMA_SBC) {
    __syncthreads();
    stage_acts(S, a, xrow, MMA_SBC, nsb - MMA_SBC);
    __syncthreads();
    k4mma_round<T, true>(row0, row1, S, MMA_SBC, nsb - MMA_SBC, v);
  }
  /* slots past the last superblock hold 0: a[i] = v[i] + 0 where no t_{i+8} came */
#pragma unroll
  for (int i = 0; i < 8; i++)
    if (i + 8 >= nsb)
#pragma unroll
      for (int o = 0; o < 16; o++) v[i][o] = v[i][o] + 0.0f;
#pragma unroll
  for (int o = 0; o < 16; o++) {
    const float b0 = v[0][o] + v[4][o], b1 = v[1][o] + v[5][o], b2 = v[2][o] + v[6][o], b3 = v[3][o] + v[7][o];
    y[o] = (b0 + b2) + (b1 + b3);
  }
}

/* MODE MM_PLAIN: activation rows blockIdx.y * 32 + n < nb, Y[b * ldy + r]. MM_GLU / MM_DOWN:
 * tile blockIdx.y of the grouping grp (slots s = perm[first + n], n < count; x row s / K (GLU)
 * or s (DOWN); Y[s * ldy + r] = silu(gate . x) * (up . x) or down . x). */
template <int T, int MODE>
__global__ void __launch_bounds__(128) k_k4mma(KArgs a, KArgs a2, int K, const int32_t *__restrict__ grp, GrpLayout L,
                                               const uint8_t *__restrict__ xq, size_t xs, float *__restrict__ Y,
                                               int64_t ldy, int64_t nb) {
  PDL_ENTER();
  extern __shared__ __align__(16) uint8_t s_mma[];
  __shared__ const uint8_t *s_xrow[MMA_NT];
  __shared__ int64_t s_oid[MMA_NT];
  int e = 0;
  if constexpr (MODE == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * MMA_NT;
    if (threadIdx.x < MMA_NT) {
      const int64_t b = b0 + threadIdx.x;
      s_xrow[threadIdx.x] = b < nb ? xq + (size_t)b * xs : nullptr;
      s_oid[threadIdx.x] = b < nb ? b : -1;
    }
  } else {
    if ((int)blockIdx.y >= grp[0]) return; /* past the real tiles: uniform over the block */
    const int32_t *tl = grp + L.tiles + 3 * blockIdx.y;
    e = tl[0];
    const int first = tl[1], cnt = tl[2];
    if (threadIdx.x < MMA_NT) {
      const int n = threadIdx.x;
      const int64_t s = n < cnt ? grp[L.perm + first + n] : -1;
      s_oid[n] = s;
      s_xrow[n] = s >= 0 ? xq + (size_t)(MODE == MM_GLU ? s / K : s) * xs : nullptr;
    }
    if (e >= a.n_expert) { /* the out-of-range ids: NaN rows */
      __syncthreads();
      for (int i = threadIdx.x; i < MMA_NT * MMA_MT; i += blockDim.x) {
        const int n = i / MMA_MT;
        const int64_t r = (int64_t)blockIdx.x * MMA_MT + i % MMA_MT;
        if (s_oid[n] >= 0 && r < a.rows) Y[s_oid[n] * ldy + r] = __int_as_float(0x7fc00000);
      }
      return;
    }
  }
  __syncthreads();
  const Stage S = stage_of(s_mma);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t rw = (int64_t)blockIdx.x * MMA_MT + 16 * warp + g;
  const int64_t r0 = rw < a.rows ? rw : a.rows - 1, r1 = rw + 8 < a.rows ? rw + 8 : a.rows - 1;
  float y[16];
  k4mma_dot<T>(a, mm_row(a, e, r0), mm_row(a, e, r1), S, s_xrow, y);
  if constexpr (MODE == MM_GLU) {
    float u[16];
    k4mma_dot<T>(a2, mm_row(a2, e, r0), mm_row(a2, e, r1), S, s_xrow, u);
#pragma unroll
    for (int o = 0; o < 16; o++) y[o] = floe_siluf(y[o]) * u[o];
  }
#pragma unroll
  for (int o = 0; o < 16; o++) {
    const int j = o >> 2, ee = o & 3;
    const int n = 8 * j + 2 * tq + (ee & 1);
    const int64_t r = rw + 8 * (ee >> 1), id = s_oid[n];
    if (id >= 0 && r < a.rows) Y[id * ldy + r] = y[o];
  }
}

/* 1: the tensor-core kernels where they apply (default); 0: never (FLOE_CUDA_MMA=0). */
static int g_mma = -1;

static int mma_on(void) {
  if (g_mma < 0) {
    const char *e = getenv("FLOE_CUDA_MMA");
    g_mma = !(e && e[0] == '0');
  }
  return g_mma;
}

template <int T, int MODE>
void launch_mma(const KArgs &a, const KArgs &a2, int K, const int32_t *grp, const GrpLayout &L, unsigned gy,
                const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t nb, cudaStream_t st) {
  static bool attr = false; /* the dynamic shared memory past 48 KiB, once per instantiation */
  if (!attr) {
    cudaFuncSetAttribute(k_k4mma<T, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, MMA_SMEM);
    attr = true;
  }
  const unsigned gx = (unsigned)((a.rows + MMA_MT - 1) / MMA_MT);
  pdl_launch(k_k4mma<T, MODE>, dim3(gx, gy), dim3(128), (size_t)MMA_SMEM, st, a, a2, K, grp, L, xq, xs, Y, ldy, nb);
}

} // namespace

/* whether a's shape and type take the tensor-core kernels (GLU: one staged round; the grouped
 * modes: a stack cuda_mm_moe_group can group) */
bool mm_mma_fits(const KArgs &a, int mode) {
  if (!mma_on() || (a.type != FLOE_TYPE_Q4_K && a.type != FLOE_TYPE_Q5_K)) return false;
  const int64_t nsb = a.cols / 256;
  return nsb >= 1 && nsb <= 16 && (mode != MM_GLU || nsb <= MMA_SBC) &&
         (mode == MM_PLAIN || a.n_expert <= CUDA_MM_GROUP_MAX_EXPERT);
}

void cuda_mm_set_mma(int on) { g_mma = on ? 1 : 0; }

/* mm_api.cu: prefill's matmuls (nb >= MMA_MIN_NB activation rows) */
bool mm_mma_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  if (!mm_mma_fits(a, MM_PLAIN)) return false;
  const GrpLayout L = grp_layout(0, 0);
  const int64_t gy = (nb + MMA_NT - 1) / MMA_NT;
  for (int64_t y0 = 0; y0 < gy; y0 += 65535) { /* grid y limit */
    const int64_t ny = gy - y0 < 65535 ? gy - y0 : 65535, b0 = y0 * MMA_NT;
    const int64_t n = nb - b0 < ny * MMA_NT ? nb - b0 : ny * MMA_NT;
    if (a.type == FLOE_TYPE_Q4_K)
      launch_mma<FLOE_TYPE_Q4_K, MM_PLAIN>(a, a, 1, nullptr, L, (unsigned)ny, xq + (size_t)b0 * xs, xs, Y + b0 * ldy, ldy, n, st);
    else
      launch_mma<FLOE_TYPE_Q5_K, MM_PLAIN>(a, a, 1, nullptr, L, (unsigned)ny, xq + (size_t)b0 * xs, xs, Y + b0 * ldy, ldy, n, st);
  }
  return true;
}

size_t cuda_mm_moe_group_bytes(int64_t slots, int n_expert) {
  return (size_t)grp_layout(slots, n_expert).total * sizeof(int32_t);
}

void cuda_mm_moe_group(const int32_t *ids, int64_t slots, int n_expert, void *grp, void *stream) {
  if (slots <= 0 || n_expert < 1 || n_expert > CUDA_MM_GROUP_MAX_EXPERT) return; /* see cuda_mm.h */
  const cudaStream_t st = (cudaStream_t)stream;
  const GrpLayout L = grp_layout(slots, n_expert);
  int32_t *g = (int32_t *)grp;
  cudaMemsetAsync(g + L.cnt, 0, (size_t)(n_expert + 1) * sizeof(int32_t), st);
  const unsigned nbk = (unsigned)((slots + 255) / 256);
  pdl_launch(k_grp_count, dim3(nbk), dim3(256), (size_t)0, st, ids, slots, n_expert, g, L);
  pdl_launch(k_grp_scan, dim3(1), dim3(256), (size_t)0, st, n_expert, g, L);
  pdl_launch(k_grp_scatter, dim3(nbk), dim3(256), (size_t)0, st, ids, slots, n_expert, g, L);
}

/* The grouped MoE kernels: false when the weights do not take them (the caller runs the per-slot
 * kernels). */
bool mm_mma_moe_launch(const KArgs &a, const KArgs &a2, int mode, int64_t slots, int K, const void *grp,
                       const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  if (!grp || !mm_mma_fits(a, mode) || (mode == MM_GLU && a2.type != a.type)) return false;
  const GrpLayout L = grp_layout(slots, a.n_expert);
  if (L.max_tiles > 65535) return false;
  const int32_t *g = (const int32_t *)grp;
  const unsigned gy = (unsigned)L.max_tiles;
  if (a.type == FLOE_TYPE_Q4_K) {
    if (mode == MM_GLU) launch_mma<FLOE_TYPE_Q4_K, MM_GLU>(a, a2, K, g, L, gy, xq, xs, Y, ldy, slots, st);
    else launch_mma<FLOE_TYPE_Q4_K, MM_DOWN>(a, a2, K, g, L, gy, xq, xs, Y, ldy, slots, st);
  } else {
    if (mode == MM_GLU) launch_mma<FLOE_TYPE_Q5_K, MM_GLU>(a, a2, K, g, L, gy, xq, xs, Y, ldy, slots, st);
    else launch_mma<FLOE_TYPE_Q5_K, MM_DOWN>(a, a2, K, g, L, gy, xq, xs, Y, ldy, slots, st);
  }
  return true;
}
