/* Thread pool (src/base/pool.c): every run reaches every thread exactly once, including when the
 * workers have fallen asleep between runs (the mutex / condition-variable path) and when there are
 * more threads than cores (the wake-ups must not be lost, or the run hangs and ctest times out),
 * with the spin before blocking set to none and to a long one (floe_pool_set_spin). */
#include <unistd.h>

#include "base/base.h"
#include "test.h"

enum { MAXT = 6, RUNS = 20000 };
static int count[MAXT];
static int bad_nth;

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
  return TEST_DONE();
}
