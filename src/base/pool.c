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
 * mutex to broadcast only when some worker is asleep (n_sleep); completion likewise signals only a
 * sleeping caller. Each side announces that it goes to sleep (seq_cst store) before re-checking the
 * other's counter (seq_cst load) under the mutex, so a wake-up cannot be lost. A mutex on every run
 * cost 0.68 us per empty run with 2 threads, and a worker that saw the new generation while the
 * caller still held the mutex slept in the kernel. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "base/base.h"

struct floe_pool {
  int n;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  floe_pool_fn fn;
  void *ctx;
  uint64_t gen;   /* incremented per run; workers wait for a new value */
  int pending;    /* workers still running the current generation */
  int quit;
  int n_sleep;    /* workers blocked (or about to block) on cv_work */
  int caller_sleep; /* the caller is blocked (or about to block) on cv_done */
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
    /* short spin on the generation counter before blocking */
    const int spin = __atomic_load_n(&p->spin, __ATOMIC_RELAXED);
    for (int i = 0; i < spin; i++) {
      if (__atomic_load_n(&p->gen, __ATOMIC_ACQUIRE) != seen || __atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) break;
      __builtin_ia32_pause();
    }
    if (__atomic_load_n(&p->gen, __ATOMIC_SEQ_CST) == seen && !__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
      pthread_mutex_lock(&p->mu);
      __atomic_add_fetch(&p->n_sleep, 1, __ATOMIC_SEQ_CST);
      while (__atomic_load_n(&p->gen, __ATOMIC_SEQ_CST) == seen && !p->quit) pthread_cond_wait(&p->cv_work, &p->mu);
      __atomic_sub_fetch(&p->n_sleep, 1, __ATOMIC_SEQ_CST);
      pthread_mutex_unlock(&p->mu);
    }
    if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) return NULL;
    seen = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE);
    floe_pool_fn fn = p->fn;
    void *ctx = p->ctx;

    fn(ctx, ith, p->n);

    if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_SEQ_CST) == 0 && __atomic_load_n(&p->caller_sleep, __ATOMIC_SEQ_CST)) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->cv_done);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

floe_pool *floe_pool_create(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  floe_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  p->spin = POOL_SPIN;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv_work, NULL);
  pthread_cond_init(&p->cv_done, NULL);
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  if (!p->threads) {
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
  pthread_mutex_lock(&p->mu);
  __atomic_store_n(&p->quit, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv_work);
  pthread_cond_destroy(&p->cv_done);
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
  __atomic_store_n(&p->pending, p->n - 1, __ATOMIC_RELEASE);
  __atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->n_sleep, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
  }

  fn(ctx, 0, p->n);

  for (int i = 0; i < POOL_SPIN && __atomic_load_n(&p->pending, __ATOMIC_ACQUIRE); i++) __builtin_ia32_pause();
  if (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->caller_sleep, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&p->pending, __ATOMIC_SEQ_CST)) pthread_cond_wait(&p->cv_done, &p->mu);
    __atomic_store_n(&p->caller_sleep, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&p->mu);
  }
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
