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
#define ROUTE_RMAX 32 /* experts a lane holds at most: moe_route_warp takes n_expert <= 32 * ROUTE_RMAX */

/* The same routing by one warp (every lane calls it; the caller's other warps must not): lane l
 * holds experts e = l + 32 r, r < ROUTE_R (n_expert <= 32 ROUTE_R). No shared memory, no barrier:
 * the serial path is the logits' load, two reductions, K argmax passes and the stores. The softmax
 * sum in the CPU's order (the 16-lane sum's lanes gathered by shuffles), the top-k as K argmax
 * passes (value descending, ties to the lower index), the renormalisation summed in pick order:
 * every value bit-identical to moe_route_block. (The block form's rank count costs n_expert
 * shared-memory reads a thread: 15 us a launch at 512 experts on the H200, ~5 here.) */
template <int ROUTE_R, typename LG, typename SH>
static __device__ __forceinline__ void moe_route_warp(LG lg_of, SH sh_of, bool has_sh, int NE, int K, int norm_topk,
                                                      int sh_id, int32_t *sel, float *wout) {
  const int lane = threadIdx.x & 31;
  float p[ROUTE_R];
#pragma unroll
  for (int r = 0; r < ROUTE_R; r++) p[r] = lane + 32 * r < NE ? lg_of(lane + 32 * r) : -INFINITY;
  const float shl = has_sh && lane == 0 ? sh_of() : 0.0f;
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
    sel[pos] = mye;
    wout[pos] = myw;
  }
  if (has_sh && lane == 0) {
    sel[K] = sh_id;
    wout[K] = floe_sigmoidf(shl);
  }
}
#endif
