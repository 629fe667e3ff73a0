/* model_eval_multi (several sessions in one forward pass) against model_eval of each session
 * alone, on the default model (models/default.gguf: GatedDeltaNet + gated attention + MoE with a
 * shared expert): every logit bit-identical, for
 *   - prompts of awkward lengths together (two multi-row segments with logits: one is evaluated
 *     on its own, the rest share the pass), including a segment without logits;
 *   - decode steps of 4 sessions, with sessions joining and leaving between steps and a prompt
 *     chunk in the same pass as the decoding rows;
 *   - quantized activations (the default) and the exact float path;
 *   - the mixers' projections batched (attention_multi, gdn_multi) or run per segment;
 *   - the experts of a few rows in one pool run (layers.c xd_worker: the decode steps) and of
 *     many on the general path (the 67-row step);
 *   - a backend without multi_begin (the generic fallback: one session after another);
 * and the sessions sharing one thread pool (model_session_share_pool). Then the same on a Q4_K
 * model made by `floe synth` (tiny-qwen35moe, n_embd 1280: rows of 5 superblocks), whose
 * decode rows of several sessions go through the Q4_K kernel's decode-once form for 3..8
 * activation rows (kern_rows_together); skipped without FLOE_BIN. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/model.h"
#include "test.h"

#define NS 4

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int32_t rand_tok(int64_t V) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (int32_t)(rng % (uint64_t)V);
}

typedef struct pair {
  model_session *b, *r; /* batched, reference */
  float *lb, *lr;       /* their last logits */
} pair;

static int same(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

/* One pass: session i (on) gets toks[i][0..n[i]) (n[i] == 0: not in the pass); logits wanted
 * when want[i]. The reference sessions get the same tokens through model_eval one by one. */
static void pass(pair *p, int ns, int32_t *const *toks, const int64_t *n, const bool *want, int64_t V, const char *what,
                 int64_t *rows, int *segs) {
  model_seg seg[NS];
  int k = 0;
  char err[256];
  for (int i = 0; i < ns; i++)
    if (n[i]) seg[k++] = (model_seg){ p[i].b, toks[i], n[i], want[i] ? p[i].lb : NULL };
  int rc = model_eval_multi(seg, k, rows, segs, err, sizeof err);
  CHECK(rc == 0, "%s: model_eval_multi: %s", what, err);
  for (int i = 0; i < ns; i++) {
    if (!n[i]) continue;
    rc = model_eval(p[i].r, toks[i], n[i], p[i].lr, false, err, sizeof err);
    CHECK(rc == 0, "%s: model_eval: %s", what, err);
    CHECK(model_session_pos(p[i].b) == model_session_pos(p[i].r), "%s: session %d at %lld, reference %lld", what, i,
          (long long)model_session_pos(p[i].b), (long long)model_session_pos(p[i].r));
    if (want[i]) CHECK(same(p[i].lb, p[i].lr, V), "%s: session %d: logits bit-identical to model_eval alone", what, i);
  }
}

static void run(model *m, bool exact, const model_backend *be, const char *name) {
  SECTION("%s", name);
  const int64_t V = m->hp.n_vocab;
  char err[256];
  pair p[NS];
  for (int i = 0; i < NS; i++) {
    int rc = model_session_new(m, 1024, KV_BF16, 2, &p[i].b, err, sizeof err);
    if (!rc) rc = model_session_new(m, 1024, KV_BF16, 2, &p[i].r, err, sizeof err);
    CHECK(rc == 0, "session: %s", err);
    if (rc) exit(1);
    if (i) CHECK(model_session_share_pool(p[i].b, p[0].b, err, sizeof err) == 0, "share pool: %s", err);
    model_session_set_exact(p[i].b, exact);
    model_session_set_exact(p[i].r, exact);
    p[i].lb = malloc((size_t)V * sizeof(float));
    p[i].lr = malloc((size_t)V * sizeof(float));
  }
  for (int i = 0; i < NS; i++) p[i].b->be = be; /* the fallback case: a table without multi_begin */
  int32_t buf[NS][200];
  int32_t *toks[NS];
  for (int i = 0; i < NS; i++) toks[i] = buf[i];
  int64_t rows = 0;
  int segs = 0;
  /* prompts of awkward lengths; session 3 wants no logits */
  {
    const int64_t n[NS] = { 37, 5, 1, 130 };
    const bool want[NS] = { true, true, true, false };
    for (int i = 0; i < NS; i++)
      for (int64_t t = 0; t < n[i]; t++) buf[i][t] = rand_tok(V);
    pass(p, NS, toks, n, want, V, "prompts", &rows, &segs);
    if (be->multi_begin) CHECK(segs >= 2 && rows >= 130 + 5 + 1, "prompts: one pass held %d segments, %lld rows", segs, (long long)rows);
    /* session 3 had no logits: evaluate one more token so every session has some */
    const int64_t n1[NS] = { 0, 0, 0, 1 };
    const bool w1[NS] = { false, false, false, true };
    buf[3][0] = rand_tok(V);
    pass(p, NS, toks, n1, w1, V, "one token", &rows, &segs);
  }
  /* decode steps: greedy tokens from the batched logits; session 2 leaves at step 6 and rejoins
   * at step 12 with a 64-token chunk in the same pass as the others' decode rows */
  for (int step = 0; step < 20; step++) {
    int64_t n[NS];
    bool want[NS];
    for (int i = 0; i < NS; i++) {
      n[i] = 1;
      want[i] = true;
      int64_t best = 0;
      for (int64_t v = 1; v < V; v++)
        if (p[i].lb[v] > p[i].lb[best]) best = v;
      buf[i][0] = (int32_t)best;
    }
    if (step >= 6 && step < 12) n[2] = 0;
    if (step == 12) {
      n[2] = 64;
      for (int t = 0; t < 64; t++) buf[2][t] = rand_tok(V);
    }
    char what[64];
    snprintf(what, sizeof what, "decode step %d", step);
    pass(p, NS, toks, n, want, V, what, &rows, &segs);
    if (be->multi_begin && step == 12) CHECK(segs == 4 && rows == 67, "step 12: one pass of 4 segments, 67 rows (%d, %lld)", segs, (long long)rows);
    if (be->multi_begin && step == 7) CHECK(segs == 3 && rows == 3, "step 7: one pass of 3 rows (%d, %lld)", segs, (long long)rows);
    if (!be->multi_begin) CHECK(segs <= 1, "fallback: no batched pass (%d segments)", segs);
  }
  /* bad input: the same session twice, a token out of the vocabulary */
  {
    int32_t t0 = 1, bad = (int32_t)V;
    model_seg s2[2] = { { p[0].b, &t0, 1, NULL }, { p[0].b, &t0, 1, NULL } };
    CHECK(model_eval_multi(s2, 2, NULL, NULL, err, sizeof err) == FLOE_E_INVALID, "a session twice is refused");
    model_seg s3[2] = { { p[0].b, &t0, 1, NULL }, { p[1].b, &bad, 1, NULL } };
    CHECK(model_eval_multi(s3, 2, NULL, NULL, err, sizeof err) == FLOE_E_INVALID, "a bad token is refused: %s", err);
  }
  for (int i = NS - 1; i >= 0; i--) { /* the pool's owner last */
    model_session_free(p[i].b);
    model_session_free(p[i].r);
    free(p[i].lb);
    free(p[i].lr);
  }
}

int main(void) {
  char err[256];
  model *m;
  const char *path = test_fixture("../../models/default.gguf");
  if (model_load(path, &m, err, sizeof err)) {
    printf("FAIL: %s\n", err);
    return 1;
  }
  run(m, false, &model_backend_cpu, "quantized activations, one batched pass");
  run(m, true, &model_backend_cpu, "exact float path, one batched pass");
  model_backend nomulti = model_backend_cpu;
  nomulti.multi_begin = NULL;
  run(m, false, &nomulti, "a backend without multi_begin: sessions one after another");
  model_backend permix = model_backend_cpu;
  permix.attention_multi = NULL;
  permix.gdn_multi = NULL;
  run(m, false, &permix, "multi_begin without attention_multi / gdn_multi: the mixers per segment");
  model_free(m);
  const char *bin = getenv("FLOE_BIN"), *tmp = getenv("FLOE_TMP");
  if (bin) {
    char q4[1024], cmd[3072];
    snprintf(q4, sizeof q4, "%s/test_batch_q4k.%d.gguf", tmp ? tmp : "/tmp", (int)getpid());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && '%s' synth --preset tiny-qwen35moe --type q4_K --set n_embd=1280 -o '%s' >/dev/null",
             tmp ? tmp : "/tmp", bin, q4);
    const int rc = system(cmd);
    CHECK(rc == 0, "floe synth of a Q4_K model (%s)", cmd);
    if (rc == 0 && model_load(q4, &m, err, sizeof err) == 0) {
      run(m, false, &model_backend_cpu, "Q4_K (synthetic), quantized activations, one batched pass");
      model_free(m);
    } else if (rc == 0) {
      CHECK(0, "load %s: %s", q4, err);
    }
    remove(q4);
  } else {
    printf("note: FLOE_BIN not set: the Q4_K model part is skipped\n");
  }
  return TEST_DONE();
}
