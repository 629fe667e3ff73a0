/* A row's greedy argmax gathered by the launch that writes the row (the speculative step's heads,
 * FLOE_CUDA_SPEC_AMAX; cuda_ops.h CUDA_AMK_ROW): each output v at index i has the key
 * kern_argmax_key orders by (amax_key: the value, then the lower index; 0 for NaN and -inf), and
 * its producer raises slot i % AMK_SLOTS of the row's keys to it (atomicMax after a read that skips
 * the atomic where the slot is already larger: the maximum does not depend on the order). A reader
 * takes the largest of the slots: k_argmax's index, bit for bit. The slots start at 0 (zeroed by
 * the step's first launch). */
#ifndef FLOE_AMK_CUH
#define FLOE_AMK_CUH
#include <stdint.h>

#include "kernels/cuda/cuda_ops.h"

#define AMK_SLOTS 32
#define AMK_STRIDE (CUDA_AMK_ROW / AMK_SLOTS) /* a slot a 32-byte sector */

/* kern_argmax_key: value order, then the lower index; 0 for NaN and -inf; -0 counts as +0 */
static __device__ __forceinline__ unsigned long long amax_key(float v, uint32_t i) {
  if (!(v > -INFINITY)) return 0ull;
  if (v == 0.0f) v = 0.0f;
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((unsigned long long)b << 32) | (unsigned long long)(0xFFFFFFFFu - i);
}

/* output v of index i into its row's keys (any thread) */
static __device__ __forceinline__ void amk_put(unsigned long long *row, uint32_t i, float v) {
  const unsigned long long k = amax_key(v, i);
  unsigned long long *slot = row + (size_t)(i % AMK_SLOTS) * AMK_STRIDE;
  if (k > __ldcg(slot)) atomicMax(slot, k);
}

/* the row's argmax index (k_argmax's: 0 where every key is 0), called by ONE WHOLE WARP; every lane
 * returns it */
static __device__ __forceinline__ int32_t amk_token(const unsigned long long *row) {
  unsigned long long k = __ldcg(row + (size_t)(threadIdx.x & 31) * AMK_STRIDE);
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, k, s);
    k = o > k ? o : k;
  }
  return k ? (int32_t)(0xFFFFFFFFu - (uint32_t)k) : 0;
}
#endif
