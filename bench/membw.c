/* Read bandwidth of main memory with 1 and 2 threads (kern_read_xor's AVX-512 loads, the loop
 * floe_engine_read_bandwidth uses on the weights, when floe's kernels run AVX-512; AVX2 otherwise), over a buffer much larger than the last-level cache (default 2.5 GiB; this CPU has
 * a 260 MiB L3). Each thread streams its half (or all) of the buffer; the best of several passes
 * is reported. Prints one JSON object per thread count:
 *   {"bench":"membw","threads":1,"bytes":...,"gbps":...}
 * Then the load-to-use latency of a random chase: {"bench":"memlat","bytes":...,"ns":...}.
 * Usage: membw [size, e.g. 3G] [passes] */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kernels/cpu/kernels.h"

typedef struct { const uint8_t *p; size_t n; uint64_t sink; } job;

__attribute__((target("avx2"))) static uint64_t read256(const uint8_t *p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
  }
  a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  uint64_t v[4];
  memcpy(v, &a0, 32);
  return v[0] ^ v[1] ^ v[2] ^ v[3];
}

static int g_avx512;

static void *run(void *arg) {
  job *j = arg;
  j->sink = g_avx512 ? kern_read_xor(j->p, j->n) : read256(j->p, j->n);
  return NULL;
}

int main(int argc, char **argv) {
  uint64_t size = 2560ull << 20;
  int passes = 5;
  if (argc > 1 && floe_parse_size(argv[1], &size) != 0) {
    fprintf(stderr, "membw: bad size %s\n", argv[1]);
    return 2;
  }
  if (argc > 2) passes = atoi(argv[2]);
  g_avx512 = kern_isa_get() == FLOE_ISA_AVX512;
  size &= ~(uint64_t)4095;
  uint8_t *buf = floe_aligned_alloc(4096, size);
  if (!buf) {
    fprintf(stderr, "membw: cannot allocate %llu bytes\n", (unsigned long long)size);
    return 1;
  }
  for (uint64_t i = 0; i < size; i += 8) *(uint64_t *)(buf + i) = i * 0x9E3779B97F4A7C15ull;
  uint64_t sink = 0;
  for (int nt = 1; nt <= 2; nt++) {
    double best = 0;
    for (int p = 0; p < passes; p++) {
      job jobs[2];
      pthread_t th[2];
      size_t part = (size / (uint64_t)nt) & ~(uint64_t)255;
      double t0 = floe_time_s();
      for (int t = 0; t < nt; t++) {
        jobs[t] = (job){buf + (size_t)t * part, part, 0};
        if (t) pthread_create(&th[t], NULL, run, &jobs[t]);
      }
      run(&jobs[0]);
      for (int t = 1; t < nt; t++) pthread_join(th[t], NULL);
      double dt = floe_time_s() - t0;
      for (int t = 0; t < nt; t++) sink ^= jobs[t].sink;
      double gbps = (double)part * nt / dt / 1e9;
      if (gbps > best) best = gbps;
    }
    printf("{\"bench\":\"membw\",\"threads\":%d,\"bytes\":%llu,\"isa\":\"%s\",\"gbps\":%.2f}\n", nt,
           (unsigned long long)size, g_avx512 ? "avx512" : "avx2", best);
  }
  /* Latency: a dependent chase through a 1 GiB buffer in 2 MiB pages (the model's are), one load
   * per line, each P lines after the last (mod the line count; P odd and ~0.38 of it, so far
   * beyond what the prefetchers follow), 2M steps. The decode streams are latency-bound per core
   * (~16 GB/s a core here): when this machine's latency moves (150-310 ns seen), decode moves
   * with it more than the streaming figures above do. */
  {
    const uint64_t lb = 1ull << 30, lines = lb / 64, P = (uint64_t)(lines * 0.382) | 1;
    uint64_t *ln = floe_huge_alloc(lb);
    if (ln) {
      for (uint64_t i = 0; i < lines; i++) ln[i * 8] = (i + P) % lines;
      const int steps = 2000000;
      uint64_t p = 0;
      const double t0 = floe_time_s();
      for (int i = 0; i < steps; i++) p = ln[p * 8];
      const double dt = floe_time_s() - t0;
      sink ^= p;
      printf("{\"bench\":\"memlat\",\"bytes\":%llu,\"ns\":%.1f}\n", (unsigned long long)lb, dt / steps * 1e9);
      floe_aligned_free(ln);
    }
  }
  fprintf(stderr, "(sink %llx)\n", (unsigned long long)sink);
  floe_aligned_free(buf);
  return 0;
}
