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
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define MOE_MAXE 1024
#define MOE_MAXK 64

static __global__ void __launch_bounds__(MOE_MAXE)
    k_moe_route(const float *logits, int NE, int K, int norm_topk, const float *sh_logit, int sh_id, int32_t *sel,
                float *wout) {
  PDL_ENTER();
  const int ks = sh_logit ? K + 1 : K; /* slots per token */
  __shared__ float p[MOE_MAXE];
  __shared__ float red[32];
  __shared__ float ws[MOE_MAXK];
  __shared__ int es[MOE_MAXK];
  __shared__ float s_mx, s_sum;
  const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, warp = e >> 5;
  const bool ok = e < NE;
  const float lg = ok ? logits[(int64_t)t * NE + e] : -INFINITY;
  float m = lg;
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (e == 0) {
    float mx = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++) mx = red[w] > mx ? red[w] : mx;
    s_mx = mx;
  }
  __syncthreads();
  if (ok) p[e] = floe_vexpf(__fsub_rn(lg, s_mx));
  __syncthreads();
  if (e < 32) { /* lane k sums p[k], p[k+16], ... in order, then fold16 */
    float acc = 0.0f;
    if (e < 16)
      for (int i = e; i < NE; i += 16) acc = __fadd_rn(acc, p[i]);
    acc = ops_fold16(acc);
    if (e == 0) s_sum = acc;
  }
  __syncthreads();
  float pe = 0.0f;
  if (ok) pe = p[e] / s_sum;
  __syncthreads();
  if (ok) p[e] = pe;
  __syncthreads();
  if (ok) {
    int rank = 0;
    for (int i = 0; i < NE; i++) {
      const float pi = p[i];
      rank += pi > pe || (pi == pe && i < e);
    }
    if (rank < K) {
      ws[rank] = pe;
      es[rank] = e;
    }
  }
  __syncthreads();
  if (e == 0 && norm_topk) {
    float sw = 0.0f;
    for (int j = 0; j < K; j++) sw = __fadd_rn(sw, ws[j]);
    for (int j = 0; j < K; j++) ws[j] = ws[j] / sw;
  }
  __syncthreads();
  if (e < K) {
    int pos = 0;
    for (int j = 0; j < K; j++) pos += es[j] < es[e];
    sel[(int64_t)t * ks + pos] = es[e];
    wout[(int64_t)t * ks + pos] = ws[e];
  }
  if (sh_logit && e == 0) {
    sel[(int64_t)t * ks + K] = sh_id;
    wout[(int64_t)t * ks + K] = floe_sigmoidf(sh_logit[t]);
  }
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
