/* floe perplexity -m MODEL -f TEXT [-c CTX] [--chunks N] [--json] [--save-logits F | --kld-base F]
 *
 * Perplexity the way llama-perplexity measures it, so figures compare across engines: the text is
 * tokenized once (control-token text is not parsed), cut into non-overlapping windows of CTX
 * tokens, each window evaluated from an empty context, and only the second half of each window
 * scored (the logits at positions CTX/2 .. CTX-2 predict tokens CTX/2+1 .. CTX-1), so every scored
 * token has at least CTX/2 tokens of context. The result is exp(mean NLL), and its error the
 * standard error of the mean NLL carried through exp (ppl * se).
 *
 * --save-logits stores every scored row's log-probabilities (src/eval/eval.h gives the format);
 * --kld-base compares this run with such a file: mean KL(base || this) per token, how often both
 * pick the same top-1 token, and the perplexity difference, the figures used to judge a
 * quantization. The base must come from the same text, tokenizer and CTX: anything else is
 * refused with one line.
 *
 * Only the public API is used: one floe_session_eval of the first half (no logits), then the
 * second half in slices of SLICE rows with all logits (batched rows are bit-identical to single
 * rows, so the slicing changes nothing but memory). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "eval/eval.h"
#include "floe.h"

#define SLICE 64

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe perplexity -m MODEL -f TEXT [options]\n"
          "  -m, --model MODEL     GGUF file or model directory\n"
          "  -f, --file TEXT       text to score (tokenized as plain text)\n"
          "  -c, --ctx N           window length in tokens (default 512; with --kld-base: the base's)\n"
          "  --chunks N            score at most N windows (default: every whole window of the text)\n"
          "  --json                last line: {\"ppl\":..,\"ppl_err\":..,\"tokens\":..} (+ the KLD figures)\n"
          "  --save-logits FILE    store this run's log-probabilities as a base for --kld-base\n"
          "  --kld-base FILE       compare with a stored base: mean KLD, top-1 agreement, delta ppl\n"
          "  --exact               exact float activations (default: 8-bit activation blocks, as run)\n"
          "  --kv-f32              F32 KV cache (default BF16)\n"
          "  -t N                  threads (default: all cores)\n"
          "%s",
          cli_stream_help());
}

/* Accumulated over scored tokens. */
typedef struct ppl_stats {
  eval_acc nll;                      /* this run's -log p(token) */
  eval_acc nll_b, kld, same;         /* base's -log p, KL(base || this), top-1 agreement (0/1) */
  double cross;                      /* sum nll * nll_b, for the covariance in delta ppl's error */
} ppl_stats;

static int run_chunks(floe_session *s, const int32_t *tok, uint32_t n_chunks, const eval_logits_hdr *h, int64_t n_vocab,
                      eval_logits_writer *save, const eval_logits *base, ppl_stats *st, cli_progress *pr, char *err,
                      size_t errlen) {
  const uint32_t n_ctx = h->n_ctx, first = h->first;
  float *logits = malloc(sizeof(float) * SLICE * (size_t)n_vocab);
  float *lp = malloc(sizeof(float) * (size_t)n_vocab), *lb = malloc(sizeof(float) * (size_t)n_vocab);
  int rc = 0;
  if (!logits || !lp || !lb) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory for %d rows of %lld logits", SLICE, (long long)n_vocab);
    goto out;
  }
  const uint64_t total = (uint64_t)n_chunks * n_ctx;
  for (uint32_t c = 0; c < n_chunks && !rc; c++) {
    const int32_t *w = tok + (size_t)c * n_ctx;
    floe_session_reset(s);
    if ((rc = floe_session_eval(s, w, first, NULL, false, err, errlen))) break;
    cli_progress_update(pr, (uint64_t)c * n_ctx + first, total);
    for (uint32_t p0 = first; p0 < n_ctx - 1 && !rc; p0 += SLICE) {
      /* the last slice stops at n_ctx - 1: position n_ctx - 1 predicts nothing in this window */
      const uint32_t n = p0 + SLICE < n_ctx - 1 ? SLICE : n_ctx - 1 - p0;
      if ((rc = floe_session_eval(s, w + p0, n, logits, true, err, errlen))) break;
      for (uint32_t i = 0; i < n && !rc; i++) {
        const uint32_t pos = p0 + i;
        const int32_t next = w[pos + 1];
        const int32_t am = eval_log_softmax(logits + (size_t)i * n_vocab, (size_t)n_vocab, lp);
        if (!eval_row_ok(lp, (size_t)n_vocab)) {
          rc = floe_err(err, errlen, FLOE_E_FORMAT, "non-finite logits at window %u position %u", c, pos);
          break;
        }
        const double nll = -(double)lp[next];
        eval_acc_add(&st->nll, nll);
        if (save && (rc = eval_logits_write_row(save, lp, err, errlen))) break;
        if (base) {
          if ((rc = eval_logits_row(base, c, pos - first, lb, err, errlen))) break;
          const double nb = -(double)lb[next];
          eval_acc_add(&st->nll_b, nb);
          st->cross += nll * nb;
          eval_acc_add(&st->kld, eval_kld(lb, lp, (size_t)n_vocab));
          eval_acc_add(&st->same, eval_argmax(lb, (size_t)n_vocab) == am ? 1.0 : 0.0);
        }
      }
      cli_progress_update(pr, (uint64_t)c * n_ctx + p0 + n + (p0 + n == n_ctx - 1), total);
    }
  }
out:
  free(logits), free(lp), free(lb);
  return rc;
}

/* The base's window, vocabulary and tokens must be this run's; n_chunks is cut to the base's. */
static int check_base(const eval_logits *b, const char *path, int64_t n_vocab, uint32_t n_ctx, const int32_t *tok,
                      uint32_t *n_chunks, bool chunks_given) {
  const eval_logits_hdr *h = eval_logits_header(b);
  if ((int64_t)h->n_vocab != n_vocab)
    return cli_fail("--kld-base %s: made with a vocabulary of %u tokens, this model has %lld", path, h->n_vocab,
                    (long long)n_vocab);
  if (h->n_ctx != n_ctx) return cli_fail("--kld-base %s: made with -c %u, this run uses -c %u", path, h->n_ctx, n_ctx);
  if (h->first != n_ctx / 2)
    return cli_fail("--kld-base %s: scores from position %u, this run from %u", path, h->first, n_ctx / 2);
  if (h->n_chunks < *n_chunks) {
    if (chunks_given)
      return cli_fail("--kld-base %s: holds %u windows, --chunks asks for %u", path, h->n_chunks, *n_chunks);
    *n_chunks = h->n_chunks;
  }
  for (uint32_t c = 0; c < *n_chunks; c++) {
    const int32_t *bt = eval_logits_tokens(b, c);
    for (uint32_t i = 0; i < n_ctx; i++)
      if (bt[i] != tok[(size_t)c * n_ctx + i])
        return cli_fail("--kld-base %s: token %u of window %u differs from this run's (another text or tokenizer)",
                        path, i, c);
  }
  return 0;
}

int cmd_perplexity(int argc, char **argv) {
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  floe_session_params spar;
  floe_session_params_init(&spar);
  spar.n_checkpoints = -1; /* windows never resume a prefix */
  const char *file = NULL, *save_path = NULL, *base_path = NULL;
  long long ctx = 0, chunks = 0, nt = 0;
  bool json = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    const int so = cli_stream_option(a, v, &ep);
    if (so < 0) return 2;
    if (so > 0) {
      i += so - 1;
      continue;
    }
    if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) ep.model = argv[++i];
    else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && v) file = argv[++i];
    else if (!strcmp(a, "--save-logits") && v) save_path = argv[++i];
    else if (!strcmp(a, "--kld-base") && v) base_path = argv[++i];
    else if (!strcmp(a, "--json")) json = true;
    else if (!strcmp(a, "--exact")) spar.exact_act = true;
    else if (!strcmp(a, "--kv-f32")) spar.kv_f32 = true;
    else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx")) && v) {
      if (!cli_parse_int(v, 4, 1 << 24, &ctx)) {
        fprintf(stderr, "floe perplexity: -c needs a window of 4 .. 16777216 tokens, got '%s'\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--chunks") && v) {
      if (!cli_parse_int(v, 1, 1 << 30, &chunks)) {
        fprintf(stderr, "floe perplexity: --chunks needs a positive count, got '%s'\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "-t") && v) {
      if (!cli_parse_int(v, 1, 1024, &nt)) {
        fprintf(stderr, "floe perplexity: -t needs a thread count, got '%s'\n", v);
        return 2;
      }
      ep.n_threads = (int)nt;
      i++;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "floe perplexity: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!ep.model || !file) {
    fprintf(stderr, "floe perplexity: %s\n", !ep.model ? "missing -m MODEL" : "missing -f TEXT");
    usage(stderr);
    return 2;
  }
  char err[512];
  eval_logits *base = NULL;
  eval_logits_writer *save = NULL;
  floe_engine *e = NULL;
  floe_session *s = NULL;
  int32_t *ids = NULL;
  char *text = NULL;
  size_t tlen = 0, n_ids = 0;
  int rc = 1;
  /* the base first: a wrong file should fail before a model is loaded */
  if (base_path) {
    if (eval_logits_open(base_path, &base, err, sizeof err)) {
      cli_fail("--kld-base: %s", err);
      goto done;
    }
    if (!ctx) ctx = eval_logits_header(base)->n_ctx;
  }
  if (!ctx) ctx = 512;
  if (floe_read_file(file, (size_t)1 << 31, &text, &tlen, err, sizeof err)) {
    cli_fail("-f: %s", err);
    goto done;
  }
  if (cli_engine_open(&ep, &e, err, sizeof err)) goto done;
  cli_device_note(e);
  floe_model_info info;
  floe_engine_info(e, &info);
  if (floe_tokenize(e, text, tlen, false, &ids, &n_ids, err, sizeof err)) {
    cli_fail("%s", err);
    goto done;
  }
  if (n_ids / (size_t)ctx == 0) {
    cli_fail("%s: %zu tokens, fewer than one window of %lld (-c)", file, n_ids, ctx);
    goto done;
  }
  uint32_t n_chunks = (uint32_t)(n_ids / (size_t)ctx > (1u << 30) ? (1u << 30) : n_ids / (size_t)ctx);
  if (chunks && (uint64_t)chunks < n_chunks) n_chunks = (uint32_t)chunks;
  if (base && check_base(base, base_path, info.n_vocab, (uint32_t)ctx, ids, &n_chunks, chunks != 0)) goto done;
  eval_logits_hdr h = {EVAL_LOGITS_VERSION, (uint32_t)info.n_vocab, (uint32_t)ctx, n_chunks, (uint32_t)ctx / 2};
  if (save_path && eval_logits_create(save_path, &h, ids, &save, err, sizeof err)) {
    cli_fail("--save-logits: %s", err);
    goto done;
  }
  spar.n_ctx = ctx;
  if (floe_session_new(e, &spar, &s, err, sizeof err)) {
    cli_fail("%s", err);
    goto done;
  }
  fprintf(stderr, "floe: perplexity over %u windows of %lld tokens (%u scored each) of %zu tokens in %s\n", n_chunks,
          ctx, eval_logits_n_scored(&h), n_ids, file);
  ppl_stats st = {0};
  cli_progress pr;
  cli_progress_init(&pr, "perplexity", "tok", 1);
  const double t0 = floe_time_s();
  const int erc = run_chunks(s, ids, n_chunks, &h, info.n_vocab, save, base, &st, &pr, err, sizeof err);
  cli_progress_done(&pr);
  const double secs = floe_time_s() - t0;
  if (erc) {
    cli_fail("%s", err);
    goto done;
  }
  if (save) {
    const int src = eval_logits_finish(save, err, sizeof err);
    save = NULL;
    if (src) {
      cli_fail("--save-logits: %s", err);
      goto done;
    }
  }
  const double mean = eval_acc_mean(&st.nll), ppl = exp(mean), ppl_err = ppl * eval_acc_err(&st.nll);
  printf("tokens scored: %lld (%u windows of %lld, %.1f tok/s evaluated)\n", (long long)st.nll.n, n_chunks, ctx,
         secs > 0 ? (double)n_chunks * (double)ctx / secs : 0.0);
  printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl_err);
  double kld = 0, kld_err = 0, same = 0, same_err = 0, ppl_b = 0, dppl = 0, dppl_err = 0;
  if (base) {
    const double nb = (double)st.nll.n;
    ppl_b = exp(eval_acc_mean(&st.nll_b));
    kld = eval_acc_mean(&st.kld), kld_err = eval_acc_err(&st.kld);
    same = eval_acc_mean(&st.same), same_err = eval_acc_err(&st.same);
    /* delta method on exp: var(ppl - ppl_b) = ppl^2 v + ppl_b^2 v_b - 2 ppl ppl_b cov, of the means */
    const double ea = eval_acc_err(&st.nll), eb = eval_acc_err(&st.nll_b);
    const double cov = nb > 1 ? (st.cross - nb * mean * eval_acc_mean(&st.nll_b)) / (nb - 1) / nb : 0;
    const double var = ppl * ppl * ea * ea + ppl_b * ppl_b * eb * eb - 2 * ppl * ppl_b * cov;
    dppl = ppl - ppl_b, dppl_err = var > 0 ? sqrt(var) : 0;
    printf("Base PPL = %.4f (%s)\n", ppl_b, base_path);
    printf("Delta PPL = %.4f +/- %.5f\n", dppl, dppl_err);
    printf("Mean KLD = %.6f +/- %.6f\n", kld, kld_err);
    printf("Same top-1 = %.3f +/- %.3f %%\n", 100 * same, 100 * same_err);
  }
  if (json) {
    printf("{\"ppl\":%.6f,\"ppl_err\":%.6f,\"tokens\":%lld,\"windows\":%u,\"ctx\":%lld", ppl, ppl_err,
           (long long)st.nll.n, n_chunks, ctx);
    if (base)
      printf(",\"base_ppl\":%.6f,\"dppl\":%.6f,\"dppl_err\":%.6f,\"kld\":%.8f,\"kld_err\":%.8f,\"top1\":%.6f,\"top1_err\":%.6f",
             ppl_b, dppl, dppl_err, kld, kld_err, same, same_err);
    printf("}\n");
  }
  rc = 0;
done:
  eval_logits_abort(save);
  eval_logits_close(base);
  floe_session_free(s);
  floe_engine_close(e);
  free(ids);
  free(text);
  return rc;
}
