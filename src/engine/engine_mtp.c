/* Speculative decoding with the model's own MTP head (engine_internal.h, model.h model_verify /
 * model_mtp_eval).
 *
 * One step, the session holding positions 0..P-1 and the next token x_P already chosen:
 *   draft   the MTP row at P-1 reads (x_P, h_{P-1}) and gives d_1; for k > 1 the row at P+j-2
 *           reads (d_{j-1}, g_{j-1}) (the module's own normed output) and gives d_j;
 *   verify  the trunk evaluates [x_P, d_1..d_k] in ONE model_verify pass (k+1 rows, every row
 *           bit-identical to single-token decode, per-row recurrent states kept);
 *   accept  greedy: the longest prefix with d_i == argmax(row i-1); sampling: the speculative-
 *           sampling rule (sampler_spec_step) position by position; model_verify_accept keeps
 *           x_P and the a accepted drafts (pointer swap of the recurrent state, no copy);
 *   next    the trunk's row a gives the next token (greedy: its argmax, exactly what decode
 *           without MTP would pick; sampling: a draw from it, or the rule's resampled token).
 * So greedy output is the output of decode without MTP, token for token.
 * On a backend with a one-pass step (model_spec_fused: CUDA), a greedy step whose caller does not
 * read the drafts' logits (no log-probabilities) runs draft, verify and accept as ONE device pass
 * with one host round trip (step_fused; the same arithmetic, so the same drafts and output); a
 * sampled step keeps the composed path, since the speculative-sampling rule needs every draft's
 * and every verify row's full distribution on the host.
 *
 * The MTP's attention cache must hold, for every position t, the row computed from (x_{t+1},
 * h_t) with the trunk's h_t: drafted rows (computed from g) are overwritten by these "catch-up"
 * rows once the trunk's hidden states are known, batched with the next step's first draft row
 * (pending rows). Prefill feeds them too (spec_eval). A history evaluated without hidden states
 * leaves some rows stale: that only lowers the acceptance, never changes the output.
 *
 * k is chosen automatically unless forced: the expected tokens of a step with k drafts,
 * 1 + sum_i prod_{j<=i} alpha_j (alpha_j: the measured conditional acceptance at draft position
 * j), over its measured cost (the median of the last 8 step wall times: draft + verify, or a
 * plain decode step for k = 0; a step that recorded a GPU graph is not counted); each k is tried
 * a few times first (round robin over 0, 1, ...; k >= 2 only while k - 1 measured at least
 * SPEC_PRUNE of the plain step's tokens per second: where one draft loses clearly, more drafts
 * are not tried first) and the neighbours of the best are re-measured every 16 steps, so a k
 * left out can still be reached from k - 1 (spec_best_k is the choice itself).
 * Where drafting costs more than it gains (a small model on the CPU, whose verify rows cost
 * about a decode step each; under a memory budget, where a verify step reads the union of its
 * rows' experts), k = 0 wins, and 32 such choices in a row (4 when every k > 0 measured below
 * SPEC_PRUNE of the plain rate) switch drafting off for 256 steps that skip the MTP block
 * entirely (plain decode); then it is fed and measured again (spec_choose_k), and each time it
 * is switched off again without a k > 0 chosen in between the span doubles, up to 4096 steps.
 * Only greedy requests reach the automatic choice (engine.c): a sampled request's draws depend
 * on each step's k, and k on timing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/engine_internal.h"
#include "model/model.h"
#include "sample/sampler.h"

#define SPEC_KMAX 4
#define SPEC_EXPLORE 3 /* steps of each k measured before choosing */
#define SPEC_OFF_AFTER 32 /* automatic choices of k = 0 in a row that switch drafting off ... */
#define SPEC_OFF_CLEAR 4  /* ... or this many where every k > 0 measured below SPEC_PRUNE of k = 0 */
#define SPEC_OFF 256      /* ... for this many decode steps, doubled each time again ... */
#define SPEC_OFF_MAX 4096 /* ... up to this many */
#define SPEC_PRUNE 0.9    /* tokens per second, relative to plain steps, below which a k loses clearly */
#define SPEC_WIN 8     /* step times kept per k: their median is the cost (a preempted step, or one
                        * that flushes the MTP's pending rows, is an outlier, not a trend) */

struct spec {
  int64_t E, V;
  int64_t cap, pn, ppos; /* pending MTP rows: positions ppos..ppos+pn-1 */
  int32_t *ptok;         /* [cap] the token after each pending position */
  float *ph;             /* [cap + 1][E] normed hidden states (also the MTP's output buffer) */
  float *hlast;          /* [E] normed trunk hidden state at position hpos */
  int64_t hpos;          /* -1: none */
  float *hbuf;           /* [MODEL_MAX_BATCH][E] hidden states of one spec_eval chunk */
  float *vlog, *vhid;    /* [KV_KEEP_MAX][V], [KV_KEEP_MAX][E] verify rows */
  float *dlog, *g;       /* [V] draft logits, [E] chained hidden */
  float *q, *p, *tmp;    /* [SPEC_KMAX][V] draft distributions, [V], [V] */
  /* automatic k */
  double cost[SPEC_KMAX + 1];                   /* the median of the last SPEC_WIN step times */
  double cost_win[SPEC_KMAX + 1][SPEC_WIN];
  int64_t cost_n[SPEC_KMAX + 1], n_choice;
  int64_t zero_run; /* automatic choices of k = 0 in a row (probes aside) */
  int64_t off;      /* decode steps left with drafting off: no MTP rows are fed */
  int64_t off_len;  /* the span of the next switch-off (SPEC_OFF, doubling; back to it when k > 0 wins) */
  bool unfed;       /* the step spec_choose_k just chose is one of those */
  int64_t a_tried[SPEC_KMAX], a_acc[SPEC_KMAX]; /* lifetime acceptance (not reset with the stats) */
  /* counters (floe_session_stats) */
  int64_t steps, drafted[SPEC_KMAX], accepted[SPEC_KMAX], tokens;
  int64_t k_steps[SPEC_KMAX + 1]; /* steps taken with k drafts (0: plain steps) */
  int k_last;
  double step_s;
};

int spec_new(model_session *ms, spec **out, char *err, size_t errlen) {
  *out = NULL;
  const model *m = ms->m;
  if (!model_has_mtp(m)) return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "the model has no MTP module");
  spec *sp = calloc(1, sizeof *sp);
  if (!sp) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
  sp->E = E;
  sp->V = V;
  sp->cap = MODEL_MAX_BATCH - 1;
  sp->hpos = -1;
  sp->off_len = SPEC_OFF;
  sp->ptok = malloc((size_t)sp->cap * sizeof *sp->ptok);
  sp->ph = malloc((size_t)((sp->cap + 1) * E) * sizeof(float));
  sp->hlast = malloc((size_t)E * sizeof(float));
  sp->hbuf = malloc((size_t)(MODEL_MAX_BATCH * E) * sizeof(float));
  sp->vlog = malloc((size_t)(KV_KEEP_MAX * V) * sizeof(float));
  sp->vhid = malloc((size_t)(KV_KEEP_MAX * E) * sizeof(float));
  sp->dlog = malloc((size_t)V * sizeof(float));
  sp->g = malloc((size_t)E * sizeof(float));
  sp->q = malloc((size_t)(SPEC_KMAX * V) * sizeof(float));
  sp->p = malloc((size_t)V * sizeof(float));
  sp->tmp = malloc((size_t)V * sizeof(float));
  if (!sp->ptok || !sp->ph || !sp->hlast || !sp->hbuf || !sp->vlog || !sp->vhid || !sp->dlog || !sp->g || !sp->q ||
      !sp->p || !sp->tmp) {
    spec_free(sp);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory for the MTP buffers");
  }
  *out = sp;
  return 0;
}

void spec_free(spec *sp) {
  if (!sp) return;
  free(sp->ptok);
  free(sp->ph);
  free(sp->hlast);
  free(sp->hbuf);
  free(sp->vlog);
  free(sp->vhid);
  free(sp->dlog);
  free(sp->g);
  free(sp->q);
  free(sp->p);
  free(sp->tmp);
  free(sp);
}

void spec_stats(const spec *sp, floe_session_stats *out) {
  if (!sp) return;
  out->mtp_steps = sp->steps;
  for (int j = 0; j < SPEC_KMAX; j++) {
    out->mtp_drafted[j] = sp->drafted[j];
    out->mtp_accepted[j] = sp->accepted[j];
  }
  out->mtp_tokens = sp->tokens;
  out->mtp_k_last = sp->k_last;
  for (int k = 0; k <= SPEC_KMAX; k++) out->mtp_k_steps[k] = sp->k_steps[k];
  out->mtp_step_s = sp->step_s;
}

void spec_stats_reset(spec *sp) {
  if (!sp) return;
  sp->steps = sp->tokens = 0;
  sp->step_s = 0;
  memset(sp->drafted, 0, sizeof sp->drafted);
  memset(sp->accepted, 0, sizeof sp->accepted);
  memset(sp->k_steps, 0, sizeof sp->k_steps);
}

void spec_forget_hidden(spec *sp) {
  if (sp) sp->hpos = -1;
}

void spec_rewound(spec *sp, int64_t n_past) {
  if (!sp) return;
  const int64_t keep = n_past - 1 - sp->ppos; /* pending rows at positions < n_past - 1 stay valid */
  if (sp->pn > keep) sp->pn = keep > 0 ? keep : 0;
  sp->hpos = -1;
}

/* Runs the pending rows (no logits). */
static int flush(spec *sp, model_session *ms, char *err, size_t errlen) {
  if (sp->pn == 0) return 0;
  int rc = model_mtp_eval(ms, sp->ptok, sp->ph, sp->pn, sp->ppos, sp->pn, NULL, NULL, err, errlen);
  sp->pn = 0;
  return rc;
}

/* Queues the MTP row at position pos: (token after pos, normed hidden at pos). */
static int push(spec *sp, model_session *ms, int64_t pos, int32_t tok, const float *h, char *err, size_t errlen) {
  int rc;
  if (sp->pn > 0 && (pos != sp->ppos + sp->pn || sp->pn == sp->cap) && (rc = flush(sp, ms, err, errlen))) return rc;
  if (sp->pn == 0) sp->ppos = pos;
  sp->ptok[sp->pn] = tok;
  memcpy(sp->ph + sp->pn * sp->E, h, (size_t)sp->E * sizeof(float));
  sp->pn++;
  return 0;
}

/* The trunk evaluated ids[0..n) at positions P..P+n-1 with raw hidden states hid[n][E] (normed
 * here in place): queue the rows at P-1 .. P+n-2 and keep h_{P+n-1}. */
static int feed(spec *sp, model_session *ms, int64_t P, const int32_t *ids, int64_t n, float *hid, char *err,
                size_t errlen) {
  model_final_norm(ms->m, hid, n, hid);
  int rc;
  if (P > 0 && sp->hpos == P - 1 && (rc = push(sp, ms, P - 1, ids[0], sp->hlast, err, errlen))) return rc;
  for (int64_t t = 1; t < n; t++)
    if ((rc = push(sp, ms, P + t - 1, ids[t], hid + (t - 1) * sp->E, err, errlen))) return rc;
  memcpy(sp->hlast, hid + (n - 1) * sp->E, (size_t)sp->E * sizeof(float));
  sp->hpos = P + n - 1;
  return 0;
}

int spec_eval(spec *sp, model_session *ms, const int32_t *ids, int64_t n, float *last_logits, char *err, size_t errlen) {
  for (int64_t c0 = 0; c0 < n; c0 += MODEL_MAX_BATCH) {
    const int64_t nb = n - c0 < MODEL_MAX_BATCH ? n - c0 : MODEL_MAX_BATCH, P = model_session_pos(ms);
    int rc = model_eval_h(ms, ids + c0, nb, last_logits, false, sp->hbuf, err, errlen);
    if (!rc) rc = feed(sp, ms, P, ids + c0, nb, sp->hbuf, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* Tokens a step with k drafts produces on average: 1 + sum_i prod_{j<=i} alpha_j. */
static double expected_tokens(const double *alpha, int k) {
  double e = 1, run = 1;
  for (int j = 0; j < k; j++) {
    run *= alpha[j];
    e += run;
  }
  return e;
}

/* k drafts' measured tokens per second relative to plain steps' (0: either unmeasured) */
double spec_rate_rel(const double *cost, const double *alpha, int k) {
  if (cost[k] <= 0 || cost[0] <= 0) return 0;
  return expected_tokens(alpha, k) / cost[k] * cost[0];
}

int spec_best_k(const double *cost, const double *alpha, int kmax) {
  int k = 0;
  double best = -1;
  for (int kk = 0; kk <= kmax; kk++) {
    const double r = cost[kk] > 0 ? expected_tokens(alpha, kk) / cost[kk] : 0;
    if (r > best) best = r, k = kk; /* ties: the smaller k (cheaper when the costs are equal) */
  }
  return k;
}

int spec_choose_k(spec *sp, int forced, int64_t room) {
  int k;
  sp->unfed = false;
  if (forced > 0) k = forced;
  else if (sp->off > 0) { /* drafting did not pay: plain steps that skip the MTP entirely */
    sp->off--;
    sp->unfed = true;
    return 0;
  } else {
    double alpha[SPEC_KMAX]; /* the conditional acceptance per draft position (Laplace-smoothed) */
    for (int j = 0; j < SPEC_KMAX; j++) alpha[j] = (double)(sp->a_acc[j] + 1) / (double)(sp->a_tried[j] + 2);
    /* exploration, round robin (0, 1, 2, 3, 4, 0, ...) so that every k sees the same drift of
     * the machine and of the expert cache (a cold cache makes the first steps slow); k >= 2 only
     * once k - 1 and 0 are measured and k - 1 has not lost clearly (spec_rate_rel) */
    k = -1;
    for (int kk = 0; kk <= SPEC_KMAX; kk++) {
      if (sp->cost_n[kk] >= SPEC_EXPLORE || (k >= 0 && sp->cost_n[kk] >= sp->cost_n[k])) continue;
      if (kk >= 2 && (!sp->cost_n[kk - 1] || !sp->cost_n[0] || spec_rate_rel(sp->cost, alpha, kk - 1) < SPEC_PRUNE))
        break;
      k = kk;
    }
    if (k < 0) {
      k = spec_best_k(sp->cost, alpha, SPEC_KMAX);
      /* k = 0 chosen SPEC_OFF_AFTER times in a row (SPEC_OFF_CLEAR when every measured k > 0
       * loses clearly): drafting is switched off for off_len steps, which then skip the MTP's
       * rows too (what a plain step in MTP mode still pays for); then the rows are fed again and
       * the choice (with its probes) resumes. The MTP's attention rows of the switched-off span
       * stay stale: that can only lower the acceptance of later drafts (so the decision errs
       * towards off), never change the output. */
      bool clear = k == 0;
      for (int kk = 1; kk <= SPEC_KMAX && clear; kk++)
        clear = !sp->cost_n[kk] || spec_rate_rel(sp->cost, alpha, kk) < SPEC_PRUNE;
      sp->zero_run = k == 0 ? sp->zero_run + 1 : 0;
      if (k > 0) sp->off_len = SPEC_OFF;
      if (sp->zero_run >= (clear ? SPEC_OFF_CLEAR : SPEC_OFF_AFTER)) {
        sp->zero_run = 0;
        sp->off = sp->off_len;
        sp->off_len = sp->off_len * 2 < SPEC_OFF_MAX ? sp->off_len * 2 : SPEC_OFF_MAX;
      }
      if (++sp->n_choice % 16 == 0) { /* re-measure a neighbour: costs drift (cache, experts) */
        const int nb = (sp->n_choice / 16) % 2 ? k + 1 : k - 1;
        if (nb >= 0 && nb <= SPEC_KMAX) k = nb;
      }
    }
  }
  if (k > SPEC_KMAX) k = SPEC_KMAX;
  if (k > room) k = (int)(room > 0 ? room : 0);
  return k;
}

/* tests: step costs pinned instead of measured (spec_test_pin_costs) */
static double pinned[SPEC_KMAX + 1];
static bool pinned_on;

void spec_test_pin_costs(const double *cost) {
  pinned_on = cost != NULL;
  if (cost) memcpy(pinned, cost, sizeof pinned);
}

static void note_cost(spec *sp, int k, double dt) {
  if (pinned_on) dt = pinned[k];
  double *w = sp->cost_win[k], v[SPEC_WIN];
  w[sp->cost_n[k] % SPEC_WIN] = dt;
  sp->cost_n[k]++;
  const int n = sp->cost_n[k] < SPEC_WIN ? (int)sp->cost_n[k] : SPEC_WIN;
  for (int i = 0; i < n; i++) { /* insertion sort of the window (n <= 8) */
    int j = i;
    for (; j > 0 && v[j - 1] > w[i]; j--) v[j] = v[j - 1];
    v[j] = w[i];
  }
  sp->cost[k] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The end of a drafted step that kept x_P and a drafts (toks[0..a]): counters, the accepted ids,
 * the catch-up rows of the kept rows (hid: their raw hidden states) and the step's cost. */
static int step_done(spec *sp, model_session *ms, int64_t P, const int32_t *toks, int k, int a, float *hid,
                     int32_t *acc, int *n_acc, double t0, int64_t rec0, char *err, size_t errlen) {
  for (int j = 0; j < k && j <= a; j++) {
    sp->drafted[j]++;
    sp->a_tried[j]++;
    if (j < a) sp->accepted[j]++, sp->a_acc[j]++;
  }
  for (int i = 0; i < a; i++) acc[i] = toks[i + 1];
  *n_acc = a;
  /* the trunk's hidden states of the kept rows feed the MTP's catch-up rows */
  int rc = feed(sp, ms, P, toks, a + 1, hid, err, errlen);
  if (rc) return rc;
  const double dt = floe_time_s() - t0;
  /* a step that recorded a replayable step (a GPU graph, once per kind and row count) is not a
   * measure of what the next ones cost: steady costs decide k */
  if (model_session_recorded(ms) == rec0) note_cost(sp, k, dt);
  sp->steps++;
  sp->k_steps[k]++;
  sp->tokens += a + 1;
  sp->k_last = k;
  sp->step_s += dt;
  return 0;
}

/* A greedy step as one device pass (model_spec_greedy): the pending catch-up rows and the row at
 * P-1 (at most KV_KEEP_MAX: a longer backlog, left by a prompt, is run first on its own), the k
 * chained drafts, the verify and the accept count, one host round trip. The same arithmetic as
 * the composed step below, so the same drafts, acceptance and output. */
static int step_fused(spec *sp, model_session *ms, int32_t id, int k, float *last_logits, int32_t *acc, int *n_acc,
                      double t0, int64_t rec0, char *err, size_t errlen) {
  const int64_t P = model_session_pos(ms);
  int rc;
  if (sp->pn >= KV_KEEP_MAX && (rc = flush(sp, ms, err, errlen))) return rc;
  if ((rc = push(sp, ms, P - 1, id, sp->hlast, err, errlen))) return rc;
  sp->hpos = -1; /* the row at P-1 is run now: feed() must not queue it again */
  int32_t toks[SPEC_KMAX + 1], amax[SPEC_KMAX + 1];
  int64_t a = 0;
  toks[0] = id;
  rc = model_spec_greedy(ms, sp->ptok, sp->ph, sp->pn, sp->ppos, k, toks + 1, amax, &a, sp->vhid, last_logits, err,
                         errlen);
  sp->pn = 0;
  if (rc) return rc;
  model_verify_accept(ms, a + 1);
  return step_done(sp, ms, P, toks, k, (int)a, sp->vhid, acc, n_acc, t0, rec0, err, errlen);
}

int spec_step(spec *sp, model_session *ms, sampler *smp, int32_t id, int k, float *last_logits, int32_t *acc,
              int *n_acc, const float **acc_logits, int32_t *forced, bool row_logits, char *err, size_t errlen) {
  const int64_t P = model_session_pos(ms), V = sp->V, E = sp->E, rec0 = model_session_recorded(ms);
  const double t0 = floe_time_s();
  int rc;
  *n_acc = 0;
  *forced = -1;
  *acc_logits = sp->vlog;
  if (k < 1 && sp->unfed) { /* drafting switched off: the trunk alone, no hidden state kept */
    sp->unfed = false;
    sp->hpos = -1;
    rc = model_eval_h(ms, &id, 1, last_logits, false, NULL, err, errlen);
    if (!rc) sp->k_steps[0]++;
    return rc;
  }
  if (k < 1 || sp->hpos != P - 1) { /* a plain step (still feeding the MTP's rows) */
    rc = spec_eval(sp, ms, &id, 1, last_logits, err, errlen);
    if (!rc && k == 0 && model_session_recorded(ms) == rec0) note_cost(sp, 0, floe_time_s() - t0);
    if (!rc) sp->k_steps[0]++;
    return rc;
  }
  if (k > SPEC_KMAX) k = SPEC_KMAX;
  const bool greedy = sampler_greedy(smp);
  if (greedy && !row_logits && model_spec_fused(ms))
    return step_fused(sp, ms, id, k, last_logits, acc, n_acc, t0, rec0, err, errlen);
  int32_t toks[SPEC_KMAX + 1];
  toks[0] = id;
  /* draft 1: the pending catch-up rows and the row at P-1 in one MTP pass */
  if ((rc = push(sp, ms, P - 1, id, sp->hlast, err, errlen))) return rc;
  sp->hpos = -1; /* the row at P-1 is run now: feed() below must not queue it again */
  const int64_t n = sp->pn;
  if ((rc = model_mtp_eval(ms, sp->ptok, sp->ph, n, sp->ppos, n - 1, sp->dlog, sp->ph, err, errlen))) return rc;
  sp->pn = 0;
  memcpy(sp->g, sp->ph + (n - 1) * E, (size_t)E * sizeof(float));
  for (int j = 0; j < k; j++) {
    if (j > 0 && (rc = model_mtp_eval(ms, &toks[j], sp->g, 1, P + j - 1, 0, sp->dlog, sp->g, err, errlen))) return rc;
    if (greedy) toks[j + 1] = sampler_argmax(sp->dlog, (int32_t)V);
    else {
      sampler_probs(smp, sp->dlog, sp->q + j * V);
      toks[j + 1] = sampler_draw(smp, sp->q + j * V, (int32_t)V);
    }
  }
  /* verify [id, d_1..d_k] in one trunk pass */
  if ((rc = model_verify(ms, toks, k + 1, sp->vlog, sp->vhid, err, errlen))) return rc;
  int a = 0;
  for (; a < k; a++) {
    const float *row = sp->vlog + a * V;
    if (greedy) {
      if (sampler_argmax(row, (int32_t)V) != toks[a + 1]) break;
    } else {
      bool ok;
      sampler_probs(smp, row, sp->p);
      const int32_t t = sampler_spec_step(smp, sp->p, sp->q + a * V, (int32_t)V, toks[a + 1], sp->tmp, &ok);
      if (!ok) {
        *forced = t;
        break;
      }
    }
  }
  model_verify_accept(ms, a + 1);
  memcpy(last_logits, sp->vlog + a * V, (size_t)V * sizeof(float));
  return step_done(sp, ms, P, toks, k, a, sp->vhid, acc, n_acc, t0, rec0, err, errlen);
}
