/* RMSNorm over rows, optionally fused with the residual add before it (cuda_ops.h).
 * One block per row: the row is staged in shared memory, warp 0 sums the squares in the CPU's
 * 16-lane order (ops_sumsq16_warp), every thread then writes (x * r) * w. Bit-identical to
 * layer_rmsnorm (and vadd + layer_rmsnorm for the fused form). */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/ops_common.cuh"

#define NORM_THREADS 256

/* add: x += delta first (written back); w == NULL: only the add. */
static __global__ void __launch_bounds__(NORM_THREADS)
    k_rmsnorm(float *x, const float *delta, const float *w, float *y, int n, float eps) {
  extern __shared__ float xs[];
  __shared__ float rs;
  const int64_t row = blockIdx.x;
  float *xr = x + row * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = xr[i];
    if (delta) {
      v = __fadd_rn(v, delta[row * n + i]);
      xr[i] = v;
    }
    xs[i] = v;
  }
  if (!w) return;
  __syncthreads();
  if (threadIdx.x < 32) {
    const float ss = ops_sumsq16_warp(xs, n);
    if (threadIdx.x == 0) rs = 1.0f / sqrtf(__fadd_rn(ss / (float)n, eps));
  }
  __syncthreads();
  const float r = rs;
  float *yr = y + row * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xs[i], r), w[i]);
}

extern "C" void cuda_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
                             void *stream) {
  if (n_rows <= 0) return;
  k_rmsnorm<<<(unsigned)n_rows, NORM_THREADS, (size_t)n * sizeof(float), OPS_STREAM(stream)>>>((float *)x, NULL, w,
                                                                                                 y, (int)n, eps);
}

extern "C" void cuda_add_rmsnorm(float *x, const float *delta, const float *w, float *y, int64_t n_rows, int64_t n,
                                 float eps, void *stream) {
  if (n_rows <= 0) return;
  k_rmsnorm<<<(unsigned)n_rows, NORM_THREADS, (size_t)n * sizeof(float), OPS_STREAM(stream)>>>(x, delta, w, y,
                                                                                                 (int)n, eps);
}
