/* A program using floe as an installed library: loads a model, completes a prompt greedily and
 * prints the text. Built against an installed copy through pkg-config:
 *
 *   cc generate.c $(pkg-config --cflags --libs floe) -o generate
 *   ./generate models/default.gguf "def fib(n):" 32
 *
 * Only include/floe.h is used: an engine (the loaded model), a session (one context), the
 * tokenizer and floe_generate with a token callback. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <floe.h>

static int on_token(void *user, const floe_token_event *ev) {
  (void)user;
  fwrite(ev->text, 1, ev->text_len, stdout);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL PROMPT [N]\n", argv[0]);
    return 2;
  }
  char err[512];
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = argv[1];
  ep.n_threads = 2;
  floe_engine *e = NULL;
  if (floe_engine_open(&ep, &e, err, sizeof err)) {
    fprintf(stderr, "floe_engine_open: %s\n", err);
    return 1;
  }
  floe_session_params sp;
  floe_session_params_init(&sp);
  floe_session *s = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = 1;
  if (floe_session_new(e, &sp, &s, err, sizeof err)) {
    fprintf(stderr, "floe_session_new: %s\n", err);
    goto out;
  }
  if (floe_tokenize(e, argv[2], strlen(argv[2]), false, &ids, &n, err, sizeof err)) {
    fprintf(stderr, "floe_tokenize: %s\n", err);
    goto out;
  }
  floe_gen_params gp;
  floe_gen_params_init(&gp);
  gp.max_tokens = argc > 3 ? atoi(argv[3]) : 32;
  floe_gen_result res;
  fputs(argv[2], stdout);
  if (floe_generate(s, ids, n, &gp, on_token, NULL, &res, err, sizeof err)) {
    fprintf(stderr, "\nfloe_generate: %s\n", err);
    goto out;
  }
  printf("\n");
  fprintf(stderr, "floe %s: %lld prompt tokens, %lld generated\n", FLOE_VERSION, (long long)res.n_prompt,
          (long long)res.n_gen);
  rc = 0;
out:
  free(ids);
  if (s) floe_session_free(s);
  floe_engine_close(e);
  return rc;
}
