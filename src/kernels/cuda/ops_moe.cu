/* MoE routing and combine, SiLU-GLU (cuda_ops.h); every value bit-identical to layer_moe.
 *   k_moe_route: block per token. router_softmax (max, vexpf, the 16-lane sum folded in halves,
 *     divide), the top-k as ranks (descending probability, ties to the lower index: the picks
 *     and order of the CPU's sorted insert), the renormalisation summed in that order, then the
 *     selections in ascending expert order.
 *   k_moe_combine: block per token. y = 0; y += y_j * w_j for j ascending; y += sh * sigmoid(gate);
 *     x += y (vaxpy / vadd), then optionally the next block's RMSNorm of x. */
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

#define COMB_THREADS 1024
#define COMB_PER 2 /* values per thread kept in registers (rows up to 2048 in one memory round trip) */

/* restrict pointers and unrolled loops: the loads of a phase are issued before their values are
 * used (a one-token combine is latency-bound) */
static __global__ void __launch_bounds__(COMB_THREADS)
    k_moe_combine(float *__restrict__ x, const float *__restrict__ y, const float *__restrict__ w, int K,
                  const float *__restrict__ sh, const float *__restrict__ shl, const float *__restrict__ nw,
                  float *__restrict__ h, float eps, int n) {
  PDL_ENTER();
  extern __shared__ float xs[];
  __shared__ float rs;
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, bs = blockDim.x;
  float wr[COMB_PER];
#pragma unroll
  for (int k = 0; k < COMB_PER; k++) {
    const int i = tid + k * bs;
    wr[k] = nw && i < n ? nw[i] : 0.0f;
  }
  const float g = sh ? floe_sigmoidf(shl[t]) : 0.0f;
#pragma unroll 2
  for (int i = tid; i < n; i += bs) {
    float acc = 0.0f;
#pragma unroll 8
    for (int j = 0; j < K; j++) acc = __fadd_rn(acc, __fmul_rn(y[(t * K + j) * n + i], w[t * K + j]));
    if (sh) acc = __fadd_rn(acc, __fmul_rn(sh[t * n + i], g));
    const float v = __fadd_rn(x[t * n + i], acc);
    x[t * n + i] = v;
    xs[i] = v;
  }
  if (!nw) return;
  __syncthreads();
  if (tid < 32) {
    const float ss = ops_sumsq16_warp(xs, n);
    if (tid == 0) rs = 1.0f / sqrtf(__fadd_rn(ss / (float)n, eps));
  }
  __syncthreads();
  const float r = rs;
#pragma unroll
  for (int k = 0; k < COMB_PER; k++) {
    const int i = tid + k * bs;
    if (i < n) h[t * n + i] = __fmul_rn(__fmul_rn(xs[i], r), wr[k]);
  }
  for (int i = tid + COMB_PER * bs; i < n; i += bs) h[t * n + i] = __fmul_rn(__fmul_rn(xs[i], r), nw[i]);
}

extern "C" void cuda_moe_combine(float *x, const float *y, const float *w, int K, const float *sh,
                                 const float *sh_logit, const float *norm_w, float *h, float eps, int64_t n_tok,
                                 int64_t n, void *stream) {
  if (n_tok <= 0) return;
  pdl_launch(k_moe_combine, dim3((unsigned)n_tok), dim3(COMB_THREADS), (size_t)((size_t)n * sizeof(float)), OPS_STREAM(stream), 
      x, y, w, K, sh, sh_logit, norm_w, h, eps, (int)n);
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
