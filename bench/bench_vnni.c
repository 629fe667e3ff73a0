/* bench_vnni: what bounds the Q4_K / Q5_K lanes kernel's inner step on this CPU (a microbenchmark,
 * no floe code): vpdpbusd zmm throughput by the number of independent chains (the latency shows
 * as chains * cycles per op), then one 16-row block's superblock against 4 activation rows as
 * kernels_gemm_avx512.c tok_sb runs it (32 code vectors, 256 vpdpbusd, the scale steps), with the
 * activation dwords broadcast from memory (as the kernel does), from registers (no loads: the
 * ceiling), and with two blocks sharing each broadcast (the paired-layout experiment, 95a6edb).
 * Cycles at the clock given (--ghz, default 3.55: measure it; the VM hides the PMU).
 *
 * bench_vnni [--ghz G] [-n ITERS] */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vnni"), noinline))

static double now(void) {
  struct timespec a;
  clock_gettime(CLOCK_MONOTONIC, &a);
  return a.tv_sec + a.tv_nsec * 1e-9;
}

/* NC independent vpdpbusd chains, n rounds: returns a checksum */
#define CHAINS(NC)                                                                    \
  TGT static int chains##NC(long n) {                                                 \
    __m512i a[NC], x = _mm512_set1_epi32(0x01010101), y = _mm512_set1_epi32(0x0202); \
    for (int i = 0; i < NC; i++) a[i] = _mm512_set1_epi32(i);                         \
    for (long r = 0; r < n; r++) {                                                    \
      _Pragma("GCC unroll 16") for (int i = 0; i < NC; i++) a[i] = _mm512_dpbusd_epi32(a[i], x, y); \
      __asm__ volatile("" ::"v"(x), "v"(y));                                          \
    }                                                                                 \
    __m512i s = a[0];                                                                 \
    for (int i = 1; i < NC; i++) s = _mm512_add_epi32(s, a[i]);                       \
    return _mm512_reduce_add_epi32(s);                                                \
  }
CHAINS(2)
CHAINS(4)
CHAINS(8)
CHAINS(12)

static __m512i g_code[2][32] __attribute__((aligned(64)));
static int32_t g_x[4][64] __attribute__((aligned(64)));
static __m512i g_sc[4];

/* MODE 0: broadcasts from memory, one block; 1: from registers (one per row), one block; 2: from
 * memory, two blocks sharing each broadcast. S accumulates the scaled step sums (as S1). */
#define STEP_FN(name, MODE)                                                                             \
  TGT static void name(__m512i *S) {                                                                   \
    const __m512i m4 = _mm512_set1_epi8(15);                                                           \
    __m512i XB[4];                                                                                     \
    for (int b = 0; b < 4; b++) XB[b] = _mm512_set1_epi32(g_x[b][0]);                                 \
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) _Pragma("GCC unroll 2") for (int h0 = 0; h0 < 8; h0 += 4) { \
      __m512i PL[2][4], PH[2][4];                                                                      \
      _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) \
        PL[i][b] = PH[i][b] = _mm512_setzero_si512();                                                  \
      _Pragma("GCC unroll 4") for (int j = h0; j < h0 + 4; j++) {                                      \
        const int c = 8 * u + j;                                                                       \
        __m512i lo[2], hi[2];                                                                          \
        _Pragma("GCC unroll 2") for (int i = 0; i < (MODE == 2 ? 2 : 1); i++) {                        \
          const __m512i N = _mm512_load_si512(&g_code[i][c]);                                         \
          lo[i] = _mm512_and_si512(N, m4), hi[i] = _mm512_and_si512(_mm512_srli_epi16(N, 4), m4);     \
        }                                                                                              \
        _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) {                                          \
          const __m512i xl = MODE == 1 ? XB[b] : _mm512_set1_epi32(g_x[b][c]);                        \
          const __m512i xh = MODE == 1 ? XB[b] : _mm512_set1_epi32(g_x[b][c + 32]);                   \
          _Pragma("GCC unroll 2") for (int i = 0; i < (MODE == 2 ? 2 : 1); i++) {                      \
            PL[i][b] = _mm512_dpbusd_epi32(PL[i][b], lo[i], xl);                                       \
            PH[i][b] = _mm512_dpbusd_epi32(PH[i][b], hi[i], xh);                                       \
          }                                                                                            \
        }                                                                                              \
      }                                                                                                \
      _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) _Pragma("GCC unroll 2") for (int i = 0; i < (MODE == 2 ? 2 : 1); i++) \
        S[4 * i + b] = _mm512_dpwssd_epi32(S[4 * i + b], _mm512_mask_blend_epi16(0xAAAAAAAAu, PL[i][b], _mm512_slli_epi32(PH[i][b], 16)), g_sc[u]); \
    }                                                                                                  \
  }
STEP_FN(step_mem, 0)
STEP_FN(step_reg, 1)
STEP_FN(step_two, 2)

static int run(double ghz, long n);

int main(int argc, char **argv) {
  double ghz = 3.55;
  long n = 100000000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ghz") && i + 1 < argc) ghz = atof(argv[++i]);
    else if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atol(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_vnni [--ghz G] [-n ITERS]\n");
      return 2;
    }
  }
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) {
    fprintf(stderr, "bench_vnni: this CPU has no AVX-512 VNNI\n");
    return 1;
  }
  return run(ghz, n);
}

TGT static int run(double ghz, long n) {
  for (int i = 0; i < 2; i++)
    for (int c = 0; c < 32; c++) g_code[i][c] = _mm512_set1_epi32(0x01020304 * (c + 1 + 7 * i));
  for (int b = 0; b < 4; b++)
    for (int c = 0; c < 64; c++) g_x[b][c] = 0x01010101 * (b + c);
  for (int u = 0; u < 4; u++) g_sc[u] = _mm512_set1_epi32(0x00030002 + u);
  int sink = 0;
  static const struct { int nc; int (*f)(long); } ch[] = { { 2, chains2 }, { 4, chains4 }, { 8, chains8 }, { 12, chains12 } };
  for (size_t i = 0; i < sizeof ch / sizeof ch[0]; i++) {
    const double t = now();
    sink += ch[i].f(n);
    const double s = now() - t;
    printf("{\"bench\":\"vnni_chains\",\"chains\":%d,\"dpbusd_per_cycle\":%.2f}\n", ch[i].nc, ch[i].nc * (double)n / s / (ghz * 1e9));
  }
  static const struct { const char *name; int blocks; void (*f)(__m512i *); } st[] = {
    { "broadcast_from_memory", 1, step_mem }, { "broadcast_in_registers", 1, step_reg }, { "two_blocks_share_broadcasts", 2, step_two } };
  const long m = n / 30;
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
    __m512i S[8];
    for (int k = 0; k < 8; k++) S[k] = _mm512_setzero_si512();
    const double t = now();
    for (long r = 0; r < m; r++) st[i].f(S);
    const double s = now() - t;
    for (int k = 0; k < 8; k++) sink += _mm512_reduce_add_epi32(S[k]);
    const double cyc = s * ghz * 1e9 / m / st[i].blocks;
    printf("{\"bench\":\"vnni_superblock_4rows\",\"form\":\"%s\",\"cycles_per_block\":%.1f,\"dpbusd_per_cycle\":%.2f}\n",
           st[i].name, cyc, 256.0 / cyc);
  }
  fprintf(stderr, "(checksum %d)\n", sink);
  return 0;
}
