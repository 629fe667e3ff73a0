/* Batched quantized matmul: the nb <= 16 AVX-512 kernel (kern_mm_q_avx512) against the batched
 * one (kern_gemm_q_avx512), one thread, activations quantized beforehand (not timed); times are
 * thread CPU time (other processes share the 2 cores; this VM shows no steal time).
 *
 * Prints one JSON object per (shape, nb, kernel): ns per call, core cycles per (weight row,
 * activation row, superblock of 256 weights) and the fraction of the int8 VNNI peak that is
 * (256 MACs per superblock; peak = 2 vpdpbusd zmm per cycle = 128 MACs/cycle, so the floor is 2
 * cycles). Core clock: measured with a dependent imul chain (3 cycles per imul).
 * Kernels: mm_q (kern_mm_q_avx512), gemm (kern_gemm_q_avx512), lanes (the batched kernel on the
 * same matrices packed by kern_k4_lanes_pack); every one's last call is checked bit for bit.
 * Usage: bench_gemm [--shapes 512x2048,2048x512] [--nb 1,4,8,16,64 (<= 512; > 16: batched kernel only)] [--mats N] [--secs S] [--type q4_K|q5_K]
 * --mats N cycles through N distinct weight matrices (N large = weights from DRAM). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/kernels_internal.h"

#define NBMAX 512 /* the batched kernel takes any nb; kern_mm_q_avx512 at most 16 */

/* CPU time of this thread: other processes share the 2 cores, and time spent descheduled is not
 * the kernel's (this VM shows no steal time, so thread CPU time is core time) */
static double thread_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double ghz(void) {
  const int64_t n = 30000000;
  double best = 0;
  for (int t = 0; t < 3; t++) {
    uint64_t x = 3;
    double t0 = thread_s();
    for (int64_t i = 0; i < n; i++) __asm__ volatile("imul %0, %0" : "+r"(x));
    double s = thread_s() - t0;
    if (3.0 * (double)n / s / 1e9 > best) best = 3.0 * (double)n / s / 1e9;
  }
  return best;
}

int main(int argc, char **argv) {
  const char *shapes = "512x2048,2048x512", *nbs = "1,2,4,8,12,16";
  int nmats = 1;
  double secs = 0.3;
  uint32_t type = FLOE_TYPE_Q4_K;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
    else if (!strcmp(argv[i], "--nb") && i + 1 < argc) nbs = argv[++i];
    else if (!strcmp(argv[i], "--mats") && i + 1 < argc) nmats = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--secs") && i + 1 < argc) secs = atof(argv[++i]);
    else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
      i++;
      type = !strcmp(argv[i], "q5_K") ? FLOE_TYPE_Q5_K : FLOE_TYPE_Q4_K;
    } else {
      fprintf(stderr, "usage: bench_gemm [--shapes RxC,...] [--nb 1,4,16] [--mats N] [--secs S] [--type q4_K|q5_K]\n");
      return 2;
    }
  }
  if (kern_isa_set(FLOE_ISA_AVX512) < 0 || nmats < 1) {
    fprintf(stderr, "bench_gemm: needs AVX-512 VNNI/VBMI/GFNI and --mats >= 1\n");
    return 1;
  }
  const double f = ghz();
  floe_rng rng;
  floe_rng_seed(&rng, 11);
  for (const char *sp = shapes; *sp;) {
    long long rows = 0, cols = 0;
    if (sscanf(sp, "%lldx%lld", &rows, &cols) != 2 || rows < 1 || cols < 256 || cols % 256) {
      fprintf(stderr, "bench_gemm: bad shape %s\n", sp);
      return 2;
    }
    floe_mat W = {0};
    W.type = type;
    W.rows = rows;
    W.cols = cols;
    W.row_bytes = floe_row_bytes(type, cols);
    const size_t mb = W.row_bytes * (size_t)rows;
    uint8_t *data = floe_aligned_alloc(64, mb * (size_t)nmats);
    quant_fill_random(type, &rng, data, (int64_t)nmats * rows * cols / 256, 1.0f);
    float *X = malloc(sizeof(float) * NBMAX * (size_t)cols), *Y = malloc(sizeof(float) * NBMAX * (size_t)rows);
    for (int64_t i = 0; i < NBMAX * cols; i++) X[i] = floe_rng_normal(&rng);
    const size_t ab = kern_act_bytes(&W);
    uint8_t *xq = floe_aligned_alloc(64, ab * NBMAX);
    kern_act_quantize_rows(&W, NBMAX, X, cols, xq, ab);
    /* the same matrices with the rows in the lanes (kern_k4_lanes_pack) */
    uint8_t *ldata = floe_aligned_alloc(64, mb * (size_t)nmats);
    memcpy(ldata, data, mb * (size_t)nmats);
    for (int m = 0; m < nmats; m++) {
      floe_mat P = W;
      P.data = ldata + (size_t)m * mb;
      kern_k4_lanes_pack(&P, ldata + (size_t)m * mb);
    }
    float *Y0 = malloc(sizeof(float) * NBMAX * (size_t)rows);
    for (const char *np = nbs; *np;) {
      const int nb = atoi(np);
      for (int kern = nb > 16; kern < 3 && nb >= 1 && nb <= NBMAX; kern++) {
        floe_mat WL = W;
        WL.k4_lanes = kern == 2;
        double best = 1e30;
        int64_t m = 0;
        for (int trial = 0; trial < 5; trial++) {
          int64_t calls = 0;
          double t0 = thread_s(), t;
          do {
            for (int i = 0; i < 8; i++, calls++, m = (m + 1) % nmats) {
              W.data = data + (size_t)m * mb;
              WL.data = ldata + (size_t)m * mb;
              if (kern == 2) kern_gemm_q_avx512(&WL, nb, xq, ab, Y, rows, 0, rows);
              else if (kern) kern_gemm_q_avx512(&W, nb, xq, ab, Y, rows, 0, rows);
              else kern_mm_q_avx512(&W, nb, NULL, 0, xq, ab, Y, rows, 0, rows);
            }
            t = thread_s() - t0;
          } while (t < secs / 5);
          if (t / (double)calls < best) best = t / (double)calls;
        }
        /* the last call's matrix m - 1 against the batched kernel on the file's layout, bit for bit */
        const int lm = (int)((m + nmats - 1) % nmats);
        W.data = data + (size_t)lm * mb;
        kern_gemm_q_avx512(&W, nb, xq, ab, Y0, rows, 0, rows);
        if (memcmp(Y0, Y, sizeof(float) * (size_t)nb * (size_t)rows)) {
          fprintf(stderr, "bench_gemm: kernel %d differs from the batched kernel (nb %d)\n", kern, nb);
          return 3;
        }
        const double cyc = best * f * 1e9 / ((double)rows * nb * (double)(cols / 256));
        printf("{\"bench\":\"gemm\",\"type\":\"%s\",\"kernel\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"nb\":%d,\"mats\":%d,\"ghz\":%.2f,"
               "\"us_per_call\":%.2f,\"cyc_per_row_sb\":%.2f,\"vnni_frac\":%.3f,\"gbps\":%.2f}\n",
               type == FLOE_TYPE_Q4_K ? "q4_K" : "q5_K", kern == 2 ? "lanes" : kern ? "gemm" : "mm_q", rows, cols, nb, nmats, f, best * 1e6, cyc,
               2.0 / cyc, (double)mb / best / 1e9);
        fflush(stdout);
      }
      np = strchr(np, ',');
      np = np ? np + 1 : "";
    }
    floe_aligned_free(data);
    floe_aligned_free(ldata);
    free(Y0);
    floe_aligned_free(xq);
    free(X);
    free(Y);
    sp = strchr(sp, ',');
    sp = sp ? sp + 1 : "";
  }
  return 0;
}
