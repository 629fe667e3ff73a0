/* Full attention on the GPU (cuda_ops.h): the per-head q/k RMSNorm + NeoX RoPE + KV-cache write
 * (cuda_attn_prep), and split-K flash-decoding attention over the cache with the combine and the
 * sigmoid output gate in the same launch (cuda_attn). Two kernels give the same bits per row:
 * k_attn (below; decode, and prefill with FLOE_CUDA_ATTN_ROWS=0) runs each row in its own blocks;
 * k_attn_rows (prefill launches of >= 8 rows) runs a block per group of rows and streams each K/V
 * tile once for all of them (ops_attn_rows.cu; its comment says why the bits are k_attn's). The
 * tensor-core order of bfloat16 caches (k_attn_tc, the default there) is in ops_attn_tc.cu.
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

#include "kernels/cuda/ops_attn.cuh"

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

/* the output quantized in k_attn_tc's launch: 1 (the default) where it fits, 0 never;
 * FLOE_CUDA_ATTN_ACT=0 at the first call */
static int g_attn_act = -1;
extern "C" void cuda_attn_set_act(int on) { g_attn_act = on ? 1 : 0; }

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
  rc |= attn_rows_launch(sh, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL);
  ActOut qn;
  memset(&qn, 0, sizeof qn);
  qn.kind = -1;
  if (sh->kv_bf16) rc |= attn_tc_dispatch(sh, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, qn, NULL);
  attn_tc_env();
  (void)attn_rows_min(); /* the environment read at setup */
  (void)attn_mma_on();
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
    attn_rows_launch(sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream);
  } else if (sh->kv_bf16) attn_dispatch<true>(hb, sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream);
  else attn_dispatch<false>(hb, sh, q, kcache, vcache, pos0, n_tok, out, part, cnt, stream);
  return 0;
}

extern "C" void cuda_attn(const cuda_attn_shape *sh, const float *q, const void *kcache, const void *vcache,
                          const int32_t *pos0, int64_t n_tok, float *out, void *scratch, void *stream) {
  (void)cuda_attn_q(sh, q, kcache, vcache, pos0, n_tok, out, scratch, NULL, stream);
}
