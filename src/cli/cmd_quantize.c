/* floe quantize IN.gguf -o OUT.gguf --type T [--expert-type T] [--output-type T] [--force] [-t N] [-v]
 *
 * GGUF -> GGUF with other block types, like llama-quantize (src/convert/convert.h, quantize_model,
 * says what is copied, what is requantized and what is refused). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"
#include "convert/convert.h"
#include "quant/quant.h"

#define TYPES "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs mxfp4"

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe quantize IN.gguf -o OUT.gguf --type T [--expert-type T] [--output-type T] [--force] [-t N] [-v]\n"
          "  -o, --output F      GGUF file to write (written to F.tmp.<pid>, renamed when complete)\n"
          "  --type T            non-expert matrices (and token_embd): " TYPES "\n"
          "  --expert-type T     routed and shared experts (default: --type)\n"
          "  --output-type T     output.weight (default: --type)\n"
          "  --force             requantize tensors stored with fewer bits per weight than their target\n"
          "  -t, --threads N     threads (default: all cores)\n"
          "  -v, --verbose       one line per tensor\n"
          "Norms, vectors, the router and ssm_conv1d keep their type (f32), as llama.cpp stores them.\n");
}

static int parse_type(const char *s, const char *opt, int *out) {
  int t = floe_type_from_name(s);
  if (t < 0 || !convert_type_ok(t)) {
    fprintf(stderr, "floe: %s: unknown or unsupported type '%s' (" TYPES ")\n", opt, s);
    return -1;
  }
  *out = t;
  return 0;
}

int cmd_quantize(int argc, char **argv) {
  static const struct option lo[] = {
    { "output", required_argument, 0, 'o' }, { "type", required_argument, 0, 'T' },
    { "expert-type", required_argument, 0, 'E' }, { "output-type", required_argument, 0, 'O' },
    { "force", no_argument, 0, 'F' }, { "threads", required_argument, 0, 't' },
    { "verbose", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
  };
  quantize_opts o = { .type = -1, .expert_type = -1, .output_type = -1 };
  long nt = 0;
  int c;
  optind = 1;
  while ((c = getopt_long(argc + 1, argv - 1, "o:t:vh", lo, NULL)) != -1) {
    switch (c) {
    case 'o': o.out_path = optarg; break;
    case 'T': if (parse_type(optarg, "--type", &o.type)) return 2; break;
    case 'E': if (parse_type(optarg, "--expert-type", &o.expert_type)) return 2; break;
    case 'O': if (parse_type(optarg, "--output-type", &o.output_type)) return 2; break;
    case 'F': o.force = true; break;
    case 't': {
      long long v;
      if (!cli_parse_int(optarg, 1, 256, &v)) {
        fprintf(stderr, "floe: -t: expected a thread count 1..256, got '%s'\n", optarg);
        return 2;
      }
      nt = (long)v;
      break;
    }
    case 'v': o.verbose = true; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc || !o.out_path || o.type < 0) {
    if (optind > argc) fprintf(stderr, "floe: quantize: missing IN.gguf\n");
    else if (optind < argc) fprintf(stderr, "floe: quantize: unexpected argument '%s'\n", argv[optind]);
    else if (!o.out_path) fprintf(stderr, "floe: quantize: missing -o OUT.gguf\n");
    else fprintf(stderr, "floe: quantize: missing --type T\n");
    usage(stderr);
    return 2;
  }
  o.in_path = argv[optind - 1];
  if (!nt) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    nt = n > 0 ? (n > 256 ? 256 : n) : 1;
  }
  o.n_threads = (int)nt;
  cli_progress pr;
  cli_progress_init(&pr, "quantize", "MB", 1e6);
  o.progress = cli_progress_cb;
  o.progress_user = &pr;
  char err[512];
  quantize_stats st;
  const double t0 = floe_time_s();
  const int rc = quantize_model(&o, &st, err, sizeof err);
  cli_progress_done(&pr);
  if (rc) return cli_fail("%s", err);
  if (st.n_fallback)
    fprintf(stderr, "floe: note: %llu tensor(s) stored in a fallback type (row length not a multiple of the block; -v lists them)\n",
            (unsigned long long)st.n_fallback);
  printf("wrote %s: %llu tensors (%llu requantized, %llu copied), %.1f MiB -> %.1f MiB, %.2f s\n", o.out_path,
         (unsigned long long)st.n_tensors, (unsigned long long)st.n_requantized, (unsigned long long)st.n_copied,
         (double)st.bytes_in / 1048576.0, (double)st.bytes_out / 1048576.0, floe_time_s() - t0);
  return 0;
}
