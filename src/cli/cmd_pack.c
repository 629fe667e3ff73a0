/* floe pack MODEL -o DIR: rewrites the routed experts expert-major (src/experts/pack.c), one 16 KiB
 * aligned block per expert in DIR/experts.floepack; `floe run -m DIR` then loads MODEL's non-expert
 * weights and reads each expert with one aligned read.
 *
 * Also the streaming options shared by run / bench (cli_stream_option) and their counters
 * (cli_stream_stats). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "experts/experts.h"
#include "floe.h"
#include "model/model.h"

static void usage(FILE *f) {
  fprintf(f, "usage: floe pack MODEL -o DIR\n"
             "  MODEL   GGUF file or HF / MLX safetensors directory\n"
             "  -o DIR  output directory (DIR/experts.floepack; the non-expert weights stay in MODEL,\n"
             "          which the pack names by absolute path: keep it in place)\n");
}

int cmd_pack(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  for (int i = 0; i < argc; i++) {
    if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (argv[i][0] != '-' && !in) in = argv[i];
    else {
      fprintf(stderr, "floe pack: unknown or incomplete option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!in || !out) {
    usage(stderr);
    return 2;
  }
  char err[512];
  model *m;
  if (xpack_is_dir(in)) return cli_fail("%s is already a pack", in);
  double t0 = floe_time_s();
  if (model_load(in, &m, err, sizeof err)) return cli_fail("%s", err);
  cli_progress pr;
  cli_progress_init(&pr, "pack", "MB", 1e6);
  floe_thread_progress_set(cli_progress_cb, &pr); /* xpack_write reports bytes written through it */
  int rc = model_pack_write(m, in, out, err, sizeof err);
  floe_thread_progress_set(NULL, NULL);
  cli_progress_done(&pr);
  model_free(m);
  if (rc) return cli_fail("%s", err);
  fprintf(stderr, "floe: packed %s into %s/%s in %.1f s\n", in, out, XPACK_FILE, floe_time_s() - t0);
  return 0;
}

int cli_device_option(const char *v, floe_engine_params *p) {
  long long idx = 0;
  if (!strcmp(v, "auto")) p->device = FLOE_DEVICE_AUTO;
  else if (!strcmp(v, "cpu")) p->device = FLOE_DEVICE_CPU;
  else if (!strcmp(v, "cuda")) p->device = FLOE_DEVICE_CUDA;
  else if (!strncmp(v, "cuda:", 5) && cli_parse_int(v + 5, 0, 255, &idx)) p->device = FLOE_DEVICE_CUDA;
  else return -1;
  p->device_index = (int)idx;
  return 0;
}

void cli_device_note(const floe_engine *e) {
  floe_model_info info;
  floe_engine_info(e, &info);
  if (info.device_note[0]) fprintf(stderr, "floe: %s\n", info.device_note);
  else if (info.gpu_name[0]) fprintf(stderr, "floe: running on %s\n", info.gpu_name);
}

int cli_stream_option(const char *a, const char *v, floe_engine_params *p) {
  uint64_t sz;
  if (!strcmp(a, "--direct")) return p->io_direct = true, 1;
  if (!strcmp(a, "--verify")) return p->io_verify = true, 1;
  if (!strcmp(a, "--no-prefault")) return p->io_no_prefault = true, 1;
  if (!strcmp(a, "--mmap")) return p->load = FLOE_LOAD_MMAP, 1;
  if (!strcmp(a, "--no-mmap")) return p->load = FLOE_LOAD_COPY, 1;
  if (!strcmp(a, "--device")) {
    if (!v || cli_device_option(v, p)) {
      fprintf(stderr, "floe: option --device needs cpu, cuda, cuda:N or auto\n");
      return -1;
    }
    return 2;
  }
  if (!strcmp(a, "--gpu-mem")) {
    if (!v || floe_parse_size(v, &sz) || sz == 0) {
      fprintf(stderr, "floe: option --gpu-mem needs a size (16G, 8G, ...)\n");
      return -1;
    }
    p->gpu_mem = sz;
    return 2;
  }
  if (strcmp(a, "--mem-budget") && strcmp(a, "--io") && strcmp(a, "--prefetch") && strcmp(a, "--cache") &&
      strcmp(a, "--io-depth") && strcmp(a, "--io-threads") && strcmp(a, "--io-chunk"))
    return 0;
  if (!v) goto bad;
  if (!strcmp(a, "--mem-budget")) {
    if (floe_parse_size(v, &sz) || sz == 0) goto bad;
    p->mem_budget = sz;
  } else if (!strcmp(a, "--io")) {
    if (!strcmp(v, "uring")) p->io = FLOE_IO_URING;
    else if (!strcmp(v, "pread")) p->io = FLOE_IO_PREAD;
    else goto bad;
  } else if (!strcmp(a, "--prefetch")) {
    p->prefetch = 0;
    if (strcmp(v, "none")) {
      char buf[64];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        if (!strcmp(t, "next")) p->prefetch |= FLOE_PREFETCH_NEXT;
        else if (!strcmp(t, "next-resid")) p->prefetch |= FLOE_PREFETCH_NEXT | FLOE_PREFETCH_RESID;
        else if (!strcmp(t, "prev")) p->prefetch |= FLOE_PREFETCH_PREV;
        else goto bad;
      }
    }
  } else if (!strcmp(a, "--cache")) {
    if (!strcmp(v, "lru")) p->cache_policy = FLOE_CACHE_LRU;
    else if (!strcmp(v, "lfu")) p->cache_policy = FLOE_CACHE_LFU;
    else goto bad;
  } else {
    char *end;
    long n = strtol(v, &end, 10);
    if (!strcmp(a, "--io-chunk")) {
      if (floe_parse_size(v, &sz) || sz < 4096 || sz > (64u << 20)) goto bad;
      p->io_chunk = sz;
    } else {
      if (*end || n < 1 || n > 4096) goto bad;
      if (!strcmp(a, "--io-depth")) p->io_depth = (int)n;
      else p->io_threads = (int)n;
    }
  }
  return 2;
bad:
  fprintf(stderr, "floe: option %s needs %s\n", a,
          !strcmp(a, "--mem-budget") ? "a size (2G, 512M, ...)"
          : !strcmp(a, "--io") ? "uring or pread"
          : !strcmp(a, "--prefetch") ? "none, next, next-resid, prev or a comma list"
          : !strcmp(a, "--cache") ? "lru or lfu" : "a positive number");
  return -1;
}

const char *cli_stream_help(void) {
  return "  --device D           cpu | cuda | cuda:N | auto (default: the GPU when there is one and the model fits)\n"
         "  --mmap               map the model file (default: read it into huge-page memory when it fits)\n"
         "  --no-mmap            always read the model file into memory\n"
         "  --gpu-mem SIZE       GPU memory for the weights (16G, ...): the routed experts beyond it stay in host\n"
         "                       memory, copied in or computed by the CPU as needed (same output, bit for bit)\n"
         "  --mem-budget SIZE    stream routed experts from disk within SIZE bytes of memory (2G, 512M, ...)\n"
         "  --io uring|pread     expert read engine (default pread: a thread pool, measured faster than uring)\n"
         "  --direct             O_DIRECT expert reads (default buffered, no readahead)\n"
         "  --prefetch P         none | next (next layer's router) | next-resid (that router on the residual\n"
         "                       stream) | prev (previous token) | next,prev (default next)\n"
         "  --no-prefault        don't populate the expert cache in the background at start\n"
         "  --cache lru|lfu      expert cache replacement (default lru)\n"
         "  --io-depth N --io-threads N --io-chunk SIZE   reads in flight, pread workers, split size\n"
         "  --verify             pack layout: check every expert block's checksum\n";
}

void cli_stream_stats(FILE *f, const floe_engine *e, const floe_session_stats *st, int64_t n_tok, double secs,
                      bool json) {
  floe_model_info info;
  floe_engine_info(e, &info);
  const double per = n_tok > 0 ? 1.0 / (double)n_tok : 0;
  const uint64_t look = st->expert_hits + st->expert_misses;
  if (json) {
    fprintf(f, "\"mem_budget\":%llu,\"resident_bytes\":%llu,\"cache_bytes\":%llu,\"cache_slots\":%lld,",
            (unsigned long long)info.mem_budget, (unsigned long long)info.resident_bytes,
            (unsigned long long)info.cache_bytes, (long long)info.cache_slots);
    fprintf(f, "\"bytes_read_per_token\":%.0f,\"read_gb_s\":%.3f,\"expert_hit_rate\":%.4f,", (double)st->bytes_read * per,
            secs > 0 ? (double)st->bytes_read / secs / 1e9 : 0.0, look ? (double)st->expert_hits / (double)look : 0.0);
    if (st->prefetch_precision >= 0)
      fprintf(f, "\"prefetch_precision\":%.4f,\"prefetch_recall\":%.4f,", st->prefetch_precision, st->prefetch_recall);
    else fprintf(f, "\"prefetch_precision\":null,\"prefetch_recall\":null,");
    fprintf(f, "\"prefetch_issued\":%llu,\"prefetch_used\":%llu,\"io_wait_ms_per_token\":%.3f,",
            (unsigned long long)st->prefetch_issued, (unsigned long long)st->prefetch_used, st->io_wait_s * 1e3 * per);
    fprintf(f, "\"disk_busy_ms_per_token\":%.3f,\"serial_ms_per_token\":%.3f,\"prefault_s\":%.4f,",
            st->disk_busy_s * 1e3 * per, st->serial_s * 1e3 * per, st->prefault_s);
    return;
  }
  if (!info.mem_budget) {
    fprintf(f, "floe: experts resident (no --mem-budget)\n");
    return;
  }
  fprintf(f,
          "floe: budget %.2f GiB = resident weights %.2f GiB + expert cache %.2f GiB (%lld slots of %.2f MiB) + "
          "sessions\n",
          info.mem_budget / 1073741824.0, info.resident_bytes / 1073741824.0, info.cache_bytes / 1073741824.0,
          (long long)info.cache_slots, info.expert_slot_bytes / 1048576.0);
  fprintf(f, "floe: experts: %.1f MB read/token, %.2f GB/s, hit rate %.3f (%llu hits, %llu misses), io wait %.2f ms/token\n",
          (double)st->bytes_read * per / 1e6, secs > 0 ? (double)st->bytes_read / secs / 1e9 : 0.0,
          look ? (double)st->expert_hits / (double)look : 0.0, (unsigned long long)st->expert_hits,
          (unsigned long long)st->expert_misses, st->io_wait_s * 1e3 * per);
  fprintf(f, "floe: disk busy %.1f ms/token, serial compute %.1f ms/token%s\n", st->disk_busy_s * 1e3 * per,
          st->serial_s * 1e3 * per, st->prefault_s > 0 ? "" : " (cache arena still being populated, or off)");
  if (st->prefetch_precision >= 0)
    fprintf(f, "floe: prefetch: precision %.3f recall %.3f, %llu reads issued, %llu used, %llu evicted unused\n",
            st->prefetch_precision, st->prefetch_recall, (unsigned long long)st->prefetch_issued,
            (unsigned long long)st->prefetch_used, (unsigned long long)st->prefetch_wasted);
  fprintf(f, "floe: hit rate per layer:");
  for (int64_t l = 0; l < info.n_layer; l++) {
    uint64_t h, mi;
    floe_engine_layer_stats(e, l, &h, &mi);
    fprintf(f, " %.2f", h + mi ? (double)h / (double)(h + mi) : 0.0);
  }
  fprintf(f, "\n");
}
