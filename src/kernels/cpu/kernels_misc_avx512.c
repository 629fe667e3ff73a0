/* kern_argmax and kern_read_xor, AVX-512: the same results as their references (tests/test_kernels.c).
 * kern_argmax:
 * A greedy decode step scanned the 248k logits one compare at a time (~0.2 ms, 1 % of a token of
 * the 35B-A3B shape); 16 lanes each keep their first strict maximum and its index, then the lanes
 * are merged: the largest value, the lowest index among equal values. */
#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/kernels_internal.h"

int64_t kern_argmax_avx512(const float *x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 best = ninf;
  __m512i bidx = _mm512_setzero_si512(), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  int64_t i = 0;
  if (n > INT32_MAX - 16) return kern_argmax_ref(x, n);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ); /* NaN: false, never taken */
    best = _mm512_mask_mov_ps(best, gt, v);
    bidx = _mm512_mask_mov_epi32(bidx, gt, idx);
    idx = _mm512_add_epi32(idx, step);
  }
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    const __m512 v = _mm512_mask_loadu_ps(ninf, m, x + i);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, gt, v);
    bidx = _mm512_mask_mov_epi32(bidx, gt, idx);
  }
  float bv[16];
  int32_t bi[16];
  _mm512_storeu_ps(bv, best);
  _mm512_storeu_si512(bi, bidx);
  float v = -INFINITY;
  int64_t r = 0;
  for (int l = 0; l < 16; l++) {
    if (!(bv[l] > -INFINITY)) continue; /* lane never took a value */
    if (bv[l] > v || (bv[l] == v && bi[l] < r)) {
      v = bv[l];
      r = bi[l];
    }
  }
  return r;
}

/* Four 64-byte loads per step into four XOR chains (the shape of bench/membw's read loop), the
 * unaligned head and the tail through the reference; XOR is order-free, so the value is the
 * reference's for any split. */
uint64_t kern_read_xor_avx512(const void *x, size_t n) {
  const uint8_t *p = x;
  size_t head = (size_t)(-(uintptr_t)p & 63);
  if (head > n) head = n;
  head &= ~(size_t)7; /* whole words, so the reference's word grid stays the same */
  uint64_t h = kern_read_xor_ref(p, head);
  p += head;
  n -= head;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_loadu_si512(p + i + 192));
  }
  const __m512i a = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  uint64_t lanes[8];
  _mm512_storeu_si512(lanes, a);
  for (int k = 0; k < 8; k++) h ^= lanes[k];
  return h ^ kern_read_xor_ref(p + i, n - i);
}
