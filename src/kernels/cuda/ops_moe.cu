/* MoE routing and combine, SiLU-GLU (cuda_ops.h); every value bit-identical to layer_moe.
 *   k_moe_route: block per token. router_softmax (max, vexpf, the 16-lane sum folded in halves,
 *     divide), the top-k as ranks (descending probability, ties to the lower index: the picks
 *     and order of the CPU's sorted insert), the renormalisation summed in that order, then the
 *     selections in ascending expert order.
 *   the combine (mm_act.cu's k_combine): block per token. y = 0; y += y_j * w_j for j ascending;
 *     y += sh * sigmoid(gate); x += y (vaxpy / vadd), then optionally the next block's RMSNorm of x
 *     (and its quantization for a matmul, cuda_mm_combine_act). */
#include "kernels/cuda/cuda_mm.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

static __global__ void __launch_bounds__(MOE_MAXE)
    k_moe_route(const float *logits, int NE, int K, int norm_topk, const float *sh_logit, int sh_id, int32_t *sel,
                float *wout) {
  PDL_ENTER();
  const int ks = sh_logit ? K + 1 : K; /* slots per token */
  const int64_t t = blockIdx.x;
  const float *lt = logits + t * NE;
  moe_route_block([&](int e) { return lt[e]; }, [&]() { return sh_logit[t]; }, sh_logit != nullptr, NE, K, norm_topk,
                  sh_id, sel + t * ks, wout + t * ks);
}

extern "C" void cuda_moe_route(const float *logits, int64_t n_tok, int n_expert, int K, int norm_topk, int32_t *sel,
                               float *w, void *stream) {
  if (n_tok <= 0) return;
  const int th = (n_expert + 31) / 32 * 32;
  pdl_launch(k_moe_route, dim3((unsigned)n_tok), dim3(th), (size_t)(0), OPS_STREAM(stream), logits, n_expert, K, norm_topk, nullptr, 0, sel, w);
}

extern "C" void cuda_moe_route_sh(const float *logits, int64_t n_tok, int n_expert, int K, int norm_topk,
                                  const float *sh_logit, int sh_id, int32_t *sel, float *w, void *stream) {
  if (n_tok <= 0) return;
  const int th = (n_expert + 31) / 32 * 32;
  pdl_launch(k_moe_route, dim3((unsigned)n_tok), dim3(th), (size_t)(0), OPS_STREAM(stream), logits, n_expert, K, norm_topk, sh_logit, sh_id, sel, w);
}

/* The combine kernel is mm_act.cu's k_combine (one implementation, which can also quantize the
 * normed output for a matmul: cuda_mm_combine_act). */
extern "C" void cuda_moe_combine(float *x, const float *y, const float *w, int K, const float *sh,
                                 const float *sh_logit, const float *norm_w, float *h, float eps, int64_t n_tok,
                                 int64_t n, void *stream) {
  cuda_mm_combine_act(NULL, x, y, w, K, sh, sh_logit, norm_w, h, eps, n_tok, n, NULL, 0, stream);
}

static __global__ void k_silu_glu(float *g, const float *u, int64_t n) {
  PDL_ENTER();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    g[i] = __fmul_rn(floe_siluf(g[i]), u[i]);
}

extern "C" void cuda_silu_glu(float *g, const float *u, int64_t n, void *stream) {
  if (n <= 0) return;
  int64_t nb = (n + 255) / 256;
  if (nb > 4096) nb = 4096;
  pdl_launch(k_silu_glu, dim3((unsigned)nb), dim3(256), (size_t)(0), OPS_STREAM(stream), g, u, n);
}
