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
 * result of the per-slot kernels).
 *
 * k_k4mma2 (below, the default; FLOE_CUDA_MMA2=0 selects k_k4mma) takes the same tiles and gives
 * the same bits with a warp per 16 rows x 16 slots; its comment says what it changes and why. */
#ifndef FLOE_MM_MMA_CUH
#define FLOE_MM_MMA_CUH

#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define MMA_MT 64    /* weight rows a block */
#define MMA_NT 32    /* activation rows a block */
#define MMA_SBC 8    /* superblocks staged a round */
#define MMA_QROW (256 * MMA_SBC + 16) /* staged bytes of one activation row's codes */
#define MMA_SMEM (MMA_NT * MMA_QROW + MMA_NT * MMA_SBC * 4 + MMA_NT * MMA_SBC * 32)

/* FLOE_CUDA_MMA2 (mm_mma.cu) */
int mm_mma2_impl(void);

/* Launches of one weight type, each in a file of its own (mm_mma_q4.cu, mm_mma_q5.cu) so that the
 * two compile in parallel: the tensor-core kernels of a mode (MM_PLAIN: nb rows from xq; MM_GLU /
 * MM_DOWN: the slots grouped for gnep experts by grp) with gy block rows, and k_k4mn for 1..15 rows. */
void mm_mma_q4_launch(int mode, const KArgs &a, const KArgs &a2, int K, const int32_t *grp, int64_t gslots, int gnep,
                      unsigned gy, const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t nb, cudaStream_t st);
void mm_mma_q5_launch(int mode, const KArgs &a, const KArgs &a2, int K, const int32_t *grp, int64_t gslots, int gnep,
                      unsigned gy, const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t nb, cudaStream_t st);
void mm_mma_q4_few(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st);
void mm_mma_q5_few(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st);

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

/* the mins and the two scales of two weight rows' superblock headers */
struct K4Hd {
  int mn0[8], mn1[8];
  float d0, dm0, d1, dm1;
};
__device__ __forceinline__ void k4_hd(const K4Row &w0, const K4Row &w1, K4Hd &h) {
#pragma unroll
  for (int j = 0; j < 8; j++) h.mn0[j] = k4_min(w0.h, j), h.mn1[j] = k4_min(w1.h, j);
  h.d0 = mm_f16(w0.h.x & 0xFFFF), h.dm0 = mm_f16(w0.h.x >> 16);
  h.d1 = mm_f16(w1.h.x & 0xFFFF), h.dm1 = mm_f16(w1.h.x >> 16);
}

/* S2 of two weight rows (mins mn0 / mn1) with one activation row's superblock: sum_j m[j] *
 * (bsum[2j] + bsum[2j+1]) from its 16 bsums at bs, exact integers */
__device__ __forceinline__ void k4_s2(const uint4 *bs, const int *mn0, const int *mn1, int &S2a, int &S2b) {
  const uint4 q0 = bs[0], q1 = bs[1];
  const uint32_t bw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w}; /* bsum 2j | 2j+1 */
  S2a = S2b = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const int p = (int)(int16_t)(bw[j] & 0xFFFF) + (int)(int16_t)(bw[j] >> 16);
    S2a += mn0[j] * p;
    S2b += mn1[j] * p;
  }
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
    K4Hd hd;
    k4_hd(w0, w1, hd);
    const int *mn0 = hd.mn0, *mn1 = hd.mn1;
    const float d0 = hd.d0, dm0 = hd.dm0, d1 = hd.d1, dm1 = hd.dm1;
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int u = 0; u < 2; u++) { /* activation row n = 8 j + 2 tq + u: outputs 4 j + u (row 0), 4 j + 2 + u (row 1) */
        const int n = 8 * j + 2 * tq + u;
        int S2a, S2b;
        k4_s2((const uint4 *)(S.bs + (n * MMA_SBC + kk) * 16), mn0, mn1, S2a, S2b);
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

/* ---- k_k4mma2: the second form (FLOE_CUDA_MMA2, on by default) ----
 *
 * The same outputs, bit for bit, as k_k4mma; what changes is where the time goes. k_k4mma kept
 * kred16's first 8 slots of 16 outputs a thread in registers (~250 registers: 2 blocks of 4 warps
 * an SM), loaded each superblock's weights right before their use, formed S2 with 16 integer
 * multiplies an output from unpacked int16 bsums, and ran all 4 n-tiles of a 32-slot tile even
 * when the expert had a handful of slots. Here:
 *  - a warp owns 16 weight rows x 16 slots (8 outputs a thread); a block of M2_NW warps covers
 *    16 M2_NW rows, and a tile of up to 32 slots is taken in passes of 16, with only the n-tiles
 *    (8 slots) that hold slots computed: a 20-slot expert costs 3 n-tiles, not 4;
 *  - kred16's tree is folded as the terms arrive: superblocks are taken in the order
 *    0, 8, 1, 9, ... (k and k + 8 first form a[k] = v[k] + v[k+8]), and a[0..7] go into
 *    b[i] = a[i] + a[i+4], c[i] = b[i] + b[i+2], c0 + c1 as soon as their operands exist, so at
 *    most 4 partial values an output are live (the same additions, in the same tree);
 *  - the weight words of the superblock after next are prefetched into L2 (and, in the DB form,
 *    the next one's loaded into registers) while this one is computed;
 *  - S2 = sum_j m[j] s[j] (s[j] = bsum[2j] + bsum[2j+1], |s| < 2^13) comes from two small
 *    mma: s = 128 h + l with l = s & 127, h = s >> 7 both int8 (staged once per slot and
 *    superblock), S2 = sum m l + 128 sum m h, exact in int32 as before;
 *  - the activation codes are staged with each 32-run's words reordered (w0 w4 w1 w5 w2 w6 w3 w7)
 *    so that a B fragment (words tq and tq + 4) is one 8-byte load, rows padded by 32 bytes so
 *    that a half-warp's loads fall in distinct banks. */
/* DB (FLOE_CUDA_MMA2=1): the next superblock's words held in registers, 4 warps a block and 3
 * blocks an SM (<= 168 registers); without (FLOE_CUDA_MMA2=2, the default): loaded at their use
 * after an L2 prefetch two superblocks ahead, 8 warps a block and 2 blocks an SM (<= 128
 * registers). On the H200 the second is faster everywhere (MoE gate+up 506 vs 543 us a layer,
 * down 161 vs 187, k_k4mma 722 / 286): more warps hide more than a register double buffer. */
#define M2_NW(DB) ((DB) ? 4 : 8)       /* warps a block */
#define M2_MINB(DB) ((DB) ? 3 : 2)     /* blocks an SM */
#define M2_MT(DB) (16 * M2_NW(DB))     /* weight rows a block */
#define M2_NP 16                /* slots a pass */
#define M2_QR(nsb) (256 * (nsb) + 32)
#define M2_SMEM(nsb) (M2_NP * M2_QR(nsb) + M2_NP * (nsb) * 20)

/* stage the pass's 16 activation rows (xrow[n], NULL: a zero row): codes reordered, then per
 * (row, superblock) the l / h bytes of the sub-block sums {l0-3, h0-3, l4-7, h4-7} and dx */
__device__ __forceinline__ void m2_stage(uint8_t *sm, int nsb, const KArgs &a, const uint8_t *const *xrow) {
  const int tid = threadIdx.x, nt = blockDim.x, QR = M2_QR(nsb), nu = 8 * nsb, tot = M2_NP * nu;
  constexpr int UB = 8; /* 32-byte runs a thread has in flight: the loads of a batch are issued before any use */
  for (int i0 = tid; i0 < tot; i0 += UB * nt) {
    uint4 p[UB], q[UB];
#pragma unroll
    for (int r = 0; r < UB; r++) {
      const int i = i0 + r * nt, n = i / nu, u = i % nu;
      const uint8_t *x = i < tot ? xrow[n] : nullptr;
      p[r] = q[r] = make_uint4(0, 0, 0, 0);
      if (x) {
        const uint4 *src = (const uint4 *)(x + 32 * (size_t)u);
        p[r] = src[0];
        q[r] = src[1];
      }
    }
#pragma unroll
    for (int r = 0; r < UB; r++) {
      const int i = i0 + r * nt, n = i / nu, u = i % nu;
      if (i >= tot) break;
      uint4 *dst = (uint4 *)(sm + n * QR + 32 * u);
      dst[0] = make_uint4(p[r].x, q[r].x, p[r].y, q[r].y);
      dst[1] = make_uint4(p[r].z, q[r].z, p[r].w, q[r].w);
    }
  }
  uint4 *lh = (uint4 *)(sm + M2_NP * QR);
  float *dd = (float *)(lh + M2_NP * nsb);
  for (int i = tid; i < M2_NP * nsb; i += nt) {
    const int n = i / nsb, k = i % nsb;
    const uint8_t *x = xrow[n];
    uint4 b0 = make_uint4(0, 0, 0, 0), b1 = b0;
    float dx = 0.0f;
    if (x) {
      const uint4 *bs = (const uint4 *)(x + a.off_s + 32 * (size_t)k);
      b0 = bs[0];
      b1 = bs[1];
      dx = ((const float *)(x + a.off_d))[k];
    }
    const uint32_t bw[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    uint32_t L[2] = {0, 0}, H[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int s = (int)(int16_t)(bw[j] & 0xFFFF) + (int)(int16_t)(bw[j] >> 16);
      L[j >> 2] |= (uint32_t)(s & 127) << (8 * (j & 3));
      H[j >> 2] |= (uint32_t)((s >> 7) & 0xFF) << (8 * (j & 3));
    }
    lh[i] = make_uint4(L[0], H[0], L[1], H[1]);
    dd[i] = dx;
  }
}

/* One superblock k of this thread's 8 outputs (n-tile j < nj, element e: weight row g + 8 (e / 2)
 * of the warp's 16, slot 8 j + 2 tq + e % 2 of the pass): the terms t = (float)S1 * (d * dx) -
 * (float)S2 * (dmin * dx); outputs of n-tiles past nj get 0 (never stored). */
template <int T>
__device__ __forceinline__ void m2_unit(const K4Row &w0, const K4Row &w1, const uint8_t *sm, int nsb, int k, int nj,
                                        float tv[8]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, QR = M2_QR(nsb);
  /* the 8 six-bit scales and mins of each row as bytes (get_scale_min_k4) */
  const uint32_t s0l = w0.h.y & 0x3F3F3F3Fu, s0h = (w0.h.w & 0x0F0F0F0Fu) | ((w0.h.y >> 2) & 0x30303030u);
  const uint32_t s1l = w1.h.y & 0x3F3F3F3Fu, s1h = (w1.h.w & 0x0F0F0F0Fu) | ((w1.h.y >> 2) & 0x30303030u);
  int S1[8];
#pragma unroll
  for (int o = 0; o < 8; o++) S1[o] = 0;
  const uint8_t *xq = sm + g * QR + 256 * k + 8 * tq;
#pragma unroll
  for (int t = 0; t < 8; t++) {
    const int c = 2 * (t >> 2) + (t & 1), hi = (t >> 1) & 1, sb = 2 * c + hi;
    const uint32_t a0 = k4_codes<T>(w0.lo[c], w0.qh0, c, hi), a1 = k4_codes<T>(w1.lo[c], w1.qh0, c, hi);
    const uint32_t a2 = k4_codes<T>(w0.hi[c], w0.qh1, c, hi), a3 = k4_codes<T>(w1.hi[c], w1.qh1, c, hi);
    const int sc0 = (int)(((sb < 4 ? s0l : s0h) >> (8 * (sb & 3))) & 0xFF);
    const int sc1 = (int)(((sb < 4 ? s1l : s1h) >> (8 * (sb & 3))) & 0xFF);
#pragma unroll
    for (int j = 0; j < 2; j++) {
      if (j >= nj) break;
      const uint2 b = *(const uint2 *)(xq + 8 * j * QR + 32 * t);
      int cc[4] = {0, 0, 0, 0};
      mma_s8(cc, a0, a1, a2, a3, b.x, b.y);
      S1[4 * j + 0] += sc0 * cc[0];
      S1[4 * j + 1] += sc0 * cc[1];
      S1[4 * j + 2] += sc1 * cc[2];
      S1[4 * j + 3] += sc1 * cc[3];
    }
  }
  /* S2: A = the mins (k 0..7 of rows g, g + 8; k 8..31 zero), B = l or h of the slot */
  const uint32_t m0l = w0.h.z & 0x3F3F3F3Fu, m0h = ((w0.h.w >> 4) & 0x0F0F0F0Fu) | ((w0.h.z >> 2) & 0x30303030u);
  const uint32_t m1l = w1.h.z & 0x3F3F3F3Fu, m1h = ((w1.h.w >> 4) & 0x0F0F0F0Fu) | ((w1.h.z >> 2) & 0x30303030u);
  const uint32_t ma0 = tq == 0 ? m0l : tq == 1 ? m0h : 0u, ma1 = tq == 0 ? m1l : tq == 1 ? m1h : 0u;
  const float d0 = mm_f16(w0.h.x & 0xFFFF), dm0 = mm_f16(w0.h.x >> 16);
  const float d1 = mm_f16(w1.h.x & 0xFFFF), dm1 = mm_f16(w1.h.x >> 16);
  const uint4 *lh = (const uint4 *)(sm + M2_NP * QR);
  const float *sd = (const float *)(lh + M2_NP * nsb);
#pragma unroll
  for (int j = 0; j < 2; j++) {
    if (j >= nj) {
#pragma unroll
      for (int e = 0; e < 4; e++) tv[4 * j + e] = 0.0f;
      continue;
    }
    uint2 v = *(const uint2 *)((const uint8_t *)(lh + (8 * j + g) * nsb + k) + 8 * (tq & 1));
    if (tq >= 2) v = make_uint2(0, 0);
    int P[4] = {0, 0, 0, 0}, Q[4] = {0, 0, 0, 0};
    mma_s8(P, ma0, ma1, 0u, 0u, v.x, 0u);
    mma_s8(Q, ma0, ma1, 0u, 0u, v.y, 0u);
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const float dx = sd[(8 * j + 2 * tq + u) * nsb + k];
      const int S2a = P[u] + 128 * Q[u], S2b = P[2 + u] + 128 * Q[2 + u];
      const float dd0 = d0 * dx, dmx0 = dm0 * dx, dd1 = d1 * dx, dmx1 = dm1 * dx;
      tv[4 * j + u] = (float)S1[4 * j + u] * dd0 - (float)S2a * dmx0;
      tv[4 * j + 2 + u] = (float)S1[4 * j + 2 + u] * dd1 - (float)S2b * dmx1;
    }
  }
}

/* the superblock of unit i (the order 0, 8, 1, 9, ... while pairs last, then the rest) */
__device__ __forceinline__ int m2_seq(int i, int nsb) {
  if (nsb <= 8) return i;
  const int np = nsb - 8;
  return i < 2 * np ? (i >> 1) + 8 * (i & 1) : i - np;
}

/* L2 prefetch of superblock k of the warp's rows (base: its first row, rows rb bytes apart, nr of
 * them exist): the first, middle and last byte of each row's block, so every line it touches */
template <int T>
__device__ __forceinline__ void m2_pf(const uint8_t *base, size_t rb, int nr, int k) {
  constexpr int BB = T == FLOE_TYPE_Q4_K ? 144 : 176;
  const int lane = threadIdx.x & 31;
  if ((lane & 15) >= nr) return;
  const uint8_t *p = base + (size_t)(lane & 15) * rb + (size_t)k * BB;
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p + (lane >> 4) * (BB - 1)));
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p + BB / 2));
}

/* This thread's 8 outputs of one matrix (rows row0 / row1; pf: its warp's first row, for the L2
 * prefetch) over the staged pass, into y. n0 / n1 hold superblock 0's words on entry; on exit
 * they hold superblock 0 of the rows f0 / f1 (the next matrix this thread computes; NULL: none). */
template <int T, bool PAIRS, bool DB>
__device__ __forceinline__ void m2_dot(const KArgs &a, const uint8_t *row0, const uint8_t *row1, const uint8_t *pf,
                                       int npf, K4Row &n0, K4Row &n1, const uint8_t *f0, const uint8_t *f1,
                                       const uint8_t *fpf, const uint8_t *sm, int nj, float y[8]) {
  const int nsb = (int)(a.cols / 256), tq = threadIdx.x & 3;
  float A0[8], A1[8], A2[8], A3[8];
  int ui = 0; /* units done */
#pragma unroll
  for (int k = 0; k < 8; k++) {
    float av[8];
    if (k < nsb) {
#pragma unroll
      for (int part = 0; part < 2; part++) {
        if (part == 1 && (!PAIRS || k + 8 >= nsb)) break;
        const int sbk = k + 8 * part;
        K4Row c0, c1;
        if constexpr (DB) {
          c0 = n0, c1 = n1;
          if (ui + 1 < nsb) { /* the next unit's words */
            const int nk = PAIRS ? m2_seq(ui + 1, nsb) : ui + 1;
            k4_load<T>(n0, row0, nk, tq);
            k4_load<T>(n1, row1, nk, tq);
          } else if (f0) {
            k4_load<T>(n0, f0, 0, tq);
            k4_load<T>(n1, f1, 0, tq);
          }
        } else {
          k4_load<T>(c0, row0, sbk, tq);
          k4_load<T>(c1, row1, sbk, tq);
        }
        if (ui + 2 < nsb) m2_pf<T>(pf, a.row_bytes, npf, PAIRS ? m2_seq(ui + 2, nsb) : ui + 2);
        else if (fpf) m2_pf<T>(fpf, a.row_bytes, npf, PAIRS ? m2_seq(ui + 2 - nsb, nsb) : ui + 2 - nsb);
        ui++;
        float tv[8];
        m2_unit<T>(c0, c1, sm, nsb, sbk, nj, tv);
        if (part == 0) {
#pragma unroll
          for (int o = 0; o < 8; o++) av[o] = 0.0f + tv[o];
        } else {
#pragma unroll
          for (int o = 0; o < 8; o++) av[o] = av[o] + (0.0f + tv[o]);
        }
      }
      if (!PAIRS || k + 8 >= nsb)
#pragma unroll
        for (int o = 0; o < 8; o++) av[o] = av[o] + 0.0f; /* a[k] = v[k] + v[k+8], v[k+8] = 0 */
    } else {
#pragma unroll
      for (int o = 0; o < 8; o++) av[o] = 0.0f + 0.0f; /* slots never written: 0 + 0 */
    }
    /* kred16: b[i] = a[i] + a[i+4], c[i] = b[i] + b[i+2], c[0] + c[1], formed as a[] arrives */
#pragma unroll
    for (int o = 0; o < 8; o++) {
      if (k == 0) A0[o] = av[o];
      else if (k == 1) A1[o] = av[o];
      else if (k == 2) A2[o] = av[o];
      else if (k == 3) A3[o] = av[o];
      else if (k == 4) A0[o] = A0[o] + av[o];
      else if (k == 5) A1[o] = A1[o] + av[o];
      else if (k == 6) {
        A2[o] = A2[o] + av[o];
        A0[o] = A0[o] + A2[o];
      } else {
        A3[o] = A3[o] + av[o];
        A1[o] = A1[o] + A3[o];
        y[o] = A0[o] + A1[o];
      }
    }
  }
}

template <int T, int MODE, bool DB>
__global__ void __launch_bounds__(32 * M2_NW(DB), M2_MINB(DB))
    k_k4mma2(KArgs a, KArgs a2, int K, const int32_t *__restrict__ grp, GrpLayout L, const uint8_t *__restrict__ xq,
             size_t xs, float *__restrict__ Y, int64_t ldy, int64_t nb) {
  PDL_ENTER();
  extern __shared__ __align__(16) uint8_t s_mma[];
  __shared__ const uint8_t *s_xrow[MMA_NT];
  __shared__ int64_t s_oid[MMA_NT];
  int e = 0, cnt;
  if constexpr (MODE == MM_PLAIN) {
    const int64_t b0 = (int64_t)blockIdx.y * MMA_NT;
    cnt = nb - b0 < MMA_NT ? (int)(nb - b0) : MMA_NT;
    if (threadIdx.x < MMA_NT) {
      const int64_t b = b0 + threadIdx.x;
      s_xrow[threadIdx.x] = b < nb ? xq + (size_t)b * xs : nullptr;
      s_oid[threadIdx.x] = b < nb ? b : -1;
    }
  } else {
    if ((int)blockIdx.y >= grp[0]) return; /* past the real tiles: uniform over the block */
    const int32_t *tl = grp + L.tiles + 3 * blockIdx.y;
    e = tl[0];
    const int first = tl[1];
    cnt = tl[2];
    if (threadIdx.x < MMA_NT) {
      const int n = threadIdx.x;
      const int64_t s = n < cnt ? grp[L.perm + first + n] : -1;
      s_oid[n] = s;
      s_xrow[n] = s >= 0 ? xq + (size_t)(MODE == MM_GLU ? s / K : s) * xs : nullptr;
    }
    if (e >= a.n_expert) { /* the out-of-range ids: NaN rows */
      __syncthreads();
      for (int i = threadIdx.x; i < MMA_NT * M2_MT(DB); i += blockDim.x) {
        const int n = i / M2_MT(DB);
        const int64_t r = (int64_t)blockIdx.x * M2_MT(DB) + i % M2_MT(DB);
        if (s_oid[n] >= 0 && r < a.rows) Y[s_oid[n] * ldy + r] = __int_as_float(0x7fc00000);
      }
      return;
    }
  }
  const int nsb = (int)(a.cols / 256);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t rbase = (int64_t)blockIdx.x * M2_MT(DB) + 16 * warp, rw = rbase + g;
  const bool live = rbase < a.rows; /* warps past the last row only stage */
  const int64_t r0 = rw < a.rows ? rw : a.rows - 1, r1 = rw + 8 < a.rows ? rw + 8 : a.rows - 1;
  const int npf = a.rows - rbase < 16 ? (int)(a.rows - rbase) : 16; /* the warp's rows, for the L2 prefetch */
  const uint8_t *g0 = mm_row(a, e, r0), *g1 = mm_row(a, e, r1), *gp = mm_row(a, e, live ? rbase : 0);
  const uint8_t *u0 = nullptr, *u1 = nullptr, *up = nullptr;
  if constexpr (MODE == MM_GLU) u0 = mm_row(a2, e, r0), u1 = mm_row(a2, e, r1), up = mm_row(a2, e, live ? rbase : 0);
  K4Row n0, n1;
  if (live) { /* the first superblock's words while the activations are staged */
    if constexpr (DB) {
      k4_load<T>(n0, g0, 0, tq);
      k4_load<T>(n1, g1, 0, tq);
    } else {
      m2_pf<T>(gp, a.row_bytes, npf, 0);
    }
    if (nsb > 1) m2_pf<T>(gp, a.row_bytes, npf, m2_seq(1, nsb));
  }
  const int npass = (cnt + M2_NP - 1) / M2_NP;
  for (int p = 0; p < npass; p++) {
    __syncthreads(); /* s_xrow written; the previous pass's readers done */
    m2_stage(s_mma, nsb, a, s_xrow + M2_NP * p);
    __syncthreads();
    if (!live) continue;
    const int rem = cnt - M2_NP * p, nj = rem > 8 ? 2 : 1;
    const bool more = p + 1 < npass;
    float y[8];
    if constexpr (MODE == MM_GLU) {
      float u[8];
      m2_dot<T, false, DB>(a, g0, g1, gp, npf, n0, n1, u0, u1, up, s_mma, nj, y); /* nsb <= 8 (mm_mma_fits) */
      m2_dot<T, false, DB>(a2, u0, u1, up, npf, n0, n1, more ? g0 : nullptr, g1, more ? gp : nullptr, s_mma, nj, u);
#pragma unroll
      for (int o = 0; o < 8; o++) y[o] = floe_siluf(y[o]) * u[o];
    } else {
      const uint8_t *f0 = more ? g0 : nullptr, *fp = more ? gp : nullptr;
      if (nsb > 8) m2_dot<T, true, DB>(a, g0, g1, gp, npf, n0, n1, f0, g1, fp, s_mma, nj, y);
      else m2_dot<T, false, DB>(a, g0, g1, gp, npf, n0, n1, f0, g1, fp, s_mma, nj, y);
    }
#pragma unroll
    for (int o = 0; o < 8; o++) {
      const int j = o >> 2, ee = o & 3;
      if (j >= nj) break;
      const int n = M2_NP * p + 8 * j + 2 * tq + (ee & 1);
      const int64_t r = rw + 8 * (ee >> 1), id = s_oid[n];
      if (id >= 0 && r < a.rows) Y[id * ldy + r] = y[o];
    }
  }
}

/* ---- k_k4mn: a few activation rows (a verify's, a small batch's) on the tensor cores ----
 *
 * The few-row dp4a kernel (k_k4wn, mm_k4.cu) forms every activation row's integer dots on its own:
 * at 4 rows the 35B-A3B shape's GatedDeltaNet input matrix took 16.9 us in a verify against 5.9 at
 * one row (issue-bound, 0.84 TB/s). Here the sub-blocks' integer dots of 16 weight rows x up to 8
 * activation rows come from one mma.sync m16n8k32 (exact, as k_k4mma's); S1, S2 and every float
 * operation after them are the CPU's, so the bits are the CPU's and k_k4wn's.
 *
 * A block: 16 weight rows (the mma's M) x 8 activation rows (its N; gridDim.y blocks of 8), NW
 * warps. kred16's slot i (the CPU's acc[i] = ((0 + t_i) + t_{i+16}) + ...) belongs to warp
 * i % NW, which sums its terms in that order, loading the next term's weight words while it forms
 * this one's; the 16 slots of each output meet in shared memory and one thread an output forms
 * the tree. B fragments (activation bytes) are read from global memory (L1): every block reads the
 * same few rows. A warp's first two weight loads wait on nothing: with pf, its superblocks of the
 * block's rows are prefetched into L2 before the wait (the previous kernel still running). */
#define MN_VP 9 /* s_v's padded row of 8 activation rows */

template <int T, int NW>
__global__ void __launch_bounds__(32 * NW) k_k4mn(KArgs a, int64_t nb, const uint8_t *__restrict__ xq, size_t xs,
                                                  MMOut o, int pf) {
  __shared__ float s_v[16][16][MN_VP];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int nsb = (int)(a.cols / 256);
  const int64_t ntile = (a.rows + 15) / 16;
  /* this lane's two weight rows of 16-row tile mt (the last row where the tile is short) */
  auto rows_of = [&](int64_t mt, const uint8_t *&p0, const uint8_t *&p1) {
    const int64_t rt = mt * 16;
    const int nr = a.rows - rt < 16 ? (int)(a.rows - rt) : 16;
    p0 = mm_row(a, 0, rt + (g < nr ? g : nr - 1));
    p1 = mm_row(a, 0, rt + (g + 8 < nr ? g + 8 : nr - 1));
  };
  if (pf)
    for (int64_t mt = blockIdx.x; mt < ntile; mt += gridDim.x) {
      const int nr = a.rows - mt * 16 < 16 ? (int)(a.rows - mt * 16) : 16;
      for (int i = warp; i < 16 && i < nsb; i += NW)
        for (int k = i; k < nsb; k += 16) m2_pf<T>(mm_row(a, 0, mt * 16), a.row_bytes, nr, k);
    }
  PDL_ENTER();
  const int64_t b0 = (int64_t)blockIdx.y * 8;
  const int nbt = nb - b0 < 8 ? (int)(nb - b0) : 8;
  /* this lane's B fragment row (g) and its two output rows (2 tq + u); NULL past the last */
  const uint8_t *xg = g < nbt ? xq + (size_t)(b0 + g) * xs : nullptr;
  const uint8_t *xu[2] = {2 * tq < nbt ? xq + (size_t)(b0 + 2 * tq) * xs : nullptr,
                          2 * tq + 1 < nbt ? xq + (size_t)(b0 + 2 * tq + 1) * xs : nullptr};
  const uint8_t *row0, *row1;
  rows_of(blockIdx.x, row0, row1);
  K4Row n0, n1;
  if (warp < nsb && (int64_t)blockIdx.x < ntile) {
    k4_load<T>(n0, row0, warp, tq);
    k4_load<T>(n1, row1, warp, tq);
  }
  for (int64_t mt = blockIdx.x; mt < ntile; mt += gridDim.x) { /* block-uniform */
    const int64_t rt = mt * 16;
    const int nr = a.rows - rt < 16 ? (int)(a.rows - rt) : 16;
    const bool more = mt + gridDim.x < ntile;
    const uint8_t *nx0 = row0, *nx1 = row1; /* the next tile's rows */
    if (more) rows_of(mt + gridDim.x, nx0, nx1);
    for (int i = warp; i < 16; i += NW) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* (row g | g + 8) x (activation row 2 tq | 2 tq + 1) */
      for (int k = i; k < nsb; k += 16) {
        const K4Row w0 = n0, w1 = n1;
        /* the next unit's words: this slot's next term, else the next slot's first, else the next
         * tile's first (warp-uniform) */
        if (k + 16 < nsb) {
          k4_load<T>(n0, row0, k + 16, tq);
          k4_load<T>(n1, row1, k + 16, tq);
        } else if (i + NW < 16 && i + NW < nsb) {
          k4_load<T>(n0, row0, i + NW, tq);
          k4_load<T>(n1, row1, i + NW, tq);
        } else if (more && warp < nsb) {
          k4_load<T>(n0, nx0, warp, tq);
          k4_load<T>(n1, nx1, warp, tq);
        }
        int S1[4] = {0, 0, 0, 0};
#pragma unroll
        for (int t = 0; t < 8; t++) {
          const int c = 2 * (t >> 2) + (t & 1), hi = (t >> 1) & 1, sb = 2 * c + hi;
          const uint32_t a0 = k4_codes<T>(w0.lo[c], w0.qh0, c, hi), a1 = k4_codes<T>(w1.lo[c], w1.qh0, c, hi);
          const uint32_t a2 = k4_codes<T>(w0.hi[c], w0.qh1, c, hi), a3 = k4_codes<T>(w1.hi[c], w1.qh1, c, hi);
          uint32_t bx0 = 0, bx1 = 0;
          if (xg) {
            const uint8_t *xb = xg + 256 * (size_t)k + 32 * t + 4 * tq;
            bx0 = *(const uint32_t *)xb;
            bx1 = *(const uint32_t *)(xb + 16);
          }
          int cc[4] = {0, 0, 0, 0};
          mma_s8(cc, a0, a1, a2, a3, bx0, bx1);
          const int sc0 = k4_scale(w0.h, sb), sc1 = k4_scale(w1.h, sb);
          S1[0] += sc0 * cc[0];
          S1[1] += sc0 * cc[1];
          S1[2] += sc1 * cc[2];
          S1[3] += sc1 * cc[3];
        }
        K4Hd hd;
        k4_hd(w0, w1, hd);
        const int *mn0 = hd.mn0, *mn1 = hd.mn1;
        const float d0 = hd.d0, dm0 = hd.dm0, d1 = hd.d1, dm1 = hd.dm1;
#pragma unroll
        for (int u = 0; u < 2; u++) {
          if (!xu[u]) continue;
          int S2a, S2b;
          k4_s2((const uint4 *)(xu[u] + a.off_s + 32 * (size_t)k), mn0, mn1, S2a, S2b);
          const float dx = ((const float *)(xu[u] + a.off_d))[k];
          const float dd0 = d0 * dx, dmx0 = dm0 * dx, dd1 = d1 * dx, dmx1 = dm1 * dx;
          const float t0 = (float)S1[u] * dd0 - (float)S2a * dmx0;
          const float t1 = (float)S1[2 + u] * dd1 - (float)S2b * dmx1;
          v[u] = v[u] + t0;
          v[2 + u] = v[2 + u] + t1;
        }
      }
#pragma unroll
      for (int u = 0; u < 2; u++) {
        s_v[i][g][2 * tq + u] = v[u];
        s_v[i][g + 8][2 * tq + u] = v[2 + u];
      }
    }
    __syncthreads();
    const int id = threadIdx.x; /* one output a thread: weight row id / 8, activation row id % 8 */
    if (id < 128) {
      const int r = id >> 3, n = id & 7;
      if (n < nbt && r < nr) {
        float av[8];
#pragma unroll
        for (int i = 0; i < 8; i++) av[i] = s_v[i][r][n] + s_v[i + 8][r][n];
        const float c0 = (av[0] + av[4]) + (av[2] + av[6]), c1 = (av[1] + av[5]) + (av[3] + av[7]);
        *mm_out(o, b0 + n, rt + r) = c0 + c1;
      }
    }
    __syncthreads(); /* s_v is read before the next tile writes it */
    row0 = nx0;
    row1 = nx1;
  }
}

template <int T, int MODE, bool DB>
void launch_mma2(const KArgs &a, const KArgs &a2, int K, const int32_t *grp, const GrpLayout &L, unsigned gy,
                 const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t nb, cudaStream_t st) {
  static bool attr = false;
  if (!attr) {
    cudaFuncSetAttribute(k_k4mma2<T, MODE, DB>, cudaFuncAttributeMaxDynamicSharedMemorySize, M2_SMEM(16));
    attr = true;
  }
  const unsigned gx = (unsigned)((a.rows + M2_MT(DB) - 1) / M2_MT(DB));
  pdl_launch(k_k4mma2<T, MODE, DB>, dim3(gx, gy), dim3(32 * M2_NW(DB)), (size_t)M2_SMEM(a.cols / 256), st, a, a2, K,
             grp, L, xq, xs, Y, ldy, nb);
}

template <int T, int MODE>
void launch_mma(const KArgs &a, const KArgs &a2, int K, const int32_t *grp, const GrpLayout &L, unsigned gy,
                const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t nb, cudaStream_t st) {
  if (mm_mma2_impl() == 1) {
    launch_mma2<T, MODE, true>(a, a2, K, grp, L, gy, xq, xs, Y, ldy, nb, st);
    return;
  }
  if (mm_mma2_impl() == 2) {
    launch_mma2<T, MODE, false>(a, a2, K, grp, L, gy, xq, xs, Y, ldy, nb, st);
    return;
  }
  static bool attr = false; /* the dynamic shared memory past 48 KiB, once per instantiation */
  if (!attr) {
    cudaFuncSetAttribute(k_k4mma<T, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, MMA_SMEM);
    attr = true;
  }
  const unsigned gx = (unsigned)((a.rows + MMA_MT - 1) / MMA_MT);
  pdl_launch(k_k4mma<T, MODE>, dim3(gx, gy), dim3(128), (size_t)MMA_SMEM, st, a, a2, K, grp, L, xq, xs, Y, ldy, nb);
}

/* k_k4mn's blocks: one per 16-row tile, at most what is resident at once over the gy block rows
 * (each then loops over tiles, so that every block prefetches before the wait: mm_grid_of) */
template <int T>
static void launch_mn(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st) {
  const int64_t ntile = (a.rows + 15) / 16;
  const unsigned gy = (unsigned)((nb + 7) / 8);
  const int pf = mm_pf_on() && (size_t)a.rows * a.row_bytes <= ((size_t)24 << 20);
  if (a.cols / 256 <= 8)
    pdl_launch(k_k4mn<T, 4>, dim3(mm_grid_of<k_k4mn<T, 4>, 32 * 4>(ntile, gy), gy), dim3(128), (size_t)0, st, a, nb, xq, xs, o, pf);
  else
    pdl_launch(k_k4mn<T, 8>, dim3(mm_grid_of<k_k4mn<T, 8>, 32 * 8>(ntile, gy), gy), dim3(256), (size_t)0, st, a, nb, xq, xs, o, pf);
}

/* A mode's tensor-core launch of weight type T (mm_mma_q4_launch / mm_mma_q5_launch): the group
 * layout of gslots slots and gnep experts (0, 0: none) */
template <int T>
void mma_launch_t(int mode, const KArgs &a, const KArgs &a2, int K, const int32_t *grp, int64_t gslots, int gnep,
                  unsigned gy, const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t nb, cudaStream_t st) {
  const GrpLayout L = grp_layout(gslots, gnep);
  if (mode == MM_PLAIN) launch_mma<T, MM_PLAIN>(a, a2, K, grp, L, gy, xq, xs, Y, ldy, nb, st);
  else if (mode == MM_GLU) launch_mma<T, MM_GLU>(a, a2, K, grp, L, gy, xq, xs, Y, ldy, nb, st);
  else launch_mma<T, MM_DOWN>(a, a2, K, grp, L, gy, xq, xs, Y, ldy, nb, st);
}

} // namespace

#endif
