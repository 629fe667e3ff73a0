/* Activation quantization on the GPU: the bytes of kern_act_quantize (src/kernels/cpu/kernels.c)
 * for every activation format (KACT_A32, KACT_A256, KACT_MLX; kernels_internal.h).
 *
 * One block per activation row. Pass 1: the absolute maximum of every scale unit (32-block,
 * superblock or MLX group; a maximum does not depend on the order it is taken in). Pass 2: every
 * output byte / field from its unit's maximum, with the CPU's operations: id = 127 / amax,
 * q = rint(x * id) clamped to +-127, d = amax / 127, both 0 when amax is 0. Padding bytes
 * between the layout's regions are not written (the CPU does not write them either). */
#include "kernels/cuda/mm_common.cuh"
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
  const float *x = stage ? s_dyn : X + (int64_t)blockIdx.x * ldx;
  uint8_t *o = xq + (size_t)blockIdx.x * xs;
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

} // namespace

void mm_act_launch(const KArgs &a, int64_t nb, const float *X, int64_t ldx, uint8_t *xq, size_t xs, cudaStream_t st) {
  const int kind = a.type == FLOE_TYPE_MLX ? KACT_MLX
                   : (a.type == FLOE_TYPE_Q4_K || a.type == FLOE_TYPE_Q5_K || a.type == FLOE_TYPE_Q6_K ||
                      a.type == FLOE_TYPE_IQ4_XS)
                       ? KACT_A256
                       : KACT_A32;
  const int U = kind == KACT_A32 ? 32 : kind == KACT_A256 ? 256 : a.group;
  const int stage = a.cols <= ACT_STAGE_MAX;
  const size_t smem = (size_t)(a.cols / U + (stage ? a.cols : 0)) * sizeof(float);
  for (int64_t b = 0; b < nb; b += 65535) { /* grid x limit is 2^31, but keep launches modest */
    const int64_t n = nb - b < 65535 ? nb - b : 65535;
    pdl_launch(k_act, dim3((unsigned)n), dim3(ACT_THREADS), (size_t)(smem), st, a, kind, X + b * ldx, ldx, xq + (size_t)b * xs, xs, stage);
  }
}
