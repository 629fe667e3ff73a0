/* Device helpers shared by the ops_*.cu files: the CPU's float primitives (layers.c) as device
 * functions with the same operations in the same order, so kernels reproduce the CPU's bits.
 * Compiled with --fmad=false: a * b + c is a multiply then an add, as on the CPU. */
#ifndef FLOE_OPS_COMMON_CUH
#define FLOE_OPS_COMMON_CUH
#include <cuda_runtime.h>
#include <stdint.h>

#include "base/vexp.h" /* floe_vexpf / floe_sigmoidf / floe_siluf: the CPU's bits */

#define OPS_STREAM(s) ((cudaStream_t)(s))

static __device__ __forceinline__ float ops_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* floe_f32_to_bf16: round to nearest even, NaN kept quiet */
static __device__ __forceinline__ uint16_t ops_f32_to_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* layers.c fold16 on lanes 0..15 of a warp (lane k holds acc[k]): halves 8, 4, 2, 1; lane 0 gets
 * the result. Lanes 16..31 take part in the shuffles only. */
static __device__ __forceinline__ float ops_fold16(float v) {
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 8, 16));
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4, 16));
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2, 16));
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 16));
  return v;
}

/* layers.c sumsq16 of xs[0..n) (shared or global memory), called by ONE WHOLE WARP: lane k < 16
 * sums xs[k], xs[k+16], ... in order (a multiply then an add each), then fold16. Every lane
 * returns the result. */
static __device__ __forceinline__ float ops_sumsq16_warp(const float *xs, int n) {
  const int lane = threadIdx.x & 31;
  float acc = 0.0f;
  if (lane < 16) {
    int i = lane;
#pragma unroll 8
    for (; i < n; i += 16) {
      const float v = xs[i];
      acc = __fadd_rn(acc, __fmul_rn(v, v));
    }
  }
  acc = ops_fold16(acc);
  return __shfl_sync(0xffffffffu, acc, 0);
}

/* cp.async (sm_80+): a 16-byte (cg: L2 only) or 4-byte (ca) copy global -> shared that completes
 * in the background; ops_cp_commit closes a group of them, ops_cp_wait<N> waits until at most N
 * groups are in flight (then a barrier makes the copies visible to the whole block). */
static __device__ __forceinline__ void ops_cp16(void *smem, const void *g) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
static __device__ __forceinline__ void ops_cp4(void *smem, const void *g) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(g));
}
static __device__ __forceinline__ void ops_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void ops_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif
