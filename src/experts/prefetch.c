/* Prefetch predictions and their accounting (see experts.h).
 *
 * Two predictors of the experts layer l+1 will use, both free of any effect on the output (they
 * only decide which reads start early):
 *  - next-layer (XS_PF_NEXT): layer l+1's router applied to layer l's MoE input (the normed hidden
 *    state; the residual stream changes little from one layer to the next), top-k of its logits.
 *    Computed by layers.c, which owns the matmul; AiiStream's method.
 *  - previous token (XS_PF_PREV): the experts the previous token used at layer l+1.
 * Each prediction is noted here and compared with the actual selection when layer l+1 routes:
 * precision = correct / predicted, recall = correct / actual, per kind and for their union (kind 0). */
#include <string.h>

#include "experts/experts.h"

int32_t *xs__pred(xstream *x, int l, int kind);
int32_t *xs__pred_n(xstream *x, int l, int kind);
int32_t *xs__prev(const xstream *x, int l, int32_t **n);
xs_stats *xs__stats(xstream *x);

static bool has(const int32_t *v, int n, int32_t e) {
  for (int i = 0; i < n; i++)
    if (v[i] == e) return true;
  return false;
}

void xs_predict_note(xstream *x, int l, int kind, const int32_t *es, int n) {
  int32_t *p = xs__pred(x, l, kind), *pn = xs__pred_n(x, l, kind);
  int32_t *u = xs__pred(x, l, 0), *un = xs__pred_n(x, l, 0);
  *pn = 0;
  for (int i = 0; i < n; i++)
    if (!has(p, *pn, es[i])) p[(*pn)++] = es[i];
  for (int i = 0; i < n; i++)
    if (!has(u, *un, es[i])) u[(*un)++] = es[i];
}

void xs_actual_note(xstream *x, int l, const int32_t *es, int n) {
  xs_stats *st = xs__stats(x);
  for (int k = 0; k < 3; k++) {
    int32_t *p = xs__pred(x, l, k), *pn = xs__pred_n(x, l, k);
    if (*pn == 0) continue;
    int hit = 0;
    for (int i = 0; i < n; i++) hit += has(p, *pn, es[i]);
    st->pred_n[k] += (uint64_t)*pn;
    st->pred_hit[k] += (uint64_t)hit;
    st->actual_n[k] += (uint64_t)n;
    *pn = 0;
  }
  int32_t *pn, *prev = xs__prev(x, l, &pn);
  memcpy(prev, es, (size_t)n * sizeof *es);
  *pn = n;
}

int xs_prev_sel(const xstream *x, int l, int32_t *es) {
  int32_t *pn, *prev = xs__prev(x, l, &pn);
  memcpy(es, prev, (size_t)*pn * sizeof *es);
  return *pn;
}
