/* vexpf: the one exp of floe's float paths (softmax, sigmoid, SiLU), shared by the CPU code, the
 * CUDA kernels and the tests that mirror them, so every side computes the same bits.
 *
 * Cephes-style exp: n = round(x / ln 2) with the 1.5*2^23 magic constant, r = x - n ln 2 in two
 * parts, a degree-6 polynomial, and 2^n put together from the integer exponent bits. Every
 * operation is a separate multiply or add: the CPU is built with -ffp-contract=off and the CUDA
 * code with --fmad=false, so no side fuses them. NaN passes through; below -87.3 gives 0. */
#ifndef FLOE_VEXP_H
#define FLOE_VEXP_H
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define FLOE_VX static __host__ __device__ __forceinline__
#else
#define FLOE_VX static inline __attribute__((always_inline))
#endif

FLOE_VX float floe_vexpf(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  const float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest */
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * (r * r) + r) + 1.0f;
  const int32_t e = ((int32_t)n + 127) << 23;
  float sc;
#if defined(__CUDA_ARCH__)
  sc = __int_as_float(e);
#else
  memcpy(&sc, &e, 4);
#endif
  return x != x ? x : x < -87.3f ? 0.0f : p * sc;
}
FLOE_VX float floe_sigmoidf(float x) { return 1.0f / (1.0f + floe_vexpf(-x)); }
FLOE_VX float floe_siluf(float x) { return x / (1.0f + floe_vexpf(-x)); }
#undef FLOE_VX
#endif
