/* Small AVX-512 helpers shared by the *_avx512.c kernel files (compiled with the AVX-512, VBMI,
 * VNNI and GFNI flags; never include this from a baseline file). */
#ifndef FLOE_KERNELS_AVX512_UTIL_H
#define FLOE_KERNELS_AVX512_UTIL_H
#include <immintrin.h>

/* The weight prefetch distances of kernels_avx512.c (bytes ahead into L2 / L1; 0 = off; set from
 * FLOE_KPF / FLOE_KPF_NEAR at start), shared with the float path (kernels_act_avx512.c). */
extern int kern_kpf, kern_kpf_near;
#define KPF kern_kpf
#define KPF_NEAR kern_kpf_near

/* bytes >> 4 (the high nibbles): the GF(2) affine map whose matrix moves bits 4-7 to 0-3 */
static inline __m512i hi_nib(__m512i q) { return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(0x1020408000000000ll), 0); }

/* Lane 4k + m of the result = reduce16 (kernels_internal.h kred16) of a[4m + k], m, k < 4: the
 * pairs kred16 adds, level by level, (i, i+8), (i, i+4), (i, i+2), (0, 1), for 16 accumulators at
 * once: 15 vector adds and 30 shuffles instead of 16 horizontal sums. */
static inline __attribute__((always_inline)) __m512 tred16(const __m512 *a) {
  __m512 v[8], w[4], x[2];
#pragma GCC unroll 8
  for (int s = 0; s < 8; s++) /* [a.q0 + a.q2, a.q1 + a.q3, b.q0 + b.q2, b.q1 + b.q3] */
    v[s] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * s], a[2 * s + 1], 0x44), _mm512_shuffle_f32x4(a[2 * s], a[2 * s + 1], 0xEE));
#pragma GCC unroll 4
  for (int t = 0; t < 4; t++) /* 128-bit lane k of w[t]: accumulator 4t + k's first 4 + last 4 */
    w[t] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * t], v[2 * t + 1], 0x88), _mm512_shuffle_f32x4(v[2 * t], v[2 * t + 1], 0xDD));
#pragma GCC unroll 2
  for (int u = 0; u < 2; u++) /* per lane: [b0 + b2, b1 + b3] of w[2u], then of w[2u+1] */
    x[u] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * u], w[2 * u + 1], 0x44), _mm512_shuffle_ps(w[2 * u], w[2 * u + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xDD));
}
#endif
