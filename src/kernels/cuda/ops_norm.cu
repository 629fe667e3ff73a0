/* RMSNorm over rows, optionally fused with the residual add before it (cuda_ops.h). The kernel is
 * mm_act.cu's k_norm (one implementation, which can also quantize its output for a matmul:
 * cuda_mm_norm_act); these are its forms without the quantization. Bit-identical to layer_rmsnorm
 * (and vadd + layer_rmsnorm for the fused form). */
#include "kernels/cuda/cuda_mm.h"
#include "kernels/cuda/cuda_ops.h"

extern "C" void cuda_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
                             void *stream) {
  cuda_mm_norm_act(NULL, (float *)x, NULL, w, y, n_rows, n, eps, NULL, 0, stream);
}

extern "C" void cuda_add_rmsnorm(float *x, const float *delta, const float *w, float *y, int64_t n_rows, int64_t n,
                                 float eps, void *stream) {
  cuda_mm_norm_act(NULL, x, delta, w, y, n_rows, n, eps, NULL, 0, stream);
}
