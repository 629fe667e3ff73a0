/* Samplers (see sampler.h). The candidate set is cut early so a 248k-entry vocabulary costs O(n)
 * per token, not a full sort: top-k uses quickselect; without top-k, only tokens within a fixed
 * logit margin of the maximum can carry probability mass above float resolution. */
#include "sample/sampler.h"
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand { float logit; int32_t id; } cand;

struct sampler {
  sampler_params p;
  int32_t n_vocab;
  floe_rng rng;
  cand *c;
  float *prob;
};

sampler_params sampler_default_params(void) {
  sampler_params p = {0};
  p.temperature = 0.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 0;
  return p;
}

int sampler_new(const sampler_params *p, int32_t n_vocab, sampler **out, char *err, size_t errlen) {
  *out = NULL;
  if (n_vocab < 1) return floe_err(err, errlen, FLOE_E_INVALID, "sampler: vocabulary size %d", n_vocab);
  if (!isfinite(p->temperature) || p->temperature < 0)
    return floe_err(err, errlen, FLOE_E_INVALID, "temperature must be a finite number >= 0 (got %g)", (double)p->temperature);
  if (!(p->top_p > 0.0f && p->top_p <= 1.0f) && !(p->top_p > 1.0f && isfinite(p->top_p)))
    return floe_err(err, errlen, FLOE_E_INVALID, "top_p must be in (0, 1] (got %g)", (double)p->top_p);
  if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
    return floe_err(err, errlen, FLOE_E_INVALID, "min_p must be in [0, 1] (got %g)", (double)p->min_p);
  sampler *s = calloc(1, sizeof *s);
  if (!s) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  s->p = *p;
  s->n_vocab = n_vocab;
  s->c = malloc((size_t)n_vocab * sizeof *s->c);
  s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
  if (!s->c || !s->prob) {
    sampler_free(s);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  floe_rng_seed(&s->rng, p->seed);
  *out = s;
  return 0;
}

void sampler_free(sampler *s) {
  if (!s) return;
  free(s->c);
  free(s->prob);
  free(s);
}

int32_t sampler_argmax(const float *logits, int32_t n) {
  return (int32_t)kern_argmax(logits, n); /* first maximum, NaN never chosen, 0 if none */
}

/* Orders candidates by logit descending, then id ascending: a strict total order, so the result
 * never depends on the sort algorithm's stability. */
static int cand_cmp(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

static inline int cand_before(const cand *x, const cand *y) {
  return x->logit > y->logit || (x->logit == y->logit && x->id < y->id);
}

/* Moves the k best candidates (by cand_cmp order) into c[0..k) (unordered). */
static void quickselect(cand *c, int32_t n, int32_t k) {
  int32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    cand pivot = c[lo + (hi - lo) / 2];
    int32_t i = lo, j = hi;
    while (i <= j) {
      while (cand_before(&c[i], &pivot)) i++;
      while (cand_before(&pivot, &c[j])) j--;
      if (i <= j) {
        cand t = c[i];
        c[i] = c[j];
        c[j] = t;
        i++;
        j--;
      }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
}

bool sampler_greedy(const sampler *s) { return s->p.temperature <= 0.0f; }

/* The candidates sampler_sample draws from: s->c[0..m) with weights s->prob[0..m) summing to *tot.
 * Returns m; 0 when no logit is above -inf (the caller falls back to the argmax). */
static int32_t candidates(sampler *s, const float *logits, double *tot_out) {
  const sampler_params *p = &s->p;
  int32_t n = s->n_vocab;
  /* the largest finite logit: a +inf one is no candidate (below), so it must not set the scale
   * either (it left no candidate, and min-p then kept one it never wrote: fuzz_sampler) */
  float maxl = -INFINITY;
  for (int32_t i = 0; i < n; i++)
    if (isfinite(logits[i]) && logits[i] > maxl) maxl = logits[i];
  if (!(maxl > -INFINITY)) return 0;

  /* Candidates: finite logits; without top-k only those within 88/T of the max (exp(-88) ~ 6e-39
   * underflows float: those tokens have probability 0 anyway). */
  int32_t m = 0;
  float cut = maxl - 88.0f * p->temperature;
  for (int32_t i = 0; i < n; i++) {
    float v = logits[i];
    if (isfinite(v) && v >= cut) s->c[m++] = (cand){v, i};
  }
  if (p->top_k > 0 && p->top_k < m) {
    quickselect(s->c, m, p->top_k);
    m = p->top_k;
  }
  qsort(s->c, (size_t)m, sizeof *s->c, cand_cmp);

  /* softmax with temperature, in double for the normaliser */
  double sum = 0;
  for (int32_t i = 0; i < m; i++) {
    s->prob[i] = expf((s->c[i].logit - maxl) / p->temperature);
    sum += s->prob[i];
  }
  for (int32_t i = 0; i < m; i++) s->prob[i] = (float)(s->prob[i] / sum);

  if (p->top_p < 1.0f) {
    double cum = 0;
    int32_t keep = m;
    for (int32_t i = 0; i < m; i++) {
      cum += s->prob[i];
      if (cum >= p->top_p) {
        keep = i + 1;
        break;
      }
    }
    m = keep;
  }
  if (p->min_p > 0.0f) {
    float thr = p->min_p * s->prob[0];
    int32_t keep = 1;
    while (keep < m && s->prob[keep] >= thr) keep++;
    m = keep;
  }
  double tot = 0;
  for (int32_t i = 0; i < m; i++) tot += s->prob[i];
  *tot_out = tot;
  return m;
}

int32_t sampler_sample(sampler *s, const float *logits) {
  if (sampler_greedy(s)) return sampler_argmax(logits, s->n_vocab);
  double tot;
  const int32_t m = candidates(s, logits, &tot);
  if (m == 0) return sampler_argmax(logits, s->n_vocab);
  double r = (double)(floe_rng_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * tot;
  double acc = 0;
  for (int32_t i = 0; i < m; i++) {
    acc += s->prob[i];
    if (r < acc) return s->c[i].id;
  }
  return s->c[m - 1].id;
}

void sampler_probs(sampler *s, const float *logits, float *probs) {
  const int32_t n = s->n_vocab;
  memset(probs, 0, (size_t)n * sizeof *probs);
  double tot = 0;
  const int32_t m = sampler_greedy(s) ? 0 : candidates(s, logits, &tot);
  if (m == 0 || !(tot > 0)) {
    probs[sampler_argmax(logits, n)] = 1.0f;
    return;
  }
  for (int32_t i = 0; i < m; i++) probs[s->c[i].id] = (float)(s->prob[i] / tot);
}

int32_t sampler_draw(sampler *s, const float *probs, int32_t n) {
  double tot = 0;
  int32_t last = -1;
  for (int32_t i = 0; i < n; i++)
    if (probs[i] > 0) {
      tot += probs[i];
      last = i;
    }
  if (last < 0) return 0;
  const double r = (double)(floe_rng_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * tot;
  double acc = 0;
  for (int32_t i = 0; i < n; i++)
    if (probs[i] > 0) {
      acc += probs[i];
      if (r < acc) return i;
    }
  return last;
}

int32_t sampler_spec_step(sampler *s, const float *p, const float *q, int32_t n, int32_t d, float *tmp, bool *accepted) {
  const double u = (double)(floe_rng_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0);
  /* accept with probability min(1, p/q): u < p/q  <=>  u*q < p (q > 0: d was drawn from q) */
  if (d >= 0 && d < n && q[d] > 0 && u * (double)q[d] < (double)p[d]) {
    *accepted = true;
    return d;
  }
  *accepted = false;
  bool any = false;
  for (int32_t i = 0; i < n; i++) {
    const float r = p[i] - q[i];
    tmp[i] = r > 0 ? r : 0.0f;
    any |= tmp[i] > 0;
  }
  return sampler_draw(s, any ? tmp : p, n);
}
