/* The MTP module's logits of the default model (models/default.gguf) against a PyTorch reference.
 *
 * tests/fixtures/default_model/mtp_ref.json is tools/train/mtp_reference.py's output: the GGUF's
 * own weights (Q8_0 dequantized exactly) in the model code the default model was trained with
 * (HF transformers' Qwen3_5MoeForCausalLM + train.py's MTP module), float32, eager, on the CPU.
 * For each prompt of T tokens it holds x_T (the trunk's greedy token after the prompt), the
 * drafts d_1..d_{C+1}, and for each of the T + C MTP rows the top-8 ids and logits, the top-2
 * margin and the logits of every 509th id: rows t < T read (x_{t+1}, h_t) at position t; row
 * T + j - 1 (j >= 1) reads (d_j, the MTP's own normed output of the row before): the chained
 * drafts of speculative decoding.
 *
 * floe (exact float activations, F32 KV cache, like test_default_model) evaluates the prompt with
 * hidden states (model_eval_h), norms them (model_final_norm), runs the T rows in one
 * model_mtp_eval and the chained rows one at a time on its own output hidden state, each fed the
 * FIXTURE's tokens (so that every row reads the same inputs). Checks per row:
 *   - |floe - reference| <= LOGIT_TOL on the top-8 ids and on the comb ids;
 *   - floe's argmax == the reference's, unless the reference's top-2 margin is below MARGIN;
 *   - floe's own greedy x_T and drafts equal the fixture's (same margin rule). */
#include <cjson/cJSON.h>
#include <math.h>

#include "model/model.h"
#include "test.h"

/* |floe - reference| on logits of |x| <= ~22: measured 1.1e-5 at most (172 rows, 12 of them
 * chained), the size of the trunk's own difference to HF (test_default_model); 2e-4 leaves room
 * for another summation order without letting a wrong input, norm or position through */
#define LOGIT_TOL 2e-4
#define MARGIN 1e-3

static int32_t *ints(const cJSON *a, int64_t *n) {
  *n = cJSON_GetArraySize(a);
  int32_t *v = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *v);
  for (int64_t i = 0; i < *n; i++) v[i] = cJSON_GetArrayItem(a, (int)i)->valueint;
  return v;
}

static int32_t argmax(const float *x, int64_t n) {
  int32_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[b]) b = (int32_t)i;
  return b;
}

/* Compares floe's row lg against the fixture's row r; returns the largest difference. */
static double check_row(const float *lg, int64_t V, const cJSON *ids, const cJSON *vals, const cJSON *comb_vals,
                        int comb, double margin, int pi, int64_t r, int *bad_argmax) {
  double md = 0;
  for (int i = 0; i < cJSON_GetArraySize(ids); i++) {
    const int32_t id = cJSON_GetArrayItem(ids, i)->valueint;
    if (id < 0 || id >= V) return INFINITY;
    md = fmax(md, fabs((double)lg[id] - cJSON_GetArrayItem(vals, i)->valuedouble));
  }
  for (int i = 0; i < cJSON_GetArraySize(comb_vals); i++)
    if ((int64_t)i * comb < V) md = fmax(md, fabs((double)lg[(int64_t)i * comb] - cJSON_GetArrayItem(comb_vals, i)->valuedouble));
  const int32_t a = argmax(lg, V), ref = cJSON_GetArrayItem(ids, 0)->valueint;
  if (a != ref && margin >= MARGIN) {
    (*bad_argmax)++;
    printf("   prompt %d row %lld: argmax %d, reference %d (margin %.3g)\n", pi, (long long)r, a, ref, margin);
  }
  return md;
}

int main(void) {
  char err[256];
  SECTION("MTP logits of models/default.gguf against the PyTorch reference (mtp_ref.json)");
  char *text = test_read_all(test_fixture("default_model/mtp_ref.json"), NULL);
  CHECK(text != NULL, "read %s", test_fixture("default_model/mtp_ref.json"));
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  CHECK(root != NULL, "mtp_ref.json parses");
  model *m = NULL;
  int rc = model_load(test_fixture("../../models/default.gguf"), &m, err, sizeof err);
  CHECK(rc == 0, "load: %s", rc ? err : "ok");
  if (!root || rc) {
    cJSON_Delete(root);
    free(text);
    return TEST_DONE();
  }
  CHECK(model_has_mtp(m), "the model has its MTP block");
  const int64_t V = m->hp.n_vocab, E = m->hp.n_embd;
  const cJSON *prompts = cJSON_GetObjectItem(root, "prompts");
  const int comb = cJSON_GetObjectItem(root, "comb") ? cJSON_GetObjectItem(root, "comb")->valueint : 0;
  printf("   reference: torch %s, transformers %s, %d prompts\n",
         cJSON_GetStringValue(cJSON_GetObjectItem(root, "torch")),
         cJSON_GetStringValue(cJSON_GetObjectItem(root, "transformers")), cJSON_GetArraySize(prompts));
  CHECK(cJSON_GetArraySize(prompts) >= 3 && comb > 0, "at least 3 prompts and a comb (%d, %d)",
        cJSON_GetArraySize(prompts), comb);
  double worst = 0;
  int64_t rows = 0;
  for (int pi = 0; pi < cJSON_GetArraySize(prompts); pi++) {
    const cJSON *p = cJSON_GetArrayItem(prompts, pi);
    int64_t T, ND;
    int32_t *toks = ints(cJSON_GetObjectItem(p, "tokens"), &T);
    int32_t *drafts = ints(cJSON_GetObjectItem(p, "drafts"), &ND);
    const int32_t next = cJSON_GetObjectItem(p, "next")->valueint;
    const cJSON *top_ids = cJSON_GetObjectItem(p, "top_ids"), *top_vals = cJSON_GetObjectItem(p, "top_vals");
    const cJSON *margin = cJSON_GetObjectItem(p, "margin"), *comb_vals = cJSON_GetObjectItem(p, "comb_vals");
    const int64_t C = ND - 1, NR = T + C;
    CHECK(T >= 2 && ND >= 2 && cJSON_GetArraySize(top_ids) == NR && cJSON_GetArraySize(margin) == NR &&
              cJSON_GetArraySize(comb_vals) == NR,
          "prompt %d: %lld tokens, %lld drafts, %lld rows", pi, (long long)T, (long long)ND, (long long)NR);
    if (T < 2 || ND < 2 || cJSON_GetArraySize(top_ids) != NR) {
      free(toks), free(drafts);
      continue;
    }
    model_session *s = NULL;
    rc = model_session_new(m, 256, KV_F32, 2, &s, err, sizeof err);
    CHECK(rc == 0, "session: %s", rc ? err : "ok");
    if (rc) {
      free(toks), free(drafts);
      continue;
    }
    model_session_set_exact(s, true);
    float *hid = malloc((size_t)(T * E) * 4), *lg = malloc((size_t)(T * V) * 4), *g = malloc((size_t)(T * E) * 4);
    int32_t *in = malloc((size_t)T * sizeof *in);
    rc = model_eval_h(s, toks, T, lg, false, hid, err, sizeof err);
    CHECK(rc == 0, "prompt %d: trunk eval: %s", pi, rc ? err : "ok");
    if (!rc) {
      const int32_t mine = argmax(lg, V);
      CHECK(mine == next, "prompt %d: the trunk's greedy token %d == the reference's %d", pi, mine, next);
      model_final_norm(m, hid, T, hid);
      for (int64_t t = 0; t < T - 1; t++) in[t] = toks[t + 1];
      in[T - 1] = next;
      rc = model_mtp_eval(s, in, hid, T, 0, 0, lg, g, err, sizeof err);
      CHECK(rc == 0, "prompt %d: MTP rows: %s", pi, rc ? err : "ok");
    }
    int bad = 0;
    double md = 0;
    for (int64_t r = 0; r < T && !rc; r++)
      md = fmax(md, check_row(lg + r * V, V, cJSON_GetArrayItem(top_ids, (int)r), cJSON_GetArrayItem(top_vals, (int)r),
                              cJSON_GetArrayItem(comb_vals, (int)r), comb,
                              cJSON_GetArrayItem(margin, (int)r)->valuedouble, pi, r, &bad));
    if (!rc) {
      const int32_t d1 = argmax(lg + (T - 1) * V, V);
      CHECK(d1 == drafts[0] || cJSON_GetArrayItem(margin, (int)(T - 1))->valuedouble < MARGIN,
            "prompt %d: first draft %d == reference %d", pi, d1, drafts[0]);
    }
    /* chained rows: (d_j, the previous row's normed output) at position T + j - 1 */
    float *gh = malloc((size_t)E * 4);
    if (!rc) memcpy(gh, g + (T - 1) * E, (size_t)E * 4);
    for (int64_t j = 1; j <= C && !rc; j++) {
      const int64_t r = T + j - 1;
      rc = model_mtp_eval(s, &drafts[j - 1], gh, 1, r, 0, lg, gh, err, sizeof err);
      CHECK(rc == 0, "prompt %d: chained row %lld: %s", pi, (long long)j, rc ? err : "ok");
      if (rc) break;
      md = fmax(md, check_row(lg, V, cJSON_GetArrayItem(top_ids, (int)r), cJSON_GetArrayItem(top_vals, (int)r),
                              cJSON_GetArrayItem(comb_vals, (int)r), comb,
                              cJSON_GetArrayItem(margin, (int)r)->valuedouble, pi, r, &bad));
      const int32_t dj = argmax(lg, V);
      CHECK(dj == drafts[j] || cJSON_GetArrayItem(margin, (int)r)->valuedouble < MARGIN,
            "prompt %d: chained draft %lld: %d == reference %d", pi, (long long)j + 1, dj, drafts[j]);
    }
    printf("   prompt %d: %lld rows (%lld chained), max |logit - ref| %.3g\n", pi, (long long)NR, (long long)C, md);
    CHECK(!rc && md <= LOGIT_TOL, "prompt %d: every row within %.0e of the reference (max %.3g)", pi, LOGIT_TOL, md);
    CHECK(!rc && bad == 0, "prompt %d: argmax equal on every row with a margin >= %.0e (%d differ)", pi, MARGIN, bad);
    worst = fmax(worst, md);
    rows += NR;
    free(gh), free(hid), free(lg), free(g), free(in), free(toks), free(drafts);
    model_session_free(s);
  }
  printf("   %lld rows, worst max |logit - ref| %.3g (bound %.0e)\n", (long long)rows, worst, LOGIT_TOL);
  model_free(m);
  cJSON_Delete(root);
  free(text);
  return TEST_DONE();
}
