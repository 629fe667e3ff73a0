/* The accept count of a greedy speculative step and the copy of the accepted row's logits
 * (cuda_spec.h). Every block recomputes the count from the k <= 64 token pairs (cheaper than a
 * second launch) and copies its share of the row; block 0 writes the count. */
#include "kernels/cuda/cuda_spec.h"
#include "kernels/cuda/amk.cuh"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define SPEC_THREADS 256
#define SPEC_PER_BLOCK 4096 /* floats of the row a block copies */
#define SPEC_KEYS_MAX 65    /* verify rows whose argmaxes k_spec_accept reads from keys */

static __global__ void k_spec_accept(const int32_t *draft, const int32_t *amax, int k, int32_t *acc,
                                     const float *logits, int64_t n, float *dst, const unsigned long long *keys,
                                     int32_t *amax_out) {
  PDL_ENTER();
  __shared__ int32_t am[SPEC_KEYS_MAX];
  if (keys) { /* the rows' argmaxes from their keys: warp w takes rows w, w + 8, ... */
    for (int i = threadIdx.x >> 5; i <= k; i += SPEC_THREADS / 32) {
      const int32_t t = amk_token(keys + (size_t)i * CUDA_AMK_ROW);
      if ((threadIdx.x & 31) == 0) am[i] = t;
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x <= k) amax_out[threadIdx.x] = am[threadIdx.x];
    amax = am;
  }
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
             n, dst, (const unsigned long long *)nullptr, (int32_t *)nullptr);
}

extern "C" int cuda_spec_accept_keys(const int32_t *draft, const unsigned long long *keys, int32_t *amax_out, int k,
                                     int32_t *acc, const float *logits, int64_t n, float *dst, void *stream) {
  if (k < 0 || k + 1 > SPEC_KEYS_MAX) return -1;
  const int nb = dst && n > 0 ? (int)((n + SPEC_PER_BLOCK - 1) / SPEC_PER_BLOCK) : 1;
  pdl_launch(k_spec_accept, dim3(nb), dim3(SPEC_THREADS), (size_t)0, OPS_STREAM(stream), draft,
             (const int32_t *)nullptr, k, acc, logits, n, dst, keys, amax_out);
  return 0;
}
