/* Token samplers: greedy, temperature, top-k, top-p, min-p, seeded and reproducible.
 *
 * Order (as llama.cpp's default chain): top-k -> softmax with temperature -> top-p -> min-p ->
 * draw. temperature <= 0 means greedy (argmax, lowest id on ties) and ignores the rest. The draw
 * uses floe_rng seeded by `seed`, so a (seed, logits sequence) always gives the same tokens. */
#ifndef FLOE_SAMPLER_H
#define FLOE_SAMPLER_H
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

typedef struct sampler_params {
  float temperature; /* <= 0: greedy */
  int32_t top_k;     /* <= 0: off */
  float top_p;       /* >= 1: off */
  float min_p;       /* <= 0: off */
  uint64_t seed;
} sampler_params;

typedef struct sampler sampler;

/* Defaults: greedy. */
sampler_params sampler_default_params(void);
/* Validates params (top_p in (0,1], min_p in [0,1], finite temperature); err gets one line. */
int sampler_new(const sampler_params *p, int32_t n_vocab, sampler **out, char *err, size_t errlen);
void sampler_free(sampler *s);
/* Picks a token from logits[n_vocab]. Non-finite logits are treated as -inf (never chosen unless
 * all are). */
int32_t sampler_sample(sampler *s, const float *logits);
/* The sampler picks greedily (temperature <= 0): sampler_sample would return sampler_argmax. */
bool sampler_greedy(const sampler *s);
/* Index of the largest logit (lowest index on ties). */
int32_t sampler_argmax(const float *logits, int32_t n);
#endif
