/* libFuzzer target for the token sampler (src/sample/sampler.c) on hostile numbers: parameters
 * anywhere (negative, zero, huge, NaN, infinite) and logits with NaN / +-inf / huge / subnormal
 * values. Input: 4 floats (temperature, top_p, min_p, and a scale for the logits), top_k, the
 * seed, then the logits as raw floats (1..4096 of them).
 * Asserted (ASan / UBSan for the rest): sampler_new refuses with one line or accepts; an accepted
 * sampler returns an id in [0, n), greedy the argmax, sampled one with a finite logit when any
 * is finite; sampler_probs gives finite non-negative weights summing to ~1 (one-hot when greedy,
 * else zero on non-finite logits), and sampler_sample's pick has weight > 0 in it;
 * the speculative-sampling step on (probs, a one-hot or the same probs) returns an id in range.
 * Built only with -DFLOE_FUZZ=ON (clang); run by tests/run_fuzz.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sampler.h"

/* a failed check: its line, then abort (libFuzzer saves the input) */
#define FAIL() (fprintf(stderr, "fuzz_sampler: the check at line %d failed\n", __LINE__), abort())

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const size_t head = 4 * 4 + 4 + 8;
  if (size < head + 4) return 0;
  float f[4];
  int32_t top_k;
  uint64_t seed;
  memcpy(f, data, sizeof f);
  memcpy(&top_k, data + 16, 4);
  memcpy(&seed, data + 20, 8);
  int32_t n = (int32_t)((size - head) / 4);
  if (n > 4096) n = 4096;
  float *logits = malloc((size_t)n * sizeof *logits), *probs = malloc((size_t)n * sizeof *probs);
  float *tmp = malloc((size_t)n * sizeof *tmp), *q = calloc((size_t)n, sizeof *q);
  if (!logits || !probs || !tmp || !q) abort();
  memcpy(logits, data + head, (size_t)n * 4);
  if (isfinite(f[3]) && f[3] != 0.0f) /* scaled logits: huge spreads, or all within rounding */
    for (int32_t i = 0; i < n; i++) logits[i] *= f[3];
  bool any_finite = false;
  for (int32_t i = 0; i < n; i++) any_finite |= isfinite(logits[i]) != 0;

  sampler_params p = sampler_default_params();
  p.temperature = f[0];
  p.top_p = f[1];
  p.min_p = f[2];
  p.top_k = top_k;
  p.seed = seed;
  sampler *s = NULL;
  char err[256] = "";
  if (sampler_new(&p, n, &s, err, sizeof err)) {
    if (s || !err[0] || strchr(err, '\n')) FAIL();
  } else {
    for (int rep = 0; rep < 2; rep++) {
      const int32_t id = sampler_sample(s, logits);
      if (id < 0 || id >= n) FAIL();
      if (!sampler_greedy(s) && any_finite && !isfinite(logits[id])) FAIL();
      if (sampler_greedy(s) && id != sampler_argmax(logits, n)) FAIL();
    }
    sampler_probs(s, logits, probs);
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
      if (!(probs[i] >= 0.0f) || !isfinite(probs[i])) FAIL();
      if (probs[i] > 0.0f && !sampler_greedy(s) && any_finite && !isfinite(logits[i])) FAIL();
      sum += probs[i];
    }
    if (any_finite && !(sum > 0.999 && sum < 1.001)) FAIL();
    const int32_t d = sampler_draw(s, probs, n);
    if (d < 0 || d >= n) FAIL();
    if (any_finite && !(probs[d] > 0.0f)) FAIL();
    if (any_finite) {
      bool acc;
      q[d] = 1.0f; /* a draft from a one-hot q: accepted with probability p[d] */
      int32_t t = sampler_spec_step(s, probs, q, n, d, tmp, &acc);
      if (t < 0 || t >= n || (acc && t != d)) FAIL();
      t = sampler_spec_step(s, probs, probs, n, d, tmp, &acc); /* q = p: always accepted */
      if (t != d || !acc) FAIL();
    }
    sampler_free(s);
  }
  free(logits);
  free(probs);
  free(tmp);
  free(q);
  return 0;
}
