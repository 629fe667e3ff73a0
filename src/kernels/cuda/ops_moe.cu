/* MoE routing and combine, SiLU-GLU (cuda_ops.h); every value bit-identical to layer_moe.
 *   k_moe_route_warp (the default for n_expert <= 1024, K <= 32): a warp per token, 8, 16 or 32
 *     experts a lane in registers (n_expert <= 256 / 512 / 1024); the same softmax (the 16-lane sum's lanes gathered by shuffles, in the
 *     CPU's order), the top-k as K argmax passes (value descending, ties to the lower index: the
 *     CPU's picks and order) by warp reductions, the renormalisation summed in pick order.
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

#define ROUTE_RMAX 32 /* experts a lane holds at most: k_moe_route_warp takes n_expert <= 32 * ROUTE_RMAX */

/* A warp per token (blockDim 32). Lane l holds experts e = l + 32 r, r < ROUTE_R. No shared memory,
 * no barrier: the serial path is the logits' load, two reductions, K argmax passes and the stores.
 * (The block kernel's rank count costs n_expert shared-memory reads a thread: 15 us a launch at 512
 * experts on the H200, Qwen3-Next-80B-A3B, against ~5 here.) */
template <int ROUTE_R>
static __global__ void __launch_bounds__(32)
    k_moe_route_warp(const float *logits, int NE, int K, int norm_topk, const float *sh_logit, int sh_id, int32_t *sel,
                     float *wout) {
  PDL_ENTER();
  const int ks = sh_logit ? K + 1 : K;
  const int64_t t = blockIdx.x;
  const float *lt = logits + t * NE;
  const int lane = threadIdx.x;
  float p[ROUTE_R];
#pragma unroll
  for (int r = 0; r < ROUTE_R; r++) p[r] = lane + 32 * r < NE ? lt[lane + 32 * r] : -INFINITY;
  const float shl = sh_logit && lane == 0 ? sh_logit[t] : 0.0f;
  float mx = p[0];
#pragma unroll
  for (int r = 1; r < ROUTE_R; r++) mx = fmaxf(mx, p[r]);
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, s));
#pragma unroll
  for (int r = 0; r < ROUTE_R; r++) p[r] = lane + 32 * r < NE ? floe_vexpf(__fsub_rn(p[r], mx)) : 0.0f;
  /* router_softmax's sum: lane k < 16 adds p[k], p[k+16], p[k+32], ... in order; those are its own
   * p[r] (e = k + 32 r) and lane k+16's (e = k + 16 + 32 r), alternately */
  float acc = 0.0f;
#pragma unroll
  for (int r = 0; r < ROUTE_R; r++) {
    const float hi = __shfl_down_sync(0xffffffffu, p[r], 16);
    if (lane < 16) {
      if (lane + 32 * r < NE) acc = __fadd_rn(acc, p[r]);
      if (lane + 16 + 32 * r < NE) acc = __fadd_rn(acc, hi);
    }
  }
  acc = ops_fold16(acc);
  const float sum = __shfl_sync(0xffffffffu, acc, 0);
  /* keys: the probability's bits + 1 (probabilities are >= 0, so their bits order as the values);
   * 0 for no expert or one already picked */
  uint32_t key[ROUTE_R];
#pragma unroll
  for (int r = 0; r < ROUTE_R; r++) key[r] = lane + 32 * r < NE ? __float_as_uint(p[r] / sum) + 1u : 0u;
  float myw = 0.0f, sw = 0.0f;
  int mye = 0;
  for (int j = 0; j < K; j++) {
    uint32_t km = key[0];
#pragma unroll
    for (int r = 1; r < ROUTE_R; r++) km = key[r] > km ? key[r] : km;
    km = __reduce_max_sync(0xffffffffu, km);
    uint32_t ei = 0xffffffffu; /* this lane's lowest expert holding the maximum */
#pragma unroll
    for (int r = ROUTE_R - 1; r >= 0; r--) ei = key[r] == km ? (uint32_t)(lane + 32 * r) : ei;
    ei = __reduce_min_sync(0xffffffffu, ei);
    const float pv = __uint_as_float(km - 1u);
#pragma unroll
    for (int r = 0; r < ROUTE_R; r++)
      if ((uint32_t)(lane + 32 * r) == ei) key[r] = 0u;
    if (lane == j) {
      myw = pv;
      mye = (int)ei;
    }
    sw = __fadd_rn(sw, pv); /* the renormalisation's sum, in pick order */
  }
  if (norm_topk) myw = myw / sw;
  int pos = 0; /* the selections in ascending expert order */
  for (int j = 0; j < K; j++) pos += __shfl_sync(0xffffffffu, mye, j) < mye;
  if (lane < K) {
    sel[t * ks + pos] = mye;
    wout[t * ks + pos] = myw;
  }
  if (sh_logit && lane == 0) {
    sel[t * ks + K] = sh_id;
    wout[t * ks + K] = floe_sigmoidf(shl);
  }
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
