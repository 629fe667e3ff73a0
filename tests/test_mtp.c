/* Speculative decoding with the MTP head (src/model/mtp.c, model_verify, src/engine/engine_mtp.c)
 * on the default model (models/default.gguf, which has an MTP block):
 *   - the MTP block binds from the GGUF;
 *   - verify rows: model_verify of n rows gives, row for row, the logits of n single-token evals;
 *   - rollback: after model_verify + model_verify_accept(a), the session's KV rows, recurrent
 *     state and conv windows equal, bit for bit, those of a fresh session fed the accepted tokens
 *     one at a time (for every a, with 1 and 2 threads);
 *   - the MTP forward against a scalar reference written here from the math (mtp.c's header),
 *     on F32 activations (exact session);
 *   - greedy generation through floe_generate: ids identical to --mtp 0 for 10+ prompts x 256
 *     tokens, k = 1..4 and auto, 1 and 2 threads, and under two memory budgets (a cache that
 *     holds most experts, and one of ~30 slots for 288 experts), where the MTP block's experts
 *     must go through the expert cache (its layer's lookups are counted). */
#include <math.h>

#include "engine/engine_internal.h"
#include "floe.h"
#include "model/model.h"
#include "quant/quant.h"
#include "test.h"

static char model_path[4096];

static void fill_prompt(int32_t *t, int n, uint64_t seed, int64_t V) {
  floe_rng r;
  floe_rng_seed(&r, seed);
  for (int i = 0; i < n; i++) t[i] = (int32_t)(floe_rng_u64(&r) % (uint64_t)(V - 16));
}

/* Every byte of the state the first n_past positions determine: attention rows < n_past of each
 * attention layer (all heads), S and conv of each recurrent layer. */
static bool same_state(const model_session *a, const model_session *b, int64_t n_past, char *what, size_t wl) {
  const kv_state *x = &a->kv, *y = &b->kv;
  if (x->n_past != y->n_past || x->n_past != n_past) {
    snprintf(what, wl, "n_past %lld vs %lld", (long long)x->n_past, (long long)y->n_past);
    return false;
  }
  const size_t esz = x->kv_type == KV_F32 ? 4 : 2, row = (size_t)x->head_dim * esz;
  for (int64_t l = 0; l < x->n_layer; l++) {
    if (x->rec[l]) {
      if (memcmp(x->ssm[l], y->ssm[l], (size_t)(x->ssm_n * x->ssm_dk * x->ssm_dv) * 4)) {
        snprintf(what, wl, "layer %lld: recurrent state", (long long)l);
        return false;
      }
      if (memcmp(x->conv[l], y->conv[l], (size_t)((x->conv_k - 1) * x->conv_c) * 4)) {
        snprintf(what, wl, "layer %lld: conv window", (long long)l);
        return false;
      }
      continue;
    }
    for (int v = 0; v < 2; v++)
      for (int64_t kh = 0; kh < x->n_head_kv; kh++)
        if (memcmp(kv_head_rows(x, l, v, kh), kv_head_rows(y, l, v, kh), (size_t)n_past * row)) {
          snprintf(what, wl, "layer %lld: %s rows of head %lld", (long long)l, v ? "V" : "K", (long long)kh);
          return false;
        }
  }
  return true;
}

static void test_verify_and_rollback(model *m, int threads) {
  SECTION("verify rows and rollback, %d thread(s)", threads);
  char err[256];
  const int64_t V = m->hp.n_vocab, NP = 37, NV = 5;
  int32_t prompt[64], extra[8];
  fill_prompt(prompt, (int)NP, 11 + (uint64_t)threads, V);
  fill_prompt(extra, (int)NV, 99, V);
  float *lv = malloc((size_t)(NV * V) * 4), *l1 = malloc((size_t)V * 4);
  model_session *a = NULL, *b = NULL;
  int rc = model_session_new(m, 256, KV_BF16, threads, &a, err, sizeof err);
  if (!rc) rc = model_session_new(m, 256, KV_BF16, threads, &b, err, sizeof err);
  CHECK(rc == 0, "sessions: %s", rc ? err : "ok");
  if (rc) goto out;
  for (int64_t acc = 0; acc <= NV; acc++) {
    model_session_reset(a);
    model_session_reset(b);
    /* a: prompt, then a verify of NV rows, of which acc are kept; then one more plain token */
    rc = model_eval(a, prompt, NP, NULL, false, err, sizeof err);
    if (!rc) rc = model_verify(a, extra, NV, lv, NULL, err, sizeof err);
    CHECK(rc == 0, "verify: %s", rc ? err : "ok");
    if (rc) break;
    CHECK(model_session_pos(a) == NP, "verify leaves n_past at %lld (got %lld)", (long long)NP,
          (long long)model_session_pos(a));
    model_verify_accept(a, acc);
    /* b: the same tokens one at a time; each row's logits must equal the verify row's */
    rc = model_eval(b, prompt, NP, NULL, false, err, sizeof err);
    bool rows_ok = true;
    for (int64_t t = 0; t < acc && !rc; t++) {
      rc = model_eval(b, extra + t, 1, l1, false, err, sizeof err);
      rows_ok &= memcmp(l1, lv + t * V, (size_t)V * 4) == 0;
    }
    CHECK(rc == 0 && rows_ok, "a=%lld: verify rows bit-identical to single-token decode", (long long)acc);
    char what[128] = "";
    CHECK(same_state(a, b, NP + acc, what, sizeof what), "a=%lld: state after rollback equals a fresh run (%s)",
          (long long)acc, what);
    /* and the sessions keep agreeing afterwards (the swapped buffers are live state now) */
    float *l2 = malloc((size_t)V * 4);
    rc = model_eval(a, extra + NV - 1, 1, l1, false, err, sizeof err);
    if (!rc) rc = model_eval(b, extra + NV - 1, 1, l2, false, err, sizeof err);
    CHECK(rc == 0 && !memcmp(l1, l2, (size_t)V * 4), "a=%lld: the next token's logits agree", (long long)acc);
    free(l2);
  }
out:
  model_session_free(a);
  model_session_free(b);
  free(lv);
  free(l1);
}

/* The MTP forward written out directly (F32 weights dequantized row by row, float math, double
 * accumulation where convenient): fc, the gated attention over the block's own rows, the MoE with
 * the shared expert, the final norm and the lm_head. Compared with model_mtp_eval in an exact
 * session (float activations) to a relative tolerance: the kernels' summation order differs. */
static void rmsnorm_ref(const float *x, const float *w, int64_t n, float eps, float *y) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const float r = (float)(1.0 / sqrt(ss / (double)n + eps));
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}
static void matvec_ref(const floe_mat *W, const float *x, float *y) {
  float *row = malloc((size_t)W->cols * 4);
  for (int64_t r = 0; r < W->rows; r++) {
    quant_dequant_row(W->type, (const uint8_t *)W->data + (size_t)r * W->row_bytes, row, W->cols);
    double acc = 0;
    for (int64_t c = 0; c < W->cols; c++) acc += (double)row[c] * x[c];
    y[r] = (float)acc;
  }
  free(row);
}
static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

static void mtp_ref(const model *m, const int32_t *tok, const float *h, int64_t n, float *logits_last) {
  const floe_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd, nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim, V = hp->n_vocab;
  const model_layer *L = &m->layers[hp->n_layer];
  const float eps = hp->rms_eps;
  float *x = calloc((size_t)(n * E), 4), *cat = malloc((size_t)(2 * E) * 4), *e = malloc((size_t)E * 4);
  float *hn = malloc((size_t)E * 4), *q = malloc((size_t)(n * nh * hd * 2) * 4);
  float *k = malloc((size_t)(n * nkv * hd) * 4), *v = malloc((size_t)(n * nkv * hd) * 4);
  float *att = malloc((size_t)(nh * hd) * 4), *o = malloc((size_t)E * 4);
  for (int64_t t = 0; t < n; t++) {
    model_embed_row(m, tok[t], e);
    rmsnorm_ref(e, m->mtp.enorm, E, eps, cat);
    rmsnorm_ref(h + t * E, m->mtp.hnorm, E, eps, cat + E);
    matvec_ref(&m->mtp.fc, cat, x + t * E);
  }
  /* attention: q/k norm, partial NeoX RoPE at position t, causal over the block's rows */
  for (int64_t t = 0; t < n; t++) {
    rmsnorm_ref(x + t * E, L->attn_norm, E, eps, hn);
    matvec_ref(&L->wq, hn, q + t * nh * hd * 2);
    matvec_ref(&L->wk, hn, k + t * nkv * hd);
    matvec_ref(&L->wv, hn, v + t * nkv * hd);
    for (int64_t hh = 0; hh < nh + nkv; hh++) {
      float *p = hh < nh ? q + t * nh * hd * 2 + hh * hd * 2 : k + t * nkv * hd + (hh - nh) * hd;
      rmsnorm_ref(p, hh < nh ? L->q_norm : L->k_norm, hd, eps, p);
      const int64_t half = hp->n_rot / 2;
      for (int64_t j = 0; j < half; j++) {
        const double f = pow((double)hp->rope_theta, -2.0 * (double)j / (double)hp->n_rot) * (double)t;
        const float c = (float)cos(f), s = (float)sin(f), a = p[j], b = p[j + half];
        p[j] = a * c - b * s;
        p[j + half] = b * c + a * s;
      }
    }
  }
  for (int64_t t = 0; t < n; t++) {
    for (int64_t hh = 0; hh < nh; hh++) {
      const int64_t kh = hh / (nh / nkv);
      const float *qh = q + t * nh * hd * 2 + hh * hd * 2, *gate = qh + hd;
      double sc[64], mx = -1e300, sum = 0;
      for (int64_t p = 0; p <= t; p++) {
        double d = 0;
        for (int64_t i = 0; i < hd; i++) d += (double)qh[i] * floe_bf16_to_f32(floe_f32_to_bf16(k[p * nkv * hd + kh * hd + i]));
        sc[p] = d / sqrt((double)hd);
        if (sc[p] > mx) mx = sc[p];
      }
      for (int64_t p = 0; p <= t; p++) sum += sc[p] = exp(sc[p] - mx);
      for (int64_t i = 0; i < hd; i++) {
        double acc = 0;
        for (int64_t p = 0; p <= t; p++) acc += sc[p] / sum * floe_bf16_to_f32(floe_f32_to_bf16(v[p * nkv * hd + kh * hd + i]));
        att[hh * hd + i] = (float)acc * sigm(gate[i]);
      }
    }
    matvec_ref(&L->wo, att, o);
    for (int64_t i = 0; i < E; i++) x[t * E + i] += o[i];
  }
  /* MoE of the last row only (the logits compared are the last row's) */
  const int64_t t = n - 1, NE = hp->n_expert, K = hp->n_expert_used, I = hp->n_ff_exp, S = hp->n_ff_shexp;
  float *r = malloc((size_t)NE * 4), *g = malloc((size_t)(I > S ? I : S) * 4), *u = malloc((size_t)(I > S ? I : S) * 4);
  float *y = calloc((size_t)E, 4), *d = malloc((size_t)E * 4);
  rmsnorm_ref(x + t * E, L->ffn_norm, E, eps, hn);
  matvec_ref(&L->router, hn, r);
  double mx = -1e300, sum = 0;
  for (int64_t i = 0; i < NE; i++) mx = r[i] > mx ? r[i] : mx;
  double pr[256];
  for (int64_t i = 0; i < NE; i++) sum += pr[i] = exp(r[i] - mx);
  int sel[16];
  double wsum = 0;
  for (int64_t j = 0; j < K; j++) {
    int best = -1;
    for (int64_t i = 0; i < NE; i++) {
      bool taken = false;
      for (int64_t u2 = 0; u2 < j; u2++) taken |= sel[u2] == i;
      if (!taken && (best < 0 || pr[i] > pr[best])) best = (int)i;
    }
    sel[j] = best;
    wsum += pr[best] / sum;
  }
  for (int64_t j = 0; j < K; j++) {
    const int ex = sel[j];
    matvec_ref(&L->exp_gate[ex], hn, g);
    matvec_ref(&L->exp_up[ex], hn, u);
    for (int64_t i = 0; i < I; i++) g[i] = g[i] * sigm(g[i]) * u[i];
    matvec_ref(&L->exp_down[ex], g, d);
    for (int64_t i = 0; i < E; i++) y[i] += (float)(pr[ex] / sum / wsum) * d[i];
  }
  matvec_ref(&L->sh_gate, hn, g);
  matvec_ref(&L->sh_up, hn, u);
  for (int64_t i = 0; i < S; i++) g[i] = g[i] * sigm(g[i]) * u[i];
  matvec_ref(&L->sh_down, g, d);
  float sg;
  matvec_ref(&L->sh_gate_inp, hn, &sg);
  for (int64_t i = 0; i < E; i++) x[t * E + i] += y[i] + sigm(sg) * d[i];
  rmsnorm_ref(x + t * E, m->mtp.norm, E, eps, hn);
  matvec_ref(&m->output, hn, logits_last);
  (void)V;
  free(x), free(cat), free(e), free(hn), free(q), free(k), free(v), free(att), free(o);
  free(r), free(g), free(u), free(y), free(d);
}

static void test_mtp_reference(model *m) {
  SECTION("MTP forward against the scalar reference (exact session, BF16 KV)");
  char err[256];
  const int64_t V = m->hp.n_vocab, E = m->hp.n_embd, NP = 24;
  int32_t prompt[64];
  fill_prompt(prompt, (int)NP, 5, V);
  model_session *s = NULL;
  int rc = model_session_new(m, 128, KV_BF16, 1, &s, err, sizeof err);
  CHECK(rc == 0, "session: %s", rc ? err : "ok");
  if (rc) return;
  model_session_set_exact(s, true);
  float *hid = malloc((size_t)(NP * E) * 4), *lg = malloc((size_t)V * 4), *ref = malloc((size_t)V * 4);
  rc = model_eval_h(s, prompt, NP, NULL, false, hid, err, sizeof err);
  model_final_norm(m, hid, NP, hid);
  /* rows t = 0..NP-2: (token t+1, h_t) */
  if (!rc) rc = model_mtp_eval(s, prompt + 1, hid, NP - 1, 0, NP - 2, lg, NULL, err, sizeof err);
  CHECK(rc == 0, "model_mtp_eval: %s", rc ? err : "ok");
  if (!rc) {
    mtp_ref(m, prompt + 1, hid, NP - 1, ref);
    double md = 0, mr = 0;
    for (int64_t i = 0; i < V; i++) {
      md = fmax(md, fabs((double)lg[i] - ref[i]));
      mr = fmax(mr, fabs((double)ref[i]));
    }
    int32_t a1 = 0, a2 = 0;
    for (int64_t i = 1; i < V; i++) {
      if (lg[i] > lg[a1]) a1 = (int32_t)i;
      if (ref[i] > ref[a2]) a2 = (int32_t)i;
    }
    printf("   max |logit - ref| %.3g (max |ref| %.3g), argmax %d vs %d\n", md, mr, a1, a2);
    CHECK(md <= 2e-3 * (mr > 1 ? mr : 1), "MTP logits match the reference (max diff %.3g)", md);
    CHECK(a1 == a2, "MTP argmax %d == reference %d", a1, a2);
  }
  free(hid), free(lg), free(ref);
  model_session_free(s);
}

/* ---- the automatic choice of k (spec_best_k) on synthetic costs and acceptance rates ---- */
static void test_best_k(void) {
  SECTION("automatic k: spec_best_k on synthetic step costs and acceptance rates");
  const double a9[4] = { 0.9, 0.9, 0.9, 0.9 }, a91[4] = { 0.9, 0.1, 0.1, 0.1 };
  const double cheap[5] = { 1, 1.2, 1.4, 1.6, 1.8 }, dear[5] = { 1, 2, 3, 4, 5 }, mid[5] = { 1, 1.3, 1.6, 1.9, 2.2 };
  const double unknown[5] = { 0, 2, 0, 0, 0 };
  CHECK(spec_best_k(cheap, a9, 4) == 4, "verify rows almost free, acceptance 0.9: k = 4 (got %d)", spec_best_k(cheap, a9, 4));
  CHECK(spec_best_k(dear, a9, 4) == 0, "each row costs a whole step: k = 0, drafting off (got %d)", spec_best_k(dear, a9, 4));
  CHECK(spec_best_k(mid, a91, 4) == 1, "only the first draft is accepted: k = 1 (got %d)", spec_best_k(mid, a91, 4));
  CHECK(spec_best_k(cheap, a9, 2) == 2, "kmax 2 caps the choice (got %d)", spec_best_k(cheap, a9, 2));
  CHECK(spec_best_k(unknown, a9, 4) == 1, "an unmeasured k is never chosen (got %d)", spec_best_k(unknown, a9, 4));
  /* random inputs against the definition: the k maximizing (1 + sum_i prod_{j<=i} a_j) / cost_k */
  floe_rng r;
  floe_rng_seed(&r, 3);
  int bad = 0;
  for (int it = 0; it < 2000; it++) {
    double c[5], a[4];
    for (int k = 0; k < 5; k++) c[k] = 0.5 + 4.0 * floe_rng_uniform(&r);
    for (int j = 0; j < 4; j++) a[j] = floe_rng_uniform(&r);
    int want = 0;
    double best = 1.0 / c[0];
    for (int k = 1; k < 5; k++) {
      double e = 1;
      for (int i = 0; i < k; i++) {
        double p = 1;
        for (int j = 0; j <= i; j++) p *= a[j];
        e += p;
      }
      if (e / c[k] > best) best = e / c[k], want = k;
    }
    bad += spec_best_k(c, a, 4) != want;
  }
  CHECK(bad == 0, "2000 random cost / acceptance sets: the best expected tokens per second (%d differ)", bad);
}

/* ---- greedy generation: MTP on equals MTP off, token for token ---- */
typedef struct ids_out { int32_t *v; int n, cap; } ids_out;
static int on_tok(void *user, const floe_token_event *ev) {
  ids_out *o = user;
  if (ev->id >= 0 && o->n < o->cap) o->v[o->n++] = ev->id;
  return 0;
}

/* modes: the --mtp values compared with 0 (-1: automatic). fresh_auto: only -1, so the automatic
 * choice starts with nothing measured. */
static void test_greedy_modes(int threads, uint64_t budget, int n_prompts, int n_gen, const int *modes, int n_modes) {
  const bool fresh_auto = n_modes == 1 && modes[0] < 0;
  SECTION("greedy ids with MTP == without, %d prompts x %d tokens, %d thread(s)%s%s", n_prompts, n_gen, threads,
          budget ? ", memory budget" : "", fresh_auto ? ", automatic k only" : "");
  char err[512];
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = model_path;
  ep.n_threads = threads;
  ep.mem_budget = budget;
  floe_engine *e = NULL;
  int rc = floe_engine_open(&ep, &e, err, sizeof err);
  CHECK(rc == 0, "engine: %s", rc ? err : "ok");
  if (rc) return;
  static const char *const texts[] = {
    "import os\ndef main():\n    ", "class Node:\n    def __init__(self, value):\n", "def fib(n):\n    \"\"\"",
    "import numpy as np\n\n\ndef normalize(x):\n", "for i in range(10):\n    print(", "# Copyright\n\"\"\"Utilities for",
    "def parse_args():\n    parser = argparse.ArgumentParser(", "    return self._cache[key]\n\n    def ",
    "try:\n    import json\nexcept ImportError:\n", "from typing import List, Optional\n\n\nclass Config:\n",
    "if __name__ == '__main__':\n", "    @property\n    def name(self):\n        return",
  };
  floe_session *s = NULL;
  rc = floe_session_new(e, NULL, &s, err, sizeof err);
  CHECK(rc == 0, "session: %s", rc ? err : "ok");
  int32_t *base = malloc((size_t)n_gen * 4), *got = malloc((size_t)n_gen * 4);
  int64_t steps = 0, toks = 0;
  uint64_t mtp_lookups = 0, mtp_misses = 0;
  int64_t auto_k[5] = { 0 }; /* steps per k of the automatic mode */
  floe_model_info info;
  floe_engine_info(e, &info);
  const int64_t n_layer = info.n_layer;
  for (int pi = 0; pi < n_prompts && !rc; pi++) {
    int32_t *ids = NULL;
    size_t n = 0;
    rc = floe_tokenize(e, texts[pi % 12], strlen(texts[pi % 12]), false, &ids, &n, err, sizeof err);
    if (rc) break;
    floe_gen_params gp;
    floe_gen_params_init(&gp);
    gp.max_tokens = n_gen;
    gp.mtp = 0;
    ids_out b = { base, 0, n_gen };
    floe_session_reset(s);
    rc = floe_generate(s, ids, n, &gp, on_tok, &b, NULL, err, sizeof err);
    for (int mi = 0; mi < n_modes && !rc; mi++) {
      gp.mtp = modes[mi];
      ids_out g = { got, 0, n_gen };
      floe_session_reset(s);
      floe_session_stats_reset(s);
      rc = floe_generate(s, ids, n, &gp, on_tok, &g, NULL, err, sizeof err);
      int first = -1;
      for (int i = 0; i < b.n && first < 0; i++)
        if (i >= g.n || g.v[i] != b.v[i]) first = i;
      CHECK(rc == 0 && g.n == b.n && first < 0, "prompt %d, mtp %d: %d ids identical to mtp 0 (%d ids, first diff at %d)%s%s",
            pi, modes[mi], b.n, g.n, first, rc ? ": " : "", rc ? err : "");
      floe_session_stats st;
      floe_session_stats_get(s, &st);
      steps += st.mtp_steps;
      toks += st.mtp_tokens;
      if (modes[mi] < 0)
        for (int k = 0; k < 5; k++) auto_k[k] += st.mtp_k_steps[k];
      uint64_t h = 0, mi = 0;
      floe_engine_layer_stats(e, n_layer, &h, &mi); /* the MTP block's experts */
      mtp_lookups += h + mi;
      mtp_misses += mi;
    }
    free(ids);
  }
  CHECK(rc == 0, "generation: %s", rc ? err : "ok");
  if (steps) printf("   %lld speculative steps, %.2f tokens per step\n", (long long)steps, (double)toks / (double)steps);
  CHECK(steps > 0, "speculative steps were taken (%lld)", (long long)steps);
  printf("   automatic k: steps with k = 0..4: %lld %lld %lld %lld %lld\n", (long long)auto_k[0], (long long)auto_k[1],
         (long long)auto_k[2], (long long)auto_k[3], (long long)auto_k[4]);
  if (fresh_auto) { /* nothing measured before: the automatic choice tries k = 0 and 1, and k >= 2 only after k - 1
                       * (round robin; a k whose k - 1 lost clearly is left out), then picks */
    bool explored = auto_k[0] > 0 && auto_k[1] > 0;
    for (int k = 2; k < 5; k++) explored &= auto_k[k] == 0 || auto_k[k - 1] > 0;
    CHECK(explored, "the automatic mode measured k = 0 and 1, and each k >= 2 only after k - 1");
  }
  if (budget) { /* the MTP block's experts go through the expert cache like the trunk's */
    printf("   cache: %lld slots; MTP block: %llu expert lookups, %llu misses\n", (long long)info.cache_slots,
           (unsigned long long)mtp_lookups, (unsigned long long)mtp_misses);
    CHECK(mtp_lookups > 0, "the MTP block's experts are streamed (%llu lookups in its layer)",
          (unsigned long long)mtp_lookups);
  }
  free(base), free(got);
  floe_session_free(s);
  floe_engine_close(e);
}

/* ---- the automatic mode end to end, on pinned step costs (deterministic) ----
 * dear: a step with k drafts costs 1 + k plain steps, drafting never pays: after exploring, the
 * choice settles on 0 and switches drafting off (plain steps that skip the MTP); cheap: drafts
 * almost free, the choice settles on 4. Both: ids identical to mtp 0. */
static void test_auto_pinned(void) {
  SECTION("automatic k on pinned step costs: drafting off when it does not pay, k = 4 when drafts are free");
  char err[512];
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = model_path;
  ep.n_threads = 2;
  floe_engine *e = NULL;
  int rc = floe_engine_open(&ep, &e, err, sizeof err);
  CHECK(rc == 0, "engine: %s", rc ? err : "ok");
  if (rc) return;
  static const char text[] = "import os\nimport sys\n\n\ndef main(argv):\n    ";
  int32_t *ids = NULL;
  size_t n = 0;
  rc = floe_tokenize(e, text, sizeof text - 1, false, &ids, &n, err, sizeof err);
  const int ng = 400;
  int32_t *base = malloc(ng * 4), *got = malloc(ng * 4);
  floe_session *s = NULL;
  if (!rc) rc = floe_session_new(e, NULL, &s, err, sizeof err);
  floe_gen_params gp;
  floe_gen_params_init(&gp);
  gp.max_tokens = ng;
  gp.mtp = 0;
  ids_out b = { base, 0, ng };
  if (!rc) rc = floe_generate(s, ids, n, &gp, on_tok, &b, NULL, err, sizeof err);
  static const double dear[5] = { 1e-3, 2e-3, 3e-3, 4e-3, 5e-3 }, cheap[5] = { 1e-3, 1.01e-3, 1.02e-3, 1.03e-3, 1.04e-3 };
  /* one draft costs two and a half plain steps: it loses clearly (below SPEC_PRUNE of the plain rate
   * whatever the acceptance), so k >= 2 is never tried and drafting goes off after 4 choices */
  static const double lossy[5] = { 1e-3, 2.5e-3, 4e-3, 5.5e-3, 7e-3 };
  for (int c = 0; c < 3 && !rc; c++) {
    floe_session_free(s); /* a fresh session: nothing measured yet */
    s = NULL;
    rc = floe_session_new(e, NULL, &s, err, sizeof err);
    if (rc) break;
    spec_test_pin_costs(c == 1 ? cheap : c == 2 ? lossy : dear);
    gp.mtp = -1;
    ids_out g = { got, 0, ng };
    rc = floe_generate(s, ids, n, &gp, on_tok, &g, NULL, err, sizeof err);
    spec_test_pin_costs(NULL);
    int first = -1;
    for (int i = 0; i < b.n && first < 0; i++)
      if (i >= g.n || g.v[i] != b.v[i]) first = i;
    const char *nm = c == 1 ? "cheap" : c == 2 ? "lossy" : "dear";
    CHECK(rc == 0 && g.n == b.n && first < 0, "%s: %d ids identical to mtp 0 (first diff at %d)", nm, b.n, first);
    floe_session_stats st;
    floe_session_stats_get(s, &st);
    printf("   %s drafts: steps with k = 0..4: %lld %lld %lld %lld %lld\n", nm,
           (long long)st.mtp_k_steps[0], (long long)st.mtp_k_steps[1], (long long)st.mtp_k_steps[2],
           (long long)st.mtp_k_steps[3], (long long)st.mtp_k_steps[4]);
    if (c == 0)
      CHECK(st.mtp_k_steps[0] > 300 && st.mtp_steps < 40,
            "dear: drafting switched off (%lld plain steps, %lld drafting steps: the exploration and a probe)",
            (long long)st.mtp_k_steps[0], (long long)st.mtp_steps);
    else if (c == 2)
      CHECK(st.mtp_k_steps[2] + st.mtp_k_steps[3] + st.mtp_k_steps[4] == 0 && st.mtp_k_steps[1] <= 6 &&
                st.mtp_k_steps[0] > 380,
            "lossy: only k = 1 tried (%lld steps), never k >= 2 (%lld), then plain steps (%lld)",
            (long long)st.mtp_k_steps[1], (long long)(st.mtp_k_steps[2] + st.mtp_k_steps[3] + st.mtp_k_steps[4]),
            (long long)st.mtp_k_steps[0]);
    else
      CHECK(st.mtp_k_steps[4] > st.mtp_k_steps[0] + st.mtp_k_steps[1] + st.mtp_k_steps[2] + st.mtp_k_steps[3],
            "cheap: k = 4 chosen for most steps (%lld of %lld)", (long long)st.mtp_k_steps[4],
            (long long)(st.mtp_k_steps[0] + st.mtp_k_steps[1] + st.mtp_k_steps[2] + st.mtp_k_steps[3] + st.mtp_k_steps[4]));
  }
  CHECK(rc == 0, "generation: %s", rc ? err : "ok");
  free(ids), free(base), free(got);
  floe_session_free(s);
  floe_engine_close(e);
}

static void test_greedy(int threads, uint64_t budget, int n_prompts, int n_gen) {
  static const int modes[] = { 1, 2, 3, 4, -1 };
  test_greedy_modes(threads, budget, n_prompts, n_gen, modes, 5);
}

int main(int argc, char **argv) {
  snprintf(model_path, sizeof model_path, "%s", test_fixture("../../models/default.gguf"));
  const bool quick = argc > 1 && !strcmp(argv[1], "--quick");
  char err[256];
  model *m = NULL;
  SECTION("models/default.gguf: the MTP block");
  int rc = model_load(model_path, &m, err, sizeof err);
  CHECK(rc == 0, "load: %s", rc ? err : "ok");
  if (rc) return TEST_DONE();
  CHECK(model_has_mtp(m) && m->hp.n_mtp == 1, "MTP bound (n_mtp %lld)", (long long)m->hp.n_mtp);
  test_verify_and_rollback(m, 1);
  test_verify_and_rollback(m, 2);
  test_mtp_reference(m);
  model_free(m);
  test_best_k();
  test_auto_pinned();
  const int np = quick ? 2 : 10, ng = quick ? 64 : 256;
  test_greedy(1, 0, np, ng);
  test_greedy(2, 0, np, ng);
  test_greedy(2, 64ull << 20, quick ? 1 : 3, ng);
  test_greedy(1, 58ull << 20, 1, ng); /* ~30 slots for 9 x 32 experts: evictions every step */
  static const int auto_only[] = { -1 };
  test_greedy_modes(2, 0, quick ? 2 : 3, ng, auto_only, 1);
  test_greedy_modes(2, 58ull << 20, 1, ng, auto_only, 1);
  return TEST_DONE();
}
