/* The CPU backend: the block operations of backend.h on the host, with the math of layers.c and
 * the kernels of src/kernels/cpu. The reference every other backend is compared with.
 *
 * A session's CPU state is the KV cache and recurrent state (kv_state, host buffers), the
 * thread pool, and one arena of scratch sized for MODEL_MAX_BATCH rows (model.h's session
 * fields). Checkpoints are host copies of the recurrent state (kv_ckpt_save). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "model/model.h"

static int cpu_session_init(model_session *s, int n_threads, char *err, size_t errlen) {
  const model *m = s->m;
  const floe_hparams *hp = &m->hp;
  const int64_t n_ctx = s->kv.n_ctx;
  int rc = kv_init(&s->kv, hp, n_ctx, s->kv.kv_type, err, errlen);
  if (rc) return rc;
  if (n_threads > 1 && !(s->pool = floe_pool_create(n_threads)))
    return floe_err(err, errlen, FLOE_E_NOMEM, "cannot start %d threads", n_threads);
  /* resident experts: the workers spin between the parallel regions of a token and also bridge
   * the gap between two decoded tokens (sampling, the caller's loop: ~50 us) instead of blocking
   * after ~25 us; each token's first region had waited ~20 us for a worker to wake (profiling
   * build, 2026-11-30). Streamed experts keep the short spin: between their regions the threads
   * wait on the disk, where spinning workers would only burn CPU. */
  if (!m->xs) floe_pool_set_spin(s->pool, 16000);
  const int64_t B = MODEL_MAX_BATCH, E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used;
  const int64_t qdim = hp->n_head * hp->head_dim * 2, kvd = hp->n_head_kv * hp->head_dim;
  const int64_t Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state, vd = hp->ssm_d_inner;
  const int64_t C = 2 * Nk * dk + vd, dv = Nv ? vd / Nv : 0;
  const int64_t raw = 2 * Nk * dk + 2 * vd > C ? 2 * Nk * dk + 2 * vd : C;
  s->ff_max = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
  int64_t tmp = 2 * kvd > dv ? 2 * kvd : dv;
  struct { float **p; int64_t n; } parts[] = {
    { &s->h, B * E }, { &s->out, B * E }, { &s->y, B * E }, { &s->q, B * qdim }, { &s->k, B * kvd },
    { &s->v, B * kvd }, { &s->att, B * hp->n_head * hp->head_dim }, { &s->scores, n_ctx }, { &s->kvtmp, tmp },
    { &s->mix, B * C }, { &s->z, B * vd }, { &s->b, B * Nv }, { &s->a, B * Nv }, { &s->raw, B * raw },
    { &s->raw2, B * 2 * Nv }, { &s->o, B * vd }, { &s->rlog, B * NE }, { &s->selw, B * K },
    { &s->contrib, B * K * E }, { &s->eg, (B * K + B) * s->ff_max }, { &s->eu, (B * K + B) * s->ff_max },
    { &s->ein, B * K * E }, { &s->eout, B * E }, { &s->shg, B }, { &s->x, B * E }, { &s->tscr, 0 },
  };
  /* per-thread scratch: attention scores [grp][n_ctx]; GDN [dv] */
  const int64_t grp = hp->n_head / hp->n_head_kv, nth = n_threads > 1 ? n_threads : 1;
  const int64_t att_scr = grp * n_ctx;
  s->tscr_n = (att_scr > dv ? att_scr : dv) + 16;
  s->tscr_n = (s->tscr_n + 15) / 16 * 16;
  parts[sizeof parts / sizeof parts[0] - 1].n = nth * s->tscr_n;
  /* quantized activation rows: at most ~2.3 bytes per value for any layout (kernels_internal.h) */
  int64_t cmax = E > vd ? E : vd;
  if (hp->n_head * hp->head_dim > cmax) cmax = hp->n_head * hp->head_dim;
  if (s->ff_max > cmax) cmax = s->ff_max;
  s->xq_row = (size_t)(3 * cmax + 1024 + 63) / 64 * 64;
  s->xq_h = floe_aligned_alloc(64, s->xq_row * (size_t)B);
  s->xq_m = floe_aligned_alloc(64, s->xq_row * (size_t)B);
  s->xq_g = floe_aligned_alloc(64, s->xq_row * (size_t)(B * K));
  s->xq_d = floe_aligned_alloc(64, s->xq_row * (size_t)(B * K + B));
  s->ecnt = malloc((size_t)NE * sizeof(int32_t));
  s->eoff = malloc((size_t)NE * sizeof(int32_t));
  s->aidx = malloc((size_t)(B * K) * sizeof(int32_t));
  s->tasks = malloc((size_t)(2 * NE + 8) * layer_task_bytes());
  s->xs_list = malloc((size_t)NE * sizeof(int32_t));
  s->xs_slot = malloc((size_t)NE * sizeof(int32_t));
  s->xs_tmp = malloc((size_t)NE * sizeof(int32_t));
  s->xs_ready = malloc((size_t)NE);
  s->ridx = malloc((size_t)(B * K) * sizeof(int32_t));
  if (!s->xq_h || !s->xq_m || !s->xq_g || !s->xq_d || !s->ecnt || !s->eoff || !s->aidx || !s->tasks || !s->xs_list ||
      !s->xs_slot || !s->xs_tmp || !s->xs_ready || !s->ridx)
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory for session scratch");
  size_t np = sizeof parts / sizeof parts[0], total = 0;
  for (size_t i = 0; i < np; i++) total += (size_t)((parts[i].n + 15) / 16 * 16);
  s->buf = floe_aligned_alloc(64, total * sizeof(float));
  s->sel = malloc((size_t)(B * K) * sizeof(int32_t));
  if (!s->buf || !s->sel) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory for session scratch");
  memset(s->buf, 0, total * sizeof(float));
  s->bytes = s->kv.bytes + total * sizeof(float) + s->xq_row * (size_t)(2 * B + 2 * B * K + B) +
             (size_t)(3 * NE + B * K * 2) * sizeof(int32_t) + (size_t)NE + (size_t)(2 * NE + 8) * layer_task_bytes() +
             (size_t)(B * K) * sizeof(int32_t);
  float *p = s->buf;
  for (size_t i = 0; i < np; i++) {
    *parts[i].p = p;
    p += (parts[i].n + 15) / 16 * 16;
  }
  return 0;
}

static void cpu_session_free(model_session *s) {
  kv_free(&s->kv);
  if (s->pool && !s->pool_shared) floe_pool_free(s->pool);
  floe_aligned_free(s->buf);
  free(s->sel);
  floe_aligned_free(s->xq_h);
  floe_aligned_free(s->xq_m);
  floe_aligned_free(s->xq_g);
  floe_aligned_free(s->xq_d);
  free(s->ecnt);
  free(s->eoff);
  free(s->aidx);
  free(s->tasks);
  free(s->xs_list);
  free(s->xs_slot);
  free(s->xs_tmp);
  free(s->xs_ready);
  free(s->ridx);
}

static void cpu_state_reset(model_session *s) { kv_reset(&s->kv); }
static size_t cpu_ckpt_bytes(const model_session *s) { return kv_ckpt_bytes(&s->kv); }
static int cpu_ckpt_save(model_session *s, kv_ckpt *c) { return kv_ckpt_save(&s->kv, c); }
static void cpu_ckpt_restore(model_session *s, const kv_ckpt *c) { kv_ckpt_restore(&s->kv, c); }
static void cpu_ckpt_free(model_session *s, kv_ckpt *c) {
  (void)s;
  kv_ckpt_free(c);
}

static float *cpu_eval_begin(model_session *s, const int32_t *tokens, int64_t n, int64_t pos0, int flags) {
  (void)tokens, (void)n, (void)pos0, (void)flags;
  return s->x;
}

static int cpu_eval_end(model_session *s, int64_t n, char *err, size_t errlen) {
  (void)s, (void)n, (void)err, (void)errlen;
  return 0;
}

static void cpu_embed(model_session *s, const int32_t *tokens, int64_t n, float *x) {
  const int64_t E = s->m->hp.n_embd;
  for (int64_t t = 0; t < n; t++) model_embed_row(s->m, tokens[t], x + t * E); /* any type, MLX included */
}

static void cpu_logits(model_session *s, const float *x, int64_t first, int64_t n, float *logits, bool greedy) {
  const model *m = s->m;
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
  for (int64_t t = first; t < n; t++) layer_rmsnorm(x + t * E, m->output_norm, E, m->hp.rms_eps, s->h + t * E);
  if (greedy && n - first == 1) /* one row: its greedy pick found by the threads over their rows */
    s->greedy = layer_matmul_argmax(s, &m->output, s->h + first * E, logits);
  else if (n - first > 0)
    layer_matmul(s, &m->output, n - first, s->h + first * E, E, logits, V);
}

static void cpu_hidden(model_session *s, const float *x, int64_t first, int64_t n, float *dst) {
  const int64_t E = s->m->hp.n_embd;
  memcpy(dst, x + first * E, (size_t)((n - first) * E) * sizeof(float));
}

static float *cpu_multi_begin(model_session *lead, const model_rows *r, int k, int64_t n, int64_t first) {
  (void)r, (void)k, (void)n, (void)first;
  return lead->x; /* MODEL_MAX_BATCH rows; the segments' own scratch is separate (h, q, k, ...) */
}

static int cpu_keep_begin(model_session *s, int64_t n) { return kv_keep_begin(&s->kv, n); }
static void cpu_keep_accept(model_session *s, int64_t a) { kv_keep_accept(&s->kv, a); }

const model_backend model_backend_cpu = {
  .name = "cpu",
  .device = MODEL_DEV_CPU,
  .model_init = NULL,
  .model_fini = NULL,
  .session_init = cpu_session_init,
  .session_free = cpu_session_free,
  .state_reset = cpu_state_reset,
  .ckpt_bytes = cpu_ckpt_bytes,
  .ckpt_save = cpu_ckpt_save,
  .ckpt_restore = cpu_ckpt_restore,
  .ckpt_free = cpu_ckpt_free,
  .eval_begin = cpu_eval_begin,
  .eval_end = cpu_eval_end,
  .embed = cpu_embed,
  .attention = layer_attention,
  .gdn = layer_gdn,
  .moe = layer_moe,
  .logits = cpu_logits,
  .hidden = cpu_hidden,
  .keep_begin = cpu_keep_begin,
  .keep_accept = cpu_keep_accept,
  .multi_begin = cpu_multi_begin,
  .attention_multi = layer_attention_multi,
  .gdn_multi = layer_gdn_multi,
};
