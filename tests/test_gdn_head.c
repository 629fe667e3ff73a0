/* The CPU's GatedDeltaNet head step (layer_gdn_head, src/model/layers.c: 16-column blocks with the
 * eight accumulators in registers, then single columns) against a scalar reference written
 * straight from the definition and base/gdn_sum.h's order: row i of S^T k and S^T q into
 * accumulator i % GDN_ACC in row order, then floe_gdn_fold8. Fresh random inputs, awkward sizes
 * (dk not a multiple of 8, dv not a multiple of 16, a single row or column), in place and from a
 * separate input state (a kept chunk's row), with and without the next head's prefetch pointer;
 * the output and the state must be bit-identical. */
#include <math.h>

#include "base/gdn_sum.h"
#include "model/model.h"
#include "test.h"

static void ref_head(float *S, const float *Sin, int64_t dk, int64_t dv, float decay, float beta, const float *k,
                     const float *q, const float *v, float *o) {
  float *acc = calloc((size_t)GDN_ACC * dv, sizeof(float)), *delta = malloc((size_t)dv * sizeof(float));
  for (int64_t i = 0; i < dk; i++)
    for (int64_t j = 0; j < dv; j++) {
      S[i * dv + j] = (Sin ? Sin[i * dv + j] : S[i * dv + j]) * decay;
      acc[(i % GDN_ACC) * dv + j] += S[i * dv + j] * k[i];
    }
  for (int64_t j = 0; j < dv; j++) {
    float a[GDN_ACC];
    for (int u = 0; u < GDN_ACC; u++) a[u] = acc[u * dv + j];
    delta[j] = (v[j] - floe_gdn_fold8(a)) * beta;
  }
  memset(acc, 0, (size_t)GDN_ACC * dv * sizeof(float));
  for (int64_t i = 0; i < dk; i++)
    for (int64_t j = 0; j < dv; j++) {
      S[i * dv + j] += k[i] * delta[j];
      acc[(i % GDN_ACC) * dv + j] += S[i * dv + j] * q[i];
    }
  for (int64_t j = 0; j < dv; j++) {
    float a[GDN_ACC];
    for (int u = 0; u < GDN_ACC; u++) a[u] = acc[u * dv + j];
    o[j] = floe_gdn_fold8(a);
  }
  free(acc), free(delta);
}

static size_t n_diff(const float *a, const float *b, size_t n) {
  size_t d = 0;
  for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], 4) != 0;
  return d;
}

static void one_case(floe_rng *r, int64_t dk, int64_t dv, int keep, int pf) {
  const size_t n = (size_t)(dk * dv);
  /* S of two heads, so the prefetch pointer has a real next head to point at */
  float *S = malloc(2 * n * 4), *Sr = malloc(n * 4), *Sin = malloc(n * 4);
  float *k = malloc(dk * 4), *q = malloc(dk * 4), *v = malloc(dv * 4), *kv = malloc(dv * 4);
  float *o = malloc(dv * 4), *orf = malloc(dv * 4);
  for (size_t i = 0; i < 2 * n; i++) S[i] = 2.0f * floe_rng_uniform(r) - 1.0f;
  for (size_t i = 0; i < n; i++) Sin[i] = 2.0f * floe_rng_uniform(r) - 1.0f;
  for (int64_t i = 0; i < dk; i++) k[i] = floe_rng_uniform(r) - 0.5f, q[i] = floe_rng_uniform(r) - 0.5f;
  for (int64_t j = 0; j < dv; j++) v[j] = 4.0f * floe_rng_uniform(r) - 2.0f;
  const float decay = 0.5f + 0.5f * floe_rng_uniform(r), beta = floe_rng_uniform(r);
  memcpy(Sr, S, n * 4);
  for (int step = 0; step < 3; step++) { /* three tokens on the same state */
    layer_gdn_head(S, keep ? Sin : NULL, dk, dv, decay, beta, k, q, v, kv, o, pf ? S + n : NULL);
    ref_head(Sr, keep ? Sin : NULL, dk, dv, decay, beta, k, q, v, orf);
    const size_t dS = n_diff(S, Sr, n), dO = n_diff(o, orf, dv);
    CHECK(dS == 0 && dO == 0, "dk %lld dv %lld %s%s token %d: S %zu of %zu and o %zu of %lld differ from the reference",
          (long long)dk, (long long)dv, keep ? "from a kept input state" : "in place", pf ? ", prefetching" : "", step,
          dS, n, dO, (long long)dv);
    for (int64_t i = 0; i < dk; i++) k[i] = floe_rng_uniform(r) - 0.5f; /* the next token's key */
  }
  free(S), free(Sr), free(Sin), free(k), free(q), free(v), free(kv), free(o), free(orf);
}

int main(void) {
  floe_rng r;
  floe_rng_seed(&r, 0x6d6e7a1f5eedull);
  static const int64_t shapes[][2] = { { 128, 128 }, { 64, 64 }, { 24, 40 }, { 13, 7 }, { 8, 16 },
                                       { 1, 33 },    { 64, 129 }, { 130, 17 }, { 5, 1 } };
  SECTION("layer_gdn_head vs the scalar reference (base/gdn_sum.h order)");
  for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
    for (int keep = 0; keep < 2; keep++)
      for (int pf = 0; pf < 2; pf++) one_case(&r, shapes[c][0], shapes[c][1], keep, pf && !keep);
  return TEST_DONE();
}
