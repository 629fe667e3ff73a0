/* The MoE routing of one token by one block (cuda_ops.h cuda_moe_route): router_softmax (max,
 * vexpf, the 16-lane sum folded in halves, divide), the top-k as ranks (descending probability,
 * ties to the lower index: the picks and order of the CPU's sorted insert), the renormalisation
 * summed in that order, the selections in ascending expert order, and the shared expert as slot
 * K when sh_logit is not NULL. Every value bit-identical to layer_moe. Shared by the routing
 * kernel (ops_moe.cu) and the router matmul that routes in its last block (mm_float.cu).
 * Needs blockDim.x >= NE (threads past NE take part in the barriers only). */
#ifndef FLOE_MOE_ROUTE_CUH
#define FLOE_MOE_ROUTE_CUH
#include "kernels/cuda/ops_common.cuh"

#define MOE_MAXE 1024
#define MOE_MAXK 64

/* lg_of(e): logit of expert e (e < NE); sh_of(): the shared expert's gate logit (read only when
 * has_sh); sel / wout: this token's K (+ has_sh) slots. */
template <typename LG, typename SH>
static __device__ void moe_route_block(LG lg_of, SH sh_of, bool has_sh, int NE, int K, int norm_topk, int sh_id,
                                       int32_t *sel, float *wout) {
  __shared__ float p[MOE_MAXE];
  __shared__ float red[32];
  __shared__ float ws[MOE_MAXK];
  __shared__ int es[MOE_MAXK];
  __shared__ float s_mx, s_sum;
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  const bool ok = e < NE;
  const float lg = ok ? lg_of(e) : -INFINITY;
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
    sel[pos] = es[e];
    wout[pos] = ws[e];
  }
  if (has_sh && e == 0) {
    sel[K] = sh_id;
    wout[K] = floe_sigmoidf(sh_of());
  }
}
#endif
