/* The accept count of a greedy speculative step and the copy of the accepted row's logits
 * (cuda_spec.h). Every block recomputes the count from the k <= 64 token pairs (cheaper than a
 * second launch) and copies its share of the row; block 0 writes the count. */
#include "kernels/cuda/cuda_spec.h"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define SPEC_THREADS 256
#define SPEC_PER_BLOCK 4096 /* floats of the row a block copies */

static __global__ void k_spec_accept(const int32_t *draft, const int32_t *amax, int k, int32_t *acc,
                                     const float *logits, int64_t n, float *dst) {
  PDL_ENTER();
  int a = 0;
  while (a < k && draft[a] == amax[a]) a++;
  if (blockIdx.x == 0 && threadIdx.x == 0) *acc = a;
  if (!dst) return;
  const float *row = logits + (int64_t)a * n;
  const int64_t i0 = (int64_t)blockIdx.x * SPEC_PER_BLOCK;
  const int64_t i1 = i0 + SPEC_PER_BLOCK < n ? i0 + SPEC_PER_BLOCK : n;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += SPEC_THREADS) dst[i] = row[i];
}

extern "C" void cuda_spec_accept(const int32_t *draft, const int32_t *amax, int k, int32_t *acc, const float *logits,
                                 int64_t n, float *dst, void *stream) {
  const int nb = dst && n > 0 ? (int)((n + SPEC_PER_BLOCK - 1) / SPEC_PER_BLOCK) : 1;
  pdl_launch(k_spec_accept, dim3(nb), dim3(SPEC_THREADS), (size_t)0, OPS_STREAM(stream), draft, amax, k, acc, logits,
             n, dst);
}
