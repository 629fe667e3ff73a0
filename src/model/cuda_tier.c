/* Routed experts tiered VRAM <- host memory for the CUDA backend (--gpu-mem).
 *
 * What lives where: the non-expert weights, KV and scratch are on the GPU as usual; the routed
 * experts stay in host memory (the model's own copy or mapping of the file; a copy is page-locked,
 * so that copies from it are asynchronous DMA; a mapping is not, the driver stages them) and a
 * VRAM pool holds as many of them as fit. Pool slot s holds one expert's gate, up and down matrices at base + s * stride of
 * three (MLX: nine) device arrays, so the MoE kernels read the pool as an expert stack whose
 * "expert id" is the slot: nothing in the kernels changes. Slots [0, n_res) hold the shared
 * experts that join the routed launches (one per layer, for good); the rest are replaced least
 * recently used first (experts.h xv_*).
 *
 * One MoE step of a layer (cu_tier_begin / cu_tier_end): the routing is copied to the host (the
 * one synchronization of the layer), then each selected expert is
 *  - found in the pool: a hit;
 *  - copied into a slot (async, on the step's stream, before the expert kernels); or
 *  - computed by the CPU threads from host memory, while the GPU computes the others, and its
 *    output row copied into the expert output buffer before the weighted sum.
 * The choice between the last two is a cost model: with m of the M misses on the CPU, of S
 * selected experts, the layer waits ~max(m * t_cpu, (M - m) * t_copy + (S - m) * t_gpu);
 * t_copy = expert bytes / the measured host -> device copy rate, t_gpu = expert bytes / the
 * measured device memory rate (the expert kernels read each expert once), t_cpu = the measured
 * CPU seconds per expert (calibrated at session start, then a running average). FLOE_TIER_CPU=0
 * / 1 forces never / always. Only one-row steps use the CPU (a prefill chunk reads each expert
 * once for many rows: copies win).
 *
 * Next-layer prefetch (the default from page-locked host experts, one-row steps; FLOE_TIER_PF=0
 * off): the caller passes
 * the next layer's top-k as its router sees this layer's input (the CPU's XS_PF_NEXT prediction);
 * those the pool lacks are copied into victims on a stream of their own while this layer computes
 * (the victims are never slots this step holds, and the previous layer's kernels are done: the
 * step synchronized), and the next step's stream waits on that stream's event before it enqueues
 * anything. A prefetched slot is an ordinary slot: a hit, then counted as used.
 *
 * Exactness: the pool holds the file's bytes, and the kernels compute a slot exactly as they
 * compute the same expert of a resident stack; the CPU computes an expert with the CPU kernels
 * whose rows the GPU's expert kernels reproduce bit for bit (gate and up on the same quantized
 * input row, floe_siluf GLU, the down input quantized for the down layout, the down rows): the
 * output is the resident GPU run's, whatever the budget and the cache state.
 *
 * Ownership: cu_tier (the pool, the slot tables, the host registration) belongs to the CUDA
 * model; cu_tier_sess (pinned staging, device slot ids, the CPU threads) to a session. One
 * evaluation at a time per model (the engine serializes them). */
#ifdef FLOE_HAVE_CUDA
#include "model/cuda_tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/vexp.h"
#include "experts/experts.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda_rt.h"

#define TIER_ALIGN 256 /* slot stride alignment (the kernels' 16-byte loads; keeps slots apart in L2 lines) */
#define TIER_PARTS 8   /* CPU work units per matrix of one expert (row ranges of a multiple of 16 rows) */

struct cu_tier {
  const model *m;
  int64_t n_l, n_res, n_slots; /* layers; reserved (shared) slots; all slots */
  int32_t *res_of;             /* [n_l] the reserved slot of layer l's shared expert, or -1 */
  xv_slots *xv;                /* routed slots: xv slot r is pool slot n_res + r */
  /* pool: [kind: gate, up, down][part: data, scales, biases] */
  uint8_t *pool[3][3];
  size_t stride[3], sb_stride[3];
  void *reg;                   /* the page-locked host range (NULL: none) */
  void *reg_xs;                /* --mem-budget: the expert cache's page-locked arena (NULL: none) */
  bool xs_seen;                /* the expert cache was met (its arena registration tried) */
  bool readahead;              /* FLOE_TIER_READAHEAD=1: the cache reads ahead by the router (host_prefetch) */
  /* FLOE_TIER_PF: the prefetch copies' stream, its event (pending: recorded, not yet waited on),
   * and which routed slots a prefetch filled and no step has used yet */
  void *pf_stream, *pf_ev;
  bool pf_pending;
  uint8_t *pf_flag;
  size_t expert_bytes;         /* the largest expert (gate + up + down), for the cost model */
  model_tier_stats st;
  int cpu_mode;
};

struct cu_tier_sess {
  cu_tier *t;
  floe_pool *pool;
  int64_t rows;
  int ks;
  int32_t *sel_h, *sid_h;      /* pinned [rows * ks] */
  int32_t *sid_d;              /* device [rows * ks] */
  uint8_t *xq_h;               /* pinned: the step's quantized input row */
  float *x_h;                  /* pinned [E]: its float row */
  size_t xq_row, xs;
  int32_t *miss;               /* [rows * ks] slot indices of the step's misses */
  float *y_h;                  /* pinned [ks][E] outputs of the CPU's experts */
  float *g, *u;                /* [ks][I] gate / up rows (g becomes the GLU output) */
  uint8_t *qd;                 /* [ks][xq_row] down inputs */
  /* the step in flight */
  int64_t l, n;
  int n_job;
  int32_t job_e[64], job_slot[64]; /* CPU experts: expert id, output row (slot index in the step) */
  const floe_mat *job_m[64][3];    /* their gate, up and down matrices (the model's, or a cache slot's) */
  bool calibrated;
  /* --mem-budget (host_fetch): the step's copies (expert, pool slot) read from the expert cache,
   * the cache slots in use, held until the next step has synchronized with its copies */
  int32_t *cp_e, *cp_r, *xs_e, *xs_slot;
  int32_t *pred, *prev;        /* [n_expert] each: read_ahead's scratch, the previous token's experts */
  int32_t *pred_h;             /* pinned [K]: the next layer's predicted experts (FLOE_TIER_PF) */
  uint8_t *xs_ready;
  int n_cp, n_held;
};

static const floe_mat *mat_of(const model_layer *H, int kind, int64_t e) {
  return kind == 0 ? &H->exp_gate[e] : kind == 1 ? &H->exp_up[e] : &H->exp_down[e];
}
static const floe_mat *sh_of(const model_layer *H, int kind) {
  return kind == 0 ? &H->sh_gate : kind == 1 ? &H->sh_up : &H->sh_down;
}
static size_t up_align(size_t v) { return (v + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN; }

/* per kind: the largest expert matrix (data) and scale/bias arrays over the layers */
static void strides(const model *m, int64_t n_l, size_t *st, size_t *sbs) {
  for (int k = 0; k < 3; k++) {
    st[k] = sbs[k] = 0;
    for (int64_t l = 0; l < n_l; l++) {
      const floe_mat *W = mat_of(&m->layers[l], k, 0);
      const size_t b = (size_t)W->rows * W->row_bytes, sb = W->scales ? (size_t)W->rows * W->sb_row_bytes : 0;
      if (b > st[k]) st[k] = b;
      if (sb > sbs[k]) sbs[k] = sb;
    }
    st[k] = up_align(st[k]);
    sbs[k] = up_align(sbs[k]);
  }
}

static size_t slot_bytes(const size_t *st, const size_t *sbs) {
  size_t b = 0;
  for (int k = 0; k < 3; k++) b += st[k] + 2 * sbs[k];
  return b;
}

/* routed slots one step may need at once: every expert of a layer, or every slot of a chunk */
static int64_t step_slots(const model *m) {
  const int64_t all = (int64_t)MODEL_MAX_BATCH * m->hp.n_expert_used;
  return all < m->hp.n_expert ? all : m->hp.n_expert;
}

uint64_t cu_tier_min_bytes(const model *m, int64_t n_l, const bool *sh_slot) {
  size_t st[3], sbs[3];
  strides(m, n_l, st, sbs);
  int64_t res = 0;
  for (int64_t l = 0; l < n_l; l++) res += sh_slot[l];
  return (uint64_t)(res + step_slots(m)) * slot_bytes(st, sbs);
}

/* Copies expert W (kind k) into pool slot s: data, then scales and biases (MLX). */
static int put(cu_tier *t, int k, int64_t s, const floe_mat *W, void *stream) {
  const size_t b = (size_t)W->rows * W->row_bytes, sb = (size_t)W->rows * W->sb_row_bytes;
  int rc = stream ? cuda_rt_h2d_async(t->pool[k][0] + (size_t)s * t->stride[k], W->data, b, stream)
                  : cuda_rt_h2d(t->pool[k][0] + (size_t)s * t->stride[k], W->data, b, NULL, 0);
  t->st.h2d_bytes += b;
  for (int p = 1; p < 3 && !rc && W->scales; p++) {
    const void *src = p == 1 ? W->scales : W->biases;
    uint8_t *dst = t->pool[k][p] + (size_t)s * t->sb_stride[k];
    rc = stream ? cuda_rt_h2d_async(dst, src, sb, stream) : cuda_rt_h2d(dst, src, sb, NULL, 0);
    t->st.h2d_bytes += sb;
  }
  return rc;
}

/* [lo, hi) grown to cover W's data, scales and biases */
static void span(const floe_mat *W, uintptr_t *lo, uintptr_t *hi) {
  const void *ps[3] = { W->data, W->scales, W->biases };
  for (int p = 0; p < 3; p++) {
    if (!ps[p]) continue;
    const uintptr_t a = (uintptr_t)ps[p];
    const size_t n = (size_t)W->rows * (p ? W->sb_row_bytes : W->row_bytes);
    if (a < *lo) *lo = a;
    if (a + n > *hi) *hi = a + n;
  }
}

/* Page-locks the host range spanning every expert the pool copies from: the routed ones and the
 * shared ones of reserved slots (one registration: ranges of separate tensors may share pages,
 * which the driver refuses to register twice). A copy from a range that runs past the registered
 * one fails (cudaMemcpy: invalid argument): the tiny qwen35moe synth's last shared expert lies
 * after its last routed one. */
static void pin_host(cu_tier *t) {
  const model *m = t->m;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int64_t l = 0; l < t->n_l; l++)
    for (int k = 0; k < 3; k++) {
      for (int64_t e = 0; e < m->hp.n_expert; e++) span(mat_of(&m->layers[l], k, e), &lo, &hi);
      if (t->res_of[l] >= 0) span(sh_of(&m->layers[l], k), &lo, &hi);
    }
  /* only a model loaded into memory (anonymous pages): on the H200 machine, page-locking a file
   * mapping (a tiny model mapped from /tmp) never returned from the driver. FLOE_TIER_PIN=0: never */
  const char *pin = getenv("FLOE_TIER_PIN");
  if (hi <= lo || !m->copied || (pin && pin[0] == '0')) return;
  if (cuda_rt_host_register((void *)lo, hi - lo, NULL, 0) == 0) {
    t->reg = (void *)lo;
    t->st.pinned = true;
  }
}

/* host -> device copy rate, measured on the pool (before it is filled) from the expert memory */
static void measure_pcie(cu_tier *t) {
  const floe_mat *W = mat_of(&t->m->layers[0], 0, 0);
  const size_t b = (size_t)W->rows * W->row_bytes;
  const int64_t n = t->n_slots < 64 ? t->n_slots : 64;
  void *stream = NULL;
  if (n < 2 || cuda_rt_stream_create(&stream, NULL, 0)) return;
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    cuda_rt_stream_sync(stream, NULL, 0);
    const double t0 = floe_time_s();
    for (int64_t s = 0; s < n; s++)
      cuda_rt_h2d_async(t->pool[0][0] + (size_t)s * t->stride[0], mat_of(&t->m->layers[0], 0, s % t->m->hp.n_expert)->data,
                        b, stream);
    cuda_rt_stream_sync(stream, NULL, 0);
    const double dt = floe_time_s() - t0, r = dt > 0 ? (double)(n * b) / dt / 1e9 : 0;
    if (r > best) best = r;
  }
  cuda_rt_stream_destroy(stream);
  t->st.pcie_gbps = best;
}

/* device memory rate for the cost model's t_gpu: the pool's first half copied onto its second
 * (before it is filled), bytes read + written a second, the best of three */
static void measure_gpu(cu_tier *t) {
  const int64_t n = (t->n_slots < 64 ? t->n_slots : 64) / 2;
  const size_t b = t->stride[0];
  void *stream = NULL, *e0 = NULL, *e1 = NULL;
  if (n < 1 || cuda_rt_stream_create(&stream, NULL, 0)) return;
  if (!cuda_rt_event_create(&e0, NULL, 0) && !cuda_rt_event_create(&e1, NULL, 0)) {
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
      cuda_rt_event_record(e0, stream);
      cuda_rt_d2d_async(t->pool[0][0] + (size_t)n * b, t->pool[0][0], (size_t)n * b, stream);
      cuda_rt_event_record(e1, stream);
      float ms = 0;
      if (cuda_rt_event_sync(e1, NULL, 0) || cuda_rt_event_ms(e0, e1, &ms, NULL, 0) || ms <= 0) break;
      const double r = 2.0 * (double)(n * b) / (ms * 1e-3) / 1e9;
      if (r > best) best = r;
    }
    t->st.gpu_gbps = best;
  }
  cuda_rt_event_destroy(e0);
  cuda_rt_event_destroy(e1);
  cuda_rt_stream_destroy(stream);
}

/* FLOE_TIER_DEBUG: the load's stages on stderr (where a load that does not return stopped) */
static void stage(const char *what) {
  if (getenv("FLOE_TIER_DEBUG")) fprintf(stderr, "tier: %s (%.3f s)\n", what, floe_time_s());
}

int cu_tier_open(const model *m, int64_t n_l, uint64_t pool_bytes, const bool *sh_slot, cu_tier **out, char *err,
                 size_t errlen) {
  *out = NULL;
  stage("open");
  cu_tier *t = calloc(1, sizeof *t);
  if (!t || !(t->res_of = malloc((size_t)n_l * sizeof *t->res_of))) {
    free(t);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  t->m = m;
  t->n_l = n_l;
  strides(m, n_l, t->stride, t->sb_stride);
  const size_t sbytes = slot_bytes(t->stride, t->sb_stride);
  for (int64_t l = 0; l < n_l; l++) t->res_of[l] = sh_slot[l] ? (int32_t)t->n_res++ : -1;
  t->n_slots = (int64_t)(pool_bytes / sbytes);
  const uint64_t need = cu_tier_min_bytes(m, n_l, sh_slot);
  int rc = 0;
  if (pool_bytes < need) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM,
                  "%.2f GiB left for the expert pool, it needs at least %.2f GiB (%lld experts of %.1f MiB)",
                  (double)pool_bytes / (1u << 30), (double)need / (1u << 30), (long long)(need / sbytes),
                  (double)sbytes / (1u << 20));
    goto fail;
  }
  if (t->n_slots - t->n_res > INT32_MAX / 2) t->n_slots = t->n_res + INT32_MAX / 2;
  /* tests: a pool of at most N routed slots (evictions on tiny models), checked like a budget */
  const char *cap = getenv("FLOE_TIER_SLOTS");
  if (cap && atoll(cap) > 0 && t->n_res + atoll(cap) < t->n_slots) {
    t->n_slots = t->n_res + atoll(cap);
    if (t->n_slots * (int64_t)sbytes < (int64_t)need) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "FLOE_TIER_SLOTS=%s: the expert pool needs at least %lld experts",
                    cap, (long long)(need / sbytes) - (long long)t->n_res);
      goto fail;
    }
  }
  for (int k = 0; k < 3; k++)
    for (int p = 0; p < 3; p++) {
      const size_t b = (size_t)t->n_slots * (p ? t->sb_stride[k] : t->stride[k]);
      if (!b) continue;
      if ((rc = cuda_rt_malloc((void **)&t->pool[k][p], b, err, errlen))) goto fail;
    }
  if (xv_open(n_l, m->hp.n_expert, t->n_slots - t->n_res, &t->xv)) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto fail;
  }
  stage("pool allocated");
  pin_host(t);
  stage(t->reg ? "host memory page-locked" : "host memory pageable");
  measure_pcie(t);
  measure_gpu(t);
  stage("copy rates measured");
  /* the shared experts, then routed experts round robin over the layers until the pool is full
   * (a warm start: the steady state's hit rate from the first token) */
  for (int64_t l = 0; l < n_l && !rc; l++)
    for (int k = 0; k < 3 && !rc && t->res_of[l] >= 0; k++) rc = put(t, k, t->res_of[l], sh_of(&m->layers[l], k), NULL);
  for (int64_t e = 0, filled = 0; e < m->hp.n_expert && filled < t->n_slots - t->n_res && !rc; e++)
    for (int64_t l = 0; l < n_l && filled < t->n_slots - t->n_res && !rc; l++, filled++) {
      int64_t ol;
      int32_t oe;
      const int32_t r = xv_take(t->xv, l, (int32_t)e, &ol, &oe);
      xv_release_all(t->xv);
      for (int k = 0; k < 3 && !rc; k++) rc = put(t, k, t->n_res + r, mat_of(&m->layers[l], k, e), NULL);
    }
  stage("pool filled");
  if (rc) {
    rc = floe_err(err, errlen, FLOE_E_IO, "cannot fill the expert pool");
    goto fail;
  }
  /* the default: copies only from page-locked memory (H200: 35B-A3B at 8 GiB 130 tok/s vs 133 with
   * the cost model; 80B-A3B at 16 GiB 92 vs 62: the CPU experts, measured alone, slow down beside
   * the copies and the cost model does not see it), the cost model from pageable memory (68 vs 28
   * copies only); FLOE_TIER_CPU=-1 / 0 / 1: the cost model / never / always */
  const char *cm = getenv("FLOE_TIER_CPU");
  t->cpu_mode = cm && cm[0] == '0' ? 0 : cm && cm[0] == '1' ? 1 : cm && cm[0] == '-' ? -1 : t->reg ? 0 : -1;
  t->expert_bytes = 0;
  for (int k = 0; k < 3; k++) {
    const floe_mat *W = mat_of(&m->layers[0], k, 0);
    t->expert_bytes += (size_t)W->rows * (W->row_bytes + (W->scales ? 2 * W->sb_row_bytes : 0));
  }
  /* the default with page-locked host experts (a copy from pageable memory would hold the host);
   * FLOE_TIER_PF=0: off. H200: 35B-A3B at 8 GiB 128.5 -> 148.7 tok/s, 80B-A3B at 16 GiB
   * 100.5 / 101.5 -> 113.7 / 112.2 (88-90 % of the prefetched experts used) */
  const char *pf = getenv("FLOE_TIER_PF");
  if (!(pf && pf[0] == '0') && t->reg) {
    t->pf_flag = calloc((size_t)(t->n_slots - t->n_res), 1);
    if (!t->pf_flag || cuda_rt_stream_create(&t->pf_stream, NULL, 0) || cuda_rt_event_create(&t->pf_ev, NULL, 0)) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "FLOE_TIER_PF: cannot set up the prefetch stream");
      goto fail;
    }
  }
  const char *ra = getenv("FLOE_TIER_READAHEAD");
  t->readahead = ra && ra[0] == '1';
  t->st.on = true;
  t->st.pool_bytes = (uint64_t)t->n_slots * sbytes;
  t->st.slots = t->n_slots - t->n_res;
  t->st.cpu_mode = t->cpu_mode;
  t->st.h2d_bytes = 0;
  *out = t;
  return 0;
fail:
  cu_tier_close(t);
  return rc;
}

void cu_tier_close(cu_tier *t) {
  if (!t) return;
  for (int k = 0; k < 3; k++)
    for (int p = 0; p < 3; p++) cuda_rt_free(t->pool[k][p]);
  if (t->pf_stream) cuda_rt_stream_sync(t->pf_stream, NULL, 0);
  if (t->reg) cuda_rt_host_unregister(t->reg);
  if (t->reg_xs) cuda_rt_host_unregister(t->reg_xs);
  cuda_rt_event_destroy(t->pf_ev);
  cuda_rt_stream_destroy(t->pf_stream);
  free(t->pf_flag);
  xv_close(t->xv);
  free(t->res_of);
  free(t);
}

void cu_tier_views(const cu_tier *t, int64_t l, cuda_mat *gate, cuda_mat *up, cuda_mat *down) {
  cuda_mat *out[3] = { gate, up, down };
  for (int k = 0; k < 3; k++) {
    const floe_mat *W = mat_of(&t->m->layers[l], k, 0);
    cuda_mat *d = out[k];
    memset(d, 0, sizeof *d);
    d->type = W->type;
    d->rows = W->rows;
    d->cols = W->cols;
    d->row_bytes = W->row_bytes;
    d->mlx = W->mlx;
    d->sb_row_bytes = W->sb_row_bytes;
    d->data = t->pool[k][0];
    d->scales = t->pool[k][1];
    d->biases = t->pool[k][2];
    d->n_expert = (int32_t)t->n_slots;
    d->expert_stride = t->stride[k];
    d->sb_expert_stride = t->sb_stride[k];
  }
}

int32_t cu_tier_shared_slot(const cu_tier *t, int64_t l) { return t->res_of[l]; }

/* ---- sessions ---- */
void cu_tier_sess_close(cu_tier_sess *ts) {
  if (!ts) return;
  cu_tier_done(ts);
  free(ts->cp_e);
  free(ts->cp_r);
  free(ts->xs_e);
  free(ts->xs_slot);
  free(ts->pred);
  free(ts->prev);
  free(ts->xs_ready);
  if (ts->pool) floe_pool_free(ts->pool);
  cuda_rt_host_free(ts->sel_h);
  cuda_rt_host_free(ts->sid_h);
  cuda_rt_host_free(ts->xq_h);
  cuda_rt_host_free(ts->x_h);
  cuda_rt_host_free(ts->pred_h);
  free(ts->miss);
  cuda_rt_host_free(ts->y_h);
  cuda_rt_free(ts->sid_d);
  free(ts->g);
  free(ts->u);
  free(ts->qd);
  free(ts);
}

int cu_tier_sess_open(cu_tier *t, int n_threads, int64_t rows, int ks, size_t xq_row, cu_tier_sess **out, char *err,
                      size_t errlen) {
  *out = NULL;
  const floe_hparams *hp = &t->m->hp;
  cu_tier_sess *ts = calloc(1, sizeof *ts);
  if (!ts) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  ts->t = t;
  ts->rows = rows;
  ts->ks = ks;
  ts->xq_row = xq_row;
  const size_t nsl = (size_t)(rows * ks) * sizeof(int32_t), I = (size_t)hp->n_ff_exp;
  int rc = 0;
  if ((rc = cuda_rt_host_alloc((void **)&ts->sel_h, nsl, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&ts->sid_h, nsl, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&ts->xq_h, xq_row, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&ts->x_h, (size_t)hp->n_embd * sizeof(float), err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&ts->pred_h, (size_t)(hp->n_expert_used + 1) * sizeof(int32_t), err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&ts->y_h, (size_t)ks * (size_t)hp->n_embd * sizeof(float), err, errlen)) ||
      (rc = cuda_rt_malloc((void **)&ts->sid_d, nsl, err, errlen))) {
    cu_tier_sess_close(ts);
    return rc;
  }
  ts->g = malloc((size_t)ks * I * sizeof(float));
  ts->u = malloc((size_t)ks * I * sizeof(float));
  ts->qd = aligned_alloc(64, (size_t)ks * xq_row);
  ts->miss = malloc(nsl);
  ts->cp_e = malloc(nsl);
  ts->cp_r = malloc(nsl);
  ts->xs_e = malloc(nsl);
  ts->xs_slot = malloc(nsl);
  ts->pred = malloc((size_t)hp->n_expert * sizeof(int32_t));
  ts->prev = malloc((size_t)hp->n_expert * sizeof(int32_t));
  ts->xs_ready = malloc((size_t)(rows * ks));
  if (!ts->g || !ts->u || !ts->qd || !ts->miss || !ts->cp_e || !ts->cp_r || !ts->xs_e || !ts->xs_slot || !ts->pred ||
      !ts->prev || !ts->xs_ready || (n_threads > 1 && !(ts->pool = floe_pool_create(n_threads)))) {
    cu_tier_sess_close(ts);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  *out = ts;
  return 0;
}

/* ---- the CPU's experts ---- */
typedef struct cpu_run {
  cu_tier_sess *ts;
  int phase;   /* 0: gate and up rows; 1: down rows */
  int next;    /* next unit (atomic) */
  size_t xs, ds; /* input row bytes; down input row bytes */
} cpu_run;

/* units: (job j, matrix, part p): rows [p * R / PARTS, (p + 1) * R / PARTS) rounded to 16 */
static void cpu_worker(void *ctx, int ith, int nth) {
  (void)ith, (void)nth;
  cpu_run *r = ctx;
  cu_tier_sess *ts = r->ts;
  const floe_hparams *hp = &ts->t->m->hp;
  const int64_t I = hp->n_ff_exp, E = hp->n_embd;
  const int per = r->phase == 0 ? 2 * TIER_PARTS : TIER_PARTS, units = ts->n_job * per;
  for (;;) {
    const int u = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
    if (u >= units) break;
    const int j = u / per, w = u % per, mtx = r->phase == 0 ? w / TIER_PARTS : 2, p = w % TIER_PARTS;
    const floe_mat *W = ts->job_m[j][mtx];
    const int64_t R = W->rows, r0 = (R * p / TIER_PARTS + 15) / 16 * 16, r1e = (R * (p + 1) / TIER_PARTS + 15) / 16 * 16;
    const int64_t r1 = r1e < R ? r1e : R;
    if (r0 >= r1) continue;
    if (mtx == 0) kern_matmul(W, 1, ts->x_h, E, ts->xq_h, r->xs, ts->g + (size_t)j * I, I, r0, r1);
    else if (mtx == 1) kern_matmul(W, 1, ts->x_h, E, ts->xq_h, r->xs, ts->u + (size_t)j * I, I, r0, r1);
    else kern_matmul(W, 1, ts->g + (size_t)j * I, I, ts->qd + (size_t)j * r->ds, r->ds, ts->y_h + (size_t)j * E, E, r0, r1);
  }
}

static void cpu_compute(cu_tier_sess *ts, size_t xs) {
  const int64_t I = ts->t->m->hp.n_ff_exp;
  cpu_run r = { ts, 0, 0, xs, kern_act_bytes(ts->job_m[0][2]) };
  if (ts->pool) floe_pool_run(ts->pool, cpu_worker, &r);
  else cpu_worker(&r, 0, 1);
  for (int j = 0; j < ts->n_job; j++) { /* SiLU-GLU, the down input quantized for its layout */
    float *g = ts->g + (size_t)j * I;
    const float *u = ts->u + (size_t)j * I;
    for (int64_t i = 0; i < I; i++) g[i] = floe_siluf(g[i]) * u[i];
    kern_act_quantize(ts->job_m[j][2], g, ts->qd + (size_t)j * r.ds);
  }
  r.phase = 1;
  r.next = 0;
  if (ts->pool) floe_pool_run(ts->pool, cpu_worker, &r);
  else cpu_worker(&r, 0, 1);
}

/* The CPU can compute expert e of H from the quantized input row of lay's layout, with the GPU's
 * bits: gate and up take that row, and the down matrix has a quantized-input path. */
static bool cpu_can(const model_layer *H, int64_t e, const floe_mat *lay) {
  return layer_same_act(&H->exp_gate[e], lay) && layer_same_act(&H->exp_up[e], lay) &&
         kern_act_bytes(&H->exp_gate[e]) && kern_act_bytes(&H->exp_down[e]);
}

/* The first step of a session measures the CPU on a real expert (its first CPU expert, computed
 * three times before the real run; the best): the cost model's starting t_cpu. */
static void calibrate(cu_tier_sess *ts, size_t xs) {
  cu_tier *t = ts->t;
  ts->calibrated = true;
  if (t->st.cpu_expert_s > 0) return;
  const int n_job = ts->n_job;
  ts->n_job = 1;
  double best = 1e9;
  for (int rep = 0; rep < 3; rep++) {
    const double t0 = floe_time_s();
    cpu_compute(ts, xs);
    const double dt = floe_time_s() - t0;
    if (dt < best) best = dt;
  }
  t->st.cpu_expert_s = best;
  ts->n_job = n_job;
}

/* ---- --mem-budget: the experts from the CPU's expert cache ----
 * With the model's experts streamed (model.xs: the file mapped, the experts read into a RAM cache
 * of slots, experts.h), the step's misses come from that cache: the experts copied into the pool
 * and the CPU's experts are pinned there (read from the file at demand priority when the cache
 * lacks them), each copy enqueued as soon as its bytes arrive, and the slots held until the next
 * step has synchronized with the stream (the copies read them). The next layer's reads are queued
 * behind the demand reads (host_prefetch): the experts there that the pool lacks, the previous
 * token's, or with FLOE_TIER_READAHEAD=1 as the next layer's router predicts them on this layer's
 * input (the GPU computes it beside the routing and the step copies it back with the selection).
 * The cache's arena is page-locked once, when first met, so that the copies are DMA. */

/* The layers the expert cache holds (the trunk, and the MTP block unless bound to a pack), or 0. */
static int64_t xs_layers(const cu_tier *t) { return t->m->xs ? xs_store_of(t->m->xs)->n_layer : 0; }

static void xs_first(cu_tier *t) {
  t->xs_seen = true;
  const char *pin = getenv("FLOE_TIER_PIN");
  void *base;
  size_t bytes;
  xs_arena(t->m->xs, &base, &bytes);
  if (!(pin && pin[0] == '0') && base && cuda_rt_host_register(base, bytes, NULL, 0) == 0) t->reg_xs = base;
  /* the default mode follows the memory the copies come from (cu_tier_open) */
  const char *cm = getenv("FLOE_TIER_CPU");
  if (!(cm && *cm)) t->cpu_mode = t->st.cpu_mode = t->reg_xs ? 0 : -1;
  t->st.pinned = t->reg_xs != NULL;
}

/* Pins the step's listed experts (the CPU's jobs, then the copies) in the expert cache, groups of
 * what it can pin at once; enqueues each copy when its bytes arrive. */
static int host_fetch(cu_tier_sess *ts, int64_t l, void *stream, char *msg, size_t msglen) {
  cu_tier *t = ts->t;
  xstream *x = t->m->xs;
  int32_t *U = ts->xs_e, *slot = ts->xs_slot;
  uint8_t *ready = ts->xs_ready;
  int nU = 0;
  for (int j = 0; j < ts->n_job; j++) U[nU++] = ts->job_e[j];
  for (int c = 0; c < ts->n_cp; c++) U[nU++] = ts->cp_e[c];
  const int cap = (int)(xs_n_slots(x) < INT32_MAX ? xs_n_slots(x) : INT32_MAX);
  if (ts->n_job > cap) {
    snprintf(msg, msglen, "expert cache: cannot hold %d experts of layer %lld at once", ts->n_job, (long long)l);
    return FLOE_E_NOMEM;
  }
  for (int g0 = 0; g0 < nU; g0 += cap) {
    const int nG = nU - g0 < cap ? nU - g0 : cap;
    if (xs_acquire(x, (int)l, U + g0, nG, slot)) {
      snprintf(msg, msglen, "expert cache: cannot hold %d experts of layer %lld at once", nG, (long long)l);
      return FLOE_E_NOMEM;
    }
    xs_kick(x);
    memset(ready, 0, (size_t)nG);
    for (int done = 0; done < nG;) {
      int rc = xs_wait(x, slot, nG, ready, msg, msglen);
      for (int i = 0; i < nG && !rc; i++) {
        if (ready[i] != 1) continue;
        ready[i] = 2;
        done++;
        const int u = g0 + i;
        const floe_mat *w = xs_mats(x, slot[i]);
        if (u < ts->n_job)
          for (int k = 0; k < 3; k++) ts->job_m[u][k] = &w[k];
        else
          for (int k = 0; k < 3 && !rc; k++)
            if (put(t, k, t->n_res + ts->cp_r[u - ts->n_job], &w[k], stream)) {
              snprintf(msg, msglen, "cannot copy an expert to the GPU");
              rc = FLOE_E_IO;
            }
      }
      /* another group follows: this one's copies must land before its slots may be reused */
      if (!rc && done == nG && g0 + nG < nU && cuda_rt_stream_sync(stream, msg, msglen)) rc = FLOE_E_IO;
      if (rc) {
        xs_release(x, slot, nG);
        return rc;
      }
    }
    if (g0 + nG < nU) xs_release(x, slot, nG);
    else ts->n_held = nG;
  }
  return 0;
}

/* Experts es[0..n) of layer l1 (kind XS_PF_*) noted as a prediction; those the pool lacks read
 * ahead into the expert cache (ts->pred: scratch). */
static void read_ahead(cu_tier_sess *ts, int64_t l1, const int32_t *es, int n, int kind) {
  cu_tier *t = ts->t;
  xstream *x = t->m->xs;
  int32_t *q = ts->pred;
  int k = 0;
  for (int i = 0; i < n; i++)
    if (es[i] >= 0 && es[i] < t->m->hp.n_expert) q[k++] = es[i];
  xs_predict_note(x, (int)l1, kind, q, k);
  int j = 0;
  for (int i = 0; i < k; i++)
    if (!xv_has(t->xv, l1, q[i])) q[j++] = q[i];
  if (j > 0) xs_prefetch(x, (int)l1, q, j, kind);
}

/* One-row steps: layer l's selection noted (the cache's hit statistics, the next token's
 * prediction); the experts of layer l + 1 the pool lacks read ahead into the expert cache: by
 * default the previous token's (whatever the --prefetch mask, when it is not none); with
 * FLOE_TIER_READAHEAD=1 as the mask says: next, the next layer's router on this layer's input
 * (pred_h, when the step had it: the CPU's XS_PF_NEXT; XS_PF_RESID is not offered here), prev the
 * previous token's. The router's read-ahead is opt-in because it was slower where measured: H200,
 * 80B-A3B at --mem-budget 16G --gpu-mem 8G --direct, 4.60 vs 4.91 tok/s (precision 0.84 vs 0.11,
 * but 365 vs 335 MB read a token: the disk is the floor, and the wrong 16 % and the cache entries
 * the read-ahead evicts cost more than the overlap gains). */
static void host_prefetch(cu_tier_sess *ts, int64_t l, int64_t n, bool have_pred) {
  cu_tier *t = ts->t;
  xstream *x = t->m->xs;
  const int K = (int)t->m->hp.n_expert_used;
  if (n != 1) return;
  xs_actual_note(x, (int)l, ts->sel_h, K);
  int pf = xs_params_of(x)->prefetch;
  if (l + 1 >= xs_layers(t) || !pf) return;
  if (!t->readahead) pf = XS_PF_PREV;
  if (have_pred && (pf & XS_PF_NEXT)) read_ahead(ts, l + 1, ts->pred_h, K, XS_PF_NEXT);
  if (pf & XS_PF_PREV) {
    const int np = xs_prev_sel(x, (int)l + 1, ts->prev);
    read_ahead(ts, l + 1, ts->prev, np, XS_PF_PREV);
  }
  xs_kick(x);
}

/* FLOE_TIER_PF: the next layer's predicted experts (ts->pred_h) that the pool lacks copied ahead
 * on the prefetch stream into victims this step does not hold. */
static void vram_prefetch(cu_tier_sess *ts, int64_t l) {
  cu_tier *t = ts->t;
  const model *m = t->m;
  const model_layer *H1 = &m->layers[l + 1];
  int issued = 0;
  for (int64_t i = 0; i < m->hp.n_expert_used; i++) {
    const int32_t e = ts->pred_h[i];
    /* a find makes a present one the most recent: kept for the next layer */
    if (e < 0 || e >= m->hp.n_expert || xv_find(t->xv, l + 1, e) >= 0) continue;
    int64_t ol;
    int32_t oe;
    const int32_t r = xv_take(t->xv, l + 1, e, &ol, &oe);
    if (r < 0) break;
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) rc = put(t, k, t->n_res + r, mat_of(H1, k, e), t->pf_stream);
    if (rc) { /* not enqueued: the slot is not to be trusted (the next step copies on demand) */
      xv_forget(t->xv, r);
      t->pf_flag[r] = 0;
      break;
    }
    t->pf_flag[r] = 1;
    t->st.pf_issued++;
    issued++;
  }
  if (issued && cuda_rt_event_record(t->pf_ev, t->pf_stream) == 0) t->pf_pending = true;
  else if (issued) cuda_rt_stream_sync(t->pf_stream, NULL, 0); /* no event: wait here instead */
}

/* the expert cache reads the next layer's experts ahead by the router's prediction */
static bool xs_next(const cu_tier *t) {
  return t->readahead && t->m->xs && (xs_params_of(t->m->xs)->prefetch & XS_PF_NEXT);
}

bool cu_tier_pf(const cu_tier *t) { return t->pf_stream != NULL || xs_next(t); }

int cu_tier_begin(cu_tier_sess *ts, int64_t l, const int32_t *sel, const int32_t *pred, int64_t n, int ks, bool sh,
                  const float *x, const uint8_t *xq, size_t xs, bool cpu_ok, void *stream, const int32_t **sid,
                  char *msg, size_t msglen) {
  cu_tier *t = ts->t;
  const model *m = t->m;
  const model_layer *H = &m->layers[l];
  const int64_t NE = m->hp.n_expert, K = m->hp.n_expert_used, ns = n * ks;
  ts->l = l;
  ts->n = n;
  ts->n_job = 0;
  cpu_ok = cpu_ok && n == 1 && xq && xs <= ts->xq_row && t->cpu_mode != 0 && K <= 64;
  ts->xs = xs;
  const double t0 = floe_time_s();
  pred = cu_tier_pf(t) && n == 1 && l + 1 < m->hp.n_layer ? pred : NULL;
  if (cuda_rt_d2h_async(ts->sel_h, sel, (size_t)ns * sizeof(int32_t), stream) ||
      (pred && cuda_rt_d2h_async(ts->pred_h, pred, (size_t)K * sizeof(int32_t), stream)) ||
      (cpu_ok && (cuda_rt_d2h_async(ts->xq_h, xq, xs, stream) ||
                  cuda_rt_d2h_async(ts->x_h, x, (size_t)m->hp.n_embd * sizeof(float), stream))) ||
      cuda_rt_stream_sync(stream, msg, msglen))
    return FLOE_E_IO;
  t->st.wait_s += floe_time_s() - t0;
  /* the previous step's copies are done: its expert-cache slots go back */
  const bool cached = l < xs_layers(t);
  if (m->xs && !t->xs_seen) xs_first(t);
  cu_tier_done(ts);
  ts->n_cp = 0;
  /* the previous step's prefetch copies land before anything this step enqueues */
  if (t->pf_pending) {
    if (cuda_rt_stream_wait_event(stream, t->pf_ev)) {
      snprintf(msg, msglen, "cannot order the expert prefetch before the step");
      return FLOE_E_IO;
    }
    t->pf_pending = false;
  }
  /* hits first (they must be held before any miss picks a victim), misses listed */
  int32_t *miss = ts->miss;
  int64_t n_miss = 0;
  for (int64_t i = 0; i < ns; i++) {
    const int64_t j = i % ks;
    const int32_t e = ts->sel_h[i];
    if (sh && j == K) {
      ts->sid_h[i] = t->res_of[l];
      continue;
    }
    if (e < 0 || e >= NE) { /* the kernels' documented NaN rows */
      ts->sid_h[i] = -1;
      continue;
    }
    t->st.lookups++;
    const int32_t r = xv_find(t->xv, l, e);
    if (r >= 0) {
      ts->sid_h[i] = (int32_t)(t->n_res + r);
      t->st.hits++;
      if (t->pf_flag && t->pf_flag[r]) {
        t->pf_flag[r] = 0;
        t->st.pf_used++;
      }
    } else {
      ts->sid_h[i] = -2; /* decided below */
      miss[n_miss++] = (int32_t)i;
    }
  }
  /* how many misses the CPU takes (one-row steps): all (mode 1), else the cost model's split */
  int n_cpu = 0;
  if (cpu_ok && n_miss > 0) {
    int can = 0;
    for (int64_t q = 0; q < n_miss; q++) can += cpu_can(H, ts->sel_h[miss[q]], &H->exp_gate[0]);
    if (t->cpu_mode == 1) n_cpu = can;
    else {
      const double tc = t->st.cpu_expert_s > 0 ? t->st.cpu_expert_s : 0;
      const double tp = t->st.pcie_gbps > 0 ? (double)t->expert_bytes / (t->st.pcie_gbps * 1e9) : 1e9;
      const double tg = t->st.gpu_gbps > 0 ? (double)t->expert_bytes / (t->st.gpu_gbps * 1e9) : 0;
      double best = 1e30;
      for (int c = 0; c <= can; c++) {
        const double a = c * tc, b = (double)(n_miss - c) * tp + (double)(ns - c) * tg, w = a > b ? a : b;
        if (w < best) best = w, n_cpu = c;
      }
      if (!ts->calibrated) n_cpu = can > 0 ? 1 : 0; /* the first step measures the CPU */
    }
  }
  for (int64_t q = 0; q < n_miss; q++) {
    const int64_t i = miss[q];
    const int32_t e = ts->sel_h[i];
    const int32_t have = xv_find(t->xv, l, e); /* copied for an earlier row of this chunk */
    if (have >= 0) {
      ts->sid_h[i] = (int32_t)(t->n_res + have);
      t->st.hits++;
      continue;
    }
    if (n_cpu > 0 && ts->n_job < n_cpu && cpu_can(H, e, &H->exp_gate[0])) {
      for (int k = 0; k < 3; k++) ts->job_m[ts->n_job][k] = mat_of(H, k, e); /* cached: host_fetch's */
      ts->job_e[ts->n_job] = e;
      ts->job_slot[ts->n_job++] = (int32_t)i;
      ts->sid_h[i] = -1;
      t->st.cpu++;
      continue;
    }
    int64_t ol;
    int32_t oe;
    const int32_t r = xv_take(t->xv, l, e, &ol, &oe);
    if (r < 0) { /* cu_tier_min_bytes makes this unreachable */
      snprintf(msg, msglen, "--gpu-mem: the expert pool cannot hold one step's experts");
      return FLOE_E_NOMEM;
    }
    if (t->pf_flag) t->pf_flag[r] = 0; /* a demand copy's slot now */
    if (cached) { /* host_fetch copies it */
      ts->cp_e[ts->n_cp] = e;
      ts->cp_r[ts->n_cp++] = r;
    } else
      for (int k = 0; k < 3; k++)
        if (put(t, k, t->n_res + r, mat_of(H, k, e), stream)) {
          snprintf(msg, msglen, "cannot copy an expert to the GPU");
          return FLOE_E_IO;
        }
    ts->sid_h[i] = (int32_t)(t->n_res + r);
    t->st.copies++;
  }
  if (cached) {
    const int rc = host_fetch(ts, l, stream, msg, msglen);
    if (rc) return rc;
    host_prefetch(ts, l, n, pred != NULL);
  }
  if (t->pf_stream && pred && !cached) vram_prefetch(ts, l);
  static int dbg = -1; /* FLOE_TIER_DEBUG=N: the first N steps' decisions on stderr */
  if (dbg < 0) dbg = getenv("FLOE_TIER_DEBUG") ? atoi(getenv("FLOE_TIER_DEBUG")) : 0;
  if (dbg > 0) {
    dbg--;
    fprintf(stderr, "tier: layer %lld, %lld rows x %d: %lld misses, %d on the CPU; sid", (long long)l, (long long)n,
            ks, (long long)n_miss, ts->n_job);
    for (int64_t i = 0; i < ns && i < 12; i++) fprintf(stderr, " %d", ts->sid_h[i]);
    fprintf(stderr, "\n");
  }
  xv_release_all(t->xv); /* later copies are ordered after this step's kernels on the stream */
  if (cuda_rt_h2d_async(ts->sid_d, ts->sid_h, (size_t)ns * sizeof(int32_t), stream)) return FLOE_E_IO;
  *sid = ts->sid_d;
  return 0;
}

int cu_tier_end(cu_tier_sess *ts, float *Y, void *stream, char *msg, size_t msglen) {
  if (ts->n_job == 0) return 0;
  cu_tier *t = ts->t;
  const int64_t E = t->m->hp.n_embd;
  if (!ts->calibrated) calibrate(ts, ts->xs);
  const double t0 = floe_time_s();
  cpu_compute(ts, ts->xs);
  const double dt = floe_time_s() - t0;
  t->st.cpu_s += dt;
  /* running estimate of one expert's CPU time (the layer's experts run together: per expert) */
  const double per = dt / ts->n_job;
  t->st.cpu_expert_s = t->st.cpu_expert_s > 0 ? 0.9 * t->st.cpu_expert_s + 0.1 * per : per;
  for (int j = 0; j < ts->n_job; j++)
    if (cuda_rt_h2d_async(Y + (size_t)ts->job_slot[j] * E, ts->y_h + (size_t)j * E, (size_t)E * sizeof(float), stream)) {
      snprintf(msg, msglen, "cannot copy an expert's output to the GPU");
      return FLOE_E_IO;
    }
  return 0;
}

void cu_tier_done(cu_tier_sess *ts) {
  if (ts->n_held && ts->t->m->xs) xs_release(ts->t->m->xs, ts->xs_slot, ts->n_held);
  ts->n_held = 0;
}

void cu_tier_stats(const cu_tier *t, model_tier_stats *out) { *out = t->st; }

int cu_tier_cpu_jobs(const cu_tier_sess *ts) { return ts->n_job; }

void cu_tier_count_graphs(cu_tier_sess *ts, int recorded, int launched) {
  ts->t->st.graphs_recorded += (uint64_t)recorded;
  ts->t->st.graph_launches += (uint64_t)launched;
}

void cu_tier_stats_reset(cu_tier *t) {
  model_tier_stats *s = &t->st;
  s->lookups = s->hits = s->copies = s->cpu = s->h2d_bytes = s->pf_issued = s->pf_used = 0;
  s->graphs_recorded = s->graph_launches = 0;
  s->wait_s = s->cpu_s = 0;
}
#endif
