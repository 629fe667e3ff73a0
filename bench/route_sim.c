/* route_sim: how a model's real routing behaves in the CUDA backend's VRAM expert pool.
 *
 * route_sim -m MODEL -f TEXT [-n MAX_TOKENS] [-t THREADS] [--fracs F1,F2,...]
 *
 * The text is tokenized and evaluated on the CPU (chunks of 256 tokens; a token's routing is the
 * same in any chunk, the rows being exact), and every layer's top-k selection of every token is
 * recorded (model_session.route_cb). The trace is then replayed, token by token and layer by
 * layer, through the pool's own slot tables (experts.h xv_*: LRU, the hits of a step held) for
 * pools of each fraction of the model's routed experts, filled at the start as cu_tier_open fills
 * them (round robin over the layers). Printed per fraction: the hit rate, the misses per token,
 * and random routing's expectation (the fraction itself), so that synthetic-weight figures can be
 * read against real text. Also the trace's own statistics: per layer, the share of a token's
 * experts that the previous token used too. Deterministic: the same file, the same numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "experts/experts.h"
#include "model/model.h"
#include "tok/tokenizer.h"

typedef struct trace {
  int64_t n_layer, K, cap, n_tok; /* tokens recorded per layer: n_tok counts layer 0 */
  int64_t *fill;                  /* [n_layer] rows recorded per layer */
  int32_t *sel;                   /* [cap][n_layer][K] */
} trace;

static void on_route(void *user, int64_t l, const int32_t *sel, int64_t n, int64_t k) {
  trace *tr = user;
  if (l < 0 || l >= tr->n_layer || k != tr->K) return;
  for (int64_t t = 0; t < n && tr->fill[l] < tr->cap; t++, tr->fill[l]++)
    memcpy(tr->sel + (tr->fill[l] * tr->n_layer + l) * tr->K, sel + t * k, (size_t)k * sizeof(int32_t));
}

int main(int argc, char **argv) {
  const char *path = NULL, *text_path = NULL, *fracs = "0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.8";
  int64_t max_tok = 2048;
  int threads = 2;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-m") && v) path = argv[++i];
    else if (!strcmp(a, "-f") && v) text_path = argv[++i];
    else if (!strcmp(a, "-n") && v) max_tok = atoll(argv[++i]);
    else if (!strcmp(a, "-t") && v) threads = atoi(argv[++i]);
    else if (!strcmp(a, "--fracs") && v) fracs = argv[++i];
    else {
      fprintf(stderr, "usage: route_sim -m MODEL -f TEXT [-n MAX_TOKENS] [-t THREADS] [--fracs F1,F2,...]\n");
      return 2;
    }
  }
  if (!path || !text_path || max_tok < 2) {
    fprintf(stderr, "route_sim: -m MODEL and -f TEXT are required\n");
    return 2;
  }
  char err[512];
  size_t tlen = 0;
  char *text = NULL;
  FILE *f = fopen(text_path, "rb");
  if (f) {
    fseek(f, 0, SEEK_END);
    const long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = sz > 0 ? malloc((size_t)sz) : NULL;
    tlen = text && fread(text, 1, (size_t)sz, f) == (size_t)sz ? (size_t)sz : 0;
    fclose(f);
  }
  if (!tlen) {
    fprintf(stderr, "route_sim: cannot read %s\n", text_path);
    return 1;
  }
  model *m = NULL;
  tok_vocab *tv = NULL;
  if (model_load(path, &m, err, sizeof err) || !m->gguf || tok_load_gguf(m->gguf, &tv, err, sizeof err)) {
    fprintf(stderr, "route_sim: %s\n", m && !m->gguf ? "a GGUF file is needed (its tokenizer)" : err);
    return 1;
  }
  tok_ids ids = { 0 };
  if (tok_encode(tv, text, tlen, false, &ids, err, sizeof err)) {
    fprintf(stderr, "route_sim: %s\n", err);
    return 1;
  }
  const floe_hparams *hp = &m->hp;
  const int64_t NL = hp->n_layer, NE = hp->n_expert, K = hp->n_expert_used;
  int64_t T = (int64_t)ids.n < max_tok ? (int64_t)ids.n : max_tok;
  if (T > hp->n_ctx_train && hp->n_ctx_train > 0) T = hp->n_ctx_train;
  trace tr = { NL, K, T, 0, calloc((size_t)NL, sizeof(int64_t)), malloc((size_t)(T * NL * K) * sizeof(int32_t)) };
  model_session *s = NULL;
  if (!tr.fill || !tr.sel || model_session_new(m, T, KV_BF16, threads, &s, err, sizeof err)) {
    fprintf(stderr, "route_sim: %s\n", err);
    return 1;
  }
  s->route_cb = on_route;
  s->route_user = &tr;
  for (int64_t c = 0; c < T; c += 256) {
    const int64_t n = T - c < 256 ? T - c : 256;
    if (model_eval(s, ids.v + c, n, NULL, false, err, sizeof err)) {
      fprintf(stderr, "route_sim: %s\n", err);
      return 1;
    }
  }
  T = tr.fill[NL - 1];
  printf("{\"model\":\"%s\",\"text\":\"%s\",\"tokens\":%lld,\"layers\":%lld,\"experts\":%lld,\"top_k\":%lld,", path,
         text_path, (long long)T, (long long)NL, (long long)NE, (long long)K);
  /* reuse: the share of token t's experts that token t-1 selected in the same layer */
  printf("\"reuse_prev_token\":[");
  for (int64_t l = 0; l < NL; l++) {
    int64_t same = 0;
    for (int64_t t = 1; t < T; t++)
      for (int64_t j = 0; j < K; j++)
        for (int64_t i = 0; i < K; i++)
          same += tr.sel[(t * NL + l) * K + j] == tr.sel[((t - 1) * NL + l) * K + i];
    printf("%s%.3f", l ? "," : "", T > 1 ? (double)same / (double)((T - 1) * K) : 0.0);
  }
  printf("],\"pool\":[");
  char fl[256];
  snprintf(fl, sizeof fl, "%s", fracs);
  int first = 1;
  int64_t prev_slots = -1;
  for (char *p = strtok(fl, ","); p; p = strtok(NULL, ",")) {
    const double fr = atof(p);
    int64_t slots = (int64_t)(fr * (double)(NL * NE));
    if (slots < NE) slots = NE; /* the pool's minimum: one layer's experts */
    if (slots == prev_slots) continue;
    prev_slots = slots;
    xv_slots *v = NULL;
    if (xv_open(NL, NE, slots, &v)) continue;
    for (int64_t e = 0, filled = 0; e < NE && filled < slots; e++) /* cu_tier_open's warm start */
      for (int64_t l = 0; l < NL && filled < slots; l++, filled++) {
        int64_t ol;
        int32_t oe;
        xv_take(v, l, (int32_t)e, &ol, &oe);
        xv_release_all(v);
      }
    int64_t look = 0, hit = 0;
    for (int64_t t = 0; t < T; t++)
      for (int64_t l = 0; l < NL; l++) {
        const int32_t *sel = tr.sel + (t * NL + l) * K;
        for (int64_t j = 0; j < K; j++) {
          look++;
          if (xv_find(v, l, sel[j]) >= 0) hit++;
          else {
            int64_t ol;
            int32_t oe;
            xv_take(v, l, sel[j], &ol, &oe);
          }
        }
        xv_release_all(v);
      }
    printf("%s{\"frac\":%.3f,\"slots\":%lld,\"hit_rate\":%.4f,\"random_routing\":%.4f,\"misses_per_token\":%.2f}",
           first ? "" : ",", (double)slots / (double)(NL * NE), (long long)slots, look ? (double)hit / (double)look : 0.0,
           (double)slots / (double)(NL * NE), T ? (double)(look - hit) / (double)T : 0.0);
    first = 0;
    xv_close(v);
  }
  printf("]}\n");
  model_session_free(s);
  tok_ids_free(&ids);
  tok_free(tv);
  model_free(m);
  free(tr.fill);
  free(tr.sel);
  free(text);
  return 0;
}
