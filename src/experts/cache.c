/* Expert cache and the stream object (see experts.h).
 *
 * Slots: n_slots fixed-size buffers in one anonymous mapping (pages become resident as slots are
 * first filled, so RSS grows to at most the cache size). map[l * n_expert + e] is the slot holding
 * expert e of layer l, or -1. A slot is FREE, LOADING (its reads are queued or in flight), READY or
 * BAD (a read failed; the next demand retries it). Pinned slots (in use by the layer being
 * computed) and LOADING slots are never evicted.
 *
 * Replacement: LRU (evict the least recently used unpinned slot) or LFU (the least frequently
 * used; frequencies are halved every n_slots demand accesses so old popularity fades; ties go to
 * the least recent), both approximated by sampling (as redis does): the victim is the best of 32
 * random slots, a full scan only when none of those can be evicted. A full scan per miss was the
 * first version: with 11k slots (20 GB) it cost ~1.5 s per token in cache misses over the slot
 * headers; sampling keeps a miss at a few microseconds.
 *
 * Counters: hits (ready in the cache), in-flight hits (a prefetch was already reading it), misses
 * (a demand read), per layer and in total; prefetch reads issued / used / evicted unused; bytes
 * read; time the evaluating thread waited for demand reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "experts/experts.h"

enum { SLOT_FREE = 0, SLOT_LOADING, SLOT_READY, SLOT_BAD };

typedef struct xs_slot {
  int32_t key;   /* l * n_expert + e, or -1 */
  uint8_t state;
  uint8_t pf;    /* prefetch kind that loaded it, until a demand uses it */
  int32_t pins;
  uint64_t last, freq;
  int n_req, n_left, status;
  uint64_t ptr[XS_MAX_PARTS];
  xio_req req[XS_MAX_PARTS];
  floe_mat mats[3];
  uint8_t *mem;
} xs_slot;

struct xstream {
  xs_store *st;
  xio *io;
  xs_params p;
  uint8_t *arena;
  size_t arena_bytes;
  xs_slot *slots;
  int64_t n_slots;
  int32_t *map;
  int32_t *free_list;
  int64_t n_free;
  uint64_t tick, lfu_count, rng;
  xs_stats stats;
  xs_layer_stats *lstats;
  /* prefetch bookkeeping (prefetch.c) */
  int32_t *pred;     /* [n_layer][3][n_expert] predicted sets (kind 0 = union) */
  int32_t *pred_n;   /* [n_layer][3] */
  int32_t *prev;     /* [n_layer][n_used] last token's selection */
  int32_t *prev_n;   /* [n_layer] */
  pthread_mutex_t mu; /* one evaluation at a time */
  /* roofline accounting of the evaluation in progress (xs_lock .. xs_unlock) */
  double t_eval0, t_first_read, busy_base;
  /* background population of the arena */
  pthread_t pf_th;
  bool pf_on;
  int pf_stop;       /* atomic */
  double pf_secs;    /* atomic store when done */
};

/* prefetch.c reaches the bookkeeping arrays through these */
int32_t *xs__pred(xstream *x, int l, int kind) { return x->pred + ((size_t)l * 3 + (size_t)kind) * (size_t)x->st->n_expert; }
int32_t *xs__pred_n(xstream *x, int l, int kind) { return x->pred_n + (size_t)l * 3 + (size_t)kind; }
int32_t *xs__prev(const xstream *x, int l, int32_t **n) {
  *n = x->prev_n + l;
  return x->prev + (size_t)l * (size_t)x->st->n_used;
}
xs_stats *xs__stats(xstream *x) { return &x->stats; }

/* Populates the arena in the background, ascending (the free list hands out low slots first), in
 * 64 MiB steps, with MADV_POPULATE_WRITE: page tables filled and pages zeroed without touching
 * any byte, so it may run while reads land in slots already in use (a store of zeros would race
 * with them). Without it, every slot's first fill faulted fresh pages on the evaluating thread's
 * time: the 20 GB cache of the 80B benchmark cost ~1 s of CPU per token while it filled.
 * Kernels before 5.14 refuse the advice (EINVAL): the thread stops and first touch remains. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static void *prefault_main(void *arg) {
  xstream *x = arg;
  const double t0 = floe_time_s();
  const size_t step = (size_t)64 << 20;
  bool ok = true;
  for (size_t o = 0; o < x->arena_bytes && !__atomic_load_n(&x->pf_stop, __ATOMIC_RELAXED); o += step) {
    const size_t n = x->arena_bytes - o < step ? x->arena_bytes - o : step;
    if (madvise(x->arena + o, n, MADV_POPULATE_WRITE) && errno != EINTR && errno != EAGAIN) {
      ok = false;
      break;
    }
  }
  double d = ok ? floe_time_s() - t0 + 1e-9 : -1; /* -1: refused (old kernel) */
  __atomic_store(&x->pf_secs, &d, __ATOMIC_RELEASE);
  return NULL;
}

int xs_open(const xs_model *m, const xs_params *p, xstream **out, char *err, size_t errlen) {
  *out = NULL;
  xstream *x = calloc(1, sizeof *x);
  if (!x) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  x->p = *p;
  x->rng = 0x9e3779b97f4a7c15ull;
  pthread_mutex_init(&x->mu, NULL);
  int rc = xs_store_open(m, p->direct, &x->st, err, errlen);
  if (rc) goto fail;
  const xs_store *st = x->st;
  x->n_slots = st->slot_bytes ? (int64_t)(p->cache_bytes / st->slot_bytes) : 0;
  if (x->n_slots < st->n_used) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "expert cache of %llu bytes holds %lld experts of %llu bytes; needs %d",
                  (unsigned long long)p->cache_bytes, (long long)x->n_slots, (unsigned long long)st->slot_bytes,
                  st->n_used);
    goto fail;
  }
  x->arena_bytes = (size_t)x->n_slots * (size_t)st->slot_bytes;
  void *a = mmap(NULL, x->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) {
    x->arena = NULL;
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "cannot map an expert cache of %zu bytes", x->arena_bytes);
    goto fail;
  }
  x->arena = a;
  /* 2 MB pages where the kernel has them: 512x fewer first-touch faults while the cache fills */
  madvise(a, x->arena_bytes, MADV_HUGEPAGE);
  const size_t nk = (size_t)st->n_layer * (size_t)st->n_expert;
  x->slots = calloc((size_t)x->n_slots, sizeof *x->slots);
  x->map = malloc(nk * sizeof *x->map);
  x->free_list = malloc((size_t)x->n_slots * sizeof *x->free_list);
  x->lstats = calloc((size_t)st->n_layer, sizeof *x->lstats);
  x->pred = calloc(nk * 3, sizeof *x->pred);
  x->pred_n = calloc((size_t)st->n_layer * 3, sizeof *x->pred_n);
  x->prev = calloc((size_t)st->n_layer * (size_t)st->n_used, sizeof *x->prev);
  x->prev_n = calloc((size_t)st->n_layer, sizeof *x->prev_n);
  if (!x->slots || !x->map || !x->free_list || !x->lstats || !x->pred || !x->pred_n || !x->prev || !x->prev_n) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto fail;
  }
  for (size_t i = 0; i < nk; i++) x->map[i] = -1;
  for (int64_t i = 0; i < x->n_slots; i++) {
    x->slots[i].key = -1;
    x->slots[i].mem = x->arena + (size_t)i * (size_t)st->slot_bytes;
    x->free_list[i] = (int32_t)(x->n_slots - 1 - i);
  }
  x->n_free = x->n_slots;
  if ((rc = xio_open(p->io_kind, p->depth, p->threads, p->chunk, &x->io, err, errlen))) goto fail;
  if (!p->no_prefault && pthread_create(&x->pf_th, NULL, prefault_main, x) == 0) x->pf_on = true;
  *out = x;
  return 0;
fail:
  xs_close(x);
  return rc;
}

void xs_close(xstream *x) {
  if (!x) return;
  if (x->pf_on) {
    __atomic_store_n(&x->pf_stop, 1, __ATOMIC_RELAXED);
    pthread_join(x->pf_th, NULL);
  }
  xio_close(x->io); /* waits for reads in flight before the arena goes */
  if (x->arena) munmap(x->arena, x->arena_bytes);
  xs_store_close(x->st);
  free(x->slots);
  free(x->map);
  free(x->free_list);
  free(x->lstats);
  free(x->pred);
  free(x->pred_n);
  free(x->prev);
  free(x->prev_n);
  pthread_mutex_destroy(&x->mu);
  free(x);
}

void xs_lock(xstream *x) {
  pthread_mutex_lock(&x->mu);
  x->t_eval0 = floe_time_s();
  x->t_first_read = 0;
}

/* Serial time of this evaluation: before its first read was queued nothing was known to read;
 * after its last read completed nothing was left to read. Reads still in flight at the end (a
 * wrong prediction) leave no tail. */
void xs_unlock(xstream *x) {
  const double t1 = floe_time_s();
  double busy, last;
  xio_times(x->io, &busy, &last);
  double ser = t1 - x->t_eval0;
  if (x->t_first_read > 0) {
    if (last < x->t_first_read) last = x->t_first_read;
    ser = (x->t_first_read - x->t_eval0) + (t1 - last);
  }
  x->stats.serial_s += ser;
  x->stats.eval_s += t1 - x->t_eval0;
  x->stats.n_eval++;
  pthread_mutex_unlock(&x->mu);
}
const xs_store *xs_store_of(const xstream *x) { return x->st; }
int64_t xs_n_slots(const xstream *x) { return x->n_slots; }
const xs_params *xs_params_of(const xstream *x) { return &x->p; }
void xs_arena(const xstream *x, void **base, size_t *bytes) {
  *base = x->arena;
  *bytes = x->arena_bytes;
}
const xs_layer_stats *xs_layer_stats_of(const xstream *x) { return x->lstats; }
void xs_stats_get(const xstream *x, xs_stats *out) {
  *out = x->stats;
  double busy, last;
  xio_times(x->io, &busy, &last);
  out->disk_busy_s = busy - x->busy_base;
  __atomic_load(&x->pf_secs, &out->prefault_s, __ATOMIC_ACQUIRE);
}
void xs_stats_reset(xstream *x) {
  memset(&x->stats, 0, sizeof x->stats);
  double last;
  xio_times(x->io, &x->busy_base, &last);
  memset(x->lstats, 0, (size_t)x->st->n_layer * sizeof *x->lstats);
}

/* Binds a loaded slot's matrices to its bytes and checks a pack block's checksum. */
static void slot_loaded(xstream *x, xs_slot *s) {
  const int l = s->key / x->st->n_expert, e = s->key % x->st->n_expert;
  const xs_layer *xl = &x->st->layer[l];
  if (!s->status && !xl->block) {
    /* A part sits at its file offset modulo 4096 (the read is page-aligned); safetensors data may
     * be only 2-aligned there, where the loader would have copied it. Move such a part down to a
     * 64-byte boundary, inside its own span. (GGUF data is 32-aligned: never moved; pack parts
     * are 64-aligned.) */
    for (int p = 0; p < xl->n_part; p++)
      if (s->ptr[p] % 4) {
        const uint64_t to = s->ptr[p] / 64 * 64;
        memmove(s->mem + to, s->mem + s->ptr[p], (size_t)xl->len[p]);
        s->ptr[p] = to;
      }
  }
  for (int j = 0; j < 3; j++) s->mats[j] = xl->tmpl[j];
  for (int p = 0; p < xl->n_part && !s->status; p++) xs_part_set(&s->mats[xl->part_mat[p]], xl->part_kind[p], s->mem + s->ptr[p]);
  if (!s->status && x->p.verify && x->st->cksum && xl->block) {
    const uint64_t n = xl->part_off[xl->n_part - 1] + xl->len[xl->n_part - 1];
    if (xs_checksum(s->mem, (size_t)n) != x->st->cksum[(size_t)l * x->st->n_expert + e]) s->status = -EBADMSG;
  }
  s->state = s->status ? SLOT_BAD : SLOT_READY;
}

/* Takes completed reads; blocks until at least `min` requests are done. */
static int pump(xstream *x, int min) {
  xio_req *done[64];
  int n = xio_poll(x->io, min, done, 64);
  if (n < 0) return n;
  for (int i = 0; i < n; i++) {
    xs_slot *s = done[i]->user;
    x->stats.bytes_read += done[i]->got;
    x->stats.reads++;
    if (done[i]->status && !s->status) s->status = done[i]->status;
    if (--s->n_left == 0) slot_loaded(x, s);
  }
  return n;
}

static void evict(xstream *x, int32_t si) {
  xs_slot *s = &x->slots[si];
  if (s->key >= 0) {
    if (x->map[s->key] == si) x->map[s->key] = -1;
    if (s->state == SLOT_READY) x->stats.evictions++;
    if (s->pf) x->stats.pf_wasted++;
  }
  s->key = -1;
  s->state = SLOT_FREE;
  s->pf = 0;
}

static bool better(const xstream *x, const xs_slot *s, const xs_slot *b) {
  return x->p.policy == XS_POLICY_LFU ? (s->freq < b->freq || (s->freq == b->freq && s->last < b->last))
                                      : s->last < b->last;
}

/* A slot to fill: a free one, else the policy's victim among unpinned, settled slots; -1 if none. */
static int32_t victim(xstream *x) {
  if (x->n_free > 0) return x->free_list[--x->n_free];
  int32_t best = -1;
  for (int k = 0; k < 32; k++) { /* sampled */
    x->rng ^= x->rng << 13;
    x->rng ^= x->rng >> 7;
    x->rng ^= x->rng << 17;
    const int32_t i = (int32_t)(x->rng % (uint64_t)x->n_slots);
    const xs_slot *s = &x->slots[i];
    if (s->pins || s->state == SLOT_LOADING) continue;
    if (best < 0 || better(x, s, &x->slots[best])) best = i;
  }
  if (best >= 0) {
    evict(x, best);
    return best;
  }
  for (int64_t i = 0; i < x->n_slots; i++) {
    const xs_slot *s = &x->slots[i];
    if (s->pins || s->state == SLOT_LOADING) continue;
    if (best < 0) {
      best = (int32_t)i;
      continue;
    }
    if (better(x, s, &x->slots[best])) best = (int32_t)i;
  }
  if (best >= 0) evict(x, best);
  return best;
}

static void load(xstream *x, int32_t si, int l, int e, int prio) {
  xs_slot *s = &x->slots[si];
  const int32_t key = l * x->st->n_expert + e;
  xs_range r[XS_MAX_PARTS];
  s->key = key;
  x->map[key] = si;
  s->state = SLOT_LOADING;
  s->status = 0;
  s->n_req = s->n_left = xs_store_reads(x->st, l, e, r, s->ptr);
  if (x->t_first_read == 0) x->t_first_read = floe_time_s();
  for (int i = 0; i < s->n_req; i++) {
    const xs_file *f = &x->st->file[r[i].file];
    xio_req *q = &s->req[i];
    memset(q, 0, sizeof *q);
    q->fd = x->p.direct && f->fd_direct >= 0 ? f->fd_direct : f->fd;
    q->off = r[i].off;
    q->len = r[i].len;
    q->need = r[i].need;
    q->dst = s->mem + r[i].dst;
    q->user = s;
    xio_submit(x->io, q, prio);
  }
}

int xs_acquire(xstream *x, int l, const int32_t *es, int n, int32_t *slot) {
  const int NE = x->st->n_expert;
  for (int i = 0; i < n; i++) {
    const int32_t key = l * NE + es[i];
    int32_t si = x->map[key];
    x->tick++;
    if (si >= 0 && x->slots[si].state == SLOT_BAD) { /* retry a failed read */
      if (x->slots[si].pins == 0) {
        evict(x, si);
        x->free_list[x->n_free++] = si;
      }
      si = -1;
    }
    if (si >= 0) {
      xs_slot *s = &x->slots[si];
      if (s->state == SLOT_LOADING) {
        x->stats.inflight_hits++;
        for (int q = 0; q < s->n_req; q++) xio_promote(x->io, &s->req[q]);
      } else {
        x->stats.hits++;
      }
      x->lstats[l].hits++;
      if (s->pf) x->stats.pf_used++;
      s->pf = 0;
    } else {
      while ((si = victim(x)) < 0) /* every slot is pinned or loading: let loads finish */
        if (pump(x, 1) <= 0) {
          for (int j = 0; j < i; j++) x->slots[slot[j]].pins--;
          return FLOE_E_NOMEM;
        }
      x->stats.misses++;
      x->lstats[l].misses++;
      load(x, si, l, es[i], XIO_DEMAND);
    }
    xs_slot *s = &x->slots[si];
    s->pins++;
    s->last = x->tick;
    s->freq++;
    slot[i] = si;
  }
  if (x->p.policy == XS_POLICY_LFU && (x->lfu_count += (uint64_t)n) >= (uint64_t)x->n_slots) {
    x->lfu_count = 0;
    for (int64_t i = 0; i < x->n_slots; i++) x->slots[i].freq >>= 1;
  }
  return 0;
}

void xs_prefetch(xstream *x, int l, const int32_t *es, int n, int kind) {
  const int NE = x->st->n_expert;
  for (int i = 0; i < n; i++) {
    if (x->map[l * NE + es[i]] >= 0) continue;
    const int32_t si = victim(x);
    if (si < 0) return;
    x->stats.pf_issued++;
    load(x, si, l, es[i], XIO_PREFETCH);
    xs_slot *s = &x->slots[si];
    s->pf = (uint8_t)kind;
    s->last = ++x->tick; /* fresh: not the next victim */
  }
}

void xs_kick(xstream *x) { pump(x, 0); }

int xs_wait(xstream *x, const int32_t *slot, int n, uint8_t *ready, char *err, size_t errlen) {
  for (;;) {
    int fresh = 0;
    for (int i = 0; i < n; i++) {
      if (ready[i]) continue;
      xs_slot *s = &x->slots[slot[i]];
      if (s->state == SLOT_BAD) {
        const int l = s->key / x->st->n_expert, e = s->key % x->st->n_expert;
        const xs_file *f = &x->st->file[x->st->layer[l].file[0]];
        if (s->status == -EFBIG)
          return floe_err(err, errlen, FLOE_E_IO,
                          "%s: layer %d expert %d: the file ended before the expert's bytes (it is %llu bytes at load; "
                          "was it truncated or replaced?)",
                          f->path, l, e, (unsigned long long)f->size);
        if (s->status == -EBADMSG)
          return floe_err(err, errlen, FLOE_E_FORMAT, "%s: layer %d expert %d: checksum mismatch", f->path, l, e);
        return floe_err(err, errlen, FLOE_E_IO, "%s: layer %d expert %d: read failed: %s", f->path, l, e,
                        strerror(-s->status));
      }
      if (s->state == SLOT_READY) {
        ready[i] = 1;
        fresh++;
      }
    }
    if (fresh) return 0;
    const double t0 = floe_time_s();
    int rc = pump(x, 1);
    x->stats.io_wait_s += floe_time_s() - t0;
    if (rc < 0) return floe_err(err, errlen, FLOE_E_IO, "expert reads: the I/O engine failed");
    if (rc == 0) return floe_err(err, errlen, FLOE_E_IO, "expert reads: nothing in flight for a loading expert");
  }
}

const floe_mat *xs_mats(const xstream *x, int32_t slot) { return x->slots[slot].mats; }

void xs_release(xstream *x, const int32_t *slot, int n) {
  for (int i = 0; i < n; i++) x->slots[slot[i]].pins--;
}
