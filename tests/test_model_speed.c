/* The speed path of the forward pass (src/model/layers.c): quantized activations, threaded MoE
 * with tokens grouped per expert, threaded attention / GDN recurrence / conv.
 *
 * For each HF fixture converted to Q8_0 GGUF (floe convert; the fixtures' widths are multiples
 * of 32, so every matrix takes the VNNI quantized-activation kernels):
 *  1. row-exact in the speed mode: logits of every position from one call equal, bit for bit,
 *     one token at a time, chunks of 7, and 2 and 3 threads (prefill == stepwise; thread count
 *     and the per-expert grouping of a chunk never change a value); also with the BF16 KV cache;
 *  2. the speed mode really differs from the exact float path (it ran) and stays close to it:
 *     mean |d| <= SPEED_MEAN_TOL = 0.15 (test_model_quant.c's bound against HF) and argmax equal at
 *     >= 2/3 of positions (measured over 300 positions: qwen3moe 0.007 / 294, qwen3next 0.10 / 223,
 *     qwen35moe 0.084 / 239). These tiny random models are chaotic: 8-bit activations move each
 *     matmul by ~1e-2 relative, which flips router choices and near-ties that the recurrence then
 *     carries over the sequence. Real models have margins far above this noise;
 *  3. the exact path is unchanged by threads (bit-identical with 1 and 2 threads). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert.h"
#include "model/model.h"
#include "model_ref_util.h"
#include "test.h"

#define SPEED_MEAN_TOL 0.15

static int64_t ndiff(const float *a, const float *b, int64_t n, int64_t V) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; i++) d += memcmp(a + i * V, b + i * V, (size_t)V * 4) != 0;
  return d;
}

static void test_one(const char *name) {
  char hf[512], out[512], err[256];
  SECTION("%s q8_0: speed path", name);
  snprintf(hf, sizeof hf, "models/%s", name);
  snprintf(hf, sizeof hf, "%s", test_fixture(hf));
  snprintf(out, sizeof out, "%s-speed-q8_0.gguf", test_tmp(name));
  convert_opts o = { .in_dir = hf, .out_path = out, .type = FLOE_TYPE_Q8_0, .expert_type = -1, .n_threads = 1 };
  convert_stats st;
  int rc = convert_model(&o, &st, err, sizeof err);
  CHECK(rc == 0, "%s: convert to q8_0: %s", name, rc ? err : "ok");
  if (rc) return;
  model *m = NULL;
  rc = model_load(out, &m, err, sizeof err);
  CHECK(rc == 0, "%s: load: %s", name, rc ? err : "ok");
  if (rc) {
    remove(out);
    return;
  }
  const int64_t V = m->hp.n_vocab, n = MODEL_MAX_BATCH + 44; /* > one chunk: crosses a chunk boundary */
  int32_t tok[MODEL_MAX_BATCH + 44];
  for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 37 + 11) % V);
  float *ref = malloc((size_t)(n * V) * 4), *alt = malloc((size_t)(n * V) * 4), *ex = malloc((size_t)(n * V) * 4);

  rc = ru_run(m, tok, n, 0, 1, KV_F32, false, ref);
  CHECK(rc == 0, "%s: speed path, one call", name);
  const struct { int64_t chunk; int threads; int kv; const char *what; } var[] = {
    { 1, 1, KV_F32, "one token at a time" }, { 7, 1, KV_F32, "chunks of 7" }, { 0, 2, KV_F32, "2 threads" },
    { 0, 3, KV_F32, "3 threads" },           { 1, 2, KV_F32, "one at a time, 2 threads" },
  };
  for (size_t v = 0; v < sizeof var / sizeof var[0]; v++) {
    memset(alt, 0, (size_t)(n * V) * 4);
    rc = ru_run(m, tok, n, var[v].chunk, var[v].threads, var[v].kv, false, alt);
    const int64_t d = ndiff(ref, alt, n, V);
    CHECK(rc == 0 && d == 0, "%s: speed path, %s: bit-identical to one batch (%lld positions differ)", name,
          var[v].what, (long long)d);
  }
  /* BF16 cache: its own reference, then stepwise with 2 threads */
  rc = ru_run(m, tok, n, 0, 1, KV_BF16, false, ex);
  rc |= ru_run(m, tok, n, 1, 2, KV_BF16, false, alt);
  CHECK(rc == 0 && ndiff(ex, alt, n, V) == 0, "%s: speed path, BF16 KV: stepwise x 2 threads bit-identical", name);

  /* speed vs exact */
  rc = ru_run(m, tok, n, 0, 1, KV_F32, true, ex);
  double maxd = 0, sum = 0;
  int64_t same = 0;
  for (int64_t i = 0; i < n * V; i++) {
    const double d = fabs((double)ex[i] - (double)ref[i]);
    maxd = fmax(maxd, d);
    sum += d;
  }
  for (int64_t i = 0; i < n; i++) same += ru_argmax(ex + i * V, V) == ru_argmax(ref + i * V, V);
  printf("  %s q8_0: speed vs exact: max %.3g, mean %.3g, argmax equal %lld/%lld\n", name, maxd,
         sum / (double)(n * V), (long long)same, (long long)n);
  CHECK(rc == 0 && maxd > 0, "%s: the speed path ran (differs from the exact path)", name);
  CHECK(sum / (double)(n * V) <= SPEED_MEAN_TOL, "%s: speed path mean |d| %.3g <= %.2g", name, sum / (double)(n * V),
        SPEED_MEAN_TOL);
  CHECK(same * 3 >= n * 2, "%s: argmax equal at >= 2/3 of positions (%lld/%lld)", name, (long long)same,
        (long long)n);
  rc = ru_run(m, tok, n, 0, 2, KV_F32, true, alt);
  CHECK(rc == 0 && ndiff(ex, alt, n, V) == 0, "%s: exact path, 2 threads bit-identical to 1", name);

  free(ref);
  free(alt);
  free(ex);
  model_free(m);
  remove(out);
}

int main(void) {
  test_one("qwen3moe");
  test_one("qwen3next");
  test_one("qwen35moe");
  return TEST_DONE();
}
