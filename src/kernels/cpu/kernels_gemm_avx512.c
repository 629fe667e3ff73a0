/* AVX-512 VNNI batched kernel for Q4_K / Q5_K with many activation rows (prefill, batched experts).
 *
 * It computes exactly the 16-lane model of kernels_internal.h (packed lanes, mins in 8 lanes, the
 * fixed reductions), so row b of any call is bit-identical to kern_matmul with nb = 1 on that row
 * and to the scalar reference. What differs from kern_mm_q_avx512 is only how the exact int32 lane
 * values are obtained and how the work is blocked:
 *
 *  - No vpackssdw. The model's packed lane 4j+t (kernels_internal.h) is
 *      sum over p = 0,1 of sc(a,i0) * (D[a][i0] + D[a][i0+1]),  a = 2p + (t >= 2), i0 = 4j + 2(t%2),
 *    i.e. for each p an 8-product sum at positions 64a + 4*i0 .. +7 times one 6-bit scale. Both the
 *    weights and the activations are dword-permuted (vpermt2d, same permutation) so that two
 *    vpdpbusd put those 8 products into lane 4j+t directly: Z_p = sum of 8 u4/u5 x s8 products,
 *    |Z_p| <= 8*31*127 < 2^15, so Z_p's low int16 word is Z_p itself and one vpdpwssd with the scale
 *    in the even word (odd word 0) adds sc * Z_p exactly. 4 vpdpbusd + 2 vpdpwssd per superblock
 *    and output instead of 4 + 2 vpackssdw + 2 vpdpwssd.
 *  - Activations are permuted once per call (or per chunk of KC superblocks) into a stack buffer
 *    shared by all weight rows of the call; weights are decoded (nibbles, permutation, scales) once
 *    per superblock and row pair and applied to every activation row of the call (up to 16), the
 *    per-output accumulators living in a small L1-resident array instead of registers.
 *  - Two weight rows per pass: their mins share one zmm (lanes 0-7 row A, 8-15 row B), one
 *    vpmaddwd / cvt / mul / add per activation row for both.
 * Scales: S = d*dx (row scale from f16, activation scale), Sm = dmin*dx, each one float multiply,
 * then acc = acc + (float)L * S, as in the model.
 *
 * ---- Floors and measurements (bench/bench_gemm.c; 1 thread, in cache, 3.07 GHz; cycles per weight
 * row, activation row and superblock of 256 weights) ----
 * VNNI peak: 2 vpdpbusd zmm per cycle = 128 MACs, so 256 MACs = 2 cycles. Weight bytes at nb=16:
 * 144 B per 16 row-superblocks, ~0.3 cycles at 28 GB/s: compute-bound by far.
 * The canonical model adds, per output and superblock, (float)L*S (cvt, mul, add) and the mins
 * (1/2 of vpmaddwd, cvt, mul, add and the dmin*dx multiply): with 4 vpdpbusd + 2 vpdpwssd that is
 * ~11.5 ALU uops = 5.75 cycles at 2 per cycle (35 % of the VNNI peak) before the decode.
 * kern_mm_q_avx512 nb=16: 11.9 (512x2048) / 16.6 (2048x512) cycles; this kernel: 7.8 / 9.6
 * (26 % / 21 % of the VNNI peak). The loop runs at ~1.5 ALU uops per cycle, not 2; the mins are
 * 1.3 cycles of it (measured by removing them); 2048x512 pays the per-output zeroing and
 * reduction over only 2 superblocks. */
#pragma GCC target("gfni,tune=sapphirerapids")
#include <immintrin.h>
#include <stdlib.h>

#include "kernels/cpu/kernels_internal.h"

#define KC 16     /* superblocks of activations permuted per chunk (16 x 16 rows x 256 B = 64 KiB) */
#define RBLK 16   /* weight rows per block: accumulators of a block, reduced 16 outputs at a time */

/* vpermt2d indices: lane 4j+t takes dword 4j + 2(t%2) (A) or that + 1 (B) of step (t >= 2), the
 * steps being the two source registers (indices 16.. = second source). */
static const int32_t kperm_a[16] __attribute__((aligned(64))) = {0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30};
static const int32_t kperm_b[16] __attribute__((aligned(64))) = {1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31};

/* vpermb byte indices into the 32-byte [row A sc[8] m[8] | row B sc[8] m[8]] vector: the scale of
 * lane 4j+t for p = 0 (steps 0-1) and p = 1 (steps 2-3), in byte 0 of each dword (the other three
 * bytes are zeroed by the mask 0x1111...): sc index kperm_q4k[2a + (j >= 2)], a = 2p + (t >= 2). */
static const uint8_t kidx_sc[2][64] __attribute__((aligned(64))) = {
  {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0,
   2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0},
  {4, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0,
   6, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 7, 0, 0, 0, 6, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 7, 0, 0, 0},
};
/* mins of both rows as int16 words for vpmaddwd with bsum: words 2j, 2j+1 = m[j]; row A words
 * 0-15 (bytes 8-15), row B words 16-31 (bytes 24-31); odd bytes zeroed by the mask 0x5555... */
static const uint8_t kidx_mins[64] __attribute__((aligned(64))) = {
  8, 0, 8, 0, 9, 0, 9, 0, 10, 0, 10, 0, 11, 0, 11, 0, 12, 0, 12, 0, 13, 0, 13, 0, 14, 0, 14, 0, 15, 0, 15, 0,
  24, 0, 24, 0, 25, 0, 25, 0, 26, 0, 26, 0, 27, 0, 27, 0, 28, 0, 28, 0, 29, 0, 29, 0, 30, 0, 30, 0, 31, 0, 31, 0};

/* FLOE_GEMM=0 turns the kernel off (A/B measurements against kern_mm_q_avx512) */
static int g_gemm_on = 1;
__attribute__((constructor)) static void gemm_from_env(void) {
  const char *e = getenv("FLOE_GEMM");
  if (e && e[0] == '0') g_gemm_on = 0;
}

int kern_gemm_avx512_supports(const floe_mat *W) {
  return g_gemm_on && (W->type == FLOE_TYPE_Q4_K || W->type == FLOE_TYPE_Q5_K) && W->cols % 256 == 0;
}

/* bytes >> 4 with one GF(2) affine map (bits 4-7 to 0-3) */
static inline __m512i hi_nib(__m512i q) { return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(0x1020408000000000ll), 0); }

/* The model's reductions (kernels_internal.h kred16 / kred8) of 16 outputs at once, transposed:
 * each stage adds the same pairs of lanes as the scalar tree, several outputs per register.
 * In: a[o] the 16-lane accumulators of outputs o = 0..15; m[p] the mins lanes of outputs 2p (lanes
 * 0-7) and 2p+1 (lanes 8-15). Out: y[o] = red16(a[o]) - red8(mins of o), in lane o. */
static inline __m512 red_tail(__m512 t0, __m512 t1, __m512 t2, __m512 t3, __m512 t4, __m512 t5, __m512 t6, __m512 t7) {
  /* in: t[p] quarters = [x_2p[0..3], x_2p[4..7], x_2p+1[0..3], x_2p+1[4..7]]; b[i] = x[i] + x[i+4] */
  const __m512 T[8] = {t0, t1, t2, t3, t4, t5, t6, t7};
  __m512 U[4], V[2];
  for (int q = 0; q < 4; q++)
    U[q] = _mm512_add_ps(_mm512_shuffle_f32x4(T[2 * q], T[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(T[2 * q], T[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  /* U[q] quarter i = b of output 4q+i; c[i] = b[i] + b[i+2] */
  for (int s = 0; s < 2; s++)
    V[s] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(U[2 * s]), _mm512_castps_pd(U[2 * s + 1]))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(U[2 * s]), _mm512_castps_pd(U[2 * s + 1]))));
  /* V[s] quarter i = [c0, c1 of output 8s+i, c0, c1 of output 8s+4+i]; c[0] + c[1]: lane 4i+e =
   * output i + 4e */
  return _mm512_add_ps(_mm512_shuffle_ps(V[0], V[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(V[0], V[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

static inline __m512 red_block(const __m512 *a, const __m512 *m) {
  __m512 T[8];
  /* a[i] + a[i+8] of outputs 2p and 2p+1 */
  for (int p = 0; p < 8; p++)
    T[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 ya = red_tail(T[0], T[1], T[2], T[3], T[4], T[5], T[6], T[7]);
  const __m512 ym = red_tail(m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]);
  /* lane 4i+e holds output i+4e */
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), _mm512_sub_ps(ya, ym));
}

/* Activation rows b < nb, superblocks [k0, k0+nk), permuted into xp[(b*nk + k)*256]: per
 * superblock [A of steps 0-1 | B of steps 0-1 | A of steps 2-3 | B of steps 2-3]; their scales
 * transposed into dxt[k*16 + b] (0 for b >= nb). */
static void permute_x(const kact_layout *L, int nb, const uint8_t *xq, size_t xs, int64_t k0, int nk, uint8_t *xp, float *dxt) {
  const __m512i ia = _mm512_load_si512(kperm_a), ib = _mm512_load_si512(kperm_b);
  for (int k = 0; k < nk; k++)
    for (int b = 0; b < 16; b++) dxt[k * 16 + b] = b < nb ? ((const float *)(xq + (size_t)b * xs + L->off_d))[k0 + k] : 0.0f;
  for (int b = 0; b < nb; b++)
    for (int k = 0; k < nk; k++) {
      const uint8_t *x = xq + (size_t)b * xs + (size_t)(k0 + k) * 256;
      uint8_t *o = xp + ((size_t)b * nk + k) * 256;
      const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 64);
      const __m512i x2 = _mm512_loadu_si512(x + 128), x3 = _mm512_loadu_si512(x + 192);
      _mm512_store_si512(o, _mm512_permutex2var_epi32(x0, ia, x1));
      _mm512_store_si512(o + 64, _mm512_permutex2var_epi32(x0, ib, x1));
      _mm512_store_si512(o + 128, _mm512_permutex2var_epi32(x2, ia, x3));
      _mm512_store_si512(o + 192, _mm512_permutex2var_epi32(x2, ib, x3));
    }
}

/* One decoded superblock of one weight row: the four permuted weight vectors (A0 B0 A1 B1) and
 * the two scale vectors (dword lanes, p = 0 and 1). */
typedef struct dec_row {
  __m512i w[4], sv[2];
} dec_row;

static inline __attribute__((always_inline)) dec_row dec_q(const int T, const uint8_t *bk, __m512i scm, int rr) {
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i ia = _mm512_load_si512(kperm_a), ib = _mm512_load_si512(kperm_b);
  const uint8_t *qs = bk + (T == FLOE_TYPE_Q4_K ? 16 : 48);
  const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
  __m512i w[4] = {_mm512_and_si512(q0, m4), hi_nib(q0), _mm512_and_si512(q1, m4), hi_nib(q1)};
  if (T == FLOE_TYPE_Q5_K) {
    /* fifth bit: step s (natural 32-runs j = 2(s/2), 2(s/2)+1, low nibbles for even s) takes qh
     * bit lo = 4(s/2) + s%2 in its first 32 bytes and bit lo + 2 in the last 32 */
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bk + 16)));
    const __m512i b16 = _mm512_set1_epi8(16);
    for (int s = 0; s < 4; s++) {
      const int lo = 4 * (s / 2) + s % 2, hi = lo + 2;
      const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << lo)), _mm256_set1_epi8((char)(1 << hi)), 1);
      w[s] = _mm512_mask_add_epi8(w[s], _mm512_test_epi8_mask(qh, bits), w[s], b16);
    }
  }
  dec_row d;
  d.w[0] = _mm512_permutex2var_epi32(w[0], ia, w[1]);
  d.w[1] = _mm512_permutex2var_epi32(w[0], ib, w[1]);
  d.w[2] = _mm512_permutex2var_epi32(w[2], ia, w[3]);
  d.w[3] = _mm512_permutex2var_epi32(w[2], ib, w[3]);
  const __m512i lane = _mm512_set1_epi8((char)(16 * rr));
  d.sv[0] = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, _mm512_add_epi8(_mm512_load_si512(kidx_sc[0]), lane), scm);
  d.sv[1] = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, _mm512_add_epi8(_mm512_load_si512(kidx_sc[1]), lane), scm);
  return d;
}

/* A zero register made by a zeroing idiom (no execution port). Without it GCC hoists one zero and
 * copies it (vmovdqa32) before every vpdpbusd chain: 6 extra ALU uops per row pair and
 * activation row, ~20 % of the loop. */
static inline __m512i zero_idiom(void) {
  __m512i z;
  __asm__ volatile("vpxord %0, %0, %0" : "=v"(z));
  return z;
}

/* int32 lanes of one superblock: 4 vpdpbusd (8-product sums per lane) + 2 vpdpwssd (scales) */
static inline __m512i lanes(const dec_row *d, const uint8_t *xp) {
  const __m512i Z0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero_idiom(), d->w[0], _mm512_load_si512(xp)), d->w[1], _mm512_load_si512(xp + 64));
  const __m512i Z1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero_idiom(), d->w[2], _mm512_load_si512(xp + 128)), d->w[3], _mm512_load_si512(xp + 192));
  return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(zero_idiom(), Z0, d->sv[0]), Z1, d->sv[1]);
}

/* Rows rA, rB (rB may equal rA for an odd last row), superblocks [k0, k0+nk) of the chunk whose
 * permuted activations are xp; accumulators acc[2][nb] (16 lanes) and macc[nb] (lanes 0-7 row A,
 * 8-15 row B), updated in place. */
static inline __attribute__((always_inline)) void pair_chunk(const int T, const floe_mat *W, const kact_layout *L, int nb,
                                                             const uint8_t *xq, size_t xs, const uint8_t *xp, const float *dxt, int64_t k0,
                                                             int nk, int64_t rA, int64_t rB, __m512 *acc, __m512 *macc) {
  const int bytes = T == FLOE_TYPE_Q4_K ? 144 : 176;
  for (int k = 0; k < nk; k++) {
    const uint8_t *bA = kw_row(W, rA) + (k0 + k) * bytes, *bB = kw_row(W, rB) + (k0 + k) * bytes;
    /* 6-bit scales and mins of both rows (ggml get_scale_min_k4), 128-bit lane rr = row rr:
     * bytes 0-7 sc[0..7], 8-15 m[0..7].
     *   sc[j<4] = q[j]&63   sc[j>=4] = (q[j+4]&15) | (q[j-4]>>6)<<4
     *   m[j<4]  = q[j+4]&63 m[j>=4]  = (q[j+4]>>4) | (q[j]>>6)<<4 */
    const __m256i raw = _mm256_loadu2_m128i((const __m128i *)(bB + 4), (const __m128i *)(bA + 4));
    const __m256i P = _mm256_shuffle_epi8(raw, _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)));
    const __m256i H = _mm256_shuffle_epi8(raw, _mm256_broadcastsi128_si256(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7)));
    const __m256i lowA = _mm256_and_si256(P, _mm256_broadcastsi128_si256(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)));
    const __m256i lowB = _mm256_and_si256(_mm256_srli_epi16(P, 4), _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
    const __m512i scm = _mm512_castsi256_si512(_mm256_or_si256(_mm256_or_si256(lowA, lowB), _mm256_and_si256(_mm256_srli_epi16(H, 2), _mm256_set1_epi8(0x30))));
    const __m512i mins = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kidx_mins), scm);
    /* [dA, dminA, dB, dminB] */
    int32_t dd[2];
    memcpy(&dd[0], bA, 4);
    memcpy(&dd[1], bB, 4);
    const __m512 ddm = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_set_epi32(0, 0, dd[1], dd[0])));
    const __m512 dA = _mm512_broadcastss_ps(_mm512_castps512_ps128(ddm));
    const __m512 dB = _mm512_permutexvar_ps(_mm512_set1_epi32(2), ddm);
    const __m512 dm = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ddm);
    const dec_row DA = dec_q(T, bA, scm, 0), DB = dec_q(T, bB, scm, 1);
    /* S = d*dx of both rows for every activation row at once (the model's one multiply each),
     * read back per activation row as embedded broadcasts: no multiply or shuffle per row */
    float s[32] __attribute__((aligned(64)));
    const __m512 dxk = _mm512_load_ps(dxt + 16 * k);
    _mm512_store_ps(s, _mm512_mul_ps(dA, dxk));
    _mm512_store_ps(s + 16, _mm512_mul_ps(dB, dxk));
    for (int b = 0; b < nb; b++) {
      const uint8_t *xb = xq + (size_t)b * xs;
      const uint8_t *x = xp + ((size_t)b * nk + k) * 256;
      const __m512 dx = _mm512_set1_ps(dxt[16 * k + b]);
      const __m512i LA = lanes(&DA, x), LB = lanes(&DB, x);
      __m512 *a = acc + b * RBLK;
      a[0] = _mm512_add_ps(a[0], _mm512_mul_ps(_mm512_cvtepi32_ps(LA), _mm512_set1_ps(s[b])));
      a[1] = _mm512_add_ps(a[1], _mm512_mul_ps(_mm512_cvtepi32_ps(LB), _mm512_set1_ps(s[16 + b])));
      const __m512i bs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const int16_t *)(xb + L->off_s) + 16 * (k0 + k))));
      const __m512i M = _mm512_madd_epi16(mins, bs);
      macc[b * (RBLK / 2)] = _mm512_add_ps(macc[b * (RBLK / 2)], _mm512_mul_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(dm, dx)));
    }
  }
}

static inline __attribute__((always_inline)) void gemm_t(const int T, const floe_mat *W, int nb, const uint8_t *xq, size_t xs,
                                                         float *Y, int64_t ldy, int64_t r0, int64_t r1) {
  const kact_layout L = kact_layout_of(W);
  const int64_t nsb = L.nblk;
  uint8_t xp[KC * 16 * 256] __attribute__((aligned(64)));
  float dxt[KC * 16] __attribute__((aligned(64)));
  /* accumulators of one block of rows, by activation row: acc[b][row in block], macc[b][pair] */
  __m512 acc[16][RBLK], macc[16][RBLK / 2];
  const int one_chunk = nsb <= KC;
  if (one_chunk) permute_x(&L, nb, xq, xs, 0, (int)nsb, xp, dxt);
  for (int64_t rb = r0; rb < r1; rb += RBLK) {
    const int64_t re = rb + RBLK < r1 ? rb + RBLK : r1;
    for (int b = 0; b < nb; b++) {
      for (int i = 0; i < RBLK; i++) acc[b][i] = _mm512_setzero_ps();
      for (int i = 0; i < RBLK / 2; i++) macc[b][i] = _mm512_setzero_ps();
    }
    for (int64_t k0 = 0; k0 < nsb; k0 += KC) {
      const int nk = (int)(nsb - k0 < KC ? nsb - k0 : KC);
      if (!one_chunk) permute_x(&L, nb, xq, xs, k0, nk, xp, dxt);
      /* a lone last row is paired with itself; its twin goes to the (unstored) next slot */
      for (int64_t r = rb; r < re; r += 2)
        pair_chunk(T, W, &L, nb, xq, xs, xp, dxt, k0, nk, r, r + 1 < re ? r + 1 : r, &acc[0][r - rb], &macc[0][(r - rb) / 2]);
    }
    const __mmask16 keep = (__mmask16)((1u << (re - rb)) - 1);
    for (int b = 0; b < nb; b++) _mm512_mask_storeu_ps(Y + b * ldy + rb, keep, red_block(acc[b], macc[b]));
  }
}

void kern_gemm_q_avx512(const floe_mat *W, int nb, const void *xq, size_t xq_stride, float *Y, int64_t ldy, int64_t r0,
                        int64_t r1) {
  FLOE_ASSERT(nb >= 1 && nb <= 16 && kern_gemm_avx512_supports(W));
  if (W->type == FLOE_TYPE_Q4_K) gemm_t(FLOE_TYPE_Q4_K, W, nb, xq, xq_stride, Y, ldy, r0, r1);
  else gemm_t(FLOE_TYPE_Q5_K, W, nb, xq, xq_stride, Y, ldy, r0, r1);
}
