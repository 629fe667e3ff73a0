/* Matrix x vector / small-batch throughput of the CPU kernels, out of cache.
 *
 * For each type and shape, a buffer of >= 2 GiB (default 2.25 GiB, far above the 260 MiB L3) is
 * filled with random valid blocks and cut into as many distinct matrices as fit; the timed loop
 * cycles through them so every call streams its weights from DRAM, like MoE expert matmuls.
 * GB/s = weight bytes (codes + scales + biases for MLX) / time. Activation quantization is
 * included (kern_matmul_q_mt quantizes once per call). Prints one JSON object per case:
 *   {"bench":"matvec","type":"q4_K","shape":"expert_gate","rows":512,"cols":2048,"threads":1,
 *    "nb":1,"path":"quant","isa":"avx512","gbps":..,"pct_bw":..,"us_per_call":..,"row_speedup":..}
 * row_speedup (nb > 1) = time per activation row at nb=1 / time per activation row at nb.
 * Usage: bench_matvec [--bw1 GBPS] [--bw2 GBPS] [--types q4_K,q8_0,...] [--shapes expert|all|RxC,RxC..]
 *                     [--nb 1,8,16] [--threads 1,2] [--secs 0.4] [--float] [--total 2304M]
 * --threads 1|2|1,2: thread counts to run (default both).
 * --shapes RxC,...: custom shapes (rows x cols), e.g. 512x2048,2048x2048 to separate the fixed
 * per-call cost from the per-byte cost. 
 * --float: exact float path; --total: weight buffer size (small = in-cache compute ceiling).
 * --lanes: Q4_K / Q5_K matrices packed with the rows in the lanes first (kern_k4_lanes_pack, as a
 * model read into memory is; "layout":"lanes" in the output). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/kernels.h"

typedef struct { const char *name; int64_t rows, cols; } shape;
static const shape shapes_all[] = {
    {"expert_gate", 512, 2048}, {"expert_down", 2048, 512}, {"attn_q", 8192, 2048}, {"attn_o", 2048, 4096}};

static double bw[3];
#define MAX_CUSTOM 16
static shape custom[MAX_CUSTOM];
static int n_custom;

/* "RxC,RxC,..." -> custom[]; 0 on success */
static int parse_shapes(const char *s) {
  while (*s && n_custom < MAX_CUSTOM) {
    char *e;
    long long r = strtoll(s, &e, 10);
    if (*e != 'x' || r < 2) return -1;
    long long c = strtoll(e + 1, &e, 10);
    if (c < 256 || c % 256 || (*e && *e != ',')) return -1;
    custom[n_custom++] = (shape){"custom", r, c};
    s = *e ? e + 1 : e;
  }
  return *s ? -1 : 0;
}

/* CPU seconds of the whole process (all threads): with other processes on the machine, wall time
 * per call is noisy while CPU time per call stays close to the in-isolation compute cost. */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double secs = 0.4;
static int force_float, lanes;

static void run_case(const char *tname, floe_mat *mats, int64_t nmat, size_t mat_bytes, floe_pool *pool, int nth, int nb,
                     double *t_nb1) {
  const floe_mat *W0 = &mats[0];
  float *X = malloc(sizeof(float) * (size_t)(nb * W0->cols));
  float *Y = malloc(sizeof(float) * (size_t)(nb * W0->rows));
  floe_rng r;
  floe_rng_seed(&r, 7);
  for (int64_t i = 0; i < nb * W0->cols; i++) X[i] = floe_rng_normal(&r);
  size_t ab = force_float ? 0 : kern_act_bytes(W0);
  void *xq = floe_aligned_alloc(64, ab ? ab * (size_t)nb : 64);
  /* warm-up: one full cycle (page faults, prefetch state) */
  int64_t calls = 0;
  for (int64_t k = 0; k < nmat; k++) {
    if (ab) kern_matmul_q_mt(pool, &mats[k], nb, X, W0->cols, xq, Y, W0->rows);
    else kern_matmul_mt(pool, &mats[k], nb, X, W0->cols, NULL, 0, Y, W0->rows);
  }
  /* best of 5 trials (other processes share this machine; the best trial is the kernel's) */
  double per = 1e30, cpu_per = 0;
  int64_t k = 0;
  for (int trial = 0; trial < 5; trial++) {
    double t0 = floe_time_s(), c0 = cpu_s(), t;
    calls = 0;
    do {
      for (int i = 0; i < 16; i++, k = (k + 1) % nmat, calls++) {
        if (ab) kern_matmul_q_mt(pool, &mats[k], nb, X, W0->cols, xq, Y, W0->rows);
        else kern_matmul_mt(pool, &mats[k], nb, X, W0->cols, NULL, 0, Y, W0->rows);
      }
      t = floe_time_s() - t0;
    } while (t < secs / 5);
    if (t / (double)calls < per) {
      per = t / (double)calls;
      cpu_per = (cpu_s() - c0) / (double)calls;
    }
  }
  double gbps = (double)mat_bytes / per / 1e9;
  printf("{\"bench\":\"matvec\",\"type\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"threads\":%d,\"nb\":%d,\"path\":\"%s\",\"isa\":\"%s\","
         "\"layout\":\"%s\",\"gbps\":%.2f,\"pct_bw\":%.1f,\"us_per_call\":%.2f,\"cpu_us_per_call\":%.2f",
         tname, (long long)W0->rows, (long long)W0->cols, nth, nb, ab ? "quant" : "float", kern_isa_name(kern_isa_get()),
         W0->k4_lanes ? "lanes" : "file", gbps,
         bw[nth] > 0 ? 100.0 * gbps / bw[nth] : 0.0, per * 1e6, cpu_per * 1e6);
  if (nb == 1) *t_nb1 = per;
  else if (*t_nb1 > 0) printf(",\"row_speedup\":%.2f", *t_nb1 / (per / nb));
  printf("}\n");
  fflush(stdout);
  floe_aligned_free(xq);
  free(X), free(Y);
}

static int in_list(const char *list, const char *name) {
  if (!list) return 1;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncasecmp(p, name, n) == 0) return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *types = NULL, *nbs = "1,8,16";
  int all_shapes = 1, th_lo = 1, th_hi = 2;
  uint64_t total = 2304ull << 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bw1") && i + 1 < argc) bw[1] = atof(argv[++i]);
    else if (!strcmp(argv[i], "--bw2") && i + 1 < argc) bw[2] = atof(argv[++i]);
    else if (!strcmp(argv[i], "--types") && i + 1 < argc) types = argv[++i];
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
      const char *v = argv[++i];
      if (!strcmp(v, "expert")) all_shapes = 0;
      else if (strcmp(v, "all") && parse_shapes(v) != 0) {
        fprintf(stderr, "bench_matvec: bad --shapes %s (expert, all or RxC,... with C a multiple of 256)\n", v);
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--nb") && i + 1 < argc) nbs = argv[++i];
    else if (!strcmp(argv[i], "--secs") && i + 1 < argc) secs = atof(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      const char *v = argv[++i];
      th_lo = v[0] == '2' ? 2 : 1;
      th_hi = strchr(v, '2') ? 2 : 1;
    }
    else if (!strcmp(argv[i], "--float")) force_float = 1;
    else if (!strcmp(argv[i], "--lanes")) lanes = 1;
    else if (!strcmp(argv[i], "--total") && i + 1 < argc) {
      if (floe_parse_size(argv[++i], &total) != 0) return 2;
    }
    else {
      fprintf(stderr, "usage: bench_matvec [--bw1 G] [--bw2 G] [--types a,b] [--shapes expert|all|RxC,..] [--nb 1,8,16] [--threads 1,2] [--secs S] [--float] [--lanes] [--total SIZE]\n");
      return 2;
    }
  }
  uint8_t *buf = floe_aligned_alloc(4096, total);
  if (!buf) return 1;
  floe_pool *pool2 = floe_pool_create(2);
  floe_rng rng;
  floe_rng_seed(&rng, 1);

  /* ggml types, then MLX 4/8-bit (group 64, bf16 scales as mlx-community ships them) */
  static const uint32_t tl[] = {FLOE_TYPE_Q4_K, FLOE_TYPE_Q8_0, FLOE_TYPE_IQ4_XS, FLOE_TYPE_Q4_0, FLOE_TYPE_Q5_K, FLOE_TYPE_Q6_K,
                                FLOE_TYPE_IQ4_NL, FLOE_TYPE_MXFP4, FLOE_TYPE_Q4_1, FLOE_TYPE_Q5_0, FLOE_TYPE_Q5_1, FLOE_TYPE_Q2_K,
                                FLOE_TYPE_Q3_K, FLOE_TYPE_IQ2_XXS, FLOE_TYPE_IQ2_XS, FLOE_TYPE_IQ2_S, FLOE_TYPE_IQ3_XXS,
                                FLOE_TYPE_IQ3_S, FLOE_TYPE_IQ1_S, FLOE_TYPE_IQ1_M, FLOE_TYPE_BF16, FLOE_TYPE_F16, FLOE_TYPE_F32,
                                FLOE_TYPE_MLX, FLOE_TYPE_MLX + 1};
  for (size_t ti = 0; ti < sizeof tl / sizeof tl[0]; ti++) {
    uint32_t type = tl[ti] > FLOE_TYPE_MLX ? FLOE_TYPE_MLX : tl[ti];
    int mlx_bits = tl[ti] == FLOE_TYPE_MLX ? 4 : 8;
    char tname[32];
    if (type == FLOE_TYPE_MLX) snprintf(tname, sizeof tname, "mlx%d_g64_bf16", mlx_bits);
    else snprintf(tname, sizeof tname, "%s", floe_type_info(type)->name);
    if (!in_list(types, tname)) continue;
    /* fill the whole buffer once per type */
    uint8_t *sbbuf = NULL;
    if (type == FLOE_TYPE_MLX) {
      for (uint64_t i = 0; i < total; i += 8) *(uint64_t *)(buf + i) = floe_rng_u64(&rng);
      size_t sbn = total / 16; /* generous: group 64 -> 2 bf16 per 64 codes*bits/8 bytes */
      sbbuf = malloc(sbn);
      for (size_t i = 0; i + 1 < sbn; i += 2) {
        float v = 0.01f + 0.001f * (float)(i % 97);
        uint16_t h = floe_f32_to_bf16((i / 2) % 2 ? -v * 8 : v);
        memcpy(sbbuf + i, &h, 2);
      }
    } else {
      const floe_type_traits *tt = floe_type_info(type);
      quant_fill_random(type, &rng, buf, (int64_t)(total / (uint64_t)tt->bytes), 1.0f);
    }
    const size_t nshapes = n_custom ? (size_t)n_custom : sizeof shapes_all / sizeof shapes_all[0];
    for (size_t si = 0; si < nshapes; si++) {
      if (!n_custom && !all_shapes && si >= 2) break;
      const shape *sh = n_custom ? &custom[si] : &shapes_all[si];
      floe_mat W = {0};
      W.type = type;
      W.rows = sh->rows;
      W.cols = sh->cols;
      size_t mat_bytes, sb_mat = 0;
      if (type == FLOE_TYPE_MLX) {
        W.mlx = (quant_mlx_fmt){mlx_bits, 64, FLOE_TYPE_BF16};
        W.row_bytes = quant_mlx_row_bytes(&W.mlx, W.cols);
        W.sb_row_bytes = (size_t)(W.cols / 64) * 2;
        sb_mat = W.sb_row_bytes * (size_t)W.rows;
        mat_bytes = W.row_bytes * (size_t)W.rows + 2 * sb_mat;
      } else {
        W.row_bytes = floe_row_bytes(type, W.cols);
        mat_bytes = W.row_bytes * (size_t)W.rows;
      }
      size_t code_bytes = W.row_bytes * (size_t)W.rows;
      int64_t nmat = (int64_t)(total / code_bytes);
      if (type == FLOE_TYPE_MLX && (size_t)nmat * 2 * sb_mat > total / 16) nmat = (int64_t)(total / 16 / (2 * sb_mat));
      floe_mat *mats = malloc(sizeof(floe_mat) * (size_t)nmat);
      for (int64_t k = 0; k < nmat; k++) {
        mats[k] = W;
        mats[k].data = buf + (size_t)k * code_bytes;
        if (type == FLOE_TYPE_MLX) {
          mats[k].scales = sbbuf + (size_t)k * 2 * sb_mat;
          mats[k].biases = sbbuf + (size_t)k * 2 * sb_mat + sb_mat;
        }
        if (lanes && kern_k4_lanes_ok(&mats[k])) kern_k4_lanes_pack(&mats[k], buf + (size_t)k * code_bytes);
      }
      for (int nth = th_lo; nth <= th_hi; nth++) {
        double t1 = 0;
        for (const char *p = nbs; *p;) {
          int nb = atoi(p);
          if (nb >= 1 && nb <= 16) run_case(tname, mats, nmat, mat_bytes, nth == 1 ? NULL : pool2, nth, nb, &t1);
          const char *e = strchr(p, ',');
          if (!e) break;
          p = e + 1;
        }
      }
      free(mats);
    }
    free(sbbuf);
  }
  floe_pool_free(pool2);
  floe_aligned_free(buf);
  return 0;
}
