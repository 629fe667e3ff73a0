/* Thread pool: n-1 persistent workers plus the calling thread.
 *
 * floe_pool_run publishes (fn, ctx) under a generation counter and wakes the workers; each worker
 * runs fn(ctx, ith, nth) once per generation and the caller waits until all have finished. Workers
 * spin briefly before sleeping on the condition variable, because decode calls run() thousands of
 * times per token and a futex wake costs more than most matvecs. The spin is short (POOL_SPIN
 * pauses, ~0.1-0.3 ms): long enough to bridge the gaps between the parallel regions of one token,
 * short enough that an oversubscribed machine (more runnable threads than cores, e.g. tests run in
 * parallel) does not burn whole time slices waiting for a descheduled thread.
 *
 * Fast path: (fn, ctx) are written before the generation is bumped (release) and read after it is
 * seen (acquire), so a spinning worker starts without touching the mutex, and the caller takes the
 * mutex to broadcast only when some worker is asleep (sleepers); completion likewise wakes only a
 * sleeping caller. Each side announces that it goes to sleep (seq_cst store) before re-checking the
 * other's counter (seq_cst load) under the mutex, so a wake-up cannot be lost (floe_waiter, which
 * the model's waits use too). A mutex on every run cost 0.68 us per empty run with 2
 * threads, and a worker that saw the new generation while the caller still held the mutex slept
 * in the kernel. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "base/base.h"

/* ---- floe_waiter ---- */
void floe_waiter_init(floe_waiter *w) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->sleepers = 0;
}

void floe_waiter_destroy(floe_waiter *w) {
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

#define WAIT_UNTIL(done)                                                     \
  do {                                                                       \
    for (int i_ = 0; i_ < spin; i_++) {                                      \
      if (done) return;                                                      \
      __builtin_ia32_pause();                                                \
    }                                                                        \
    pthread_mutex_lock(&w->mu);                                              \
    __atomic_add_fetch(&w->sleepers, 1, __ATOMIC_SEQ_CST);                   \
    while (!(done)) pthread_cond_wait(&w->cv, &w->mu);                       \
    __atomic_sub_fetch(&w->sleepers, 1, __ATOMIC_SEQ_CST);                   \
    pthread_mutex_unlock(&w->mu);                                            \
  } while (0)

void floe_waiter_wait_change(floe_waiter *w, const uint64_t *gen, uint64_t seen, const int *quit, int spin) {
  WAIT_UNTIL(__atomic_load_n(gen, __ATOMIC_SEQ_CST) != seen || (quit && __atomic_load_n(quit, __ATOMIC_SEQ_CST)));
}

void floe_waiter_wait_zero(floe_waiter *w, const int *count, int spin) {
  WAIT_UNTIL(__atomic_load_n(count, __ATOMIC_SEQ_CST) == 0);
}
#undef WAIT_UNTIL

void floe_waiter_wake(floe_waiter *w) {
  if (__atomic_load_n(&w->sleepers, __ATOMIC_SEQ_CST) == 0) return;
  pthread_mutex_lock(&w->mu);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* ---- floe_pool ---- */
struct floe_pool {
  int n;
  pthread_t *threads;
  floe_waiter work, done; /* workers wait for a new generation; the caller for pending == 0 */
  floe_pool_fn fn;
  void *ctx;
  uint64_t gen;   /* incremented per run; workers wait for a new value */
  int pending;    /* workers still running the current generation */
  int quit;
  int spin;       /* pauses a worker spins before blocking (floe_pool_set_spin) */
};

#define POOL_SPIN 2000

typedef struct { floe_pool *p; int ith; } worker_arg;

static void *worker_main(void *arg_) {
  worker_arg *arg = arg_;
  floe_pool *p = arg->p;
  int ith = arg->ith;
  free(arg);
  uint64_t seen = 0;
  for (;;) {
    floe_waiter_wait_change(&p->work, &p->gen, seen, &p->quit, __atomic_load_n(&p->spin, __ATOMIC_RELAXED));
    if (__atomic_load_n(&p->quit, __ATOMIC_SEQ_CST)) return NULL;
    seen = __atomic_load_n(&p->gen, __ATOMIC_SEQ_CST);
    p->fn(p->ctx, ith, p->n);
    if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_SEQ_CST) == 0) floe_waiter_wake(&p->done);
  }
}

floe_pool *floe_pool_create(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  floe_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  p->spin = POOL_SPIN;
  floe_waiter_init(&p->work);
  floe_waiter_init(&p->done);
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  if (!p->threads) {
    floe_waiter_destroy(&p->work);
    floe_waiter_destroy(&p->done);
    free(p);
    return NULL;
  }
  for (int i = 1; i < n_threads; i++) {
    worker_arg *a = malloc(sizeof *a);
    if (!a) {
      p->n = i;
      floe_pool_free(p);
      return NULL;
    }
    a->p = p;
    a->ith = i;
    if (pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
      free(a);
      p->n = i;
      floe_pool_free(p);
      return NULL;
    }
  }
  return p;
}

void floe_pool_free(floe_pool *p) {
  if (!p) return;
  __atomic_store_n(&p->quit, 1, __ATOMIC_SEQ_CST);
  floe_waiter_wake(&p->work);
  for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
  floe_waiter_destroy(&p->work);
  floe_waiter_destroy(&p->done);
  free(p->threads);
  free(p);
}

int floe_pool_size(const floe_pool *p) { return p ? p->n : 1; }

void floe_pool_set_spin(floe_pool *p, int pauses) {
  if (p) __atomic_store_n(&p->spin, pauses > 0 ? pauses : 0, __ATOMIC_RELAXED);
}

void floe_pool_run(floe_pool *p, floe_pool_fn fn, void *ctx) {
  if (!p || p->n == 1) {
    fn(ctx, 0, 1);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  __atomic_store_n(&p->pending, p->n - 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
  floe_waiter_wake(&p->work);
  fn(ctx, 0, p->n);
  /* the caller spins as long as the workers do: a session that keeps its workers spinning between
   * regions (floe_pool_set_spin) also bridges the short serial steps between them */
  const int spin = __atomic_load_n(&p->spin, __ATOMIC_RELAXED);
  floe_waiter_wait_zero(&p->done, &p->pending, spin > POOL_SPIN ? spin : POOL_SPIN);
}

void floe_split_range(int64_t n, int64_t align, int ith, int nth, int64_t *r0, int64_t *r1) {
  if (align < 1) align = 1;
  int64_t units = (n + align - 1) / align;
  int64_t per = units / nth, extra = units % nth;
  int64_t u0 = ith * per + (ith < extra ? ith : extra);
  int64_t u1 = u0 + per + (ith < extra ? 1 : 0);
  *r0 = u0 * align < n ? u0 * align : n;
  *r1 = u1 * align < n ? u1 * align : n;
}
