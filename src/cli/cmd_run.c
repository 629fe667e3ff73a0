/* floe run -m MODEL [-p TEXT | -f FILE] [--chat] [-n N] [--temp T --top-k K --top-p P --min-p M --seed S]
 *           [-t N] [-c CTX] [--ids] [--kv-f32]
 *
 * Generates text: the completion goes to stdout as it is produced (whole UTF-8 characters only),
 * timings to stderr. --ids prints the generated token ids (space separated) instead of text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "cli/cli.h"
#include "floe.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe run -m MODEL [-p TEXT | -f FILE] [options]\n"
          "  -m, --model MODEL    GGUF file or model directory\n"
          "  -p, --prompt TEXT    prompt text\n"
          "  -f, --file FILE      read the prompt from FILE\n"
          "  --chat               wrap the prompt as a user turn in the model's chat template\n"
          "  --no-think           with --chat: thinking off\n"
          "  -n N                 tokens to generate (default 128; <= 0: until end of generation)\n"
          "  --temp T             temperature (default 0 = greedy)\n"
          "  --top-k K, --top-p P, --min-p M, --seed S   sampling\n"
          "  -t N                 threads (default: all cores)\n"
          "  -c CTX               context size (default: the model's, capped at 4096)\n"
          "  --kv-f32             F32 KV cache (default BF16)\n"
          "  --mtp K              speculative decoding with the model's MTP head: K drafts per step\n"
          "                       (1..4), 0 off, -1 automatic (default; lossless either way)\n"
          "  --ids                print generated token ids instead of text\n"
          "  --stats              print expert streaming counters after the run\n"
          "%s", cli_stream_help());
}

typedef struct run_out { bool ids; int64_t n; } run_out;

static int on_token(void *user, const floe_token_event *ev) {
  run_out *o = user;
  if (o->ids) {
    if (ev->id >= 0) printf(o->n++ ? " %d" : "%d", ev->id);
  } else if (ev->text_len) {
    fwrite(ev->text, 1, ev->text_len, stdout);
  }
  fflush(stdout);
  return 0;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t k;
  while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += k;
    if (n + 1 == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        buf = NULL;
      }
      buf = nb;
    }
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool parse_num(const char *s, double *out) {
  char *end;
  *out = strtod(s, &end);
  return end != s && *end == 0;
}

int cmd_run(int argc, char **argv) {
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  floe_session_params spar;
  floe_session_params_init(&spar);
  spar.n_checkpoints = -1; /* one generation, no later prompt to resume: no recurrent-state checkpoints */
  floe_gen_params gp;
  floe_gen_params_init(&gp);
  gp.max_tokens = 128;
  const char *prompt = NULL, *file = NULL;
  bool chat = false, think = true;
  run_out out = {0};
  bool stats = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    double num;
    const int so = cli_stream_option(a, v, &ep);
    if (so < 0) return 2;
    if (so > 0) {
      i += so - 1;
      continue;
    }
#define NEEDNUM()                                                                   \
  do {                                                                              \
    if (!v || !parse_num(v, &num)) {                                                \
      fprintf(stderr, "floe run: option %s needs a number\n", a);                   \
      return 2;                                                                     \
    }                                                                               \
    i++;                                                                            \
  } while (0)
    if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) ep.model = argv[++i];
    else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && v) prompt = argv[++i];
    else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && v) file = argv[++i];
    else if (!strcmp(a, "--chat")) chat = true;
    else if (!strcmp(a, "--no-think")) think = false;
    else if (!strcmp(a, "--ids")) out.ids = true;
    else if (!strcmp(a, "--stats")) stats = true;
    else if (!strcmp(a, "--kv-f32")) spar.kv_f32 = true;
    else if (!strcmp(a, "-n")) { NEEDNUM(); gp.max_tokens = (int64_t)num; }
    else if (!strcmp(a, "--temp")) { NEEDNUM(); gp.sampling.temperature = (float)num; }
    else if (!strcmp(a, "--top-k")) { NEEDNUM(); gp.sampling.top_k = (int32_t)num; }
    else if (!strcmp(a, "--top-p")) { NEEDNUM(); gp.sampling.top_p = (float)num; }
    else if (!strcmp(a, "--min-p")) { NEEDNUM(); gp.sampling.min_p = (float)num; }
    else if (!strcmp(a, "--seed")) { NEEDNUM(); gp.sampling.seed = (uint64_t)num; }
    else if (!strcmp(a, "--mtp")) {
      NEEDNUM();
      if (num < -1 || num > 4) {
        fprintf(stderr, "floe run: --mtp must be -1 (auto), 0 (off) or 1..4\n");
        return 2;
      }
      gp.mtp = (int)num;
    }
    else if (!strcmp(a, "-t")) { NEEDNUM(); ep.n_threads = (int)num; }
    else if (!strcmp(a, "-c")) { NEEDNUM(); spar.n_ctx = (int64_t)num; }
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
    else {
      fprintf(stderr, "floe run: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef NEEDNUM
  }
  if (!ep.model || (!prompt && !file) || (prompt && file)) {
    usage(stderr);
    return 2;
  }
  char *text = NULL;
  size_t tlen = 0;
  if (file) {
    text = read_file(file, &tlen);
    if (!text) return cli_fail("cannot read prompt file '%s'", file);
  } else {
    text = strdup(prompt);
    tlen = strlen(prompt);
  }
  char err[512];
  floe_engine *e = NULL;
  floe_session *s = NULL;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  int rc = 1;
  double t0 = now_s();
  if (cli_engine_open(&ep, &e, err, sizeof err)) goto done;
  double t_load = now_s() - t0;
  cli_device_note(e);
  if (chat) {
    char *rendered = NULL;
    floe_chat_msg msg = {.role = "user", .content = text};
    floe_chat_opts co = {.add_generation_prompt = true, .enable_thinking = think};
    if (floe_chat_render(e, &msg, 1, &co, &rendered, err, sizeof err)) {
      cli_fail("%s", err);
      goto done;
    }
    free(text);
    text = rendered;
    tlen = strlen(text);
  }
  if (floe_tokenize(e, text, tlen, chat, &ids, &n_ids, err, sizeof err)) {
    cli_fail("%s", err);
    goto done;
  }
  if (n_ids == 0) {
    cli_fail("the prompt is empty");
    goto done;
  }
  if (floe_session_new(e, &spar, &s, err, sizeof err)) {
    cli_fail("%s", err);
    goto done;
  }
  floe_gen_result res;
  floe_session_stats_reset(s);
  if (floe_generate(s, ids, n_ids, &gp, on_token, &out, &res, err, sizeof err)) {
    fputc('\n', stdout);
    cli_fail("%s", err);
    goto done;
  }
  fputc('\n', stdout);
  fflush(stdout);
  int64_t n_dec = res.n_gen > 1 ? res.n_gen - 1 : 0; /* the first token comes from the prefill */
  fprintf(stderr, "floe: load %.2f s | prompt %lld tokens in %.3f s (%.1f tok/s) | generated %lld tokens, %.1f tok/s\n",
          t_load, (long long)res.n_prompt, res.prefill_s,
          res.prefill_s > 0 ? (double)(res.n_prompt - res.n_reused) / res.prefill_s : 0.0, (long long)res.n_gen,
          res.decode_s > 0 && n_dec ? (double)n_dec / res.decode_s : 0.0);
  floe_session_stats st;
  floe_session_stats_get(s, &st);
  if (st.mtp_steps > 0) {
    int64_t dr = 0, ac = 0;
    for (int j = 0; j < 4; j++) dr += st.mtp_drafted[j], ac += st.mtp_accepted[j];
    fprintf(stderr, "floe: mtp %lld speculative steps (last k %d), %.2f tokens/step, acceptance %.3f\n",
            (long long)st.mtp_steps, st.mtp_k_last, (double)st.mtp_tokens / (double)st.mtp_steps,
            dr ? (double)ac / (double)dr : 0.0);
  }
  if (stats) {
    cli_stream_stats(stderr, e, &st, st.n_tokens, res.prefill_s + res.decode_s, false);
  }
  rc = 0;
done:
  free(ids);
  free(text);
  floe_session_free(s);
  floe_engine_close(e);
  return rc;
}
