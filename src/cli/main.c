/* floe: command-line entry point. Dispatches to the subcommands in src/cli/cmd_*.c. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "floe.h"

bool cli_parse_int(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end || errno == ERANGE || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int cli_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("floe: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} commands[] = {
    {"info", cmd_info, "info -m MODEL [--tensor NAME]   describe a model file, or dump one tensor"},
    {"run", cmd_run, "run -m MODEL [-p TEXT | -f FILE] [--chat] [-n N] [sampling] [-t N] [-c CTX] [--ids]   generate text"},
    {"tokenize", cmd_tokenize, "tokenize -m MODEL [--ids] [--no-special] < text   text to token ids"},
    {"serve", cmd_serve, "serve -m MODEL [--host H] [--port P] [--api-key K] [...]   OpenAI-compatible HTTP server"},
    {"bench", cmd_bench, "bench -m MODEL [-p N] [-n N] [-d DEPTH] [-r REPS] [-t N] [--bw GBPS] [--json]   prefill / decode speed"},
    {"synth", cmd_synth, "synth --preset P -o FILE.gguf [...]   write a random model with real shapes"},
    {"pack", cmd_pack, "pack MODEL -o DIR   rewrite routed experts expert-major (one aligned block each) for streaming"},
    {"convert", cmd_convert, "convert IN_DIR -o OUT.gguf [--type T] [--expert-type T]   HF/MLX directory to GGUF"},
    {"perplexity", cmd_perplexity, "perplexity -m MODEL -f TEXT [-c CTX] [--chunks N] [--json] [--save-logits F | --kld-base F]   score a text"},
    {"quantize", cmd_quantize, "quantize IN.gguf -o OUT.gguf --type T [--expert-type T] [--output-type T] [--force]   GGUF to GGUF"},
};

static void usage(FILE *f) {
  fprintf(f, "floe %s: inference for very large Mixture-of-Experts models\n\nusage: floe COMMAND [options]\n\n",
          FLOE_VERSION);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  floe %s\n", commands[i].help);
  fprintf(f, "\n'floe COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("floe %s\n", FLOE_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
  fprintf(stderr, "floe: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
