/* Which routed experts a device's expert pool holds (experts.h xv_*): n_slots slots, each holding
 * one expert (layer l, expert e) or nothing, replaced least recently used first.
 *
 * Why it is separate from cache.c: cache.c owns host memory and disk reads; this file owns no
 * memory but its tables. The device backend keeps the bytes (a VRAM pool whose slot s is at
 * base + s * stride) and asks here where an expert is and which slot to overwrite.
 *
 * Holding: a slot found or taken during one layer's step stays held until xv_release_all (the
 * step's kernels read it), so a later miss of the same step never overwrites it. Held slots are
 * the most recently used, so the LRU walk from the tail meets at most the held ones before a free
 * or unheld slot.
 *
 * Invariants: map[l * n_expert + e] == s  <=>  owner[s] == l * n_expert + e; every slot is in the
 * list exactly once; the free slots are a suffix of it. */
#include <stdlib.h>

#include "base/base.h"
#include "experts/experts.h"

struct xv_slots {
  int64_t n_layer, n_expert, n_slots;
  int32_t *map;      /* [n_layer * n_expert] slot or -1 */
  int64_t *owner;    /* [n_slots] l * n_expert + e, or -1 */
  int32_t *prev, *next; /* LRU list: head = most recent */
  uint32_t *held;    /* [n_slots] epoch of the last hold */
  uint32_t epoch;
  int32_t head, tail;
};

int xv_open(int64_t n_layer, int64_t n_expert, int64_t n_slots, xv_slots **out) {
  *out = NULL;
  if (n_layer <= 0 || n_expert <= 0 || n_slots <= 0 || n_slots > INT32_MAX || n_layer * n_expert > INT32_MAX)
    return FLOE_E_INVALID;
  xv_slots *v = calloc(1, sizeof *v);
  if (!v) return FLOE_E_NOMEM;
  v->n_layer = n_layer;
  v->n_expert = n_expert;
  v->n_slots = n_slots;
  v->map = malloc((size_t)(n_layer * n_expert) * sizeof *v->map);
  v->owner = malloc((size_t)n_slots * sizeof *v->owner);
  v->prev = malloc((size_t)n_slots * sizeof *v->prev);
  v->next = malloc((size_t)n_slots * sizeof *v->next);
  v->held = calloc((size_t)n_slots, sizeof *v->held);
  if (!v->map || !v->owner || !v->prev || !v->next || !v->held) {
    xv_close(v);
    return FLOE_E_NOMEM;
  }
  for (int64_t i = 0; i < n_layer * n_expert; i++) v->map[i] = -1;
  for (int64_t s = 0; s < n_slots; s++) {
    v->owner[s] = -1;
    v->prev[s] = (int32_t)s - 1;
    v->next[s] = s + 1 < n_slots ? (int32_t)s + 1 : -1;
  }
  v->head = 0;
  v->tail = (int32_t)n_slots - 1;
  v->epoch = 1;
  *out = v;
  return 0;
}

void xv_close(xv_slots *v) {
  if (!v) return;
  free(v->map);
  free(v->owner);
  free(v->prev);
  free(v->next);
  free(v->held);
  free(v);
}

int64_t xv_n_slots(const xv_slots *v) { return v->n_slots; }

/* s to the head of the list (most recently used) and held for this step */
static void touch(xv_slots *v, int32_t s) {
  v->held[s] = v->epoch;
  if (v->head == s) return;
  const int32_t p = v->prev[s], n = v->next[s];
  if (p >= 0) v->next[p] = n;
  if (n >= 0) v->prev[n] = p;
  if (v->tail == s) v->tail = p;
  v->prev[s] = -1;
  v->next[s] = v->head;
  v->prev[v->head] = s;
  v->head = s;
}

int32_t xv_find(xv_slots *v, int64_t l, int32_t e) {
  if (l < 0 || l >= v->n_layer || e < 0 || e >= v->n_expert) return -1;
  const int32_t s = v->map[l * v->n_expert + e];
  if (s >= 0) touch(v, s);
  return s;
}

bool xv_has(const xv_slots *v, int64_t l, int32_t e) {
  return l >= 0 && l < v->n_layer && e >= 0 && e < v->n_expert && v->map[l * v->n_expert + e] >= 0;
}

int32_t xv_take(xv_slots *v, int64_t l, int32_t e, int64_t *old_l, int32_t *old_e) {
  *old_l = -1;
  *old_e = -1;
  if (l < 0 || l >= v->n_layer || e < 0 || e >= v->n_expert) return -1;
  const int64_t key = l * v->n_expert + e;
  if (v->map[key] >= 0) { /* already there: a find */
    touch(v, v->map[key]);
    return v->map[key];
  }
  int32_t s = v->tail;
  while (s >= 0 && v->held[s] == v->epoch) s = v->prev[s];
  if (s < 0) return -1; /* every slot is read by this step */
  if (v->owner[s] >= 0) {
    *old_l = v->owner[s] / v->n_expert;
    *old_e = (int32_t)(v->owner[s] % v->n_expert);
    v->map[v->owner[s]] = -1;
  }
  v->owner[s] = key;
  v->map[key] = s;
  touch(v, s);
  return s;
}

/* A free slot goes to the tail, not held: free slots stay a suffix of the list (used ones are
 * always moved to the head), so a take uses every free slot before it evicts. */
void xv_forget(xv_slots *v, int32_t s) {
  if (s < 0 || s >= v->n_slots || v->owner[s] < 0) return;
  v->map[v->owner[s]] = -1;
  v->owner[s] = -1;
  v->held[s] = 0;
  if (v->tail == s) return;
  const int32_t p = v->prev[s], n = v->next[s];
  if (p >= 0) v->next[p] = n;
  else v->head = n;
  v->prev[n] = p; /* n >= 0: s is not the tail */
  v->prev[s] = v->tail;
  v->next[s] = -1;
  v->next[v->tail] = s;
  v->tail = s;
}

void xv_release_all(xv_slots *v) {
  if (++v->epoch == 0) { /* wrapped: clear the marks once every 2^32 steps */
    for (int64_t s = 0; s < v->n_slots; s++) v->held[s] = 0;
    v->epoch = 1;
  }
}

int xv_check(const xv_slots *v) {
  int64_t seen = 0;
  bool free_seen = false;
  for (int32_t s = v->head, p = -1; s >= 0; p = s, s = v->next[s]) {
    if (v->prev[s] != p || ++seen > v->n_slots) return -1;
    if (v->owner[s] < 0) free_seen = true;
    else if (free_seen) return -1; /* a used slot after a free one */
    if (v->next[s] < 0 && v->tail != s) return -1;
    if (v->owner[s] >= 0 && v->map[v->owner[s]] != s) return -1;
  }
  if (seen != v->n_slots) return -1;
  for (int64_t k = 0; k < v->n_layer * v->n_expert; k++)
    if (v->map[k] >= 0 && v->owner[v->map[k]] != k) return -1;
  return 0;
}
