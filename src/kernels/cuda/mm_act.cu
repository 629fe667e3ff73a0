/* Activation quantization on the GPU: the bytes of kern_act_quantize (src/kernels/cpu/kernels.c)
 * for every activation format (KACT_A32, KACT_A256, KACT_MLX; kernels_internal.h).
 *
 * One block per activation row. Pass 1: the absolute maximum of every scale unit (32-block,
 * superblock or MLX group; a maximum does not depend on the order it is taken in). Pass 2: every
 * output byte / field from its unit's maximum, with the CPU's operations: id = 127 / amax,
 * q = rint(x * id) clamped to +-127, d = amax / 127, both 0 when amax is 0. Padding bytes
 * between the layout's regions are not written (the CPU does not write them either). */
#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace {

__device__ __forceinline__ int q8v(float x, float amax) {
  if (!(amax > 0)) return 0;
  const float id = 127.0f / amax;
  const float v = rintf(x * id);
  return (int)(v > 127 ? 127 : v < -127 ? -127 : v);
}
__device__ __forceinline__ float d8(float amax) { return amax > 0 ? amax / 127.0f : 0.0f; }

/* kact_perm256: natural index (within a superblock) of activation position p */
__device__ __forceinline__ int perm256(int type, int p) {
  if (type == FLOE_TYPE_Q4_K || type == FLOE_TYPE_Q5_K) {
    const int t = p >> 5, pt = (t & 4) | ((t & 1) << 1) | ((t >> 1) & 1); /* 0,2,1,3,4,6,5,7 */
    return pt * 32 + (p & 31);
  }
  if (type == FLOE_TYPE_IQ4_XS) {
    const int h = p / 128, r = p % 128, hi = r / 64, k = (r % 64) / 16;
    return h * 128 + k * 32 + hi * 16 + r % 16;
  }
  return p;
}

#define ACT_THREADS 512
#define ACT_STAGE_MAX 8192 /* rows up to this many values are staged in shared memory first */

/* The quantized bytes of one row x (shared or global memory, a.cols values) into o, for the
 * layout of a (kind: KACT_*). Called by every thread of the block; s_amax: shared memory for
 * a.cols / unit floats. */
__device__ void act_row(const KArgs &a, int kind, const float *x, float *s_amax, uint8_t *o) {
  int8_t *q = (int8_t *)o;
  float *d = (float *)(o + a.off_d);
  const int64_t n = a.cols;
  const int U = kind == KACT_A32 ? 32 : kind == KACT_A256 ? 256 : a.group;
  const int64_t nu = n / U;
  /* a warp per unit: a maximum is the same whatever the order it is taken in */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t k = warp; k < nu; k += nw) {
    float m = 0.0f;
    for (int j = lane; j < U; j += 32) m = fmaxf(m, fabsf(x[k * U + j]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(MM_FULL, m, o));
    if (lane == 0) s_amax[k] = m;
  }
  __syncthreads();
  if (kind == KACT_A32) {
    float *dexp = (float *)(o + a.off_s);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) q[j] = (int8_t)q8v(x[j], s_amax[j / 32]);
    for (int64_t k = threadIdx.x; k < nu; k += blockDim.x) {
      const float dk = d8(s_amax[k]);
      d[k] = dk;
      for (int i = 0; i < 8; i++) dexp[8 * k + i] = dk;
    }
  } else if (kind == KACT_A256) {
    int16_t *bs = (int16_t *)(o + a.off_s);
    for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
      const int64_t k = p / 256;
      q[p] = (int8_t)q8v(x[256 * k + perm256(a.type, (int)(p % 256))], s_amax[k]);
    }
    for (int64_t k = threadIdx.x; k < nu; k += blockDim.x) d[k] = d8(s_amax[k]);
    for (int64_t id = threadIdx.x; id < nu * 16; id += blockDim.x) {
      const int64_t k = id / 16;
      int s = 0;
      for (int i = 0; i < 16; i++) s += q8v(x[16 * id + i], s_amax[k]);
      bs[id] = (int16_t)s;
    }
  } else { /* KACT_MLX */
    const int g = a.group, b4 = a.bits == 4, step = b4 ? 128 : 64;
    float *sx = (float *)(o + a.off_s);
    int32_t *nc = (int32_t *)(o + a.off_c);
    float *dl = (float *)(o + a.off_e);
    /* quantized natural value j (0 past the end of the row: the padded last chunk) */
    auto nat = [&](int64_t j) -> int { return j < n ? q8v(x[j], s_amax[j / g]) : 0; };
    for (int64_t c = threadIdx.x; c < a.nq; c += blockDim.x) {
      int64_t j = c;
      if (b4) { /* a 128-chunk holds its even values, then its odd ones */
        const int64_t cc = c & ~(int64_t)127, oo = c & 127;
        j = oo < 64 ? cc + 2 * oo : cc + 2 * (oo - 64) + 1;
      }
      q[c] = (int8_t)nat(j);
    }
    for (int64_t k = warp; k < nu; k += nw) { /* a warp per group: an exact integer sum */
      int32_t isum = 0;
      for (int i = lane; i < g; i += 32) isum += nat(k * g + i);
      for (int o = 16; o > 0; o >>= 1) isum += __shfl_xor_sync(MM_FULL, isum, o);
      if (lane == 0) {
        const float dk = d8(s_amax[k]);
        d[k] = dk;
        sx[k] = dk * (float)isum;
      }
    }
    const int64_t nst = a.nq / step;
    for (int64_t id = threadIdx.x; id < nst * 16; id += blockDim.x) {
      const int64_t c = id / 16 * step;
      const int i = (int)(id % 16), per = step / 16;
      int32_t t = 0;
      for (int k = 0; k < per; k++) t += nat(c + per * i + k);
      nc[id] = (b4 ? -8 : -128) * t;
      const int64_t e0 = c + (int64_t)i * per;
      dl[id] = e0 < n ? d8(s_amax[e0 / g]) : 0.0f;
    }
  }
}

__global__ void __launch_bounds__(ACT_THREADS) k_act(KArgs a, int kind, const float *__restrict__ X, int64_t ldx,
                                                     uint8_t *__restrict__ xq, size_t xs, int stage) {
  PDL_ENTER();
  extern __shared__ float s_dyn[];
  /* staged: the row is read from global memory once, all its loads in flight together (a one-row
   * quantization is latency-bound), then every pass reads shared memory */
  float *s_amax = s_dyn + (stage ? a.cols : 0);
  if (stage) {
    const float *xg = X + (int64_t)blockIdx.x * ldx;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) s_dyn[j] = xg[j];
    __syncthreads();
  }
  act_row(a, kind, stage ? s_dyn : X + (int64_t)blockIdx.x * ldx, s_amax, xq + (size_t)blockIdx.x * xs);
}

#define NORM_THREADS 512
#define NORM_PER 4 /* values a thread keeps in registers (rows up to 2048 in one memory round trip) */

/* y = (xs * r) * w for the row staged in xs (r = 1 / sqrt(sumsq / n + eps), the CPU's 16-lane
 * sum of squares: ops_sumsq16_warp), into global y and back into xs; wr: this thread's weights
 * for i = tid + k * bs, k < NORM_PER. */
__device__ __forceinline__ void norm_row(float *xs, const float *__restrict__ w, const float wr[NORM_PER], float *y,
                                         int n, float eps) {
  __shared__ float rs;
  const int tid = threadIdx.x, bs = blockDim.x;
  __syncthreads();
  if (tid < 32) {
    const float ss = ops_sumsq16_warp(xs, n);
    if (tid == 0) rs = 1.0f / sqrtf(__fadd_rn(ss / (float)n, eps));
  }
  __syncthreads();
  const float r = rs;
#pragma unroll
  for (int k = 0; k < NORM_PER; k++) {
    const int i = tid + k * bs;
    if (i < n) xs[i] = y[i] = __fmul_rn(__fmul_rn(xs[i], r), wr[k]);
  }
  for (int i = tid + NORM_PER * bs; i < n; i += bs) xs[i] = y[i] = __fmul_rn(__fmul_rn(xs[i], r), w[i]);
  __syncthreads();
}

/* RMSNorm over rows, optionally after the residual add (x += delta, written back) and optionally
 * followed by the quantization of the normed row (qkind >= 0: act_row for qa into xq). One block
 * per row; a one-row norm is latency-bound, so every global load of a phase is issued before its
 * values are used (restrict pointers, unrolled loops, the weights read before the reduction).
 * w == NULL: only the add. Bit-identical to layer_rmsnorm (and vadd + layer_rmsnorm). */
__global__ void __launch_bounds__(NORM_THREADS)
    k_norm(float *__restrict__ x, const float *__restrict__ delta, const float *__restrict__ w, float *__restrict__ y,
           int n, float eps, KArgs qa, int qkind, uint8_t *__restrict__ xq, size_t xqs) {
  PDL_ENTER();
  extern __shared__ float xs[];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, bs = blockDim.x;
  float *xr = x + row * n;
  float wr[NORM_PER];
#pragma unroll
  for (int k = 0; k < NORM_PER; k++) {
    const int i = tid + k * bs;
    wr[k] = w && i < n ? w[i] : 0.0f;
  }
  if (delta) {
    const float *dr = delta + row * n;
#pragma unroll 4
    for (int i = tid; i < n; i += bs) {
      const float v = __fadd_rn(xr[i], dr[i]);
      xr[i] = v;
      xs[i] = v;
    }
  } else {
#pragma unroll 4
    for (int i = tid; i < n; i += bs) xs[i] = xr[i];
  }
  if (!w) return;
  norm_row(xs, w, wr, y + row * n, n, eps);
  if (qkind >= 0) act_row(qa, qkind, xs, xs + n, xq + (size_t)row * xqs);
}

#define COMB_THREADS 512

/* x[t] += sum_j w[t*K+j] * y[t*K+j] (j ascending) + sigmoid(sh_logit[t]) * sh[t]; then, when nw
 * is not NULL, h[t] = rmsnorm(x[t]) * nw, and when qkind >= 0 h[t] quantized for qa into xq. */
__global__ void __launch_bounds__(COMB_THREADS)
    k_combine(float *__restrict__ x, const float *__restrict__ y, const float *__restrict__ w, int K,
              const float *__restrict__ sh, const float *__restrict__ shl, const float *__restrict__ nw,
              float *__restrict__ h, float eps, int n, KArgs qa, int qkind, uint8_t *__restrict__ xq, size_t xqs) {
  PDL_ENTER();
  extern __shared__ float xs[];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, bs = blockDim.x;
  float wr[NORM_PER];
#pragma unroll
  for (int k = 0; k < NORM_PER; k++) {
    const int i = tid + k * bs;
    wr[k] = nw && i < n ? nw[i] : 0.0f;
  }
  const float g = sh ? floe_sigmoidf(shl[t]) : 0.0f;
#pragma unroll 4
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
  norm_row(xs, nw, wr, h + t * n, n, eps);
  if (qkind >= 0) act_row(qa, qkind, xs, xs + n, xq + (size_t)t * xqs);
}

} // namespace

static int act_kind(const KArgs &a) {
  return a.type == FLOE_TYPE_MLX ? KACT_MLX
         : (a.type == FLOE_TYPE_Q4_K || a.type == FLOE_TYPE_Q5_K || a.type == FLOE_TYPE_Q6_K || a.type == FLOE_TYPE_IQ4_XS)
             ? KACT_A256
             : KACT_A32;
}

static int act_unit(const KArgs &a, int kind) { return kind == KACT_A32 ? 32 : kind == KACT_A256 ? 256 : a.group; }

/* the epilogue's arguments for W (NULL, or no activation layout: none) */
static void act_epilogue(const cuda_mat *W, KArgs *qa, int *qkind, size_t *extra_floats) {
  memset(qa, 0, sizeof *qa);
  *qkind = -1;
  *extra_floats = 0;
  if (!W || !cuda_mm_act_bytes(W)) return;
  *qa = mm_kargs(W);
  *qkind = act_kind(*qa);
  *extra_floats = (size_t)(qa->cols / act_unit(*qa, *qkind));
}

extern "C" void cuda_mm_norm_act(const cuda_mat *W, float *x, const float *delta, const float *w, float *y,
                                 int64_t n_rows, int64_t n, float eps, void *xq, size_t xq_stride, void *stream) {
  if (n_rows <= 0) return;
  KArgs qa;
  int qkind;
  size_t extra;
  act_epilogue(xq && w ? W : nullptr, &qa, &qkind, &extra);
  pdl_launch(k_norm, dim3((unsigned)n_rows), dim3(NORM_THREADS), (size_t)(n + extra) * sizeof(float),
             (cudaStream_t)stream, x, delta, w, y, (int)n, eps, qa, qkind, (uint8_t *)xq, xq_stride);
}

extern "C" void cuda_mm_combine_act(const cuda_mat *W, float *x, const float *y, const float *w, int K, const float *sh,
                                    const float *sh_logit, const float *norm_w, float *h, float eps, int64_t n_tok,
                                    int64_t n, void *xq, size_t xq_stride, void *stream) {
  if (n_tok <= 0) return;
  KArgs qa;
  int qkind;
  size_t extra;
  act_epilogue(xq && norm_w ? W : nullptr, &qa, &qkind, &extra);
  pdl_launch(k_combine, dim3((unsigned)n_tok), dim3(COMB_THREADS), (size_t)(n + extra) * sizeof(float),
             (cudaStream_t)stream, x, y, w, K, sh, sh_logit, norm_w, h, eps, (int)n, qa, qkind, (uint8_t *)xq,
             xq_stride);
}

void mm_act_launch(const KArgs &a, int64_t nb, const float *X, int64_t ldx, uint8_t *xq, size_t xs, cudaStream_t st) {
  const int kind = act_kind(a);
  const int U = act_unit(a, kind);
  const int stage = a.cols <= ACT_STAGE_MAX;
  const size_t smem = (size_t)(a.cols / U + (stage ? a.cols : 0)) * sizeof(float);
  for (int64_t b = 0; b < nb; b += 65535) { /* grid x limit is 2^31, but keep launches modest */
    const int64_t n = nb - b < 65535 ? nb - b : 65535;
    pdl_launch(k_act, dim3((unsigned)n), dim3(ACT_THREADS), (size_t)(smem), st, a, kind, X + b * ldx, ldx, xq + (size_t)b * xs, xs, stage);
  }
}
