/* Shared layer math for the Qwen MoE family: RMSNorm, partial NeoX RoPE, (gated) attention over
 * the KV cache, the GatedDeltaNet recurrence, softmax/top-k MoE with the shared expert.
 * The math follows /work/shared/reference/qwen-models.md §2 (HF transformers 5.17 eager, float32).
 *
 * Row-exactness (see model.h): every function here processes the n rows of a chunk with per-row
 * arithmetic that is the same as for n = 1 and for any thread count. Matmuls go through
 * kern_matmul (row-exact; activation rows are quantized one by one, so quantizing once per input
 * and reusing the rows for every matrix of the same layout changes nothing); the GDN state is
 * advanced token by token (never HF's chunked form); attention row t reads the cache positions
 * 0..pos_t in order; each token's expert outputs are summed in ascending expert order whatever
 * the grouping of tokens per expert.
 *
 * Threads: work is cut into as few pool runs (each one a barrier) as the data dependencies allow.
 * A run executes a list of matmul "tasks" (all the matrices that read the same inputs: q|k|v,
 * the GDN projections, router + shared expert, every routed expert's gate and up, every down)
 * with the 16-row units of all tasks split by estimated cost; attention splits (token, kv head)
 * pairs; the GDN recurrence splits value heads; the conv splits channels. Which thread computes
 * a row never changes its value.
 *
 * Decode floors (35B-A3B shape, Q4_K, 8 layers, 2 threads): see bench/results.tsv and
 * layer_decode_bytes(); the weights read per token are ~0.56 GB, half of them the output matrix. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/gdn_sum.h"
#include "base/vexp.h"
#include "experts/experts.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"

/* Hot element-wise loops are compiled for AVX-512 / AVX2 / baseline and picked at load time
 * (ifunc). Every loop is lane-wise or has a fixed reduction order, and FMA contraction is off
 * for the whole build, so the three clones give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define VEC_FN __attribute__((target_clones("avx512f", "avx2", "default"), optimize("O3")))
#else
#define VEC_FN
#endif

/* Parallel regions run through the session's pool (floe_pool_run); a resident-expert session sets
 * the pool's spin long enough (model_session_new) that its workers wait between the ~60 regions of
 * a token, and between tokens, without sleeping (see pool.c). */
static void layer_run(model_session *s, floe_pool_fn fn, void *ctx) { floe_pool_run(s->pool, fn, ctx); }

/* ---- matmul tasks ---- */
typedef struct mm_task {
  const floe_mat *W;
  int64_t nb;          /* activation rows */
  const float *X;      /* float rows (exact path, and the fallback) */
  int64_t ldx;
  const uint8_t *xq;   /* quantized rows, xqs bytes apart, or NULL: exact float path */
  size_t xqs;
  float *Y;
  int64_t ldy;
  uint64_t *amax;      /* NULL, or (nb = 1) the best kern_argmax_key of Y's rows so far (atomic) */
} mm_task;

/* A few activation rows (the decode rows of several requests, continuous batching) on quantized
 * weights: where the kernel decodes a weight row once for all of them (kern_rows_together: Q4_K /
 * Q5_K on AVX-512) they go in one call; elsewhere its paths for 3..8 rows are slower per row than
 * its 1-2 row paths (bench_matvec q4_K 248320x2048, 2 threads, before the decode-once kernel:
 * nb 1 5.9 ms, 2 9.6 ms, 4 29 ms, 8 33 ms), so such a batch runs as pairs of rows over blocks of
 * SMALL_BLOCK weight rows, the block staying in cache for the next pair. Exact: every row's value
 * does not depend on nb (kern_matmul_batch). */
#define SMALL_NB_MAX 8
#define SMALL_BLOCK 64
static void task_rows(const mm_task *t, int64_t r0, int64_t r1) {
  if (t->xq && t->nb >= 3 && t->nb <= SMALL_NB_MAX && !kern_rows_together(t->W, t->nb)) {
    for (int64_t a = r0; a < r1; a += SMALL_BLOCK) {
      const int64_t b1 = a + SMALL_BLOCK < r1 ? a + SMALL_BLOCK : r1;
      for (int64_t b = 0; b < t->nb; b += 2)
        kern_matmul_batch(t->W, t->nb - b < 2 ? t->nb - b : 2, t->X + b * t->ldx, t->ldx, t->xq + (size_t)b * t->xqs,
                          t->xqs, t->Y + b * t->ldy, t->ldy, a, b1);
    }
  } else {
    kern_matmul_batch(t->W, t->nb, t->X, t->ldx, t->xq, t->xqs, t->Y, t->ldy, r0, r1);
  }
  if (t->amax && r1 > r0) { /* the greedy pick of these rows while they are in this core's cache */
    const int64_t i = r0 + kern_argmax(t->Y + r0, r1 - r0);
    const uint64_t k = kern_argmax_key(t->Y[i], i);
    uint64_t cur = __atomic_load_n(t->amax, __ATOMIC_RELAXED);
    while (k > cur && !__atomic_compare_exchange_n(t->amax, &cur, k, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
  }
}

/* Estimated cost of one 16-row unit: the weight bytes, plus the per-row integer work that grows
 * with the batch (a Q4_K row costs ~1/4 of its decode per extra activation row). */
static int64_t unit_cost(const mm_task *t) { return (int64_t)t->W->row_bytes * 16 * (3 + t->nb) / 4; }

typedef struct mm_list {
  const mm_task *t;
  int n;
  int64_t total;
  int64_t split;  /* cost [0, split) is cut statically, [split, total) taken in chunks */
  int64_t chunk;
  int64_t next;   /* the next chunk's starting cost (atomic) */
} mm_list;

/* Runs the units whose starting cost lies in [lo, hi). Adjacent ranges tile the units exactly. */
static void mm_range(const mm_list *L, int64_t lo, int64_t hi) {
  int64_t c0 = 0;
  for (int i = 0; i < L->n && c0 < hi; i++) {
    const mm_task *t = &L->t[i];
    const int64_t units = (t->W->rows + 15) / 16, cu = unit_cost(t), ct = units * cu;
    if (t->nb > 0 && c0 + ct > lo) {
      int64_t u0 = lo > c0 ? (lo - c0 + cu - 1) / cu : 0;
      int64_t u1 = (hi - c0 + cu - 1) / cu;
      if (u1 > units) u1 = units;
      if (u1 > u0) task_rows(t, u0 * 16, u1 * 16 < t->W->rows ? u1 * 16 : t->W->rows);
    }
    c0 += ct;
  }
}

/* Thread ith first takes the units whose starting cost lies in its share of [0, split), then
 * chunks of the rest from a shared counter until none is left: a thread slowed by the OS or by
 * slower rows (float weights read fewer bytes per second than Q4_K) no longer holds the others at
 * the barrier. The chunks shrink as the rest does (guided: a 1/(2*nth) share of what is left,
 * at least L->chunk), so the last one, the most a thread can still wait for at the end, is small
 * even for the 286 MB output matrix (fixed chunks there were 3.6 MB, ~240 us of one thread).
 * Which thread computes a row never changes its value. */
static void mm_list_worker(void *ctx, int ith, int nth) {
  mm_list *L = ctx;
  const int64_t S = L->split;
  const int64_t lo = S / nth * ith + S % nth * ith / nth;
  const int64_t hi = ith == nth - 1 ? S : S / nth * (ith + 1) + S % nth * (ith + 1) / nth;
  mm_range(L, lo, hi);
  int64_t c = __atomic_load_n(&L->next, __ATOMIC_RELAXED);
  while (c < L->total) {
    int64_t n = (L->total - c) / (2 * nth);
    if (n < L->chunk) n = L->chunk;
    const int64_t e = c + n < L->total ? c + n : L->total;
    if (__atomic_compare_exchange_n(&L->next, &c, e, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      mm_range(L, c, e);
      c = e;
    } /* else c holds the counter's current value: retry from there */
  }
}

static void mm_run(model_session *s, const mm_task *t, int n) {
  mm_list L = { t, n, 0, 0, 0, 0 };
  int64_t rows = 0;
  for (int i = 0; i < n; i++)
    if (t[i].nb > 0) {
      L.total += (t[i].W->rows + 15) / 16 * unit_cost(&t[i]);
      rows += t[i].W->rows;
    }
  if (L.total == 0) return;
  const int nth = s->pool ? floe_pool_size(s->pool) : 1;
  /* the last fifth in guided chunks (mm_list_worker) of at least ~64 KB of weights at one row */
  L.split = L.total - L.total / 5;
  L.chunk = 65536;
  L.next = L.split;
  if (nth > 1 && rows >= 64) layer_run(s, mm_list_worker, &L);
  else
    for (int i = 0; i < n; i++)
      if (t[i].nb > 0) task_rows(&t[i], 0, t[i].W->rows);
}

/* ---- activation quantization ---- */
/* a and b take the same quantized activation rows */
bool layer_same_act(const floe_mat *a, const floe_mat *b) {
  if (a->type != b->type || a->cols != b->cols) return false;
  if (a->type != FLOE_TYPE_MLX) return true;
  return a->mlx.bits == b->mlx.bits && a->mlx.group == b->mlx.group && a->mlx.sb_type == b->mlx.sb_type;
}

typedef struct aq_job {
  const floe_mat *W;
  const float *X;
  int64_t ldx;
  uint8_t *buf;
  size_t stride;
  int64_t nb;
} aq_job;

static void aq_worker(void *ctx, int ith, int nth) {
  const aq_job *j = ctx;
  int64_t b0, b1;
  floe_split_range(j->nb, 1, ith, nth, &b0, &b1);
  for (int64_t b = b0; b < b1; b++) kern_act_quantize(j->W, j->X + b * j->ldx, j->buf + (size_t)b * j->stride);
}

/* Quantizes nb rows of X for matrices laid out like W into buf (rows *stride bytes apart).
 * Returns NULL (exact float path) when the session runs exact or W's type has no quantized path. */
static const uint8_t *act_prep(model_session *s, uint8_t *buf, const floe_mat *W, int64_t nb, const float *X,
                               int64_t ldx, size_t *stride) {
  *stride = 0;
  if (!s->act_q || nb <= 0) return NULL;
  const size_t ab = kern_act_bytes(W);
  if (!ab || ab > s->xq_row) return NULL;
  *stride = ab;
  aq_job j = { W, X, ldx, buf, ab, nb };
  if (s->pool && floe_pool_size(s->pool) > 1 && nb >= 4) layer_run(s, aq_worker, &j);
  else aq_worker(&j, 0, 1);
  return buf;
}

/* A task of W over rows prepared for layout `lay` (xq) when W shares that layout, else float. */
static mm_task task(const floe_mat *W, int64_t nb, const float *X, int64_t ldx, const floe_mat *lay,
                    const uint8_t *xq, size_t xqs, float *Y, int64_t ldy) {
  mm_task t = { W, nb, X, ldx, NULL, 0, Y, ldy, NULL };
  if (xq && lay && layer_same_act(W, lay)) {
    t.xq = xq;
    t.xqs = xqs;
  }
  return t;
}

/* One batch of at most MODEL_MAX_BATCH rows; amax: NULL, or (n = 1) mm_task.amax */
static void matmul_batch(model_session *s, const floe_mat *W, int64_t n, const float *X, int64_t ldx, float *Y,
                         int64_t ldy, uint64_t *amax) {
  size_t xs;
  const uint8_t *xq = act_prep(s, s->xq_m, W, n, X, ldx, &xs);
  mm_task t = task(W, n, X, ldx, W, xq, xs, Y, ldy);
  t.amax = amax;
  mm_run(s, &t, 1);
}

void layer_matmul(model_session *s, const floe_mat *W, int64_t nb, const float *X, int64_t ldx, float *Y,
                  int64_t ldy) {
  for (int64_t b = 0; b < nb; b += MODEL_MAX_BATCH)
    matmul_batch(s, W, nb - b < MODEL_MAX_BATCH ? nb - b : MODEL_MAX_BATCH, X + b * ldx, ldx, Y + b * ldy, ldy, NULL);
}

int64_t layer_matmul_argmax(model_session *s, const floe_mat *W, const float *x, float *y) {
  if (W->rows >= (int64_t)UINT32_MAX) { /* beyond kern_argmax_key's index field: after the rows */
    matmul_batch(s, W, 1, x, W->cols, y, W->rows, NULL);
    return kern_argmax(y, W->rows);
  }
  uint64_t key = 0;
  matmul_batch(s, W, 1, x, W->cols, y, W->rows, &key);
  return kern_argmax_key_index(key);
}

/* ---- elementwise ---- */
/* exp(x) in plain float arithmetic, so that loops over it vectorize (libm's expf is a call per
 * element): floe_vexpf (base/vexp.h, shared with the CUDA kernels); within 1 ulp of libm expf on
 * [-87, 88] (checked over every float). Every clone of a VEC_FN loop and every caller (decode or
 * prefill) computes the same bits. Used by the attention softmax, every sigmoid / SiLU and the
 * router's softmax. */
static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch threshold 20 */

/* 16 lane sums folded in halves (8, 4, 2, 1): the fixed end of sumsq16 and router_softmax. */
static inline __attribute__((always_inline)) float fold16(float acc[16]) {
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; k++) acc[k] += acc[k + w];
  return acc[0];
}

/* sum of x[i]^2 in a fixed order that vectorizes: lane k (of 16) sums x[k], x[k+16], ... in
 * order, the tail included, then fold16. A sequential sum is a chain of n dependent adds (~3.5 us
 * for the 2048-wide norms, on the serial path between regions); every clone and every caller
 * (decode, prefill) gets the same bits from this order. */
static inline __attribute__((always_inline)) float sumsq16(const float *x, int64_t n) {
  float acc[16] = { 0 };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += x[i + k] * x[i + k];
  for (int k = 0; i + k < n; k++) acc[k] += x[i + k] * x[i + k];
  return fold16(acc);
}

/* x[i] += y[i] */
VEC_FN static void vadd(float *x, const float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* y[i] += c[i] * w */
VEC_FN static void vaxpy(float *y, const float *c, float w, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += c[i] * w;
}

/* HF: x * rsqrt(mean(x^2) + eps), then times the weight (1+w folded in for zero-centred norms). */
VEC_FN void layer_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) {
  const float ss = sumsq16(x, n);
  float r = 1.0f / sqrtf(ss / (float)n + eps);
  for (int64_t i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

/* NeoX rotation of dims [0, n_rot) of one head: pairs (j, j + n_rot/2). HF computes
 * inv_freq = 1/theta^(2i/R) and cos/sin of pos*inv_freq in float32; layer_rope_table computes them
 * once per position for all heads (and, uploaded, for the GPU kernels: the same bits) (cs: [n_rot/2] cos, then [n_rot/2] sin). */
void layer_rope_table(float *cs, int64_t n_rot, float theta, int64_t pos) {
  const int64_t h = n_rot / 2;
  for (int64_t j = 0; j < h; j++) {
    const float inv = 1.0f / powf(theta, (float)(2 * j) / (float)n_rot);
    const float ang = (float)pos * inv;
    cs[j] = cosf(ang);
    cs[h + j] = sinf(ang);
  }
}

static void rope_head(float *x, int64_t n_rot, const float *cs) {
  const int64_t h = n_rot / 2;
  for (int64_t j = 0; j < h; j++) {
    const float c = cs[j], sn = cs[h + j];
    const float a = x[j], b = x[j + h];
    x[j] = a * c - b * sn;
    x[j + h] = b * c + a * sn;
  }
}

/* Per-thread scratch (model_session_new sizes it): [grp][n_ctx] scores, then 2 rows of hd. */
static float *tscratch(model_session *s, int ith) { return s->tscr + (size_t)ith * (size_t)s->tscr_n; }

/* ---- full attention ---- */
typedef struct attn_job {
  model_session *s;          /* the KV cache and the per-thread scratch */
  int64_t l, n, pos0, qdim, kvd, grp, hd, nkv, hsplit;
  bool gated;
  float scale;
  const float *q;            /* [n][qdim] the rows' queries (the session's s->q, or a pass's rows) */
  float *att;                /* [n][n_head * hd] their outputs */
} attn_job;

/* One (token t, kv head kh, query heads [h0, h1) of its group). Scores: kern_dot16_rows (16
 * FMA lanes and the fixed reduction; a sequential FMA sum when hd % 16 != 0), times the scale;
 * the softmax with vexpf and a 16-lane sum; the output: kern_wsum_rows, fma(w_p, v_p, o) in
 * position order. The arithmetic of a head does not depend on which other heads share its unit,
 * so the split of the group over threads (layer_attention) never changes a value. */
static inline __attribute__((always_inline)) void attn_one(const attn_job *j, int64_t t, int64_t kh, int64_t h0,
                                                           int64_t h1, float *scr) {
  model_session *s = j->s;
  const kv_state *kv = &s->kv;
  const int64_t hd = j->hd, np = j->pos0 + t + 1, nctx = kv->n_ctx, ldkv = hd;
  const int64_t qstride = hd * (j->gated ? 2 : 1), nh = h1 - h0;
  const int bf = kv->kv_type == KV_BF16;
  const void *K = kv_head_rows(kv, j->l, false, kh), *V = kv_head_rows(kv, j->l, true, kh);
  const float *q0 = j->q + t * j->qdim + (kh * j->grp + h0) * qstride;
  float *o0 = j->att + t * s->m->hp.n_head * hd + (kh * j->grp + h0) * hd;
  if (hd % 16 == 0) kern_dot16_rows(q0, qstride, (int)nh, K, bf, ldkv, np, hd, scr, nctx);
  else
    for (int64_t h = 0; h < nh; h++)
      for (int64_t p = 0; p < np; p++) {
        float d = 0.0f;
        for (int64_t i = 0; i < hd; i++)
          d = fmaf(q0[h * qstride + i], bf ? floe_bf16_to_f32(((const uint16_t *)K)[p * ldkv + i]) : ((const float *)K)[p * ldkv + i], d);
        scr[h * nctx + p] = d;
      }
  /* the first rows of V into L2 while the softmax runs (kern_wsum_rows prefetches each block of
   * positions during the one before; the first had none) */
  for (int64_t p = 0; p < np && p < 64; p++)
    for (int64_t i = 0; i < hd * (bf ? 2 : 4); i += 64) __builtin_prefetch((const char *)V + (p * ldkv) * (bf ? 2 : 4) + i, 0, 2);
  for (int64_t h = 0; h < nh; h++) {
    /* scale, and the maximum in 16 lanes (a lane-wise select: it vectorizes, where one running
     * maximum was a chain of ~2048 dependent compares; 6.8 -> 2.7 TSC cycles per head and
     * position at depth 2048). The maximum of a set does not depend on the order (a zero's sign
     * may, and x - (+0) and x - (-0) give the same exp) */
    float *sc = scr + h * nctx, acc[16] = { 0 }, mx[16];
    const int64_t n16 = np / 16 * 16;
    for (int i = 0; i < 16; i++) mx[i] = -INFINITY;
    for (int64_t p = 0; p < n16; p += 16)
      for (int i = 0; i < 16; i++) {
        const float v = sc[p + i] * j->scale;
        sc[p + i] = v;
        mx[i] = v > mx[i] ? v : mx[i];
      }
    for (int64_t p = n16; p < np; p++) {
      const float v = sc[p] * j->scale;
      sc[p] = v;
      mx[0] = v > mx[0] ? v : mx[0];
    }
    float m0 = mx[0];
    for (int i = 1; i < 16; i++) m0 = mx[i] > m0 ? mx[i] : m0;
    for (int64_t p = 0; p < n16; p += 16)
      for (int i = 0; i < 16; i++) {
        sc[p + i] = floe_vexpf(sc[p + i] - m0);
        acc[i] += sc[p + i];
      }
    float sm = 0.0f;
    for (int i = 0; i < 16; i++) sm += acc[i];
    for (int64_t p = n16; p < np; p++) {
      sc[p] = floe_vexpf(sc[p] - m0);
      sm += sc[p];
    }
    for (int64_t p = 0; p < np; p++) sc[p] = sc[p] / sm;
    memset(o0 + h * hd, 0, (size_t)hd * sizeof(float));
  }
  kern_wsum_rows(scr, nctx, (int)nh, V, bf, ldkv, np, hd, o0, hd);
  if (j->gated)
    for (int64_t h = 0; h < nh; h++) {
      const float *g = q0 + h * qstride + hd;
      float *oh = o0 + h * hd;
      for (int64_t i = 0; i < hd; i++) oh[i] *= floe_sigmoidf(g[i]);
    }
}

/* Units are (token, kv head, part of its query-head group); hsplit parts per group. */
VEC_FN static void attn_worker(void *ctx, int ith, int nth) {
  const attn_job *j = ctx;
  const int64_t hs = j->hsplit, per = (j->grp + hs - 1) / hs;
  int64_t a0, a1;
  floe_split_range(j->n * j->nkv * hs, 1, ith, nth, &a0, &a1);
  for (int64_t a = a0; a < a1; a++) {
    const int64_t t = a / (j->nkv * hs), kh = a / hs % j->nkv, h0 = a % hs * per;
    const int64_t h1 = h0 + per < j->grp ? h0 + per : j->grp;
    if (h1 > h0) attn_one(j, t, kh, h0, h1, tscratch(j->s, ith));
  }
}

/* Norm and the q / k / v projections of n rows into s->q, s->k, s->v. */
static void attn_in(model_session *s, const model_layer *L, const float *x, int64_t n, int64_t qdim, int64_t kvd) {
  const int64_t E = s->m->hp.n_embd;
  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, L->attn_norm, E, s->m->hp.rms_eps, s->h + t * E);
  size_t xs;
  const uint8_t *xq = act_prep(s, s->xq_h, &L->wq, n, s->h, E, &xs);
  mm_task tk[3] = { task(&L->wq, n, s->h, E, &L->wq, xq, xs, s->q, qdim),
                    task(&L->wk, n, s->h, E, &L->wq, xq, xs, s->k, kvd),
                    task(&L->wv, n, s->h, E, &L->wq, xq, xs, s->v, kvd) };
  mm_run(s, tk, 3);
}

/* The per-session part of attention for n rows at positions pos0..: q / k norms and RoPE and the
 * rows' k / v into s's cache (attn_prep, serial), then attention over it (attn_core: the job's
 * units on s's pool). q, k, v, att: the rows' buffers (s's own, or rows of a multi-session pass);
 * s gives the cache, the pool and the per-thread scratch. */
static attn_job attn_prep(model_session *s, const model_layer *L, int64_t l, int64_t n, int64_t pos0, bool gated,
                          float *qb, float *kb, const float *vb, float *att) {
  const floe_hparams *hp = &s->m->hp;
  const int64_t nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim;
  const int64_t qdim = nh * hd * (gated ? 2 : 1), kvd = nkv * hd;
  const float eps = hp->rms_eps, scale = (float)(1.0 / sqrt((double)hd));
  float *cs = s->kvtmp; /* [n_rot] (kvtmp holds 2*kvd >= n_rot floats) */
  for (int64_t t = 0; t < n; t++) {
    float *q = qb + t * qdim, *k = kb + t * kvd;
    layer_rope_table(cs, hp->n_rot, hp->rope_theta, pos0 + t);
    for (int64_t hh = 0; hh < nh; hh++) {
      float *qh = q + hh * hd * (gated ? 2 : 1);
      layer_rmsnorm(qh, L->q_norm, hd, eps, qh);
      rope_head(qh, hp->n_rot, cs);
    }
    for (int64_t hh = 0; hh < nkv; hh++) {
      layer_rmsnorm(k + hh * hd, L->k_norm, hd, eps, k + hh * hd);
      rope_head(k + hh * hd, hp->n_rot, cs);
    }
    kv_put(&s->kv, l, pos0 + t, k, vb + t * kvd);
  }

  /* fewer (token, kv head) pairs than threads (decode with few kv heads): split the query heads */
  const int nth = s->pool ? floe_pool_size(s->pool) : 1; /* the pool that will run the units */
  int64_t hsplit = 1;
  while (n * nkv * hsplit < nth && hsplit < nh / nkv) hsplit++;
  return (attn_job){ s, l, n, pos0, qdim, kvd, nh / nkv, hd, nkv, hsplit, gated, scale, qb, att };
}

static void attn_core(model_session *s, const model_layer *L, int64_t l, int64_t n, int64_t pos0, bool gated, float *qb,
                      float *kb, const float *vb, float *att) {
  attn_job aj = attn_prep(s, L, l, n, pos0, gated, qb, kb, vb, att);
  const int nth = s->pool ? floe_pool_size(s->pool) : 1;
  if (nth > 1 && n * aj.nkv * aj.hsplit > 1) layer_run(s, attn_worker, &aj);
  else attn_worker(&aj, 0, 1);
}

/* The attention of several sessions in one pool run: each thread takes, in every session, the
 * units it would take in that session's own run (attn_worker), so every value is attn_core's. */
typedef struct attn_jobs {
  const attn_job *j;
  int k;
} attn_jobs;
static void attn_multi_worker(void *ctx, int ith, int nth) {
  const attn_jobs *J = ctx;
  for (int i = 0; i < J->k; i++) attn_worker((void *)&J->j[i], ith, nth);
}

void layer_attention(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0, bool gated) {
  const double t0 = floe_time_s();
  const floe_hparams *hp = &s->m->hp;
  const model_layer *L = &s->m->layers[l];
  const int64_t E = hp->n_embd, nh = hp->n_head, hd = hp->head_dim;
  const int64_t qdim = nh * hd * (gated ? 2 : 1), kvd = hp->n_head_kv * hd;
  attn_in(s, L, x, n, qdim, kvd);
  attn_core(s, L, l, n, pos0, gated, s->q, s->k, s->v, s->att);
  layer_matmul(s, &L->wo, n, s->att, nh * hd, s->out, E);
  vadd(x, s->out, n * E);
  s->ph[MODEL_PH_ATTN] += floe_time_s() - t0;
}

/* Attention of several sessions' rows in one pass: the projections (q / k / v in, o out) once
 * over all N rows in lead's scratch, the per-session part (cache, attention) per segment on the
 * segment's rows of those buffers. Row for row the arithmetic of layer_attention. */
void layer_attention_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N, bool gated) {
  const double t0 = floe_time_s();
  const floe_hparams *hp = &lead->m->hp;
  const model_layer *L = &lead->m->layers[l];
  const int64_t E = hp->n_embd, nh = hp->n_head, hd = hp->head_dim;
  const int64_t qdim = nh * hd * (gated ? 2 : 1), kvd = hp->n_head_kv * hd;
  attn_in(lead, L, x, N, qdim, kvd);
  bool one_pool = lead->pool && floe_pool_size(lead->pool) > 1; /* as in layer_gdn_multi */
  for (int i = 0; i < k; i++) one_pool = one_pool && r[i].s->pool == lead->pool;
  if (one_pool) {
    attn_job aj[k];
    for (int i = 0; i < k; i++)
      aj[i] = attn_prep(r[i].s, L, l, r[i].n, r[i].s->kv.n_past, gated, lead->q + r[i].off * qdim,
                        lead->k + r[i].off * kvd, lead->v + r[i].off * kvd, lead->att + r[i].off * nh * hd);
    attn_jobs J = { aj, k };
    layer_run(lead, attn_multi_worker, &J);
  } else {
    for (int i = 0; i < k; i++)
      attn_core(r[i].s, L, l, r[i].n, r[i].s->kv.n_past, gated, lead->q + r[i].off * qdim, lead->k + r[i].off * kvd,
                lead->v + r[i].off * kvd, lead->att + r[i].off * nh * hd);
  }
  layer_matmul(lead, &L->wo, N, lead->att, nh * hd, lead->out, E);
  vadd(x, lead->out, N * E);
  lead->ph[MODEL_PH_ATTN] += floe_time_s() - t0;
}

/* ---- GatedDeltaNet ---- */
typedef struct gdn_job {
  model_session *s;          /* the recurrent state and the per-thread scratch */
  const model_layer *L;
  int64_t l, n, C, K, Nk, Nv, dk, dv, r;
  /* the rows' buffers (the session's own, or rows of a multi-session pass) */
  const float *mix, *b, *a, *z; /* [n][C] projected q | k | v, [n][Nv], [n][Nv], [n][vd] */
  float *raw, *o;               /* [n][C] conv output, [n][vd] normed output */
} gdn_job;

/* Kernel-4 causal conv of channels [c0, c1): the taps oldest first, then SiLU, and the window
 * shifted (s0 <- s1 <- s2 <- mix) in the same pass: the arithmetic of the tap-at-a-time loops of
 * gdn_conv_worker, per channel, in one sweep over the 7 input rows instead of 5 sweeps and 3 copies. */
static inline __attribute__((always_inline)) void conv4_range(float *restrict c, float *restrict s0, float *restrict s1,
                                                              float *restrict s2, const float *restrict w0,
                                                              const float *restrict w1, const float *restrict w2,
                                                              const float *restrict w3, const float *restrict mix,
                                                              int64_t c0, int64_t c1) {
  for (int64_t ch = c0; ch < c1; ch++) {
    float a = 0.0f;
    a += w0[ch] * s0[ch];
    a += w1[ch] * s1[ch];
    a += w2[ch] * s2[ch];
    c[ch] = floe_siluf(a + w3[ch] * mix[ch]);
    s0[ch] = s1[ch];
    s1[ch] = s2[ch];
    s2[ch] = mix[ch];
  }
}

/* Causal depthwise conv over [state_0 .. state_{K-2}, mix_t], oldest first, then SiLU, for the
 * channels [c0, c1) and every token in order; output into raw [n][C]. Channels are split in whole
 * key heads (dk), so each thread also applies the L2 norm (eps 1e-6) of the q / k heads it owns,
 * q scaled by dk^-0.5, right after their conv. Per channel the taps are summed oldest first, as
 * before; the weights are read channel-major (conv_wt) so the loop vectorizes over channels. */
VEC_FN static void gdn_conv_worker(void *ctx, int ith, int nth) {
  const gdn_job *j = ctx;
  model_session *s = j->s;
  const int64_t C = j->C, K = j->K, dk = j->dk, kd = j->Nk * dk;
  const float qscale = (float)(1.0 / sqrt((double)dk));
  const float *wt = j->L->conv_wt;
  float *conv = s->kv.conv[j->l];
  int64_t c0, c1;
  floe_split_range(C, dk, ith, nth, &c0, &c1);
  for (int64_t t = 0; t < j->n; t++) {
    const float *mix = j->mix + t * C;
    if (s->kv.keep_n) { /* a kept chunk: row t's window starts as row t-1's, in its own buffer */
      const float *in = kv_conv_in(&s->kv, j->l, t);
      conv = kv_conv_out(&s->kv, j->l, t);
      for (int64_t q = 0; q < K - 1; q++) memcpy(conv + q * C + c0, in + q * C + c0, (size_t)(c1 - c0) * 4);
    }
    float *c = j->raw + t * C;
    if (K == 4) /* the Qwen kernel: one pass over the channels, every tap and the shift */
      conv4_range(c, conv, conv + C, conv + 2 * C, wt, wt + C, wt + 2 * C, wt + 3 * C, mix, c0, c1);
    else {
      for (int64_t ch = c0; ch < c1; ch++) c[ch] = 0.0f; /* one tap at a time: each pass vectorizes */
      for (int64_t q = 0; q < K - 1; q++)
        for (int64_t ch = c0; ch < c1; ch++) c[ch] += wt[q * C + ch] * conv[q * C + ch];
      for (int64_t ch = c0; ch < c1; ch++) c[ch] = floe_siluf(c[ch] + wt[(K - 1) * C + ch] * mix[ch]);
      for (int64_t q = 0; q + 1 < K - 1; q++) memcpy(conv + q * C + c0, conv + (q + 1) * C + c0, (size_t)(c1 - c0) * 4);
      memcpy(conv + (K - 2) * C + c0, mix + c0, (size_t)(c1 - c0) * 4);
    }
    for (int64_t h0 = c0; h0 < c1 && h0 < 2 * kd; h0 += dk) { /* q heads, then k heads */
      float *v = c + h0;
      const float ss = sumsq16(v, dk);
      const float rn = 1.0f / sqrtf(ss + 1e-6f);
      if (h0 < kd)
        for (int64_t i = 0; i < dk; i++) v[i] = (v[i] * rn) * qscale;
      else
        for (int64_t i = 0; i < dk; i++) v[i] = v[i] * rn;
    }
  }
}

/* The two passes over one value head's state S (dk rows of dv) for the columns [j0, j0 + W), W
 * a compile-time width (16: one AVX-512 vector), with the GDN_ACC accumulators of each column in
 * registers (acc[u] takes rows i = u mod GDN_ACC, in row order; base/gdn_sum.h):
 *   pass 1: S = (Sin ? Sin : S) * decay, out = fold8(sum S k)      (S^T k, before the delta)
 *   pass 2: S = S + k * delta, out = fold8(sum S q)                (S^T q)
 * Row-major S is walked a column block at a time (W floats of each row), so the accumulators
 * never leave the registers; the rows' order and every operation are those of the row-at-a-time
 * form. pf / pf_n: this block's share of the next head's state to prefetch (pf_n floats, spread
 * over the row groups). */
typedef float gdn_v16 __attribute__((vector_size(64), aligned(4))); /* 16 floats, unaligned access */

/* T: float (W = 1) or gdn_v16 (W = 16 lanes); each lane is one column, so both are the same
 * per-column operations. */
#define GDN_PASS_BLK(NAME, T)                                                                                      \
  static inline __attribute__((always_inline)) void NAME(const int two, float *restrict S, const float *restrict Sin, \
                                                         int64_t dk, int64_t dv, int64_t j0, float decay,            \
                                                         const float *restrict kk, const float *restrict qq,         \
                                                         const float *restrict delta, float *restrict out,           \
                                                         const float *pf, int64_t pf_n) {                            \
    T acc[GDN_ACC], d = (T){0};                                                                                  \
    for (int u = 0; u < GDN_ACC; u++) acc[u] = (T){0};                                                           \
    if (two) d = *(const T *)(delta + j0);                                                                       \
    const int64_t ng = (dk + GDN_ACC - 1) / GDN_ACC, per = pf ? (pf_n + ng - 1) / ng : 0;                       \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      for (int64_t p = g * per; p < (g + 1) * per && p < pf_n; p += 16) __builtin_prefetch(pf + p, 0, 2);       \
      _Pragma("GCC unroll 8") for (int u = 0; u < GDN_ACC; u++) {                                                \
        const int64_t i = g * GDN_ACC + u;                                                                       \
        if (i < dk) {                                                                                            \
          T *row = (T *)(S + i * dv + j0);                                                                       \
          T x;                                                                                                   \
          if (two) {                                                                                             \
            x = *row + kk[i] * d;                                                                                \
            acc[u] += x * qq[i];                                                                                 \
          } else {                                                                                               \
            x = (Sin ? *(const T *)(Sin + i * dv + j0) : *row) * decay;                                          \
            acc[u] += x * kk[i];                                                                                 \
          }                                                                                                      \
          *row = x;                                                                                              \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    *(T *)(out + j0) = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));        \
  }
_Static_assert(GDN_ACC == 8, "the fold below is floe_gdn_fold8's tree");
GDN_PASS_BLK(gdn_pass_v16, gdn_v16)
GDN_PASS_BLK(gdn_pass_1, float)
#undef GDN_PASS_BLK

/* One pass over a head's columns: blocks of 16, then single columns. pf: the next head's state
 * slice for this pass (pf_n floats, shared out over the blocks), or NULL. */
static inline __attribute__((always_inline)) void gdn_pass(const int two, float *restrict S, const float *restrict Sin,
                                                           int64_t dk, int64_t dv, float decay, const float *kk,
                                                           const float *qq, const float *delta, float *out,
                                                           const float *pf, int64_t pf_n) {
  const int64_t nb = dv / 16, share = nb ? pf_n / nb : 0;
  for (int64_t b = 0; b < nb; b++)
    gdn_pass_v16(two, S, Sin, dk, dv, 16 * b, decay, kk, qq, delta, out, pf ? pf + b * share : NULL, share);
  for (int64_t j = 16 * nb; j < dv; j++) gdn_pass_1(two, S, Sin, dk, dv, j, decay, kk, qq, delta, out, NULL, 0);
}

VEC_FN void layer_gdn_head(float *S, const float *Sin, int64_t dk, int64_t dv, float decay, float beta, const float *k,
                           const float *q, const float *v, float *kv, float *o, const float *Sn) {
  /* the next head's state is fetched into L2 while this head runs, half during each pass, spread
   * over the row groups (microbenchmark of the row-at-a-time form, 16 cold heads a thread, 2
   * threads: 94 -> 82 us; all of it during the second pass: 94; none: 100) */
  const int64_t half = dk * (dv / 2);
  gdn_pass(0, S, Sin, dk, dv, decay, k, q, NULL, kv, Sn, half);
  for (int64_t jj = 0; jj < dv; jj++) kv[jj] = (v[jj] - kv[jj]) * beta; /* delta */
  gdn_pass(1, S, NULL, dk, dv, decay, k, q, kv, o, Sn ? Sn + half : NULL, half);
}

/* Delta-rule recurrence and gated RMSNorm for value heads [h0, h1), every token in order.
 * Two passes over S per token: (decay, S^T k) then (rank-1 update, S^T q); each element sees
 * the same operations in the same order as the four-pass form of the reference. The sums over
 * the key dimension take base/gdn_sum.h's order (row i into accumulator row i % GDN_ACC, then
 * floe_gdn_fold8), which the CUDA kernels share. */
VEC_FN static void gdn_heads_worker(void *ctx, int ith, int nth) {
  const gdn_job *j = ctx;
  model_session *s = j->s;
  const model *m = s->m;
  const model_layer *L = j->L;
  const int64_t Nk = j->Nk, Nv = j->Nv, dk = j->dk, dv = j->dv, r = j->r, C = j->C;
  const int64_t kd = Nk * dk, vd = Nv * dv;
  const float eps = m->hp.rms_eps;
  float *kv = tscratch(s, ith); /* S^T k, then the delta */
  int64_t h0, h1;
  floe_split_range(Nv, 1, ith, nth, &h0, &h1);
  for (int64_t t = 0; t < j->n; t++) {
    const float *c = j->raw + t * C;
    const float *q = c, *k = c + kd, *v = c + 2 * kd;
    float *o = j->o + t * vd;
    const float *bt = j->b + t * Nv, *at = j->a + t * Nv, *zt = j->z + t * vd;
    for (int64_t hv = h0; hv < h1; hv++) {
      const int64_t kh = m->v_tiled ? hv % Nk : hv / r;
      const float *kk = k + kh * dk, *qq = q + kh * dk, *vv = v + hv * dv;
      const float beta = floe_sigmoidf(bt[hv]);
      const float decay = expf(L->ssm_a[hv] * softplusf(at[hv] + L->dt_bias[hv]));
      float *S = kv_ssm_out(&s->kv, j->l, t) + hv * dk * dv, *oh = o + hv * dv;
      /* a kept chunk (kv.h): the first pass reads row t-1's state and writes row t's; the same
       * arithmetic as the in-place pass below (-ffp-contract=off: no fusing either way) */
      const float *Sin = s->kv.keep_n ? kv_ssm_in(&s->kv, j->l, t) + hv * dk * dv : NULL;
      const float *Sn = hv + 1 < h1 && !Sin ? S + dk * dv : NULL; /* the next head's state */
      layer_gdn_head(S, Sin, dk, dv, decay, beta, kk, qq, vv, kv, oh, Sn);
      /* gated RMSNorm per value head: (w * (o * rsqrt(mean(o^2)+eps))) * silu(z) */
      const float ss = sumsq16(oh, dv);
      const float rr = 1.0f / sqrtf(ss / (float)dv + eps);
      const float *zh = zt + hv * dv;
      for (int64_t jj = 0; jj < dv; jj++) oh[jj] = (L->ssm_norm[jj] * (oh[jj] * rr)) * floe_siluf(zh[jj]);
    }
  }
}

/* Norm and the input projections of n rows into s->mix (q | k | v), s->z, s->b, s->a. */
static void gdn_in(model_session *s, const model_layer *L, const float *x, int64_t n) {
  const floe_hparams *hp = &s->m->hp;
  const int64_t E = hp->n_embd, Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
  const int64_t dv = hp->ssm_d_inner / Nv, r = Nv / Nk;
  const int64_t kd = Nk * dk, vd = Nv * dv, C = 2 * kd + vd;
  const float eps = hp->rms_eps;
  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, L->attn_norm, E, eps, s->h + t * E);
  const int64_t gq = 2 * dk + 2 * r * dv, gb = 2 * r;
  const floe_mat *lay = L->qkvz_grouped ? &L->ssm_qkvz : &L->ssm_qkv;
  size_t xs;
  const uint8_t *xq = act_prep(s, s->xq_h, lay, n, s->h, E, &xs);
  mm_task tk[4];
  int nt = 0;
  if (L->qkvz_grouped) tk[nt++] = task(&L->ssm_qkvz, n, s->h, E, lay, xq, xs, s->raw, Nk * gq);
  else {
    tk[nt++] = task(&L->ssm_qkv, n, s->h, E, lay, xq, xs, s->mix, C);
    tk[nt++] = task(&L->ssm_z, n, s->h, E, lay, xq, xs, s->z, vd);
  }
  if (L->ba_grouped) tk[nt++] = task(&L->ssm_ba, n, s->h, E, lay, xq, xs, s->raw2, Nk * gb);
  else {
    tk[nt++] = task(&L->ssm_b, n, s->h, E, lay, xq, xs, s->b, Nv);
    tk[nt++] = task(&L->ssm_alpha, n, s->h, E, lay, xq, xs, s->a, Nv);
  }
  mm_run(s, tk, nt);
  if (L->qkvz_grouped) {
    /* HF Qwen3-Next in_proj_qkvz: per key head g: [q(dk) | k(dk) | v(r*dv) | z(r*dv)] */
    for (int64_t t = 0; t < n; t++) {
      const float *rw = s->raw + t * Nk * gq;
      float *mix = s->mix + t * C, *z = s->z + t * vd;
      for (int64_t g = 0; g < Nk; g++) {
        const float *p = rw + g * gq;
        memcpy(mix + g * dk, p, (size_t)dk * 4);
        memcpy(mix + kd + g * dk, p + dk, (size_t)dk * 4);
        memcpy(mix + 2 * kd + g * r * dv, p + 2 * dk, (size_t)(r * dv) * 4);
        memcpy(z + g * r * dv, p + 2 * dk + r * dv, (size_t)(r * dv) * 4);
      }
    }
  }
  if (L->ba_grouped) {
    /* per key head g: [b(r) | a(r)] */
    for (int64_t t = 0; t < n; t++) {
      const float *rb = s->raw2 + t * Nk * gb;
      for (int64_t g = 0; g < Nk; g++) {
        memcpy(s->b + t * Nv + g * r, rb + g * gb, (size_t)r * 4);
        memcpy(s->a + t * Nv + g * r, rb + g * gb + r, (size_t)r * 4);
      }
    }
  }
}

/* The recurrent part for n rows of session s (its conv window and state, advanced row by row),
 * reading and writing the rows' buffers (see gdn_job). */
static gdn_job gdn_job_of(model_session *s, const model_layer *L, int64_t l, int64_t n, const float *mix, const float *b,
                          const float *a, const float *z, float *raw, float *o) {
  const floe_hparams *hp = &s->m->hp;
  const int64_t Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
  const int64_t dv = hp->ssm_d_inner / Nv, r = Nv / Nk, K = hp->ssm_conv_kernel;
  const int64_t C = 2 * Nk * dk + Nv * dv;
  return (gdn_job){ s, L, l, n, C, K, Nk, Nv, dk, dv, r, mix, b, a, z, raw, o };
}

/* The recurrent parts of several sessions in one pool run per stage (conv, then heads): each
 * thread takes, in every session, the channels / heads it would take in that session's own run,
 * so every value is the one gdn_core gives; 2 regions per layer instead of 2 per session. */
typedef struct gdn_jobs {
  const gdn_job *j;
  int k;
} gdn_jobs;
static void gdn_conv_multi_worker(void *ctx, int ith, int nth) {
  const gdn_jobs *J = ctx;
  for (int i = 0; i < J->k; i++) gdn_conv_worker((void *)&J->j[i], ith, nth);
}
static void gdn_heads_multi_worker(void *ctx, int ith, int nth) {
  const gdn_jobs *J = ctx;
  for (int i = 0; i < J->k; i++) gdn_heads_worker((void *)&J->j[i], ith, nth);
}

static void gdn_core(model_session *s, const model_layer *L, int64_t l, int64_t n, const float *mix, const float *b,
                     const float *a, const float *z, float *raw, float *o) {
  gdn_job j = gdn_job_of(s, L, l, n, mix, b, a, z, raw, o);
  const bool mt = s->pool && floe_pool_size(s->pool) > 1;
  if (mt) layer_run(s, gdn_conv_worker, &j);
  else gdn_conv_worker(&j, 0, 1);
  if (mt) layer_run(s, gdn_heads_worker, &j);
  else gdn_heads_worker(&j, 0, 1);
}

void layer_gdn(model_session *s, int64_t l, float *x, int64_t n) {
  const double t0 = floe_time_s();
  const model_layer *L = &s->m->layers[l];
  const int64_t E = s->m->hp.n_embd, vd = s->m->hp.ssm_d_inner;
  gdn_in(s, L, x, n);
  gdn_core(s, L, l, n, s->mix, s->b, s->a, s->z, s->raw, s->o);
  layer_matmul(s, &L->ssm_out, n, s->o, vd, s->out, E);
  vadd(x, s->out, n * E);
  s->ph[MODEL_PH_GDN] += floe_time_s() - t0;
}

/* GatedDeltaNet of several sessions' rows in one pass: the projections (in and out) once over
 * all N rows in lead's scratch, the recurrence per segment on its own state. Row for row the
 * arithmetic of layer_gdn. */
void layer_gdn_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N) {
  const double t0 = floe_time_s();
  const floe_hparams *hp = &lead->m->hp;
  const model_layer *L = &lead->m->layers[l];
  const int64_t E = hp->n_embd, Nv = hp->ssm_dt_rank, vd = hp->ssm_d_inner;
  const int64_t C = 2 * hp->ssm_n_group * hp->ssm_d_state + vd;
  gdn_in(lead, L, x, N);
  gdn_job jb[k];
  for (int i = 0; i < k; i++) {
    const int64_t o = r[i].off;
    jb[i] = gdn_job_of(r[i].s, L, l, r[i].n, lead->mix + o * C, lead->b + o * Nv, lead->a + o * Nv, lead->z + o * vd,
                       lead->raw + o * C, lead->o + o * vd);
  }
  /* every session runs on lead's pool (model_session_share_pool), or each on its own */
  bool one_pool = lead->pool && floe_pool_size(lead->pool) > 1;
  for (int i = 0; i < k; i++) one_pool = one_pool && r[i].s->pool == lead->pool;
  if (one_pool) {
    gdn_jobs J = { jb, k };
    layer_run(lead, gdn_conv_multi_worker, &J);
    layer_run(lead, gdn_heads_multi_worker, &J);
  } else {
    for (int i = 0; i < k; i++) {
      const int64_t o = r[i].off;
      gdn_core(r[i].s, L, l, r[i].n, lead->mix + o * C, lead->b + o * Nv, lead->a + o * Nv, lead->z + o * vd,
               lead->raw + o * C, lead->o + o * vd);
    }
  }
  layer_matmul(lead, &L->ssm_out, N, lead->o, vd, lead->out, E);
  vadd(x, lead->out, N * E);
  lead->ph[MODEL_PH_GDN] += floe_time_s() - t0;
}

/* ---- MoE ---- */
#define XD_MAX_K 64   /* top-k up to which decode runs every expert in one run (xd_worker) */
#define XD_SH_PARTS 4 /* row ranges of the shared expert's down in decode */
#define XD_MAX_N 8    /* rows up to which the experts run in one run (larger chunks: the general path) */
/* FLOE_XD_MULTI=0: several rows (the decode of several requests, an MTP verify, small chunks) take
 * the general path (three pool runs a layer) instead of xd_worker's one (A/B) */
static int g_xd_multi = 1;
__attribute__((constructor)) static void xd_from_env(void) {
  const char *e = getenv("FLOE_XD_MULTI");
  if (e && e[0] == '0') g_xd_multi = 0;
}
void layer_xd_multi_set(int on) { g_xd_multi = on; }
typedef struct glu_job {
  model_session *s;
  int64_t nA, nS, I, Is;  /* routed rows (stride I), shared rows (stride Is) */
  const int32_t *ridx;    /* routed row r is row ridx[r] (streaming waves), NULL: row r */
  float *gr, *ur, *gs, *us;
  const floe_mat *dr, *ds; /* down layouts: routed, shared (NULL: no quantization) */
  uint8_t *qr, *qs;
  size_t sr, ss;
} glu_job;

/* p = softmax(p) in float: max, exp(p - max) by vexpf, the sum in 16 lanes folded in halves (the
 * order of sumsq16, fold16), each divided by the sum. Vectorized: with libm's expf and sequential sums
 * the 256-expert router took ~3 us a layer on the serial path. */
VEC_FN static void router_softmax(float *p, int64_t n) {
  float mx = -INFINITY, acc[16] = { 0 };
  for (int64_t e = 0; e < n; e++) mx = p[e] > mx ? p[e] : mx;
  int64_t e = 0;
  for (; e + 16 <= n; e += 16)
    for (int k = 0; k < 16; k++) {
      p[e + k] = floe_vexpf(p[e + k] - mx);
      acc[k] += p[e + k];
    }
  for (int k = 0; e + k < n; k++) {
    p[e + k] = floe_vexpf(p[e + k] - mx);
    acc[k] += p[e + k];
  }
  const float sum = fold16(acc);
  for (e = 0; e < n; e++) p[e] /= sum;
}

/* One row's SiLU-GLU into g, then (D set) its quantization into q for the down matmul. */
VEC_FN static void glu_row(float *g, const float *u, int64_t I, const floe_mat *D, uint8_t *q) {
  for (int64_t i = 0; i < I; i++) g[i] = floe_siluf(g[i]) * u[i];
  if (D) kern_act_quantize(D, g, q);
}

/* glu_row of every gathered row. */
static void glu_worker(void *ctx, int ith, int nth) {
  const glu_job *j = ctx;
  int64_t r0, r1;
  floe_split_range(j->nA + j->nS, 1, ith, nth, &r0, &r1);
  for (int64_t r = r0; r < r1; r++) {
    const bool sh = r >= j->nA;
    const int64_t i0 = sh ? r - j->nA : (j->ridx ? j->ridx[r] : r), I = sh ? j->Is : j->I;
    float *g = (sh ? j->gs : j->gr) + i0 * I;
    const float *u = (sh ? j->us : j->ur) + i0 * I;
    glu_row(g, u, I, sh ? j->ds : j->dr, (sh ? j->qs : j->qr) + (size_t)i0 * (sh ? j->ss : j->sr));
  }
}

size_t layer_task_bytes(void) { return sizeof(mm_task); }

/* ---- streamed experts (src/experts) ---- */
/* Top-k of one row of logits (ties to the lower index, like the router), each added to set[] if
 * new: over several rows, set[] is the union of their top-k (at most NE entries). The row's j-th
 * pick is the largest after pick j-1 in the order (value descending, index ascending), so no list
 * of the row's own picks is needed. (Excluding every expert already in set[] instead, as this did
 * for decode's two rows, picks a row's next-best experts where rows overlap, and with more rows
 * than NE / k runs past NE entries.) */
static int topk_add(const float *p, int64_t NE, int64_t K, int32_t *set, int n) {
  float pv = 0.0f;
  int64_t pi = -1;
  for (int64_t jj = 0; jj < K; jj++) {
    int64_t best = -1;
    for (int64_t e = 0; e < NE; e++) {
      if (pi >= 0 && !(p[e] < pv || (p[e] == pv && e > pi))) continue; /* picked already */
      if (best < 0 || p[e] > p[best]) best = e;
    }
    if (best < 0) break;
    pv = p[best];
    pi = best;
    bool dup = false;
    for (int u = 0; u < n; u++) dup |= set[u] == best;
    if (!dup) set[n++] = (int32_t)best;
  }
  return n;
}

/* Decode and speculative verify chunks (n <= KV_KEEP_MAX rows: the token and its drafts, whose
 * union of experts a verify step reads): predicts layer l+1's experts, the union of each row's
 * top-k, and starts reading them at prefetch priority.
 * XS_PF_NEXT: layer l+1's router on this layer's MoE input h (quantized rows reused when the
 * routers share a layout), or with XS_PF_RESID on the residual stream xres (after this layer's
 * attention) normed with layer l+1's ffn_norm; XS_PF_PREV: the previous token's experts at l+1. Scratch: s->rlog
 * (this layer's probabilities are consumed by now) and s->xs_tmp. Never touches the output. */
static void stream_prefetch(model_session *s, int64_t l, int64_t n, const uint8_t *xq_r, size_t xs_r, const float *xres) {
  const model *m = s->m;
  xstream *x = m->xs;
  const int pf = xs_params_of(x)->prefetch;
  const int64_t NE = m->hp.n_expert, K = m->hp.n_expert_used, E = m->hp.n_embd;
  if (n > KV_KEEP_MAX || l + 1 >= m->hp.n_layer || !pf) return;
  const model_layer *L = &m->layers[l], *N = &m->layers[l + 1];
  int32_t *pred = s->xs_tmp;
  if (pf & XS_PF_NEXT) {
    mm_task rt = task(&N->router, n, s->h, E, &L->router, xq_r, xs_r, s->rlog, NE);
    if (pf & XS_PF_RESID) { /* the residual stream normed as layer l+1 will norm it; float activations.
                             * s->eout is free until the shared expert's down projection below */
      for (int64_t t = 0; t < n; t++) layer_rmsnorm(xres + t * E, N->ffn_norm, E, m->hp.rms_eps, s->eout + t * E);
      rt = task(&N->router, n, s->eout, E, NULL, NULL, 0, s->rlog, NE);
    }
    mm_run(s, &rt, 1);
    int np = 0;
    for (int64_t t = 0; t < n; t++) np = topk_add(s->rlog + t * NE, NE, K, pred, np);
    xs_predict_note(x, (int)l + 1, XS_PF_NEXT, pred, np);
    xs_prefetch(x, (int)l + 1, pred, np, XS_PF_NEXT);
  }
  if ((pf & XS_PF_PREV) && n == 1) {
    const int np = xs_prev_sel(x, (int)l + 1, pred);
    if (np) {
      xs_predict_note(x, (int)l + 1, XS_PF_PREV, pred, np);
      xs_prefetch(x, (int)l + 1, pred, np, XS_PF_PREV);
    }
  }
  xs_kick(x);
}

/* Routed experts of layer l from the expert cache. The experts in use (ascending) are taken in
 * groups that fit the cache; each group's reads are queued at demand priority, the shared expert
 * is computed while they are in flight, and each wave of experts whose bytes have arrived is
 * computed at once (gate/up run, SiLU-GLU, down run). Every row is computed by the same kernel on
 * the same bytes as in the resident path, so the result is bit-identical whatever the waves.
 * Returns non-zero after storing an I/O error in the session. */
static int moe_stream(model_session *s, int64_t l, int64_t n, int64_t nA, const floe_mat *lay_e, const uint8_t *xq_e,
                      size_t xs_e, const floe_mat *lay_d, bool qd, size_t sr, const glu_job *shared, mm_task *sh_down,
                      const uint8_t *xq_r, size_t xs_r, const float *xres) {
  const model *m = s->m;
  xstream *x = m->xs;
  const int64_t NE = m->hp.n_expert, K = m->hp.n_expert_used, E = m->hp.n_embd, I = m->hp.n_ff_exp;
  const int32_t *cnt = s->ecnt, *off = s->eoff;
  const bool mt = s->pool && floe_pool_size(s->pool) > 1;
  mm_task *tk = s->tasks;
  int32_t *U = s->xs_list, *slot = s->xs_slot;
  uint8_t *ready = s->xs_ready;
  int nU = 0;
  for (int64_t e = 0; e < NE; e++)
    if (cnt[e]) U[nU++] = (int32_t)e;
  const int64_t cap = xs_n_slots(x);
  for (int g0 = 0; g0 < nU; g0 += (int)cap) {
    const int nG = nU - g0 < cap ? nU - g0 : (int)cap;
    const int32_t *G = U + g0;
    int rc = xs_acquire(x, (int)l, G, nG, slot);
    if (rc) {
      s->xs_err = rc;
      snprintf(s->xs_msg, sizeof s->xs_msg, "expert cache: cannot hold %d experts of layer %lld at once", nG,
               (long long)l);
      return -1;
    }
    xs_kick(x);
    if (g0 == 0) {
      if (n == 1) xs_actual_note(x, (int)l, s->sel, (int)K);
      stream_prefetch(s, l, n, xq_r, xs_r, xres);
      if (shared->nS > 0) { /* the shared expert while the routed experts are read */
        if (mt && shared->nS >= 4) layer_run(s, glu_worker, (void *)shared);
        else glu_worker((void *)shared, 0, 1);
        mm_run(s, sh_down, 1);
      }
    }
    memset(ready, 0, (size_t)nG);
    for (int done = 0; done < nG;) {
      rc = xs_wait(x, slot, nG, ready, s->xs_msg, sizeof s->xs_msg);
      if (rc) {
        s->xs_err = rc;
        xs_release(x, slot, nG);
        return -1;
      }
      int nt = 0;
      int64_t nr = 0;
      for (int i = 0; i < nG; i++) {
        if (ready[i] != 1) continue;
        ready[i] = 2;
        done++;
        const int32_t e = G[i];
        const floe_mat *w = xs_mats(x, slot[i]);
        const uint8_t *xg = xq_e ? s->xq_g + (size_t)off[e] * xs_e : NULL;
        tk[nt++] = task(&w[0], cnt[e], s->ein + off[e] * E, E, lay_e, xg, xs_e, s->eg + off[e] * I, I);
        tk[nt++] = task(&w[1], cnt[e], s->ein + off[e] * E, E, lay_e, xg, xs_e, s->eu + off[e] * I, I);
        for (int32_t r = 0; r < cnt[e]; r++) s->ridx[nr++] = off[e] + r;
      }
      mm_run(s, tk, nt);
      glu_job gj = *shared;
      gj.nA = nr;
      gj.nS = 0;
      gj.ridx = s->ridx;
      gj.dr = qd ? lay_d : NULL;
      if (mt && nr >= 4) layer_run(s, glu_worker, &gj);
      else glu_worker(&gj, 0, 1);
      nt = 0;
      for (int i = 0; i < nG; i++) {
        if (ready[i] != 2) continue;
        ready[i] = 3;
        const int32_t e = G[i];
        const floe_mat *w = xs_mats(x, slot[i]);
        tk[nt++] = task(&w[2], cnt[e], s->eg + off[e] * I, I, lay_d, qd ? s->xq_d + (size_t)off[e] * sr : NULL, sr,
                        s->contrib + off[e] * E, E);
      }
      mm_run(s, tk, nt);
    }
    xs_release(x, slot, nG);
  }
  (void)nA;
  return 0;
}

/* ---- decode: every expert in one run ----
 * Up to XD_MAX_N rows (one token; the decode rows of several requests, an MTP verify), resident
 * experts: the threads take units from a shared counter (xd_worker: each used expert's gate, up,
 * SiLU-GLU and the quantization of the down inputs of its rows; then the downs; then the shared
 * expert's down in parts), all in one pool run; the general path needs three runs (gate|up, GLU,
 * down). Each output row is computed by the same kernel call as in the general path
 * (kern_matmul_batch over the expert's gathered rows) and the same glu_row, so the values are the
 * same bits. Several rows: the 8-layer 35B cut's 4-stream step, experts 1-2 % faster (bench_multi
 * "4g", results.tsv). */
typedef struct xd_job {
  model_session *s;
  const model_layer *L;
  int64_t I, E, Is;
  const floe_mat *lay_e, *lay_d;
  const uint8_t *xq_e;   /* the quantized normed input (NULL: float path) */
  size_t xs_e, sr;       /* its row bytes; down-input row bytes (0: no quantization) */
  float *gs;             /* shared expert's GLU output (its down input) */
  const uint8_t *qs;     /* its quantized rows */
  size_t ss;
  int next;              /* next unit (atomic), see xd_worker */
  int ready[XD_MAX_K];   /* expert slot u's down input is written (atomic) */
  int64_t n;             /* rows; n > 1: expert U[k]'s rows are the gathered rows [off, off + cnt) */
  const int32_t *U;      /* the used experts, ascending (n = 1: s->sel) */
  int nU;
} xd_job;

/* Units, taken in order from j->next: [0, K) gate, up and GLU of expert U[u] (K = nU: the
 * selected experts of one row, or every expert some of n rows selected, each over its rows);
 * [K, 2K) the down matrix of expert U[u - K], once its GLU is ready (another thread may still be writing it);
 * then the shared expert's down in XD_SH_PARTS row ranges. Whole experts as units left the
 * threads ~24 us apart at the end of the region on average (1.8 MB units, the last one decides);
 * the tail is now made of 0.6 MB downs and 0.15 MB shared parts. Which thread runs a unit never
 * changes a value. K <= XD_MAX_K (layer_moe takes the general path otherwise). */
static void xd_worker(void *ctx, int ith, int nth) {
  (void)ith, (void)nth;
  xd_job *j = ctx;
  model_session *s = j->s;
  const model_layer *L = j->L;
  const int64_t K = j->nU, I = j->I, E = j->E;
  const int nr = 2 * (int)K, units = nr + (j->Is > 0 ? XD_SH_PARTS : 0);
  for (;;) {
    const int u = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
    if (u >= units) break;
    if (u >= nr) { /* shared expert down: rows [b(p), b(p+1)), b(p) = p/PARTS of E up to a multiple of 16 */
      const int p = u - nr;
      int64_t r[2];
      for (int i = 0; i < 2; i++) {
        const int64_t b = (E * (p + i) / XD_SH_PARTS + 15) / 16 * 16;
        r[i] = b < E ? b : E;
      }
      mm_task t = task(&L->sh_down, j->n, j->gs, j->Is, &L->sh_down, j->ss ? j->qs : NULL, j->ss, s->eout, E);
      if (r[1] > r[0]) task_rows(&t, r[0], r[1]);
      continue;
    }
    const int k = u < K ? u : u - (int)K;
    const int32_t e = j->U[k];
    /* the expert's rows [o, o + c) (one row: slot k, as U = sel is ascending) */
    const int64_t o = s->eoff[e], c = s->ecnt[e];
    float *g = s->eg + o * I, *up = s->eu + o * I;
    uint8_t *qd = j->sr ? s->xq_d + (size_t)o * j->sr : NULL;
    if (u < K) {
      /* one row reads row 0 of h in place (layer_moe gathers nothing then) */
      const float *xf = j->n == 1 ? s->h : s->ein + o * E;
      const uint8_t *xg = !j->xq_e ? NULL : j->n == 1 ? j->xq_e : s->xq_g + (size_t)o * j->xs_e;
      mm_task tg = task(&L->exp_gate[e], c, xf, E, j->lay_e, xg, j->xs_e, g, I);
      mm_task tu = task(&L->exp_up[e], c, xf, E, j->lay_e, xg, j->xs_e, up, I);
      task_rows(&tg, 0, I);
      task_rows(&tu, 0, I);
      for (int64_t r = 0; r < c; r++)
        glu_row(g + r * I, up + r * I, I, qd ? j->lay_d : NULL, qd ? qd + (size_t)r * j->sr : NULL);
      __atomic_store_n(&j->ready[k], 1, __ATOMIC_RELEASE);
      continue;
    }
    /* the GLU's unit was taken earlier: it is running or done (no cycle: it waits on nothing) */
    for (int w = 0; !__atomic_load_n(&j->ready[k], __ATOMIC_ACQUIRE); w++) {
      __builtin_ia32_pause();
      if ((w & 1023) == 1023) sched_yield(); /* its thread may be waiting for a core */
    }
    mm_task td = task(&L->exp_down[e], c, g, I, j->lay_d, qd, j->sr, s->contrib + o * E, E);
    task_rows(&td, 0, E);
  }
}

/* The experts with rows (cnt[e] > 0), ascending, into U (at most XD_MAX_K + 1 written); returns
 * how many, or XD_MAX_K + 1 past XD_MAX_K. */
static int xd_used(const int32_t *cnt, int64_t NE, int32_t *U) {
  int nU = 0;
  for (int64_t e = 0; e < NE && nU <= XD_MAX_K; e++)
    if (cnt[e]) U[nU++] = (int32_t)e;
  return nU;
}

void layer_moe(model_session *s, int64_t l, float *x, int64_t n) {
  const double t0 = floe_time_s();
  int32_t xdU[XD_MAX_K + 1];
  int nU;
  const model *m = s->m;
  const floe_hparams *hp = &m->hp;
  const model_layer *L = &m->layers[l];
  const int64_t E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used, I = hp->n_ff_exp;
  const int64_t Is = hp->n_ff_shexp;
  const bool mt = s->pool && floe_pool_size(s->pool) > 1;
  /* streamed experts: every layer of the expert store (the trunk's, and the MTP block's at
   * l == n_layer unless the experts come from a pack, which holds the trunk's only: then the MTP
   * block's are used in place through the source file's mapping) */
  const bool xs = m->xs && l < xs_store_of(m->xs)->n_layer;
  mm_task *tk = s->tasks;

  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, L->ffn_norm, E, hp->rms_eps, s->h + t * E);
  /* the router and the shared expert's gate / up / gate logit read the same rows: one run */
  size_t xs_r, xs_e = 0;
  const uint8_t *xq_r = act_prep(s, s->xq_h, &L->router, n, s->h, E, &xs_r);
  const floe_mat *lay_e = &L->exp_gate[0];
  const uint8_t *xq_e = NULL;
  if (xq_r && layer_same_act(lay_e, &L->router)) {
    xq_e = xq_r;
    xs_e = xs_r;
  } else {
    xq_e = act_prep(s, s->xq_m, lay_e, n, s->h, E, &xs_e);
  }
  float *gs = s->eg + (n * K) * I, *us = s->eu + (n * K) * I; /* shared rows after the routed ones */
  int nt = 0;
  tk[nt++] = task(&L->router, n, s->h, E, &L->router, xq_r, xs_r, s->rlog, NE);
  if (Is > 0) {
    tk[nt++] = task(&L->sh_gate, n, s->h, E, lay_e, xq_e, xs_e, gs, Is);
    tk[nt++] = task(&L->sh_up, n, s->h, E, lay_e, xq_e, xs_e, us, Is);
    tk[nt++] = task(&L->sh_gate_inp, n, s->h, E, &L->router, xq_r, xs_r, s->shg, 1);
  }
  mm_run(s, tk, nt);

  /* softmax (f32) -> top-k -> renormalise; selections kept in ascending expert order, which is
   * the order HF's eager experts loop adds them in. */
  for (int64_t t = 0; t < n; t++) {
    float *p = s->rlog + t * NE;
    router_softmax(p, NE);
    int32_t *sel = s->sel + t * K;
    float *w = s->selw + t * K;
    /* the K largest, by descending probability, ties to the lower index: one pass keeping them
     * sorted; a later expert enters only when strictly larger than the K-th, and goes after
     * every kept one that is not smaller (the same picks, in the same order, as K argmax passes) */
    int64_t nk = 0;
    for (int64_t e = 0; e < NE; e++) {
      const float pe = p[e];
      if (nk == K && !(pe > w[K - 1])) continue;
      int64_t u = nk < K ? nk++ : K - 1;
      for (; u > 0 && pe > w[u - 1]; u--) {
        w[u] = w[u - 1];
        sel[u] = sel[u - 1];
      }
      w[u] = pe;
      sel[u] = (int32_t)e;
    }
    if (hp->norm_topk) {
      float ws = 0.0f;
      for (int64_t jj = 0; jj < K; jj++) ws += w[jj];
      for (int64_t jj = 0; jj < K; jj++) w[jj] /= ws;
    }
    for (int64_t jj = 1; jj < K; jj++) /* insertion sort by expert index */
      for (int64_t u = jj; u > 0 && sel[u - 1] > sel[u]; u--) {
        int32_t ti = sel[u]; sel[u] = sel[u - 1]; sel[u - 1] = ti;
        float tw = w[u]; w[u] = w[u - 1]; w[u - 1] = tw;
      }
  }
  const double t1 = floe_time_s();
  s->ph[MODEL_PH_ROUTER] += t1 - t0;
  if (s->route_cb) s->route_cb(s->route_user, l, s->sel, n, K);

  /* group the (token, slot) pairs by expert: expert e's rows are gathered at [off[e], off[e]+cnt[e]) */
  int32_t *cnt = s->ecnt, *off = s->eoff, *aidx = s->aidx;
  memset(cnt, 0, (size_t)NE * sizeof *cnt);
  for (int64_t i = 0; i < n * K; i++) cnt[s->sel[i]]++;
  int32_t acc = 0;
  for (int64_t e = 0; e < NE; e++) {
    off[e] = acc;
    acc += cnt[e];
  }
  const int64_t nA = acc;
  /* the gathered float rows are read only by the float path: not when both gate and up take the
   * quantized rows (resident experts; the streamed path keeps them) */
  bool need_f = !xq_e || xs;
  for (int64_t i = 0; i < n * K && !need_f; i++) { /* the selected experts (all 256 took ~3 us a layer) */
    const int32_t e = s->sel[i];
    need_f = !layer_same_act(&L->exp_gate[e], lay_e) || !layer_same_act(&L->exp_up[e], lay_e);
  }
  for (int64_t e = 0; e < NE; e++) cnt[e] = 0;
  for (int64_t t = 0; t < n; t++)
    for (int64_t jj = 0; jj < K; jj++) {
      const int32_t e = s->sel[t * K + jj];
      const int32_t a = off[e] + cnt[e]++;
      aidx[t * K + jj] = a;
      if (n == 1 && !xs) continue; /* one token: every expert reads row 0 of h in place */
      if (need_f) memcpy(s->ein + a * E, s->h + t * E, (size_t)E * 4);
      if (xq_e) memcpy(s->xq_g + (size_t)a * xs_e, xq_e + (size_t)t * xs_e, xs_e);
    }
  const floe_mat *lay_d = &L->exp_down[0];
  const bool qd = s->act_q && kern_act_bytes(lay_d) && kern_act_bytes(lay_d) <= s->xq_row;
  const bool qsd = Is > 0 && s->act_q && kern_act_bytes(&L->sh_down) && kern_act_bytes(&L->sh_down) <= s->xq_row;
  glu_job gj = { s, nA, Is > 0 ? n : 0, I, Is, NULL, s->eg, s->eu, gs, us, qd ? lay_d : NULL,
                 qsd ? &L->sh_down : NULL, s->xq_d, NULL, qd ? kern_act_bytes(lay_d) : 0,
                 qsd ? kern_act_bytes(&L->sh_down) : 0 };
  gj.qs = s->xq_d + (size_t)nA * gj.sr;
  if (xs) {
    /* streamed: the shared expert alone (its rows), then the routed experts wave by wave */
    glu_job sj = gj;
    sj.nA = 0;
    mm_task sd = task(&L->sh_down, n, gs, Is, &L->sh_down, qsd ? gj.qs : NULL, gj.ss, s->eout, E);
    if (moe_stream(s, l, n, nA, lay_e, xq_e, xs_e, lay_d, qd, gj.sr, &sj, &sd, xq_r, xs_r, x)) return;
  } else if (mt && (nU = n == 1 ? (int)K : g_xd_multi && n <= XD_MAX_N ? xd_used(cnt, NE, xdU) : XD_MAX_K + 1) <= XD_MAX_K) {
    /* the shared expert's GLU (and down-input quantization), then every expert in one run */
    glu_job sj = gj;
    sj.nA = 0;
    glu_worker(&sj, 0, 1);
    xd_job xj = { s, L, I, E, Is, lay_e, lay_d, xq_e, xs_e, qd ? gj.sr : 0, gs, gj.qs, qsd ? gj.ss : 0, 0, { 0 },
                  n, n == 1 ? s->sel : xdU, nU };
    layer_run(s, xd_worker, &xj);
  } else {
    nt = 0;
    for (int64_t e = 0; e < NE; e++) {
      if (!cnt[e]) continue;
      const bool one = n == 1; /* decode: the gathered row would be a copy of h (and of its quantized row) */
      const uint8_t *xg = xq_e ? (one ? xq_e : s->xq_g + (size_t)off[e] * xs_e) : NULL;
      const float *xin = one ? s->h : s->ein + off[e] * E;
      tk[nt++] = task(&L->exp_gate[e], cnt[e], xin, E, lay_e, xg, xs_e, s->eg + off[e] * I, I);
      tk[nt++] = task(&L->exp_up[e], cnt[e], xin, E, lay_e, xg, xs_e, s->eu + off[e] * I, I);
    }
    mm_run(s, tk, nt);

    /* SiLU-GLU and the quantization of the down inputs (routed rows, then shared rows) */
    if (mt && nA + gj.nS >= 4) layer_run(s, glu_worker, &gj);
    else glu_worker(&gj, 0, 1);

    nt = 0;
    for (int64_t e = 0; e < NE; e++) {
      if (!cnt[e]) continue;
      tk[nt++] = task(&L->exp_down[e], cnt[e], s->eg + off[e] * I, I, lay_d,
                      qd ? s->xq_d + (size_t)off[e] * gj.sr : NULL, gj.sr, s->contrib + off[e] * E, E);
    }
    if (Is > 0) tk[nt++] = task(&L->sh_down, n, gs, Is, &L->sh_down, qsd ? gj.qs : NULL, gj.ss, s->eout, E);
    mm_run(s, tk, nt);
  }

  /* each token: its experts' outputs in ascending expert order, then the gated shared expert */
  for (int64_t t = 0; t < n; t++) {
    float *y = s->y + t * E;
    memset(y, 0, (size_t)E * 4);
    for (int64_t jj = 0; jj < K; jj++)
      vaxpy(y, s->contrib + (int64_t)aidx[t * K + jj] * E, s->selw[t * K + jj], E);
    if (Is > 0) vaxpy(y, s->eout + t * E, floe_sigmoidf(s->shg[t]), E);
  }
  vadd(x, s->y, n * E);
  s->ph[MODEL_PH_EXPERTS] += floe_time_s() - t1;
}

/* Weight bytes one decoded token reads: every non-expert matrix of every layer, the router, the
 * shared expert, top-k routed experts (gate, up, down) and the output matrix; one embedding row. */
uint64_t layer_decode_bytes(const model *m) {
  const floe_hparams *hp = &m->hp;
  uint64_t b = (uint64_t)m->tok_embd.row_bytes + (uint64_t)m->output.row_bytes * (uint64_t)m->output.rows;
#define MB(w) ((uint64_t)(w).row_bytes * (uint64_t)(w).rows + ((w).scales ? 2ull * (w).sb_row_bytes * (uint64_t)(w).rows : 0))
  for (int64_t l = 0; l < hp->n_layer; l++) {
    const model_layer *L = &m->layers[l];
    b += MB(L->wq) + MB(L->wk) + MB(L->wv) + MB(L->wo);
    b += MB(L->ssm_qkvz) + MB(L->ssm_ba) + MB(L->ssm_qkv) + MB(L->ssm_z) + MB(L->ssm_b) + MB(L->ssm_alpha) + MB(L->ssm_out);
    b += MB(L->router) + MB(L->sh_gate) + MB(L->sh_up) + MB(L->sh_down) + MB(L->sh_gate_inp);
    if (L->exp_gate) b += (uint64_t)hp->n_expert_used * (MB(L->exp_gate[0]) + MB(L->exp_up[0]) + MB(L->exp_down[0]));
  }
#undef MB
  return b;
}
