/* Attention rows, AVX-512: kern_dot16_rows (scores q . k) and kern_wsum_rows (sum of w_p * v_p),
 * bit-identical to the scalar references in kernels.c (tests/test_kernels.c, attention section).
 *
 * Why: at context depth the decode spent ~60 (QK) and ~36 (PV) cycles per query head and cache
 * position (bench/results.tsv, 2026-11-29): four accumulator chains per head (add-latency bound),
 * each score reduced with scalar adds, and separate multiplies and adds (the float order then had
 * no FMA: 32 vector ops per 256 products; with FMA 16, 8 cycles on the two FP ports).
 *
 * kern_dot16_rows: 16 scores at once, NH query rows x PB cache rows (NH * PB = 16), one zmm
 * accumulator each: 16 independent chains, cache rows widened from BF16 once per NH rows. The 16
 * accumulators are reduced together by a transposed reduce16 (tred16): the same additions, lane
 * pairs for pairs, as kred16 applied to each, 15 vector adds + 30 shuffles for 16 scores.
 * kern_wsum_rows: 32 output columns of up to 8 rows at a time in 16 registers, all positions in
 * order (one V load, widened once, feeds every row), so the outputs are read and written once
 * per call instead of once per 4 positions. */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/kernels_avx512_util.h"
#include "kernels/cpu/kernels_internal.h"

static inline __attribute__((always_inline)) __m512 ld16(const void *B, int bf16, int64_t off) {
  if (bf16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)B + off))), 16));
  return _mm512_loadu_ps((const float *)B + off);
}


/* QK: every cache row is prefetched QK_PF_ROWS rows before its use (prefetcht0). Measured with
 * the position-major cache of the time (rows ldb apart, half of each read): without it K came at
 * ~4-6 GB/s, and distances of 8-64 rows were all the same; a second, far prefetcht1 64 rows ahead
 * showed nothing (2026-11-30).
 * PV: each block of PV_BLK positions is read once per 32-column block, one line of every row per
 * pass, so the first pass needs the whole block at once: the next block is prefetched into L2
 * (prefetcht1) meanwhile (it had been 16 rows ahead into L1, which left most of each first pass to
 * demand misses: 20 -> 17.4 TSC cycles per head and position at depth 2048 in the decode of the
 * 35B-A3B shape). Each pass prefetches its own columns of the next block's rows, one row per
 * position step (one line for BF16 rows), where it had issued the block's lines in bursts of 64
 * before each pass: a burst fills the L1 fill buffers and stalls the pass behind it. Attention
 * region at depth 2048, per-token alternation in one process (4 runs): -14 to -33 us of ~280 us
 * per layer (2026-11-30). When the rows are contiguous (the KV cache) the passes prefetch the
 * next block in address order instead (pass k the k-th share of its bytes): -36 us a token at
 * depth 2048 in two A/B runs; why the order matters here is not settled (no hardware prefetcher
 * fills lines that the weight kernels skip, bench/results.tsv). QK_PF_ROWS 8 or 32, a far T1 +
 * near T0 pair for K, a 2-block V lead, V prefetched during QK, blocks of 32 or 128: no gain. */
#define QK_PF_ROWS 16
#define PV_BLK 64 /* positions per pass over the column blocks */
#define QK_MAX_N 1024 /* head dims up to which QK runs here (larger: the reference) */

/* Scores of the NH query rows in qa (interleaved by qk_rows_copy) x B rows [b0, b0 + nbv)
 * (nbv <= PB); rows past na and nbv repeat the last one and are not stored. */
static inline __attribute__((always_inline)) void qk_block(const float *qa, int na, const void *B, int bf16,
                                                           int64_t ldb, int64_t b0, int nbv, int64_t n, float *out,
                                                           int64_t ldo, const int NH, const int PB) {
  int64_t bo[16];
  #pragma GCC unroll 16
  for (int k = 0; k < PB; k++) bo[k] = (b0 + (k < nbv ? k : nbv - 1)) * ldb;
  __m512 acc[16];
  #pragma GCC unroll 16
  for (int s = 0; s < 16; s++) acc[s] = _mm512_setzero_ps();
  const int esz = bf16 ? 2 : 4;
  const char *pf = (const char *)B + (b0 + QK_PF_ROWS) * ldb * esz;
  for (int64_t j = 0; j < n; j += 16) {
    #pragma GCC unroll 16
    for (int k = 0; k < PB; k++) _mm_prefetch(pf + (k * ldb + j) * esz, _MM_HINT_T0);
    __m512 kv[16];
    #pragma GCC unroll 16
    for (int k = 0; k < PB; k++) kv[k] = ld16(B, bf16, bo[k] + j);
    #pragma GCC unroll 16
    for (int m = 0; m < NH; m++) {
      const __m512 qm = _mm512_load_ps(qa + j * NH + 16 * m);
      #pragma GCC unroll 16
      for (int k = 0; k < PB; k++) acc[m * PB + k] = _mm512_fmadd_ps(qm, kv[k], acc[m * PB + k]);
    }
  }
  float t[16];
  _mm512_storeu_ps(t, tred16(acc));
  #pragma GCC unroll 16
  for (int L = 0; L < 16; L++) {
    const int s = 4 * (L % 4) + L / 4, m = s / PB, k = s % PB;
    if (m < na && k < nbv) out[m * ldo + b0 + k] = t[L];
  }
}

/* The query rows [0, na) of A, 16 columns at a time, interleaved: qa[j * NH + 16 * m + i] =
 * A[m][j + i] (rows past na repeat the last). The block loop then reads them at constant offsets
 * from one pointer: with 8 row pointers it had run out of general registers (spills and moves
 * from vector registers on port 0, beside the FMAs). */
static inline __attribute__((always_inline)) void qk_rows_copy(const float *A, int64_t lda, int na, int64_t n, const int NH,
                                                               float *qa) {
  for (int64_t j = 0; j < n; j += 16)
    #pragma GCC unroll 8
    for (int m = 0; m < NH; m++) _mm512_store_ps(qa + j * NH + 16 * m, _mm512_loadu_ps(A + (m < na ? m : na - 1) * lda + j));
}

#define QK_ROWS(NH, PB)                                                                              \
  do {                                                                                               \
    qk_rows_copy(A + a0 * lda, lda, na_b, n, NH, qa);                                                \
    for (int64_t b0 = 0; b0 < nb; b0 += PB)                                                          \
      qk_block(qa, na_b, B, B_bf16, ldb, b0, nb - b0 < PB ? (int)(nb - b0) : PB, n, out + a0 * ldo, ldo, NH, PB); \
  } while (0)

void kern_dot16_rows_avx512(const float *A, int64_t lda, int na, const void *B, int B_bf16, int64_t ldb, int64_t nb,
                            int64_t n, float *out, int64_t ldo) {
  if (n % 16 || n > QK_MAX_N) { /* the interleaved copy lives on the stack */
    kern_dot16_rows_ref(A, lda, na, B, B_bf16, ldb, nb, n, out, ldo);
    return;
  }
  float qa[8 * QK_MAX_N] __attribute__((aligned(64)));
  for (int a0 = 0; a0 < na; a0 += 8) {
    const int na_b = na - a0 < 8 ? na - a0 : 8;
    if (na_b > 4) QK_ROWS(8, 2);
    else if (na_b > 2) QK_ROWS(4, 4);
    else if (na_b == 2) QK_ROWS(2, 8);
    else QK_ROWS(1, 16);
  }
}
#undef QK_ROWS

/* O rows [0, nh) (nh <= NH), columns [i0, i0 + 16 * NC), positions [p0, p1) in order. Missing
 * rows repeat the last one and are not stored. At position p, the pfl bytes at
 * pfa + (p - p0) * pfs are prefetched into L2, the lines below pfe. */
static inline __attribute__((always_inline)) void pv_block(const float *wl, int nh, const void *V, int bf16,
                                                           int64_t ldv, int64_t p0, int64_t p1, int64_t i0, float *O,
                                                           int64_t ldo, const int NH, const int NC, const char *pfa,
                                                           int64_t pfs, int64_t pfl, const char *pfe) {
  __m512 acc[16];
  #pragma GCC unroll 16
  for (int h = 0; h < NH; h++) {
    const int hh = h < nh ? h : nh - 1;
    #pragma GCC unroll 16
    for (int c = 0; c < NC; c++) acc[h * NC + c] = _mm512_loadu_ps(O + hh * ldo + i0 + 16 * c);
  }
  for (int64_t p = p0; p < p1; p++) {
    const char *a = pfa + (p - p0) * pfs;
    for (int64_t b = 0; b < pfl && a + b < pfe; b += 64) _mm_prefetch(a + b, _MM_HINT_T1);
    __m512 v[2];
    #pragma GCC unroll 16
    for (int c = 0; c < NC; c++) v[c] = ld16(V, bf16, p * ldv + i0 + 16 * c);
    #pragma GCC unroll 16
    for (int h = 0; h < NH; h++) {
      const __m512 wh = _mm512_set1_ps(wl[(p - p0) * 8 + h]);
      #pragma GCC unroll 16
      for (int c = 0; c < NC; c++) acc[h * NC + c] = _mm512_fmadd_ps(wh, v[c], acc[h * NC + c]);
    }
  }
  #pragma GCC unroll 16
  for (int h = 0; h < nh; h++)
    #pragma GCC unroll 16
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(O + h * ldo + i0 + 16 * c, acc[h * NC + c]);
}

/* positions [p0, p1): every column block. Pass k reads columns [32k, 32k + 32) of every row of
 * the block and prefetches 1/passes of the next block meanwhile: when rows are contiguous
 * (ldv == n, the KV cache), the next block's bytes in address order, a line or so per position
 * step; otherwise its own lines of each next-block row. */
static inline __attribute__((always_inline)) void pv_rows(const float *W, int64_t ldw, int nh, const void *V, int bf16,
                                                          int64_t ldv, int64_t np, int64_t p0, int64_t p1, int64_t n,
                                                          float *O, int64_t ldo, const int NH) {
  const int64_t n16 = n / 16 * 16, esz = bf16 ? 2 : 4, rowb = n * esz, d = p1 - p0, lb = ldv * esz;
  const char *Vb = V, *end = Vb + np * lb, *next = Vb + p1 * lb;
  const int seq = ldv == n;
  /* the block's weights position-major, 8 a position (rows past nh repeat the last): one pointer
   * and constant offsets in the loop, where 8 row pointers had spilled to the stack and to vector
   * registers (moves back on port 0, beside the FMAs) */
  float wl[PV_BLK * 8] __attribute__((aligned(64)));
  for (int64_t p = p0; p < p1; p++)
    #pragma GCC unroll 8
    for (int h = 0; h < NH; h++) wl[(p - p0) * 8 + h] = W[(h < nh ? h : nh - 1) * ldw + p];
  int64_t i0 = 0;
  for (; i0 < n16; i0 += 32) { /* lines from the one holding column i0, up to the next pass's */
    const int NC2 = i0 + 32 <= n16;
    const int64_t b0 = i0 * esz / 64 * 64, b1 = NC2 && i0 + 32 < n16 ? (i0 + 32) * esz / 64 * 64 : rowb;
    const char *pfa = seq ? next + d * b0 : next + b0;
    const int64_t pfs = seq ? b1 - b0 : lb;
    if (NC2) pv_block(wl, nh, V, bf16, ldv, p0, p1, i0, O, ldo, NH, 2, pfa, pfs, b1 - b0, end);
    else pv_block(wl, nh, V, bf16, ldv, p0, p1, i0, O, ldo, NH, 1, pfa, pfs, b1 - b0, end);
  }
}

#define PV_ROWS(NH)                                                                                  \
  for (int64_t p0 = 0; p0 < np; p0 += PV_BLK)                                                        \
  pv_rows(W + h0 * ldw, ldw, nh_b, V, V_bf16, ldv, np, p0, p0 + PV_BLK < np ? p0 + PV_BLK : np, n, O + h0 * ldo, ldo, NH)

void kern_wsum_rows_avx512(const float *W, int64_t ldw, int nh, const void *V, int V_bf16, int64_t ldv, int64_t np,
                           int64_t n, float *O, int64_t ldo) {
  const int64_t n16 = n / 16 * 16;
  for (int h0 = 0; h0 < nh; h0 += 8) {
    const int nh_b = nh - h0 < 8 ? nh - h0 : 8;
    if (nh_b > 4) PV_ROWS(8);
    else if (nh_b > 2) PV_ROWS(4);
    else if (nh_b == 2) PV_ROWS(2);
    else PV_ROWS(1);
  }
  if (n16 < n) /* columns past the last multiple of 16: the reference on the rest */
    kern_wsum_rows_ref(W, ldw, nh, V_bf16 ? (const void *)((const uint16_t *)V + n16) : (const void *)((const float *)V + n16),
                       V_bf16, ldv, np, n - n16, O + n16, ldo);
}
#undef PV_ROWS
