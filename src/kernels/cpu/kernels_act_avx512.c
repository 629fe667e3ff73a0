/* AVX-512 pieces of kernels.c that are not quantized matmuls (split from kernels_avx512.c):
 *  - activation quantization: kern_act_q8_avx512 (act_q8 of one group, bit-identical to the scalar
 *    one: the same amax, the same round-to-nearest) and kern_act_mlx_avx512 (kern_act_quantize
 *    for MLX 4/8-bit weights, the same bytes; tests/test_kernels.c checks both);
 *  - the float path kern_mm_float_avx512 (F32/F16/BF16 weights on float activations, in the lane
 *    order kern_mm_float_lanes_ref writes out in scalar C; F32 rows of whole 64-value steps by
 *    mm_f32_rows, the same order without the chunk copy). */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/kernels_avx512_util.h"
#include "kernels/cpu/kernels_internal.h"

/* ================= activation quantization ================= */

/* kernels.c act_q8 for n % 16 == 0, bit-identical: the same amax (max is exact), the same
 * 127/amax and x*id products, round-to-nearest-even (vrndscaleps = nearbyintf in the default
 * mode), the same clamp. */
float kern_act_q8_avx512(const float *x, int n, int8_t *q) {
  const __m512 sgn = _mm512_set1_ps(-0.0f);
  __m512 m = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) m = _mm512_max_ps(_mm512_andnot_ps(sgn, _mm512_loadu_ps(x + i)), m); /* NaN-ignoring like fmaxf */
  const float amax = _mm512_reduce_max_ps(m);
  if (!(amax > 0)) {
    memset(q, 0, (size_t)n);
    return 0;
  }
  const __m512 id = _mm512_set1_ps(127.0f / amax);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int i = 0; i < n; i += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  return amax / 127.0f;
}

/* kernels.c kern_act_quantize for MLX 4/8-bit, the same bytes (tested): per group the same act_q8
 * (kern_act_q8_avx512) and s = d * isum; then per step the 4-bit even/odd split (two vpermt2b),
 * negcorr from 4-sums (vpdpbusd with ones; 8-sums by adding even/odd dwords), dlane by a masked
 * gather. The scalar version (byte loops, a malloc, a 64-bit division per lane) took 2.8 us for
 * 2048 values, 12 % of a 2-thread 512x2048 MLX4 matvec. */
void kern_act_mlx_avx512(const floe_mat *W, const float *x, void *xq_, int64_t c0, int64_t c1) {
  const kact_layout L = kact_layout_of(W);
  uint8_t *xq = xq_;
  int8_t *q = (int8_t *)xq;
  float *d = (float *)(xq + L.off_d), *s = (float *)(xq + L.off_s);
  int32_t *nc = (int32_t *)(xq + L.off_c);
  float *dl = (float *)(xq + L.off_e);
  const int g = W->mlx.group, lg = __builtin_ctz((unsigned)g), bits = W->mlx.bits;
  const int64_t n = W->cols;
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t e1 = c1 < n ? c1 : n;
  for (int64_t k = c0 >> lg; k < e1 >> lg; k++) {
    d[k] = kern_act_q8_avx512(x + g * k, g, q + g * k);
    __m512i t = _mm512_setzero_si512();
    for (int i = 0; i < g; i += 32) t = _mm512_dpbusd_epi32(t, ones, _mm512_maskz_loadu_epi8(0xFFFFFFFFull, q + g * k + i));
    s[k] = d[k] * (float)_mm512_reduce_add_epi32(t);
  }
  const int64_t z0 = c0 > n ? c0 : n; /* padding past the last value, this range's part */
  if (c1 > z0) memset(q + z0, 0, (size_t)(c1 - z0));
  const int ST = bits == 4 ? 128 : 64, LW = ST / 16;
  const __m512i lanev = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(LW));
  uint8_t ev[64], od[64];
  uint32_t e32[16], o32[16];
  for (int i = 0; i < 64; i++) ev[i] = (uint8_t)(2 * i), od[i] = (uint8_t)(2 * i + 1);
  for (int i = 0; i < 16; i++) e32[i] = (uint32_t)(2 * i), o32[i] = (uint32_t)(2 * i + 1);
  const __m512i iev = _mm512_loadu_si512(ev), iod = _mm512_loadu_si512(od);
  const __m512i jev = _mm512_loadu_si512(e32), jod = _mm512_loadu_si512(o32);
  for (int64_t c = c0; c < c1; c += ST) {
    const int64_t st = c / ST;
    const __m512i A = _mm512_loadu_si512(q + c);
    __m512i S4A = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, A), neg;
    if (bits == 4) {
      const __m512i B = _mm512_loadu_si512(q + c + 64);
      const __m512i S4B = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, B);
      /* lane i: the 8 values c+8i.. = 4-sums 2i and 2i+1 of [A | B] */
      const __m512i S8 = _mm512_add_epi32(_mm512_permutex2var_epi32(S4A, jev, S4B), _mm512_permutex2var_epi32(S4A, jod, S4B));
      neg = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(S8, 3));
      _mm512_storeu_si512(q + c, _mm512_permutex2var_epi8(A, iev, B));
      _mm512_storeu_si512(q + c + 64, _mm512_permutex2var_epi8(A, iod, B));
    } else {
      neg = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(S4A, 7));
    }
    _mm512_storeu_si512(nc + st * 16, neg);
    const __m512i e0 = _mm512_add_epi32(lanev, _mm512_set1_epi32((int)c));
    const __mmask16 in = _mm512_cmplt_epi32_mask(e0, _mm512_set1_epi32((int)n));
    _mm512_storeu_ps(dl + st * 16, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, _mm512_srli_epi32(e0, (unsigned)lg), d, 4));
  }
}

/* ================= float path ================= */

/* 16 weights of a plain-type row at element j (masked tail) */
static inline __m512 plain_load(uint32_t type, const uint8_t *row, int64_t j, __mmask16 m) {
  if (type == FLOE_TYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + j);
  __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + j);
  if (type == FLOE_TYPE_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* F32 weights, cols % 64 == 0, activation rows 0..NB-1 (NB <= 4) of weight row r: each 64-value
 * step's 4 weight vectors are loaded once, straight from the row, for all NB rows, the 4 x NB
 * accumulators in registers. Per output the fused multiply-adds of the chunked loop below in the
 * same order (accumulator j mod 64, j ascending: a chunk boundary changes nothing there) and the
 * same final sum: the same bits. The chunked loop copies each chunk into buf and keeps one row's
 * accumulators at a time: on the MoE router (256 x 2048 F32, 2 threads, out of cache) 4 rows take
 * 76-84 us here against 91-97 there, one row 42-48 either way. pf: the chunked loop's prefetches
 * (per line one T1 KPF ahead, one T0 KPF_NEAR ahead). */
static inline __attribute__((always_inline)) void f32_rows(const int NB, const float *w, int64_t cols, const float *X,
                                                           int64_t ldx, float *Y, int64_t ldy, int64_t r, int pf) {
  __m512 a[4][4];
#pragma GCC unroll 4
  for (int b = 0; b < NB; b++)
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) a[b][i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; j += 64) {
    if (pf)
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) {
        const char *p = (const char *)(w + j + 16 * i);
        if (KPF) _mm_prefetch(p + KPF, _MM_HINT_T1);
        if (KPF_NEAR) _mm_prefetch(p + KPF_NEAR, _MM_HINT_T0);
      }
    __m512 wv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) wv[i] = _mm512_loadu_ps(w + j + 16 * i);
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) a[b][i] = _mm512_fmadd_ps(wv[i], _mm512_loadu_ps(X + b * ldx + j + 16 * i), a[b][i]);
  }
#pragma GCC unroll 4
  for (int b = 0; b < NB; b++)
    Y[b * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[b][0], a[b][1]), _mm512_add_ps(a[b][2], a[b][3])));
}

/* F32 weights with cols % 64 == 0: f32_rows for groups of at most 4 activation rows (the weight
 * row read again from L1 for each further group). */
static void mm_f32_rows(const floe_mat *W, int nb, const float *X, int64_t ldx, float *Y, int64_t ldy, int64_t r0,
                        int64_t r1) {
  for (int64_t r = r0; r < r1; r++) {
    const float *w = (const float *)kw_row(W, r);
    for (int b0 = 0; b0 < nb; b0 += 4) {
      const int g = nb - b0 < 4 ? nb - b0 : 4;
      const float *x = X + b0 * ldx;
      float *y = Y + b0 * ldy;
      if (g == 4) f32_rows(4, w, W->cols, x, ldx, y, ldy, r, b0 == 0);
      else if (g == 3) f32_rows(3, w, W->cols, x, ldx, y, ldy, r, b0 == 0);
      else if (g == 2) f32_rows(2, w, W->cols, x, ldx, y, ldy, r, b0 == 0);
      else f32_rows(1, w, W->cols, x, ldx, y, ldy, r, b0 == 0);
    }
  }
}

/* Each output keeps 4 accumulators (16-value vectors j mod 64); a chunk of KERN_CHUNK values is
 * dequantized once (plain types: converted) and dotted with every activation row. F32 weights
 * with whole 64-value steps take mm_f32_rows (the same sums, no copy into buf). */
void kern_mm_float_avx512(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq, size_t xs,
                          float *Y, int64_t ldy, int64_t r0, int64_t r1) {
  (void)xq;
  (void)xs;
  _Static_assert(KERN_CHUNK % 64 == 0, "mm_f32_rows: a chunk holds whole 64-value steps");
  if (W->type == FLOE_TYPE_F32 && W->cols % 64 == 0) {
    mm_f32_rows(W, nb, X, ldx, Y, ldy, r0, r1);
    return;
  }
  const int plain = W->type == FLOE_TYPE_F32 || W->type == FLOE_TYPE_F16 || W->type == FLOE_TYPE_BF16;
  float buf[KERN_CHUNK] __attribute__((aligned(64)));
  for (int64_t r = r0; r < r1; r++) {
    __m512 acc[16][4];
    for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = _mm512_setzero_ps();
    const uint8_t *row = kw_row(W, r);
    for (int64_t j0 = 0; j0 < W->cols; j0 += KERN_CHUNK) {
      int64_t n = W->cols - j0 < KERN_CHUNK ? W->cols - j0 : KERN_CHUNK;
      if (plain) {
        /* the two-level prefetch of the quantized kernels (pf_row), per 64-byte line; rows are
         * contiguous, so it runs on into the next row */
        const int es = W->type == FLOE_TYPE_F32 ? 4 : 2;
        for (int64_t j = 0; j < n; j += 16) {
          if (((j0 + j) * es) % 64 == 0) {
            const char *p = (const char *)row + (j0 + j) * es;
            if (KPF) _mm_prefetch(p + KPF, _MM_HINT_T1);
            if (KPF_NEAR) _mm_prefetch(p + KPF_NEAR, _MM_HINT_T0);
          }
          __mmask16 m = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
          _mm512_store_ps(buf + j, plain_load(W->type, row, j0 + j, m));
        }
      } else {
        kern_dequant_chunk(W, r, j0, n, buf);
      }
      for (int b = 0; b < nb; b++) {
        const float *x = X + b * ldx + j0;
        __m512 a0 = acc[b][0], a1 = acc[b][1], a2 = acc[b][2], a3 = acc[b][3];
        int64_t j = 0;
        for (; j + 64 <= n; j += 64) {
          a0 = _mm512_fmadd_ps(_mm512_load_ps(buf + j), _mm512_loadu_ps(x + j), a0);
          a1 = _mm512_fmadd_ps(_mm512_load_ps(buf + j + 16), _mm512_loadu_ps(x + j + 16), a1);
          a2 = _mm512_fmadd_ps(_mm512_load_ps(buf + j + 32), _mm512_loadu_ps(x + j + 32), a2);
          a3 = _mm512_fmadd_ps(_mm512_load_ps(buf + j + 48), _mm512_loadu_ps(x + j + 48), a3);
        }
        for (; j < n; j += 16) {
          __mmask16 m = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
          a0 = _mm512_fmadd_ps(_mm512_maskz_load_ps(m, buf + j), _mm512_maskz_loadu_ps(m, x + j), a0);
        }
        acc[b][0] = a0, acc[b][1] = a1, acc[b][2] = a2, acc[b][3] = a3;
      }
    }
    for (int b = 0; b < nb; b++)
      Y[b * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[b][0], acc[b][1]),
                                                          _mm512_add_ps(acc[b][2], acc[b][3])));
  }
}
