/* bench_verify: the cost of a speculative-decoding step against a plain decode step.
 *
 * bench_verify -m MODEL [-t THREADS] [-r ROUNDS] [-d DEPTH] [--kmax K] [--cache-mb MB]
 *              [--alpha a1,a2,a3,a4] [--layers-total N] [--device cpu|cuda] [--only KIND]
 *
 * On one session (CPU backend unless --device cuda, 8-bit activations as floe decodes, BF16 KV),
 * filled to DEPTH
 * pseudo-random tokens, each round times, in an order rotated every round:
 *   plain   model_eval of 1 token with its logits (a decode step);
 *   v<n>    model_verify of n = 2..K+1 rows (logits and hidden of every row, the per-row recurrent
 *           states kept) + model_verify_accept(1) (so every measurement advances the context by one
 *           token, like the plain step);
 *   draft   model_mtp_eval of 1 row with its logits (one chained draft: the MTP block + lm_head);
 *   f<k>    where the backend has the one-pass greedy step (model_spec_fused: CUDA), a whole step
 *           with k = 1..K drafts and one MTP input row (model_spec_greedy + model_verify_accept(1)):
 *           what a greedy step costs there, host round trip included.
 * Medians over rounds; the phase split (lm_head vs the rest) of each kind from the session's phase
 * timers. Then the predicted speedup of k drafts at per-position acceptance alpha (the measured
 * conditional rates of a real model, e.g. the default model's):
 *   tokens(k) = 1 + sum_i prod_{j<=i} alpha_j,  cost(k) = v<k+1> + k * draft,
 *   speedup(k) = tokens(k) / (cost(k) / plain), and with the one-pass step tokens(k) / (f<k> / plain).
 * --layers-total N: the model is a cut of an N-layer one (floe synth --layers): also the costs
 * with the layers part scaled by N / n_layer (lm_head and the MTP block are not repeated).
 * --cache-mb MB: stream the routed experts (the MTP block's too) through an expert cache of MB
 * (next-layer prefetch), as --mem-budget does: the question is whether a verify step, which
 * reads the union of its rows' experts, still pays.
 * --only KIND (plain, v2..v5, draft, f1..f4): time that kind alone, every round (a launch trace of
 * one kind, FLOE_CUDA_TRACE + scripts/trace_step.py, then repeats with one period); prints its
 * median only.
 * Every timed call holds nothing else; the caller runs this under flock /tmp/floe-bench.lock on a
 * shared machine (bench/mtp_cost.sh). One JSON object per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "experts/experts.h"
#include "model/model.h"

#define KMAX 4
#define NKIND (2 * KMAX + 2) /* plain, v2..v(KMAX+1), draft, f1..fKMAX */

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int threads = 2, rounds = 20, kmax = KMAX, layers_total = 0;
  bool cuda = false;
  const char *only = NULL;
  int64_t depth = 64;
  double cache_mb = 0, alpha[KMAX] = { 0.923, 0.838, 0.831, 0.824 };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-m") && v) path = argv[++i];
    else if (!strcmp(a, "-t") && v) threads = atoi(argv[++i]);
    else if (!strcmp(a, "-r") && v) rounds = atoi(argv[++i]);
    else if (!strcmp(a, "-d") && v) depth = atoll(argv[++i]);
    else if (!strcmp(a, "--kmax") && v) kmax = atoi(argv[++i]);
    else if (!strcmp(a, "--cache-mb") && v) cache_mb = atof(argv[++i]);
    else if (!strcmp(a, "--layers-total") && v) layers_total = atoi(argv[++i]);
    else if (!strcmp(a, "--device") && v) cuda = !strcmp(argv[++i], "cuda");
    else if (!strcmp(a, "--only") && v) only = argv[++i];
    else if (!strcmp(a, "--alpha") && v) {
      if (sscanf(argv[++i], "%lf,%lf,%lf,%lf", &alpha[0], &alpha[1], &alpha[2], &alpha[3]) != 4) {
        fprintf(stderr, "bench_verify: --alpha takes 4 comma-separated rates\n");
        return 2;
      }
    } else {
      fprintf(stderr, "usage: bench_verify -m MODEL [-t N] [-r ROUNDS] [-d DEPTH] [--kmax K] [--cache-mb MB] "
                      "[--alpha a1,a2,a3,a4] [--layers-total N] [--device cpu|cuda] [--only KIND]\n");
      return 2;
    }
  }
  if (!path || threads < 1 || rounds < 1 || rounds > 1000 || kmax < 1 || kmax > KMAX || depth < 1) {
    fprintf(stderr, "bench_verify: -m MODEL required; -t >= 1, -r 1..1000, --kmax 1..%d, -d >= 1\n", KMAX);
    return 2;
  }
  char err[512];
  model *m = NULL;
  int rc = model_load_ex(path, cache_mb > 0 ? FLOE_LOAD_MMAP : FLOE_LOAD_AUTO, &m, err, sizeof err);
  if (rc) {
    fprintf(stderr, "bench_verify: %s\n", err);
    return 1;
  }
  if (!model_has_mtp(m)) {
    fprintf(stderr, "bench_verify: %s has no MTP block\n", path);
    model_free(m);
    return 1;
  }
#ifdef FLOE_HAVE_CUDA
  if (cuda && (rc = model_use_backend(m, &model_backend_cuda, 0, err, sizeof err))) {
    fprintf(stderr, "bench_verify: %s\n", err);
    model_free(m);
    return 1;
  }
#else
  if (cuda) {
    fprintf(stderr, "bench_verify: built without CUDA\n");
    model_free(m);
    return 1;
  }
#endif
  if (cache_mb > 0) {
    xs_params xp = { 0 };
    xp.cache_bytes = (uint64_t)(cache_mb * 1048576.0);
    xp.io_kind = XIO_AUTO;
    xp.policy = XS_POLICY_LRU;
    xp.prefetch = XS_PF_NEXT;
    xp.depth = 64;
    xp.threads = 16;
    xp.chunk = 512u << 10;
    if ((rc = model_stream_start(m, &xp, err, sizeof err))) {
      fprintf(stderr, "bench_verify: %s\n", err);
      model_free(m);
      return 1;
    }
  }
  const uint64_t lanes = model_pack_lanes(m); /* as floe_engine_open does (FLOE_LANES=0: not) */
  if (lanes) fprintf(stderr, "bench_verify: %.2f GB repacked for the CPU\n", (double)lanes / 1e9);
  const int64_t V = m->hp.n_vocab, E = m->hp.n_embd, NL = m->hp.n_layer;
  const int64_t n_ctx = depth + (int64_t)rounds * NKIND + 16;
  model_session *s = NULL;
  if ((rc = model_session_new(m, n_ctx, KV_BF16, threads, &s, err, sizeof err))) {
    fprintf(stderr, "bench_verify: %s\n", err);
    model_free(m);
    return 1;
  }
  float *lg = malloc((size_t)((KMAX + 1) * V) * sizeof(float)), *hid = malloc((size_t)((KMAX + 1) * E) * sizeof(float));
  float *g = malloc((size_t)E * sizeof(float));
  int32_t *toks = malloc((size_t)depth * sizeof *toks);
  floe_rng r;
  floe_rng_seed(&r, 7);
  for (int64_t i = 0; i < depth; i++) toks[i] = (int32_t)(floe_rng_u64(&r) % (uint64_t)V);
  for (int64_t c = 0; c < depth && !rc; c += 256) /* prefill in chunks, with the hidden state of the last */
    rc = model_eval(s, toks + c, depth - c < 256 ? depth - c : 256, NULL, false, err, sizeof err);
  if (!rc) rc = model_eval_h(s, toks, 1, lg, false, hid, err, sizeof err);
  if (rc) {
    fprintf(stderr, "bench_verify: %s\n", err);
    return 1;
  }
  model_final_norm(m, hid, 1, g);
  const bool fused = model_spec_fused(s);
  const int nk = kmax + 2 + (fused ? kmax : 0); /* plain, v2..v(kmax+1), draft, f1..f(kmax) */
  int only_kind = -1;
  if (only) {
    const int n = only[0] ? atoi(only + 1) : 0;
    if (!strcmp(only, "plain")) only_kind = 0;
    else if (!strcmp(only, "draft")) only_kind = kmax + 1;
    else if (only[0] == 'v' && n >= 2 && n <= kmax + 1) only_kind = n - 1;
    else if (only[0] == 'f' && fused && n >= 1 && n <= kmax) only_kind = kmax + 1 + n;
    if (only_kind < 0) {
      fprintf(stderr, "bench_verify: --only %s: not plain, v2..v%d, draft%s\n", only, kmax + 1,
              fused ? ", f1..f<kmax>" : " (no one-pass step on this backend)");
      return 2;
    }
  }
  double *t = calloc((size_t)(nk * rounds), sizeof *t), *th = calloc((size_t)(nk * rounds), sizeof *th);
  for (int rd = 0; rd < rounds && !rc; rd++)
    for (int o = 0; o < nk && !rc; o++) {
      const int kind = only_kind >= 0 ? only_kind : (o + rd) % nk;
      if (only_kind >= 0 && o) break;
      int32_t in[KMAX + 1];
      for (int i = 0; i <= KMAX; i++) in[i] = (int32_t)(floe_rng_u64(&r) % (uint64_t)V);
      memset(s->ph, 0, sizeof s->ph);
      const double t0 = floe_time_s();
      if (kind == 0) {
        rc = model_eval(s, in, 1, lg, false, err, sizeof err);
      } else if (kind <= kmax) {
        rc = model_verify(s, in, kind + 1, lg, hid, err, sizeof err);
        if (!rc) model_verify_accept(s, 1);
      } else if (kind == kmax + 1) {
        const int64_t pos = model_session_pos(s) - 1;
        rc = model_mtp_eval(s, in, g, 1, pos, 0, lg, g, err, sizeof err);
      } else { /* the one-pass step with kind - kmax - 1 drafts, one row kept */
        const int k = kind - kmax - 1;
        int32_t d[KMAX], am[KMAX + 1];
        int64_t a = 0;
        rc = model_spec_greedy(s, in, g, 1, model_session_pos(s) - 1, k, d, am, &a, hid, lg, err, sizeof err);
        if (!rc) model_verify_accept(s, 1);
      }
      t[kind * rounds + rd] = floe_time_s() - t0;
      th[kind * rounds + rd] = s->ph[MODEL_PH_LMHEAD];
    }
  if (rc) {
    fprintf(stderr, "bench_verify: %s\n", err);
    return 1;
  }
  double med[NKIND], medh[NKIND];
  for (int kind = 0; kind < nk; kind++) {
    med[kind] = median(t + kind * rounds, rounds);
    medh[kind] = median(th + kind * rounds, rounds);
  }
  if (only_kind >= 0) {
    printf("{\"bench\":\"verify_cost\",\"model\":\"%s\",\"only\":\"%s\",\"rounds\":%d,\"ms\":%.3f,\"device\":\"%s\"}\n",
           path, only, rounds, 1e3 * med[only_kind], cuda ? "cuda" : "cpu");
    goto done;
  }
  /* draft's lm_head is timed inside model_mtp_eval's "other" phase: take the 1-row head of the plain step */
  const double draft = med[kmax + 1], plain = med[0];
  const double scale = layers_total > NL ? (double)layers_total / (double)NL : 1.0;
  printf("{\"bench\":\"verify_cost\",\"model\":\"%s\",\"threads\":%d,\"rounds\":%d,\"depth\":%lld,\"n_layer\":%lld,"
         "\"cache_mb\":%.0f,\"plain_ms\":%.3f,\"plain_lm_head_ms\":%.3f,\"draft_ms\":%.3f",
         path, threads, rounds, (long long)depth, (long long)NL, cache_mb, 1e3 * plain, 1e3 * medh[0], 1e3 * draft);
  for (int k = 1; k <= kmax; k++)
    printf(",\"verify%d_ms\":%.3f,\"verify%d_ratio\":%.3f", k + 1, 1e3 * med[k], k + 1, med[k] / plain);
  printf(",\"device\":\"%s\"", cuda ? "cuda" : "cpu");
  for (int k = 1; k <= kmax && fused; k++)
    printf(",\"fused%d_ms\":%.3f,\"fused%d_ratio\":%.3f", k, 1e3 * med[kmax + 1 + k], k, med[kmax + 1 + k] / plain);
  printf(",\"alpha\":[%.3f,%.3f,%.3f,%.3f]", alpha[0], alpha[1], alpha[2], alpha[3]);
  if (fused) {
    printf(",\"fused_predicted_speedup\":[1.000");
    for (int k = 1; k <= kmax; k++) {
      double tok = 1, run = 1;
      for (int j = 0; j < k; j++) tok += (run *= alpha[j]);
      printf(",%.3f", tok / (med[kmax + 1 + k] / plain));
    }
    printf("]");
  }
  double best = 1;
  int bestk = 0;
  printf(",\"predicted_speedup\":[1.000");
  for (int k = 1; k <= kmax; k++) {
    double tok = 1, run = 1;
    for (int j = 0; j < k; j++) tok += (run *= alpha[j]);
    const double sp = tok / ((med[k] + k * draft) / plain);
    printf(",%.3f", sp);
    if (sp > best) best = sp, bestk = k;
  }
  printf("],\"best_k\":%d,\"best_speedup\":%.3f", bestk, best);
  if (scale > 1) { /* the layers part (everything but lm_head) scaled to the full depth */
    const double p2 = medh[0] + (plain - medh[0]) * scale;
    printf(",\"layers_total\":%d,\"scaled_plain_ms\":%.3f,\"scaled_predicted_speedup\":[1.000", layers_total, 1e3 * p2);
    double best2 = 1;
    int bestk2 = 0;
    for (int k = 1; k <= kmax; k++) {
      const double v2 = medh[k] + (med[k] - medh[k]) * scale;
      double tok = 1, run = 1;
      for (int j = 0; j < k; j++) tok += (run *= alpha[j]);
      const double sp = tok / ((v2 + k * draft) / p2);
      printf(",%.3f", sp);
      if (sp > best2) best2 = sp, bestk2 = k;
    }
    printf("],\"scaled_best_k\":%d,\"scaled_best_speedup\":%.3f", bestk2, best2);
    for (int k = 1; k <= kmax; k++)
      printf(",\"scaled_verify%d_ratio\":%.3f", k + 1, (medh[k] + (med[k] - medh[k]) * scale) / p2);
  }
  for (int k = 1; k <= kmax; k++) printf(",\"verify%d_lm_head_ms\":%.3f", k + 1, 1e3 * medh[k]);
  printf("}\n");
done:
  free(t), free(th), free(lg), free(hid), free(g), free(toks);
  model_session_free(s);
  model_free(m);
  return 0;
}
