/* Activation quantization on the GPU: the bytes of kern_act_quantize (src/kernels/cpu/kernels.c)
 * for every activation format (KACT_A32, KACT_A256, KACT_MLX; kernels_internal.h); and the
 * one-row kernels that end in it: k_norm (residual add + RMSNorm) and k_combine (MoE weighted sum
 * + residual + RMSNorm), bit-identical to layers.c.
 *
 * One block per activation row. Pass 1: the absolute maximum of every scale unit (32-block,
 * superblock or MLX group; a maximum does not depend on the order it is taken in). Pass 2: every
 * output byte / field from its unit's maximum, with the CPU's operations: id = 127 / amax,
 * q = rint(x * id) clamped to +-127, d = amax / 127, both 0 when amax is 0. Padding bytes
 * between the layout's regions are not written (the CPU does not write them either).
 *
 * Two implementations of a row's A32 / A256 quantization, the same bytes (test_cuda_mm runs
 * both; cuda_mm_set_act2, FLOE_CUDA_ACT2=0 selects the first):
 *  - act_row (MLX always): a warp per unit for the maxima, a barrier, then a thread per output
 *    byte or field, each computing its own 127 / amax;
 *  - act_row_warp (the default): a warp per 256-value chunk, eight values per lane in registers,
 *    loaded straight from the row: the unit's maximum by shuffles, one 127 / amax per lane, the
 *    bytes, the 16-value sums (A256) by shuffles; no barrier, so a one-row quantization's serial
 *    path is load -> max -> divide -> store.
 * The same switch picks the norms' forms: the default stores each value's square transposed as
 * it is written (sq_put) so the 16-lane sum of squares reads its lanes by float4 (sumsq16_rows,
 * the CPU's adds in the CPU's order), and k_combine loads up to COMB_KB slots of a row at once
 * into registers before the adds; the first forms read the row value by value. */
#include "kernels/cuda/amk.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/mm_act.cuh"
#include "kernels/cuda/mm_common.cuh"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace {

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

/* act_row_warp where it applies (impl 1, kinds A32 / A256), else act_row */
__device__ __forceinline__ bool act_warp_ok(int impl, int kind) { return impl && kind != KACT_MLX; }

__global__ void __launch_bounds__(ACT_THREADS) k_act(KArgs a, int kind, const float *__restrict__ X, int64_t ldx,
                                                     uint8_t *__restrict__ xq, size_t xs, int stage, int impl) {
  PDL_ENTER();
  if (act_warp_ok(impl, kind)) { /* each lane loads its own values: nothing to stage */
    act_row_warp(a, kind, X + (int64_t)blockIdx.x * ldx, xq + (size_t)blockIdx.x * xs);
    return;
  }
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

/* The squares for sumsq16_rows: value i's square (a plain multiply, as sumsq16's) at row i % 16,
 * column i / 16 of sq, rows sq_rs floats apart. sq_rs: a multiple of 4 (float4 rows) that is 4
 * more than a multiple of 32 (the 16 rows start in different banks). */
static __host__ __device__ __forceinline__ int sq_rs(int n) { return ((n + 15) / 16 + 31) / 32 * 32 + 4; }
__device__ __forceinline__ void sq_put(float *sq, int rs, int i, float v) { sq[(i & 15) * rs + (i >> 4)] = __fmul_rn(v, v); }

/* ops_sumsq16_warp from the squares sq_put stored (called by one whole warp): lane k < 16 adds
 * its row, x[k]^2, x[k+16]^2, ... in order, then fold16: the same adds in the same order; the
 * row comes in float4 loads, eight in flight, so the serial path is the chain of adds. */
__device__ __forceinline__ float sumsq16_rows(const float *sq, int n) {
  const int lane = threadIdx.x & 31, rs = sq_rs(n);
  float acc = 0.0f;
  if (lane < 16) {
    const int cnt = (n - lane + 15) / 16; /* values lane + 16 m < n */
    const float *r = sq + lane * rs;
    int m = 0;
#pragma unroll 8
    for (; m + 4 <= cnt; m += 4) {
      const float4 v = *(const float4 *)(r + m);
      acc = __fadd_rn(acc, v.x);
      acc = __fadd_rn(acc, v.y);
      acc = __fadd_rn(acc, v.z);
      acc = __fadd_rn(acc, v.w);
    }
    for (; m < cnt; m++) acc = __fadd_rn(acc, r[m]);
  }
  acc = ops_fold16(acc);
  return __shfl_sync(0xffffffffu, acc, 0);
}

/* y = (xs * r) * w for the row staged in xs (r = 1 / sqrt(sumsq / n + eps), the CPU's 16-lane
 * sum of squares: ops_sumsq16_warp, or sumsq16_rows from sq when sq is not NULL), into global y
 * and back into xs; wr: this thread's weights for i = tid + k * bs, k < NORM_PER. */
__device__ __forceinline__ void norm_row(float *xs, const float *sq, const float *__restrict__ w,
                                         const float wr[NORM_PER], float *y, int n, float eps) {
  __shared__ float rs;
  const int tid = threadIdx.x, bs = blockDim.x;
  __syncthreads();
  if (tid < 32) {
    const float ss = sq ? sumsq16_rows(sq, n) : ops_sumsq16_warp(xs, n);
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

/* this thread's weights for i = tid + k * blockDim.x, k < NORM_PER (w NULL: zeros) */
__device__ __forceinline__ void norm_w_regs(const float *__restrict__ w, int n, float wr[NORM_PER]) {
#pragma unroll
  for (int k = 0; k < NORM_PER; k++) {
    const int i = threadIdx.x + k * blockDim.x;
    wr[k] = w && i < n ? w[i] : 0.0f;
  }
}

/* Token embedding rows read by a norm's launch instead of written by k_embed before it (data not
 * NULL: row t is row tok[t] of the embedding matrix, embed_elem's values, NaN for an id out of
 * range, as k_embed writes them) */
struct EmbedSrc {
  const uint8_t *data;
  size_t row_bytes;
  int64_t n_vocab;
  int32_t *tok;
  uint32_t type;
  /* keys not NULL: row key_t's token is the argmax those keys gathered (amk.cuh), written to
   * tok[key_t] here for the later readers */
  const unsigned long long *keys;
  int64_t key_t;
};

/* embedding row tok[t] (k_embed's values) staged for a norm: into xs (and the squares' sq), and
 * into the residual row x when x is not NULL */
__device__ __forceinline__ void embed_stage(const EmbedSrc &es, int64_t t, float *x, float *xs, float *sq, int rs,
                                            int n) {
  __shared__ int32_t ktok;
  if (es.keys && t == es.key_t) { /* the whole block is here */
    if (threadIdx.x < 32) {
      const int32_t v = amk_token(es.keys);
      if (threadIdx.x == 0) ktok = es.tok[t] = v;
    }
    __syncthreads();
  }
  const int32_t tok = es.keys && t == es.key_t ? ktok : es.tok[t];
  const bool ok = tok >= 0 && tok < es.n_vocab;
  const uint8_t *er = es.data + (size_t)(ok ? tok : 0) * es.row_bytes;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = ok ? embed_elem(es.type, er, i) : __int_as_float(0x7fc00000);
    if (x) x[i] = v;
    xs[i] = v;
    if (sq) sq_put(sq, rs, i, v);
  }
}

/* RMSNorm over rows, optionally after the residual add (x += delta, written back) and optionally
 * followed by the quantization of the normed row (qkind >= 0: act_row for qa into xq). One block
 * per row; a one-row norm is latency-bound, so every global load of a phase is issued before its
 * values are used (restrict pointers, unrolled loops, the weights read before the reduction).
 * w == NULL: only the add. Bit-identical to layer_rmsnorm (and vadd + layer_rmsnorm). */
__global__ void __launch_bounds__(NORM_THREADS)
    k_norm(float *__restrict__ x, const float *__restrict__ delta, const float *__restrict__ w, float *__restrict__ y,
           int n, float eps, KArgs qa, int qkind, uint8_t *__restrict__ xq, size_t xqs, int impl, int sqoff,
           int prew, EmbedSrc es) {
  float wr[NORM_PER];
  if (prew & 1) norm_w_regs(w, n, wr); /* the model's weights: before the wait (pdl.cuh, cuda_rt_prew) */
  if (prew & 2) PDL_WAIT(); /* the next kernel scheduled once the row is in (PDL_TRIGGER below) */
  else PDL_ENTER();
  extern __shared__ float xs[];
  float *sq = sqoff ? xs + sqoff : nullptr; /* the squares for sumsq16_rows */
  const int rs = sq_rs(n);
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, bs = blockDim.x;
  float *xr = x + row * n;
  if (!(prew & 1)) norm_w_regs(w, n, wr);
  if (delta) {
    const float *dr = delta + row * n;
#pragma unroll 4
    for (int i = tid; i < n; i += bs) {
      const float v = __fadd_rn(xr[i], dr[i]);
      xr[i] = v;
      xs[i] = v;
      if (sq) sq_put(sq, rs, i, v);
    }
  } else if (es.data) { /* x's row is the embedding row of tok[row]: written here, then normed */
    embed_stage(es, row, xr, xs, sq, rs, n);
  } else {
#pragma unroll 4
    for (int i = tid; i < n; i += bs) {
      const float v = xr[i];
      xs[i] = v;
      if (sq) sq_put(sq, rs, i, v);
    }
  }
  if (prew & 2) PDL_TRIGGER();
  if (!w) return;
  norm_row(xs, sq, w, wr, y + row * n, n, eps);
  if (qkind < 0) return;
  if (act_warp_ok(impl, qkind)) act_row_warp(qa, qkind, xs, xq + (size_t)row * xqs);
  else act_row(qa, qkind, xs, xs + n, xq + (size_t)row * xqs);
}

/* The MTP's input rows: y row t = [rmsnorm(x1 row t) * w1 | rmsnorm(x2 row t) * w2] (rows of n, y's
 * of 2n), a block per half row: k_norm's loads and norm_row, so each half is k_norm's bits; with
 * qkind >= 0 each block also writes its half's chunks of y row t's quantization (act_row_warp's
 * bytes: its 256-value chunks do not depend on each other). es.data: x1's rows are the embedding
 * rows of es.tok, dequantized here (one launch fewer than k_embed then this; the same values). */
__global__ void __launch_bounds__(NORM_THREADS)
    k_norm_pair(const float *__restrict__ x1, const float *__restrict__ w1, const float *__restrict__ x2,
                const float *__restrict__ w2, float *__restrict__ y, int n, float eps, int sqoff, KArgs qa, int qkind,
                uint8_t *__restrict__ xq, size_t xqs, int prew, EmbedSrc es) {
  const int h = blockIdx.x & 1;
  const float *w = h ? w2 : w1;
  float wr[NORM_PER];
  if (prew & 1) norm_w_regs(w, n, wr);
  PDL_ENTER();
  extern __shared__ float xs[];
  float *sq = sqoff ? xs + sqoff : nullptr;
  const int rs = sq_rs(n);
  const int64_t t = blockIdx.x >> 1;
  const int tid = threadIdx.x, bs = blockDim.x;
  if (!(prew & 1)) norm_w_regs(w, n, wr);
  if (!h && es.data) {
    embed_stage(es, t, nullptr, xs, sq, rs, n);
  } else {
    const float *xr = (h ? x2 : x1) + t * n;
#pragma unroll 4
    for (int i = tid; i < n; i += bs) {
      const float v = xr[i];
      xs[i] = v;
      if (sq) sq_put(sq, rs, i, v);
    }
  }
  norm_row(xs, sq, w, wr, y + (2 * t + h) * n, n, eps);
  /* the half's chunks of the 2n-value row's quantization for qa (n a multiple of 256) */
  if (qkind >= 0) act_row_warp_from(qa, qkind, xs, xq + (size_t)t * xqs, n, h * (n / 256));
}

#define COMB_THREADS 512
#define COMB_KB 12 /* MoE slots whose loads the register path issues together */

/* x[t] += sum_j w[t*K+j] * y[t*K+j] (j ascending) + sigmoid(sh_logit[t]) * sh[t]; then, when nw
 * is not NULL, h[t] = rmsnorm(x[t]) * nw, and when qkind >= 0 h[t] quantized for qa into xq. */
__global__ void __launch_bounds__(COMB_THREADS)
    k_combine(float *__restrict__ x, const float *__restrict__ y, const float *__restrict__ w, int K,
              const float *__restrict__ sh, const float *__restrict__ shl, const float *__restrict__ nw,
              float *__restrict__ h, float eps, int n, KArgs qa, int qkind, uint8_t *__restrict__ xq, size_t xqs,
              int impl, int sqoff, int prew) {
  float wr[NORM_PER];
  if (prew & 1) norm_w_regs(nw, n, wr);
  if (prew & 2) PDL_WAIT(); /* as k_norm */
  else PDL_ENTER();
  extern __shared__ float xs[];
  float *sq = sqoff ? xs + sqoff : nullptr; /* the squares for sumsq16_rows */
  const int rs = sq_rs(n);
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, bs = blockDim.x;
  if (!(prew & 1)) norm_w_regs(nw, n, wr);
  const float g = sh ? floe_sigmoidf(shl[t]) : 0.0f;
  if (impl && n <= NORM_PER * bs) {
    /* the row in registers (NORM_PER values a thread): every load of a batch of COMB_KB slots is
     * issued before the first add, the adds then in the order of the loop below */
    float acc[NORM_PER], xv[NORM_PER], sv[NORM_PER];
#pragma unroll
    for (int k = 0; k < NORM_PER; k++) {
      const int i = tid + k * bs;
      acc[k] = 0.0f;
      xv[k] = i < n ? x[t * n + i] : 0.0f;
      sv[k] = sh && i < n ? sh[t * n + i] : 0.0f;
    }
    for (int j0 = 0; j0 < K; j0 += COMB_KB) {
      float yv[COMB_KB][NORM_PER], wv[COMB_KB];
#pragma unroll
      for (int jj = 0; jj < COMB_KB; jj++) {
        const int j = j0 + jj;
        wv[jj] = j < K ? w[t * K + j] : 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_PER; k++) {
          const int i = tid + k * bs;
          yv[jj][k] = j < K && i < n ? y[(t * K + j) * n + i] : 0.0f;
        }
      }
#pragma unroll
      for (int jj = 0; jj < COMB_KB; jj++)
        if (j0 + jj < K)
#pragma unroll
          for (int k = 0; k < NORM_PER; k++) acc[k] = __fadd_rn(acc[k], __fmul_rn(yv[jj][k], wv[jj]));
    }
#pragma unroll
    for (int k = 0; k < NORM_PER; k++) {
      const int i = tid + k * bs;
      if (i >= n) break;
      float a = acc[k];
      if (sh) a = __fadd_rn(a, __fmul_rn(sv[k], g));
      const float v = __fadd_rn(xv[k], a);
      x[t * n + i] = v;
      xs[i] = v;
      if (sq) sq_put(sq, rs, i, v);
    }
  } else
#pragma unroll 4
  for (int i = tid; i < n; i += bs) {
    float acc = 0.0f;
#pragma unroll 8
    for (int j = 0; j < K; j++) acc = __fadd_rn(acc, __fmul_rn(y[(t * K + j) * n + i], w[t * K + j]));
    if (sh) acc = __fadd_rn(acc, __fmul_rn(sh[t * n + i], g));
    const float v = __fadd_rn(x[t * n + i], acc);
    x[t * n + i] = v;
    xs[i] = v;
    if (sq) sq_put(sq, rs, i, v);
  }
  if (prew & 2) PDL_TRIGGER();
  if (!nw) return;
  norm_row(xs, sq, nw, wr, h + t * n, n, eps);
  if (qkind < 0) return;
  if (act_warp_ok(impl, qkind)) act_row_warp(qa, qkind, xs, xq + (size_t)t * xqs);
  else act_row(qa, qkind, xs, xs + n, xq + (size_t)t * xqs);
}

} // namespace

/* act_row_warp and k_combine's register path are the default; FLOE_CUDA_ACT2=0 (or
 * cuda_mm_set_act2(0)) selects the first forms, the same bytes. */
static int g_act2 = -1;

static int act2_on(void) {
  if (g_act2 < 0) {
    const char *e = getenv("FLOE_CUDA_ACT2");
    g_act2 = !(e && e[0] == '0');
  }
  return g_act2;
}

extern "C" void cuda_mm_set_act2(int on) { g_act2 = on ? 1 : 0; }
int mm_act2_on(void) { return act2_on(); }

static int act_kind(const KArgs &a) {
  return a.type == FLOE_TYPE_MLX ? KACT_MLX
         : (a.type == FLOE_TYPE_Q4_K || a.type == FLOE_TYPE_Q5_K || a.type == FLOE_TYPE_Q6_K || a.type == FLOE_TYPE_IQ4_XS)
             ? KACT_A256
             : KACT_A32;
}

ActOut mm_act_out(const cuda_mat *W, void *xq, size_t xs) {
  ActOut o;
  memset(&o, 0, sizeof o);
  o.kind = -1;
  if (!W || !xq || !cuda_mm_act_bytes(W)) return o;
  const KArgs a = mm_kargs(W);
  const int kind = act_kind(a);
  if (kind != KACT_A32 && kind != KACT_A256) return o;
  o.xq = (uint8_t *)xq;
  o.xs = xs;
  o.off_d = a.off_d;
  o.off_s = a.off_s;
  o.cols = a.cols;
  o.kind = kind;
  o.type = a.type;
  return o;
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

/* the norms' dynamic shared memory: the row (n floats), act_row's maxima (extra), then from float
 * sqoff (16-byte aligned; 0: none) the squares for sumsq16_rows */
static int sq_off(int64_t n, size_t extra) {
  const int64_t off = (n + (int64_t)extra + 3) / 4 * 4;
  return (off + 16 * (int64_t)sq_rs((int)n)) * 4 <= 48 * 1024 ? (int)off : 0; /* within the default limit */
}
static size_t norm_smem(int64_t n, size_t extra, int sqoff) {
  return (sqoff ? (size_t)sqoff + (size_t)16 * sq_rs((int)n) : (size_t)n + extra) * sizeof(float);
}

static void norm_launch(const cuda_mat *W, float *x, const float *delta, const float *w, float *y, int64_t n_rows,
                        int64_t n, float eps, void *xq, size_t xq_stride, const EmbedSrc &es, void *stream) {
  if (n_rows <= 0) return;
  KArgs qa;
  int qkind;
  size_t extra;
  act_epilogue(xq && w ? W : nullptr, &qa, &qkind, &extra);
  const int sqoff = w && act2_on() ? sq_off(n, extra) : 0;
  pdl_launch(k_norm, dim3((unsigned)n_rows), dim3(NORM_THREADS), norm_smem(n, extra, sqoff), (cudaStream_t)stream, x,
             delta, w, y, (int)n, eps, qa, qkind, (uint8_t *)xq, xq_stride, act2_on(), sqoff, cuda_rt_prew(), es);
}

extern "C" void cuda_mm_norm_act(const cuda_mat *W, float *x, const float *delta, const float *w, float *y,
                                 int64_t n_rows, int64_t n, float eps, void *xq, size_t xq_stride, void *stream) {
  norm_launch(W, x, delta, w, y, n_rows, n, eps, xq, xq_stride, EmbedSrc{}, stream);
}

extern "C" void cuda_mm_embed_norm_act(const cuda_mat *W, uint32_t etype, const void *edata, size_t erow_bytes,
                                       int64_t n_vocab, int32_t *tok, const unsigned long long *keys, float *x,
                                       const float *w, float *y, int64_t n_rows, int64_t n, float eps, void *xq,
                                       size_t xq_stride, void *stream) {
  const EmbedSrc es = { (const uint8_t *)edata, erow_bytes, n_vocab, tok, etype, keys, n_rows - 1 };
  norm_launch(W, x, nullptr, w, y, n_rows, n, eps, xq, xq_stride, es, stream);
}

static int norm_pair_launch(const cuda_mat *W, const float *x1, const float *w1, const float *x2, const float *w2,
                            float *y, int64_t n_rows, int64_t n, float eps, void *xq, size_t xq_stride,
                            const EmbedSrc &es, void *stream) {
  if (n_rows <= 0) return 0;
  KArgs qa;
  int qkind;
  size_t extra;
  act_epilogue(xq && W && W->cols == 2 * n ? W : nullptr, &qa, &qkind, &extra);
  if (qkind == KACT_MLX || !act2_on() || n % 256) qkind = -1; /* the warp quantizer's whole chunks only */
  const int sqoff = act2_on() ? sq_off(n, 0) : 0;
  pdl_launch(k_norm_pair, dim3((unsigned)(2 * n_rows)), dim3(NORM_THREADS), norm_smem(n, 0, sqoff), (cudaStream_t)stream,
             x1, w1, x2, w2, y, (int)n, eps, sqoff, qa, qkind, (uint8_t *)xq, xq_stride, cuda_rt_prew(), es);
  return qkind >= 0;
}

extern "C" int cuda_mm_norm_pair_act(const cuda_mat *W, const float *x1, const float *w1, const float *x2,
                                     const float *w2, float *y, int64_t n_rows, int64_t n, float eps, void *xq,
                                     size_t xq_stride, void *stream) {
  return norm_pair_launch(W, x1, w1, x2, w2, y, n_rows, n, eps, xq, xq_stride, EmbedSrc{}, stream);
}

extern "C" int cuda_mm_embed_norm_pair_act(const cuda_mat *W, uint32_t etype, const void *edata, size_t erow_bytes,
                                           int64_t n_vocab, int32_t *tok, const unsigned long long *keys,
                                           const float *w1, const float *x2, const float *w2, float *y, int64_t n_rows,
                                           int64_t n, float eps, void *xq, size_t xq_stride, void *stream) {
  const EmbedSrc es = { (const uint8_t *)edata, erow_bytes, n_vocab, tok, etype, keys, n_rows - 1 };
  return norm_pair_launch(W, nullptr, w1, x2, w2, y, n_rows, n, eps, xq, xq_stride, es, stream);
}

extern "C" void cuda_mm_norm_pair(const float *x1, const float *w1, const float *x2, const float *w2, float *y,
                                  int64_t n_rows, int64_t n, float eps, void *stream) {
  (void)cuda_mm_norm_pair_act(NULL, x1, w1, x2, w2, y, n_rows, n, eps, NULL, 0, stream);
}

extern "C" void cuda_mm_combine_act(const cuda_mat *W, float *x, const float *y, const float *w, int K, const float *sh,
                                    const float *sh_logit, const float *norm_w, float *h, float eps, int64_t n_tok,
                                    int64_t n, void *xq, size_t xq_stride, void *stream) {
  if (n_tok <= 0) return;
  KArgs qa;
  int qkind;
  size_t extra;
  act_epilogue(xq && norm_w ? W : nullptr, &qa, &qkind, &extra);
  const int sqoff = norm_w && act2_on() ? sq_off(n, extra) : 0;
  pdl_launch(k_combine, dim3((unsigned)n_tok), dim3(COMB_THREADS), norm_smem(n, extra, sqoff), (cudaStream_t)stream, x,
             y, w, K, sh, sh_logit, norm_w, h, eps, (int)n, qa, qkind, (uint8_t *)xq, xq_stride, act2_on(), sqoff,
             cuda_rt_prew());
}

void mm_act_launch(const KArgs &a, int64_t nb, const float *X, int64_t ldx, uint8_t *xq, size_t xs, cudaStream_t st) {
  const int kind = act_kind(a);
  const int U = act_unit(a, kind);
  const int impl = act2_on();
  const int stage = a.cols <= ACT_STAGE_MAX;
  size_t smem = (size_t)(a.cols / U + (stage ? a.cols : 0)) * sizeof(float);
  int threads = ACT_THREADS;
  if (impl && kind != KACT_MLX) { /* a warp per 256-value chunk, no shared memory */
    const int64_t warps = (a.cols + 255) / 256;
    threads = warps < ACT_THREADS / 32 ? (int)warps * 32 : ACT_THREADS;
    smem = 0;
  }
  for (int64_t b = 0; b < nb; b += 65535) { /* grid x limit is 2^31, but keep launches modest */
    const int64_t n = nb - b < 65535 ? nb - b : 65535;
    pdl_launch(k_act, dim3((unsigned)n), dim3(threads), smem, st, a, kind, X + b * ldx, ldx, xq + (size_t)b * xs, xs,
               stage, impl);
  }
}
