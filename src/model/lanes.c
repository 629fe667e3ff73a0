/* The CPU's resident Q4_K / Q5_K matrices repacked with the rows in the lanes (kernels.h
 * kern_k4_lanes_pack), once, after loading: the AVX-512 batched kernel then reads them as they lie,
 * so a decode row costs it what the one-row kernel's does and the rows of a batch (verify, several
 * requests, prefill) share the weight decoding. The values are the same, bit for bit.
 * Only where the CPU owns the bytes: a model read into memory (not mapped, not streamed, not a
 * pack), on the CPU backend. The token embedding (read by rows) and any matrix sharing bytes with
 * another of a different shape stay in the file's layout. FLOE_LANES=0: nothing is packed. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "format/gguf.h"
#include "kernels/cpu/kernels.h"
#include "model/backend.h"
#include "model/model.h"

typedef struct matv {
  floe_mat **w;
  size_t n, cap;
  int oom;
} matv;

static void push(matv *v, floe_mat *W) {
  if (!W->data || W->rows < 1) return;
  if (v->n == v->cap) {
    const size_t cap = v->cap ? 2 * v->cap : 256;
    floe_mat **p = realloc(v->w, cap * sizeof *p);
    if (!p) {
      v->oom = 1;
      return;
    }
    v->w = p;
    v->cap = cap;
  }
  v->w[v->n++] = W;
}

static int by_data(const void *a, const void *b) {
  const uintptr_t x = (uintptr_t)(*(floe_mat *const *)a)->data, y = (uintptr_t)(*(floe_mat *const *)b)->data;
  return x < y ? -1 : x > y;
}

static uintptr_t mat_end(const floe_mat *W) { return (uintptr_t)W->data + (size_t)W->rows * W->row_bytes; }

static int same_mat(const floe_mat *a, const floe_mat *b) {
  return a->data == b->data && a->type == b->type && a->rows == b->rows && a->cols == b->cols && a->row_bytes == b->row_bytes;
}

typedef struct pack_job {
  floe_mat **w; /* one matrix of each group to pack */
  size_t n;
  size_t next;  /* atomic */
} pack_job;

static void pack_worker(void *ctx, int ith, int nth) {
  (void)ith, (void)nth;
  pack_job *j = ctx;
  for (size_t i; (i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->n;) kern_k4_lanes_pack(j->w[i], (void *)j->w[i]->data);
}

uint64_t model_pack_lanes(model *m) {
  const char *env = getenv("FLOE_LANES");
  if ((env && env[0] == '0') || !m->copied || !m->gguf || m->xs || m->pack || m->be != &model_backend_cpu) return 0;
  const floe_hparams *hp = &m->hp;
  matv v = {0};
  for (int64_t l = 0; l < hp->n_layer + (m->mtp.on ? 1 : 0); l++) {
    model_layer *L = &m->layers[l];
    floe_mat *one[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ssm_qkvz, &L->ssm_ba, &L->ssm_qkv, &L->ssm_z, &L->ssm_b,
                       &L->ssm_alpha, &L->ssm_out, &L->router, &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_gate_inp};
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) push(&v, one[i]);
    for (int64_t e = 0; L->exp_gate && e < hp->n_expert; e++) {
      push(&v, &L->exp_gate[e]);
      push(&v, &L->exp_up[e]);
      push(&v, &L->exp_down[e]);
    }
  }
  push(&v, &m->output);
  push(&v, &m->mtp.fc);
  if (v.oom || !v.n) {
    free(v.w);
    return 0;
  }
  qsort(v.w, v.n, sizeof *v.w, by_data);
  /* groups of the same matrix (same bytes, same shape); a group is packed when it can be, lies in
   * bytes the model owns (the file's copy, or a buffer of its own), overlaps no other group and
   * not the token embedding */
  const uintptr_t map0 = (uintptr_t)m->gguf->map, map1 = map0 + m->gguf->map_size;
  const uintptr_t e0 = (uintptr_t)m->tok_embd.data, e1 = m->tok_embd.data ? mat_end(&m->tok_embd) : e0;
  floe_mat **todo = malloc(v.n * sizeof *todo);
  uint8_t *take = calloc(v.n, 1);
  size_t nt = 0;
  uint64_t bytes = 0;
  uintptr_t before = 0; /* the end of every group before */
  for (size_t i = 0, j; todo && take && i < v.n; i = j) {
    const floe_mat *W = v.w[i];
    int ok = kern_k4_lanes_ok(W);
    uintptr_t end = mat_end(W);
    for (j = i + 1; j < v.n && v.w[j]->data == W->data; j++) {
      ok &= same_mat(W, v.w[j]);
      if (mat_end(v.w[j]) > end) end = mat_end(v.w[j]);
    }
    if (before > (uintptr_t)W->data) ok = 0;                 /* overlaps a group before */
    if (j < v.n && (uintptr_t)v.w[j]->data < end) ok = 0;   /* overlaps the next group */
    if (end > before) before = end;
    if ((uintptr_t)W->data < e1 && mat_end(W) > e0) ok = 0;              /* the token embedding's bytes */
    int owned = (uintptr_t)W->data >= map0 && mat_end(W) <= map1;
    for (size_t k = 0; !owned && k < m->n_owned; k++) owned = m->owned[k] == W->data;
    if (!ok || !owned) continue;
    memset(take + i, 1, j - i);
    todo[nt++] = v.w[i];
    bytes += (uint64_t)W->rows * W->row_bytes;
  }
  if (nt) {
    const long pg = sysconf(_SC_PAGESIZE);
    const size_t len = ((size_t)m->gguf->map_size + (size_t)pg - 1) & ~((size_t)pg - 1);
    if (mprotect((void *)m->gguf->map, len, PROT_READ | PROT_WRITE) != 0) {
      nt = 0; /* keep the file's layout */
      bytes = 0;
    } else {
      pack_job job = {todo, nt, 0};
      const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
      floe_pool *pool = floe_pool_create(ncpu > 1 ? (int)(ncpu < 16 ? ncpu : 16) : 1);
      if (pool) {
        floe_pool_run(pool, pack_worker, &job);
        floe_pool_free(pool);
      } else {
        pack_worker(&job, 0, 1); /* no workers: this thread packs them all */
      }
      mprotect((void *)m->gguf->map, len, PROT_READ);
      for (size_t i = 0; i < v.n; i++)
        if (take[i]) v.w[i]->k4_lanes = 1;
      m->lanes = true;
    }
  }
  free(todo);
  free(take);
  free(v.w);
  return bytes;
}
