/* Full attention on the GPU (cuda_ops.h): the per-head q/k RMSNorm + NeoX RoPE + KV-cache write
 * (cuda_attn_prep), and split-K flash-decoding attention over the cache with the combine and the
 * sigmoid output gate in the same launch (cuda_attn).
 *
 * cuda_attn: block (part c, kv head kh / head batch, row t), 256 threads, HB query heads of the
 * group at once so each K/V row is read once for them. Row t sees np = *pos0 + t + 1 positions,
 * cut into parts of CH = roundup64(ceil(np / n_split)) positions: the cut depends only on np, so
 * a prefill row and the decode of the same position run the same arithmetic (bit-identical).
 *   - Scores: a half-warp per position, lane l holds q[l + 16 j] in registers and computes the
 *     CPU's kern_dot16_rows lane (fmaf over j), then the fixed 16-lane tree: the CPU's bits,
 *     times the scale.
 *   - Softmax and V sum: tiles of 128 positions with a running maximum (online softmax, vexpf),
 *     V summed with fmaf in position order per thread group; the part's (o, max, sum) go to
 *     scratch. Not the CPU's single pass (which normalises before summing): rounding differs.
 *   - The last block of a (row, kv head batch) to finish (a counter in scratch, reset by it)
 *     combines the parts in part order, divides, applies sigmoid(gate), writes out.
 * Parts past the row's length only count themselves done. */
#include <stdio.h>

extern "C" {
#include "base/base.h"
}
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/ops_common.cuh"

#define ATT_THREADS 256
#define ATT_TILE 128    /* positions per online-softmax tile */
#define ATT_MAX_SPLIT 256

static int attn_hb(const cuda_attn_shape *sh) { /* query heads per block: a power of two dividing the group */
  const int G = sh->n_head / sh->n_head_kv, cap = 2048 / sh->head_dim;
  int hb = 1;
  while (hb * 2 <= cap && G % (hb * 2) == 0 && hb * 2 <= 8) hb *= 2;
  return hb;
}

extern "C" int cuda_attn_check(const cuda_attn_shape *sh, char *err, size_t errlen) {
  if (sh->head_dim != 128 && sh->head_dim != 256)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda attention: head_dim %d (128 or 256 supported)", sh->head_dim);
  if (sh->n_head_kv <= 0 || sh->n_head % sh->n_head_kv || sh->n_head / sh->n_head_kv > 16)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda attention: %d heads over %d kv heads (group <= 16)",
                    sh->n_head, sh->n_head_kv);
  if (sh->n_rot < 0 || sh->n_rot % 2 || sh->n_rot > sh->head_dim)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda attention: n_rot %d", sh->n_rot);
  if (sh->n_split < 1 || sh->n_split > ATT_MAX_SPLIT)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda attention: n_split %d (1..%d)", sh->n_split, ATT_MAX_SPLIT);
  if (sh->n_ctx <= 0 || sh->n_ctx > INT32_MAX)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda attention: n_ctx %lld", (long long)sh->n_ctx);
  return 0;
}

static size_t part_floats(const cuda_attn_shape *sh) { return (size_t)sh->head_dim + 2; }

extern "C" size_t cuda_attn_scratch_bytes(const cuda_attn_shape *sh, int64_t n_tok) {
  const int hb = attn_hb(sh), nhb = sh->n_head / sh->n_head_kv / hb;
  const size_t parts = (size_t)n_tok * (size_t)sh->n_head * (size_t)sh->n_split * part_floats(sh) * sizeof(float);
  const size_t cnt = (size_t)n_tok * (size_t)sh->n_head_kv * (size_t)nhb * sizeof(int);
  return (cnt + 255) / 256 * 256 + parts;
}

/* ---- prep: q/k norm + RoPE, K/V into the cache ---- */
/* block (row t, head hh): hh < n_head a query head (in place), else kv head hh - n_head (k normed and
 * rotated into the K cache, v copied into the V cache). blockDim = head_dim. */
static __global__ void __launch_bounds__(256)
    k_attn_prep(float *q, const float *k, const float *v, const float *qn, const float *kn, const float *cs,
                void *kc, void *vc, const int32_t *pos0, int nh, int nkv, int hd, int n_rot, int gated,
                int64_t n_ctx, int bf16, float eps) {
  __shared__ float xs[256];
  __shared__ float rs;
  const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
  const int64_t pos = (int64_t)*pos0 + t;
  if (pos < 0 || pos >= n_ctx) return; /* the caller's bug; never write outside the cache */
  const bool isq = hh < nh;
  const int kh = hh - nh;
  const int64_t qdim = (int64_t)nh * hd * (gated ? 2 : 1), kvd = (int64_t)nkv * hd;
  float *qh = isq ? q + t * qdim + (int64_t)hh * hd * (gated ? 2 : 1) : NULL;
  const float *src = isq ? qh : k + t * kvd + (int64_t)kh * hd;
  xs[i] = src[i];
  __syncthreads();
  if (i < 32) {
    const float ss = ops_sumsq16_warp(xs, hd);
    if (i == 0) rs = 1.0f / sqrtf(__fadd_rn(ss / (float)hd, eps));
  }
  __syncthreads();
  const float y = __fmul_rn(__fmul_rn(xs[i], rs), (isq ? qn : kn)[i]);
  __syncthreads();
  xs[i] = y;
  __syncthreads();
  float o = y;
  const int h2 = n_rot / 2;
  const float *c = cs + pos * n_rot;
  if (i < h2) /* x[j] = a*c - b*s; x[j+h] = b*c + a*s (rope_head) */
    o = __fsub_rn(__fmul_rn(xs[i], c[i]), __fmul_rn(xs[i + h2], c[h2 + i]));
  else if (i < n_rot)
    o = __fadd_rn(__fmul_rn(xs[i], c[i - h2]), __fmul_rn(xs[i - h2], c[i]));
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
  k_attn_prep<<<grid, sh->head_dim, 0, OPS_STREAM(stream)>>>(q, k, v, q_norm, k_norm, rope_cs, kcache, vcache, pos0,
                                                              sh->n_head, sh->n_head_kv, sh->head_dim, sh->n_rot,
                                                              sh->gated, sh->n_ctx, sh->kv_bf16, sh->eps);
}

/* ---- attention ---- */
template <bool BF>
static __device__ __forceinline__ float ld_kv(const void *p, int64_t i) {
  if (BF) return ops_bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}
template <bool BF>
static __device__ __forceinline__ float2 ld_kv2(const void *p, int64_t i) { /* i even */
  if (BF) {
    const uint32_t u = ((const uint32_t *)p)[i / 2];
    return make_float2(ops_bf16_to_f32((uint16_t)(u & 0xffffu)), ops_bf16_to_f32((uint16_t)(u >> 16)));
  }
  return ((const float2 *)p)[i / 2];
}

/* HB query heads per block, LPT = head_dim / 16 elements per lane. */
template <int HB, int LPT, bool BF>
static __global__ void __launch_bounds__(ATT_THREADS)
    k_attn(const float *q, const void *kc, const void *vc, const int32_t *pos0, float *out, float *part, int *cnt,
           int nh, int nkv, int64_t n_ctx, int gated, int n_split, float scale) {
  constexpr int HD = LPT * 16;
  constexpr int NPG = 2 * ATT_THREADS / HD; /* PV: each thread 2 dims, NPG position groups */
  __shared__ float sc[HB][ATT_TILE];
  __shared__ float s_alpha[HB], s_m[HB], s_l[HB];
  __shared__ float red[NPG > 1 ? NPG - 1 : 1][HB][HD];
  __shared__ int s_last;
  const int tid = threadIdx.x, lane16 = tid & 15, hw = tid >> 4, warp = tid >> 5, lane = tid & 31;
  const int G = nh / nkv, nhb = G / HB;
  const int c = blockIdx.x, y = blockIdx.y, t = blockIdx.z;
  const int kh = y / nhb, head0 = kh * G + (y % nhb) * HB;
  const int64_t np = (int64_t)*pos0 + t + 1;
  const int64_t per = (np + n_split - 1) / n_split, CH = (per + 63) / 64 * 64;
  const int nparts = (int)((np + CH - 1) / CH);
  const int64_t p0 = (int64_t)c * CH, p1 = p0 + CH < np ? p0 + CH : np;
  const int qs = HD * (gated ? 2 : 1);
  const int64_t qrow = (int64_t)t * nh * qs;
  const size_t PF = (size_t)HD + 2;
  /* part (t, y, c) holds HB heads: o[HB][HD], then m[HB], l[HB] */
  float *mypart = part + (((size_t)t * gridDim.y + y) * n_split + c) * HB * PF;
  const void *K = BF ? (const void *)((const uint16_t *)kc + (size_t)kh * n_ctx * HD)
                     : (const void *)((const float *)kc + (size_t)kh * n_ctx * HD);
  const void *V = BF ? (const void *)((const uint16_t *)vc + (size_t)kh * n_ctx * HD)
                     : (const void *)((const float *)vc + (size_t)kh * n_ctx * HD);

  if (p0 < np) {
    float qr[HB][LPT];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
      for (int j = 0; j < LPT; j++) qr[h][j] = q[qrow + (int64_t)(head0 + h) * qs + lane16 + 16 * j];
    const int dg = tid % (HD / 2), pg = tid / (HD / 2), d0 = 2 * dg;
    float o0[HB], o1[HB];
#pragma unroll
    for (int h = 0; h < HB; h++) o0[h] = o1[h] = 0.0f;
    if (tid < HB) {
      s_m[tid] = -INFINITY;
      s_l[tid] = 0.0f;
    }
    for (int64_t tp0 = p0; tp0 < p1; tp0 += ATT_TILE) {
      const int npos = (int)(p1 - tp0 < ATT_TILE ? p1 - tp0 : ATT_TILE);
      /* scores: a half-warp per position, two positions per pass (loads of both in flight) */
      for (int pb = 0; pb < npos; pb += 32) {
        const int pa = pb + hw, pbb = pb + 16 + hw;
        float ka[LPT], kb[LPT];
#pragma unroll
        for (int j = 0; j < LPT; j++) {
          ka[j] = pa < npos ? ld_kv<BF>(K, (tp0 + pa) * HD + lane16 + 16 * j) : 0.0f;
          kb[j] = pbb < npos ? ld_kv<BF>(K, (tp0 + pbb) * HD + lane16 + 16 * j) : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < HB; h++) {
          float aa = 0.0f, ab = 0.0f;
#pragma unroll
          for (int j = 0; j < LPT; j++) {
            aa = fmaf(qr[h][j], ka[j], aa);
            ab = fmaf(qr[h][j], kb[j], ab);
          }
          aa = ops_fold16(aa);
          ab = ops_fold16(ab);
          if (lane16 == 0) {
            if (pa < npos) sc[h][pa] = __fmul_rn(aa, scale);
            if (pbb < npos) sc[h][pbb] = __fmul_rn(ab, scale);
          }
        }
      }
      __syncthreads();
      /* online softmax per head: warp w takes heads w, w + 8, ... */
      for (int h = warp; h < HB; h += ATT_THREADS / 32) {
        float mt = -INFINITY;
        for (int p = lane; p < npos; p += 32) mt = fmaxf(mt, sc[h][p]);
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, s));
        const float mo = s_m[h], mn = fmaxf(mo, mt);
        float lt = 0.0f;
        for (int p = lane; p < npos; p += 32) {
          const float e = ops_vexpf(__fsub_rn(sc[h][p], mn));
          sc[h][p] = e;
          lt = __fadd_rn(lt, e);
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) lt = __fadd_rn(lt, __shfl_xor_sync(0xffffffffu, lt, s));
        __syncwarp();
        if (lane == 0) {
          const float al = ops_vexpf(__fsub_rn(mo, mn));
          s_alpha[h] = al;
          s_m[h] = mn;
          s_l[h] = __fadd_rn(__fmul_rn(s_l[h], al), lt);
        }
      }
      __syncthreads();
      /* o = o * alpha + sum_p e_p v_p (fmaf in position order within the group) */
#pragma unroll
      for (int h = 0; h < HB; h++) {
        o0[h] = __fmul_rn(o0[h], s_alpha[h]);
        o1[h] = __fmul_rn(o1[h], s_alpha[h]);
      }
#pragma unroll 4
      for (int p = pg; p < npos; p += NPG) {
        const float2 vv = ld_kv2<BF>(V, (tp0 + p) * HD + d0);
#pragma unroll
        for (int h = 0; h < HB; h++) {
          const float e = sc[h][p];
          o0[h] = fmaf(e, vv.x, o0[h]);
          o1[h] = fmaf(e, vv.y, o1[h]);
        }
      }
      __syncthreads();
    }
    /* the position groups' sums, in group order */
    if (NPG > 1) {
      if (pg > 0)
#pragma unroll
        for (int h = 0; h < HB; h++) {
          red[pg - 1][h][d0] = o0[h];
          red[pg - 1][h][d0 + 1] = o1[h];
        }
      __syncthreads();
      if (pg == 0)
        for (int g = 1; g < NPG; g++)
#pragma unroll
          for (int h = 0; h < HB; h++) {
            o0[h] = __fadd_rn(o0[h], red[g - 1][h][d0]);
            o1[h] = __fadd_rn(o1[h], red[g - 1][h][d0 + 1]);
          }
    }
    if (pg == 0)
#pragma unroll
      for (int h = 0; h < HB; h++) {
        mypart[h * PF + d0] = o0[h];
        mypart[h * PF + d0 + 1] = o1[h];
      }
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
  for (int h = warp; h < HB; h += ATT_THREADS / 32) {
    float M = -INFINITY;
    for (int cc = lane; cc < nparts; cc += 32) M = fmaxf(M, __ldcg(P + ((size_t)cc * HB + h) * PF + HD));
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, s));
    for (int cc = lane; cc < nparts; cc += 32) f[h][cc] = ops_vexpf(__fsub_rn(__ldcg(P + ((size_t)cc * HB + h) * PF + HD), M));
    __syncwarp();
    if (lane == 0) {
      float L = 0.0f;
      for (int cc = 0; cc < nparts; cc++) L = __fadd_rn(L, __fmul_rn(f[h][cc], __ldcg(P + ((size_t)cc * HB + h) * PF + HD + 1)));
      s_inv[h] = L;
    }
  }
  __syncthreads();
  for (int e = tid; e < HB * HD; e += ATT_THREADS) {
    const int h = e / HD, d = e % HD;
    float O = 0.0f;
    for (int cc = 0; cc < nparts; cc++) O = __fadd_rn(O, __fmul_rn(f[h][cc], __ldcg(P + ((size_t)cc * HB + h) * PF + d)));
    float r = O / s_inv[h];
    if (gated) r = __fmul_rn(r, ops_sigmoidf(q[qrow + (int64_t)(head0 + h) * qs + HD + d]));
    out[((int64_t)t * nh + head0 + h) * HD + d] = r;
  }
  if (tid == 0) *ctr = 0; /* ready for the next launch (graph replay) */
}

template <int HB, int LPT>
static void launch_attn(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc, const int32_t *pos0,
                        int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  const int nhb = sh->n_head / sh->n_head_kv / HB;
  dim3 grid((unsigned)sh->n_split, (unsigned)(sh->n_head_kv * nhb), (unsigned)n_tok);
  const float scale = (float)(1.0 / sqrt((double)sh->head_dim));
  if (sh->kv_bf16)
    k_attn<HB, LPT, true><<<grid, ATT_THREADS, 0, OPS_STREAM(stream)>>>(q, kc, vc, pos0, out, part, cnt, sh->n_head,
                                                                       sh->n_head_kv, sh->n_ctx, sh->gated,
                                                                       sh->n_split, scale);
  else
    k_attn<HB, LPT, false><<<grid, ATT_THREADS, 0, OPS_STREAM(stream)>>>(q, kc, vc, pos0, out, part, cnt, sh->n_head,
                                                                        sh->n_head_kv, sh->n_ctx, sh->gated,
                                                                        sh->n_split, scale);
}

extern "C" void cuda_attn(const cuda_attn_shape *sh, const float *q, const void *kcache, const void *vcache,
                          const int32_t *pos0, int64_t n_tok, float *out, void *scratch, void *stream) {
  if (n_tok <= 0) return;
  const int hb = attn_hb(sh);
  /* the counters first: their place must not depend on n_tok (a decode launch after a prefill
   * launch finds them at zero), the partials after them */
  const int nhb = sh->n_head / sh->n_head_kv / hb;
  const size_t cnt_bytes = (size_t)n_tok * (size_t)sh->n_head_kv * (size_t)nhb * sizeof(int);
  int *cnt = (int *)scratch;
  float *part = (float *)((char *)scratch + (cnt_bytes + 255) / 256 * 256);
#define ATT_CASE(H, L) launch_attn<H, L>(sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream)
  if (sh->head_dim == 256) {
    switch (hb) {
    case 1: ATT_CASE(1, 16); break;
    case 2: ATT_CASE(2, 16); break;
    case 4: ATT_CASE(4, 16); break;
    default: ATT_CASE(8, 16); break;
    }
  } else {
    switch (hb) {
    case 1: ATT_CASE(1, 8); break;
    case 2: ATT_CASE(2, 8); break;
    case 4: ATT_CASE(4, 8); break;
    default: ATT_CASE(8, 8); break;
    }
  }
#undef ATT_CASE
}
