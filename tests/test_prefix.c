/* Partial prefix reuse and prefill cancellation, through the public API (include/floe.h).
 *
 *  1. For tiny synthetic models of each architecture (qwen3moe: attention only; qwen3next and
 *     qwen35moe: GatedDeltaNet hybrids), many random scenarios on ONE session: the same prompt
 *     twice, extensions of the history, divergence in the middle (after a checkpoint and before
 *     any), prompts shorter than the history, two conversations alternating on the session. For
 *     each, the greedy tokens and their logprobs (chosen + top 20, from the logits) are
 *     BIT-IDENTICAL to a fresh session, and so are the full logits of a probe evaluated after the
 *     generation (the whole KV / recurrent state matches); n_reused is the common prefix for
 *     attention, the largest checkpoint at or before it for hybrids, and what
 *     floe_session_reusable predicted.
 *  2. Checkpoint placement: a prompt that diverges right after the previous prompt's end reuses
 *     all of it (Qwen3 drops the old <think>); one that diverges inside the final
 *     "<|im_start|>assistant\n<think>\n" reuses up to that <|im_start|> (Qwen3.5); a divergence
 *     inside a long prompt resumes at the interior checkpoint before it; the same prompt twice
 *     reuses all but the tail; the count stays within n_checkpoints; with n_checkpoints < 0 a
 *     hybrid reuses only whole histories (attention still rewinds).
 *  3. Cancellation: should_stop stops a 3000-token prefill after k steps (finish CANCELLED, n_gen
 *     0, n_past <= k * STEP, STEP = MODEL_MAX_BATCH = the engine's prefill step) in well under the
 *     full prefill's time; a stop before the first step
 *     evaluates nothing; the same prompt then continues from there (n_reused = what was
 *     evaluated) and equals a cold run; a divergent prompt cancelled after one step, then run to
 *     the end, equals a cold run too. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "floe.h"
#include "model/model.h" /* MODEL_MAX_BATCH: the engine's prefill step on the CPU (model.h max_batch) */
#include "test.h"

#define NCTX 1024
#define NGEN 6
#define NTOP 20
#define NPROBE 5
#define MAXGEN 64

static int synth(const char *out, const char *args) {
  const char *bin = getenv("FLOE_BIN");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s synth %s -o %s -t 1 >/dev/null 2>&1", bin ? bin : "build/bin/floe", args, out);
  return system(cmd);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state % n);
}

/* what one generation produced */
typedef struct gen_out {
  int32_t ids[MAXGEN];
  float lp[MAXGEN];
  int32_t top_ids[MAXGEN][NTOP];
  float top_lp[MAXGEN][NTOP];
  int n;
} gen_out;

static int on_tok(void *user, const floe_token_event *ev) {
  gen_out *g = user;
  if (ev->id < 0 || g->n >= MAXGEN) return 0;
  g->ids[g->n] = ev->id;
  g->lp[g->n] = ev->logprob;
  memcpy(g->top_ids[g->n], ev->top_ids, sizeof g->top_ids[0]);
  memcpy(g->top_lp[g->n], ev->top_logprobs, sizeof g->top_lp[0]);
  g->n++;
  return 0;
}

typedef struct ctx {
  floe_engine *e;
  int64_t V;
  bool hybrid;
  int32_t im_start, think;
  floe_session *warm, *cold;
  int32_t hist[NCTX]; /* mirror of warm's history */
  int64_t n_hist;
  float *la, *lb;     /* probe logits */
  int max_ckpt;
} ctx;

static int gen(floe_session *s, const int32_t *p, size_t n, gen_out *g, floe_gen_result *r) {
  floe_gen_params gp;
  floe_gen_params_init(&gp);
  gp.max_tokens = NGEN;
  gp.logprobs = true;
  gp.n_top_logprobs = NTOP;
  memset(g, 0, sizeof *g);
  char err[256];
  int rc = floe_generate(s, p, n, &gp, on_tok, g, r, err, sizeof err);
  if (rc) printf("generate: %s\n", err);
  return rc;
}

static int64_t common(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
  int64_t c = 0;
  while (c < na && c < nb && a[c] == b[c]) c++;
  return c;
}

/* What n_reused must be, from the documented rule and the checkpoints the session holds. */
static int64_t expect_reuse(ctx *c, const int32_t *p, int64_t n) {
  const int64_t cp = common(c->hist, c->n_hist, p, n);
  if (cp == c->n_hist) return cp;
  const int64_t want = cp < n - 1 ? cp : n - 1;
  if (!c->hybrid) return want;
  int64_t pos[4096], best = 0;
  const int k = floe_session_checkpoints(c->warm, pos, 4096);
  for (int i = 0; i < k; i++)
    if (pos[i] <= want && pos[i] > best) best = pos[i];
  return best;
}

/* Runs prompt p on the warm session and on a fresh one; everything must match bit for bit.
 * Returns n_reused (-1 on failure). */
static int64_t run_case(ctx *c, const char *what, const int32_t *p, int64_t n) {
  char err[256];
  gen_out gw, gc;
  floe_gen_result rw, rc_;
  const int64_t want = expect_reuse(c, p, n);
  const int64_t pred = floe_session_reusable(c->warm, p, (size_t)n);
  if (gen(c->warm, p, (size_t)n, &gw, &rw)) return -1;
  floe_session_reset(c->cold);
  if (gen(c->cold, p, (size_t)n, &gc, &rc_)) return -1;
  CHECK(rw.n_reused == want && pred == want, "%s: n_reused %lld, predicted %lld, expected %lld (prompt %lld, history %lld)",
        what, (long long)rw.n_reused, (long long)pred, (long long)want, (long long)n, (long long)c->n_hist);
  CHECK(rc_.n_reused == 0, "%s: cold run reuses nothing", what);
  bool same = gw.n == gc.n && rw.n_gen == rc_.n_gen && rw.finish == rc_.finish && gw.n > 0;
  for (int i = 0; same && i < gw.n; i++)
    same = gw.ids[i] == gc.ids[i] && !memcmp(&gw.lp[i], &gc.lp[i], sizeof(float)) &&
           !memcmp(gw.top_ids[i], gc.top_ids[i], sizeof gw.top_ids[i]) &&
           !memcmp(gw.top_lp[i], gc.top_lp[i], sizeof gw.top_lp[i]);
  CHECK(same, "%s: tokens and logprobs bit-identical to a cold run (%d vs %d tokens)", what, gw.n, gc.n);
  /* history mirror: prompt + generated tokens the session evaluated */
  const int64_t np = floe_session_n_past(c->warm);
  CHECK(np == floe_session_n_past(c->cold) && np >= n && np <= n + gw.n, "%s: n_past %lld", what, (long long)np);
  memcpy(c->hist, p, (size_t)n * sizeof *p);
  for (int64_t i = n; i < np && i - n < gw.n; i++) c->hist[i] = gw.ids[i - n];
  c->n_hist = np;
  /* a probe evaluated on both: every position's logits equal (the whole state matches) */
  if (np + NPROBE <= NCTX && (rnd(2) || !c->hybrid)) {
    int32_t pr[NPROBE];
    for (int i = 0; i < NPROBE; i++) pr[i] = (int32_t)rnd((uint32_t)c->V);
    int a = floe_session_eval(c->warm, pr, NPROBE, c->la, true, err, sizeof err);
    int b = floe_session_eval(c->cold, pr, NPROBE, c->lb, true, err, sizeof err);
    CHECK(a == 0 && b == 0 && !memcmp(c->la, c->lb, (size_t)(NPROBE * c->V) * sizeof(float)),
          "%s: probe logits after the generation bit-identical", what);
    memcpy(c->hist + np, pr, sizeof pr);
    c->n_hist += NPROBE;
  }
  int64_t pos[64];
  const int k = floe_session_checkpoints(c->warm, pos, 64);
  CHECK(k <= c->max_ckpt && (c->hybrid || k == 0), "%s: %d checkpoints (max %d)", what, k, c->max_ckpt);
  for (int i = 0; i < k && i < 64; i++) CHECK(pos[i] > 0 && pos[i] <= c->n_hist, "%s: checkpoint at %lld", what, (long long)pos[i]);
  return rw.n_reused;
}

/* A "conversation": random text with <|im_start|> turn openings. */
static int64_t make_text(ctx *c, int32_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)rnd((uint32_t)c->V);
  for (int64_t i = 0; i + 1 < n; i++)
    if (dst[i] == c->im_start) dst[i] = 1; /* turns only where placed */
  if (n > 8) dst[rnd((uint32_t)(n / 2))] = c->im_start;
  if (n > 4) dst[n - 3 - rnd(2)] = c->im_start;
  return n;
}

static void random_scenarios(ctx *c, int n_cases) {
  int32_t p[NCTX], sys[48], convA[NCTX], convB[NCTX], lastp[NCTX];
  int64_t nA = 0, nB = 0, nlast = 0;
  const int64_t nsys = make_text(c, sys, 40);
  int64_t reused_mid = 0, reused_total = 0;
  for (int it = 0; it < n_cases; it++) {
    char what[96];
    const int kind = (int)rnd(8);
    int64_t n = 0;
    if (c->n_hist + 120 > NCTX - 2 * NPROBE - MAXGEN) {
      floe_session_reset(c->warm);
      c->n_hist = 0;
    }
    switch (kind) {
    case 0: /* fresh conversation with the shared system prompt */
      memcpy(p, sys, sizeof sys[0] * (size_t)nsys);
      n = nsys + make_text(c, p + nsys, 20 + rnd(100));
      snprintf(what, sizeof what, "case %d new conversation", it);
      break;
    case 1: /* the same prompt again (the last one is the history's prefix up to its length) */
      if (c->n_hist < 10) continue;
      n = c->n_hist - rnd(c->n_hist / 2);
      memcpy(p, c->hist, (size_t)n * sizeof *p);
      snprintf(what, sizeof what, "case %d prompt shorter than the history (%lld of %lld)", it, (long long)n,
               (long long)c->n_hist);
      break;
    case 2: /* extension: the whole history plus a new turn */
      memcpy(p, c->hist, (size_t)c->n_hist * sizeof *p);
      n = c->n_hist + make_text(c, p + c->n_hist, 5 + rnd(80));
      snprintf(what, sizeof what, "case %d extension", it);
      break;
    case 3: /* divergence somewhere in the middle */
    case 4: {
      if (c->n_hist < 10) continue;
      const int64_t d = 1 + rnd((uint32_t)c->n_hist - 1);
      memcpy(p, c->hist, (size_t)d * sizeof *p);
      n = d + make_text(c, p + d, 3 + rnd(60));
      if (p[d] == c->hist[d]) p[d] = (p[d] + 1) % (int32_t)c->V;
      snprintf(what, sizeof what, "case %d divergence at %lld of %lld", it, (long long)d, (long long)c->n_hist);
      break;
    }
    case 5: /* divergence right after the system prompt (before most checkpoints) */
      if (c->n_hist < nsys + 2) continue;
      memcpy(p, c->hist, (size_t)(nsys / 2) * sizeof *p);
      n = nsys / 2 + make_text(c, p + nsys / 2, 10 + rnd(30));
      if (p[nsys / 2] == c->hist[nsys / 2]) p[nsys / 2] = (p[nsys / 2] + 1) % (int32_t)c->V;
      snprintf(what, sizeof what, "case %d early divergence", it);
      break;
    case 7: /* the same prompt twice */
      if (nlast == 0) continue;
      n = nlast;
      memcpy(p, lastp, (size_t)n * sizeof *p);
      snprintf(what, sizeof what, "case %d same prompt again", it);
      break;
    case 6: { /* two conversations alternating on the session */
      int32_t *cv = (it & 1) ? convA : convB;
      int64_t *ncv = (it & 1) ? &nA : &nB;
      if (*ncv == 0 || *ncv + 100 > NCTX - 2 * NPROBE - MAXGEN) {
        memcpy(cv, sys, sizeof sys[0] * (size_t)nsys);
        *ncv = nsys + make_text(c, cv + nsys, 20 + rnd(40));
      } else {
        *ncv += make_text(c, cv + *ncv, 5 + rnd(40));
      }
      n = *ncv;
      memcpy(p, cv, (size_t)n * sizeof *p);
      snprintf(what, sizeof what, "case %d alternating conversation %c", it, (it & 1) ? 'A' : 'B');
      break;
    }
    }
    if (n < 1) continue;
    const int64_t r = run_case(c, what, p, n);
    memcpy(lastp, p, (size_t)n * sizeof *p);
    nlast = n;
    if (r < 0) {
      CHECK(0, "%s failed", what);
      return;
    }
    if (kind == 3 || kind == 4) reused_mid += r;
    reused_total += r;
    if (kind == 6) { /* the conversation continues with what the model said */
      int32_t *cv = (it & 1) ? convA : convB;
      int64_t *ncv = (it & 1) ? &nA : &nB;
      const int64_t add = c->n_hist - n < 8 ? c->n_hist - n : 8;
      if (add > 0 && *ncv + add < NCTX) {
        memcpy(cv + *ncv, c->hist + n, (size_t)add * sizeof *cv);
        *ncv += add;
      }
    }
  }
  CHECK(reused_mid > 0 && reused_total > 0, "mid-history divergences reused something (%lld, total %lld)",
        (long long)reused_mid, (long long)reused_total);
}

/* Random text without <|im_start|>. */
static int64_t make_plain(ctx *c, int32_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    dst[i] = (int32_t)rnd((uint32_t)c->V);
    if (dst[i] == c->im_start) dst[i] = 1;
  }
  return n;
}

/* Checkpoints where agent conversations diverge. */
static void placement(ctx *c) {
  int32_t p[NCTX], q[NCTX];
  floe_session_reset(c->warm);
  c->n_hist = 0;
  /* Qwen3: the prompt ends with "<|im_start|>assistant\n"; the next request re-renders the reply
   * without the <think> block the model sampled: divergence exactly at the previous prompt's end */
  int64_t n = make_plain(c, p, 150);
  p[n - 3] = c->im_start;
  run_case(c, "qwen3-style turn 1", p, n);
  memcpy(q, p, (size_t)n * sizeof *p);
  int64_t m = n + make_text(c, q + n, 40);
  if (q[n] == c->hist[n]) q[n] = (q[n] + 1) % (int32_t)c->V;
  int64_t r = run_case(c, "qwen3-style turn 2 (old <think> dropped)", q, m);
  CHECK(r == n, "re-rendered reply after the prompt end: reuses the whole previous prompt (%lld of %lld)",
        (long long)r, (long long)n);
  /* Qwen3.5: the prompt ends with "<|im_start|>assistant\n<think>\n"; the history re-renders the
   * turn without "<think>\n": divergence two tokens before the prompt's end */
  n = make_plain(c, p, 120);
  const int64_t at = n - 4;
  p[at] = c->im_start;
  p[n - 2] = c->think >= 0 ? c->think : 7;
  run_case(c, "qwen35-style turn 1", p, n);
  memcpy(q, p, (size_t)(n - 2) * sizeof *p);
  m = n - 2 + make_text(c, q + n - 2, 30);
  if (q[n - 2] == p[n - 2]) q[n - 2] = (q[n - 2] + 1) % (int32_t)c->V;
  r = run_case(c, "qwen35-style turn 2 (no <think> opening)", q, m);
  CHECK(r == (c->hybrid ? at : n - 2), "divergence inside the assistant opening: reuses up to its <|im_start|> (%lld, expected %lld)",
        (long long)r, (long long)(c->hybrid ? at : n - 2));
  /* interior checkpoints: every checkpoint_every (32 here) tokens of a long prompt; with 6 kept,
   * the oldest interior ones go first */
  n = make_plain(c, p, 300);
  run_case(c, "long prompt", p, n);
  memcpy(q, p, 250 * sizeof *p);
  m = 250 + make_text(c, q + 250, 20);
  if (q[250] == p[250]) q[250] = (q[250] + 1) % (int32_t)c->V;
  r = run_case(c, "divergence at 250 of a long prompt", q, m);
  CHECK(r == (c->hybrid ? 224 : 250), "the interior checkpoint before the divergence is used (%lld)", (long long)r);
  /* the same prompt twice */
  n = make_text(c, p, 80);
  run_case(c, "a prompt", p, n);
  r = run_case(c, "the same prompt again", p, n);
  CHECK(r > 0 && r < n, "the same prompt again reuses all but what must be re-evaluated (%lld of %lld)", (long long)r,
        (long long)n);
}

/* Cancellation during prefill. */
typedef struct stopper { int calls, stop_after; } stopper;
static int should_stop(void *user) {
  stopper *st = user;
  return ++st->calls > st->stop_after;
}
static int tok_stopper(void *user, const floe_token_event *ev) {
  (void)user;
  (void)ev;
  return 0;
}

static void cancellation(const char *path, int arch_hybrid) {
  char err[256];
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = path;
  ep.n_threads = 2;
  floe_engine *e;
  if (floe_engine_open(&ep, &e, err, sizeof err)) {
    CHECK(0, "open %s: %s", path, err);
    return;
  }
  floe_model_info info;
  floe_engine_info(e, &info);
  floe_session_params sp;
  floe_session_params_init(&sp);
  sp.n_ctx = 4096;
  floe_session *s, *cold;
  CHECK(floe_session_new(e, &sp, &s, err, sizeof err) == 0 && floe_session_new(e, &sp, &cold, err, sizeof err) == 0,
        "sessions: %s", err);
  const int64_t N = 3000, D = 1100; /* prompt length, divergence */
  const int64_t STEP = MODEL_MAX_BATCH;
  int32_t *p = malloc((size_t)N * sizeof *p);
  for (int64_t i = 0; i < N; i++) p[i] = (int32_t)rnd((uint32_t)info.n_vocab);
  floe_gen_params gp;
  floe_gen_params_init(&gp);
  gp.max_tokens = 4;
  gp.should_stop = should_stop;
  stopper st = { 0, 0 };
  floe_gen_result r;
  /* a stop before the first step: nothing evaluated, nothing changed */
  double t0 = floe_time_s();
  int rc = floe_generate(s, p, (size_t)N, &gp, tok_stopper, &st, &r, err, sizeof err);
  CHECK(rc == 0 && r.finish == FLOE_FINISH_CANCELLED && r.n_gen == 0 && floe_session_n_past(s) == 0,
        "stop before the first step: rc %d finish %d n_past %lld", rc, r.finish, (long long)floe_session_n_past(s));
  /* stop after 2 steps */
  st = (stopper){ 0, 2 };
  t0 = floe_time_s();
  rc = floe_generate(s, p, (size_t)N, &gp, tok_stopper, &st, &r, err, sizeof err);
  const double t_cancel = floe_time_s() - t0;
  const int64_t done = floe_session_n_past(s);
  CHECK(rc == 0 && r.finish == FLOE_FINISH_CANCELLED && r.n_gen == 0 && st.calls == 3,
        "cancelled after 2 steps: rc %d finish %d n_gen %lld calls %d", rc, r.finish, (long long)r.n_gen, st.calls);
  CHECK(done > 0 && done <= 2 * STEP, "session keeps the %lld tokens evaluated (<= %lld)", (long long)done, (long long)(2 * STEP));
  /* the full prompt on a cold session (timing reference and expected output) */
  gen_out gc, gw;
  floe_gen_params g2 = gp;
  g2.should_stop = NULL;
  g2.logprobs = true;
  g2.n_top_logprobs = NTOP;
  memset(&gc, 0, sizeof gc);
  floe_gen_result rc_;
  t0 = floe_time_s();
  rc = floe_generate(cold, p, (size_t)N, &g2, on_tok, &gc, &rc_, err, sizeof err);
  const double t_full = floe_time_s() - t0;
  CHECK(rc == 0 && rc_.finish != FLOE_FINISH_CANCELLED, "cold run: %s", rc ? err : "ok");
  CHECK(t_cancel < t_full * 0.6, "cancelled prefill returns promptly (%.3f s vs %.3f s for the whole prompt)", t_cancel,
        t_full);
  /* the retry continues from what was evaluated and gives the cold result */
  memset(&gw, 0, sizeof gw);
  rc = floe_generate(s, p, (size_t)N, &g2, on_tok, &gw, &r, err, sizeof err);
  bool same = rc == 0 && gw.n == gc.n && gw.n > 0;
  for (int i = 0; same && i < gw.n; i++)
    same = gw.ids[i] == gc.ids[i] && !memcmp(gw.top_lp[i], gc.top_lp[i], sizeof gw.top_lp[i]);
  CHECK(rc == 0 && r.n_reused == done, "retry reuses the %lld cancelled-prefill tokens (n_reused %lld)", (long long)done,
        (long long)r.n_reused);
  CHECK(same, "retry after a cancelled prefill == cold run (bit-identical logprobs)");
  /* a cancelled prefill on a session that then gets a divergent prompt */
  st = (stopper){ 0, 1 };
  int32_t *q = malloc((size_t)N * sizeof *q);
  memcpy(q, p, (size_t)N * sizeof *q);
  q[D] = (q[D] + 1) % (int32_t)info.n_vocab;
  rc = floe_generate(s, q, (size_t)N, &gp, tok_stopper, &st, &r, err, sizeof err);
  CHECK(rc == 0 && r.finish == FLOE_FINISH_CANCELLED && floe_session_n_past(s) <= r.n_reused + STEP &&
        floe_session_n_past(s) < N, "cancel a divergent prompt (n_reused %lld, n_past %lld)", (long long)r.n_reused,
        (long long)floe_session_n_past(s));
  CHECK(arch_hybrid ? r.n_reused >= 1024 && r.n_reused <= D : r.n_reused == D,
        "resumes at the divergence (attention) or at a checkpoint before it (%lld)", (long long)r.n_reused);
  memset(&gw, 0, sizeof gw);
  memset(&gc, 0, sizeof gc);
  rc = floe_generate(s, q, (size_t)N, &g2, on_tok, &gw, &r, err, sizeof err);
  floe_session_reset(cold);
  int rc2 = floe_generate(cold, q, (size_t)N, &g2, on_tok, &gc, &rc_, err, sizeof err);
  same = rc == 0 && rc2 == 0 && gw.n == gc.n && gw.n > 0;
  for (int i = 0; same && i < gw.n; i++)
    same = gw.ids[i] == gc.ids[i] && !memcmp(gw.top_lp[i], gc.top_lp[i], sizeof gw.top_lp[i]);
  CHECK(same, "divergent prompt after a cancelled prefill == cold run");
  free(p);
  free(q);
  floe_session_free(s);
  floe_session_free(cold);
  floe_engine_close(e);
}

static void model_tests(const char *path, const char *name, bool hybrid) {
  char err[256];
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = path;
  ep.n_threads = 2;
  ctx c;
  memset(&c, 0, sizeof c);
  if (floe_engine_open(&ep, &c.e, err, sizeof err)) {
    CHECK(0, "open %s: %s", path, err);
    return;
  }
  floe_model_info info;
  floe_engine_info(c.e, &info);
  c.V = info.n_vocab;
  c.hybrid = hybrid;
  c.im_start = floe_token_find(c.e, "<|im_start|>");
  c.think = floe_token_find(c.e, "<think>");
  CHECK(c.im_start >= 0, "%s: <|im_start|> in the vocabulary", name);
  floe_session_params sp;
  floe_session_params_init(&sp);
  sp.n_ctx = NCTX;
  sp.n_checkpoints = c.max_ckpt = 6;
  sp.checkpoint_every = 32;
  CHECK(floe_session_new(c.e, &sp, &c.warm, err, sizeof err) == 0, "session: %s", err);
  CHECK(floe_session_new(c.e, &sp, &c.cold, err, sizeof err) == 0, "session: %s", err);
  c.la = malloc((size_t)(NPROBE * c.V) * sizeof(float));
  c.lb = malloc((size_t)(NPROBE * c.V) * sizeof(float));

  SECTION("%s: checkpoint placement", name);
  placement(&c);
  SECTION("%s: random scenarios", name);
  floe_session_reset(c.warm);
  c.n_hist = 0;
  random_scenarios(&c, 60);

  SECTION("%s: no checkpoints", name);
  floe_session_free(c.warm);
  sp.n_checkpoints = -1;
  c.max_ckpt = 0;
  CHECK(floe_session_new(c.e, &sp, &c.warm, err, sizeof err) == 0, "session: %s", err);
  c.n_hist = 0;
  int32_t p[200];
  const int64_t n = make_text(&c, p, 100);
  run_case(&c, "no checkpoints: first", p, n);
  p[60] = (c.hist[60] + 1) % (int32_t)c.V;
  const int64_t r = run_case(&c, "no checkpoints: divergence at 60", p, n);
  CHECK(r == (hybrid ? 0 : 60), "without checkpoints a hybrid starts over, attention rewinds (%lld)", (long long)r);
  free(c.la);
  free(c.lb);
  floe_session_free(c.warm);
  floe_session_free(c.cold);
  floe_engine_close(c.e);
}

int main(void) {
  static const struct { const char *preset, *file; bool hybrid; } models[] = {
    { "tiny-qwen3moe", "prefix_qwen3moe.gguf", false },
    { "tiny-qwen3next", "prefix_qwen3next.gguf", true },
    { "tiny-qwen35moe", "prefix_qwen35moe.gguf", true },
  };
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    const char *path = test_tmp(models[i].file);
    char args[256];
    snprintf(args, sizeof args, "--preset %s --type q8_0 --layers 4", models[i].preset);
    SECTION("synth %s", models[i].preset);
    if (synth(path, args) != 0) {
      CHECK(0, "synth %s", path);
      continue;
    }
    model_tests(path, models[i].preset, models[i].hybrid);
    SECTION("%s: cancellation during prefill", models[i].preset);
    cancellation(path, models[i].hybrid);
    remove(path);
  }
  return TEST_DONE();
}
