/* What the attention kernels of ops_attn.cu (k_attn), ops_attn_rows.cu (k_attn_rows) and
 * ops_attn_tc.cu (k_attn_tc) share: the tile sizes, the K/V row loads, the rows kernels' subgroups
 * and their finish (the kernels' comments say how each works). Three files so that the three
 * compile in parallel. */
#ifndef FLOE_OPS_ATTN_CUH
#define FLOE_OPS_ATTN_CUH

#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

extern "C" {
#include "base/base.h"
}
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_rt.h"
#include "kernels/cuda/mm_act.cuh"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define ATT_THREADS 256
#define ATT_STAGES 4     /* cp.async pipeline depth (tiles) */
#define ATT_PAD 16       /* elements of padding per shared row: two half-warps reading two rows hit other banks */
#define ATT_CH 128       /* parts are multiples of this many positions (every TP divides it) */
#define ATT_MAX_SPLIT 256

static inline int attn_hd(int head_dim) { /* kernel head dim: the power of two >= head_dim, >= 16 */
  int h = 16;
  while (h < head_dim) h *= 2;
  return h;
}

/* positions per tile: ~32 KiB of K + V per stage, 16..128 */
static __host__ __device__ constexpr int att_tp(int hd, int es) {
  return 32768 / (2 * hd * es) > 128 ? 128 : (32768 / (2 * hd * es) < 16 ? 16 : 32768 / (2 * hd * es));
}
static __host__ __device__ constexpr size_t att_smem(int hd, int es) {
  return (size_t)ATT_STAGES * 2 * att_tp(hd, es) * (hd + ATT_PAD) * es;
}
/* k_attn's blocks per SM and pipeline depth: with head_dim 256, 2 or 4 heads a block keep their q
 * slices and sums in about 128 registers, so two blocks share an SM (16 warps, twice the latency
 * hiding of one 255-register block of 8 heads), each 3 stages deep to fit both in shared memory.
 * The stage count and the blocks per SM change no arithmetic: tiles and their order are the same. */
static __host__ __device__ constexpr int att_minb(int hb, int hd) { return hd == 256 && (hb == 2 || hb == 4) ? 2 : 1; }
static __host__ __device__ constexpr int att_stages(int hb, int hd) { return att_minb(hb, hd) > 1 ? 3 : ATT_STAGES; }
static __host__ __device__ constexpr size_t att_smem_hb(int hb, int hd, int es) {
  return (size_t)att_stages(hb, hd) * 2 * att_tp(hd, es) * (hd + ATT_PAD) * es;
}

/* Positions tp0 .. tp0 + npos - 1 of one kv head's K or V rows X into the staged rows xs (as
 * att_load_tile, one matrix) */
template <int HD, bool BF, int RB>
static __device__ __forceinline__ void att_load_rows(unsigned char *xs, const unsigned char *X, int64_t tp0, int npos,
                                                     int hd, bool exact) {
  constexpr int ES = BF ? 2 : 4;
  const int tid = threadIdx.x;
  if (exact) {
    constexpr int CPR = HD * ES / 16; /* 16-byte chunks per row */
    for (int e = tid; e < npos * CPR; e += ATT_THREADS) {
      const int p = e / CPR, ch = e % CPR;
      ops_cp16(xs + p * RB + ch * 16, X + (size_t)(tp0 + p) * HD * ES + (size_t)ch * 16);
    }
  } else {
    for (int e = tid; e < npos * HD; e += ATT_THREADS) {
      const int p = e / HD, d = e % HD;
      const size_t g = (size_t)(tp0 + p) * hd + d;
      if (BF) ((uint16_t *)(xs + p * RB))[d] = d < hd ? ((const uint16_t *)X)[g] : (uint16_t)0;
      else ((float *)(xs + p * RB))[d] = d < hd ? ((const float *)X)[g] : 0.0f;
    }
  }
}

/* Positions tp0 .. tp0 + npos - 1 of one kv head's K and V (K, V: its rows, hd elements each) into
 * a stage's K rows ks and V rows vs, RB bytes apart: with hd == HD (exact) 16-byte cp.async copies
 * straight from the cache, else element copies zero-padded to HD. Every thread of the block
 * (ATT_THREADS) takes part; k_attn and k_attn_rows load their tiles with it. */
template <int HD, bool BF, int RB>
static __device__ __forceinline__ void att_load_tile(unsigned char *ks, unsigned char *vs, const unsigned char *K,
                                                     const unsigned char *V, int64_t tp0, int npos, int hd,
                                                     bool exact) {
  att_load_rows<HD, BF, RB>(ks, K, tp0, npos, hd, exact);
  att_load_rows<HD, BF, RB>(vs, V, tp0, npos, hd, exact);
}

/* DPT (2 or 4) values of a staged V row vr from dimension d0 (bfloat16 or float), one vector load
 * (k_attn and k_attn_rows) */
template <bool BF, int DPT>
static __device__ __forceinline__ void att_vrow(const unsigned char *vr, int d0, float *vv) {
  if (BF) {
    if (DPT == 4) {
      const uint2 u = *(const uint2 *)(vr + d0 * 2);
      vv[0] = __uint_as_float(u.x << 16), vv[1] = __uint_as_float(u.x & 0xffff0000u);
      vv[DPT > 2 ? 2 : 0] = __uint_as_float(u.y << 16), vv[DPT > 3 ? 3 : 0] = __uint_as_float(u.y & 0xffff0000u);
    } else {
      const uint32_t u = *(const uint32_t *)(vr + d0 * 2);
      vv[0] = __uint_as_float(u << 16), vv[1] = __uint_as_float(u & 0xffff0000u);
    }
  } else {
    if (DPT == 4) {
      const float4 f = *(const float4 *)(vr + d0 * 4);
      vv[0] = f.x, vv[1] = f.y, vv[DPT > 2 ? 2 : 0] = f.z, vv[DPT > 3 ? 3 : 0] = f.w;
    } else {
      const float2 f = *(const float2 *)(vr + d0 * 4);
      vv[0] = f.x, vv[1] = f.y;
    }
  }
}

template <bool BF>
static __device__ __forceinline__ float att_cvt(const void *row, int i) {
  if (BF) return ops_bf16_to_f32(((const uint16_t *)row)[i]);
  return ((const float *)row)[i];
}

/* ops_fold16 of M values at once over a half-warp, by transposition: at the xor-MASK level a lane
 * keeps half of its values (the upper half where its MASK bit is set), sends the other half to its
 * partner and adds the partner's copy of the half it keeps; once one value is left, plain xor
 * levels finish. Every value takes ops_fold16's tree (level 8: v[l] + v[l + 8], then 4, 2, 1),
 * each add of the same two values (a + b == b + a in IEEE arithmetic, so which lane adds does not
 * matter): the same bits, in 15 shuffles for 16 values instead of 64. Lane l16 ends with value
 * l16 >> (4 - log2 M) in v[0]. */
template <int M, int MASK>
static __device__ __forceinline__ void att_fold_t(float *v, int l16) {
  if constexpr (MASK > 0) {
    if constexpr (M == 1) {
      v[0] = __fadd_rn(v[0], __shfl_xor_sync(0xffffffffu, v[0], MASK));
      att_fold_t<1, MASK / 2>(v, l16);
    } else {
      const bool up = (l16 & MASK) != 0;
#pragma unroll
      for (int p = 0; p < M / 2; p++) {
        const float send = up ? v[p] : v[p + M / 2], keep = up ? v[p + M / 2] : v[p];
        v[p] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, MASK));
      }
      att_fold_t<M / 2, MASK / 2>(v, l16);
    }
  }
}
static __host__ __device__ constexpr int att_log2(int m) { return m <= 1 ? 0 : 1 + att_log2(m / 2); }

#define ATR_QR 16 /* query rows (row, head) per block: their V sums are 4 * QR registers a thread */
#define ATR_QB 4  /* query rows per score pass of a thread (16 accumulators each) */

static __host__ __device__ constexpr int atr_rb(int hd, int es) { return hd * es + 16; } /* 16 B pad: conflict-free rows */
static __host__ __device__ constexpr size_t atr_max(size_t a, size_t b) { return a > b ? a : b; }
/* the pipeline stages, reused for the group sums and the combine's factors */
static __host__ __device__ constexpr size_t atr_union(int hd, int es) {
  return atr_max(atr_max((size_t)ATT_STAGES * 2 * att_tp(hd, es) * atr_rb(hd, es),
                         (size_t)(ATT_THREADS / (hd / (hd >= 64 ? 4 : 2)) - 1) * ATR_QR * hd * 4),
                 (size_t)2 * ATR_QR * ATT_MAX_SPLIT * 4);
}
/* + q [QR][HD] + scores [QR][TP] */
static __host__ __device__ constexpr size_t atr_smem(int hd, int es) {
  return atr_union(hd, es) + (size_t)ATR_QR * hd * 4 + (size_t)ATR_QR * att_tp(hd, es) * 4;
}

/* heads per block of the rows kernel: the largest divisor of the group <= QR; rows = QR / that */
static inline int atr_hbh(const cuda_attn_shape *sh) {
  const int G = sh->n_head / sh->n_head_kv;
  int h = G < ATR_QR ? G : ATR_QR;
  while (G % h) h--;
  return h;
}

/* The rows kernels' (k_attn_rows, k_attn_tc) subgroups: a block's rows r0 .. r1 - 1 share k_attn's
 * part size CH (it grows with np); part c of them runs over [p0, pend) (pend: the end of the part
 * or the np of the subgroup's last row; has = false when no row of theirs reaches part c).
 * np0: the np of the block's row 0. */
struct AtrSub {
  int64_t CH, p0, pend;
  int r1;
  bool has;
};
static __device__ __forceinline__ int64_t atr_ch(int64_t np, int n_split) {
  const int64_t per = (np + n_split - 1) / n_split;
  return (per + ATT_CH - 1) / ATT_CH * ATT_CH;
}
static __device__ __forceinline__ AtrSub atr_sub(int64_t np0, int r0, int nr, int c, int n_split) {
  AtrSub u;
  u.CH = atr_ch(np0 + r0, n_split);
  u.r1 = r0 + 1;
  while (u.r1 < nr && atr_ch(np0 + u.r1, n_split) == u.CH) u.r1++;
  const int64_t npmax = np0 + u.r1 - 1; /* np of the subgroup's last row */
  u.p0 = (int64_t)c * u.CH;
  u.has = u.p0 < npmax;
  u.pend = u.p0 + u.CH < npmax ? u.p0 + u.CH : npmax;
  return u;
}
/* query row i's positions in the tile at tp0 of TP (0: none; rows outside [i0, i1) have none): its
 * part ends at min(p0 + CH, np) */
static __device__ __forceinline__ int atr_tile_n(const AtrSub &u, int i, int i0, int i1, int HBH, int64_t np0,
                                                 int64_t tp0, int TP) {
  if (i < i0 || i >= i1) return 0;
  const int64_t np = np0 + i / HBH, e = u.p0 + u.CH < np ? u.p0 + u.CH : np;
  return e - tp0 <= 0 ? 0 : (int)(e - tp0 < TP ? e - tp0 : TP);
}
/* query row i (token t0 + i / HBH, head head0 + i % HBH) of the subgroup has part c */
static __device__ __forceinline__ bool atr_has_part(const AtrSub &u, int i, int i0, int i1, int HBH, int64_t np0) {
  return i >= i0 && i < i1 && u.p0 < np0 + i / HBH;
}
/* query row i's parts in the scratch: n_split of HD + 4 floats (o, m, l, padding) each */
static __device__ __forceinline__ float *atr_parts(float *part, int t0, int i, int HBH, int nh, int head0,
                                                   int n_split, int HD) {
  return part + ((size_t)(t0 + i / HBH) * nh + head0 + i % HBH) * n_split * ((size_t)HD + 4);
}

/* The end of a rows kernel's block (k_attn_rows, k_attn_tc): count the block done; the last block
 * of its (row group, kv head batch) combines each of the nq query rows' parts (k_attn's combine:
 * the parts' maxima, their weights in part order, the sum divided, sigmoid(gate)) and writes out.
 * sm: at least 2 * nq * ATT_MAX_SPLIT floats of shared memory no longer in use. */
/* qo (kind >= 0): the block's output values of its rows r0 .. r1 - 1 (heads head0 .. head0 + HBH - 1
 * of row t0 + r), quantized for the next matmul from x (row r's values at x + r * xrs: out, written
 * by this block before a barrier, or staged in shared memory); the host checked that they are
 * whole chunks (A256) / units (A32) of the row */
static __device__ __forceinline__ void atr_quant(const ActOut &qo, const float *x, size_t xrs, int r0, int r1, int t0,
                                                 int head0, int HBH, int hd) {
  for (int r = r0; r < r1; r++)
    act_out_range(qo, qo.xq + (size_t)(t0 + r) * qo.xs, (int64_t)head0 * hd, x + (size_t)r * xrs, HBH * hd);
}
/* atr_quant of a block's nr rows from out (row t: nh * hd values) */
static __device__ __forceinline__ void atr_quant_out(const ActOut &qo, const float *out, int nr, int t0, int head0,
                                                     int HBH, int nh, int hd) {
  atr_quant(qo, out + ((size_t)t0 * nh + head0) * hd, (size_t)nh * hd, 0, nr, t0, head0, HBH, hd);
}

template <int HD>
static __device__ void atr_finish(unsigned char *sm, const float *part, int *cnt, const float *q, float *out, int nq,
                                  int HBH, int t0, int head0, int64_t base, int n_split, int nh, int hd, int gated,
                                  const ActOut &qo) {
  __shared__ float s_inv[32];
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qs_row = hd * (gated ? 2 : 1);
  const size_t PF = (size_t)HD + 4;
  __threadfence();
  __syncthreads();
  int *ctr = cnt + (size_t)blockIdx.x * gridDim.y + blockIdx.y;
  if (tid == 0) s_last = atomicAdd(ctr, 1) == n_split - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  float *fq = (float *)sm, *flq = fq + nq * ATT_MAX_SPLIT; /* [nq][ATT_MAX_SPLIT] each */
  auto nparts_of = [&](int i) { /* k_attn's parts of the row */
    const int64_t np = base + t0 + i / HBH + 1, ch = atr_ch(np, n_split);
    return (int)((np + ch - 1) / ch);
  };
  auto parts_of = [&](int i) { return (const float *)atr_parts((float *)part, t0, i, HBH, nh, head0, n_split, HD); };
  for (int i = warp; i < nq; i += ATT_THREADS / 32) { /* k_attn's combine, per query row */
    const int nparts = nparts_of(i);
    const float *P = parts_of(i);
    float *f = fq + i * ATT_MAX_SPLIT, *fl = flq + i * ATT_MAX_SPLIT;
    float M = -INFINITY;
    for (int cc = lane; cc < nparts; cc += 32) M = fmaxf(M, __ldcg(P + (size_t)cc * PF + HD));
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, s));
    for (int cc = lane; cc < nparts; cc += 32) {
      const float fc = floe_vexpf(__fsub_rn(__ldcg(P + (size_t)cc * PF + HD), M));
      f[cc] = fc;
      fl[cc] = __fmul_rn(fc, __ldcg(P + (size_t)cc * PF + HD + 1));
    }
    __syncwarp();
    if (lane == 0) {
      float L = 0.0f;
      for (int cc = 0; cc < nparts; cc++) L = __fadd_rn(L, fl[cc]);
      s_inv[i] = L;
    }
  }
  __syncthreads();
  for (int e = 4 * tid; e < nq * HD; e += 4 * ATT_THREADS) {
    const int i = e / HD, d = e % HD, nparts = nparts_of(i);
    const float *P = parts_of(i), *f = fq + i * ATT_MAX_SPLIT;
    float O[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll 8
    for (int cc = 0; cc < nparts; cc++) {
      const float4 pv = __ldcg((const float4 *)(P + (size_t)cc * PF + d));
      const float fc = f[cc];
      O[0] = __fadd_rn(O[0], __fmul_rn(fc, pv.x));
      O[1] = __fadd_rn(O[1], __fmul_rn(fc, pv.y));
      O[2] = __fadd_rn(O[2], __fmul_rn(fc, pv.z));
      O[3] = __fadd_rn(O[3], __fmul_rn(fc, pv.w));
    }
    const int64_t t = t0 + i / HBH;
    const int head = head0 + i % HBH;
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (d + u >= hd) continue;
      float r = O[u] / s_inv[i];
      if (gated) r = __fmul_rn(r, floe_sigmoidf(q[(t * nh + head) * qs_row + hd + d + u]));
      out[(t * nh + head) * hd + d + u] = r;
    }
  }
  if (tid == 0) *ctr = 0; /* ready for the next launch (graph replay) */
  if (qo.kind >= 0) {
    __syncthreads();
    atr_quant_out(qo, out, nq / HBH, t0, head0, HBH, nh, hd);
  }
}

/* ops_attn_tc.cu: k_attn_tc's launch for the row count (q NULL: only its shared-memory
 * attribute, at setup), and the reading of its switches from the environment at setup */
int attn_tc_dispatch(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc, const int32_t *pos0,
                     int64_t n_tok, float *out, float *part, int *cnt, const ActOut &qo, void *stream);
void attn_tc_env(void);
/* ops_attn_rows.cu: k_attn_rows' launch (bfloat16 or float cache as sh says; q NULL: only its
 * shared-memory attribute, at setup) */
int attn_rows_launch(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc, const int32_t *pos0,
                     int64_t n_tok, float *out, float *part, int *cnt, void *stream);

#endif
