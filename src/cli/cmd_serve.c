/* floe serve -m MODEL [--host H] [--port P] [--api-key K] [...]
 *
 * Starts the OpenAI-compatible server (src/server/): binds first, loads the model in the
 * background (GET /health answers 503 until it is ready), then serves until SIGINT / SIGTERM,
 * when it stops cleanly (running generations are cancelled, connections closed, memory freed).
 * Prints "floe serve: listening on http://HOST:PORT" on stderr once bound (--port 0 picks a free
 * port, which that line reports). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cli/cli.h"
#include "floe.h"
#include "server/server.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe serve -m MODEL [options]\n"
          "  -m, --model MODEL      GGUF file or model directory\n"
          "  --host HOST            address to bind (default 127.0.0.1)\n"
          "  --port PORT            port (default 8080; 0: any free port)\n"
          "  --api-key KEY          require 'Authorization: Bearer KEY' (default: any key accepted)\n"
          "  --alias NAME           model id served by /v1/models (default: the file name)\n"
          "  -c, --ctx N            context size per session (default: the model's, capped at 4096)\n"
          "  --slots N              sessions kept for prefix reuse (default 1; at least --parallel)\n"
          "  --parallel N           requests decoded together in one batched forward pass (default 4, or\n"
          "                         fewer when --mem-budget cannot hold 4 sessions)\n"
          "  --chunk N              prompt tokens evaluated per step while other requests decode (default 64)\n"
          "  --mtp K                MTP speculative decoding: 0 off (default), -1 auto, 1..4 drafts; used\n"
          "                         while one request decodes alone (greedy output unchanged; sampled\n"
          "                         output then depends on whether the request decoded alone)\n"
          "  --checkpoints N        recurrent-state copies per session for partial prefix reuse on hybrid\n"
          "                         models (default 8; 0: none; counted in --mem-budget)\n"
          "  --queue N              pending requests before 503 (default 64)\n"
          "  --max-body BYTES       request body limit (default 8M; suffixes K M G)\n"
          "  --max-conn N           connection limit (default 256)\n"
          "  -n N                   default max_tokens when a request gives none (default: until the context is full)\n"
          "  -t N                   engine threads (default: all cores)\n"
          "  --device D             cpu | cuda | cuda:N | auto (default: the GPU when there is one and the model fits)\n"
          "  --mem-budget BYTES     memory budget; routed experts are streamed from disk (suffixes K M G)\n"
          "  --gpu-mem BYTES        GPU memory for the weights; routed experts beyond it stay in host memory\n"
          "  --direct               O_DIRECT expert reads (with --mem-budget; default buffered)\n"
          "  --kv-f32               F32 KV cache (default BF16)\n"
          "  --mmap                 map the model file (default: read it into huge-page memory when it fits)\n"
          "  --no-mmap              always read the model file into memory\n"
          "  -v, --verbose          log each request\n");
}

static void serve_progress(void *user, uint64_t done, uint64_t total) {
  cli_progress_update(user, done, total);
  if (total && done >= total) cli_progress_done(user);
}

int cmd_serve(int argc, char **argv) {
  srv_opts o;
  srv_opts_init(&o);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long num;
#define NEEDINT(lo, hi)                                                                    \
  do {                                                                                     \
    if (!v || !cli_parse_int(v, lo, hi, &num)) {                                           \
      fprintf(stderr, "floe serve: option %s needs an integer in [%lld, %lld]\n", a, (long long)(lo), (long long)(hi)); \
      return 2;                                                                            \
    }                                                                                      \
    i++;                                                                                   \
  } while (0)
    if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) o.model = argv[++i];
    else if (!strcmp(a, "--host") && v) o.host = argv[++i];
    else if (!strcmp(a, "--api-key") && v) o.api_key = argv[++i];
    else if (!strcmp(a, "--alias") && v) o.alias = argv[++i];
    else if (!strcmp(a, "--port")) { NEEDINT(0, 65535); o.port = (int)num; }
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) { NEEDINT(0, 1LL << 40); o.n_ctx = num; }
    else if (!strcmp(a, "--slots")) { NEEDINT(1, 64); o.n_slots = (int)num; }
    else if (!strcmp(a, "--parallel")) { NEEDINT(1, 64); o.n_parallel = (int)num; o.parallel_set = true; }
    else if (!strcmp(a, "--chunk")) { NEEDINT(1, 512); o.chunk = num; }
    else if (!strcmp(a, "--mtp")) { NEEDINT(-1, 4); o.mtp = (int)num; }
    else if (!strcmp(a, "--checkpoints")) { NEEDINT(0, 4096); o.n_checkpoints = num ? (int)num : -1; }
    else if (!strcmp(a, "--queue")) { NEEDINT(1, 1000000); o.queue_max = (int)num; }
    else if (!strcmp(a, "--max-conn")) { NEEDINT(4, 100000); o.max_conn = (int)num; }
    else if (!strcmp(a, "-n")) { NEEDINT(-1, 1LL << 40); o.default_max_tokens = num; }
    else if (!strcmp(a, "-t")) { NEEDINT(0, 4096); o.n_threads = (int)num; }
    else if (!strcmp(a, "--max-body") && v) {
      uint64_t b;
      if (floe_parse_size(argv[++i], &b) || b == 0 || b > ((uint64_t)1 << 40)) {
        fprintf(stderr, "floe serve: --max-body needs a size like 8M\n");
        return 2;
      }
      o.max_body = (size_t)b;
    }
    else if (!strcmp(a, "--mem-budget") && v) {
      uint64_t b;
      if (floe_parse_size(argv[++i], &b)) {
        fprintf(stderr, "floe serve: --mem-budget needs a size like 24G\n");
        return 2;
      }
      o.mem_budget = b;
    }
    else if (!strcmp(a, "--gpu-mem") && v) {
      uint64_t b;
      if (floe_parse_size(argv[++i], &b) || b == 0) {
        fprintf(stderr, "floe serve: --gpu-mem needs a size like 16G\n");
        return 2;
      }
      o.gpu_mem = b;
    }
    else if (!strcmp(a, "--kv-f32")) o.kv_f32 = true;
    else if (!strcmp(a, "--direct")) o.io_direct = true;
    else if (!strcmp(a, "--device") && v) {
      floe_engine_params dp;
      floe_engine_params_init(&dp);
      if (cli_device_option(argv[++i], &dp)) {
        fprintf(stderr, "floe serve: --device needs cpu, cuda, cuda:N or auto\n");
        return 2;
      }
      o.device = dp.device;
      o.device_index = dp.device_index;
    }
    else if (!strcmp(a, "--mmap")) o.load = FLOE_LOAD_MMAP;
    else if (!strcmp(a, "--no-mmap")) o.load = FLOE_LOAD_COPY;
    else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o.verbose = true;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
    else {
      fprintf(stderr, "floe serve: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef NEEDINT
  }
  if (!o.model) {
    usage(stderr);
    return 2;
  }
  /* Every thread inherits this mask; the main thread takes the signals with sigtimedwait. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  /* the load runs in the server's loader thread (/health answers 503 meanwhile): a bar on a
   * terminal, its line ended once the whole file is in */
  static cli_progress lpr;
  cli_progress_load_init(&lpr);
  o.progress = serve_progress;
  o.progress_user = &lpr;
  char err[512];
  srv *s = NULL;
  if (srv_start(&o, &s, err, sizeof err)) return cli_fail("%s", err);
  fprintf(stderr, "floe serve: listening on http://%s:%d\n", o.host, srv_port(s));
  fflush(stderr);
  int rc = 0;
  for (;;) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&set, NULL, &ts);
    if (sig == SIGINT || sig == SIGTERM) {
      fprintf(stderr, "floe serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
    if (srv_failed(s)) {
      rc = 1;
      break;
    }
  }
  srv_stop(s);
  return rc;
}
