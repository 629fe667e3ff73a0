/* bench_multi: the engine's batched decode step (model_eval_multi: what `floe serve --parallel`
 * runs every step) with 1, 2, 4, ... sessions, and where its time goes.
 *
 * bench_multi -m MODEL [-t THREADS] [-r ROUNDS] [-s STEPS] [-d DEPTH] [--streams 1,2,4,8]
 *             [--device cpu|cuda]
 *
 * A stream count with a g ("4g") runs the CPU's several-row experts on the general path (three pool
 * runs a layer, as FLOE_XD_MULTI=0) instead of one run (xd_worker): "1,4,4g" is an in-process A/B.
 *
 * --device cuda: the model on the GPU (FLOE_CUDA_MULTI=0 runs the sessions one after another there;
 * "segs" says how many sessions a step's pass held at most, 1 = one after another).
 * The model is read into memory (FLOE_LOAD_COPY, as `floe serve --no-mmap`); max(streams)
 * sessions share one thread pool (as the server's slots do), each filled with DEPTH distinct
 * pseudo-random tokens. A round runs STEPS greedy decode steps for every stream count, in an order
 * reversed every other round (1 2 4 8, then 8 4 2 1), so a shared machine's slow phases spread over
 * all counts. A step of k streams is one model_eval_multi of k one-token segments with their
 * logits, then each session's greedy pick (kern_argmax of its logits, as the server's generation
 * does). One JSON object per stream count: median ms per step, aggregate tok/s (k / step), the
 * ratio to the first count's tok/s (1 stream by default) both from the medians and as the median
 * of the per-round ratios (paired: each round's counts ran close together in time, which cancels
 * most of a shared machine's drift), and the lead session's phase split (attention, GDN, router, experts,
 * lm_head, other) per step, means over the steps. The caller runs this under
 * flock /tmp/floe-bench.lock on a shared machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"

#define MAXS 16

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* the median of v[0..n) (v is left as it was: the per-round ratios read it in round order) */
static double median(const double *v, int n) {
  double *c = malloc((size_t)n * sizeof *c);
  if (!c) return 0;
  memcpy(c, v, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, cmp_d);
  const double r = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  free(c);
  return r;
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int threads = 2, rounds = 12, steps = 2, ns = 0, counts[MAXS], gen[MAXS] = { 0 };
  int64_t depth = 32;
  bool cuda = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-m") && v) path = argv[++i];
    else if (!strcmp(a, "-t") && v) threads = atoi(argv[++i]);
    else if (!strcmp(a, "-r") && v) rounds = atoi(argv[++i]);
    else if (!strcmp(a, "-s") && v) steps = atoi(argv[++i]);
    else if (!strcmp(a, "-d") && v) depth = atoll(argv[++i]);
    else if (!strcmp(a, "--device") && v) {
      const char *d = argv[++i];
      if (strcmp(d, "cpu") && strcmp(d, "cuda")) {
        fprintf(stderr, "bench_multi: --device %s: expected cpu or cuda\n", d);
        return 2;
      }
      cuda = !strcmp(d, "cuda");
    } else if (!strcmp(a, "--streams") && v) {
      const char *p = argv[++i];
      while (*p && ns < MAXS) {
        char *e;
        counts[ns] = (int)strtol(p, &e, 10);
        if (*e == 'g') gen[ns] = 1, e++;
        ns++;
        p = *e == ',' ? e + 1 : e;
      }
    } else {
      fprintf(stderr, "usage: bench_multi -m MODEL [-t N] [-r ROUNDS] [-s STEPS] [-d DEPTH] [--streams 1,2,4g,8] "
                      "[--device cpu|cuda]\n");
      return 2;
    }
  }
  if (!ns) {
    const int def[4] = { 1, 2, 4, 8 };
    for (ns = 0; ns < 4; ns++) counts[ns] = def[ns];
  }
  int kmax = 0;
  for (int i = 0; i < ns; i++) {
    if (counts[i] < 1 || counts[i] > MAXS) {
      fprintf(stderr, "bench_multi: stream counts must be 1..%d\n", MAXS);
      return 2;
    }
    if (counts[i] > kmax) kmax = counts[i];
  }
  if (!path || threads < 1 || rounds < 1 || steps < 1 || depth < 1) {
    fprintf(stderr, "bench_multi: -m MODEL required; -t, -r, -s, -d >= 1\n");
    return 2;
  }
  char err[512];
  model *m = NULL;
  int rc = model_load_ex(path, FLOE_LOAD_COPY, &m, err, sizeof err);
  if (rc) {
    fprintf(stderr, "bench_multi: %s\n", err);
    return 1;
  }
#ifdef FLOE_HAVE_CUDA
  if (cuda && (rc = model_use_backend(m, &model_backend_cuda, 0, err, sizeof err))) {
    fprintf(stderr, "bench_multi: %s\n", err);
    model_free(m);
    return 1;
  }
#else
  if (cuda) {
    fprintf(stderr, "bench_multi: --device cuda: this build has no CUDA backend\n");
    model_free(m);
    return 1;
  }
#endif
  const uint64_t lanes = model_pack_lanes(m); /* as floe_engine_open does (FLOE_LANES=0: not) */
  fprintf(stderr, "bench_multi: %.2f GB repacked for the CPU\n", (double)lanes / 1e9);
  const int64_t V = m->hp.n_vocab;
  const int64_t n_ctx = depth + (int64_t)rounds * steps * ns + 16;
  model_session *s[MAXS] = { 0 };
  for (int i = 0; i < kmax && !rc; i++) {
    rc = model_session_new(m, n_ctx, KV_BF16, threads, &s[i], err, sizeof err);
    if (!rc && i) rc = model_session_share_pool(s[i], s[0], err, sizeof err);
  }
  float *lg = malloc((size_t)kmax * (size_t)V * sizeof(float));
  int32_t *toks = malloc((size_t)depth * sizeof *toks), next[MAXS];
  floe_rng r;
  floe_rng_seed(&r, 11);
  for (int i = 0; i < kmax && !rc; i++) {
    for (int64_t j = 0; j < depth; j++) toks[j] = (int32_t)(floe_rng_u64(&r) % (uint64_t)V);
    rc = model_eval(s[i], toks, depth, lg + (size_t)i * V, false, err, sizeof err);
    next[i] = (int32_t)kern_argmax(lg + (size_t)i * V, V);
  }
  if (rc) {
    fprintf(stderr, "bench_multi: %s\n", err);
    return 1;
  }
  double *t = calloc((size_t)(ns * rounds * steps), sizeof *t), ph[MAXS][MODEL_PH_N] = { { 0 } };
  int segs_max[MAXS] = { 0 };
  for (int rd = 0; rd < rounds && !rc; rd++)
    for (int o = 0; o < ns && !rc; o++) {
      const int ci = rd % 2 ? ns - 1 - o : o, k = counts[ci];
      for (int st = 0; st < steps && !rc; st++) {
        model_seg seg[MAXS];
        for (int i = 0; i < k; i++) seg[i] = (model_seg){ s[i], &next[i], 1, lg + (size_t)i * V };
        memset(s[0]->ph, 0, sizeof s[0]->ph);
        layer_xd_multi_set(!gen[ci]);
        const double t0 = floe_time_s();
        int segs = 0;
        rc = model_eval_multi(seg, k, NULL, &segs, err, sizeof err);
        if (segs > segs_max[ci]) segs_max[ci] = segs;
        for (int i = 0; i < k && !rc; i++) next[i] = (int32_t)kern_argmax(lg + (size_t)i * V, V);
        t[(ci * rounds + rd) * steps + st] = floe_time_s() - t0;
        for (int p = 0; p < MODEL_PH_N; p++) ph[ci][p] += s[0]->ph[p];
      }
    }
  if (rc) {
    fprintf(stderr, "bench_multi: %s\n", err);
    return 1;
  }
  double base = 0, *rr = malloc((size_t)rounds * sizeof *rr);
  static const char *pn[MODEL_PH_N] = { "attn", "gdn", "router", "experts", "lm_head", "other" };
  for (int ci = 0; ci < ns; ci++) {
    const int k = counts[ci];
    const double med = median(t + (size_t)ci * rounds * steps, rounds * steps);
    const double tps = k / med;
    if (ci == 0) base = tps / k; /* the first count given is the reference (1 stream by default) */
    for (int rd = 0; rd < rounds; rd++) { /* this round's k-stream tok/s over the first count's */
      double a = 0, b = 0;
      for (int st = 0; st < steps; st++) {
        a += t[(ci * rounds + rd) * steps + st];
        b += t[rd * steps + st];
      }
      rr[rd] = (k / a) / (counts[0] / b);
    }
    const double pr = median(rr, rounds);
    printf("{\"bench\":\"multi_decode\",\"model\":\"%s\",\"threads\":%d,\"rounds\":%d,\"steps\":%d,\"depth\":%lld,"
           "\"streams\":%d,\"step_ms\":%.3f,\"agg_tok_s\":%.2f,\"ratio_vs_first\":%.3f,\"paired_ratio\":%.3f,"
           "\"device\":\"%s\",\"segs\":%d,\"experts_path\":\"%s\"",
           path, threads, rounds, steps, (long long)depth, k, 1e3 * med, tps, tps / (base * counts[0]), pr,
           cuda ? "cuda" : "cpu", segs_max[ci], gen[ci] ? "general" : "one_run");
    for (int p = 0; p < MODEL_PH_N; p++) printf(",\"%s_ms\":%.3f", pn[p], 1e3 * ph[ci][p] / (rounds * steps));
    printf("}\n");
  }
  free(t), free(lg), free(toks), free(rr);
  for (int i = kmax - 1; i >= 0; i--) model_session_free(s[i]);
  model_free(m);
  return 0;
}
