/* floe convert IN_DIR -o OUT.gguf [--type T] [--expert-type T] [-t N] [--name NAME] [-v]
 *
 * HF safetensors directory (qwen3_moe, qwen3_next, qwen3_5_moe) or MLX quantized directory ->
 * GGUF with llama.cpp's names, shapes and metadata (src/convert/convert.h says what is written).
 * --type: 2-D non-expert weights; --expert-type: routed and shared experts (default: --type).
 * Default types: each tensor keeps its source float type (F32/F16/BF16); MLX-quantized tensors
 * become q8_0. Norms, vectors, the router and ssm_conv1d are always f32.
 *
 * Hidden: floe convert --make-mlx-fixture HF_DIR -o OUT_DIR writes the MLX test fixture
 * (tests/fixtures/mlx/) from an HF fixture directory. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"
#include "convert/convert.h"
#include "quant/quant.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe convert IN_DIR -o OUT.gguf [--type T] [--expert-type T] [-t N] [--name NAME] [-v]\n"
          "  IN_DIR            HF safetensors directory (qwen3_moe, qwen3_next, qwen3_5_moe) or MLX quantized directory\n"
          "  -o, --output F    GGUF file to write (written to F.tmp.<pid>, renamed when complete)\n"
          "  --type T          2-D non-expert weights: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K q6_K\n"
          "                    iq4_nl iq4_xs mxfp4 (default: the source's float type; q8_0 for MLX-quantized tensors)\n"
          "  --expert-type T   routed and shared experts (default: --type)\n"
          "  -t, --threads N   threads (default: all cores)\n"
          "  --name NAME       general.name (default: the directory's name)\n"
          "  -v, --verbose     one line per tensor\n"
          "Norms, vectors, the router (ffn_gate_inp) and ssm_conv1d are always f32, as llama.cpp stores them.\n");
}

static int parse_type(const char *s, const char *opt, int *out) {
  int t = floe_type_from_name(s);
  if (t < 0 || !convert_type_ok(t)) {
    fprintf(stderr, "floe: %s: unknown or unsupported type '%s' (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K "
                    "q4_K q5_K q6_K iq4_nl iq4_xs mxfp4)\n", opt, s);
    return -1;
  }
  *out = t;
  return 0;
}

int cmd_convert(int argc, char **argv) {
  static const struct option lo[] = {
    { "output", required_argument, 0, 'o' }, { "type", required_argument, 0, 'T' },
    { "expert-type", required_argument, 0, 'E' }, { "threads", required_argument, 0, 't' },
    { "name", required_argument, 0, 'N' }, { "verbose", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' },
    { "make-mlx-fixture", no_argument, 0, 'M' }, { 0, 0, 0, 0 },
  };
  convert_opts o = { .type = -1, .expert_type = -1 };
  const char *out = NULL;
  bool fixture = false;
  long nt = 0;
  int c;
  optind = 1;
  while ((c = getopt_long(argc + 1, argv - 1, "o:t:vh", lo, NULL)) != -1) {
    switch (c) {
    case 'o': out = optarg; break;
    case 'T': if (parse_type(optarg, "--type", &o.type)) return 2; break;
    case 'E': if (parse_type(optarg, "--expert-type", &o.expert_type)) return 2; break;
    case 't': {
      long long v;
      if (!cli_parse_int(optarg, 1, 256, &v)) {
        fprintf(stderr, "floe: -t: expected a thread count 1..256, got '%s'\n", optarg);
        return 2;
      }
      nt = (long)v;
      break;
    }
    case 'N': o.name = optarg; break;
    case 'v': o.verbose = true; break;
    case 'M': fixture = true; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc || !out) { /* exactly one positional argument (argv is shifted by one) */
    if (optind > argc) fprintf(stderr, "floe: convert: missing IN_DIR\n");
    else if (optind < argc) fprintf(stderr, "floe: convert: unexpected argument '%s'\n", argv[optind]);
    else fprintf(stderr, "floe: convert: missing -o OUT.gguf\n");
    usage(stderr);
    return 2;
  }
  o.in_dir = argv[optind - 1];
  o.out_path = out;
  char err[512];
  if (fixture) {
    if (convert_make_mlx_fixture(o.in_dir, out, err, sizeof err)) return cli_fail("%s", err);
    printf("wrote MLX fixture %s from %s\n", out, o.in_dir);
    return 0;
  }
  if (!nt) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    nt = n > 0 ? (n > 256 ? 256 : n) : 1;
  }
  o.n_threads = (int)nt;
  convert_stats st;
  double t0 = floe_time_s();
  cli_progress pr;
  cli_progress_init(&pr, "convert", "MB", 1e6);
  if (!o.verbose) { /* -v prints a line per tensor: no bar between them */
    o.progress = cli_progress_cb;
    o.progress_user = &pr;
  }
  const int crc = convert_model(&o, &st, err, sizeof err);
  cli_progress_done(&pr);
  if (crc) return cli_fail("%s", err);
  if (!st.tokenizer) fprintf(stderr, "floe: warning: %s has no tokenizer.json: %s has no tokenizer\n", o.in_dir, out);
  if (st.n_fallback)
    fprintf(stderr, "floe: note: %d tensor(s) stored in a fallback type (row length not a multiple of the block; -v lists them)\n",
            st.n_fallback);
  printf("wrote %s: %llu tensors, %.1f MiB%s%s, %.2f s\n", out, (unsigned long long)st.n_tensors,
         (double)st.bytes / (1024.0 * 1024.0), st.mlx ? ", from MLX" : "", st.n_mtp ? ", with MTP" : "",
         floe_time_s() - t0);
  return 0;
}
