/* Expert streaming (src/experts): streamed runs are bit-identical to resident runs, errors are
 * clear, budgets too small are refused with the minimum.
 *
 *  1. For tiny models (GGUF qwen35moe Q4_K with 32 experts top-4, qwen3next Q8_0, qwen3moe Q4_K
 *     without a shared expert, the MLX 4-bit fixture: 9 ranges per expert), logits of a 12-token
 *     prefill (every position) and 12 decode steps equal, bit for bit, the resident run in every
 *     mode: source layout and pack, io_uring and pread, buffered and O_DIRECT, prefetch none / next /
 *     prev / both, LRU and LFU, and a cache of exactly top-k slots (constant eviction; the prefill
 *     needs more experts than the cache holds, so it runs in groups).
 *  2. An injected EIO gives FLOE_E_IO with the file, layer and errno text, and the next evaluation
 *     (the failed slot is read again) is correct; a pack truncated after load gives "ended before";
 *     a damaged block with verification on gives "checksum mismatch"; a truncated or foreign pack
 *     is refused at load.
 *  3. Public API: a budget below non-expert weights + one layer's top-k is refused at open with
 *     "needs at least"; one that leaves no room for KV + scratch is refused at session creation
 *     naming them; a workable budget gives the resident logits. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "experts/experts.h"
#include "floe.h"
#include "model/model.h"
#include "test.h"

#define NPRE 12
#define NDEC 12

static int32_t toks[NPRE + NDEC];

static int synth(const char *out, const char *args) {
  const char *bin = getenv("FLOE_BIN");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s synth %s -o %s -t 1 >/dev/null 2>&1", bin ? bin : "build/bin/floe", args, out);
  return system(cmd);
}

/* logits of NPRE positions (one call) then NDEC single steps: [(NPRE+NDEC)][V] */
static int run(model *m, float *out, char *err, size_t errlen) {
  model_session *s;
  int rc = model_session_new(m, 64, KV_F32, 2, &s, err, errlen);
  if (rc) return rc;
  const int64_t V = m->hp.n_vocab;
  int32_t t[NPRE + NDEC];
  for (int i = 0; i < NPRE + NDEC; i++) t[i] = toks[i] % (int32_t)V;
  rc = model_eval(s, t, NPRE, out, true, err, errlen);
  for (int i = 0; !rc && i < NDEC; i++) rc = model_eval(s, t + NPRE + i, 1, out + (NPRE + i) * V, true, err, errlen);
  model_session_free(s);
  return rc;
}

static int stream_load(const char *path, const xs_params *p, model **m, char *err, size_t errlen) {
  int rc = model_load(path, m, err, errlen);
  if (rc) return rc;
  if ((rc = model_stream_start(*m, p, err, errlen))) {
    model_free(*m);
    *m = NULL;
  }
  return rc;
}

static xs_params params(uint64_t cache, int io, bool direct, int pf, int policy) {
  xs_params p = { 0 };
  p.cache_bytes = cache;
  p.io_kind = io;
  p.direct = direct;
  p.prefetch = pf;
  p.policy = policy;
  p.depth = 16;
  p.threads = 4;
  p.chunk = 64 * 1024; /* several chunks per expert range */
  p.verify = true;
  return p;
}

/* Section 1 for one model: every mode against the resident logits. */
static void modes(const char *name, const char *path, const char *pack) {
  char err[512];
  model *m;
  int rc = model_load(path, &m, err, sizeof err);
  CHECK(rc == 0, "%s: load: %s", name, err);
  if (rc) return;
  const int64_t V = m->hp.n_vocab, K = m->hp.n_expert_used, NE = m->hp.n_expert;
  const size_t nf = (size_t)((NPRE + NDEC) * V);
  float *ref = malloc(nf * 4), *got = malloc(nf * 4);
  rc = run(m, ref, err, sizeof err);
  CHECK(rc == 0, "%s: resident run: %s", name, err);
  rc = model_pack_write(m, path, pack, err, sizeof err);
  CHECK(rc == 0, "%s: pack: %s", name, err);
  model_free(m);
  int bad = 0, runs = 0;
  for (int lay = 0; lay < 2; lay++)
    for (int io = XIO_URING; io <= XIO_PREAD; io++)
      for (int direct = 0; direct < 2; direct++)
        for (int pi = 0; pi < 5; pi++) /* none, next, prev, next+prev, next on the residual stream */
          for (int tiny = 0; tiny < 2; tiny++) {
            const int pf = pi < 4 ? pi : XS_PF_NEXT | XS_PF_RESID;
            const char *src = lay ? pack : path;
            xs_params p = params(0, io, direct, pf, (pf + tiny) % 2 ? XS_POLICY_LFU : XS_POLICY_LRU);
            p.no_prefault = pi == 2; /* first-touch arena in some runs, populated in the others */
            /* slot size: from a store of this layout */
            if ((rc = model_load(src, &m, err, sizeof err)) == 0) {
              xs_store *st;
              if ((rc = model_store_open(m, false, &st, err, sizeof err)) == 0) {
                p.cache_bytes = st->slot_bytes * (uint64_t)(tiny ? K : NE * m->hp.n_layer);
                xs_store_close(st);
              }
              model_free(m);
            }
            if (!rc) rc = stream_load(src, &p, &m, err, sizeof err);
            if (!rc) {
              memset(got, 0, nf * 4);
              rc = run(m, got, err, sizeof err);
              model_free(m);
            }
            runs++;
            if (rc || memcmp(ref, got, nf * 4)) {
              bad++;
              printf("  %s: %s io=%s %s prefetch=%d cache=%s: %s\n", name, lay ? "pack" : "source",
                     io == XIO_URING ? "uring" : "pread", direct ? "direct" : "buffered", pf, tiny ? "top-k" : "all",
                     rc ? err : "logits differ");
            }
          }
  CHECK(bad == 0, "%s: %d of %d streamed runs bit-identical to resident", name, runs - bad, runs);
  free(ref);
  free(got);
}

static void corrupt_at(const char *path, uint64_t off) {
  int fd = open(path, O_RDWR);
  uint8_t b = 0;
  if (fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1) {
    b ^= 0x5a;
    if (pwrite(fd, &b, 1, (off_t)off) != 1) b = 0;
  }
  if (fd >= 0) close(fd);
}

static void errors(const char *path, const char *pack) {
  char err[512];
  model *m;
  xs_params p = params(64u << 20, XIO_AUTO, false, XS_PF_NEXT, XS_POLICY_LRU);
  float *out = NULL;

  SECTION("injected EIO");
  int rc = stream_load(path, &p, &m, err, sizeof err);
  CHECK(rc == 0, "stream: %s", err);
  if (rc) return;
  const int64_t V = m->hp.n_vocab;
  out = malloc((size_t)((NPRE + NDEC) * V) * 4);
  float *ref = malloc((size_t)((NPRE + NDEC) * V) * 4);
  xio_test_inject_eio(3);
  rc = run(m, out, err, sizeof err);
  xio_test_inject_eio(0);
  CHECK(rc == FLOE_E_IO && strstr(err, "Input/output error") && strstr(err, "layer"), "EIO reported: %d %s", rc, err);
  rc = run(m, out, err, sizeof err);
  model_free(m);
  model_load(path, &m, err, sizeof err);
  run(m, ref, err, sizeof err);
  model_free(m);
  CHECK(rc == 0 && !memcmp(out, ref, (size_t)((NPRE + NDEC) * V) * 4), "after the error, a new evaluation is exact: %s",
        rc ? err : "ok");

  SECTION("pack truncated after load");
  char cp[1100], cpf[1200], cmd[3400];
  snprintf(cp, sizeof cp, "%s.trunc", pack);
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", cp, pack, cp);
  CHECK(system(cmd) == 0, "copy %s", pack);
  snprintf(cpf, sizeof cpf, "%s/%s", cp, XPACK_FILE);
  rc = stream_load(cp, &p, &m, err, sizeof err);
  CHECK(rc == 0, "stream the copy: %s", err);
  if (!rc) {
    struct stat sb;
    stat(cpf, &sb);
    CHECK(truncate(cpf, sb.st_size / 3) == 0, "truncate");
    rc = run(m, out, err, sizeof err);
    CHECK(rc == FLOE_E_IO && strstr(err, "ended before"), "read past the new end: %d %s", rc, err);
    model_free(m);
    rc = model_load(cp, &m, err, sizeof err);
    CHECK(rc == FLOE_E_FORMAT && strstr(err, "truncated"), "truncated pack refused at load: %s", err);
    if (!rc) model_free(m);
  }

  SECTION("damaged block, verification on");
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", cp, pack, cp);
  CHECK(system(cmd) == 0, "copy %s", pack);
  rc = stream_load(cp, &p, &m, err, sizeof err);
  if (!rc) {
    const xs_store *st = xs_store_of(m->xs);
    for (int e = 0; e < st->n_expert; e++) /* every expert of layer 0: one is surely used */
      corrupt_at(cpf, st->layer[0].off[(size_t)e * st->layer[0].n_part] + 100);
    rc = run(m, out, err, sizeof err);
    CHECK(rc == FLOE_E_FORMAT && strstr(err, "checksum mismatch"), "checksum: %d %s", rc, err);
    model_free(m);
  }

  SECTION("foreign pack");
  FILE *f = fopen(cpf, "wb");
  if (f) {
    fputs("definitely not a pack, but long enough to hold a header ....", f);
    fclose(f);
  }
  rc = model_load(cp, &m, err, sizeof err);
  CHECK(rc == FLOE_E_FORMAT && strstr(err, "not a floe expert pack"), "bad magic: %s", err);
  if (!rc) model_free(m);
  snprintf(cmd, sizeof cmd, "rm -rf %s", cp);
  CHECK(system(cmd) == 0, "cleanup");
  free(out);
  free(ref);
}

static void budget(const char *path) {
  char err[512];
  floe_engine_params ep;
  floe_engine *e;
  floe_session *s;
  floe_engine_params_init(&ep);
  ep.model = path;
  ep.n_threads = 2;
  ep.mem_budget = 1u << 20;
  int rc = floe_engine_open(&ep, &e, err, sizeof err);
  CHECK(rc == FLOE_E_NOMEM && strstr(err, "too small") && strstr(err, "needs at least") &&
            strstr(err, "non-expert weights"),
        "1M refused at open: %s", err);
  if (!rc) floe_engine_close(e);

  floe_session_params sp;
  floe_session_params_init(&sp);
  sp.n_ctx = 4096; /* a KV cache larger than what is left */
  ep.mem_budget = 14u << 20;
  rc = floe_engine_open(&ep, &e, err, sizeof err);
  CHECK(rc == 0, "14M opens: %s", err);
  if (!rc) {
    rc = floe_session_new(e, &sp, &s, err, sizeof err);
    CHECK(rc == FLOE_E_NOMEM && strstr(err, "KV and scratch") && strstr(err, "needs at least"),
          "session refused: %s", err);
    if (!rc) floe_session_free(s);
    floe_engine_close(e);
  }

  SECTION("public API streaming == resident");
  float *a = NULL, *b = NULL;
  for (int pass = 0; pass < 2; pass++) {
    ep.mem_budget = pass ? 64u << 20 : 0;
    sp.n_ctx = 64;
    rc = floe_engine_open(&ep, &e, err, sizeof err);
    if (!rc) rc = floe_session_new(e, &sp, &s, err, sizeof err);
    CHECK(rc == 0, "engine (budget %llu): %s", (unsigned long long)ep.mem_budget, err);
    if (rc) return;
    floe_model_info info;
    floe_engine_info(e, &info);
    const size_t n = (size_t)(NPRE * info.n_vocab);
    float *dst = malloc(n * 4);
    const double t0 = floe_time_s();
    rc = floe_session_eval(s, toks, NPRE, dst, true, err, sizeof err);
    const double wall = floe_time_s() - t0;
    CHECK(rc == 0, "eval: %s", err);
    if (pass) {
      b = dst;
      floe_session_stats st;
      floe_session_stats_get(s, &st);
      CHECK(st.serial_s > 0 && st.serial_s <= wall && st.disk_busy_s > 0,
            "roofline terms: serial %.6f s, disk busy %.6f s, eval %.6f s", st.serial_s, st.disk_busy_s, wall);
      for (int k = 0; k < 500 && st.prefault_s <= 0; k++) { /* the background population ends */
        usleep(10000);
        floe_session_stats_get(s, &st);
      }
      CHECK(st.prefault_s > 0, "cache arena populated in the background (%.6f s)", st.prefault_s);
      CHECK(info.cache_slots > 0 && info.resident_bytes > 0 && st.bytes_read > 0 && st.expert_misses > 0,
            "counters: %lld slots, %llu bytes read, %llu misses", (long long)info.cache_slots,
            (unsigned long long)st.bytes_read, (unsigned long long)st.expert_misses);
    } else {
      a = dst;
    }
    floe_session_free(s);
    floe_engine_close(e);
  }
  CHECK(a && b && !memcmp(a, b, (size_t)NPRE * 1024 * 4), "floe_session_eval logits bit-identical");
  free(a);
  free(b);
}

int main(void) {
  for (int i = 0; i < NPRE + NDEC; i++) toks[i] = (int32_t)((i * 7919 + 13) % 1000);
  char a[1024], b[1024], c[1024], pa[1024], pb[1024], pc[1024], pm[1024];
  snprintf(a, sizeof a, "%s", test_tmp("xs_q35.gguf"));
  snprintf(b, sizeof b, "%s", test_tmp("xs_q3n.gguf"));
  snprintf(c, sizeof c, "%s", test_tmp("xs_q3m.gguf"));
  snprintf(pa, sizeof pa, "%s", test_tmp("xs_q35.pack"));
  snprintf(pb, sizeof pb, "%s", test_tmp("xs_q3n.pack"));
  snprintf(pc, sizeof pc, "%s", test_tmp("xs_q3m.pack"));
  snprintf(pm, sizeof pm, "%s", test_tmp("xs_mlx.pack"));
  SECTION("synth tiny models");
  CHECK(synth(a, "--preset tiny-qwen35moe --type q4_K --set n_expert=32 --set n_expert_used=4") == 0, "synth %s", a);
  CHECK(synth(b, "--preset tiny-qwen3next --type q8_0 --set n_expert=16") == 0, "synth %s", b);
  CHECK(synth(c, "--preset tiny-qwen3moe --type q4_K --set n_expert=16 --set n_expert_used=3") == 0, "synth %s", c);
  SECTION("bit-identical: every mode");
  modes("qwen35moe q4_K", a, pa);
  modes("qwen3next q8_0", b, pb);
  modes("qwen3moe q4_K", c, pc);
  modes("mlx qwen35moe", test_fixture("mlx/qwen35moe"), pm);
  errors(a, pa);
  SECTION("budget");
  budget(a);
  return TEST_DONE();
}
