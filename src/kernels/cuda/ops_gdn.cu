/* GatedDeltaNet step on the GPU (cuda_ops.h): the conv then the recurrence, each over all n tokens
 * in order (token-by-token recurrence, as the CPU: prefill rows equal decode rows). One decode
 * token takes a single launch (k_gdn_step1: both in one block per value head); prefill chunks
 * take the parallel conv (k_gdn_conv_par) and the recurrence with S's columns over several blocks
 * (k_gdn_recur_cols) followed by the gated norm (k_gdn_gnorm). Every kernel choice gives the same
 * bits: each output takes the float operations below, in the same order.
 *   k_gdn_conv: block per dk channels (one key head of q or k, or dk channels of v), a thread
 *     per channel: the causal conv over [window, mix_t] oldest first, SiLU, the window shift
 *     (kept in registers across tokens), and for q / k heads the L2 norm (sumsq16 order, eps
 *     1e-6; q also times dk^-0.5). Same operations and order as gdn_conv_worker.
 *   k_gdn_recur: block per value head, a thread per column jj of S (its dk values in registers
 *     and shared memory across tokens): decay and S^T k summed over i (base/gdn_sum.h's
 *     order: eight accumulators by i % 8, a fixed tree), the delta, the rank-1 update and S^T q
 *     the same way, then the gated RMSNorm with silu(z) (warp 0, sumsq16 order). Same
 *     operations and order as gdn_heads_worker; the columns are independent, so a thread per
 *     column is the CPU's loop order exactly. The decay's exp / log1p are computed in double and
 *     rounded (libm expf / log1pf on the CPU): see cuda_ops.h.
 * Kept chunks (KEEP = true, speculative verify): the same token loop, with the state after each
 * token also stored into that token's own buffer and the state read at entry left as it was.
 * The state lives in registers across the loop either way, so row t's kept state is bit for bit
 * the in-place state after t + 1 tokens. The in-place instantiations are unchanged code. */
#include <math.h>
#include <stdlib.h>

extern "C" {
#include "base/base.h"
#include "base/gdn_sum.h"
}
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/mm_act.cuh"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define GDN_KMAX 8
#define GDN_SR128 64 /* rows of S in registers at dk 128 */

static int g_cluster_ok = -1; /* the device launches thread block clusters (sm_90+), for k_gdn_step1 */

static void gdn_cluster_query(void) {
  if (g_cluster_ok >= 0) return;
  int dev = 0, v = 0;
  g_cluster_ok = cudaGetDevice(&dev) == cudaSuccess &&
                 cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev) == cudaSuccess && v;
}

extern "C" int cuda_gdn_check(const cuda_gdn_shape *sh, char *err, size_t errlen) {
  if (sh->dk < 1 || sh->dk > 128)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: dk %d (1..128 supported)", sh->dk);
  if (sh->dv < 2 || sh->dv > 128)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: dv %d (2..128 supported)", sh->dv);
  if (sh->Nk <= 0 || sh->Nv <= 0 || sh->Nv % sh->Nk)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: %d value heads over %d key heads", sh->Nv, sh->Nk);
  if (sh->conv_k < 2 || sh->conv_k > GDN_KMAX)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: conv kernel %d (2..%d)", sh->conv_k, GDN_KMAX);
  gdn_cluster_query(); /* here, at setup, rather than at a first launch inside a graph capture */
  return 0;
}

template <bool KEEP>
static __global__ void __launch_bounds__(128)
    k_gdn_conv(const float *mix, const float *wt, float *state, float *const *state_p, float *const *keep, float *raw,
               int C, int K, int dk, int Nk, int n_tok, float qscale) {
  PDL_ENTER();
  if (state_p) state = *state_p; /* the window behind a device pointer cell (graph replay after swaps) */
  __shared__ float xs[128];
  const int g = blockIdx.x, tid = threadIdx.x, ch = g * dk + tid;
  const bool ok = tid < dk && ch < C, norm = g < 2 * Nk; /* threads >= dk: barriers only */
  float win[GDN_KMAX - 1], w[GDN_KMAX];
#pragma unroll
  for (int q = 0; q < GDN_KMAX; q++) {
    w[q] = ok && q < K ? wt[(int64_t)q * C + ch] : 0.0f;
    if (q < GDN_KMAX - 1) win[q] = ok && q < K - 1 ? state[(int64_t)q * C + ch] : 0.0f;
  }
  for (int t = 0; t < n_tok; t++) {
    const float m = ok ? mix[(int64_t)t * C + ch] : 0.0f;
    float c = 0.0f;
#pragma unroll
    for (int q = 0; q < GDN_KMAX - 1; q++)
      if (q < K - 1) c = __fadd_rn(c, __fmul_rn(w[q], win[q]));
    float wl = w[0];
#pragma unroll
    for (int q = 1; q < GDN_KMAX; q++)
      if (q == K - 1) wl = w[q];
    c = floe_siluf(__fadd_rn(c, __fmul_rn(wl, m)));
#pragma unroll
    for (int q = 0; q < GDN_KMAX - 2; q++)
      if (q < K - 2) win[q] = win[q + 1];
#pragma unroll
    for (int q = 0; q < GDN_KMAX - 1; q++)
      if (q == K - 2) win[q] = m;
    if (norm) { /* block-uniform */
      if (tid < dk) xs[tid] = c;
      __syncthreads();
      __shared__ float rn;
      if (tid < 32) {
        const float ss = ops_sumsq16_warp(xs, dk);
        if (tid == 0) rn = 1.0f / sqrtf(__fadd_rn(ss, 1e-6f));
      }
      __syncthreads();
      c = g < Nk ? __fmul_rn(__fmul_rn(c, rn), qscale) : __fmul_rn(c, rn);
      __syncthreads();
    }
    if (ok) raw[(int64_t)t * C + ch] = c;
    if (KEEP && ok) { /* kept chunk: the window after row t into row t's buffer */
      float *kt = keep[t];
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 1; q++)
        if (q < K - 1) kt[(int64_t)q * C + ch] = win[q];
    }
  }
  if (!KEEP && ok)
#pragma unroll
    for (int q = 0; q < GDN_KMAX - 1; q++)
      if (q < K - 1) state[(int64_t)q * C + ch] = win[q];
}

/* k_gdn_conv_par: k_gdn_conv's outputs for a chunk of tokens with a block per (channel group,
 * token). The conv has no recurrence: token t's window is the chunk's rows t-K+1 .. t-1, or the
 * entry window for positions before the chunk, so the tokens run in parallel while each output
 * takes k_gdn_conv's operations in its order (c = 0, then c + w[q] * x over the window oldest
 * first, then c + w[K-1] * x_t, SiLU, the L2 norm of q / k heads). The window state is advanced
 * after the chunk by k_gdn_conv_shift. Prefill measured the serial kernel at ~1 us a token a layer
 * (H200, 35B-A3B shape), its tokens walked one by one. Not for kept chunks (k_gdn_conv<true>). */
static __global__ void __launch_bounds__(128)
    k_gdn_conv_par(const float *__restrict__ mix, const float *__restrict__ wt, const float *state,
                   float *const *state_p, float *__restrict__ raw, int C, int K, int dk, int Nk, float qscale) {
  PDL_ENTER();
  if (state_p) state = *state_p;
  __shared__ float xs[128];
  __shared__ float rn;
  const int g = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, ch = g * dk + tid;
  const bool ok = tid < dk && ch < C, norm = g < 2 * Nk;
  float c = 0.0f, m = 0.0f, wl = 0.0f;
  if (ok) {
    for (int q = 0; q < K - 1; q++) {
      const int i = t - (K - 1) + q; /* the input at window slot q */
      const float v = i >= 0 ? mix[(int64_t)i * C + ch] : state[(int64_t)(K - 1 + i) * C + ch];
      c = __fadd_rn(c, __fmul_rn(wt[(int64_t)q * C + ch], v));
    }
    m = mix[(int64_t)t * C + ch];
    wl = wt[(int64_t)(K - 1) * C + ch];
  }
  c = floe_siluf(__fadd_rn(c, __fmul_rn(wl, m)));
  if (norm) { /* block-uniform */
    if (tid < dk) xs[tid] = c;
    __syncthreads();
    if (tid < 32) {
      const float ss = ops_sumsq16_warp(xs, dk);
      if (tid == 0) rn = 1.0f / sqrtf(__fadd_rn(ss, 1e-6f));
    }
    __syncthreads();
    c = g < Nk ? __fmul_rn(__fmul_rn(c, rn), qscale) : __fmul_rn(c, rn);
  }
  if (ok) raw[(int64_t)t * C + ch] = c;
}

/* The window after n_tok more inputs: slot q = input n_tok - (K-1) + q, from the chunk or from the
 * window itself (a slot read is always past the slots already written: in place, oldest first). */
static __global__ void k_gdn_conv_shift(const float *__restrict__ mix, float *state, float *const *state_p, int C,
                                        int K, int n_tok) {
  PDL_ENTER();
  if (state_p) state = *state_p;
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= C) return;
  for (int q = 0; q < K - 1; q++) {
    const int i = n_tok - (K - 1) + q;
    state[(int64_t)q * C + ch] = i >= 0 ? mix[(int64_t)i * C + ch] : state[(int64_t)(K - 1 + i) * C + ch];
  }
}

/* 1: chunks of several tokens through k_gdn_conv_par (the default); 0: k_gdn_conv token by token
 * (the same bits); -1: from FLOE_CUDA_CONV_PAR (=0 selects k_gdn_conv). */
static int g_conv_par = -1;

extern "C" void cuda_gdn_set_conv_par(int on) { g_conv_par = on ? 1 : 0; }

static void gdn_conv_launch(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *conv_state,
                            float *const *state_p, float *const *keep, float *raw, int64_t n_tok, void *stream) {
  if (n_tok <= 0) return;
  const int C = 2 * sh->Nk * sh->dk + sh->Nv * sh->dv;
  const float qscale = (float)(1.0 / sqrt((double)sh->dk));
  if (g_conv_par < 0) {
    const char *e = getenv("FLOE_CUDA_CONV_PAR");
    g_conv_par = !(e && e[0] == '0');
  }
  /* whole warps: the sumsq16 warp needs all 32 lanes */
  const dim3 grid((C + sh->dk - 1) / sh->dk), block((sh->dk + 31) / 32 * 32);
  if (!keep && n_tok > 1 && n_tok <= 65535 && g_conv_par == 1) {
    pdl_launch(k_gdn_conv_par, dim3(grid.x, (unsigned)n_tok), block, (size_t)0, OPS_STREAM(stream), mix, conv_wt,
               (const float *)conv_state, state_p, raw, C, sh->conv_k, sh->dk, sh->Nk, qscale);
    pdl_launch(k_gdn_conv_shift, dim3((unsigned)((C + 127) / 128)), dim3(128), (size_t)0, OPS_STREAM(stream), mix,
               conv_state, state_p, C, sh->conv_k, (int)n_tok);
    return;
  }
  if (keep)
    pdl_launch(k_gdn_conv<true>, grid, block, (size_t)0, OPS_STREAM(stream), mix, conv_wt, conv_state, state_p, keep,
               raw, C, sh->conv_k, sh->dk, sh->Nk, (int)n_tok, qscale);
  else
    pdl_launch(k_gdn_conv<false>, grid, block, (size_t)0, OPS_STREAM(stream), mix, conv_wt, conv_state, state_p, keep,
               raw, C, sh->conv_k, sh->dk, sh->Nk, (int)n_tok, qscale);
}

extern "C" void cuda_gdn_conv(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *conv_state,
                              float *raw, int64_t n_tok, void *stream) {
  gdn_conv_launch(sh, mix, conv_wt, conv_state, NULL, NULL, raw, n_tok, stream);
}

extern "C" void cuda_gdn_conv_p(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt,
                                float *const *conv_state, float *const *keep, float *raw, int64_t n_tok, void *stream) {
  gdn_conv_launch(sh, mix, conv_wt, NULL, conv_state, keep, raw, n_tok, stream);
}

/* expf / log1pf as libm computes them (correctly rounded float results, in practice) */
static __device__ __forceinline__ float gdn_expf(float x) { return (float)exp((double)x); }
static __device__ __forceinline__ float gdn_softplus(float x) {
  return x > 20.0f ? x : (float)log1p((double)gdn_expf(x));
}

/* DK: the kernel's key dim (16, 32, 64 or 128), dk <= DK the real one; rows i >= dk are skipped
 * (uniform branches). A thread per column jj < dv; blockDim is dv rounded up to whole warps, the
 * extra threads take part in the barriers only. */
template <int DK, bool KEEP>
static __global__ void __launch_bounds__(128)
    k_gdn_recur(const float *raw, const float *z, const float *b, const float *a, const float *dt_bias,
                const float *ssm_a, const float *norm_w, float *Sg, float *const *Sp, float *const *keep, float *o,
                int Nk, int Nv, int dk, int dv, int v_tiled, float eps, int n_tok) {
  PDL_ENTER();
  if (Sp) Sg = *Sp; /* the state behind a device pointer cell (graph replay after swaps) */
  __shared__ float qk[2 * DK];
  __shared__ float os[128];
  __shared__ float s_rr;
  const int hv = blockIdx.x, jj = threadIdx.x, r = Nv / Nk;
  const bool col = jj < dv;
  const int kh = v_tiled ? hv % Nk : hv / r;
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  /* beta and the decay of every token first, parked in o[t][hv*dv + 0, 1] (overwritten by token
   * t's output only after they are read; hence dv >= 2): the double-precision exp / log1p beside
   * the registers of S's column made the token loop spill */
  {
    const float A = ssm_a[hv], dtb = dt_bias[hv];
    for (int t = jj; t < n_tok; t += blockDim.x) {
      float *st = o + (int64_t)t * vd + (int64_t)hv * dv;
      const float bt = floe_sigmoidf(b[(int64_t)t * Nv + hv]);
      const float dc = gdn_expf(__fmul_rn(A, gdn_softplus(__fadd_rn(a[(int64_t)t * Nv + hv], dtb))));
      st[0] = bt;
      st[1] = dc;
    }
    __syncthreads();
  }
  /* S's column: rows i < SR in registers, the rest in shared memory (ssh[i - SR][jj]: no bank
   * conflicts). dk 128 with 64 rows in registers: 128 registers, no spill (the earlier loop
   * spilled 288 bytes); (128 - 64) * 128 floats = 32 KiB of shared memory. */
  constexpr int SR = DK <= 32 ? DK : (DK == 64 ? 32 : GDN_SR128);
  extern __shared__ float ssh[];
  float *S = Sg + (int64_t)hv * dk * dv + jj;
  float s[SR];
#pragma unroll
  for (int i = 0; i < SR; i++) s[i] = col && i < dk ? S[(int64_t)i * dv] : 0.0f;
  if (col)
    for (int i = SR; i < dk; i++) ssh[(i - SR) * dv + jj] = S[(int64_t)i * dv];
  const float wn = col ? norm_w[jj] : 0.0f;
  for (int t = 0; t < n_tok; t++) {
    const float *c = raw + (int64_t)t * C;
    for (int i = jj; i < dk; i += blockDim.x) {
      qk[i] = c[kh * dk + i];
      qk[DK + i] = c[kd + kh * dk + i];
    }
    const float *ot = o + (int64_t)t * vd + (int64_t)hv * dv;
    const float vv = col ? c[2 * kd + (int64_t)hv * dv + jj] : 0.0f;
    const float zz = col ? z[(int64_t)t * vd + (int64_t)hv * dv + jj] : 0.0f;
    const float beta = ot[0], decay = ot[1];
    __syncthreads();
    float oo = 0.0f;
    if (col) { /* the sums in base/gdn_sum.h's order: row i into accumulator i % GDN_ACC (SR is a multiple of it) */
      float ka[GDN_ACC], oa[GDN_ACC];
#pragma unroll
      for (int u = 0; u < GDN_ACC; u++) ka[u] = oa[u] = 0.0f;
#pragma unroll
      for (int i = 0; i < SR; i++)
        if (i < dk) {
          s[i] = __fmul_rn(s[i], decay);
          ka[i % GDN_ACC] = __fadd_rn(ka[i % GDN_ACC], __fmul_rn(s[i], qk[DK + i]));
        }
      for (int i0 = SR; i0 < dk; i0 += GDN_ACC)
#pragma unroll
        for (int u = 0; u < GDN_ACC; u++) {
          const int i = i0 + u;
          if (i < dk) {
            const float v = __fmul_rn(ssh[(i - SR) * dv + jj], decay);
            ssh[(i - SR) * dv + jj] = v;
            ka[u] = __fadd_rn(ka[u], __fmul_rn(v, qk[DK + i]));
          }
        }
      const float delta = __fmul_rn(__fsub_rn(vv, floe_gdn_fold8(ka)), beta);
#pragma unroll
      for (int i = 0; i < SR; i++)
        if (i < dk) {
          s[i] = __fadd_rn(s[i], __fmul_rn(qk[DK + i], delta));
          oa[i % GDN_ACC] = __fadd_rn(oa[i % GDN_ACC], __fmul_rn(s[i], qk[i]));
        }
      for (int i0 = SR; i0 < dk; i0 += GDN_ACC)
#pragma unroll
        for (int u = 0; u < GDN_ACC; u++) {
          const int i = i0 + u;
          if (i < dk) {
            const float v = __fadd_rn(ssh[(i - SR) * dv + jj], __fmul_rn(qk[DK + i], delta));
            ssh[(i - SR) * dv + jj] = v;
            oa[u] = __fadd_rn(oa[u], __fmul_rn(v, qk[i]));
          }
        }
      oo = floe_gdn_fold8(oa);
      os[jj] = oo;
      if (KEEP) { /* kept chunk: the state after row t into row t's buffer */
        float *Kt = keep[t] + (int64_t)hv * dk * dv + jj;
#pragma unroll
        for (int i = 0; i < SR; i++)
          if (i < dk) Kt[(int64_t)i * dv] = s[i];
        for (int i = SR; i < dk; i++) Kt[(int64_t)i * dv] = ssh[(i - SR) * dv + jj];
      }
    }
    __syncthreads(); /* os complete; every thread has read beta / decay and qk of token t */
    if (jj < 32) {
      const float ss = ops_sumsq16_warp(os, dv);
      if (jj == 0) s_rr = 1.0f / sqrtf(__fadd_rn(ss / (float)dv, eps));
    }
    __syncthreads();
    if (col) o[(int64_t)t * vd + (int64_t)hv * dv + jj] = __fmul_rn(__fmul_rn(wn, __fmul_rn(oo, s_rr)), floe_siluf(zz));
  }
  if (!KEEP && col) {
#pragma unroll
    for (int i = 0; i < SR; i++)
      if (i < dk) S[(int64_t)i * dv] = s[i];
    for (int i = SR; i < dk; i++) S[(int64_t)i * dv] = ssh[(i - SR) * dv + jj];
  }
}

/* k_gdn_recur2<DK>: dk = DK (128 or 64), two threads per column: lane l < 16 of a warp holds half
 * 0 of the rows of column 16 w + l of S, lane l + 16 half 1 (g2_row: rows 8m..8m+3 and
 * 8m+4..8m+7), both in registers. Every float operation and its order is k_gdn_recur's: the decay
 * product and s * k per row, then kv summed over i in base/gdn_sum.h's order (g2_chain_h: each
 * half its four accumulators, one exchange for the tree's last add), the delta (in both halves),
 * the rank-1 update and s * q per row, oo summed the same way. So the operations are
 * k_gdn_recur's, while each thread issues half the instructions and no
 * shared-memory traffic for S (k_gdn_recur's column thread runs ~5000 instructions a token with
 * one warp per scheduler). The default for dk 128 (H200, 35B-A3B shape: decode 252 -> 274 tok/s,
 * prefill 870 -> 1103) and dk 64 (the default model); FLOE_CUDA_GDN2=0 / cuda_gdn_set_impl(0)
 * selects k_gdn_recur. */
#define G2_HALF 64

/* The rows of a column's NQ threads (2, 4 or 8; lanes of a warp: thread qi = lane / (32 / NQ) of
 * column lane % (32 / NQ)): thread qi holds the rows of accumulators R qi .. R qi + R - 1 of
 * base/gdn_sum.h's order (row i into accumulator i % GDN_ACC), R = 8 / NQ of them: its p[i] is
 * row gq_row(qi, i) = 8 (i / R) + R qi + i % R. Each thread sums its R accumulators alone (chains
 * of dk / 8 adds side by side) and forms their subtree of floe_gdn_fold8; log2(NQ) exchanges add
 * the subtrees in the tree's order (the lower group's first). No thread waits for another's
 * chain, and the warp runs one path. NQ = 2: g2_row(h, i) = 8 (i / 4) + 4 h + i % 4. */
template <int NQ>
static __device__ __forceinline__ int gq_row(int qi, int i) {
  constexpr int R = GDN_ACC / NQ;
  return GDN_ACC * (i / R) + R * qi + i % R;
}
static __device__ __forceinline__ int g2_row(int half, int i) { return gq_row<2>(half, i); }

/* floe_gdn_fold8's subtree of a thread's R accumulators, then the exchanges up the tree */
template <int NQ>
static __device__ __forceinline__ float gq_fold(const float *acc, int qi) {
  static_assert(GDN_ACC == 8 && (NQ == 2 || NQ == 4 || NQ == 8), "eight accumulators over 2, 4 or 8 threads");
  float v = NQ == 2   ? __fadd_rn(__fadd_rn(acc[0], acc[1]), __fadd_rn(acc[2], acc[3]))
            : NQ == 4 ? __fadd_rn(acc[0], acc[1])
                      : acc[0];
#pragma unroll
  for (int b = 1; b < NQ; b <<= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, b * (32 / NQ));
    v = qi & b ? __fadd_rn(o, v) : __fadd_rn(v, o);
  }
  return v;
}

/* The sum of a column's NQ H products p (this thread's H, rows gq_row) in base/gdn_sum.h's
 * order; valid in every thread of the column. */
template <int NQ, int H>
static __device__ __forceinline__ float gq_chain(const float p[H], int qi) {
  constexpr int R = GDN_ACC / NQ;
  static_assert(H % R == 0, "whole accumulator groups");
  float acc[R];
#pragma unroll
  for (int u = 0; u < R; u++) acc[u] = 0.0f;
#pragma unroll
  for (int i = 0; i < H; i++) acc[i % R] = __fadd_rn(acc[i % R], p[i]);
  return gq_fold<NQ>(acc, qi);
}

/* gq_chain of two columns' products at once, interleaved (independent add chains share each
 * step's latency) */
template <int NQ, int H>
static __device__ __forceinline__ void gq_chain2(const float pa[H], const float pb[H], int qi, float &ra, float &rb) {
  constexpr int R = GDN_ACC / NQ;
  float x[R], y[R];
#pragma unroll
  for (int u = 0; u < R; u++) x[u] = y[u] = 0.0f;
#pragma unroll
  for (int i = 0; i < H; i++) {
    x[i % R] = __fadd_rn(x[i % R], pa[i]);
    y[i % R] = __fadd_rn(y[i % R], pb[i]);
  }
  ra = gq_fold<NQ>(x, qi);
  rb = gq_fold<NQ>(y, qi);
}

/* One token of the column recurrence with consecutive tokens overlapped (k_gdn_recur_cols2 / 3):
 * s += k delta and oo = S^T q; where a next token exists (kn, its k; block-uniform) also its decay
 * s *= decay and kv = S^T kn, both sums in one pass (gq_chain2). */
template <int NQ, int HR>
static __device__ __forceinline__ void gq_token(float s[HR], const float *q, const float *k, const float *kn,
                                                float delta, float decay, int qi, float &oo, float &kv) {
  float po[HR], pk[HR];
  if (kn) {
#pragma unroll
    for (int i = 0; i < HR; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(k[gq_row<NQ>(qi, i)], delta));
      po[i] = __fmul_rn(s[i], q[gq_row<NQ>(qi, i)]);
      s[i] = __fmul_rn(s[i], decay);
      pk[i] = __fmul_rn(s[i], kn[gq_row<NQ>(qi, i)]);
    }
    gq_chain2<NQ, HR>(po, pk, qi, oo, kv);
  } else {
#pragma unroll
    for (int i = 0; i < HR; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(k[gq_row<NQ>(qi, i)], delta));
      po[i] = __fmul_rn(s[i], q[gq_row<NQ>(qi, i)]);
    }
    oo = gq_chain<NQ, HR>(po, qi);
  }
}

/* two threads a column (k_gdn_recur2, k_gdn_step1, k_gdn_recur_cols) */
template <int H>
static __device__ __forceinline__ float g2_chain_h(const float p[H], int lane, int half) {
  (void)lane;
  return gq_chain<2, H>(p, half);
}
static __device__ __forceinline__ float g2_chain(const float p[G2_HALF], int lane, int half) {
  return g2_chain_h<G2_HALF>(p, lane, half);
}

template <int DK, bool KEEP>
static __global__ void __launch_bounds__(256)
    k_gdn_recur2(const float *raw, const float *z, const float *b, const float *a, const float *dt_bias,
                 const float *ssm_a, const float *norm_w, float *Sg, float *const *Sp, float *const *keep, float *o,
                 int Nk, int Nv, int dv, int v_tiled, float eps, int n_tok) {
  PDL_ENTER();
  if (Sp) Sg = *Sp;
  constexpr int dk = DK, H = DK / 2; /* rows a thread holds */
  __shared__ float qk[2 * dk];
  __shared__ float os[128];
  __shared__ float s_rr;
  const int hv = blockIdx.x, lane = threadIdx.x & 31, half = lane >> 4;
  const int jj = (threadIdx.x >> 5) * 16 + (lane & 15), r = Nv / Nk;
  const bool col = jj < dv;
  const int kh = v_tiled ? hv % Nk : hv / r;
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  {
    const float A = ssm_a[hv], dtb = dt_bias[hv];
    for (int t = threadIdx.x; t < n_tok; t += blockDim.x) {
      float *st = o + (int64_t)t * vd + (int64_t)hv * dv;
      const float bt = floe_sigmoidf(b[(int64_t)t * Nv + hv]);
      const float dc = gdn_expf(__fmul_rn(A, gdn_softplus(__fadd_rn(a[(int64_t)t * Nv + hv], dtb))));
      st[0] = bt;
      st[1] = dc;
    }
    __syncthreads();
  }
  float *S = Sg + (int64_t)hv * dk * dv + (col ? jj : 0);
  float s[H], p[H];
#pragma unroll
  for (int i = 0; i < H; i++) s[i] = col ? S[(int64_t)g2_row(half, i) * dv] : 0.0f;
  const float wn = col ? norm_w[jj] : 0.0f;
  for (int t = 0; t < n_tok; t++) {
    const float *c = raw + (int64_t)t * C;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      qk[i] = c[kh * dk + i];
      qk[dk + i] = c[kd + kh * dk + i];
    }
    const float *ot = o + (int64_t)t * vd + (int64_t)hv * dv;
    const float vv = col ? c[2 * kd + (int64_t)hv * dv + jj] : 0.0f;
    const float zz = col ? z[(int64_t)t * vd + (int64_t)hv * dv + jj] : 0.0f;
    const float beta = ot[0], decay = ot[1];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fmul_rn(s[i], decay);
      p[i] = __fmul_rn(s[i], qk[dk + g2_row(half, i)]);
    }
    const float kv = g2_chain_h<H>(p, lane, half);
    const float delta_u = __fmul_rn(__fsub_rn(vv, kv), beta);
    const float delta = delta_u; /* kv is valid in both halves */
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(qk[dk + g2_row(half, i)], delta));
      p[i] = __fmul_rn(s[i], qk[g2_row(half, i)]);
    }
    const float oo = g2_chain_h<H>(p, lane, half);
    if (half == 1 && col) os[jj] = oo;
    if (KEEP && col) { /* kept chunk: this half's rows of the state after row t */
      float *Kt = keep[t] + (int64_t)hv * dk * dv + jj;
#pragma unroll
      for (int i = 0; i < H; i++) Kt[(int64_t)g2_row(half, i) * dv] = s[i];
    }
    __syncthreads(); /* os complete; every thread has read beta / decay and qk of token t */
    if (threadIdx.x < 32) {
      const float ss = ops_sumsq16_warp(os, dv);
      if (threadIdx.x == 0) s_rr = 1.0f / sqrtf(__fadd_rn(ss / (float)dv, eps));
    }
    __syncthreads();
    if (col && half == 1)
      o[(int64_t)t * vd + (int64_t)hv * dv + jj] = __fmul_rn(__fmul_rn(wn, __fmul_rn(oo, s_rr)), floe_siluf(zz));
  }
  if (!KEEP && col)
#pragma unroll
    for (int i = 0; i < H; i++) S[(int64_t)g2_row(half, i) * dv] = s[i];
}

/* ---- decode: the conv and the recurrence of one token in one launch (k_gdn_step1) ----
 * A block per value head hv in k_gdn_recur2's layout (dk DK = 128 or 64, NQ threads per column: 2,
 * or 4 with cuda_gdn_set_step_nq(4) / FLOE_CUDA_GDN_STEP_NQ=4, twice the warps). The block
 * first does k_gdn_conv's work for the channels it needs: q and k of its key head kh (2 * dk
 * channels: the conv, SiLU, the L2 norms, q times dk^-0.5) and its own dv channels of v, with
 * k_gdn_conv's operations in its order; then k_gdn_recur2's token with beta / decay from shared
 * memory. The q / k conv of a key head is thus done by each of its r = Nv / Nk value heads (the
 * same bits); its window rows are written by one of them (rank 0), each block writes its own v
 * rows. In place, the writer must not overwrite a window another block has still to read: the r
 * blocks of a key head form a thread block cluster (sm_90), every thread arrives at the cluster
 * barrier once its window reads are done and rank 0 waits on it just before writing (at the end,
 * so the wait is normally free). Blocks are numbered so that a cluster is one key head:
 * blockIdx.x = kh * r + rank, hv = v_tiled ? kh + rank * Nk : kh * r + rank. keep != NULL (one
 * kept row): the windows and S after the token go to keep[0] instead, the state read is left as it
 * was. raw is written as k_gdn_conv writes it (q / k by rank 0). */
static __device__ __forceinline__ void gdn_cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ void gdn_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

#define G1_CLUSTER_MAX 8 /* the portable cluster size: r above it takes the two launches */
#define G1_SLOTS 2       /* conv channels a thread loads at once (dv 128: 384 channels, 256 threads, one pass) */

template <int DK, int NQ, bool QX>
static __global__ void __launch_bounds__(128 * NQ)
    k_gdn_step1(const float *mix, const float *wt, float *conv_g, float *const *conv_p, float *const *conv_keep,
                float *raw, const float *z, const float *b, const float *a, const float *dt_bias, const float *ssm_a,
                const float *norm_w, float *Sg, float *const *Sp, float *const *S_keep, float *o, int Nk, int Nv,
                int dv, int K, int v_tiled, float eps, float qscale, int prew, int pres, ActOut qo, int cl) {
  constexpr int dk = DK, H = DK / NQ, CPW = 32 / NQ; /* rows a thread holds, columns a warp */
  /* QX: the output row quantized for ssm_out here (qo); an A256 chunk is 256 / dv value heads, all
   * in this cluster of cl blocks (gdn_act_cluster), which trade their heads' maxima (xch) */
  const bool xch = QX && qo.kind == KACT_A256;
  const int r = Nv / Nk, kh = blockIdx.x / r, rank = blockIdx.x % r;
  const int hv = v_tiled ? kh + rank * Nk : kh * r + rank;
  const int lane = threadIdx.x & 31, qi = lane / CPW, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  const int jj = warp * CPW + lane % CPW;
  const bool col = jj < dv;
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  const int64_t so = (int64_t)hv * dk * dv + (col ? jj : 0);
  const int nch = 2 * dk + dv; /* conv channels: q | k of kh, v of hv */
  /* recur2's beta and decay by the last thread that has a conv channel (its loads now, its math
   * in its first conv round, while the conv's loads are in flight; with four threads a column
   * the block can have more threads than channels) */
  const bool bd = threadIdx.x == ((int)blockDim.x < nch ? (int)blockDim.x : nch) - 1;
  /* Loads that do not depend on the kernel before this one go before the wait (pdl.cuh): the
   * model's constants when prew (cuda_rt_prew), and when pres (the caller's promise that the kernel
   * launched right before this one writes neither the states nor their pointers) S's column and
   * the conv windows of the first round; otherwise after it, in the same order (the same bits).
   * S's column first either way: its loads are in flight while the conv runs. */
  float s[H], p[H];
  float win[G1_SLOTS][GDN_KMAX - 1], w[G1_SLOTS][GDN_KMAX - 1], wl[G1_SLOTS];
  float A_in = 0.0f, dtb_in = 0.0f, wn = 0.0f;
  float *conv_d = nullptr, *Sd = nullptr;
  /* the conv channel of slot sl in round u0 (q | k of kh, then v of hv) */
  auto chan = [&](int u) -> int64_t {
    return u < dk ? (int64_t)kh * dk + u : u < 2 * dk ? kd + (int64_t)kh * dk + (u - dk) : 2 * kd + (int64_t)hv * dv + (u - 2 * dk);
  };
  auto load_state = [&]() {
    if (conv_p) conv_g = *conv_p;
    if (Sp) Sg = *Sp;
    conv_d = conv_keep ? conv_keep[0] : conv_g; /* where the windows after the token go */
    Sd = S_keep ? S_keep[0] : Sg;
#pragma unroll
    for (int i = 0; i < H; i++) s[i] = col ? Sg[so + (int64_t)gq_row<NQ>(qi, i) * dv] : 0.0f;
#pragma unroll
    for (int sl = 0; sl < G1_SLOTS; sl++) { /* the first round's windows */
      const int u = threadIdx.x + sl * blockDim.x;
      const bool ok = u < nch;
      const int64_t ch = chan(ok ? u : 0);
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 1; q++) win[sl][q] = ok && q < K - 1 ? conv_g[(int64_t)q * C + ch] : 0.0f;
    }
  };
  auto load_consts = [&]() {
    A_in = bd ? ssm_a[hv] : 0.0f;
    dtb_in = bd ? dt_bias[hv] : 0.0f;
#pragma unroll
    for (int sl = 0; sl < G1_SLOTS; sl++) { /* the first round's conv weights */
      const int u = threadIdx.x + sl * blockDim.x;
      const bool ok = u < nch;
      const int64_t ch = chan(ok ? u : 0);
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 1; q++) w[sl][q] = ok && q < K - 1 ? wt[(int64_t)q * C + ch] : 0.0f;
      wl[sl] = ok ? wt[(int64_t)(K - 1) * C + ch] : 0.0f;
    }
    wn = col ? norm_w[jj] : 0.0f;
  };
  if (pres) load_state();
  if (prew & 1) load_consts();
  PDL_ENTER();
  if (!pres) load_state();
  __shared__ float qk[2 * dk];
  __shared__ float vs[128];
  __shared__ float os[128];
  __shared__ float wq[(GDN_KMAX - 1) * 2 * dk]; /* rank 0: the q / k windows after the token */
  __shared__ float s_rr, s_beta, s_decay, s_rn[2];
  const float b_in = bd ? b[hv] : 0.0f, a_in = bd ? a[hv] : 0.0f;
  if (!(prew & 1)) load_consts();
  /* the conv of channels u < 2 dk (q | k of kh) and 2 dk + j (v of hv), as k_gdn_conv; G1_SLOTS
   * channels a thread at a time, all their loads issued before any use (one latency, not two) */
  for (int u0 = threadIdx.x; u0 < nch; u0 += G1_SLOTS * blockDim.x) {
    float m[G1_SLOTS];
    int64_t chs[G1_SLOTS];
#pragma unroll
    for (int sl = 0; sl < G1_SLOTS; sl++) {
      const int u = u0 + sl * blockDim.x;
      const bool ok = u < nch;
      const int64_t ch = chan(ok ? u : 0);
      chs[sl] = ch;
      if (u0 != threadIdx.x) { /* a later round (dk + dv channels past G1_SLOTS a thread) */
#pragma unroll
        for (int q = 0; q < GDN_KMAX - 1; q++) {
          win[sl][q] = ok && q < K - 1 ? conv_g[(int64_t)q * C + ch] : 0.0f;
          w[sl][q] = ok && q < K - 1 ? wt[(int64_t)q * C + ch] : 0.0f;
        }
        wl[sl] = ok ? wt[(int64_t)(K - 1) * C + ch] : 0.0f;
      }
      m[sl] = ok ? mix[ch] : 0.0f;
    }
    if (bd && u0 == threadIdx.x) {
      s_beta = floe_sigmoidf(b_in);
      s_decay = gdn_expf(__fmul_rn(A_in, gdn_softplus(__fadd_rn(a_in, dtb_in))));
    }
#pragma unroll
    for (int sl = 0; sl < G1_SLOTS; sl++) {
      const int u = u0 + sl * blockDim.x;
      if (u >= nch) break;
      const int64_t ch = chs[sl];
      float c = 0.0f;
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 1; q++)
        if (q < K - 1) c = __fadd_rn(c, __fmul_rn(w[sl][q], win[sl][q]));
      c = floe_siluf(__fadd_rn(c, __fmul_rn(wl[sl], m[sl])));
      if (u < 2 * dk) {
        qk[u] = c;
        if (rank == 0)
#pragma unroll
          for (int q = 0; q < GDN_KMAX - 1; q++)
            if (q < K - 1) wq[q * 2 * dk + u] = q < K - 2 ? win[sl][q + 1] : m[sl];
      } else {
        vs[u - 2 * dk] = c;
        raw[ch] = c;
#pragma unroll
        for (int q = 0; q < GDN_KMAX - 1; q++)
          if (q < K - 1) conv_d[(int64_t)q * C + ch] = q < K - 2 ? win[sl][q + 1] : m[sl];
      }
    }
  }
  __syncthreads();
  if (cl > 1 && !xch) gdn_cluster_arrive(); /* this block's window reads are done (block-uniform) */
  for (int h = warp; h < 2; h += nwarp) { /* the L2 norms of q (h 0) and k (h 1) */
    const float ss = ops_sumsq16_warp(qk + h * dk, dk);
    if (lane == 0) s_rn[h] = 1.0f / sqrtf(__fadd_rn(ss, 1e-6f));
  }
  __syncthreads();
  for (int u = threadIdx.x; u < 2 * dk; u += blockDim.x) {
    const float c = qk[u];
    const float y = u < dk ? __fmul_rn(__fmul_rn(c, s_rn[0]), qscale) : __fmul_rn(c, s_rn[1]);
    qk[u] = y;
    if (rank == 0) raw[u < dk ? (int64_t)kh * dk + u : kd + (int64_t)kh * dk + (u - dk)] = y;
  }
  const float vv = col ? vs[jj] : 0.0f;
  const float zz = col ? z[(int64_t)hv * dv + jj] : 0.0f;
  __syncthreads();
  const float beta = s_beta, decay = s_decay;
  /* k_gdn_recur2's token */
#pragma unroll
  for (int i = 0; i < H; i++) {
    s[i] = __fmul_rn(s[i], decay);
    p[i] = __fmul_rn(s[i], qk[dk + gq_row<NQ>(qi, i)]);
  }
  const float kv = gq_chain<NQ, H>(p, qi);
  const float delta_u = __fmul_rn(__fsub_rn(vv, kv), beta);
  const float delta = delta_u; /* kv is valid in every thread of the column */
#pragma unroll
  for (int i = 0; i < H; i++) {
    s[i] = __fadd_rn(s[i], __fmul_rn(qk[dk + gq_row<NQ>(qi, i)], delta));
    p[i] = __fmul_rn(s[i], qk[gq_row<NQ>(qi, i)]);
  }
  const float oo = gq_chain<NQ, H>(p, qi);
  if (qi == NQ - 1 && col) os[jj] = oo;
  if (col)
#pragma unroll
    for (int i = 0; i < H; i++) Sd[so + (int64_t)gq_row<NQ>(qi, i) * dv] = s[i];
  __syncthreads();
  if (threadIdx.x < 32) {
    const float ss = ops_sumsq16_warp(os, dv);
    if (threadIdx.x == 0) s_rr = 1.0f / sqrtf(__fadd_rn(ss / (float)dv, eps));
  }
  __syncthreads();
  __shared__ float fin[QX ? 128 : 1]; /* QX: the head's output row */
  __shared__ float s_amx[G1_CLUSTER_MAX]; /* xch: the chunk's heads' maxima, pushed by each of them */
  if (col && qi == NQ - 1) {
    const float y = __fmul_rn(__fmul_rn(wn, __fmul_rn(oo, s_rr)), floe_siluf(zz));
    o[(int64_t)hv * dv + jj] = y;
    if (QX) fin[jj] = y;
  }
  if (QX) __syncthreads();
  if (xch) { /* this head's maximum into the s_amx of each block of its chunk, then the late arrive */
    if (warp == 0) {
      const float m = act_amax128(fin, dv);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* clusters: the host launches QX only where they exist */
      if (lane == 0) {
        const int hpc = 256 / dv, c0 = blockIdx.x - blockIdx.x % cl;
        cg::cluster_group clg = cg::this_cluster();
        for (int j = 0; j < cl; j++) {
          const int bj = c0 + j, khj = bj / r, rj = bj % r, hvj = v_tiled ? khj + rj * Nk : khj * r + rj;
          if (hvj / hpc == hv / hpc) clg.map_shared_rank(s_amx, (unsigned)j)[hv % hpc] = m;
        }
      }
#else
      (void)m;
#endif
    }
    __syncwarp();
    gdn_cluster_arrive(); /* also: this block's window reads are done */
  }
  __syncwarp(); /* the .aligned barrier wants each warp converged */
  if (cl > 1) gdn_cluster_wait(); /* every block of this cluster has read its windows (and pushed its maximum) */
  if (QX && warp == 0) {
    uint8_t *row = qo.xq;
    if (xch) {
      const int hpc = 256 / dv;
      float m = 0.0f;
      for (int i = 0; i < hpc; i++) m = fmaxf(m, s_amx[i]);
      act_out_a256_part(qo, row, (int64_t)hv / hpc, (hv % hpc) * dv, fin, dv, m);
    } else
      act_out_range(qo, row, (int64_t)hv * dv, fin, dv);
  }
  if (rank == 0)
    for (int u = threadIdx.x; u < 2 * dk; u += blockDim.x) {
      const int64_t ch = u < dk ? (int64_t)kh * dk + u : kd + (int64_t)kh * dk + (u - dk);
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 1; q++)
        if (q < K - 1) conv_d[(int64_t)q * C + ch] = wq[q * 2 * dk + u];
    }
}

/* ---- speculative verify: the conv and the recurrence of a kept chunk in one launch (k_gdn_stepn) ----
 * A kept chunk of 2..GN_MAX rows (the MTP verify: 1 + k drafts) in k_gdn_step1's layout: blocks
 * of one value head hv (blockIdx.x / G = kh * r + rank, as there), each over CB of its columns
 * (SPLIT: G = ceil(dv / 32) blocks of 32 columns, eight threads a column, the G blocks one thread
 * block cluster; else one block of all dv columns, NQ threads a column). Nothing is written in
 * place, so no block waits on another's reads. Phase 1, k_gdn_conv's work for the block's
 * channels (q | k of kh, v of its columns) over all rows: a thread per channel keeps the window in
 * registers and walks the rows oldest first (k_gdn_conv's operations and order), writing row t's
 * window into conv_keep[t]; then the L2 norms of each row's q and k (a warp per row and head, the
 * sumsq16 order), q times dk^-0.5. Phase 2, k_gdn_recur2's token loop for every row with q / k /
 * v / beta / decay already in shared memory, so a row's chain is the recurrence alone (no global
 * load, no barrier); S after row t goes to S_keep[t]. Phase 3, each row's gated RMSNorm (a warp
 * per row) over the head's dv outputs, which a split block first gathers from its cluster's
 * shared memory. The same float operations in the same order as k_gdn_conv<true> +
 * k_gdn_recur2<true>, which it replaces (test_cuda_ops' kept chunks check it bit for bit against
 * single in-place rows; FLOE_CUDA_GDN_STEPN selects the form, 0 the two launches). q | k raw rows
 * and windows are written by the head's rank 0 (its first column block), v ones by each block.
 * KC: the conv width when it is 4 (every model's), else 0 (K at run time; the window then lives in
 * local memory). */
#define GN_MAX 16
#define GN_CB 32 /* columns of a split block */

template <int DK, int NQ, int KC, bool SPLIT, int NT>
static __global__ void __launch_bounds__(SPLIT ? GN_CB * 8 + (NT && DK == 128 ? 32 : 0) : 128 * NQ, 1)
    k_gdn_stepn(const float *__restrict__ mix, const float *__restrict__ wt, const float *conv_g,
                float *const *conv_p, float *const *conv_keep, float *__restrict__ raw, const float *__restrict__ z,
                const float *__restrict__ b, const float *__restrict__ a, const float *__restrict__ dt_bias,
                const float *__restrict__ ssm_a, const float *__restrict__ norm_w, const float *Sg,
                const float *const *Sp, float *const *S_keep, float *__restrict__ o, int Nk, int Nv, int dv, int K,
                int v_tiled, float eps, float qscale, int n) {
  PDL_ENTER();
  if (KC) K = KC; /* the conv width known at compile time: the window stays in registers */
  if (NT) n = NT; /* the row count known at compile time: the row loops hold those rows alone */
  constexpr int NM = NT ? NT : GN_MAX;
  if (conv_p) conv_g = *conv_p;
  if (Sp) Sg = *Sp;
  constexpr int dk = DK, H = DK / NQ, CPW = 32 / NQ;
  __shared__ float qk[NM][2 * dk];
  __shared__ float vs[NM][SPLIT ? GN_CB : 128];
  __shared__ float os[NM][SPLIT ? GN_CB : 128];
  __shared__ float s_beta[NM], s_decay[NM], s_rr[NM], s_rn[NM][2];
  const int G = SPLIT ? (dv + GN_CB - 1) / GN_CB : 1, cg_ = SPLIT ? (int)blockIdx.x % G : 0;
  const int hb = (int)blockIdx.x / G, r = Nv / Nk, kh = hb / r, rank = hb % r;
  const int hv = v_tiled ? kh + rank * Nk : kh * r + rank;
  const int c0 = cg_ * GN_CB, cb = SPLIT ? min(GN_CB, dv - c0) : dv; /* this block's columns [c0, c0 + cb) */
  const int tid = threadIdx.x, lane = tid & 31, qi = lane / CPW, warp = tid >> 5, nwarp = blockDim.x >> 5;
  const int jl = warp * CPW + lane % CPW, jj = c0 + jl; /* the column, local and in the head */
  const bool col = jl < cb;
  const bool head0 = rank == 0 && cg_ == 0; /* writes the q | k raw rows and windows */
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  /* S's column first: its loads are in flight while the conv runs */
  const int64_t so = (int64_t)hv * dk * dv + (col ? jj : 0);
  float s[H], p[H];
#pragma unroll
  for (int i = 0; i < H; i++) s[i] = col ? Sg[so + (int64_t)gq_row<NQ>(qi, i) * dv] : 0.0f;
  /* beta / decay inputs of row tid */
  const float b_in = tid < n ? b[(int64_t)tid * Nv + hv] : 0.0f, a_in = tid < n ? a[(int64_t)tid * Nv + hv] : 0.0f;
  const float A = ssm_a[hv], dtb = dt_bias[hv];
  const int nch = 2 * dk + cb; /* conv channels: q | k of kh, v of the block's columns */
  for (int u = tid; u < nch; u += blockDim.x) {
    const int64_t ch = u < dk ? (int64_t)kh * dk + u
                       : u < 2 * dk ? kd + (int64_t)kh * dk + (u - dk)
                                    : 2 * kd + (int64_t)hv * dv + c0 + (u - 2 * dk);
    float win[GDN_KMAX - 1], w[GDN_KMAX], m[NM];
#pragma unroll
    for (int q = 0; q < GDN_KMAX; q++) {
      w[q] = q < K ? wt[(int64_t)q * C + ch] : 0.0f;
      if (q < GDN_KMAX - 1) win[q] = q < K - 1 ? conv_g[(int64_t)q * C + ch] : 0.0f;
    }
#pragma unroll
    for (int t = 0; t < NM; t++) m[t] = t < n ? mix[(int64_t)t * C + ch] : 0.0f;
    float wl = w[0];
#pragma unroll
    for (int q = 1; q < GDN_KMAX; q++)
      if (q == K - 1) wl = w[q];
    const bool wr = u >= 2 * dk || head0; /* this block writes the channel's raw rows and windows */
#pragma unroll
    for (int t = 0; t < NM; t++) {
      if (t >= n) continue;
      float c = 0.0f;
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 1; q++)
        if (q < K - 1) c = __fadd_rn(c, __fmul_rn(w[q], win[q]));
      c = floe_siluf(__fadd_rn(c, __fmul_rn(wl, m[t])));
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 2; q++)
        if (q < K - 2) win[q] = win[q + 1];
#pragma unroll
      for (int q = 0; q < GDN_KMAX - 1; q++)
        if (q == K - 2) win[q] = m[t];
      if (u < 2 * dk) qk[t][u] = c;
      else {
        vs[t][u - 2 * dk] = c;
        raw[(int64_t)t * C + ch] = c;
      }
      if (wr) {
        float *kt = conv_keep[t];
#pragma unroll
        for (int q = 0; q < GDN_KMAX - 1; q++)
          if (q < K - 1) kt[(int64_t)q * C + ch] = win[q];
      }
    }
  }
  if (tid < n) {
    s_beta[tid] = floe_sigmoidf(b_in);
    s_decay[tid] = gdn_expf(__fmul_rn(A, gdn_softplus(__fadd_rn(a_in, dtb))));
  }
  __syncthreads();
  for (int h = warp; h < 2 * n; h += nwarp) { /* the L2 norms of row h / 2's q (h even) and k */
    const float ss = ops_sumsq16_warp(&qk[h >> 1][(h & 1) * dk], dk);
    if (lane == 0) s_rn[h >> 1][h & 1] = 1.0f / sqrtf(__fadd_rn(ss, 1e-6f));
  }
  __syncthreads();
  for (int e = tid; e < n * 2 * dk; e += blockDim.x) {
    const int t = e / (2 * dk), u = e % (2 * dk);
    const float c = qk[t][u];
    const float y = u < dk ? __fmul_rn(__fmul_rn(c, s_rn[t][0]), qscale) : __fmul_rn(c, s_rn[t][1]);
    qk[t][u] = y;
    if (head0) raw[(int64_t)t * C + (u < dk ? (int64_t)kh * dk + u : kd + (int64_t)kh * dk + (u - dk))] = y;
  }
  const float wn = col ? norm_w[jj] : 0.0f;
  float zz[NM]; /* silu(z)'s inputs of the column's rows, loaded ahead */
#pragma unroll
  for (int t = 0; t < NM; t++) zz[t] = col && qi == NQ - 1 && t < n ? z[(int64_t)t * vd + (int64_t)hv * dv + jj] : 0.0f;
  __syncthreads();
  /* k_gdn_recur2's token loop; each column's rows alone, no barrier (a 288-thread block's ninth
   * warp, there for the conv's channels 256..287, has no column) */
  if (!SPLIT || warp < GN_CB * 8 / 32)
  for (int t = 0; t < n; t++) {
    const float beta = s_beta[t], decay = s_decay[t], vv = col ? vs[t][jl] : 0.0f;
    const float *q = qk[t], *k = qk[t] + dk;
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fmul_rn(s[i], decay);
      p[i] = __fmul_rn(s[i], k[gq_row<NQ>(qi, i)]);
    }
    const float kv = gq_chain<NQ, H>(p, qi);
    const float delta = __fmul_rn(__fsub_rn(vv, kv), beta);
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(k[gq_row<NQ>(qi, i)], delta));
      p[i] = __fmul_rn(s[i], q[gq_row<NQ>(qi, i)]);
    }
    const float oo = gq_chain<NQ, H>(p, qi);
    if (qi == NQ - 1 && col) os[t][jl] = oo;
    if (col) {
      float *Kt = S_keep[t];
#pragma unroll
      for (int i = 0; i < H; i++) Kt[so + (int64_t)gq_row<NQ>(qi, i) * dv] = s[i];
    }
  }
  if (SPLIT && G > 1) {
    /* the head's dv outputs of every row from the cluster's blocks (block rank c holds columns
     * [32 c, 32 c + 32)), then the norm as below. Clusters are sm_90's: before it the host never
     * launches this form with G > 1 (gdn_stepn_mode) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float full[NM][128];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); /* every block's os written */
    for (int e = tid; e < n * dv; e += blockDim.x) {
      const int t = e / dv, j = e % dv;
      const float *ro = cl.map_shared_rank(&os[0][0], (unsigned)(j / GN_CB));
      full[t][j] = ro[t * GN_CB + j % GN_CB];
    }
    cl.sync(); /* every block has read the others' os (none exits while it is read) */
    for (int t = warp; t < n; t += nwarp) {
      const float ss = ops_sumsq16_warp(full[t], dv);
      if (lane == 0) s_rr[t] = 1.0f / sqrtf(__fadd_rn(ss / (float)dv, eps));
    }
#else
    __trap();
#endif
  } else {
    __syncthreads();
    for (int t = warp; t < n; t += nwarp) {
      const float ss = ops_sumsq16_warp(os[t], dv);
      if (lane == 0) s_rr[t] = 1.0f / sqrtf(__fadd_rn(ss / (float)dv, eps));
    }
  }
  __syncthreads();
  if (col && qi == NQ - 1)
#pragma unroll
    for (int t = 0; t < NM; t++) {
      if (t >= n) continue;
      o[(int64_t)t * vd + (int64_t)hv * dv + jj] =
          __fmul_rn(__fmul_rn(wn, __fmul_rn(os[t][jl], s_rr[t])), floe_siluf(zz[t]));
    }
}

/* ---- prefill: k_gdn_recur2's columns split over several blocks (k_gdn_recur_cols) ----
 * The columns of S are independent in the recurrence: only the gated RMSNorm of the output mixes
 * them. k_gdn_recur2 runs a block per value head (32 blocks for the 35B-A3B shape, 32 of the
 * H200's 132 SMs, 8 warps each walking one long chain per token with a third of their issue slots
 * spent on a barrier-bound tail); here a block of two warps takes G2_COLS columns of one head
 * (grid Nv x ceil(dv / G2_COLS)), writes each token's o before the norm, and k_gdn_gnorm applies
 * the norm afterwards. Every float operation of each column and of the norm is k_gdn_recur2's, in
 * its order. Each token's inputs are loaded ahead: q / k of token t+2 into registers at the start
 * of token t, stored into the shared buffer of token t+2 at the start of token t+1 (two buffers,
 * one barrier a token); v of token t+1 into a register; beta / decay of G2_BD tokens at a time
 * into shared memory (the double-precision exp / log1p, off the token loop). So a token's chain
 * is the recurrence itself and one two-warp barrier, where k_gdn_recur2's was a dependent global
 * load (~600-800 cycles, an L2 hit), three eight-warp barriers and a one-warp norm around the same
 * recurrence, with two warps a scheduler. Not for kept chunks (k_gdn_recur2<true>). */
#define G2_COLS 32
#define G2_BD 256

static __global__ void __launch_bounds__(64)
    k_gdn_recur_cols(const float *__restrict__ raw, const float *__restrict__ b, const float *__restrict__ a,
                     const float *__restrict__ dt_bias, const float *__restrict__ ssm_a, float *Sg, float *const *Sp,
                     float *__restrict__ o, int Nk, int Nv, int dv, int v_tiled, int n_tok) {
  PDL_ENTER();
  if (Sp) Sg = *Sp;
  constexpr int dk = 128, NT = 64, PF = 2 * dk / NT;
  __shared__ float qk[2][2 * dk];
  __shared__ float s_beta[G2_BD], s_decay[G2_BD];
  const int hv = blockIdx.x, lane = threadIdx.x & 31, half = lane >> 4, r = Nv / Nk;
  const int jj = blockIdx.y * G2_COLS + (threadIdx.x >> 5) * 16 + (lane & 15);
  const bool col = jj < dv;
  const int kh = v_tiled ? hv % Nk : hv / r;
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  const int64_t so = (int64_t)hv * dk * dv + (col ? jj : 0);
  float s[G2_HALF], p[G2_HALF];
#pragma unroll
  for (int i = 0; i < G2_HALF; i++) s[i] = col ? Sg[so + (int64_t)g2_row(half, i) * dv] : 0.0f;
  /* element u = threadIdx.x + e * NT of a token's q | k */
  const int64_t qo = (int64_t)kh * dk, ko = kd + (int64_t)kh * dk - dk;
  float pf[PF];
#pragma unroll
  for (int e = 0; e < PF; e++) {
    const int u = threadIdx.x + e * NT;
    qk[0][u] = raw[(u < dk ? qo : ko) + u];
  }
  if (n_tok > 1)
#pragma unroll
    for (int e = 0; e < PF; e++) {
      const int u = threadIdx.x + e * NT;
      pf[e] = raw[C + (u < dk ? qo : ko) + u];
    }
  const int64_t vo = 2 * kd + (int64_t)hv * dv + (col ? jj : 0);
  float vv = col ? raw[vo] : 0.0f;
  for (int t = 0; t < n_tok; t++) {
    if (t % G2_BD == 0) { /* beta / decay of the next G2_BD tokens, as k_gdn_recur2's prologue */
      __syncthreads();
      const float A = ssm_a[hv], dtb = dt_bias[hv];
      for (int u = threadIdx.x; u < G2_BD && t + u < n_tok; u += NT) {
        s_beta[u] = floe_sigmoidf(b[(int64_t)(t + u) * Nv + hv]);
        s_decay[u] = gdn_expf(__fmul_rn(A, gdn_softplus(__fadd_rn(a[(int64_t)(t + u) * Nv + hv], dtb))));
      }
      __syncthreads();
    }
    /* token t+1's q | k into the other buffer (last read by token t-1, before the barrier that
     * ended it); then token t+2's loads and token t+1's v, in flight while token t computes */
    if (t + 1 < n_tok)
#pragma unroll
      for (int e = 0; e < PF; e++) qk[(t + 1) & 1][threadIdx.x + e * NT] = pf[e];
    if (t + 2 < n_tok)
#pragma unroll
      for (int e = 0; e < PF; e++) {
        const int u = threadIdx.x + e * NT;
        pf[e] = raw[(int64_t)(t + 2) * C + (u < dk ? qo : ko) + u];
      }
    const float vn = col && t + 1 < n_tok ? raw[(int64_t)(t + 1) * C + vo] : 0.0f;
    const float *q = qk[t & 1];
    const float beta = s_beta[t % G2_BD], decay = s_decay[t % G2_BD];
#pragma unroll
    for (int i = 0; i < G2_HALF; i++) {
      s[i] = __fmul_rn(s[i], decay);
      p[i] = __fmul_rn(s[i], q[dk + g2_row(half, i)]);
    }
    const float kv = g2_chain(p, lane, half);
    const float delta_u = __fmul_rn(__fsub_rn(vv, kv), beta);
    const float delta = delta_u; /* kv is valid in both halves */
#pragma unroll
    for (int i = 0; i < G2_HALF; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(q[dk + g2_row(half, i)], delta));
      p[i] = __fmul_rn(s[i], q[g2_row(half, i)]);
    }
    const float oo = g2_chain(p, lane, half);
    if (col && half == 1) o[(int64_t)t * vd + (int64_t)hv * dv + jj] = oo;
    vv = vn;
    __syncthreads(); /* token t+1's q | k stored; everyone is done with buffer t&1 */
  }
  if (col)
#pragma unroll
    for (int i = 0; i < G2_HALF; i++) Sg[so + (int64_t)g2_row(half, i) * dv] = s[i];
}

/* k_gdn_recur_cols with consecutive tokens overlapped: token t's output sum S^T q needs S after
 * token t's update, and so does token t+1's S^T k (after its decay); neither depends on the other,
 * so one pass over the rows forms both products and runs the two sums' add chains side by side.
 * Per token the chain is then one sum (S^T k, then the delta) instead of two. The operations of
 * every output and of S are k_gdn_recur2's, in its order: s = s + k_t delta_t, oo_t += s q_t
 * (g2_chain's order); then s = s * decay_{t+1}, kv_{t+1} += s k_{t+1} (the same order). The
 * token loop reads q / k of tokens t and t+1, so three shared buffers: token t+2's is stored at the
 * start of token t (the buffer token t-1 read, before the barrier that ended it). Beta / decay as
 * in k_gdn_recur_cols, refilled one token ahead (token t+1's decay is read at token t).
 * NQ threads a column (gq_row): 2 (the default, two warps a block of G2_COLS columns) or 4
 * (cuda_gdn_set_cols(3): four warps, half the rows and registers a thread, twice the warps an SM). */
template <int NQ>
static __global__ void __launch_bounds__(G2_COLS * NQ)
    k_gdn_recur_cols2(const float *__restrict__ raw, const float *__restrict__ b, const float *__restrict__ a,
                      const float *__restrict__ dt_bias, const float *__restrict__ ssm_a, float *Sg, float *const *Sp,
                      float *__restrict__ o, int Nk, int Nv, int dv, int v_tiled, int n_tok) {
  PDL_ENTER();
  if (Sp) Sg = *Sp;
  constexpr int dk = 128, NT = G2_COLS * NQ, PF = 2 * dk / NT, HR = dk / NQ, CPW = 32 / NQ;
  __shared__ float qk[3][2 * dk];
  __shared__ float s_beta[G2_BD], s_decay[G2_BD];
  const int hv = blockIdx.x, lane = threadIdx.x & 31, qi = lane / CPW, r = Nv / Nk;
  const int jj = blockIdx.y * G2_COLS + (threadIdx.x >> 5) * CPW + lane % CPW;
  const bool col = jj < dv;
  const int kh = v_tiled ? hv % Nk : hv / r;
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  const int64_t so = (int64_t)hv * dk * dv + (col ? jj : 0);
  const float A = ssm_a[hv], dtb = dt_bias[hv];
  float s[HR], pk[HR];
#pragma unroll
  for (int i = 0; i < HR; i++) s[i] = col ? Sg[so + (int64_t)gq_row<NQ>(qi, i) * dv] : 0.0f;
  const int64_t qo = (int64_t)kh * dk, ko = kd + (int64_t)kh * dk - dk;
  float pf[PF];
  for (int t = 0; t < 2 && t < n_tok; t++) /* tokens 0 and 1 straight into their buffers */
#pragma unroll
    for (int e = 0; e < PF; e++) {
      const int u = threadIdx.x + e * NT;
      qk[t][u] = raw[(int64_t)t * C + (u < dk ? qo : ko) + u];
    }
  if (n_tok > 2)
#pragma unroll
    for (int e = 0; e < PF; e++) {
      const int u = threadIdx.x + e * NT;
      pf[e] = raw[2 * C + (u < dk ? qo : ko) + u];
    }
  const int64_t vo = 2 * kd + (int64_t)hv * dv + (col ? jj : 0);
  float vv = col ? raw[vo] : 0.0f;
  float vn = col && n_tok > 1 ? raw[C + vo] : 0.0f;
  for (int u = threadIdx.x; u < G2_BD && u < n_tok; u += NT) {
    s_beta[u] = floe_sigmoidf(b[(int64_t)u * Nv + hv]);
    s_decay[u] = gdn_expf(__fmul_rn(A, gdn_softplus(__fadd_rn(a[(int64_t)u * Nv + hv], dtb))));
  }
  __syncthreads();
  /* token 0's decay and S^T k */
  {
    const float decay = s_decay[0];
    const float *k0 = qk[0] + dk;
#pragma unroll
    for (int i = 0; i < HR; i++) {
      s[i] = __fmul_rn(s[i], decay);
      pk[i] = __fmul_rn(s[i], k0[gq_row<NQ>(qi, i)]);
    }
  }
  float kv = gq_chain<NQ, HR>(pk, qi);
  for (int t = 0; t < n_tok; t++) {
    const float beta = s_beta[t % G2_BD];
    if ((t + 1) % G2_BD == 0 && t + 1 < n_tok) { /* the next G2_BD tokens' beta / decay */
      __syncthreads();
      for (int u = threadIdx.x; u < G2_BD && t + 1 + u < n_tok; u += NT) {
        s_beta[u] = floe_sigmoidf(b[(int64_t)(t + 1 + u) * Nv + hv]);
        s_decay[u] = gdn_expf(__fmul_rn(A, gdn_softplus(__fadd_rn(a[(int64_t)(t + 1 + u) * Nv + hv], dtb))));
      }
      __syncthreads();
    }
    if (t + 2 < n_tok)
#pragma unroll
      for (int e = 0; e < PF; e++) qk[(t + 2) % 3][threadIdx.x + e * NT] = pf[e];
    if (t + 3 < n_tok)
#pragma unroll
      for (int e = 0; e < PF; e++) {
        const int u = threadIdx.x + e * NT;
        pf[e] = raw[(int64_t)(t + 3) * C + (u < dk ? qo : ko) + u];
      }
    const float *q = qk[t % 3], *k = q + dk;
    const float delta_u = __fmul_rn(__fsub_rn(vv, kv), beta);
    const float delta = delta_u; /* kv is valid in both halves */
    float oo;
    if (t + 1 < n_tok) /* block-uniform */
      gq_token<NQ, HR>(s, q, k, qk[(t + 1) % 3] + dk, delta, s_decay[(t + 1) % G2_BD], qi, oo, kv);
    else
      gq_token<NQ, HR>(s, q, k, nullptr, delta, 0.0f, qi, oo, kv);
    if (col && qi == NQ - 1) o[(int64_t)t * vd + (int64_t)hv * dv + jj] = oo;
    vv = vn;
    if (t + 2 < n_tok) vn = col ? raw[(int64_t)(t + 2) * C + vo] : 0.0f;
    __syncthreads(); /* token t+2's q | k stored; everyone is done with buffer t % 3 */
  }
  if (col)
#pragma unroll
    for (int i = 0; i < HR; i++) Sg[so + (int64_t)gq_row<NQ>(qi, i) * dv] = s[i];
}

/* k_gdn_recur_cols3<NQ>: k_gdn_recur_cols2's recurrence (the same operations on every output and
 * on S, in its order) with its inputs loaded G3_TC tokens at a time by cp.async, two chunks ahead.
 * k_gdn_recur_cols2 stores each token's q | k into shared memory from loads it issued one token
 * earlier, so every token waits out what is left of a DRAM latency (~0.5 us) behind a barrier:
 * the eight-accumulator order cut its add chain and the 4096-token prefill did not move. Here
 * chunk c + 2's q | k and v are copied while chunk c computes, and the block meets at a barrier
 * once a chunk. Shared: q | k of three chunks (token t reads token t+1's k, so chunks c and c+1
 * are resident while c+2 arrives), v of the block's columns for three chunks, beta / decay of two
 * G2_BD-token tables (the next filled a whole table ahead). NQ threads a column: 2, 4 or 8
 * (cuda_gdn_set_cols(4 / 5 / 6); 6 is the default); with 8 a thread holds one accumulator's 16 rows.
 * NC columns a block: G2_COLS (32), or 16 (cuda_gdn_set_cols(7), eight threads a column: 256
 * blocks for the 35B-A3B shape instead of 128, two an SM, each copying its head's q | k). */
#define G3_TC 8

/* chunk c's q | k (16-byte copies where raw's rows allow them) and v of columns j0 .. j0 + ncol - 1
 * into buffer c % 3, one cp.async group */
template <int NT, int NC>
static __device__ __forceinline__ void g3_load_chunk(float (*qk)[G3_TC][256], float (*vs)[G3_TC][NC],
                                                     const float *raw, int c, int n_tok, int64_t C, int64_t qo,
                                                     int64_t ko, int64_t vo, int ncol, bool vec) {
  constexpr int dk = 128;
  const int t0 = c * G3_TC, nt = min(G3_TC, n_tok - t0);
  float(*dq)[256] = qk[c % 3];
  float(*dv)[NC] = vs[c % 3];
  if (vec)
    for (int e = threadIdx.x; e < nt * (2 * dk / 4); e += NT) {
      const int tt = e / (2 * dk / 4), u = e % (2 * dk / 4) * 4;
      ops_cp16(&dq[tt][u], raw + (int64_t)(t0 + tt) * C + (u < dk ? qo + u : ko + (u - dk)));
    }
  else
    for (int e = threadIdx.x; e < nt * 2 * dk; e += NT) {
      const int tt = e / (2 * dk), u = e % (2 * dk);
      ops_cp4(&dq[tt][u], raw + (int64_t)(t0 + tt) * C + (u < dk ? qo + u : ko + (u - dk)));
    }
  for (int e = threadIdx.x; e < nt * NC; e += NT) {
    const int tt = e / NC, cc = e % NC;
    if (cc < ncol) ops_cp4(&dv[tt][cc], raw + (int64_t)(t0 + tt) * C + vo + cc);
  }
  ops_cp_commit();
}

template <int NQ, int NC>
static __global__ void __launch_bounds__(NC * NQ)
    k_gdn_recur_cols3(const float *__restrict__ raw, const float *__restrict__ b, const float *__restrict__ a,
                      const float *__restrict__ dt_bias, const float *__restrict__ ssm_a, float *Sg, float *const *Sp,
                      float *__restrict__ o, int Nk, int Nv, int dv, int v_tiled, int n_tok) {
  PDL_ENTER();
  if (Sp) Sg = *Sp;
  constexpr int dk = 128, NT = NC * NQ, HR = dk / NQ, CPW = 32 / NQ;
  static_assert(NC % CPW == 0, "whole warps of columns");
  __shared__ __align__(16) float qk[3][G3_TC][2 * dk];
  __shared__ float vs[3][G3_TC][NC];
  __shared__ float s_beta[2][G2_BD], s_decay[2][G2_BD];
  const int hv = blockIdx.x, lane = threadIdx.x & 31, qi = lane / CPW, r = Nv / Nk;
  const int j0 = blockIdx.y * NC, cl = (threadIdx.x >> 5) * CPW + lane % CPW, jj = j0 + cl;
  const bool col = jj < dv;
  const int ncol = min(NC, dv - j0);
  const int kh = v_tiled ? hv % Nk : hv / r;
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  const int64_t so = (int64_t)hv * dk * dv + (col ? jj : 0);
  const int64_t qo = (int64_t)kh * dk, ko = kd + (int64_t)kh * dk, vo = 2 * kd + (int64_t)hv * dv + j0;
  const bool vec = ((uintptr_t)raw & 15) == 0 && C % 4 == 0;
  const int nch = (n_tok + G3_TC - 1) / G3_TC;
  const float A = ssm_a[hv], dtb = dt_bias[hv];
  g3_load_chunk<NT, NC>(qk, vs, raw, 0, n_tok, C, qo, ko, vo, ncol, vec);
  if (nch > 1) g3_load_chunk<NT, NC>(qk, vs, raw, 1, n_tok, C, qo, ko, vo, ncol, vec);
  float s[HR], pk[HR];
#pragma unroll
  for (int i = 0; i < HR; i++) s[i] = col ? Sg[so + (int64_t)gq_row<NQ>(qi, i) * dv] : 0.0f;
  /* tokens t0 .. t0 + G2_BD - 1's beta / decay into table (t0 / G2_BD) & 1, as k_gdn_recur2's prologue */
  auto fill_bd = [&](int t0) {
    const int h = (t0 / G2_BD) & 1;
    for (int u = threadIdx.x; u < G2_BD && t0 + u < n_tok; u += NT) {
      s_beta[h][u] = floe_sigmoidf(b[(int64_t)(t0 + u) * Nv + hv]);
      s_decay[h][u] = gdn_expf(__fmul_rn(A, gdn_softplus(__fadd_rn(a[(int64_t)(t0 + u) * Nv + hv], dtb))));
    }
  };
  fill_bd(0);
  if (n_tok > G2_BD) fill_bd(G2_BD);
  ops_cp_wait<0>();
  __syncthreads();
  float kv;
  { /* token 0's decay and S^T k */
    const float decay = s_decay[0][0];
    const float *k0 = qk[0][0] + dk;
#pragma unroll
    for (int i = 0; i < HR; i++) {
      s[i] = __fmul_rn(s[i], decay);
      pk[i] = __fmul_rn(s[i], k0[gq_row<NQ>(qi, i)]);
    }
    kv = gq_chain<NQ, HR>(pk, qi);
  }
  for (int c = 0; c < nch; c++) {
    const int t0 = c * G3_TC;
    if (c > 0) {
      ops_cp_wait<0>(); /* chunk c + 1 (issued at chunk c - 1's start) has landed */
      __syncthreads();  /* ... for every thread, and chunk c - 1's buffers and table entries are done with */
    }
    if (c + 2 < nch) g3_load_chunk<NT, NC>(qk, vs, raw, c + 2, n_tok, C, qo, ko, vo, ncol, vec);
    /* the table of tokens t0 - G2_BD .. t0 - 1 (all read by now) takes t0 + G2_BD ..; its first
     * reader, token t0 + G2_BD - 1, is many barriers away */
    if (c > 0 && t0 % G2_BD == 0 && t0 + G2_BD < n_tok) fill_bd(t0 + G2_BD);
    const int te = min(t0 + G3_TC, n_tok);
    for (int t = t0; t < te; t++) {
      const float beta = s_beta[(t / G2_BD) & 1][t % G2_BD];
      const float *q = qk[c % 3][t - t0], *k = q + dk;
      const float vv = col ? vs[c % 3][t - t0][cl] : 0.0f;
      const float delta_u = __fmul_rn(__fsub_rn(vv, kv), beta);
      const float delta = delta_u; /* kv is valid in every thread of the column */
      float oo;
      if (t + 1 < n_tok) { /* block-uniform */
        const int tn = t + 1;
        gq_token<NQ, HR>(s, q, k, qk[(tn / G3_TC) % 3][tn % G3_TC] + dk, delta, s_decay[(tn / G2_BD) & 1][tn % G2_BD],
                         qi, oo, kv);
      } else
        gq_token<NQ, HR>(s, q, k, nullptr, delta, 0.0f, qi, oo, kv);
      if (col && qi == NQ - 1) o[(int64_t)t * vd + (int64_t)hv * dv + jj] = oo;
    }
  }
  if (col)
#pragma unroll
    for (int i = 0; i < HR; i++) Sg[so + (int64_t)gq_row<NQ>(qi, i) * dv] = s[i];
}

/* The gated RMSNorm of k_gdn_recur2's token tail, in place over o (the recurrence's outputs): a
 * warp per (token, value head), k_gdn_recur2's operations in its order. */
static __global__ void __launch_bounds__(128)
    k_gdn_gnorm(float *o, const float *__restrict__ z, const float *__restrict__ norm_w, int Nv, int dv, float eps) {
  PDL_ENTER();
  const int hv = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (hv >= Nv) return; /* warp-uniform */
  const int64_t off = (int64_t)blockIdx.y * Nv * dv + (int64_t)hv * dv;
  float *x = o + off;
  const float ss = ops_sumsq16_warp(x, dv);
  const float rr = 1.0f / sqrtf(__fadd_rn(ss / (float)dv, eps));
  for (int j = lane; j < dv; j += 32)
    x[j] = __fmul_rn(__fmul_rn(norm_w[j], __fmul_rn(x[j], rr)), floe_siluf(z[off + j]));
}

static int g_gdn_impl = -1; /* 1: k_gdn_recur2 where it applies; 0: k_gdn_recur; -1: from FLOE_CUDA_GDN2 (default 1) */

extern "C" void cuda_gdn_set_impl(int two) { g_gdn_impl = two ? 1 : 0; }

/* true where k_gdn_recur2 and the kernels of its layout apply (g_gdn_impl, from FLOE_CUDA_GDN2 at the first call) */
static bool gdn2_on(void) {
  if (g_gdn_impl < 0) {
    const char *e = getenv("FLOE_CUDA_GDN2");
    g_gdn_impl = !(e && e[0] == '0');
  }
  return g_gdn_impl == 1;
}

/* Prefill chunks (not kept) where k_gdn_recur2 applies: 7 = k_gdn_recur_cols3 (chunked cp.async
 * loads) with 8 threads a column and 16 columns a block + k_gdn_gnorm (the default: on the H200
 * the 35B-A3B shape's 4096-token prefill 7837-8063 -> 8225-8324 tok/s against 6, alternated in one
 * call), 6 = the same with 32 columns a block (one block an SM: issue-bound; it took the
 * recurrence from 1.19 to 0.47 us a token a layer against 2), 4 and 5 = 6 with 2 and 4 threads a
 * column, 2 = k_gdn_recur_cols2 (loads one token ahead), 3 = the same with four threads a column,
 * 1 = k_gdn_recur_cols, 0 = k_gdn_recur2; -1: from FLOE_CUDA_GDN_COLS (one digit 0..7, anything
 * else 7) */
static int g_gdn_cols = -1;

extern "C" void cuda_gdn_set_cols(int mode) { g_gdn_cols = mode < 0 || mode > 7 ? 7 : mode; }

static int gdn_cols_mode(void) {
  if (g_gdn_cols < 0) {
    const char *e = getenv("FLOE_CUDA_GDN_COLS");
    g_gdn_cols = e && e[0] >= '0' && e[0] <= '7' && !e[1] ? e[0] - '0' : 7;
  }
  return g_gdn_cols;
}

/* one-token steps through the column-split recurrence (cuda_gdn_set_dec_cols; -1: from the
 * environment at the first call) */
static int g_gdn_dec_cols = -1;

extern "C" void cuda_gdn_set_dec_cols(int on) { g_gdn_dec_cols = on ? 1 : 0; }

static bool gdn_dec_cols_on(void) {
  if (g_gdn_dec_cols < 0) {
    const char *e = getenv("FLOE_CUDA_GDN_DEC_COLS");
    g_gdn_dec_cols = e && e[0] == '1';
  }
  return g_gdn_dec_cols == 1;
}

static void gdn_recur_launch(const cuda_gdn_shape *sh, const float *raw, const float *z, const float *b,
                             const float *a, const float *dt_bias, const float *ssm_a, const float *norm_w, float *S,
                             float *const *Sp, float *const *keep, float *o, int64_t n_tok, void *stream) {
  if (n_tok <= 0) return;
  if (gdn2_on() && gdn_cols_mode() > 0 && !keep && (n_tok > 1 || gdn_dec_cols_on()) && n_tok <= 65535 &&
      sh->dk == 128 && sh->dv <= 128) {
    const dim3 grid(sh->Nv, (sh->dv + G2_COLS - 1) / G2_COLS);
    if (g_gdn_cols == 7)
      pdl_launch(k_gdn_recur_cols3<8, 16>, dim3(sh->Nv, (sh->dv + 15) / 16), dim3(16 * 8), (size_t)0,
                 OPS_STREAM(stream), raw, b, a, dt_bias, ssm_a, S, Sp, o, sh->Nk, sh->Nv, sh->dv, sh->v_tiled,
                 (int)n_tok);
    else if (g_gdn_cols >= 4) {
      const int nq = g_gdn_cols == 4 ? 2 : g_gdn_cols == 5 ? 4 : 8;
      pdl_launch(nq == 2   ? k_gdn_recur_cols3<2, G2_COLS>
                 : nq == 4 ? k_gdn_recur_cols3<4, G2_COLS>
                           : k_gdn_recur_cols3<8, G2_COLS>,
                 grid, dim3(G2_COLS * nq), (size_t)0, OPS_STREAM(stream), raw, b, a, dt_bias, ssm_a, S, Sp, o, sh->Nk,
                 sh->Nv, sh->dv, sh->v_tiled, (int)n_tok);
    } else if (g_gdn_cols == 3)
      pdl_launch(k_gdn_recur_cols2<4>, grid, dim3(G2_COLS * 4), (size_t)0, OPS_STREAM(stream), raw, b, a, dt_bias, ssm_a,
                 S, Sp, o, sh->Nk, sh->Nv, sh->dv, sh->v_tiled, (int)n_tok);
    else
      pdl_launch(g_gdn_cols == 2 ? k_gdn_recur_cols2<2> : k_gdn_recur_cols, grid, dim3(G2_COLS * 2), (size_t)0,
                 OPS_STREAM(stream), raw, b, a, dt_bias, ssm_a, S, Sp, o, sh->Nk, sh->Nv, sh->dv, sh->v_tiled,
                 (int)n_tok);
    pdl_launch(k_gdn_gnorm, dim3((sh->Nv + 3) / 4, (unsigned)n_tok), dim3(128), (size_t)0, OPS_STREAM(stream), o, z,
               norm_w, sh->Nv, sh->dv, sh->eps);
    return;
  }
  if (gdn2_on() && (sh->dk == 128 || sh->dk == 64) && sh->dv <= 128) {
    const dim3 grid(sh->Nv), block((sh->dv + 15) / 16 * 32);
#define GDN2_CASE(D, KP)                                                                                        \
  pdl_launch(k_gdn_recur2<D, KP>, grid, block, (size_t)0, OPS_STREAM(stream), raw, z, b, a, dt_bias, ssm_a, norm_w, \
             S, Sp, keep, o, sh->Nk, sh->Nv, sh->dv, sh->v_tiled, sh->eps, (int)n_tok)
    if (sh->dk == 128) {
      if (keep) GDN2_CASE(128, true);
      else GDN2_CASE(128, false);
    } else {
      if (keep) GDN2_CASE(64, true);
      else GDN2_CASE(64, false);
    }
#undef GDN2_CASE
    return;
  }
  const int nt = (sh->dv + 31) / 32 * 32, DK = sh->dk <= 16 ? 16 : sh->dk <= 32 ? 32 : sh->dk <= 64 ? 64 : 128;
  const int sr = DK <= 32 ? DK : (DK == 64 ? 32 : GDN_SR128);
  const size_t shm = sh->dk > sr ? (size_t)(sh->dk - sr) * sh->dv * sizeof(float) : 0;
#define GDN_CASE(D, KP)                                                                                          \
  pdl_launch(k_gdn_recur<D, KP>, dim3(sh->Nv), dim3(nt), (size_t)(shm), OPS_STREAM(stream), raw, z, b, a, dt_bias, \
             ssm_a, norm_w, S, Sp, keep, o, sh->Nk, sh->Nv, sh->dk, sh->dv, sh->v_tiled, sh->eps, (int)n_tok)
#define GDN_CASES(KP)                   \
  switch (DK) {                         \
  case 16: GDN_CASE(16, KP); break;     \
  case 32: GDN_CASE(32, KP); break;     \
  case 64: GDN_CASE(64, KP); break;     \
  default: GDN_CASE(128, KP); break;    \
  }
  if (keep) {
    GDN_CASES(true)
  } else {
    GDN_CASES(false)
  }
#undef GDN_CASES
#undef GDN_CASE
}

extern "C" void cuda_gdn_recur(const cuda_gdn_shape *sh, const float *raw, const float *z, const float *b,
                               const float *a, const float *dt_bias, const float *ssm_a, const float *norm_w,
                               float *S, float *o, int64_t n_tok, void *stream) {
  gdn_recur_launch(sh, raw, z, b, a, dt_bias, ssm_a, norm_w, S, NULL, NULL, o, n_tok, stream);
}

extern "C" void cuda_gdn_recur_p(const cuda_gdn_shape *sh, const float *raw, const float *z, const float *b,
                                 const float *a, const float *dt_bias, const float *ssm_a, const float *norm_w,
                                 float *const *S, float *const *keep, float *o, int64_t n_tok, void *stream) {
  gdn_recur_launch(sh, raw, z, b, a, dt_bias, ssm_a, norm_w, NULL, S, keep, o, n_tok, stream);
}

/* 1: one-token steps through k_gdn_step1 where it applies (the default); 0: k_gdn_conv then the
 * recurrence; -1: from FLOE_CUDA_GDN_FUSED (=0 selects the two launches) */
static int g_gdn_fused = -1;

extern "C" void cuda_gdn_set_fused(int on) { g_gdn_fused = on ? 1 : 0; }

/* threads a column of k_gdn_step1: 2 (the default) or 4; -1: from FLOE_CUDA_GDN_STEP_NQ (=4 selects 4) */
static int g_gdn_step_nq = -1;

extern "C" void cuda_gdn_set_step_nq(int nq) { g_gdn_step_nq = nq == 4 ? 4 : 2; }

static int gdn_step_nq(void) {
  if (g_gdn_step_nq < 0) {
    const char *e = getenv("FLOE_CUDA_GDN_STEP_NQ");
    g_gdn_step_nq = e && e[0] == '4' && !e[1] ? 4 : 2;
  }
  return g_gdn_step_nq;
}

static bool gdn_fused_fits(const cuda_gdn_shape *sh, int64_t n_tok, bool keep) {
  if (g_gdn_fused < 0) {
    const char *e = getenv("FLOE_CUDA_GDN_FUSED");
    g_gdn_fused = !(e && e[0] == '0');
  }
  const int r = sh->Nv / sh->Nk;
  if (n_tok != 1 || g_gdn_fused != 1 || !gdn2_on() || (sh->dk != 128 && sh->dk != 64) || sh->dv > 128 ||
      r > G1_CLUSTER_MAX)
    return false;
  if (!keep && gdn_dec_cols_on() && gdn_cols_mode() > 0) return false; /* the column-split recurrence instead */
  if (r > 1) gdn_cluster_query();
  return r == 1 || g_cluster_ok == 1;
}

/* kept chunks of 2..GN_MAX rows: 2 through k_gdn_stepn with each head's columns over a cluster of
 * 32-column blocks (the default), 1 with one block a head, 0 as k_gdn_conv then the recurrence;
 * -1: from FLOE_CUDA_GDN_STEPN (0 / 1 / 2) */
static int g_gdn_stepn = -1;

extern "C" void cuda_gdn_set_stepn(int mode) { g_gdn_stepn = mode < 0 || mode > 2 ? 2 : mode; }

static int gdn_stepn_mode(const cuda_gdn_shape *sh, int64_t n_tok, bool keep) {
  if (g_gdn_stepn < 0) {
    const char *e = getenv("FLOE_CUDA_GDN_STEPN");
    g_gdn_stepn = e && e[0] >= '0' && e[0] <= '2' && !e[1] ? e[0] - '0' : 2;
  }
  if (!keep || n_tok < 2 || n_tok > GN_MAX || !gdn2_on() || (sh->dk != 128 && sh->dk != 64) || sh->dv > 128)
    return 0;
  if (g_gdn_stepn == 2 && sh->dv > GN_CB) { /* a cluster of the head's column blocks */
    gdn_cluster_query();
    if (g_cluster_ok != 1) return 1;
  }
  return g_gdn_stepn;
}

/* k_gdn_stepn's split form with the row count a template argument for 2..GN_NT_MAX rows (the
 * default; FLOE_CUDA_GDN_STEPN_NT=0 or cuda_gdn_set_stepn_nt(0): the one kernel for every count).
 * ncu of the 35B's 4-row verify (session 26) had the general form's row loops, unrolled to GN_MAX
 * with the rows past n branched over, stall on instruction fetch (19 % of its warp samples: no
 * instruction, branch resolving, icache misses), and its dk-128 conv's 288 channels on 256 threads
 * take one warp through a second round while seven wait at the barrier (16 %): with the count
 * fixed, those blocks get a ninth warp. The same operations in the same order. */
#define GN_NT_MAX 5
static int g_gdn_stepn_nt = -1;

extern "C" void cuda_gdn_set_stepn_nt(int on) { g_gdn_stepn_nt = on ? 1 : 0; }

static bool gdn_stepn_nt_on(void) {
  if (g_gdn_stepn_nt < 0) g_gdn_stepn_nt = mm_env_int("FLOE_CUDA_GDN_STEPN_NT", 1) != 0;
  return g_gdn_stepn_nt != 0;
}

/* threads of a block over all dv columns of a value head, nq threads a column (whole warps) */
static int gdn_head_threads(int dv, int nq) { return (dv + 32 / nq - 1) / (32 / nq) * 32; }

/* A launch of grid x block threads on stream with programmatic dependent launch (where on) and,
 * when cluster > 1, clusters of that many consecutive blocks; at: the attributes' storage. */
static cudaLaunchConfig_t gdn_cfg(unsigned grid, int block, int cluster, void *stream, cudaLaunchAttribute at[2]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3((unsigned)block);
  cfg.stream = OPS_STREAM(stream);
  int na = 0;
  if (cluster > 1) {
    at[na].id = cudaLaunchAttributeClusterDimension;
    at[na].val.clusterDim.x = (unsigned)cluster;
    at[na].val.clusterDim.y = 1;
    at[na].val.clusterDim.z = 1;
    na++;
  }
  if (cuda_rt_pdl()) {
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na].val.programmaticStreamSerializationAllowed = 1;
    na++;
  }
  cfg.attrs = at;
  cfg.numAttrs = (unsigned)na;
  return cfg;
}

/* k_gdn_step1's output quantized in its launch: 1 = where it fits, 0 = never (the default);
 * -1: from FLOE_CUDA_GDN_ACT (=1 selects 1). Measured slower on the H200 (session 24): the 35B-A3B
 * decode 477-483 tok/s with it against 488-499 without (three paired rounds), then 479-486 against
 * 497-499 (three more); the default model's --mtp 0 about the same either way. Its clusters of 4
 * blocks (a chunk's two value heads are two key heads' there) and the arrive moved behind the
 * outputs cost more than the k_act launch they save (~2.1 us a layer in the graph). */
static int g_gdn_act = -1;

extern "C" void cuda_gdn_set_act(int on) { g_gdn_act = on ? 1 : 0; }

static int gcd_int(int a, int b) { return b ? gcd_int(b, a % b) : a; }

/* The cluster size of a k_gdn_step1 launch that quantizes its output for layout q (A32: the r
 * value heads of a key head, as without; A256: P key heads' blocks, so that each 256-value chunk's
 * 256 / dv value heads are in one cluster: P = 256 / dv for tiled heads, the smallest P with
 * P * r a multiple of 256 / dv otherwise); 0 when the shape does not fit. */
static int gdn_act_cluster(const cuda_gdn_shape *sh, const ActOut &q) {
  const int r = sh->Nv / sh->Nk, dv = sh->dv;
  if (q.cols != (int64_t)sh->Nv * dv) return 0;
  if (q.kind == KACT_A32) return dv % 32 == 0 ? r : 0;
  if (q.kind != KACT_A256 || dv % 16 || 256 % dv) return 0;
  const int hpc = 256 / dv, P = sh->v_tiled ? hpc : hpc / gcd_int(hpc, r);
  if (sh->Nk % P || P * r > G1_CLUSTER_MAX) return 0;
  return P * r;
}

static int gdn_step_launch(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *conv_state,
                           float *const *conv_p, float *const *conv_keep, float *raw, const float *z,
                           const float *b, const float *a, const float *dt_bias, const float *ssm_a,
                           const float *norm_w, float *S, float *const *Sp, float *const *S_keep, float *o,
                           int64_t n_tok, const cuda_act_out *qa, void *stream) {
  if (n_tok <= 0) return 0;
  const int sn = conv_keep ? gdn_stepn_mode(sh, n_tok, S_keep != NULL) : 0;
  if (sn) {
    const int nq = sn == 2 ? 8 : gdn_step_nq(), G = sn == 2 ? (sh->dv + GN_CB - 1) / GN_CB : 1;
    const bool k4 = sh->conv_k == 4;
    /* the row count as a template argument (a verify of 1 + k drafts, k <= 4) */
    const int nt = sn == 2 && k4 && gdn_stepn_nt_on() && n_tok <= GN_NT_MAX && sh->dv % GN_CB == 0 ? (int)n_tok : 0;
    cudaLaunchAttribute at[2];
    /* the column blocks of a head in one cluster (the norm's gather); with the row count fixed, a
     * dk-128 block has a ninth warp for the conv's 288 channels */
    cudaLaunchConfig_t cfg = gdn_cfg((unsigned)(sh->Nv * G),
                                     sn == 2 ? GN_CB * 8 + (nt && sh->dk == 128 ? 32 : 0) : gdn_head_threads(sh->dv, nq),
                                     G, stream, at);
    void (*kern)(const float *, const float *, const float *, float *const *, float *const *, float *, const float *,
                 const float *, const float *, const float *, const float *, const float *, const float *,
                 const float *const *, float *const *, float *, int, int, int, int, int, float, float, int);
#define GN_NTK(D, N) (N == 2 ? k_gdn_stepn<D, 8, 4, true, 2> : N == 3 ? k_gdn_stepn<D, 8, 4, true, 3> \
                      : N == 4 ? k_gdn_stepn<D, 8, 4, true, 4> : k_gdn_stepn<D, 8, 4, true, 5>)
    if (nt) {
      kern = sh->dk == 128 ? GN_NTK(128, nt) : GN_NTK(64, nt);
    } else if (sn == 2) {
      if (sh->dk == 128) kern = k4 ? k_gdn_stepn<128, 8, 4, true, 0> : k_gdn_stepn<128, 8, 0, true, 0>;
      else kern = k4 ? k_gdn_stepn<64, 8, 4, true, 0> : k_gdn_stepn<64, 8, 0, true, 0>;
    } else if (sh->dk == 128) {
      if (nq == 4) kern = k4 ? k_gdn_stepn<128, 4, 4, false, 0> : k_gdn_stepn<128, 4, 0, false, 0>;
      else kern = k4 ? k_gdn_stepn<128, 2, 4, false, 0> : k_gdn_stepn<128, 2, 0, false, 0>;
    } else {
      if (nq == 4) kern = k4 ? k_gdn_stepn<64, 4, 4, false, 0> : k_gdn_stepn<64, 4, 0, false, 0>;
      else kern = k4 ? k_gdn_stepn<64, 2, 4, false, 0> : k_gdn_stepn<64, 2, 0, false, 0>;
    }
#undef GN_NTK
    cudaLaunchKernelEx(&cfg, kern, mix, conv_wt, (const float *)conv_state, conv_p, conv_keep, raw, z, b, a, dt_bias,
                       ssm_a, norm_w, (const float *)S, (const float *const *)Sp, S_keep, o, sh->Nk, sh->Nv, sh->dv,
                       sh->conv_k, sh->v_tiled, sh->eps, (float)(1.0 / sqrt((double)sh->dk)), (int)n_tok);
    return 0;
  }
  if (!gdn_fused_fits(sh, n_tok, S_keep != NULL)) {
    gdn_conv_launch(sh, mix, conv_wt, conv_state, conv_p, conv_keep, raw, n_tok, stream);
    gdn_recur_launch(sh, raw, z, b, a, dt_bias, ssm_a, norm_w, S, Sp, S_keep, o, n_tok, stream);
    return 0;
  }
  if (g_gdn_act < 0) g_gdn_act = mm_env_int("FLOE_CUDA_GDN_ACT", 0) == 1;
  const int r = sh->Nv / sh->Nk, nq = gdn_step_nq();
  const ActOut q = mm_act_out(qa && g_gdn_act && !S_keep ? qa->W : NULL, qa ? qa->xq : NULL, qa ? qa->xs : 0);
  int cl = q.kind >= 0 ? gdn_act_cluster(sh, q) : 0;
  if (cl > 1) gdn_cluster_query();
  if (cl > 1 && g_cluster_ok != 1) cl = 0;
  const bool qx = cl > 0;
  if (!qx) cl = r; /* the value heads of a key head in one cluster (k_gdn_step1) */
  cudaLaunchAttribute at[2];
  const cudaLaunchConfig_t cfg = gdn_cfg((unsigned)sh->Nv, gdn_head_threads(sh->dv, nq), cl, stream, at);
  void (*kern)(const float *, const float *, float *, float *const *, float *const *, float *, const float *,
               const float *, const float *, const float *, const float *, const float *, float *, float *const *,
               float *const *, float *, int, int, int, int, int, float, float, int, int, ActOut, int);
  if (sh->dk == 128)
    kern = nq == 4 ? (qx ? k_gdn_step1<128, 4, true> : k_gdn_step1<128, 4, false>)
                   : (qx ? k_gdn_step1<128, 2, true> : k_gdn_step1<128, 2, false>);
  else
    kern = nq == 4 ? (qx ? k_gdn_step1<64, 4, true> : k_gdn_step1<64, 4, false>)
                   : (qx ? k_gdn_step1<64, 2, true> : k_gdn_step1<64, 2, false>);
  cudaLaunchKernelEx(&cfg, kern, mix, conv_wt, conv_state, conv_p, conv_keep, raw, z, b, a, dt_bias, ssm_a, norm_w, S,
                     Sp, S_keep, o, sh->Nk, sh->Nv, sh->dv, sh->conv_k, sh->v_tiled, sh->eps,
                     (float)(1.0 / sqrt((double)sh->dk)), cuda_rt_prew(), (cuda_rt_prew() & 1) && sh->pre_state, q,
                     cl);
  return qx ? 1 : 0;
}

extern "C" void cuda_gdn_step(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *conv_state,
                              float *raw, const float *z, const float *b, const float *a, const float *dt_bias,
                              const float *ssm_a, const float *norm_w, float *S, float *o, int64_t n_tok,
                              void *stream) {
  (void)gdn_step_launch(sh, mix, conv_wt, conv_state, NULL, NULL, raw, z, b, a, dt_bias, ssm_a, norm_w, S, NULL, NULL,
                        o, n_tok, NULL, stream);
}

extern "C" void cuda_gdn_step_p(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt,
                                float *const *conv_state, float *const *conv_keep, float *raw, const float *z,
                                const float *b, const float *a, const float *dt_bias, const float *ssm_a,
                                const float *norm_w, float *const *S, float *const *S_keep, float *o, int64_t n_tok,
                                void *stream) {
  (void)gdn_step_launch(sh, mix, conv_wt, NULL, conv_state, conv_keep, raw, z, b, a, dt_bias, ssm_a, norm_w, NULL, S,
                        S_keep, o, n_tok, NULL, stream);
}

extern "C" int cuda_gdn_step_q(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt,
                               float *const *conv_state, float *const *conv_keep, float *raw, const float *z,
                               const float *b, const float *a, const float *dt_bias, const float *ssm_a,
                               const float *norm_w, float *const *S, float *const *S_keep, float *o, int64_t n_tok,
                               const cuda_act_out *qo, void *stream) {
  return gdn_step_launch(sh, mix, conv_wt, NULL, conv_state, conv_keep, raw, z, b, a, dt_bias, ssm_a, norm_w, NULL, S,
                         S_keep, o, n_tok, qo, stream);
}
