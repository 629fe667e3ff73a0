/* RMSNorm over rows, optionally fused with the residual add before it (cuda_ops.h).
 * One block per row: the row is staged in shared memory, warp 0 sums the squares in the CPU's
 * 16-lane order (ops_sumsq16_warp), every thread then writes (x * r) * w. Bit-identical to
 * layer_rmsnorm (and vadd + layer_rmsnorm for the fused form). */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define NORM_THREADS 512
#define NORM_PER 4 /* values a thread keeps in registers (rows up to 2048 in one memory round trip) */

/* add: x += delta first (written back); w == NULL: only the add. A one-row norm is latency-bound:
 * every global load of a phase is issued before its values are used (restrict pointers, unrolled
 * loops, the weights read into registers before the reduction). */
static __global__ void __launch_bounds__(NORM_THREADS)
    k_rmsnorm(float *__restrict__ x, const float *__restrict__ delta, const float *__restrict__ w,
              float *__restrict__ y, int n, float eps) {
  PDL_ENTER();
  extern __shared__ float xs[];
  __shared__ float rs;
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, bs = blockDim.x;
  float *xr = x + row * n;
  float wr[NORM_PER];
#pragma unroll
  for (int k = 0; k < NORM_PER; k++) {
    const int i = tid + k * bs;
    wr[k] = w && i < n ? w[i] : 0.0f;
  }
  if (delta) {
    const float *dr = delta + row * n;
#pragma unroll 4
    for (int i = tid; i < n; i += bs) {
      const float v = __fadd_rn(xr[i], dr[i]);
      xr[i] = v;
      xs[i] = v;
    }
  } else {
#pragma unroll 4
    for (int i = tid; i < n; i += bs) xs[i] = xr[i];
  }
  if (!w) return;
  __syncthreads();
  if (tid < 32) {
    const float ss = ops_sumsq16_warp(xs, n);
    if (tid == 0) rs = 1.0f / sqrtf(__fadd_rn(ss / (float)n, eps));
  }
  __syncthreads();
  const float r = rs;
  float *yr = y + row * n;
#pragma unroll
  for (int k = 0; k < NORM_PER; k++) {
    const int i = tid + k * bs;
    if (i < n) yr[i] = __fmul_rn(__fmul_rn(xs[i], r), wr[k]);
  }
  for (int i = tid + NORM_PER * bs; i < n; i += bs) yr[i] = __fmul_rn(__fmul_rn(xs[i], r), w[i]);
}

extern "C" void cuda_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
                             void *stream) {
  if (n_rows <= 0) return;
  pdl_launch(k_rmsnorm, dim3((unsigned)n_rows), dim3(NORM_THREADS), (size_t)((size_t)n * sizeof(float)), OPS_STREAM(stream), (float *)x, nullptr, w,
                                                                                                 y, (int)n, eps);
}

extern "C" void cuda_add_rmsnorm(float *x, const float *delta, const float *w, float *y, int64_t n_rows, int64_t n,
                                 float eps, void *stream) {
  if (n_rows <= 0) return;
  pdl_launch(k_rmsnorm, dim3((unsigned)n_rows), dim3(NORM_THREADS), (size_t)((size_t)n * sizeof(float)), OPS_STREAM(stream), x, delta, w, y,
                                                                                                 (int)n, eps);
}
