/* GatedDeltaNet step on the GPU (cuda_ops.h): two launches per layer, each over all n tokens in
 * order (token-by-token recurrence, as the CPU: prefill rows equal decode rows).
 *   k_gdn_conv: block per dk channels (one key head of q or k, or dk channels of v), a thread
 *     per channel: the causal conv over [window, mix_t] oldest first, SiLU, the window shift
 *     (kept in registers across tokens), and for q / k heads the L2 norm (sumsq16 order, eps
 *     1e-6; q also times dk^-0.5). Same operations and order as gdn_conv_worker.
 *   k_gdn_recur: block per value head, a thread per column jj of S (its dk values in registers
 *     and shared memory across tokens): decay and S^T k summed over i in order, the delta, the rank-1 update and
 *     S^T q in order, then the gated RMSNorm with silu(z) (warp 0, sumsq16 order). Same
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
}
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

#define GDN_KMAX 8
#define GDN_SR128 64 /* rows of S in registers at dk 128 */

extern "C" int cuda_gdn_check(const cuda_gdn_shape *sh, char *err, size_t errlen) {
  if (sh->dk < 1 || sh->dk > 128)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: dk %d (1..128 supported)", sh->dk);
  if (sh->dv < 2 || sh->dv > 128)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: dv %d (2..128 supported)", sh->dv);
  if (sh->Nk <= 0 || sh->Nv <= 0 || sh->Nv % sh->Nk)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: %d value heads over %d key heads", sh->Nv, sh->Nk);
  if (sh->conv_k < 2 || sh->conv_k > GDN_KMAX)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda gdn: conv kernel %d (2..%d)", sh->conv_k, GDN_KMAX);
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
    float kv = 0.0f, oo = 0.0f;
    if (col) {
#pragma unroll
      for (int i = 0; i < SR; i++)
        if (i < dk) {
          s[i] = __fmul_rn(s[i], decay);
          kv = __fadd_rn(kv, __fmul_rn(s[i], qk[DK + i]));
        }
#pragma unroll 8
      for (int i = SR; i < dk; i++) {
        const float v = __fmul_rn(ssh[(i - SR) * dv + jj], decay);
        ssh[(i - SR) * dv + jj] = v;
        kv = __fadd_rn(kv, __fmul_rn(v, qk[DK + i]));
      }
      const float delta = __fmul_rn(__fsub_rn(vv, kv), beta);
#pragma unroll
      for (int i = 0; i < SR; i++)
        if (i < dk) {
          s[i] = __fadd_rn(s[i], __fmul_rn(qk[DK + i], delta));
          oo = __fadd_rn(oo, __fmul_rn(s[i], qk[i]));
        }
#pragma unroll 8
      for (int i = SR; i < dk; i++) {
        const float v = __fadd_rn(ssh[(i - SR) * dv + jj], __fmul_rn(qk[DK + i], delta));
        ssh[(i - SR) * dv + jj] = v;
        oo = __fadd_rn(oo, __fmul_rn(v, qk[i]));
      }
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

/* k_gdn_recur2: dk = 128, two threads per column: lane l < 16 of a warp holds rows 0..63 of
 * column 16 w + l of S, lane l + 16 rows 64..127, both in registers. Every float operation and its
 * order is k_gdn_recur's: the decay product and s * k per row, then kv summed over i in order (the
 * lower half's 64 additions, its partial handed to the upper half by a shuffle, which adds its 64),
 * delta from the upper half, the rank-1 update and s * q per row, oo summed in order the same
 * way. So the serial chain is unchanged, while each thread issues half the instructions and no
 * shared-memory traffic for S (k_gdn_recur's column thread runs ~5000 instructions a token with
 * one warp per scheduler). The default for dk 128 (H200, 35B-A3B shape: decode 252 -> 274 tok/s,
 * prefill 870 -> 1103); FLOE_CUDA_GDN2=0 / cuda_gdn_set_impl(0) selects k_gdn_recur. */
#define G2_HALF 64

/* The ordered sum p[0] + ... + p[127] of a column, its rows split over the two halves: the lower
 * half adds its 64 from 0, the upper half continues from that partial. Valid in the upper half. */
static __device__ __forceinline__ float g2_chain(const float p[G2_HALF], int lane, int half) {
  float acc = 0.0f;
  if (half == 0)
#pragma unroll
    for (int i = 0; i < G2_HALF; i++) acc = __fadd_rn(acc, p[i]);
  const float lower = __shfl_sync(0xffffffffu, acc, lane & 15);
  if (half == 1) {
    acc = lower;
#pragma unroll
    for (int i = 0; i < G2_HALF; i++) acc = __fadd_rn(acc, p[i]);
  }
  return acc;
}

template <bool KEEP>
static __global__ void __launch_bounds__(256)
    k_gdn_recur2(const float *raw, const float *z, const float *b, const float *a, const float *dt_bias,
                 const float *ssm_a, const float *norm_w, float *Sg, float *const *Sp, float *const *keep, float *o,
                 int Nk, int Nv, int dv, int v_tiled, float eps, int n_tok) {
  PDL_ENTER();
  if (Sp) Sg = *Sp;
  constexpr int dk = 128;
  __shared__ float qk[2 * dk];
  __shared__ float os[128];
  __shared__ float s_rr;
  const int hv = blockIdx.x, lane = threadIdx.x & 31, half = lane >> 4;
  const int jj = (threadIdx.x >> 5) * 16 + (lane & 15), r = Nv / Nk;
  const bool col = jj < dv;
  const int kh = v_tiled ? hv % Nk : hv / r;
  const int64_t kd = (int64_t)Nk * dk, vd = (int64_t)Nv * dv, C = 2 * kd + vd;
  const int i0 = half * G2_HALF;
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
  float s[G2_HALF], p[G2_HALF];
#pragma unroll
  for (int i = 0; i < G2_HALF; i++) s[i] = col ? S[(int64_t)(i0 + i) * dv] : 0.0f;
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
    for (int i = 0; i < G2_HALF; i++) {
      s[i] = __fmul_rn(s[i], decay);
      p[i] = __fmul_rn(s[i], qk[dk + i0 + i]);
    }
    const float kv = g2_chain(p, lane, half);
    const float delta_u = __fmul_rn(__fsub_rn(vv, kv), beta);
    const float delta = __shfl_sync(0xffffffffu, delta_u, (lane & 15) + 16);
#pragma unroll
    for (int i = 0; i < G2_HALF; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(qk[dk + i0 + i], delta));
      p[i] = __fmul_rn(s[i], qk[i0 + i]);
    }
    const float oo = g2_chain(p, lane, half);
    if (half == 1 && col) os[jj] = oo;
    if (KEEP && col) { /* kept chunk: this half's rows of the state after row t */
      float *Kt = keep[t] + (int64_t)hv * dk * dv + jj;
#pragma unroll
      for (int i = 0; i < G2_HALF; i++) Kt[(int64_t)(i0 + i) * dv] = s[i];
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
    for (int i = 0; i < G2_HALF; i++) S[(int64_t)(i0 + i) * dv] = s[i];
}

static int g_gdn_impl = -1; /* 1: k_gdn_recur2 where it applies; 0: k_gdn_recur; -1: from FLOE_CUDA_GDN2 (default 1) */

extern "C" void cuda_gdn_set_impl(int two) { g_gdn_impl = two ? 1 : 0; }

static void gdn_recur_launch(const cuda_gdn_shape *sh, const float *raw, const float *z, const float *b,
                             const float *a, const float *dt_bias, const float *ssm_a, const float *norm_w, float *S,
                             float *const *Sp, float *const *keep, float *o, int64_t n_tok, void *stream) {
  if (n_tok <= 0) return;
  if (g_gdn_impl < 0) {
    const char *e = getenv("FLOE_CUDA_GDN2");
    g_gdn_impl = !(e && e[0] == '0');
  }
  if (g_gdn_impl == 1 && sh->dk == 128 && sh->dv <= 128) {
    const dim3 grid(sh->Nv), block((sh->dv + 15) / 16 * 32);
    if (keep)
      pdl_launch(k_gdn_recur2<true>, grid, block, (size_t)0, OPS_STREAM(stream), raw, z, b, a, dt_bias, ssm_a, norm_w,
                 S, Sp, keep, o, sh->Nk, sh->Nv, sh->dv, sh->v_tiled, sh->eps, (int)n_tok);
    else
      pdl_launch(k_gdn_recur2<false>, grid, block, (size_t)0, OPS_STREAM(stream), raw, z, b, a, dt_bias, ssm_a, norm_w,
                 S, Sp, keep, o, sh->Nk, sh->Nv, sh->dv, sh->v_tiled, sh->eps, (int)n_tok);
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
