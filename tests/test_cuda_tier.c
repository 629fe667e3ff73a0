/* Tiered experts on the GPU (model.gpu_mem, src/model/cuda_tier.c) against the fully resident GPU
 * run of the same file: bit for bit, whatever the pool size and where the misses are computed.
 *
 * For each model (the default model: Q8_0 experts, its shared expert apart; the golden qwen35moe
 * fixture in Q4_K (tests/fixtures/models/qwen35moe_k); FLOE_TEST_SYNTH_CPU:
 * tiny `floe synth` models in Q4_K / Q5_K whose shared expert joins the routed launches;
 * FLOE_TEST_SYNTH: the 35B-A3B shape):
 *  - the resident run: a prompt + continuation evaluated as one chunk (every row's logits) and
 *    the same tokens one at a time;
 *  - tiered runs with pools of the minimum (one layer's experts: every step evicts) and of twice
 *    that, with the misses copied in (FLOE_TIER_CPU=0), computed by the CPU whenever it can (=1),
 *    and the cost model's choice: both paths' logits equal the resident ones bit for bit, and the
 *    counters show that the misses really went where asked; the larger pools load a copy of the
 *    file (page-locked host memory), the smaller its mapping (pageable);
 *  - the experts streamed from the file (--mem-budget with --gpu-mem: model_stream_start on the
 *    mapping, a RAM cache of a few experts more than one token's): the misses are read from the
 *    file into the cache, then copied or computed by the CPU from there; the same bits, and the
 *    cache's counters show the reads;
 *  - a pool below the minimum is refused at load with a message naming it;
 *  - one-token steps run as recorded graph segments, cut at each layer's host decisions (recorded
 *    at the first step, replayed after: the counters say so; a chunk runs eagerly), and eagerly
 *    with FLOE_CUDA_TIER_GRAPH=0: the same bits either way.
 * Without a CUDA device: "skipped: no CUDA device", exit 77.
 * FLOE_TEST_WATCHDOG=S: after S seconds the main thread's stack is printed ("bt: OBJECT OFFSET
 * SYMBOL" lines, named by scripts/elf_sym.py) and the test aborts, so a hang says where it is. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/experts.h"
#include "floe.h"
#include "model/model.h"
#include "test.h"

/* loads path onto the GPU with gpu_mem (0: resident); msg gets the error */
static int load(const char *path, uint64_t gpu_mem, bool copy, model **m, char *msg, size_t msglen) {
  if (model_load_ex(path, copy ? FLOE_LOAD_COPY : FLOE_LOAD_MMAP, m, msg, msglen)) return -1;
  (*m)->gpu_mem = gpu_mem;
  if (model_use_backend(*m, &model_backend_cuda, 0, msg, msglen)) {
    model_free(*m);
    *m = NULL;
    return -1;
  }
  return 0;
}

/* n tokens in chunks of `chunk`; every position's logits into out [n][V] */
static int run(const model *m, const int32_t *tok, int64_t n, int64_t chunk, float *out) {
  char err[256];
  model_session *s;
  const int64_t V = m->hp.n_vocab;
  if (model_session_new(m, 512, KV_BF16, 4, &s, err, sizeof err)) {
    printf("  session: %s\n", err);
    return -1;
  }
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t c = n - i < chunk ? n - i : chunk;
    if (model_eval(s, tok + i, c, out + i * V, true, err, sizeof err)) {
      printf("  eval: %s\n", err);
      model_session_free(s);
      return -1;
    }
  }
  model_session_free(s);
  return 0;
}

/* The graph segments of a pass (decode: one token a step): recorded at the first step and replayed
 * at the later ones, unless FLOE_CUDA_TIER_GRAPH=0; a chunk (or that setting) launches none. */
static void check_graphs(const model_tier_stats *st, bool decode, const char *what) {
  const char *e = getenv("FLOE_CUDA_TIER_GRAPH");
  if (decode && !(e && e[0] == '0'))
    CHECK(st->graphs_recorded > 0 && st->graph_launches > st->graphs_recorded,
          "%s: the steps ran as graph segments (%llu recorded, %llu launched)", what,
          (unsigned long long)st->graphs_recorded, (unsigned long long)st->graph_launches);
  else
    CHECK(st->graph_launches == 0, "%s: no graph segment (%llu launched)", what, (unsigned long long)st->graph_launches);
}

static int64_t rows_differ(const float *a, const float *b, int64_t n, int64_t V) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; i++) d += memcmp(a + i * V, b + i * V, (size_t)V * 4) != 0;
  return d;
}

/* The pool of min_slots experts with the routed experts streamed from the file through a RAM
 * cache of K + 2 experts (a chunk's experts come in several groups), CPU mode `mode`. */
static void test_streamed(const char *path, int64_t n, const int32_t *tok, const float *ref_p, const float *ref_d,
                          float *lg, int64_t min_slots, const char *mode) {
  char msg[512], slots[32];
  snprintf(slots, sizeof slots, "%lld", (long long)min_slots);
  setenv("FLOE_TIER_SLOTS", slots, 1);
  setenv("FLOE_TIER_CPU", mode, 1);
  const bool ra = mode[0] != '0'; /* the router's read-ahead (opt-in) with two of the three modes */
  setenv("FLOE_TIER_READAHEAD", ra ? "1" : "0", 1);
  model *mt = NULL;
  int rc = load(path, (uint64_t)256 << 30, false, &mt, msg, sizeof msg);
  unsetenv("FLOE_TIER_READAHEAD");
  CHECK(rc == 0, "streamed: tiered load (cpu %s)%s%s", mode, rc ? ": " : "", rc ? msg : "");
  if (rc) return;
  const int64_t V = mt->hp.n_vocab, K = mt->hp.n_expert_used;
  xs_store *st = NULL;
  rc = model_store_open(mt, false, &st, msg, sizeof msg);
  CHECK(rc == 0, "streamed: the expert store opens%s%s", rc ? ": " : "", rc ? msg : "");
  if (!rc) {
    xs_params xp = { 0 };
    xp.cache_bytes = (uint64_t)(K + 2) * st->slot_bytes;
    xp.io_kind = XIO_AUTO;
    xp.policy = XS_POLICY_LRU;
    xp.prefetch = XS_PF_NEXT | XS_PF_PREV; /* both read-aheads (host_prefetch) */
    xp.depth = 8;
    xp.threads = 2;
    xp.chunk = 512 * 1024;
    xs_store_close(st);
    rc = model_stream_start(mt, &xp, msg, sizeof msg);
    CHECK(rc == 0, "streamed: the expert cache starts%s%s", rc ? ": " : "", rc ? msg : "");
  }
  for (int pass = 0; pass < 2 && !rc; pass++) {
    model_tier_stats_reset(mt);
    xs_stats_reset(mt->xs);
    rc = run(mt, tok, n, pass ? 1 : n, lg);
    const int64_t d = rc ? -1 : rows_differ(lg, pass ? ref_d : ref_p, n, V);
    model_tier_stats ts;
    xs_stats xst;
    model_tier_stats_get(mt, &ts);
    xs_stats_get(mt->xs, &xst);
    CHECK(rc == 0 && d == 0, "streamed, cpu %s, %s: logits == the resident run's (%lld rows differ); copied %llu, "
          "cpu %llu; cache: %llu reads, %llu hits, %llu misses, %llu prefetched", mode, pass ? "decode" : "one chunk",
          (long long)d, (unsigned long long)ts.copies, (unsigned long long)ts.cpu, (unsigned long long)xst.reads,
          (unsigned long long)xst.hits, (unsigned long long)xst.misses, (unsigned long long)xst.pf_issued);
    CHECK(xst.bytes_read > 0 && xst.misses > 0, "streamed, cpu %s, %s: experts read from the file (%llu bytes)", mode,
          pass ? "decode" : "one chunk", (unsigned long long)xst.bytes_read);
    if (pass == 1) /* decode: with the read-ahead, the next layer's router prediction came back with each selection */
      CHECK((ra ? xst.pred_n[XS_PF_NEXT] > 0 : xst.pred_n[XS_PF_NEXT] == 0) && xst.pred_n[XS_PF_PREV] > 0,
            "streamed, cpu %s, decode: read-ahead by the router's prediction %s (%llu predicted, %llu used), by the "
            "previous token's (%llu, %llu)", mode, ra ? "on" : "off", (unsigned long long)xst.pred_n[XS_PF_NEXT],
            (unsigned long long)xst.pred_hit[XS_PF_NEXT], (unsigned long long)xst.pred_n[XS_PF_PREV],
            (unsigned long long)xst.pred_hit[XS_PF_PREV]);
    if (mode[0] == '1' && pass == 1)
      CHECK(ts.cpu > 0 && ts.copies == 0, "streamed, cpu 1, decode: every miss on the CPU (%llu; copied %llu)",
            (unsigned long long)ts.cpu, (unsigned long long)ts.copies);
    if (mode[0] == '0') CHECK(ts.cpu == 0, "streamed, cpu 0: no expert on the CPU");
    check_graphs(&ts, pass == 1, pass ? "streamed, decode" : "streamed, one chunk");
  }
  model_free(mt);
}

/* FLOE_TIER_PF=1: decode with the next layer's predicted experts copied ahead (a copy in
 * page-locked memory, twice the minimum pool): the same bits, and prefetches happened. */
static void test_prefetch(const char *path, int64_t n, const int32_t *tok, const float *ref_d, float *lg,
                          int64_t min_slots) {
  char msg[512], slots[32];
  snprintf(slots, sizeof slots, "%lld", (long long)(2 * min_slots));
  setenv("FLOE_TIER_SLOTS", slots, 1);
  setenv("FLOE_TIER_CPU", "0", 1);
  setenv("FLOE_TIER_PF", "1", 1);
  model *mt = NULL;
  int rc = load(path, (uint64_t)256 << 30, true, &mt, msg, sizeof msg);
  unsetenv("FLOE_TIER_PF");
  CHECK(rc == 0, "prefetch: tiered load%s%s", rc ? ": " : "", rc ? msg : "");
  if (rc) return;
  model_tier_stats_reset(mt);
  rc = run(mt, tok, n, 1, lg);
  const int64_t d = rc ? -1 : rows_differ(lg, ref_d, n, mt->hp.n_vocab);
  model_tier_stats st;
  model_tier_stats_get(mt, &st);
  CHECK(rc == 0 && d == 0, "prefetch, decode: logits == the resident run's (%lld rows differ); hits %llu, copied %llu, "
        "prefetched %llu, used %llu", (long long)d, (unsigned long long)st.hits, (unsigned long long)st.copies,
        (unsigned long long)st.pf_issued, (unsigned long long)st.pf_used);
  check_graphs(&st, true, "prefetch, decode");
  CHECK(st.pf_issued > 0 && st.pf_used <= st.pf_issued, "prefetch: experts were copied ahead (%llu, %llu used)",
        (unsigned long long)st.pf_issued, (unsigned long long)st.pf_used);
  model_free(mt);
}

/* FLOE_CUDA_TIER_GRAPH=0: decode steps enqueued eagerly (no segment recorded), CPU mode `mode`,
 * the minimum pool: the same bits as the resident run (and so as the segmented steps above). */
static void test_eager(const char *path, int64_t n, const int32_t *tok, const float *ref_d, float *lg,
                       int64_t min_slots, const char *mode) {
  char msg[512], slots[32], what[64];
  snprintf(slots, sizeof slots, "%lld", (long long)min_slots);
  snprintf(what, sizeof what, "eager steps, cpu %s, decode", mode);
  setenv("FLOE_TIER_SLOTS", slots, 1);
  setenv("FLOE_TIER_CPU", mode, 1);
  setenv("FLOE_CUDA_TIER_GRAPH", "0", 1);
  model *mt = NULL;
  int rc = load(path, (uint64_t)256 << 30, true, &mt, msg, sizeof msg);
  CHECK(rc == 0, "%s: tiered load%s%s", what, rc ? ": " : "", rc ? msg : "");
  if (!rc) {
    model_tier_stats_reset(mt);
    rc = run(mt, tok, n, 1, lg);
    const int64_t d = rc ? -1 : rows_differ(lg, ref_d, n, mt->hp.n_vocab);
    model_tier_stats st;
    model_tier_stats_get(mt, &st);
    CHECK(rc == 0 && d == 0, "%s: logits == the resident run's (%lld rows differ); copied %llu, cpu %llu", what,
          (long long)d, (unsigned long long)st.copies, (unsigned long long)st.cpu);
    check_graphs(&st, true, what);
    model_free(mt);
  }
  unsetenv("FLOE_CUDA_TIER_GRAPH");
}

/* full: every pool size and CPU mode; else the minimum pool with the cost model's choice only (a
 * large model: each load page-locks its experts) */
static void test_model(const char *path, int64_t n, bool full) {
  SECTION("%s", path);
  char msg[512];
  model *mr = NULL;
  CHECK(load(path, 0, false, &mr, msg, sizeof msg) == 0, "%s: resident on the GPU", path);
  if (!mr) {
    printf("  %s\n", msg);
    return;
  }
  const int64_t V = mr->hp.n_vocab, NE = mr->hp.n_expert, K = mr->hp.n_expert_used, mr_layers = mr->hp.n_layer;
  int64_t min_slots = (int64_t)MODEL_MAX_BATCH * K < NE ? (int64_t)MODEL_MAX_BATCH * K : NE;
  int32_t *tok = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
  float *ref_p = malloc((size_t)(n * V) * 4), *ref_d = malloc((size_t)(n * V) * 4);
  float *lg = malloc((size_t)(n * V) * 4);
  int rc = run(mr, tok, n, n, ref_p);
  if (!rc) rc = run(mr, tok, n, 1, ref_d);
  CHECK(rc == 0 && rows_differ(ref_p, ref_d, n, V) == 0, "resident: decode rows == prefill rows");
  model_free(mr);
  const uint64_t big = (uint64_t)256 << 30; /* the pool is capped by FLOE_TIER_SLOTS below */
  const char *modes[3] = { "0", "1", "-1" };
  for (int sz = 0; sz < (full ? 2 : 1); sz++)
    for (int mi = full ? 0 : 2; mi < 3; mi++) {
      char slots[32];
      snprintf(slots, sizeof slots, "%lld", (long long)(min_slots * (sz + 1)));
      setenv("FLOE_TIER_SLOTS", slots, 1);
      setenv("FLOE_TIER_CPU", modes[mi], 1);
      model *mt = NULL;
      printf("  %s slots, cpu %s: loading\n", slots, modes[mi]);
      /* the larger pools from a copy in memory (page-locked), the smaller from the file's mapping */
      const bool copy = sz == 1 || !full;
      rc = load(path, big, copy, &mt, msg, sizeof msg);
      CHECK(rc == 0, "tiered load (%s slots, cpu %s)%s%s", slots, modes[mi], rc ? ": " : "", rc ? msg : "");
      if (rc) continue;
      model_tier_stats st0;
      model_tier_stats_get(mt, &st0);
      CHECK(st0.pinned == copy, "%s slots: host memory %s (a %s)", slots, st0.pinned ? "page-locked" : "pageable",
            copy ? "copy: page-locked" : "mapping: pageable");
      model_tier_stats st;
      for (int pass = 0; pass < 2; pass++) {
        model_tier_stats_reset(mt);
        printf("  %s slots, cpu %s: %s\n", slots, modes[mi], pass ? "decode" : "one chunk");
        rc = run(mt, tok, n, pass ? 1 : n, lg);
        const int64_t d = rc ? -1 : rows_differ(lg, pass ? ref_d : ref_p, n, V);
        model_tier_stats_get(mt, &st);
        CHECK(rc == 0 && d == 0, "%s slots, cpu %s, %s: logits == the resident run's (%lld rows differ); lookups %llu, "
              "hits %llu, copied %llu, cpu %llu", slots, modes[mi], pass ? "decode" : "one chunk", (long long)d,
              (unsigned long long)st.lookups, (unsigned long long)st.hits, (unsigned long long)st.copies,
              (unsigned long long)st.cpu);
        CHECK(st.lookups == st.hits + st.copies + st.cpu && st.lookups > 0, "every lookup is counted once");
        check_graphs(&st, pass == 1, pass ? "decode" : "one chunk");
        if (sz == 0) CHECK(st.copies + st.cpu > 0, "a minimum pool misses");
        if (mi == 0 || pass == 0) CHECK(st.cpu == 0, "cpu %s, %s: no expert on the CPU", modes[mi],
                                        pass ? "decode" : "a chunk");
        if (mi == 1 && pass == 1 && sz == 0)
          CHECK(st.cpu > 0 && st.copies == 0, "cpu 1, decode: every miss on the CPU (%llu; copied %llu)",
                (unsigned long long)st.cpu, (unsigned long long)st.copies);
      }
      printf("  %s slots, cpu %s: pool %.1f MiB, %lld slots, host memory %s, PCIe %.1f GB/s, device memory %.0f GB/s, "
             "CPU expert %.1f us\n", slots, modes[mi], (double)st.pool_bytes / 1048576.0, (long long)st.slots,
             st.pinned ? "pinned" : "pageable", st.pcie_gbps, st.gpu_gbps, st.cpu_expert_s * 1e6);
      CHECK(st.pcie_gbps > 0 && st.gpu_gbps > st.pcie_gbps, "the cost model's copy rates were measured (PCIe %.1f, "
            "device memory %.0f GB/s)", st.pcie_gbps, st.gpu_gbps);
      model_free(mt);
    }
  for (int mi = 0; mi < 3; mi++) test_streamed(path, n, tok, ref_p, ref_d, lg, min_slots, modes[mi]);
  /* twice the minimum pool holding (nearly) every routed expert misses nothing, so nothing is
   * prefetched: the qwen35moe_k fixture, 2 layers of 8 experts (its 16 slots hold 14 of them) */
  if (2 * min_slots < mr_layers * NE) test_prefetch(path, n, tok, ref_d, lg, min_slots);
  else printf("  prefetch: not tested (twice the minimum pool, %lld slots, for %lld routed experts: nothing would "
              "miss)\n", (long long)(2 * min_slots), (long long)(mr_layers * NE));
  test_eager(path, n, tok, ref_d, lg, min_slots, "0");
  if (full) test_eager(path, n, tok, ref_d, lg, min_slots, "1");
  char slots[32];
  snprintf(slots, sizeof slots, "%lld", (long long)(min_slots - 1));
  setenv("FLOE_TIER_SLOTS", slots, 1);
  model *mt = NULL;
  rc = load(path, big, false, &mt, msg, sizeof msg);
  CHECK(rc != 0 && strstr(msg, "expert pool"), "a pool below one layer's experts is refused: %s", rc ? msg : "(loaded)");
  model_free(mt);
  unsetenv("FLOE_TIER_SLOTS");
  unsetenv("FLOE_TIER_CPU");
  free(tok);
  free(ref_p);
  free(ref_d);
  free(lg);
}

/* the watchdog: SIGUSR1 to the main thread, whose handler prints its stack */
static void on_usr1(int sig) {
  (void)sig;
  void *pc[48];
  const int n = backtrace(pc, 48);
  for (int i = 0; i < n; i++) {
    Dl_info di;
    char line[512];
    int len;
    if (dladdr(pc[i], &di) && di.dli_fname)
      len = snprintf(line, sizeof line, "bt: %s 0x%lx %s\n", di.dli_fname,
                     (unsigned long)((uintptr_t)pc[i] - (uintptr_t)di.dli_fbase), di.dli_sname ? di.dli_sname : "?");
    else
      len = snprintf(line, sizeof line, "bt: ? %p ?\n", pc[i]);
    if (len > 0) (void)!write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
  }
}

static pthread_t g_main;

static void *watchdog(void *arg) {
  sleep((unsigned)(uintptr_t)arg);
  fprintf(stderr, "watchdog: still running after %u s, the main thread's stack:\n", (unsigned)(uintptr_t)arg);
  pthread_kill(g_main, SIGUSR1);
  sleep(2);
  abort();
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines reach a log even when the test is killed */
  const char *wd = getenv("FLOE_TEST_WATCHDOG");
  if (wd && atoi(wd) > 0) {
    pthread_t th;
    g_main = pthread_self();
    signal(SIGUSR1, on_usr1);
    if (pthread_create(&th, NULL, watchdog, (void *)(uintptr_t)atoi(wd)) == 0) pthread_detach(th);
  }
  if (model_cuda_devices() <= 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  const char *sc = getenv("FLOE_TEST_SYNTH_CPU"), *synth = getenv("FLOE_TEST_SYNTH");
  /* the default model under ctest; the synth models alone when named */
  if (!(sc && *sc) && !(synth && *synth)) {
    test_model(test_fixture("../../models/default.gguf"), 40, true);
    test_model(test_fixture("models/qwen35moe_k/model-q4_k.gguf"), 24, true); /* the HF fixture in Q4_K */
  }
  if (sc && *sc) {
    char *list = strdup(sc), *save = NULL;
    for (char *f = strtok_r(list, " ", &save); f; f = strtok_r(NULL, " ", &save)) test_model(f, 24, true);
    free(list);
  }
  if (synth && *synth) test_model(synth, 16, false);
  return TEST_DONE();
}
