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
/* Picks a token from logits[n_vocab]. Sampled: non-finite logits (NaN, +-inf) are never drawn
 * unless no logit is finite (then sampler_argmax). Greedy: sampler_argmax (a +inf logit is the
 * maximum there, as in the reference's argmax; NaN is never chosen). */
int32_t sampler_sample(sampler *s, const float *logits);
/* The sampler picks greedily (temperature <= 0): sampler_sample would return sampler_argmax. */
bool sampler_greedy(const sampler *s);
/* The distribution sampler_sample draws from (temperature, top-k, top-p, min-p applied) over the
 * whole vocabulary: probs[n_vocab], zero outside the kept candidates; greedy: one-hot at the argmax. */
void sampler_probs(sampler *s, const float *logits, float *probs);
/* A draw from probs[n] (non-negative weights, not necessarily normalised) with the sampler's
 * generator; the last positive index when rounding runs past the sum; 0 when all are zero. */
int32_t sampler_draw(sampler *s, const float *probs, int32_t n);
/* The speculative-sampling rule (Leviathan et al. / Chen et al.): draft d was drawn from q, the
 * target distribution is p (both over n tokens, normalised). Accepts d with probability
 * min(1, p[d]/q[d]) (returns d, *accepted = true), else returns a draw from
 * norm(max(0, p - q)) (*accepted = false; p itself if that is all zero). The token returned is
 * then distributed exactly as p. tmp: n floats of scratch. */
int32_t sampler_spec_step(sampler *s, const float *p, const float *q, int32_t n, int32_t d, float *tmp, bool *accepted);
/* Index of the largest logit (lowest index on ties). */
int32_t sampler_argmax(const float *logits, int32_t n);
#endif
