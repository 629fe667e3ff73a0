/* floe perplexity against an independent computation, and the logits-file reader.
 *
 * 1. Hand-checkable statistics: log_softmax, KLD, the standard error of a mean.
 * 2. The default model on a held-out text (tests/fixtures/text): this test evaluates every window
 *    whole through the public API (one floe_session_eval with all logits, where the CLI slices the
 *    second half), computes the NLL of the second half with its own log-sum-exp in long double and
 *    its own two-pass variance, and compares with `floe perplexity --json`.
 * 3. Logits files: one written by the CLI opens; truncated, padded, wrong-magic, out-of-vocabulary
 *    and non-log-probability variants are refused with one line. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval/eval.h"
#include "floe.h"
#include "test.h"

#define CTX 128
#define CHUNKS 3

static void stats_by_hand(void) {
  SECTION("statistics by hand");
  const float lg[2] = {0.0f, logf(3.0f)};
  float lp[2];
  const int32_t am = eval_log_softmax(lg, 2, lp);
  CHECK(am == 1, "argmax of {0, ln 3} is 1 (got %d)", am);
  CHECK(fabs(lp[0] - (-log(4.0))) < 1e-6 && fabs(lp[1] - (log(3.0) - log(4.0))) < 1e-6,
        "log_softmax {0, ln 3} = {-ln 4, ln 3/4} (got %g %g)", lp[0], lp[1]);
  CHECK(eval_kld(lp, lp, 2) == 0.0, "KLD of a row with itself is exactly 0");
  const float q[2] = {(float)log(0.5), (float)log(0.5)};
  const double want = 0.25 * log(0.25 / 0.5) + 0.75 * log(0.75 / 0.5);
  CHECK(fabs(eval_kld(lp, q, 2) - want) < 1e-6, "KLD({1/4, 3/4} || {1/2, 1/2}) = %g (got %g)", want, eval_kld(lp, q, 2));
  eval_acc a = {0};
  for (int i = 1; i <= 4; i++) eval_acc_add(&a, i);
  CHECK(fabs(eval_acc_mean(&a) - 2.5) < 1e-12, "mean of 1..4 is 2.5");
  CHECK(fabs(eval_acc_err(&a) - sqrt(5.0 / 3.0) / 2.0) < 1e-12, "standard error of 1..4 is sqrt(5/3)/2 (got %g)",
        eval_acc_err(&a));
  const float bad[3] = {-1.0f, 0.5f, -2.0f}, nan_row[2] = {-1.0f, NAN}, ok[2] = {-0.0f, -3.0f};
  CHECK(!eval_row_ok(bad, 3) && !eval_row_ok(nan_row, 2) && eval_row_ok(ok, 2), "row check: > 0 and NaN refused");
}

/* Runs cmd, returns its last stdout line (static buffer) or NULL. */
static const char *last_line(const char *cmd) {
  static char line[4096];
  char buf[4096];
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  line[0] = 0;
  while (fgets(buf, sizeof buf, p)) snprintf(line, sizeof line, "%s", buf);
  return pclose(p) == 0 ? line : NULL;
}

static double json_num(const char *s, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = s ? strstr(s, k) : NULL;
  return p ? strtod(p + strlen(k), NULL) : NAN;
}

static void against_api(const char *bin, const char *model, const char *text_path, const char *save) {
  SECTION("default model, %d windows of %d: the CLI against this test's own computation", CHUNKS, CTX);
  char err[512];
  size_t tlen = 0, n = 0;
  char *text = test_read_all(text_path, &tlen);
  CHECK(text != NULL, "read %s", text_path);
  if (!text) return;
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = model;
  floe_engine *e = NULL;
  int32_t *ids = NULL;
  if (floe_engine_open(&ep, &e, err, sizeof err) || floe_tokenize(e, text, tlen, false, &ids, &n, err, sizeof err)) {
    CHECK(0, "open and tokenize: %s", err);
    floe_engine_close(e);
    free(text);
    return;
  }
  CHECK(n >= (size_t)CTX * CHUNKS, "text has %zu tokens, at least %d", n, CTX * CHUNKS);
  floe_model_info info;
  floe_engine_info(e, &info);
  const size_t nv = (size_t)info.n_vocab;
  floe_session_params sp;
  floe_session_params_init(&sp);
  sp.n_ctx = CTX;
  floe_session *s = NULL;
  float *lg = malloc(sizeof(float) * nv * CTX);
  double nll[CHUNKS * CTX];
  int cnt = 0;
  if (!lg || floe_session_new(e, &sp, &s, err, sizeof err)) CHECK(0, "session: %s", err);
  else
    for (int c = 0; c < CHUNKS; c++) {
      floe_session_reset(s);
      if (floe_session_eval(s, ids + c * CTX, CTX, lg, true, err, sizeof err)) {
        CHECK(0, "eval: %s", err);
        break;
      }
      for (int p = CTX / 2; p < CTX - 1; p++) {
        const float *r = lg + (size_t)p * nv;
        long double mx = r[0], sum = 0;
        for (size_t i = 1; i < nv; i++) mx = r[i] > mx ? r[i] : mx;
        for (size_t i = 0; i < nv; i++) sum += expl((long double)r[i] - mx);
        nll[cnt++] = (double)(mx + logl(sum) - (long double)r[ids[c * CTX + p + 1]]);
      }
    }
  double mean = 0, var = 0;
  for (int i = 0; i < cnt; i++) mean += nll[i];
  mean /= cnt;
  for (int i = 0; i < cnt; i++) var += (nll[i] - mean) * (nll[i] - mean);
  var /= cnt - 1;
  const double ppl = exp(mean), ppl_err = ppl * sqrt(var / cnt);
  printf("this test: %d tokens, ppl %.6f +/- %.6f\n", cnt, ppl, ppl_err);
  CHECK(cnt == CHUNKS * (CTX - 1 - CTX / 2), "scored %d tokens per window", CTX - 1 - CTX / 2);
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "\"%s\" perplexity -m \"%s\" -f \"%s\" -c %d --chunks %d --json --save-logits \"%s\" 2>/dev/null",
           bin, model, text_path, CTX, CHUNKS, save);
  const char *j = last_line(cmd);
  printf("floe perplexity: %s", j ? j : "(failed)\n");
  CHECK(j && fabs(json_num(j, "ppl") - ppl) < 1e-5 * ppl, "CLI ppl %.6f = this test's %.6f", json_num(j, "ppl"), ppl);
  CHECK(j && fabs(json_num(j, "ppl_err") - ppl_err) < 1e-4 * ppl_err, "CLI ppl_err %.6f = this test's %.6f",
        json_num(j, "ppl_err"), ppl_err);
  CHECK(j && json_num(j, "tokens") == cnt, "CLI tokens %g = %d", json_num(j, "tokens"), cnt);
  CHECK(ppl > 1.5 && ppl < 100, "a trained coder's ppl on held-out Python is plausible (%.3f)", ppl);
  floe_session_free(s);
  free(lg);
  free(ids);
  floe_engine_close(e);
  free(text);
}

static int open_mutated(const uint8_t *buf, size_t len, char *err, size_t errlen) {
  eval_logits *l = NULL;
  const int rc = eval_logits_open_buffer(buf, len, "mutated", &l, err, errlen);
  eval_logits_close(l);
  return rc;
}

static void reader(const char *save) {
  SECTION("logits file reader");
  char err[512] = "";
  eval_logits *l = NULL;
  CHECK(eval_logits_open(save, &l, err, sizeof err) == 0, "open the CLI's file: %s", err);
  if (!l) return;
  const eval_logits_hdr *h = eval_logits_header(l);
  CHECK(h->n_ctx == CTX && h->n_chunks == CHUNKS && h->first == CTX / 2 && h->n_vocab > 0, "header: ctx %u chunks %u first %u",
        h->n_ctx, h->n_chunks, h->first);
  float *row = malloc(4ull * h->n_vocab);
  double psum = 0;
  CHECK(eval_logits_row(l, CHUNKS - 1, eval_logits_n_scored(h) - 1, row, err, sizeof err) == 0, "last row reads");
  for (uint32_t i = 0; i < h->n_vocab; i++) psum += exp(row[i]);
  CHECK(fabs(psum - 1) < 1e-4, "a row's probabilities sum to 1 (%.6f)", psum);
  CHECK(eval_logits_row(l, CHUNKS, 0, row, err, sizeof err) == FLOE_E_INVALID, "window out of range refused");
  CHECK(eval_logits_tokens(l, CHUNKS) == NULL, "tokens of a window out of range: NULL");
  size_t len = 0;
  uint8_t *buf = (uint8_t *)test_read_all(save, &len);
  CHECK(buf && len == eval_logits_file_size(h), "file size %zu = header's %llu", len,
        (unsigned long long)eval_logits_file_size(h));
  if (buf) {
    uint8_t *m = malloc(len + 4);
    memcpy(m, buf, len);
    memset(m + len, 0, 4);
    struct { const char *what; size_t len; size_t at; uint32_t val; int code; } cases[] = {
      {"truncated by one byte", len - 1, 0, 0, FLOE_E_FORMAT},
      {"padded by four bytes", len + 4, 0, 0, FLOE_E_FORMAT},
      {"empty", 0, 0, 0, FLOE_E_FORMAT},
      {"wrong magic", len, 0, 0x4c454f46u ^ 1u, FLOE_E_FORMAT},
      {"version 2", len, 8, 2, FLOE_E_UNSUPPORTED},
      {"n_vocab 0", len, 12, 0, FLOE_E_FORMAT},
      {"first = n_ctx - 1", len, 24, CTX - 1, FLOE_E_FORMAT},
      {"n_chunks 2^31 (size overflow check)", len, 20, 1u << 31, FLOE_E_FORMAT},
      {"token outside the vocabulary", len, 32 + 4 * 5, h->n_vocab, FLOE_E_FORMAT},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      uint8_t *t = malloc(len + 4);
      memcpy(t, m, len + 4);
      if (cases[k].val || cases[k].at) memcpy(t + cases[k].at, &cases[k].val, 4);
      err[0] = 0;
      const int rc = open_mutated(t, cases[k].len, err, sizeof err);
      CHECK(rc == cases[k].code && err[0] && !strchr(err, '\n'), "%s: refused (%d): %s", cases[k].what, rc, err);
      free(t);
    }
    /* a positive log-probability in the last row: opens (rows are checked when read), the row is refused */
    float one = 1.0f;
    memcpy(m + len - 4, &one, 4);
    eval_logits *b = NULL;
    CHECK(eval_logits_open_buffer(m, len, "bad-row", &b, err, sizeof err) == 0, "bad row: the file opens");
    if (b) {
      const int rc = eval_logits_row(b, CHUNKS - 1, eval_logits_n_scored(h) - 1, row, err, sizeof err);
      CHECK(rc == FLOE_E_FORMAT && !strchr(err, '\n'), "bad row refused when read: %s", err);
      eval_logits_close(b);
    }
    free(m);
  }
  free(buf);
  free(row);
  eval_logits_close(l);
  CHECK(eval_logits_open("/nonexistent/base.lgp", &l, err, sizeof err) == FLOE_E_NOTFOUND && !l, "missing file: %s", err);
}

int main(void) {
  const char *bin = getenv("FLOE_BIN"), *tmp = getenv("FLOE_TMP");
  char model[4096], save[4096];
  snprintf(model, sizeof model, "%s", test_fixture("../../models/default.gguf"));
  snprintf(save, sizeof save, "%s/test_perplexity.%d.lgp", tmp ? tmp : "/tmp", (int)getpid());
  stats_by_hand();
  if (!bin) {
    CHECK(0, "FLOE_BIN is not set");
    return TEST_DONE();
  }
  against_api(bin, model, test_fixture("text/heldout_wsgiref_util.py.txt"), save);
  reader(save);
  unlink(save);
  return TEST_DONE();
}
