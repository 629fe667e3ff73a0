/* floe bench -m MODEL [-p N] [-n N] [-d DEPTH] [-r REPS] [-t N] [-c CTX] [--bw GBPS] [--exact] [--kv-f32]
 *            [--disk-bw GBPS] [--window W] [--json]
 *
 * Speed of one model through the public API only:
 *  - prefill: one call evaluating N prompt tokens (pseudo-random ids, fixed seed) from an empty
 *    context; prefill tok/s = N / time; time to first token = that time (the logits of the last
 *    position are computed, so it includes the output matrix once);
 *  - decode: the context is filled to DEPTH tokens first (untimed), then N tokens are generated
 *    greedily one at a time (timed; each step evaluates one token and computes its logits);
 *  - each repetition starts from a reset session; the figures are medians over repetitions; the
 *    phase split is that of the median decode run (per decoded token);
 *  - peak RSS is the process high-water mark (getrusage ru_maxrss); on the GPU, vram_used_bytes is
 *    the device memory floe holds after the runs, the session still open (floe_model_info);
 *  - weight_bytes_per_token: what one decoded token reads (top-k experts, output matrix, every
 *    non-expert matrix); achieved_gbps = that x decode tok/s; roofline_frac = achieved / --bw
 *    (bench/membw measures the bandwidth; null without --bw). With the file read into memory and
 *    no budget, weights_read_gbps = the read bandwidth of the weights' own pages
 *    (floe_engine_read_bandwidth, all threads, best of 3 passes, the mean of one measurement
 *    before and one after the repetitions) and weights_roofline_frac = achieved / that.
 *  - streaming (--mem-budget), the I/O roofline of issue 4: roofline time per token = bytes
 *    actually read per token / the disk's bandwidth (--disk-bw GBPS, measured right before by
 *    bench/stream_disk) + the compute no read could overlap (serial_ms_per_token: per token, from
 *    its start to its first read queued, plus from its last read done to its logits);
 *    io_roofline_frac = that time / the measured time per token (1.0 = at the roofline). What is
 *    missing is the sum of (disk_busy_ms_per_token - bytes / disk bandwidth): reads slower than
 *    the disk can go, and (time - disk busy - serial): compute that ran with the disk idle although
 *    something could have been read (late or wrong predictions, demand misses found late).
 *    compute_ms_per_token = time per token - io wait; when it exceeds the I/O roofline the run is
 *    compute-bound ("bound":"compute") and bound_frac = max(I/O roofline, compute) / time.
 *  - with a budget, timing starts once the expert cache's memory has been populated (background,
 *    at start; prefault_wait_s) unless --no-prefault;
 *  - --window W: every W decoded tokens of the first repetition, one more line (JSON with --json)
 *    for those W tokens alone: tok/s, hit rate, bytes read per token (cache warm-up curves).
 * Text to stdout, or with --json one JSON object per line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "floe.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe bench -m MODEL [options]\n"
          "  -p N        prompt tokens for the prefill measurement (default 512; 0: skip)\n"
          "  -n N        tokens to decode (default 32; 0: skip)\n"
          "  -d DEPTH    context depth before decoding starts (default 0)\n"
          "  -r REPS     repetitions; medians are reported (default 3)\n"
          "  -t N        threads (default: all cores)\n"
          "  -c CTX      context size (default: what the run needs)\n"
          "  --bw GBPS   memory bandwidth, for the roofline fraction (bench/membw)\n"
          "  --disk-bw GBPS  disk bandwidth, for the I/O roofline of streamed runs (bench/stream_disk)\n"
          "  --window W  also report every W decoded tokens of the first repetition (warm-up curves)\n"
          "  --exact     exact float activations (default: 8-bit activations for quantized weights)\n"
          "  --kv-f32    F32 KV cache (default BF16)\n"
          "  --json      one JSON object per line\n"
          "  --mtp K     also decode N tokens of a fixed Python prompt through floe_generate with\n"
          "              speculative decoding (K drafts, -1 auto) and without (mtp 0), same run: one\n"
          "              more line (\"bench\":\"mtp\") with both tok/s (decode_tok_s, decode_tok_s_mtp0),\n"
          "              mtp_k (the k of most steps), mtp_k_steps, mtp_accept_rate overall and per\n"
          "              draft position (mtp_accept_rate_pos), tokens_per_step\n"
          "%s", cli_stream_help());
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  double *c = malloc((size_t)n * sizeof *c);
  if (!c) return v[0];
  memcpy(c, v, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, cmp_d);
  double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  free(c);
  return m;
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
    else putchar(*s);
  }
  putchar('"');
}

/* --mtp: greedy generation of n_gen tokens after a fixed code prompt, mtp 0 and mtp K alternating
 * per repetition (the same machine state for both); medians of the decode times (floe_gen_result:
 * the first token, from the prefill, is not a decode step). */
static int bench_mtp(floe_engine *e, floe_session *s, int mtp, int64_t n_gen, int reps, bool json) {
  static const char text[] = "import os\nimport sys\n\n\ndef main(argv):\n    \"\"\"Entry point.\"\"\"\n    ";
  char err[512];
  int32_t *ids = NULL;
  size_t n = 0;
  if (floe_tokenize(e, text, sizeof text - 1, false, &ids, &n, err, sizeof err)) return cli_fail("%s", err);
  double t0[1000], t1[1000];
  floe_session_stats st, sum;
  memset(&sum, 0, sizeof sum);
  for (int r = 0; r < reps; r++)
    for (int v = 0; v < 2; v++) {
      floe_gen_params gp;
      floe_gen_params_init(&gp);
      gp.max_tokens = n_gen;
      gp.mtp = v ? mtp : 0;
      floe_gen_result res;
      floe_session_reset(s);
      floe_session_stats_reset(s);
      if (floe_generate(s, ids, n, &gp, NULL, NULL, &res, err, sizeof err)) {
        free(ids);
        return cli_fail("%s", err);
      }
      const double tps = res.decode_s > 0 && res.n_gen > 1 ? (double)(res.n_gen - 1) / res.decode_s : 0;
      (v ? t1 : t0)[r] = tps;
      if (!v) continue;
      floe_session_stats_get(s, &st);
      sum.mtp_steps += st.mtp_steps, sum.mtp_tokens += st.mtp_tokens;
      for (int j = 0; j < 4; j++) sum.mtp_drafted[j] += st.mtp_drafted[j], sum.mtp_accepted[j] += st.mtp_accepted[j];
      sum.mtp_k_last = st.mtp_k_last;
      for (int k = 0; k < 5; k++) sum.mtp_k_steps[k] += st.mtp_k_steps[k];
    }
  free(ids);
  const double d0 = median(t0, reps), d1 = median(t1, reps);
  int64_t dr = 0, ac = 0;
  for (int j = 0; j < 4; j++) dr += sum.mtp_drafted[j], ac += sum.mtp_accepted[j];
  const double rate = dr ? (double)ac / (double)dr : 0, tps = sum.mtp_steps ? (double)sum.mtp_tokens / (double)sum.mtp_steps : 0;
  /* mtp_k: the k of most decode steps (forced: K; automatic: what it settled on, 0 when drafting
   * did not pay); tokens_per_step over the drafting steps (mtp_k_steps[1..4]) */
  int kmode = 0;
  for (int k = 1; k < 5; k++)
    if (sum.mtp_k_steps[k] > sum.mtp_k_steps[kmode]) kmode = k;
  if (json) {
    printf("{\"bench\":\"mtp\",\"mtp\":%d,\"mtp_k\":%d,\"mtp_k_last\":%d,\"n_gen\":%lld,\"reps\":%d,"
           "\"decode_tok_s\":%.3f,\"decode_tok_s_mtp0\":%.3f,\"speedup\":%.3f,\"tokens_per_step\":%.3f,"
           "\"mtp_accept_rate\":%.4f,\"mtp_k_steps\":[%lld,%lld,%lld,%lld,%lld],\"mtp_accept_rate_pos\":[",
           mtp, kmode, sum.mtp_k_last, (long long)n_gen, reps, d1, d0, d0 > 0 ? d1 / d0 : 0, tps, rate,
           (long long)sum.mtp_k_steps[0], (long long)sum.mtp_k_steps[1], (long long)sum.mtp_k_steps[2],
           (long long)sum.mtp_k_steps[3], (long long)sum.mtp_k_steps[4]);
    for (int j = 0; j < 4; j++)
      printf(j ? ",%.4f" : "%.4f", sum.mtp_drafted[j] ? (double)sum.mtp_accepted[j] / (double)sum.mtp_drafted[j] : 0.0);
    printf("]}\n");
  } else {
    printf("mtp %d (k %d, last %d): decode %.2f tok/s vs %.2f tok/s without (%.2fx), %.2f tokens/step, acceptance %.3f [",
           mtp, kmode, sum.mtp_k_last, d1, d0, d0 > 0 ? d1 / d0 : 0, tps, rate);
    for (int j = 0; j < 4; j++)
      printf(j ? " %.3f" : "%.3f", sum.mtp_drafted[j] ? (double)sum.mtp_accepted[j] / (double)sum.mtp_drafted[j] : 0.0);
    printf("]\n");
  }
  return 0;
}

/* Tiered experts (--gpu-mem), per decoded token: where the selected routed experts were found or
 * computed, the bytes copied to the GPU and their rate over the decode, the host's waits, and the
 * cost model's inputs. */
static void tier_stats(const floe_session_stats *st, int64_t n_gen, double decode_s, bool json) {
  if (!st->tier_on || n_gen <= 0) return;
  const double per = 1.0 / (double)n_gen, lk = (double)st->tier_lookups;
  if (json) {
    printf("\"tier\":{\"pool_bytes\":%llu,\"slots\":%lld,\"host_pinned\":%s,\"lookups_per_token\":%.2f,"
           "\"vram_hits_per_token\":%.2f,\"copied_per_token\":%.2f,\"cpu_per_token\":%.2f,\"vram_hit_rate\":%.4f,"
           "\"h2d_mb_per_token\":%.3f,\"pcie_gb_s\":%.3f,\"wait_ms_per_token\":%.3f,\"cpu_ms_per_token\":%.3f,"
           "\"model_pcie_gbps\":%.2f,\"model_gpu_gbps\":%.1f,\"model_cpu_expert_us\":%.1f,\"prefetched_per_token\":%.2f,"
           "\"prefetch_used_per_token\":%.2f,\"graphs_per_token\":%.2f},",
           (unsigned long long)st->tier_pool_bytes, (long long)st->tier_slots, st->tier_pinned ? "true" : "false",
           lk * per, (double)st->tier_hits * per, (double)st->tier_copies * per, (double)st->tier_cpu * per,
           lk > 0 ? (double)st->tier_hits / lk : 0.0, (double)st->tier_h2d_bytes * per / 1e6,
           decode_s > 0 ? (double)st->tier_h2d_bytes / decode_s / 1e9 : 0.0, st->tier_wait_s * per * 1e3,
           st->tier_cpu_s * per * 1e3, st->tier_pcie_gbps, st->tier_gpu_gbps, st->tier_cpu_expert_s * 1e6,
           (double)st->tier_pf_issued * per, (double)st->tier_pf_used * per, (double)st->tier_graph_launches * per);
  } else {
    printf("tiered experts: pool %.2f GiB (%lld experts, host memory %s); per token %.1f lookups: %.1f in VRAM "
           "(%.1f %%), %.1f copied (%.1f MB, %.2f GB/s), %.1f on the CPU (%.2f ms); waits %.2f ms; cost model: "
           "%.1f GB/s PCIe, %.0f GB/s device memory, %.0f us a CPU expert; prefetched %.1f, used %.1f; %.1f graph segments\n",
           (double)st->tier_pool_bytes / 1073741824.0, (long long)st->tier_slots, st->tier_pinned ? "pinned" : "pageable",
           lk * per, (double)st->tier_hits * per, lk > 0 ? 100.0 * (double)st->tier_hits / lk : 0.0,
           (double)st->tier_copies * per, (double)st->tier_h2d_bytes * per / 1e6,
           decode_s > 0 ? (double)st->tier_h2d_bytes / decode_s / 1e9 : 0.0, (double)st->tier_cpu * per,
           st->tier_cpu_s * per * 1e3, st->tier_wait_s * per * 1e3, st->tier_pcie_gbps, st->tier_gpu_gbps,
           st->tier_cpu_expert_s * 1e6,
           (double)st->tier_pf_issued * per, (double)st->tier_pf_used * per, (double)st->tier_graph_launches * per);
  }
}

int cmd_bench(int argc, char **argv) {
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  floe_session_params sp;
  floe_session_params_init(&sp);
  int64_t n_prompt = 512, n_gen = 32, depth = 0, n_ctx = 0;
  int reps = 3;
  double bw = 0, disk_bw = 0;
  int64_t window = 0;
  bool json = false;
  int mtp = -2; /* --mtp K: also the speculative-decoding measurement (-1 auto, 1..4 forced); -2: not run */
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    double num = v ? strtod(v, &end) : 0;
    const bool isnum = v && end != v && *end == 0;
    const int so = cli_stream_option(a, v, &ep);
    if (so < 0) return 2;
    if (so > 0) {
      i += so - 1;
      continue;
    }
    if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) ep.model = argv[++i];
    else if (!strcmp(a, "--json")) json = true;
    else if (isnum && !strcmp(a, "--mtp") && num >= -1 && num <= 4) mtp = (int)num, i++;
    else if (!strcmp(a, "--exact")) sp.exact_act = true;
    else if (!strcmp(a, "--kv-f32")) sp.kv_f32 = true;
    else if (isnum && !strcmp(a, "-p") && num >= 0) n_prompt = (int64_t)num, i++;
    else if (isnum && !strcmp(a, "-n") && num >= 0) n_gen = (int64_t)num, i++;
    else if (isnum && !strcmp(a, "-d") && num >= 0) depth = (int64_t)num, i++;
    else if (isnum && !strcmp(a, "-r") && num >= 1 && num <= 1000) reps = (int)num, i++;
    else if (isnum && !strcmp(a, "-t") && num >= 1 && num <= 1024) ep.n_threads = (int)num, i++;
    else if (isnum && !strcmp(a, "-c") && num >= 1) n_ctx = (int64_t)num, i++;
    else if (isnum && !strcmp(a, "--bw") && num > 0) bw = num, i++;
    else if (isnum && !strcmp(a, "--disk-bw") && num > 0) disk_bw = num, i++;
    else if (isnum && !strcmp(a, "--window") && num >= 1) window = (int64_t)num, i++;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "floe bench: unknown, incomplete or out-of-range option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!ep.model || (n_prompt == 0 && n_gen == 0)) {
    usage(stderr);
    return 2;
  }
  if (ep.n_threads <= 0) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    ep.n_threads = nc > 0 ? (int)nc : 1;
  }
  const int64_t need = n_prompt > depth + n_gen ? n_prompt : depth + n_gen;
  sp.n_ctx = n_ctx > 0 ? n_ctx : need;
  /* one sequence per repetition, no later prompt to resume: no recurrent-state checkpoints (with a
   * memory budget their ~8 state copies would be counted against it for nothing) */
  sp.n_checkpoints = -1;
  char err[512];
  floe_engine *e = NULL;
  floe_session *s = NULL;
  int32_t *ids = NULL;
  float *logits = NULL;
  double *pf = NULL, *dc = NULL, *ph = NULL, *pph = NULL;
  floe_session_stats *dst = NULL;
  int rc = 1;
  double t0 = now_s();
  if (cli_engine_open(&ep, &e, err, sizeof err)) goto done;
  const double t_load = now_s() - t0;
  floe_model_info info;
  floe_engine_info(e, &info);
  cli_device_note(e);
  if (floe_session_new(e, &sp, &s, err, sizeof err)) {
    cli_fail("%s", err);
    goto done;
  }
  if (need > floe_session_n_ctx(s)) {
    cli_fail("the run needs %lld positions but the context holds %lld", (long long)need,
             (long long)floe_session_n_ctx(s));
    goto done;
  }
  const int64_t nid = need > 0 ? need : 1;
  ids = malloc((size_t)nid * sizeof *ids);
  logits = malloc((size_t)info.n_vocab * sizeof *logits);
  pf = calloc((size_t)reps, sizeof *pf);
  dc = calloc((size_t)reps, sizeof *dc);
  ph = calloc((size_t)reps * 7, sizeof *ph);
  dst = calloc((size_t)reps, sizeof *dst);
  pph = calloc((size_t)reps * 6, sizeof *pph);
  if (!ids || !logits || !pf || !dc || !ph || !pph || !dst) {
    cli_fail("out of memory");
    goto done;
  }
  /* streaming: the expert cache's memory is populated in the background at start; timing starts
   * once that is done (a startup cost like loading, reported as prefault_wait_s) */
  double t_pfw = 0;
  if (ep.mem_budget && !ep.io_no_prefault) {
    const double w0 = now_s();
    floe_session_stats st;
    for (;;) {
      floe_session_stats_get(s, &st);
      if (st.prefault_s != 0 || now_s() - w0 > 300) break;
      usleep(20000);
    }
    t_pfw = now_s() - w0;
  }
  uint64_t z = 0x9e3779b97f4a7c15ull; /* fixed pseudo-random prompt: a splitmix64 stream */
  for (int64_t i = 0; i < nid; i++) {
    z += 0x9e3779b97f4a7c15ull;
    uint64_t x = z;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    ids[i] = (int32_t)((x ^ (x >> 31)) % (uint64_t)info.n_vocab);
  }
  /* the read bandwidth of the weights' own pages, before and after the repetitions (memory of
   * this VM is not uniform: a separate test buffer can sit in faster or slower memory) */
  double wbw[2] = { 0, 0 };
  const bool want_wbw = n_gen > 0 && info.copied && !ep.mem_budget;
  if (want_wbw && floe_engine_read_bandwidth(e, ep.n_threads, 3, &wbw[0], err, sizeof err)) wbw[0] = 0;
  for (int r = 0; r < reps; r++) {
    if (n_prompt > 0) {
      floe_session_reset(s);
      floe_session_stats_reset(s);
      double a = now_s();
      if (floe_session_eval(s, ids, (size_t)n_prompt, logits, false, err, sizeof err)) {
        cli_fail("%s", err);
        goto done;
      }
      pf[r] = now_s() - a;
      floe_session_stats st;
      floe_session_stats_get(s, &st);
      double *q = pph + 6 * r;
      q[0] = st.attn_s, q[1] = st.gdn_s, q[2] = st.router_s, q[3] = st.experts_s, q[4] = st.lm_head_s, q[5] = st.other_s;
    }
    if (n_gen > 0) {
      floe_session_reset(s);
      if (depth > 0 && floe_session_eval(s, ids, (size_t)depth, logits, false, err, sizeof err)) {
        cli_fail("%s", err);
        goto done;
      }
      int32_t tok = depth > 0 ? floe_argmax(logits, (size_t)info.n_vocab) : ids[0];
      floe_session_stats_reset(s);
      double a = now_s(), wa = a;
      floe_session_stats w0;
      floe_session_stats_get(s, &w0);
      for (int64_t i = 0; i < n_gen; i++) {
        /* a decode step as floe_generate runs it: no copy of the logits, the greedy pick the
         * threads found while computing them */
        if (floe_session_eval(s, &tok, 1, NULL, false, err, sizeof err)) {
          cli_fail("%s", err);
          goto done;
        }
        tok = floe_session_argmax(s);
        if (window > 0 && r == 0 && (i + 1) % window == 0) {
          const double wb = now_s();
          floe_session_stats w1;
          floe_session_stats_get(s, &w1);
          const double h = (double)(w1.expert_hits - w0.expert_hits), mi = (double)(w1.expert_misses - w0.expert_misses);
          const double tps = (double)window / (wb - wa), bpt = (double)(w1.bytes_read - w0.bytes_read) / (double)window;
          struct rusage wr;
          getrusage(RUSAGE_SELF, &wr);
          if (json)
            printf("{\"bench\":\"window\",\"tokens\":%lld,\"tok_s\":%.3f,\"expert_hit_rate\":%.4f,"
                   "\"bytes_read_per_token\":%.0f,\"serial_ms_per_token\":%.2f,\"disk_busy_ms_per_token\":%.2f,"
                   "\"io_wait_ms_per_token\":%.2f,\"peak_rss_bytes\":%.0f}\n",
                   (long long)(i + 1), tps, h + mi > 0 ? h / (h + mi) : 0.0, bpt, (w1.serial_s - w0.serial_s) * 1e3 / (double)window,
                   (w1.disk_busy_s - w0.disk_busy_s) * 1e3 / (double)window, (w1.io_wait_s - w0.io_wait_s) * 1e3 / (double)window,
                   (double)wr.ru_maxrss * 1024.0);
          else
            printf("tokens %lld: %.2f tok/s, hit rate %.3f, %.1f MB read/token (last %lld tokens)\n", (long long)(i + 1),
                   tps, h + mi > 0 ? h / (h + mi) : 0.0, bpt / 1e6, (long long)window);
          fflush(stdout);
          w0 = w1;
          wa = now_s();
        }
      }
      dc[r] = now_s() - a;
      floe_session_stats st;
      floe_session_stats_get(s, &st);
      dst[r] = st;
      double *p = ph + 7 * r;
      p[0] = st.attn_s, p[1] = st.gdn_s, p[2] = st.router_s, p[3] = st.experts_s, p[4] = st.lm_head_s;
      p[5] = st.other_s, p[6] = dc[r];
    }
  }
  if (want_wbw && floe_engine_read_bandwidth(e, ep.n_threads, 3, &wbw[1], err, sizeof err)) wbw[1] = 0;
  const double wgbps = wbw[0] > 0 && wbw[1] > 0 ? (wbw[0] + wbw[1]) / 2 : 0;
  const double t_pf = n_prompt > 0 ? median(pf, reps) : 0, t_dc = n_gen > 0 ? median(dc, reps) : 0;
  int rmed = 0; /* the decode run closest to the median, for the phase split */
  for (int r = 1; r < reps; r++)
    if (fabs(dc[r] - t_dc) < fabs(dc[rmed] - t_dc)) rmed = r;
  const double *p = ph + 7 * rmed;
  const double pf_tps = n_prompt > 0 ? (double)n_prompt / t_pf : 0, dc_tps = n_gen > 0 ? (double)n_gen / t_dc : 0;
  const double gbps = dc_tps * (double)info.decode_bytes / 1e9;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double rss = (double)ru.ru_maxrss * 1024.0;
  floe_model_info now; /* the device memory held with the session still open */
  floe_engine_info(e, &now);
  const char *names[6] = { "attn", "gdn", "router", "experts", "lm_head", "other" };
  const double per = n_gen > 0 ? 1e3 / (double)n_gen : 0;
  if (json) {
    printf("{\"bench\":\"model\",\"model\":");
    json_str(ep.model);
    printf(",\"arch\":");
    json_str(info.arch ? info.arch : "?");
    printf(",\"threads\":%d,\"n_prompt\":%lld,\"n_gen\":%lld,\"depth\":%lld,\"reps\":%d,\"exact_act\":%s,"
           "\"kv\":\"%s\",\"load\":\"%s\",\"load_s\":%.3f,\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.3f,\"ttft_ms\":%.2f,"
           "\"peak_rss_bytes\":%.0f,\"weight_bytes_per_token\":%llu,\"achieved_gbps\":%.2f,",
           ep.n_threads, (long long)n_prompt, (long long)n_gen, (long long)depth, reps, sp.exact_act ? "true" : "false",
           sp.kv_f32 ? "f32" : "bf16", info.copied ? "copy" : "mmap", t_load, pf_tps, dc_tps, t_pf * 1e3, rss, (unsigned long long)info.decode_bytes,
           gbps);
    printf("\"lanes_bytes\":%llu,", (unsigned long long)info.lanes_bytes);
    printf("\"device\":\"%s\",\"gpu_name\":", info.device ? info.device : "cpu");
    json_str(info.gpu_name);
    printf(",\"vram_bytes\":%llu,\"vram_used_bytes\":%llu,", (unsigned long long)info.vram_bytes,
           (unsigned long long)now.vram_used_bytes);
    if (bw > 0) printf("\"bw_gbps\":%.2f,\"roofline_frac\":%.4f,", bw, gbps / bw);
    else printf("\"bw_gbps\":null,\"roofline_frac\":null,");
    if (wgbps > 0)
      printf("\"weights_read_gbps\":%.2f,\"weights_read_gbps_before\":%.2f,\"weights_read_gbps_after\":%.2f,"
             "\"weights_roofline_frac\":%.4f,", wgbps, wbw[0], wbw[1], gbps / wgbps);
    else printf("\"weights_read_gbps\":null,\"weights_roofline_frac\":null,");
    if (n_gen > 0) cli_stream_stats(stdout, e, &dst[rmed], n_gen, dc[rmed], true);
    if (n_gen > 0) tier_stats(&dst[rmed], n_gen, dc[rmed], true);
    if (n_gen > 0 && ep.mem_budget) {
      printf("\"prefault_wait_s\":%.3f,", t_pfw);
      const double ms = dc[rmed] * 1e3 / (double)n_gen, ser = dst[rmed].serial_s * 1e3 / (double)n_gen;
      const double bpt = (double)dst[rmed].bytes_read / (double)n_gen;
      if (disk_bw > 0) {
        const double io = bpt / (disk_bw * 1e9) * 1e3;
        /* compute: the time the forward pass did not wait for reads; when it exceeds the I/O
         * roofline the run is compute-bound and bound_frac compares with it instead */
        const double cmp = ms - dst[rmed].io_wait_s * 1e3 / (double)n_gen, bound = io + ser > cmp ? io + ser : cmp;
        printf("\"disk_gb_s\":%.3f,\"io_ms_per_token\":%.3f,\"io_roofline_ms_per_token\":%.3f,"
               "\"io_roofline_frac\":%.4f,\"compute_ms_per_token\":%.3f,\"bound\":\"%s\",\"bound_frac\":%.4f,",
               disk_bw, io, io + ser, ms > 0 ? (io + ser) / ms : 0.0, cmp, io + ser > cmp ? "io" : "compute",
               ms > 0 ? bound / ms : 0.0);
      } else {
        printf("\"disk_gb_s\":null,\"io_ms_per_token\":null,\"io_roofline_ms_per_token\":null,\"io_roofline_frac\":null,");
      }
    }
    printf("\"decode_ms_per_token\":{");
    for (int i = 0; i < 6; i++) printf("%s\"%s\":%.3f", i ? "," : "", names[i], p[i] * per);
    printf(",\"total\":%.3f}", p[6] * per);
    if (n_prompt > 0) {
      int pm = 0; /* the prefill run closest to the median */
      for (int r = 1; r < reps; r++)
        if (fabs(pf[r] - t_pf) < fabs(pf[pm] - t_pf)) pm = r;
      printf(",\"prefill_ms_per_token\":{");
      for (int i = 0; i < 6; i++) printf("%s\"%s\":%.3f", i ? "," : "", names[i], pph[6 * pm + i] * 1e3 / (double)n_prompt);
      printf("}");
    }
    printf("}\n");
  } else {
    printf("model %s (%s), %d threads, %s activations, %s KV; load %.2f s (%s", ep.model,
           info.arch ? info.arch : "?", ep.n_threads, sp.exact_act ? "exact float" : "8-bit", sp.kv_f32 ? "F32" : "BF16",
           t_load, info.copied ? "read into huge pages" : "mapped");
    if (info.lanes_bytes) printf(", %.2f GB repacked for the CPU", (double)info.lanes_bytes / 1e9);
    printf(")\n");
    if (n_prompt > 0)
      printf("prefill %lld tokens: %.1f tok/s, time to first token %.1f ms (median of %d)\n", (long long)n_prompt,
             pf_tps, t_pf * 1e3, reps);
    if (n_gen > 0) {
      printf("decode %lld tokens at depth %lld: %.2f tok/s, %.2f ms/token, %.1f GB/s of weights (%.1f MB/token)",
             (long long)n_gen, (long long)depth, dc_tps, t_dc * per, gbps, (double)info.decode_bytes / 1e6);
      if (bw > 0) printf(", %.1f %% of the %.1f GB/s roofline", 100.0 * gbps / bw, bw);
      if (wgbps > 0) printf(", %.1f %% of the weights' own read bandwidth (%.1f GB/s)", 100.0 * gbps / wgbps, wgbps);
      printf("\nphases (ms/token):");
      for (int i = 0; i < 6; i++) printf(" %s %.2f", names[i], p[i] * per);
      printf("\n");
    }
    if (n_gen > 0) tier_stats(&dst[rmed], n_gen, dc[rmed], false);
    if (n_gen > 0 && ep.mem_budget) {
      cli_stream_stats(stdout, e, &dst[rmed], n_gen, dc[rmed], false);
      if (disk_bw > 0) {
        const double ms = dc[rmed] * 1e3 / (double)n_gen, ser = dst[rmed].serial_s * 1e3 / (double)n_gen;
        const double io = (double)dst[rmed].bytes_read / (double)n_gen / (disk_bw * 1e9) * 1e3;
        printf("I/O roofline: %.1f ms/token read at %.2f GB/s + %.1f ms serial compute = %.1f ms/token; "
               "measured %.1f ms/token: %.1f %% of the roofline\n",
               io, disk_bw, ser, io + ser, ms, ms > 0 ? 100.0 * (io + ser) / ms : 0.0);
      }
    }
    printf("peak RSS %.1f MiB", rss / 1048576.0);
    if (now.vram_used_bytes) printf(", VRAM used %.2f GiB", (double)now.vram_used_bytes / 1073741824.0);
    printf("\n");
  }
  if (mtp > -2 && n_gen > 0 && info.n_mtp > 0 && bench_mtp(e, s, mtp, n_gen, reps, json)) goto done;
  rc = 0;
done:
  free(ids);
  free(logits);
  free(pf);
  free(dc);
  free(ph);
  free(pph);
  free(dst);
  floe_session_free(s);
  floe_engine_close(e);
  return rc;
}
