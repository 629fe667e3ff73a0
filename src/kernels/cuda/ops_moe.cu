/* MoE routing and combine, SiLU-GLU (cuda_ops.h); every value bit-identical to layer_moe.
 *   k_moe_route_warp (the default for n_expert <= 1024, K <= 32): a warp per token, 8, 16 or 32
 *     experts a lane in registers (n_expert <= 256 / 512 / 1024; moe_route.cuh moe_route_warp):
 *     the same softmax (the 16-lane sum's lanes gathered by shuffles, in the CPU's order), the
 *     top-k as K argmax passes (value descending, ties to the lower index: the CPU's picks and
 *     order) by warp reductions, the renormalisation summed in pick order.
 *     cuda_moe_set_route_impl(0) / FLOE_CUDA_ROUTE_WARP=0 select k_moe_route, the same bits.
 *   k_moe_route: block per token. router_softmax (max, vexpf, the 16-lane sum folded in halves,
 *     divide), the top-k as ranks (descending probability, ties to the lower index: the picks
 *     and order of the CPU's sorted insert), the renormalisation summed in that order, then the
 *     selections in ascending expert order.
 *   the combine (mm_act.cu's k_combine): block per token. y = 0; y += y_j * w_j for j ascending;
 *     y += sh * sigmoid(gate); x += y (vaxpy / vadd), then optionally the next block's RMSNorm of x
 *     (and its quantization for a matmul, cuda_mm_combine_act). */
#include <stdlib.h>

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

/* A warp per token (blockDim 32): moe_route_warp (moe_route.cuh), the logits from global memory. */
template <int ROUTE_R>
static __global__ void __launch_bounds__(32)
    k_moe_route_warp(const float *logits, int NE, int K, int norm_topk, const float *sh_logit, int sh_id, int32_t *sel,
                     float *wout) {
  PDL_ENTER();
  const int ks = sh_logit ? K + 1 : K;
  const int64_t t = blockIdx.x;
  const float *lt = logits + t * NE;
  moe_route_warp<ROUTE_R>([&](int e) { return lt[e]; }, [&]() { return sh_logit[t]; }, sh_logit != nullptr, NE, K,
                          norm_topk, sh_id, sel + t * ks, wout + t * ks);
}

static int g_route_warp = -1;

static int route_warp_on(int NE, int K) {
  if (g_route_warp < 0) {
    const char *e = getenv("FLOE_CUDA_ROUTE_WARP");
    g_route_warp = !(e && e[0] == '0');
  }
  return g_route_warp && NE <= 32 * ROUTE_RMAX && K <= 32;
}

/* k_moe_route_warp with the fewest experts a lane that hold n_expert */
static void route_warp_launch(const float *logits, int64_t n_tok, int NE, int K, int norm_topk, const float *sh_logit,
                              int sh_id, int32_t *sel, float *w, void *stream) {
#define RW_LAUNCH(R)                                                                                             \
  pdl_launch(k_moe_route_warp<R>, dim3((unsigned)n_tok), dim3(32), (size_t)0, OPS_STREAM(stream), logits, NE, K, \
             norm_topk, sh_logit, sh_id, sel, w)
  if (NE <= 256) RW_LAUNCH(8);
  else if (NE <= 512) RW_LAUNCH(16);
  else RW_LAUNCH(32);
#undef RW_LAUNCH
}

extern "C" void cuda_moe_set_route_impl(int warp) { g_route_warp = warp ? 1 : 0; }

extern "C" void cuda_moe_route(const float *logits, int64_t n_tok, int n_expert, int K, int norm_topk, int32_t *sel,
                               float *w, void *stream) {
  if (n_tok <= 0) return;
  if (route_warp_on(n_expert, K)) {
    route_warp_launch(logits, n_tok, n_expert, K, norm_topk, nullptr, 0, sel, w, stream);
    return;
  }
  const int th = (n_expert + 31) / 32 * 32;
  pdl_launch(k_moe_route, dim3((unsigned)n_tok), dim3(th), (size_t)(0), OPS_STREAM(stream), logits, n_expert, K, norm_topk, nullptr, 0, sel, w);
}

extern "C" void cuda_moe_route_sh(const float *logits, int64_t n_tok, int n_expert, int K, int norm_topk,
                                  const float *sh_logit, int sh_id, int32_t *sel, float *w, void *stream) {
  if (n_tok <= 0) return;
  if (route_warp_on(n_expert, K)) {
    route_warp_launch(logits, n_tok, n_expert, K, norm_topk, sh_logit, sh_id, sel, w, stream);
    return;
  }
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
