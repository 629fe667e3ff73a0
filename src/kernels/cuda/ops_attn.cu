/* Full attention on the GPU (cuda_ops.h): the per-head q/k RMSNorm + NeoX RoPE + KV-cache write
 * (cuda_attn_prep), and split-K flash-decoding attention over the cache with the combine and the
 * sigmoid output gate in the same launch (cuda_attn). Two kernels give the same bits per row:
 * k_attn (below; decode, and prefill with FLOE_CUDA_ATTN_ROWS=0) runs each row in its own blocks;
 * k_attn_rows (prefill launches of >= 8 rows) runs a block per group of rows and streams each K/V
 * tile once for all of them (its own comment, further down, says why the bits are k_attn's).
 *
 * cuda_attn: block (part c, kv head kh / head batch, row t), 256 threads, HB query heads of the
 * group at once so each K/V row is read once for them (HB = 1 where a block per head fits in one
 * wave: attn_hb_for; the same bits). Row t sees np = *pos0 + t + 1 positions,
 * cut into parts of CH = roundup128(ceil(np / n_split)) positions: the cut depends only on np, so
 * a prefill row and the decode of the same position run the same arithmetic (bit-identical).
 *   - K/V tiles of TP positions stream into shared memory through cp.async, ATT_STAGES deep:
 *     the loads of the next tiles are in flight while a tile is computed (the earlier version
 *     loaded K and V straight into registers between barriers and reached ~0.85 TB/s).
 *   - Scores: a half-warp per position, lane l holds q[l + 16 j] in registers and computes the
 *     CPU's kern_dot16_rows lane (fmaf over j), then the fixed 16-lane tree: the CPU's bits,
 *     times the scale.
 *   - Softmax and V sum: online softmax per tile (running maximum, vexpf); V summed with fmaf in
 *     position order per thread position group, 4 dims a thread; the part's (o, max, sum) go to
 *     scratch. Not the CPU's single pass (which normalises before summing): rounding differs.
 *   - The last block of a (row, kv head batch) to finish (a counter in scratch, reset by it)
 *     combines the parts in part order, divides, applies sigmoid(gate), writes out.
 * Parts past the row's length only count themselves done.
 * head_dim: kernels for HD = 16, 32, 64, 128, 256; another head_dim runs the next larger one with
 * the rows zero-padded (loaded without cp.async). The padded lanes add fmaf(0, 0, acc) terms, which
 * change no score; but the CPU scores a head_dim that is not a multiple of 16 with one sequential
 * fmaf chain, so there the scores differ from the CPU's by rounding. */
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

static int attn_hd(int head_dim) { /* kernel head dim: the power of two >= head_dim, >= 16 */
  int h = 16;
  while (h < head_dim) h *= 2;
  return h;
}
static int attn_hb(const cuda_attn_shape *sh) { /* query heads per block: a power of two dividing the group */
  const int G = sh->n_head / sh->n_head_kv, cap = 2048 / attn_hd(sh->head_dim);
  int hb = 1;
  while (hb * 2 <= cap && G % (hb * 2) == 0 && hb * 2 <= 8) hb *= 2;
  return hb;
}

/* The heads a launch gives each block. A head's arithmetic does not depend on how many heads share
 * its block (scores, softmax, V sums and the combine are per head, in the same order), so this
 * choice changes no bit. attn_hb's batches read each K/V row once for HB heads, which pays when
 * the grid is large; when one block per query head still fits in a wave (decode at a short
 * context: 1 x 2 blocks of 8 heads otherwise), a block per head cuts the serial work of each block
 * HB-fold. cuda_attn_set_spread(0) / FLOE_CUDA_ATTN_SPREAD=0 keep attn_hb always. */
static int g_attn_spread = -1, g_attn_nsm = 0, g_attn_hbmax = -1;

/* attn_hb within FLOE_CUDA_ATTN_HB / cuda_attn_set_hb */
static int attn_hb_capped(const cuda_attn_shape *sh) {
  if (g_attn_hbmax < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_HB");
    g_attn_hbmax = e && e[0] ? atoi(e) : 8;
  }
  int hb = attn_hb(sh);
  while (hb > 1 && hb > g_attn_hbmax) hb /= 2;
  return hb;
}

/* the current device's SM count, read once (0 when it cannot be asked) */
static int attn_nsm(void) {
  if (g_attn_nsm <= 0) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
      g_attn_nsm = n;
    else
      (void)cudaGetLastError();
  }
  return g_attn_nsm;
}

static int attn_hb_for(const cuda_attn_shape *sh, int64_t n_tok) {
  if (g_attn_spread < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_SPREAD");
    g_attn_spread = !(e && e[0] == '0');
  }
  const int nsm = attn_nsm();
  if (g_attn_spread && nsm > 0 && n_tok * sh->n_split * (int64_t)sh->n_head <= nsm) return 1;
  return attn_hb_capped(sh);
}

extern "C" void cuda_attn_set_spread(int on) { g_attn_spread = on ? 1 : 0; }
extern "C" void cuda_attn_set_hb(int hb_max) { g_attn_hbmax = hb_max < 1 ? 1 : hb_max; }
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
static int attn_set_smem(const cuda_attn_shape *sh);

extern "C" int cuda_attn_check(const cuda_attn_shape *sh, char *err, size_t errlen) {
  if (sh->head_dim < 1 || sh->head_dim > 256)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda attention: head_dim %d (1..256 supported)", sh->head_dim);
  if (sh->n_head_kv <= 0 || sh->n_head <= 0 || sh->n_head % sh->n_head_kv)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda attention: %d heads over %d kv heads (must divide)",
                    sh->n_head, sh->n_head_kv);
  if (sh->n_rot < 0 || sh->n_rot % 2 || sh->n_rot > sh->head_dim)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda attention: n_rot %d (even, <= head_dim %d)", sh->n_rot,
                    sh->head_dim);
  if (sh->n_split < 1 || sh->n_split > ATT_MAX_SPLIT)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda attention: n_split %d (1..%d)", sh->n_split, ATT_MAX_SPLIT);
  if (sh->n_ctx <= 0 || sh->n_ctx > INT32_MAX)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda attention: n_ctx %lld", (long long)sh->n_ctx);
  /* the kernel's shared memory above 48 KiB needs an opt-in: done here, at setup, so that no
   * attribute call happens inside a graph capture (the launcher repeats it only if this failed) */
  if (cuda_rt_device_count() > 0) (void)attn_hb_for(sh, 1); /* the SM count read now, not inside a capture */
  if (cuda_rt_device_count() > 0 && attn_set_smem(sh))
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda attention: the device refused %zu bytes of shared memory",
                    att_smem(attn_hd(sh->head_dim), sh->kv_bf16 ? 2 : 4));
  return 0;
}

extern "C" int cuda_attn_split_hint(const cuda_attn_shape *sh, int n_sm) {
  if (n_sm <= 0 && (n_sm = attn_nsm()) <= 0) return 0;
  const int blocks = sh->n_head_kv * (sh->n_head / sh->n_head_kv / attn_hb_capped(sh));
  int s = n_sm / (blocks > 0 ? blocks : 1);
  return s < 1 ? 1 : (s > ATT_MAX_SPLIT ? ATT_MAX_SPLIT : s);
}

/* a part: o[HD], m, l, 2 floats of padding (16-byte aligned rows for the combine's float4 loads) */
static size_t part_floats(const cuda_attn_shape *sh) { return (size_t)attn_hd(sh->head_dim) + 4; }

/* The completion counters come first, one per (row, head) for ATT_CNT_ROWS rows whatever the
 * launch's rows: then no launch of up to ATT_CNT_ROWS rows writes its parts where another launch
 * keeps counters (a prefill chunk after a decode step finds its counters at zero, not over the
 * decode's parts). A launch uses at most one per (row, head): k_attn one per (row, block of heads),
 * k_attn_rows one per (group of rows, block of heads). */
#define ATT_CNT_ROWS 512
static size_t attn_cnt_bytes(const cuda_attn_shape *sh, int64_t n_tok) {
  const int64_t n = n_tok > ATT_CNT_ROWS ? n_tok : ATT_CNT_ROWS;
  return ((size_t)n * (size_t)sh->n_head * sizeof(int) + 255) / 256 * 256;
}

extern "C" size_t cuda_attn_scratch_bytes(const cuda_attn_shape *sh, int64_t n_tok) {
  /* parts: one per (row, head, split) whatever the heads per block */
  const size_t parts = (size_t)n_tok * (size_t)sh->n_head * (size_t)sh->n_split * part_floats(sh) * sizeof(float);
  return attn_cnt_bytes(sh, n_tok) + parts;
}

/* ---- prep: q/k norm + RoPE, K/V into the cache ---- */
/* block (row t, head hh): hh < n_head a query head (in place), else kv head hh - n_head (k normed and
 * rotated into the K cache, v copied into the V cache). blockDim = head_dim rounded up to a whole
 * warp (the sumsq16 warp needs all 32 lanes); threads i >= head_dim only take part in barriers. */
static __global__ void __launch_bounds__(256)
    k_attn_prep(float *q, const float *k, const float *v, const float *qn, const float *kn, const float *cs,
                void *kc, void *vc, const int32_t *pos0, int nh, int nkv, int hd, int n_rot, int gated,
                int64_t n_ctx, int bf16, float eps, int prew) {
  const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
  const bool in = i < hd, isq = hh < nh;
  /* the norm's weight: the model's, so before the wait when prew (pdl.cuh, cuda_rt_prew) */
  float wn = (prew & 1) && in ? (isq ? qn : kn)[i] : 0.0f;
  PDL_ENTER();
  __shared__ float xs[256];
  __shared__ float rs;
  const int64_t pos = (int64_t)*pos0 + t;
  if (pos < 0 || pos >= n_ctx) return; /* the caller's bug; never write outside the cache */
  const int kh = hh - nh;
  const int64_t qdim = (int64_t)nh * hd * (gated ? 2 : 1), kvd = (int64_t)nkv * hd;
  float *qh = isq ? q + t * qdim + (int64_t)hh * hd * (gated ? 2 : 1) : NULL;
  const float *src = isq ? qh : k + t * kvd + (int64_t)kh * hd;
  if (!(prew & 1) && in) wn = (isq ? qn : kn)[i];
  /* this thread's two rope factors, loaded now beside its value (rope_head's c[i] and c[h2 + i]
   * for i < h2, c[i - h2] and c[i] for h2 <= i < n_rot) */
  const int h2 = n_rot / 2;
  const float *c = cs + pos * n_rot;
  const float c0 = i < h2 ? c[i] : i < n_rot ? c[i - h2] : 0.0f;
  const float c1 = i < h2 ? c[h2 + i] : i < n_rot ? c[i] : 0.0f;
  if (in) xs[i] = src[i];
  __syncthreads();
  if (i < 32) {
    const float ss = ops_sumsq16_warp(xs, hd);
    if (i == 0) rs = 1.0f / sqrtf(__fadd_rn(ss / (float)hd, eps));
  }
  __syncthreads();
  const float y = in ? __fmul_rn(__fmul_rn(xs[i], rs), wn) : 0.0f;
  __syncthreads();
  if (in) xs[i] = y;
  __syncthreads();
  if (!in) return;
  float o = y;
  if (i < h2) /* x[j] = a*c - b*s; x[j+h] = b*c + a*s (rope_head) */
    o = __fsub_rn(__fmul_rn(xs[i], c0), __fmul_rn(xs[i + h2], c1));
  else if (i < n_rot)
    o = __fadd_rn(__fmul_rn(xs[i], c0), __fmul_rn(xs[i - h2], c1));
  if (isq) {
    qh[i] = o;
    return;
  }
  const int64_t at = ((int64_t)kh * n_ctx + pos) * hd + i;
  const float vv = v[t * kvd + (int64_t)kh * hd + i];
  if (bf16) {
    ((uint16_t *)kc)[at] = ops_f32_to_bf16(o);
    ((uint16_t *)vc)[at] = ops_f32_to_bf16(vv);
  } else {
    ((float *)kc)[at] = o;
    ((float *)vc)[at] = vv;
  }
}

extern "C" void cuda_attn_prep(const cuda_attn_shape *sh, float *q, const float *k, const float *v,
                               const float *q_norm, const float *k_norm, const float *rope_cs, void *kcache,
                               void *vcache, const int32_t *pos0, int64_t n_tok, void *stream) {
  if (n_tok <= 0) return;
  dim3 grid((unsigned)n_tok, (unsigned)(sh->n_head + sh->n_head_kv));
  const int nt = (sh->head_dim + 31) / 32 * 32;
  pdl_launch(k_attn_prep, dim3(grid), dim3(nt), (size_t)(0), OPS_STREAM(stream), q, k, v, q_norm, k_norm, rope_cs, kcache, vcache, pos0,
                                                   sh->n_head, sh->n_head_kv, sh->head_dim, sh->n_rot,
                                                   sh->gated, sh->n_ctx, sh->kv_bf16, sh->eps, cuda_rt_prew());
}

/* ---- attention ---- */

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

/* HB query heads per block, HD the kernel's head dim (hd <= HD the real one), BF: bfloat16 cache.
 * FT: the scores' 16-lane folds transposed (att_fold_t, the same bits; FLOE_CUDA_ATTN_FOLDT). */
template <int HB, int HD, bool BF, bool FT = false>
static __global__ void __launch_bounds__(ATT_THREADS, att_minb(HB, HD))
    k_attn(const float *q, const void *kc, const void *vc, const int32_t *pos0, float *out, float *part, int *cnt,
           int nh, int nkv, int hd, int64_t n_ctx, int gated, int n_split, float scale) {
  PDL_ENTER();
  constexpr int ES = BF ? 2 : 4;
  constexpr int TP = att_tp(HD, ES);
  constexpr int RS = HD + ATT_PAD;          /* shared row stride, elements */
  constexpr int RB = RS * ES;               /* bytes */
  constexpr int TB = TP * RB;               /* one tile of K (or V) */
  constexpr int LPT = HD / 16;              /* score lanes: elements per lane */
  constexpr int DPT = HD >= 64 ? 4 : 2;     /* V sum: dims per thread */
  constexpr int ND = HD / DPT, NPG = ATT_THREADS / ND; /* dim groups, position groups */
  constexpr int ST = att_stages(HB, HD);      /* cp.async pipeline depth (tiles) */
  static_assert((size_t)(NPG - 1) * HB * HD * 4 <= att_smem_hb(HB, HD, ES), "group sums alias the tile stages");
  extern __shared__ __align__(16) unsigned char att_sm[];
  __shared__ __align__(16) float sc[TP][HB];
  __shared__ float s_alpha[HB], s_m[HB], s_l[HB];
  __shared__ int s_last;
  const int tid = threadIdx.x, lane16 = tid & 15, hw = tid >> 4, warp = tid >> 5, lane = tid & 31;
  const int G = nh / nkv, nhb = G / HB;
  const int c = blockIdx.x, y = blockIdx.y, t = blockIdx.z;
  const int kh = y / nhb, head0 = kh * G + (y % nhb) * HB;
  const int64_t np = (int64_t)*pos0 + t + 1;
  const int64_t per = (np + n_split - 1) / n_split, CH = (per + ATT_CH - 1) / ATT_CH * ATT_CH;
  const int nparts = (int)((np + CH - 1) / CH);
  const int64_t p0 = (int64_t)c * CH, p1 = p0 + CH < np ? p0 + CH : np;
  const int qs = hd * (gated ? 2 : 1);
  const int64_t qrow = (int64_t)t * nh * qs;
  const size_t PF = (size_t)HD + 4; /* part_floats */
  const bool exact = hd == HD; /* rows straight from the cache with cp.async; else zero-padded copies */
  /* part (t, y, c) holds HB heads: o[HB][HD], then m[HB], l[HB] */
  float *mypart = part + (((size_t)t * gridDim.y + y) * n_split + c) * HB * PF;
  const unsigned char *K = (const unsigned char *)kc + (size_t)kh * n_ctx * hd * ES;
  const unsigned char *V = (const unsigned char *)vc + (size_t)kh * n_ctx * hd * ES;

  if (p0 < np) {
    const int ntiles = (int)((p1 - p0 + TP - 1) / TP);
    /* tile i into stage st: K rows then V rows */
    auto issue = [&](int i, int st) {
      const int64_t tp0 = p0 + (int64_t)i * TP;
      unsigned char *ks = att_sm + (size_t)st * 2 * TB;
      att_load_tile<HD, BF, RB>(ks, ks + TB, K, V, tp0, (int)(p1 - tp0 < TP ? p1 - tp0 : TP), hd, exact);
    };
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
      if (s < ntiles) issue(s, s);
      ops_cp_commit();
    }
    float qr[HB][LPT];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
      for (int j = 0; j < LPT; j++) {
        const int d = lane16 + 16 * j;
        qr[h][j] = d < hd ? q[qrow + (int64_t)(head0 + h) * qs + d] : 0.0f;
      }
    const int dg = tid % ND, pg = tid / ND, d0 = DPT * dg;
    float o[HB][DPT];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
      for (int u = 0; u < DPT; u++) o[h][u] = 0.0f;
    if (tid < HB) {
      s_m[tid] = -INFINITY;
      s_l[tid] = 0.0f;
    }
    for (int it = 0; it < ntiles; it++) {
      ops_cp_wait<ST - 2>();
      __syncthreads(); /* tile it landed for every thread; everyone is done with tile it - 1 */
      if (it + ST - 1 < ntiles) issue(it + ST - 1, (it + ST - 1) % ST);
      ops_cp_commit();
      const int64_t tp0 = p0 + (int64_t)it * TP;
      const int npos = (int)(p1 - tp0 < TP ? p1 - tp0 : TP);
      const unsigned char *ks = att_sm + (size_t)(it % ST) * 2 * TB, *vs = ks + TB;
      /* scores: a half-warp per position, two positions per pass */
      for (int pb = 0; pb < npos; pb += 32) {
        const int pa = pb + hw, pbb = pb + 16 + hw;
        const unsigned char *ra = ks + (pa < TP ? pa : 0) * RB, *rb = ks + (pbb < TP ? pbb : 0) * RB;
        float aa[HB], ab[HB];
#pragma unroll
        for (int h = 0; h < HB; h++) aa[h] = ab[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < LPT; j++) {
          const float ka = att_cvt<BF>(ra, lane16 + 16 * j), kb = att_cvt<BF>(rb, lane16 + 16 * j);
#pragma unroll
          for (int h = 0; h < HB; h++) {
            aa[h] = fmaf(qr[h][j], ka, aa[h]);
            ab[h] = fmaf(qr[h][j], kb, ab[h]);
          }
        }
        if constexpr (FT) {
          /* value 2h + 1 is position pbb's head h, 2h position pa's: lane l16 ends with one */
          constexpr int NV = 2 * HB, SH = 4 - att_log2(NV);
          float v[NV];
#pragma unroll
          for (int h = 0; h < HB; h++) v[2 * h] = aa[h], v[2 * h + 1] = ab[h];
          att_fold_t<NV, 8>(v, lane16);
          const int J = lane16 >> SH, h = J >> 1, p = J & 1 ? pbb : pa;
          if ((lane16 & ((1 << SH) - 1)) == 0 && p < npos) sc[p][h] = __fmul_rn(v[0], scale);
        } else {
#pragma unroll
          for (int h = 0; h < HB; h++) {
            const float fa = ops_fold16(aa[h]), fb = ops_fold16(ab[h]);
            if (lane16 == 0) {
              if (pa < npos) sc[pa][h] = __fmul_rn(fa, scale);
              if (pbb < npos) sc[pbb][h] = __fmul_rn(fb, scale);
            }
          }
        }
      }
      __syncthreads();
      /* online softmax per head: warp w takes heads w, w + 8, ... */
      for (int h = warp; h < HB; h += ATT_THREADS / 32) {
        float mt = -INFINITY;
        for (int p = lane; p < npos; p += 32) mt = fmaxf(mt, sc[p][h]);
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, s));
        const float mo = s_m[h], mn = fmaxf(mo, mt);
        float lt = 0.0f;
        for (int p = lane; p < npos; p += 32) {
          const float e = floe_vexpf(__fsub_rn(sc[p][h], mn));
          sc[p][h] = e;
          lt = __fadd_rn(lt, e);
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) lt = __fadd_rn(lt, __shfl_xor_sync(0xffffffffu, lt, s));
        __syncwarp();
        if (lane == 0) {
          const float al = floe_vexpf(__fsub_rn(mo, mn));
          s_alpha[h] = al;
          s_m[h] = mn;
          s_l[h] = __fadd_rn(__fmul_rn(s_l[h], al), lt);
        }
      }
      __syncthreads();
      /* o = o * alpha + sum_p e_p v_p (fmaf in position order within the group) */
#pragma unroll
      for (int h = 0; h < HB; h++) {
        const float al = s_alpha[h];
#pragma unroll
        for (int u = 0; u < DPT; u++) o[h][u] = __fmul_rn(o[h][u], al);
      }
#pragma unroll 2
      for (int p = pg; p < npos; p += NPG) {
        float vv[DPT];
        att_vrow<BF, DPT>(vs + p * RB, d0, vv);
        float e[HB];
#pragma unroll
        for (int h = 0; h < HB; h++) e[h] = sc[p][h];
#pragma unroll
        for (int h = 0; h < HB; h++)
#pragma unroll
          for (int u = 0; u < DPT; u++) o[h][u] = fmaf(e[h], vv[u], o[h][u]);
      }
    }
    ops_cp_wait<0>();
    __syncthreads(); /* every tile consumed: the stages are free for the group sums */
    /* the position groups' sums, in group order */
    float *red = (float *)att_sm; /* [NPG - 1][HB][HD] */
    if (NPG > 1) {
      if (pg > 0)
#pragma unroll
        for (int h = 0; h < HB; h++)
#pragma unroll
          for (int u = 0; u < DPT; u++) red[((size_t)(pg - 1) * HB + h) * HD + d0 + u] = o[h][u];
      __syncthreads();
      if (pg == 0)
        for (int g = 1; g < NPG; g++)
#pragma unroll
          for (int h = 0; h < HB; h++)
#pragma unroll
            for (int u = 0; u < DPT; u++) o[h][u] = __fadd_rn(o[h][u], red[((size_t)(g - 1) * HB + h) * HD + d0 + u]);
    }
    if (pg == 0)
#pragma unroll
      for (int h = 0; h < HB; h++)
#pragma unroll
        for (int u = 0; u < DPT; u++) mypart[h * PF + d0 + u] = o[h][u];
    if (tid < HB) {
      mypart[tid * PF + HD] = s_m[tid];
      mypart[tid * PF + HD + 1] = s_l[tid];
    }
  }
  /* completion count; the last block combines */
  __threadfence();
  __syncthreads();
  int *ctr = cnt + (size_t)t * gridDim.y + y;
  if (tid == 0) s_last = atomicAdd(ctr, 1) == n_split - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const float *P = part + ((size_t)t * gridDim.y + y) * n_split * HB * PF;
  __shared__ float f[HB][ATT_MAX_SPLIT];
  __shared__ float s_inv[HB];
  /* the combine reads nparts * HB * HD floats from L2 in one block: loads are issued many at a
   * time (float4, parts unrolled), the sums still run in part order */
  __shared__ float fl[HB][ATT_MAX_SPLIT];
  for (int h = warp; h < HB; h += ATT_THREADS / 32) {
    float M = -INFINITY;
    for (int cc = lane; cc < nparts; cc += 32) M = fmaxf(M, __ldcg(P + ((size_t)cc * HB + h) * PF + HD));
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, s));
    for (int cc = lane; cc < nparts; cc += 32) {
      const float fc = floe_vexpf(__fsub_rn(__ldcg(P + ((size_t)cc * HB + h) * PF + HD), M));
      f[h][cc] = fc;
      fl[h][cc] = __fmul_rn(fc, __ldcg(P + ((size_t)cc * HB + h) * PF + HD + 1));
    }
    __syncwarp();
    if (lane == 0) {
      float L = 0.0f;
      for (int cc = 0; cc < nparts; cc++) L = __fadd_rn(L, fl[h][cc]);
      s_inv[h] = L;
    }
  }
  __syncthreads();
  for (int e = 4 * tid; e < HB * HD; e += 4 * ATT_THREADS) {
    const int h = e / HD, d = e % HD;
    float O[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll 8
    for (int cc = 0; cc < nparts; cc++) {
      const float4 pv = __ldcg((const float4 *)(P + ((size_t)cc * HB + h) * PF + d));
      const float fc = f[h][cc];
      O[0] = __fadd_rn(O[0], __fmul_rn(fc, pv.x));
      O[1] = __fadd_rn(O[1], __fmul_rn(fc, pv.y));
      O[2] = __fadd_rn(O[2], __fmul_rn(fc, pv.z));
      O[3] = __fadd_rn(O[3], __fmul_rn(fc, pv.w));
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (d + u >= hd) continue;
      float r = O[u] / s_inv[h];
      if (gated) r = __fmul_rn(r, floe_sigmoidf(q[qrow + (int64_t)(head0 + h) * qs + hd + d + u]));
      out[((int64_t)t * nh + head0 + h) * hd + d + u] = r;
    }
  }
  if (tid == 0) *ctr = 0; /* ready for the next launch (graph replay) */
}

/* ---- prefill: a block per (part c, kv head / head batch, group of R rows) ----
 * k_attn_rows computes what k_attn computes for each of its rows, with the same operations in the
 * same order, but streams each K/V tile once for the block's QR = R x HBH query rows (row, head)
 * instead of once per row. Why the bits are those of decode:
 *   - a row's parts depend only on its np (CH = roundup128(ceil(np / n_split)), part c starts at
 *     c * CH), and tiles start at part starts, TP dividing 128: every row of every block sees the
 *     one tile grid of TP positions aligned in absolute positions. The block's rows with the same
 *     CH (consecutive rows; CH grows with np) share p0 = c * CH and differ only in where their part
 *     ends (p0 + CH or np), so a tile is, for a row, whole, cut at np, or past its part; rows of
 *     another CH (a group straddling a CH step) run afterwards as a second subgroup.
 *   - scores: one thread per (position, query row) runs the 16 lane chains of k_attn's half-warp
 *     (chain l: fmaf over j of q[l + 16 j] k[l + 16 j]) one after another and folds them with
 *     ops_fold16's tree (8, 4, 2, 1), then times the scale;
 *   - softmax: a warp per query row, k_attn's code, over the row's positions of the tile;
 *   - V sums: thread (dg, pg) keeps k_attn's accumulators o[DPT] (position group pg, dims
 *     d0..d0+DPT-1) for each of the QR rows in registers: o *= alpha, then fmaf in position order
 *     over the row's positions pg, pg + NPG, ...; the group sums and the part's (o, m, l) as k_attn;
 *   - the last block of a (row group, kv head batch) combines each row's parts as k_attn does.
 * Parts go to the scratch at ((t * n_head + head) * n_split + c) * (HD + 4) floats.
 * Floors of a 512-row chunk at depth D, Qwen3.5-35B-A3B shape (16 q / 2 kv heads, head_dim 256,
 * bf16 cache): 512 D + 131328 (row, position) pairs, 16 x (256 + 256) fmaf each: D = 0 1.08 G fmaf
 * (32 us at the FP32 rate, 33.5 T fmaf/s), 32K 138 G (4.1 ms), 128K 551 G (16.4 ms). K/V bytes
 * (2 KiB a position): k_attn reads them once per row, 34.6 GB at 32K (8.0 ms at 4.3 TB/s) and
 * 138 GB at 128K (32 ms); here once per block of 2 rows, and blocks of one part run together
 * (row groups vary fastest in the grid), so most of those reads hit L2. The fmaf chains cannot
 * use the tensor cores (their order is decode's), so the FP32 rate is the floor at every depth. */
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
static int atr_hbh(const cuda_attn_shape *sh) {
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

template <int HD, bool BF>
static __global__ void __launch_bounds__(ATT_THREADS, 1)
    k_attn_rows(const float *q, const void *kc, const void *vc, const int32_t *pos0, float *out, float *part,
                int *cnt, int nh, int nkv, int hd, int64_t n_ctx, int gated, int n_split, float scale, int n_tok,
                int R, int HBH) {
  PDL_ENTER();
  constexpr int QR = ATR_QR, QB = ATR_QB;
  constexpr int ES = BF ? 2 : 4;
  constexpr int TP = att_tp(HD, ES);
  constexpr int RB = atr_rb(HD, ES);
  constexpr int TB = TP * RB;
  constexpr int LPT = HD / 16;
  constexpr int DPT = HD >= 64 ? 4 : 2;
  constexpr int ND = HD / DPT, NPG = ATT_THREADS / ND;
  constexpr int NG = ATT_THREADS / TP, QPT = QR / NG; /* score groups of threads; query rows a thread scores */
  constexpr int NPP = TP / NPG; /* positions of a tile per V-sum thread */
  static_assert(NPP % 4 == 0, "a V-sum thread's exps load as float4");
  static_assert(QR % NG == 0 && QPT >= 1, "query rows split evenly over the score groups");
  static_assert((size_t)(NPG - 1) * QR * HD * 4 <= atr_union(HD, ES), "group sums fit the stages");
  extern __shared__ __align__(16) unsigned char att_sm[];
  float *qs = (float *)(att_sm + atr_union(HD, ES)); /* [QR][HD], zero past hd and past the block's rows */
  float *sc = qs + QR * HD; /* [QR][TP]: scores, then exps, position p at PERM(p): a V-sum thread's contiguous */
#define PERM(p) (((p) % NPG) * NPP + (p) / NPG)
  __shared__ float s_alpha[QR], s_m[QR], s_l[QR];
  __shared__ int s_np[QR]; /* the query row's positions in the current tile (0: none) */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = nh / nkv, nhb = G / HBH;
  /* row groups vary fastest in launch order: the blocks running at once read the same part's K/V;
   * the last rows (the longest) first, so that the short ones fill the tail */
  const int grp = gridDim.x - 1 - blockIdx.x, y = blockIdx.y, c = blockIdx.z;
  const int kh = y / nhb, head0 = kh * G + (y % nhb) * HBH;
  const int t0 = grp * R, nr = n_tok - t0 < R ? n_tok - t0 : R, nq = nr * HBH; /* query row i = r * HBH + h */
  const int64_t base = *pos0;
  const int qs_row = hd * (gated ? 2 : 1);
  const size_t PF = (size_t)HD + 4;
  const bool exact = hd == HD;
  const unsigned char *K = (const unsigned char *)kc + (size_t)kh * n_ctx * hd * ES;
  const unsigned char *V = (const unsigned char *)vc + (size_t)kh * n_ctx * hd * ES;
  const int64_t np0 = base + t0 + 1; /* np of the block's row 0 */
  for (int e = tid; e < QR * HD; e += ATT_THREADS) {
    const int i = e / HD, d = e % HD;
    float v = 0.0f;
    if (i < nq && d < hd) v = q[((int64_t)(t0 + i / HBH) * nh + head0 + i % HBH) * qs_row + d];
    qs[e] = v;
  }
  const int dg = tid % ND, pg = tid / ND, d0 = DPT * dg;
  for (int r0 = 0; r0 < nr;) { /* subgroups of rows with one part size */
    const AtrSub u = atr_sub(np0, r0, nr, c, n_split);
    const int r1 = u.r1, i0 = r0 * HBH, i1 = r1 * HBH; /* its query rows */
    if (!u.has) {
      r0 = r1;
      continue;
    }
    const int64_t p0 = u.p0, pend = u.pend;
    const int ntiles = (int)((pend - p0 + TP - 1) / TP);
    auto issue = [&](int it, int st) { /* k_attn's tile load, up to pend */
      const int64_t tp0 = p0 + (int64_t)it * TP;
      unsigned char *ks = att_sm + (size_t)st * 2 * TB;
      att_load_tile<HD, BF, RB>(ks, ks + TB, K, V, tp0, (int)(pend - tp0 < TP ? pend - tp0 : TP), hd, exact);
    };
#pragma unroll
    for (int s = 0; s < ATT_STAGES - 1; s++) {
      if (s < ntiles) issue(s, s);
      ops_cp_commit();
    }
    float o[QR][DPT];
#pragma unroll
    for (int i = 0; i < QR; i++)
#pragma unroll
      for (int u = 0; u < DPT; u++) o[i][u] = 0.0f;
    if (tid < QR) {
      s_m[tid] = -INFINITY;
      s_l[tid] = 0.0f;
    }
    for (int it = 0; it < ntiles; it++) {
      ops_cp_wait<ATT_STAGES - 2>();
      __syncthreads(); /* tile it landed; everyone is done with tile it - 1 (and s_np) */
      if (it + ATT_STAGES - 1 < ntiles) issue(it + ATT_STAGES - 1, (it + ATT_STAGES - 1) % ATT_STAGES);
      ops_cp_commit();
      const int64_t tp0 = p0 + (int64_t)it * TP;
      const int ntp = (int)(pend - tp0 < TP ? pend - tp0 : TP);
      const unsigned char *ks = att_sm + (size_t)(it % ATT_STAGES) * 2 * TB, *vs = ks + TB;
      if (tid < QR) s_np[tid] = atr_tile_n(u, tid, i0, i1, HBH, np0, tp0, TP);
      /* scores: thread (position p, group g) scores query rows g, g + NG, ... QB at a time */
      {
        const int p = tid % TP, g = tid / TP;
        const unsigned char *kr = ks + p * RB;
#pragma unroll
        for (int kb = 0; kb < QPT; kb += QB) {
          { /* a pass with none of the subgroup's rows is skipped (whole warps: g is uniform in a warp for TP >= 32) */
            const int ia = g + NG * kb, ib = g + NG * (kb + QB - 1 < QPT - 1 ? kb + QB - 1 : QPT - 1);
            if (ib < i0 || ia >= i1) continue;
          }
          float acc[QB][16];
#pragma unroll
          for (int b = 0; b < QB; b++)
#pragma unroll
            for (int l = 0; l < 16; l++) acc[b][l] = 0.0f;
#pragma unroll
          for (int j = 0; j < LPT; j++) {
            float kv[16];
            if (BF) {
              const uint4 a = *(const uint4 *)(kr + j * 32), b2 = *(const uint4 *)(kr + j * 32 + 16);
              const uint32_t w[8] = { a.x, a.y, a.z, a.w, b2.x, b2.y, b2.z, b2.w };
#pragma unroll
              for (int m = 0; m < 8; m++) {
                kv[2 * m] = __uint_as_float(w[m] << 16);
                kv[2 * m + 1] = __uint_as_float(w[m] & 0xffff0000u);
              }
            } else {
#pragma unroll
              for (int m = 0; m < 4; m++) {
                const float4 f = *(const float4 *)(kr + j * 64 + m * 16);
                kv[4 * m] = f.x, kv[4 * m + 1] = f.y, kv[4 * m + 2] = f.z, kv[4 * m + 3] = f.w;
              }
            }
#pragma unroll
            for (int b = 0; b < QB; b++) {
              if (kb + b >= QPT) break;
              const float *qq = qs + (g + NG * (kb + b)) * HD + 16 * j;
#pragma unroll
              for (int m = 0; m < 4; m++) {
                const float4 f = *(const float4 *)(qq + 4 * m);
                acc[b][4 * m] = fmaf(f.x, kv[4 * m], acc[b][4 * m]);
                acc[b][4 * m + 1] = fmaf(f.y, kv[4 * m + 1], acc[b][4 * m + 1]);
                acc[b][4 * m + 2] = fmaf(f.z, kv[4 * m + 2], acc[b][4 * m + 2]);
                acc[b][4 * m + 3] = fmaf(f.w, kv[4 * m + 3], acc[b][4 * m + 3]);
              }
            }
          }
#pragma unroll
          for (int b = 0; b < QB; b++) {
            if (kb + b >= QPT) break;
            float f8[8], f4[4];
#pragma unroll
            for (int l = 0; l < 8; l++) f8[l] = __fadd_rn(acc[b][l], acc[b][l + 8]);
#pragma unroll
            for (int l = 0; l < 4; l++) f4[l] = __fadd_rn(f8[l], f8[l + 4]);
            const float f2a = __fadd_rn(f4[0], f4[2]), f2b = __fadd_rn(f4[1], f4[3]);
            sc[(g + NG * (kb + b)) * TP + PERM(p)] = __fmul_rn(__fadd_rn(f2a, f2b), scale);
          }
        }
      }
      __syncthreads();
      /* online softmax per query row (k_attn's code over the row's positions of the tile) */
      for (int i = warp; i < QR; i += ATT_THREADS / 32) {
        const int npos = s_np[i];
        if (npos <= 0) continue;
        float *si = sc + i * TP;
        float mt = -INFINITY;
        for (int p = lane; p < npos; p += 32) mt = fmaxf(mt, si[PERM(p)]);
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, s));
        const float mo = s_m[i], mn = fmaxf(mo, mt);
        float lt = 0.0f;
        for (int p = lane; p < npos; p += 32) {
          const float e = floe_vexpf(__fsub_rn(si[PERM(p)], mn));
          si[PERM(p)] = e;
          lt = __fadd_rn(lt, e);
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) lt = __fadd_rn(lt, __shfl_xor_sync(0xffffffffu, lt, s));
        __syncwarp();
        if (lane == 0) {
          const float al = floe_vexpf(__fsub_rn(mo, mn));
          s_alpha[i] = al;
          s_m[i] = mn;
          s_l[i] = __fadd_rn(__fmul_rn(s_l[i], al), lt);
        }
      }
      __syncthreads();
      /* V sums: every active row's o *= alpha, then fmaf over its positions pg, pg + NPG, ... */
      unsigned act = 0;
      bool full = true;
#pragma unroll
      for (int i = 0; i < QR; i++) {
        const int n = s_np[i];
        if (n > 0) {
          act |= 1u << i;
          full &= n == ntp;
          const float al = s_alpha[i];
#pragma unroll
          for (int u = 0; u < DPT; u++) o[i][u] = __fmul_rn(o[i][u], al);
        }
      }
      auto vload = [&](int p, float *vv) { att_vrow<BF, DPT>(vs + p * RB, d0, vv); };
      if (full && ntp == TP && act == (QR >= 32 ? 0xffffffffu : (1u << QR) - 1u)) {
        /* every row over the whole tile: 4 positions at a time, their exps one float4 load */
#pragma unroll 1
        for (int k4 = 0; k4 < NPP; k4 += 4) {
          float vv[4][DPT];
#pragma unroll
          for (int m = 0; m < 4; m++) vload(pg + NPG * (k4 + m), vv[m]);
#pragma unroll
          for (int i = 0; i < QR; i++) {
            const float4 e = *(const float4 *)(sc + i * TP + pg * NPP + k4);
            const float ee[4] = { e.x, e.y, e.z, e.w };
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
              for (int u = 0; u < DPT; u++) o[i][u] = fmaf(ee[m], vv[m][u], o[i][u]);
          }
        }
      } else {
        for (int p = pg; p < ntp; p += NPG) {
          float vv[DPT];
          vload(p, vv);
#pragma unroll
          for (int i = 0; i < QR; i++) {
            if (!((act >> i) & 1u) || p >= s_np[i]) continue;
            const float e = sc[i * TP + PERM(p)];
#pragma unroll
            for (int u = 0; u < DPT; u++) o[i][u] = fmaf(e, vv[u], o[i][u]);
          }
        }
      }
    }
    ops_cp_wait<0>();
    __syncthreads(); /* every tile consumed: the stages are free for the group sums */
    float *red = (float *)att_sm; /* [NPG - 1][QR][HD] */
    if (NPG > 1) {
      if (pg > 0)
#pragma unroll
        for (int i = 0; i < QR; i++)
#pragma unroll
          for (int u = 0; u < DPT; u++) red[((size_t)(pg - 1) * QR + i) * HD + d0 + u] = o[i][u];
      __syncthreads();
      if (pg == 0)
        for (int g = 1; g < NPG; g++)
#pragma unroll
          for (int i = 0; i < QR; i++)
#pragma unroll
            for (int u = 0; u < DPT; u++) o[i][u] = __fadd_rn(o[i][u], red[((size_t)(g - 1) * QR + i) * HD + d0 + u]);
    }
#pragma unroll
    for (int i = 0; i < QR; i++) {
      if (!atr_has_part(u, i, i0, i1, HBH, np0)) continue;
      float *mp = atr_parts(part, t0, i, HBH, nh, head0, n_split, HD) + c * PF;
      if (pg == 0)
#pragma unroll
        for (int u = 0; u < DPT; u++) mp[d0 + u] = o[i][u];
      if (tid == 0) {
        mp[HD] = s_m[i];
        mp[HD + 1] = s_l[i];
      }
    }
    __syncthreads(); /* the stages, s_m and s_l are the next subgroup's */
    r0 = r1;
  }
  ActOut qn;
  qn.kind = -1; /* k_attn_rows leaves the quantization to the caller */
  atr_finish<HD>(att_sm, part, cnt, q, out, nq, HBH, t0, head0, base, n_split, nh, hd, gated, qn);
#undef PERM
}

/* ---- the tensor-core order (the default for bfloat16 caches; cuda_attn_set_mma / FLOE_CUDA_ATTN_MMA=0) ----
 * k_attn_tc runs every launch of a bf16 cache in this mode (decode, a verify's few rows, prefill
 * chunks) with one code path per query row, so a row's bits do not depend on the launch it is in
 * (row-exact). They are not k_attn's bits (which are the CPU's score order): the products go
 * through mma.sync m16n8k16 (bf16 x bf16 -> f32). The operands are exact: a float q is the sum of
 * three bfloat16 terms (each the rounded rest of the ones before: 8 + 8 + 8 bits cover its 24),
 * likewise a softmax weight e; K and V are bfloat16 already. So every product is exact and the only
 * rounding is the accumulation's (f32, in the mma's fixed order), as k_attn's V sums differ from
 * the CPU's by rounding.
 * A block: (group of R rows, kv head / head batch, part c) with QR = 16 MT query rows (row, head),
 * MT m16 tiles (2 in launches of >= 16 rows by default); parts and tiles as k_attn (parts of CH = roundup128(ceil(np / n_split)) positions,
 * tiles of ATC_TP positions from the part's start, rows of another CH in a second subgroup).
 *   - scores: warp w keeps the A fragments of its k-chunks (16 dims each) of the three q terms in
 *     registers for the whole launch and multiplies them with the tile's K (ldmatrix; three mma a
 *     chunk, the smallest term first): a partial score per warp, summed in warp order by the
 *     softmax warps, times the scale;
 *   - softmax per query row: k_attn's online softmax over the row's positions of the tile, the
 *     weights stored as their three bfloat16 terms (zero past the row's positions, and V rows past
 *     the tile's positions are zeroed: 0 x a stale NaN is not 0);
 *   - V sums: warp w owns n8 tiles of dims: o *= alpha, then per 16 positions the three weight
 *     terms (the smallest first) times V (ldmatrix.trans) accumulate into o.
 * Floors (4096-token prefill of the 35B-A3B shape, one attention layer): 2 x 68.7 G multiply-adds
 * of (row, position, dim), x3 for the terms: ~0.4 T flops, ~0.6 ms at the mma.sync rate; a block's
 * K/V tiles come from L2 once per 16 MT query rows (~4.3 GB of L2 reads a layer at MT 2). */
#define ATC_TP 64 /* positions per tile (the online softmax's step: part of the bits) */
#define ATC_QR 16 /* query rows per block */
#define ATC_ST 2  /* cp.async pipeline depth (tiles) */
#define ATC_PS (ATC_TP + 8) /* weight terms' row stride, bf16 elements (conflict-free ldmatrix) */
#define ATC_SS (ATC_TP + 4) /* partial scores' row stride, floats */

static __host__ __device__ constexpr int atc_rb(int hd) { return (hd + 8) * 2; } /* staged K/V row, bytes */
static __host__ __device__ constexpr int atc_nkw(int hd) { return hd / 16 < 8 ? hd / 16 : 8; } /* warps with k-chunks */
static __host__ __device__ constexpr int atc_kcw(int hd) { return hd / 16 < 8 ? 1 : hd / 128; } /* k-chunks a warp */
/* the stages, reused by the combine (atr_finish: 2 x QR x ATT_MAX_SPLIT floats) */
static __host__ __device__ constexpr size_t atc_stage_bytes(int hd, int mt) {
  return atr_max((size_t)ATC_ST * 2 * ATC_TP * atc_rb(hd), (size_t)2 * ATC_QR * mt * ATT_MAX_SPLIT * 4);
}
/* MT m16 tiles of query rows a block */
static __host__ __device__ constexpr size_t atc_smem(int hd, int mt) {
  return atc_stage_bytes(hd, mt) + (size_t)atc_nkw(hd) * ATC_QR * mt * ATC_SS * 4 + (size_t)3 * ATC_QR * mt * ATC_PS * 2;
}

/* x = t[0] + t[1] + t[2] exactly, in bfloat16 (t[k] the rounded rest of x after the terms before) */
static __device__ __forceinline__ void atc_split3(float x, uint32_t *t) {
  const uint32_t a = ops_f32_to_bf16(x);
  const float r1 = __fsub_rn(x, ops_bf16_to_f32((uint16_t)a));
  const uint32_t b = ops_f32_to_bf16(r1);
  t[0] = a, t[1] = b, t[2] = ops_f32_to_bf16(__fsub_rn(r1, ops_bf16_to_f32((uint16_t)b)));
}
static __device__ __forceinline__ void atc_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void atc_ldsm4(uint32_t *r, const void *p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
static __device__ __forceinline__ void atc_ldsm2(uint32_t *r, const void *p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
}
static __device__ __forceinline__ void atc_ldsm2t(uint32_t *r, const void *p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s)
               : "memory");
}

template <int HD, int MT, bool PIPE>
static __global__ void __launch_bounds__(ATT_THREADS, 1)
    k_attn_tc(const float *q, const void *kc, const void *vc, const int32_t *pos0, float *out, float *part, int *cnt,
              int nh, int nkv, int hd, int64_t n_ctx, int gated, int n_split, float scale, int n_tok, int R, int HBH,
              ActOut qo, int onep_ok) {
  PDL_ENTER();
  constexpr int TP = ATC_TP, QR = ATC_QR * MT, RB = atc_rb(HD), TB = TP * RB;
  constexpr int NKW = atc_nkw(HD), KCW = atc_kcw(HD);
  constexpr int NT = HD / 8, NVW = NT < 8 ? NT : 8, NTW = NT < 8 ? 1 : NT / 8; /* V sums: warps, n8 tiles a warp */
  static_assert(QR <= 32 && TP % 32 == 0 && NKW * KCW == HD / 16, "atr_finish's rows; whole k-chunks");
  static_assert((size_t)QR * HD * 4 <= atc_stage_bytes(HD, MT), "the staged outputs fit the stages");
  extern __shared__ __align__(16) unsigned char att_sm[];
  float *red = (float *)(att_sm + atc_stage_bytes(HD, MT));      /* [NKW][QR][ATC_SS]: partial scores */
  uint16_t *es = (uint16_t *)(red + (size_t)NKW * QR * ATC_SS); /* [3][QR][ATC_PS]: the weights' terms */
  __shared__ float s_alpha[QR], s_m[QR], s_l[QR];
  __shared__ int s_np[2][QR]; /* the query row's positions in tile it (s_np[it & 1]; 0: none) */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int G = nh / nkv, nhb = G / HBH;
  const int grp = gridDim.x - 1 - blockIdx.x, y = blockIdx.y, c = blockIdx.z; /* the longest rows first */
  const int kh = y / nhb, head0 = kh * G + (y % nhb) * HBH;
  const int t0 = grp * R, nr = n_tok - t0 < R ? n_tok - t0 : R, nq = nr * HBH; /* query row i = r * HBH + h */
  const int64_t base = *pos0;
  const int qs_row = hd * (gated ? 2 : 1);
  const size_t PF = (size_t)HD + 4;
  const bool exact = hd == HD;
  const unsigned char *K = (const unsigned char *)kc + (size_t)kh * n_ctx * hd * 2;
  const unsigned char *V = (const unsigned char *)vc + (size_t)kh * n_ctx * hd * 2;
  const int64_t np0 = base + t0 + 1; /* np of the block's row 0 */
  /* onep: every row of the block's group has one part (np <= its part size: always with one split),
   * so part 0's block writes the outputs with atr_finish's arithmetic for one part, and no block
   * touches the counter or the scratch (the same bits, without the scratch's round trip) */
  bool onep = onep_ok != 0;
  for (int r = 0; r < nr && onep; r++) onep = np0 + r <= atr_ch(np0 + r, n_split);
  if (onep && c > 0) return;
  /* qs: a one-part block quantizes its rows from shared memory (head_dim == HD: a row's heads are
   * contiguous there; MT 1, the decode launches: at MT 2 the staging's registers spill); else from
   * out after a barrier (atr_quant) */
  const bool qs = MT == 1 && onep && qo.kind >= 0 && hd == HD;
  /* the q terms' A fragments of this warp's k-chunks: register r of m-tile m, chunk k holds rows
   * 16 m + g + 8 (r & 1), dims 16 kc + 8 (r >> 1) + 2 tq and + 1 (low half first). Loaded after the
   * first tiles' copies are issued, so that their latencies overlap. */
  uint32_t qa[MT][KCW][3][4];
  bool q_loaded = false;
  auto load_q = [&]() {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
    for (int k = 0; k < KCW; k++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int i = 16 * m + g + 8 * (r & 1), d = 16 * (warp * KCW + k) + 8 * (r >> 1) + 2 * tq;
        float x0 = 0.0f, x1 = 0.0f;
        if (warp < NKW && i < nq) {
          const float *qr = q + ((int64_t)(t0 + i / HBH) * nh + head0 + i % HBH) * qs_row;
          x0 = d < hd ? qr[d] : 0.0f;
          x1 = d + 1 < hd ? qr[d + 1] : 0.0f;
        }
        uint32_t a[3], b[3];
        atc_split3(x0, a);
        atc_split3(x1, b);
#pragma unroll
        for (int s = 0; s < 3; s++) qa[m][k][s][r] = a[s] | b[s] << 16;
      }
  };
  for (int r0 = 0; r0 < nr;) { /* subgroups of rows with one part size */
    const AtrSub u = atr_sub(np0, r0, nr, c, n_split);
    const int r1 = u.r1, i0 = r0 * HBH, i1 = r1 * HBH; /* its query rows */
    if (!u.has) {
      r0 = r1;
      continue;
    }
    const int64_t p0 = u.p0, pend = u.pend;
    const int ntiles = (int)((pend - p0 + TP - 1) / TP);
    /* k_attn's tile load: K (kv & 1) and V (kv & 2) of tile it up to pend into stage it % ATC_ST,
     * the V rows past the tile's positions zeroed */
    auto issue = [&](int it, int kv) {
      const int64_t tp0 = p0 + (int64_t)it * TP;
      const int n = (int)(pend - tp0 < TP ? pend - tp0 : TP);
      unsigned char *ks = att_sm + (size_t)(it % ATC_ST) * 2 * TB;
      if (kv & 1) att_load_rows<HD, true, RB>(ks, K, tp0, n, hd, exact);
      if (kv & 2) {
        att_load_rows<HD, true, RB>(ks + TB, V, tp0, n, hd, exact);
        for (int e = tid; e < (TP - n) * (RB / 16); e += ATT_THREADS)
          *(uint4 *)(ks + TB + (size_t)n * RB + (size_t)e * 16) = make_uint4(0u, 0u, 0u, 0u);
      }
    };
    /* s_np of tile it, and this warp's partial scores of every position of it into red */
    auto scores = [&](int it) {
      const int64_t tp0 = p0 + (int64_t)it * TP;
      const unsigned char *ks = att_sm + (size_t)(it % ATC_ST) * 2 * TB;
      if (tid < QR) s_np[it & 1][tid] = atr_tile_n(u, tid, i0, i1, HBH, np0, tp0, TP);
      if (warp >= NKW) return;
      /* the accumulators of all n8 tiles at once, so that consecutive mma are independent (each
       * still sums its k-chunks in order, the smallest term first) */
      float *rw = red + (size_t)warp * QR * ATC_SS;
      float d[MT][TP / 8][4];
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int nt = 0; nt < TP / 8; nt++) d[m][nt][0] = d[m][nt][1] = d[m][nt][2] = d[m][nt][3] = 0.0f;
#pragma unroll
      for (int k = 0; k < KCW; k++) {
        uint32_t b[TP / 8][2]; /* positions 8 nt + (lane & 7), dims 16 kc + 8 ((lane >> 3) & 1) */
#pragma unroll
        for (int nt = 0; nt < TP / 8; nt++)
          atc_ldsm2(b[nt], ks + (size_t)(8 * nt + (lane & 7)) * RB + (16 * (warp * KCW + k) + 8 * ((lane >> 3) & 1)) * 2);
#pragma unroll
        for (int s = 2; s >= 0; s--)
#pragma unroll
          for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < TP / 8; nt++) atc_mma(d[m][nt], qa[m][k][s], b[nt][0], b[nt][1]);
      }
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int nt = 0; nt < TP / 8; nt++) {
          *(float2 *)(rw + (16 * m + g) * ATC_SS + 8 * nt + 2 * tq) = make_float2(d[m][nt][0], d[m][nt][1]);
          *(float2 *)(rw + (16 * m + g + 8) * ATC_SS + 8 * nt + 2 * tq) = make_float2(d[m][nt][2], d[m][nt][3]);
        }
    };
    /* the online softmax per query row over its positions of tile it; the weights' terms into es */
    auto softmax = [&](int it) {
      for (int i = warp; i < QR; i += ATT_THREADS / 32) {
        const int npos = s_np[it & 1][i];
        uint16_t *e0 = es + i * ATC_PS;
        if (npos <= 0) {
          for (int p = lane; p < TP; p += 32) e0[p] = e0[QR * ATC_PS + p] = e0[2 * QR * ATC_PS + p] = 0;
          continue;
        }
        float sv[TP / 32];
        float mt = -INFINITY;
#pragma unroll
        for (int u = 0; u < TP / 32; u++) {
          const int p = lane + 32 * u;
          float v = 0.0f;
          if (p < npos) {
            v = red[i * ATC_SS + p];
#pragma unroll
            for (int w = 1; w < NKW; w++) v = __fadd_rn(v, red[((size_t)w * QR + i) * ATC_SS + p]);
            v = __fmul_rn(v, scale);
            mt = fmaxf(mt, v);
          }
          sv[u] = v;
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, s));
        const float mo = s_m[i], mn = fmaxf(mo, mt);
        float lt = 0.0f;
#pragma unroll
        for (int u = 0; u < TP / 32; u++) {
          const int p = lane + 32 * u;
          uint32_t t[3] = { 0u, 0u, 0u };
          if (p < npos) {
            const float e = floe_vexpf(__fsub_rn(sv[u], mn));
            lt = __fadd_rn(lt, e);
            atc_split3(e, t);
          }
          e0[p] = (uint16_t)t[0], e0[QR * ATC_PS + p] = (uint16_t)t[1], e0[2 * QR * ATC_PS + p] = (uint16_t)t[2];
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) lt = __fadd_rn(lt, __shfl_xor_sync(0xffffffffu, lt, s));
        if (lane == 0) {
          const float al = floe_vexpf(__fsub_rn(mo, mn));
          s_alpha[i] = al;
          s_m[i] = mn;
          s_l[i] = __fadd_rn(__fmul_rn(s_l[i], al), lt);
        }
      }
    };
    float o[MT][NTW][4];
    /* o = o * alpha + e V over tile it, rows 16 m + g and + 8 */
    auto vsum = [&](int it) {
      if (warp >= NVW) return;
      const unsigned char *vs = att_sm + (size_t)(it % ATC_ST) * 2 * TB + TB;
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int i = 16 * m + g + 8 * h;
          if (s_np[it & 1][i] > 0) {
            const float al = s_alpha[i];
#pragma unroll
            for (int j = 0; j < NTW; j++)
              o[m][j][2 * h] = __fmul_rn(o[m][j][2 * h], al), o[m][j][2 * h + 1] = __fmul_rn(o[m][j][2 * h + 1], al);
          }
        }
#pragma unroll
      for (int kc = 0; kc < TP / 16; kc++) {
        uint32_t a[MT][3][4]; /* rows 16 m + (lane & 15), positions 16 kc + 8 (lane >> 4) */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
          for (int s = 0; s < 3; s++)
            atc_ldsm4(a[m][s], es + ((size_t)s * QR + 16 * m + (lane & 15)) * ATC_PS + 16 * kc + 8 * (lane >> 4));
        uint32_t b[NTW][2]; /* positions 16 kc + (lane & 15), dims of n8 tile warp * NTW + j; transposed */
#pragma unroll
        for (int j = 0; j < NTW; j++) atc_ldsm2t(b[j], vs + (size_t)(16 * kc + (lane & 15)) * RB + 16 * (warp * NTW + j));
#pragma unroll
        for (int s = 2; s >= 0; s--) /* each accumulator: the smallest term first, as before */
#pragma unroll
          for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NTW; j++) atc_mma(o[m][j], a[m][s], b[j][0], b[j][1]);
      }
    };
    if constexpr (PIPE) { /* tile 0; then K(it + 1) and V(it + 1) load while tile it is computed (below) */
      issue(0, 3);
      ops_cp_commit();
    } else {
#pragma unroll
      for (int s = 0; s < ATC_ST - 1; s++) {
        if (s < ntiles) issue(s, 3);
        ops_cp_commit();
      }
    }
    if (!q_loaded) {
      load_q();
      q_loaded = true;
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int j = 0; j < NTW; j++) o[m][j][0] = o[m][j][1] = o[m][j][2] = o[m][j][3] = 0.0f;
    if (tid < QR) {
      s_m[tid] = -INFINITY;
      s_l[tid] = 0.0f;
    }
    if constexpr (PIPE) {
      /* phase it: the V sums of tile it - 1 and the scores of tile it (independent), a barrier, the
       * softmax of it: two barriers a tile instead of three. K(it + 1) goes into the stage half that
       * held K(it - 1) (its scores were done in phase it - 1), V(it + 1) after this phase's V sums
       * into the half that held V(it - 1); each load has a phase and a softmax to land in. */
      for (int it = 0; it <= ntiles; it++) {
        if (it == 0) ops_cp_wait<0>();
        else ops_cp_wait<1>(); /* every group but the newest: V(it), needed in phase it + 1 */
        __syncthreads(); /* K(it) and V(it - 1) landed; softmax(it - 1) done */
        if (it + 1 < ntiles) issue(it + 1, 1);
        ops_cp_commit();
        if (it > 0) vsum(it - 1);
        if (it == ntiles) break;
        scores(it);
        __syncthreads(); /* the V sums of it - 1 are done: V(it + 1) may take their stage half */
        if (it + 1 < ntiles) issue(it + 1, 2);
        ops_cp_commit();
        softmax(it);
      }
    } else {
      for (int it = 0; it < ntiles; it++) {
        ops_cp_wait<ATC_ST - 2>();
        __syncthreads(); /* tile it landed; everyone is done with tile it - 1 (its stage, s_np, es) */
        if (it + ATC_ST - 1 < ntiles) issue(it + ATC_ST - 1, 3);
        ops_cp_commit();
        scores(it);
        __syncthreads();
        softmax(it);
        __syncthreads();
        vsum(it);
      }
    }
    ops_cp_wait<0>();
    __syncthreads(); /* every tile consumed */
    if (onep) { /* atr_finish's combine of one part: M = max(-inf, m), its factor exp(m - M), L = 0 + f l, out = (0 + f o) / L */
      float *so = (float *)att_sm; /* qs: the outputs staged for the quantization (the tiles' stages are free) */
      if (warp < NVW)
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
          for (int h = 0; h < 2; h++) {
            const int i = 16 * m + g + 8 * h;
            if (!atr_has_part(u, i, i0, i1, HBH, np0)) continue;
            const float mi = s_m[i], M = fmaxf(-INFINITY, mi);
            const float fc = floe_vexpf(__fsub_rn(mi, M)), L = __fadd_rn(0.0f, __fmul_rn(fc, s_l[i]));
            const int64_t t = t0 + i / HBH;
            const int head = head0 + i % HBH;
#pragma unroll
            for (int j = 0; j < NTW; j++)
#pragma unroll
              for (int e = 0; e < 2; e++) {
                const int d = 8 * (warp * NTW + j) + 2 * tq + e;
                if (d >= hd) continue;
                float r = __fadd_rn(0.0f, __fmul_rn(fc, o[m][j][2 * h + e])) / L;
                if (gated) r = __fmul_rn(r, floe_sigmoidf(q[(t * nh + head) * qs_row + hd + d]));
                out[(t * nh + head) * hd + d] = r;
                if (qs) so[(size_t)i * HD + d] = r;
              }
          }
      if (qs) { /* the subgroup's rows quantized from shared memory: query row i = r * HBH + h */
        __syncthreads();
        atr_quant(qo, so, (size_t)HBH * HD, r0, r1, t0, head0, HBH, hd);
      }
      __syncthreads(); /* s_m and s_l are the next subgroup's (and the stages its tiles') */
      r0 = r1;
      continue;
    }
    if (warp < NVW)
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int i = 16 * m + g + 8 * h;
          if (!atr_has_part(u, i, i0, i1, HBH, np0)) continue;
          float *mp = atr_parts(part, t0, i, HBH, nh, head0, n_split, HD) + c * PF;
#pragma unroll
          for (int j = 0; j < NTW; j++)
            *(float2 *)(mp + 8 * (warp * NTW + j) + 2 * tq) = make_float2(o[m][j][2 * h], o[m][j][2 * h + 1]);
        }
    if (tid < QR && atr_has_part(u, tid, i0, i1, HBH, np0)) {
      float *mp = atr_parts(part, t0, tid, HBH, nh, head0, n_split, HD) + c * PF;
      mp[HD] = s_m[tid];
      mp[HD + 1] = s_l[tid];
    }
    __syncthreads(); /* s_m and s_l are the next subgroup's */
    r0 = r1;
  }
  if (onep) {
    if (qo.kind >= 0 && !qs) {
      __syncthreads(); /* every output of the block written */
      atr_quant_out(qo, out, nr, t0, head0, HBH, nh, hd);
    }
    return;
  }
  atr_finish<HD>(att_sm, part, cnt, q, out, nq, HBH, t0, head0, base, n_split, nh, hd, gated, qo);
}

/* k_attn's scores folded by transposition (att_fold_t) for head_dim 256: 1 = on (the default: on
 * the H200 the 128K decode launch 228.5 -> 174.9 us, the 35B decode at 128K 206.6 -> 235.7 tok/s),
 * 0 = ops_fold16 per value; the same bits. FLOE_CUDA_ATTN_FOLDT=0 at the first call: off. */
static int g_attn_fold_t = -1;
static bool attn_fold_t(void) {
  if (g_attn_fold_t < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_FOLDT");
    g_attn_fold_t = !(e && e[0] == '0');
  }
  return g_attn_fold_t == 1;
}
extern "C" void cuda_attn_set_fold_t(int on) { g_attn_fold_t = on ? 1 : 0; }

/* one entry per (HB, HD, BF, FT): its shared-memory opt-in done once */
template <int HB, int HD, bool BF, bool FT = false>
static int attn_smem_once() {
  static int done = 0;
  if (done) return 0;
  const size_t sm = att_smem_hb(HB, HD, BF ? 2 : 4);
  if (cudaFuncSetAttribute(k_attn<HB, HD, BF, FT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  done = 1;
  return 0;
}

template <int HB, int HD, bool BF, bool FT = false>
static int launch_attn(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc, const int32_t *pos0,
                       int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  if constexpr (!FT && HD == 256) /* head_dim 256: the transposed folds where asked for */
    if (attn_fold_t()) return launch_attn<HB, HD, BF, true>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  if (attn_smem_once<HB, HD, BF, FT>()) return -1;
  if (!q) return 0; /* the check's call: attribute only */
  const int nhb = sh->n_head / sh->n_head_kv / HB;
  dim3 grid((unsigned)sh->n_split, (unsigned)(sh->n_head_kv * nhb), (unsigned)n_tok);
  const float scale = (float)(1.0 / sqrt((double)sh->head_dim));
  pdl_launch(k_attn<HB, HD, BF, FT>, dim3(grid), dim3(ATT_THREADS), att_smem_hb(HB, HD, BF ? 2 : 4), OPS_STREAM(stream),
      q, kc, vc, pos0, out, part, cnt, sh->n_head, sh->n_head_kv, sh->head_dim, sh->n_ctx, sh->gated, sh->n_split,
      scale);
  return 0;
}

template <int HD, bool BF>
static int attn_hb_dispatch(int hb, const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                            const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  switch (hb) {
  case 1: return launch_attn<1, HD, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 2: return launch_attn<2, HD, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 4: return launch_attn<4, HD, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  default: return launch_attn<8, HD, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  }
}
template <bool BF>
static int attn_dispatch(int hb, const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                         const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  switch (attn_hd(sh->head_dim)) {
  case 16: return attn_hb_dispatch<16, BF>(hb, sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 32: return attn_hb_dispatch<32, BF>(hb, sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 64: return attn_hb_dispatch<64, BF>(hb, sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 128: return attn_hb_dispatch<128, BF>(hb, sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  default: return attn_hb_dispatch<256, BF>(hb, sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  }
}

/* ---- the rows kernel's launch ---- */
template <int HD, bool BF>
static int launch_attn_rows(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                            const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  static int done = 0;
  const size_t sm = atr_smem(HD, BF ? 2 : 4);
  if (!done) {
    if (cudaFuncSetAttribute(k_attn_rows<HD, BF>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    done = 1;
  }
  if (!q) return 0; /* the check's call: attribute only */
  const int hbh = atr_hbh(sh), R = ATR_QR / hbh, G = sh->n_head / sh->n_head_kv;
  dim3 grid((unsigned)((n_tok + R - 1) / R), (unsigned)(sh->n_head_kv * (G / hbh)), (unsigned)sh->n_split);
  const float scale = (float)(1.0 / sqrt((double)sh->head_dim));
  pdl_launch(k_attn_rows<HD, BF>, dim3(grid), dim3(ATT_THREADS), sm, OPS_STREAM(stream), q, kc, vc, pos0, out, part,
             cnt, sh->n_head, sh->n_head_kv, sh->head_dim, sh->n_ctx, sh->gated, sh->n_split, scale, (int)n_tok, R,
             hbh);
  return 0;
}
template <bool BF>
static int attn_rows_dispatch(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                              const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  switch (attn_hd(sh->head_dim)) {
  case 16: return launch_attn_rows<16, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 32: return launch_attn_rows<32, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 64: return launch_attn_rows<64, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 128: return launch_attn_rows<128, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  default: return launch_attn_rows<256, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  }
}

/* ---- the tensor-core kernel's launch ---- */
/* bfloat16 caches: 1 = every launch runs k_attn_tc (the tensor-core order; the default: on the
 * H200 the 35B-A3B shape's 4096-token prefill 7914-8244 -> 9638-10013 tok/s, its decode at 128K
 * 279 -> 311 tok/s, at 32K 390 -> 404, at depth 0 489-496 -> 472-476), 0 = k_attn / k_attn_rows
 * (the CPU's score order). FLOE_CUDA_ATTN_MMA=0 at setup (cuda_attn_check) or the first call. */
static int g_attn_mma = -1;
static bool attn_mma_on(void) {
  if (g_attn_mma < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_MMA");
    g_attn_mma = !(e && e[0] == '0');
  }
  return g_attn_mma == 1;
}
extern "C" void cuda_attn_set_mma(int on) { g_attn_mma = on ? 1 : 0; }
extern "C" int cuda_attn_mma(void) { return attn_mma_on(); }

/* query rows a block of k_attn_tc in launches of many rows: 1 = one m16 tile (16), 2 = two (32:
 * each K/V tile read from L2 once for twice the rows; the default: 4096-token prefill 9512-9819 ->
 * 10063-10107 tok/s); decode and launches of fewer than 16 rows keep one. The same bits per row.
 * FLOE_CUDA_ATTN_MT=1 at setup or the first call. */
static int g_attn_mt = -1;
static int attn_tc_mt(void) {
  if (g_attn_mt < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_MT");
    g_attn_mt = e && e[0] == '1' ? 1 : 2;
  }
  return g_attn_mt;
}
extern "C" void cuda_attn_set_mt(int mt) { g_attn_mt = mt == 2 ? 2 : 1; }

/* k_attn_tc's launches of one m16 tile (decode, a verify's rows): 1 = the pipelined tile loop (the
 * V sums of a tile beside the next tile's scores, two barriers a tile; the default), 0 = three
 * phases a tile. The same operations on every value: the same bits (test_cuda_ops compares them).
 * Launches of 32-row blocks keep the three phases (both accumulator sets at once would not fit the
 * registers). FLOE_CUDA_ATTN_PIPE=0 at setup or the first call. */
static int g_attn_pipe = -1;
static bool attn_tc_pipe(void) {
  if (g_attn_pipe < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_PIPE");
    g_attn_pipe = !(e && e[0] == '0');
  }
  return g_attn_pipe == 1;
}
extern "C" void cuda_attn_set_pipe(int on) { g_attn_pipe = on ? 1 : 0; }

/* k_attn_tc's rows of one part written by their block without the scratch (the same bits): 1 (the
 * default), 0: every part through the scratch and the counter; FLOE_CUDA_ATTN_ONEPART=0 at the
 * first call */
static int g_attn_onep = -1;
static int attn_onep(void) {
  if (g_attn_onep < 0) g_attn_onep = mm_env_int("FLOE_CUDA_ATTN_ONEPART", 1) != 0;
  return g_attn_onep;
}
extern "C" void cuda_attn_set_onep(int on) { g_attn_onep = on ? 1 : 0; }

/* k_attn_tc's launches of 2..15 rows (a verify's): 1 (the default) = a block per token (its HBH
 * heads, the decode step's block exactly: twice the blocks of the 35B-A3B shape's 4-row verify,
 * which packs two tokens' 16 query rows into each of its 4 blocks and took 27 us in the graph
 * against 15 for one row, session 26); 0 = ATC_QR / HBH tokens a block. Each query row's
 * operations do not depend on the rows beside it in its block: the same bits. Session 27, the
 * 35B-A3B shape's bench_verify alternated: verify4 2.006 / 1.996 -> 1.961 / 1.951 plain steps.
 * FLOE_CUDA_ATTN_R1=0 at the first call. */
static int g_attn_r1 = -1;
static int attn_r1(void) {
  if (g_attn_r1 < 0) g_attn_r1 = mm_env_int("FLOE_CUDA_ATTN_R1", 1) != 0;
  return g_attn_r1;
}
extern "C" void cuda_attn_set_r1(int on) { g_attn_r1 = on ? 1 : 0; }

/* the output quantized in k_attn_tc's launch: 1 (the default) where it fits, 0 never;
 * FLOE_CUDA_ATTN_ACT=0 at the first call */
static int g_attn_act = -1;
extern "C" void cuda_attn_set_act(int on) { g_attn_act = on ? 1 : 0; }

template <int HD, int MT, bool PIPE>
static int launch_attn_tc(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                          const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, const ActOut &qo,
                          void *stream) {
  static int done = 0;
  const size_t sm = atc_smem(HD, MT);
  if (!done) {
    if (cudaFuncSetAttribute(k_attn_tc<HD, MT, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    done = 1;
  }
  if (!q) return 0; /* the check's call: attribute only */
  const int hbh = atr_hbh(sh), G = sh->n_head / sh->n_head_kv;
  const int R = MT == 1 && n_tok >= 2 && n_tok < 16 && attn_r1() ? 1 : ATC_QR * MT / hbh;
  dim3 grid((unsigned)((n_tok + R - 1) / R), (unsigned)(sh->n_head_kv * (G / hbh)), (unsigned)sh->n_split);
  const float scale = (float)(1.0 / sqrt((double)sh->head_dim));
  pdl_launch(k_attn_tc<HD, MT, PIPE>, dim3(grid), dim3(ATT_THREADS), sm, OPS_STREAM(stream), q, kc, vc, pos0, out, part, cnt,
             sh->n_head, sh->n_head_kv, sh->head_dim, sh->n_ctx, sh->gated, sh->n_split, scale, (int)n_tok, R, hbh, qo,
             attn_onep());
  return 0;
}
template <int HD>
static int launch_attn_tc_mt(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                             const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, const ActOut &qo,
                             void *stream) {
  if (!q) /* the check's call: all three */
    return launch_attn_tc<HD, 1, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream) |
           launch_attn_tc<HD, 1, true>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream) |
           launch_attn_tc<HD, 2, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  if (attn_tc_mt() == 2 && n_tok >= 16)
    return launch_attn_tc<HD, 2, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  if (attn_tc_pipe()) return launch_attn_tc<HD, 1, true>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  return launch_attn_tc<HD, 1, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
}
static int attn_tc_dispatch(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                            const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, const ActOut &qo,
                            void *stream) {
  switch (attn_hd(sh->head_dim)) {
  case 16: return launch_attn_tc_mt<16>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  case 32: return launch_attn_tc_mt<32>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  case 64: return launch_attn_tc_mt<64>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  case 128: return launch_attn_tc_mt<128>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  default: return launch_attn_tc_mt<256>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  }
}

/* launches of at least this many rows use k_attn_rows (0: never). Default 8: the MTP verify
 * launches (a few rows) keep k_attn's block per row. FLOE_CUDA_ATTN_ROWS=0 / =N at the first call. */
static int g_attn_rows = -1;
static int attn_rows_min(void) {
  if (g_attn_rows < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_ROWS");
    g_attn_rows = e && e[0] ? atoi(e) : 8;
    if (g_attn_rows < 0) g_attn_rows = 0;
  }
  return g_attn_rows;
}
extern "C" void cuda_attn_set_rows(int min_rows) { g_attn_rows = min_rows < 0 ? 0 : min_rows; }
extern "C" int cuda_attn_rows_used(int64_t n_tok) {
  const int m = attn_rows_min();
  return m > 0 && n_tok >= m;
}

static int attn_set_smem(const cuda_attn_shape *sh) { /* every head batching attn_hb_for picks from, and the rows kernel */
  int rc = 0;
  for (int hb = 1; hb <= attn_hb(sh); hb *= 2) {
    rc |= sh->kv_bf16 ? attn_dispatch<true>(hb, sh, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL)
                      : attn_dispatch<false>(hb, sh, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL);
  }
  rc |= sh->kv_bf16 ? attn_rows_dispatch<true>(sh, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL)
                    : attn_rows_dispatch<false>(sh, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL);
  ActOut qn;
  memset(&qn, 0, sizeof qn);
  qn.kind = -1;
  if (sh->kv_bf16) rc |= attn_tc_dispatch(sh, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, qn, NULL);
  (void)attn_onep();
  (void)attn_r1();
  (void)attn_rows_min(); /* the environment read at setup */
  (void)attn_mma_on();
  (void)attn_tc_mt();
  (void)attn_tc_pipe();
  return rc;
}

extern "C" int cuda_attn_q(const cuda_attn_shape *sh, const float *q, const void *kcache, const void *vcache,
                           const int32_t *pos0, int64_t n_tok, float *out, void *scratch, const cuda_act_out *qa,
                           void *stream) {
  if (n_tok <= 0) return 0;
  const int hb = attn_hb_for(sh, n_tok);
  /* the counters first, the partials after them (attn_cnt_bytes) */
  int *cnt = (int *)scratch;
  float *part = (float *)((char *)scratch + attn_cnt_bytes(sh, n_tok));
  if (sh->kv_bf16 && attn_mma_on()) {
    if (g_attn_act < 0) g_attn_act = mm_env_int("FLOE_CUDA_ATTN_ACT", 1) != 0;
    ActOut qo = mm_act_out(qa && g_attn_act ? qa->W : NULL, qa ? qa->xq : NULL, qa ? qa->xs : 0);
    /* a block's heads [head0, head0 + hbh) of a row: whole A256 chunks / A32 units of it */
    const int64_t bv = (int64_t)atr_hbh(sh) * sh->head_dim;
    if (qo.kind >= 0 && (qo.cols != (int64_t)sh->n_head * sh->head_dim || bv % (qo.kind == KACT_A256 ? 256 : 32)))
      qo.kind = -1;
    attn_tc_dispatch(sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, qo, stream);
    return qo.kind >= 0;
  }
  if (cuda_attn_rows_used(n_tok)) {
    if (sh->kv_bf16) attn_rows_dispatch<true>(sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream);
    else attn_rows_dispatch<false>(sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream);
  } else if (sh->kv_bf16) attn_dispatch<true>(hb, sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream);
  else attn_dispatch<false>(hb, sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream);
  return 0;
}

extern "C" void cuda_attn(const cuda_attn_shape *sh, const float *q, const void *kcache, const void *vcache,
                          const int32_t *pos0, int64_t n_tok, float *out, void *scratch, void *stream) {
  (void)cuda_attn_q(sh, q, kcache, vcache, pos0, n_tok, out, scratch, NULL, stream);
}
