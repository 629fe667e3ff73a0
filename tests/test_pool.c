/* Thread pool (src/base/pool.c): every run reaches every thread exactly once, including when the
 * workers have fallen asleep between runs (the mutex / condition-variable path) and when there are
 * more threads than cores (the wake-ups must not be lost, or the run hangs and ctest times out),
 * with the spin before blocking set to none and to a long one (floe_pool_set_spin); and floe_waiter
 * alone, in a ping-pong between two threads. */
#include <pthread.h>
#include <unistd.h>

#include "base/base.h"
#include "test.h"

enum { MAXT = 6, RUNS = 20000 };
static int count[MAXT];
static int bad_nth;

/* floe_waiter ping-pong: the main thread publishes gen = r and waits for busy == 0; the partner
 * waits for a new gen, records it and clears busy */
typedef struct pingpong {
  floe_waiter w;
  uint64_t gen;
  int busy, quit, spin, rounds;
  int seen;
} pingpong;

static void *ponger(void *arg) {
  pingpong *pp = arg;
  uint64_t g = 0;
  for (;;) {
    floe_waiter_wait_change(&pp->w, &pp->gen, g, &pp->quit, pp->spin);
    if (__atomic_load_n(&pp->quit, __ATOMIC_SEQ_CST)) return NULL;
    g = __atomic_load_n(&pp->gen, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pp->seen, (int)g, __ATOMIC_SEQ_CST);
    if (g % 777 == 0) usleep(100); /* the main thread's spin runs out: it sleeps */
    __atomic_store_n(&pp->busy, 0, __ATOMIC_SEQ_CST);
    floe_waiter_wake(&pp->w);
  }
}

static void job(void *ctx, int ith, int nth) {
  int *n = ctx;
  if (nth != *n) bad_nth = 1;
  count[ith]++;
  if ((count[ith] & 2047) == 0) usleep(100); /* one thread late: the others wait for it */
}

int main(void) {
  SECTION("every run reaches every thread once, across sleeps");
  for (int n = 1; n <= MAXT; n++) {
    floe_pool *p = floe_pool_create(n);
    CHECK(p != NULL && floe_pool_size(p) == n, "pool of %d", n);
    if (!p) continue;
    for (int i = 0; i < MAXT; i++) count[i] = 0;
    bad_nth = 0;
    for (int i = 0; i < RUNS; i++) {
      floe_pool_run(p, job, &n);
      if (i % 1499 == 0) usleep(2000); /* longer than the spin: workers block on the condition variable */
    }
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= count[i] == RUNS;
    CHECK(ok && !bad_nth, "%d threads: %d runs each, nth passed right", n, RUNS);
    floe_pool_free(p);
  }
  SECTION("floe_pool_set_spin: no spin (every run wakes blocked workers) and a long spin");
  const int spins[2] = { 0, 16000 };
  for (int si = 0; si < 2; si++) {
    int n = 3;
    floe_pool *p = floe_pool_create(n);
    CHECK(p != NULL, "pool of %d", n);
    if (!p) continue;
    floe_pool_set_spin(p, spins[si]);
    for (int i = 0; i < MAXT; i++) count[i] = 0;
    bad_nth = 0;
    const int runs = 3000;
    for (int i = 0; i < runs; i++) {
      floe_pool_run(p, job, &n);
      if (i % 997 == 0) usleep(300); /* longer than the default spin, shorter than the long one */
    }
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= count[i] == runs;
    CHECK(ok && !bad_nth, "spin %d: %d runs reach each of %d threads", spins[si], runs, n);
    floe_pool_free(p);
  }

  SECTION("floe_waiter: hand-offs with no spin (every wait sleeps or finds the word set) and with a spin");
  for (int si = 0; si < 2; si++) {
    pingpong pp = { .spin = si ? 4000 : 0, .rounds = 5000 };
    floe_waiter_init(&pp.w);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, ponger, &pp) == 0, "thread started");
    int order_ok = 1;
    for (int r = 1; r <= pp.rounds; r++) {
      __atomic_store_n(&pp.busy, 1, __ATOMIC_SEQ_CST);
      __atomic_store_n(&pp.gen, (uint64_t)r, __ATOMIC_SEQ_CST); /* the partner's turn: it clears busy */
      floe_waiter_wake(&pp.w);
      floe_waiter_wait_zero(&pp.w, &pp.busy, pp.spin);
      order_ok &= __atomic_load_n(&pp.seen, __ATOMIC_SEQ_CST) == r;
      if (r % 1000 == 0) usleep(200);
    }
    __atomic_store_n(&pp.quit, 1, __ATOMIC_SEQ_CST);
    floe_waiter_wake(&pp.w);
    pthread_join(th, NULL);
    floe_waiter_destroy(&pp.w);
    CHECK(order_ok, "spin %d: %d hand-offs, each seen in order (a lost wake-up would hang here)", pp.spin, pp.rounds);
  }
  return TEST_DONE();
}
