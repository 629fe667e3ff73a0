/* floe tokenize -m MODEL [--ids] [--no-special]
 *
 * Reads text from stdin and prints its tokens: one "id<TAB>piece" line per token (the piece as a
 * C-escaped string so control bytes and partial UTF-8 stay visible), or with --ids the ids alone,
 * space separated, on one line. Special tokens written in the text (<|im_start|>, ...) become
 * their ids unless --no-special. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "floe.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe tokenize -m MODEL [--ids] [--no-special] < text\n"
          "  -m, --model MODEL   GGUF file or model directory\n"
          "  --ids               print only the ids, space separated\n"
          "  --no-special        treat <|im_start|> etc. in the text as plain text\n");
}

static void print_escaped(const char *p, size_t n) {
  putchar('\'');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c == '\\' || c == '\'') printf("\\%c", c);
    else if (c == '\n') fputs("\\n", stdout);
    else if (c == '\t') fputs("\\t", stdout);
    else if (c == '\r') fputs("\\r", stdout);
    else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
    else putchar(c);
  }
  putchar('\'');
}

int cmd_tokenize(int argc, char **argv) {
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.n_threads = 1;
  bool ids_only = false, special = true;
  for (int i = 0; i < argc; i++) {
    if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) ep.model = argv[++i];
    else if (!strcmp(argv[i], "--ids")) ids_only = true;
    else if (!strcmp(argv[i], "--no-special")) special = false;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "floe tokenize: unknown or incomplete option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!ep.model) {
    usage(stderr);
    return 2;
  }
  size_t cap = 1 << 16, n = 0, k;
  char *text = malloc(cap);
  if (!text) return cli_fail("out of memory");
  while ((k = fread(text + n, 1, cap - n, stdin)) > 0) {
    n += k;
    if (n == cap) {
      char *t = realloc(text, cap *= 2);
      if (!t) {
        free(text);
        return cli_fail("out of memory");
      }
      text = t;
    }
  }
  char err[512];
  floe_engine *e = NULL;
  if (floe_engine_open(&ep, &e, err, sizeof err)) {
    free(text);
    return cli_fail("%s", err);
  }
  int32_t *ids = NULL;
  size_t n_ids = 0;
  int rc = 0;
  if (floe_tokenize(e, text, n, special, &ids, &n_ids, err, sizeof err)) {
    rc = cli_fail("%s", err);
  } else {
    for (size_t i = 0; i < n_ids; i++) {
      if (ids_only) {
        printf(i ? " %d" : "%d", ids[i]);
      } else {
        size_t len = 0;
        const char *piece = floe_token_piece(e, ids[i], &len);
        printf("%d\t", ids[i]);
        print_escaped(piece ? piece : "", piece ? len : 0);
        putchar('\n');
      }
    }
    if (ids_only) putchar('\n');
  }
  free(ids);
  free(text);
  floe_engine_close(e);
  return rc;
}
