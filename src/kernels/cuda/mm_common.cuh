/* Shared by the mm_*.cu files (not part of the API, cuda_mm.h): the kernel argument block, byte
 * loads, exact half / E8M0 conversions, the fixed reductions, the CPU's vexpf / SiLU, and the
 * per-file launch entry points that mm_api.cu dispatches to.
 *
 * Float rules: the files are compiled with --fmad=false, so every a * b + c below is a multiply
 * then an add, as on the CPU (-ffp-contract=off); divisions are IEEE (no fast math). */
#ifndef FLOE_MM_COMMON_CUH
#define FLOE_MM_COMMON_CUH
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* floe's C headers, with C linkage (the system headers above are included first, outside) */
extern "C" {
#include "base/base.h"
#include "kernels/cpu/kernels_internal.h"
#include "kernels/cuda/cuda_mm.h"
#include "quant/tables.h"
}
#include "base/vexp.h" /* floe_vexpf / floe_siluf: the CPU GLU's bits */

#define MM_FULL 0xffffffffu

/* Everything a kernel needs about one weight matrix (or expert stack) and its activation layout
 * (kact_layout_of of kernels_internal.h, computed on the host). */
struct KArgs {
  const uint8_t *data;
  size_t row_bytes;
  const uint8_t *sc, *bi; /* MLX scales / biases */
  size_t sb_row_bytes;
  int64_t rows, cols;
  int type, bits, group, sb_type;
  int n_expert;
  size_t estride, sb_estride;
  /* activation layout */
  int64_t nblk, nq;
  size_t off_d, off_s, off_c, off_e;
  /* the type's 16-entry value table (kvalues_iq4nl / kvalues_mxfp4) as 4 little-endian words:
   * kernel arguments live in the constant bank, so no per-file __constant__ copy is needed */
  uint32_t kv[4];
};

KArgs mm_kargs(const cuda_mat *W); /* mm_api.cu */

/* Where the few-row kernels write output row r of activation row b: a joined matrix's parts go to
 * their own buffers, rows [0, s1) to y[0] (ld[0]), [s1, s2) to y[1] - s1, [s2, rows) to y[2] - s2
 * (a plain matmul: s1 = s2 = rows). */
struct MMOut {
  float *y[4];
  int64_t ld[4];
  int64_t s1, s2, s3;
  /* not NULL (k_q16's MM_PLAIN launches of a whole matrix, cuda_mm_matmul_amax): each output row's
   * argmax keys too (amk.cuh), activation row b's at keys + b * CUDA_AMK_ROW */
  unsigned long long *keys;
};
/* a whole matrix's rows into Y (ldy apart) */
inline MMOut mm_out_all(float *Y, int64_t ldy, int64_t rows) {
  return MMOut{{Y, Y, Y, Y}, {ldy, ldy, ldy, ldy}, rows, rows, rows, nullptr};
}
__device__ __forceinline__ float *mm_out(const MMOut &o, int64_t b, int64_t r) {
  if (r < o.s1) return o.y[0] + b * o.ld[0] + r;
  if (r < o.s2) return o.y[1] + b * o.ld[1] + (r - o.s1);
  if (r < o.s3) return o.y[2] + b * o.ld[2] + (r - o.s2);
  return o.y[3] + b * o.ld[3] + (r - o.s3);
}
/* The few-row kernels (k_k4wn for Q4_K / Q5_K with quantized rows, k_plainn for F32 / F16 / BF16,
 * and for the parts of a joined matrix k_q16 for the other quantized types), when they take this call (cuda_mm_set_few on, 2 <= nb <= their maximum); false: not launched. */
bool mm_k4_few_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st);
/* the MoE down projection with its input quantization in the launch (mm_k4.cu): false where it
 * does not apply; then the caller quantizes (mm_act_launch) and launches the matmul */
bool mm_k4_down_qx_launch(const KArgs &a, int64_t ns, const int32_t *ids, const float *H, int64_t ldh, size_t xs,
                          float *Y, int64_t ldy, cudaStream_t st);
/* 1 when activation rows are quantized with act_row_warp (FLOE_CUDA_ACT2, mm_act.cu) */
int mm_act2_on(void);
bool mm_float_few_launch(const KArgs &a, int64_t nb, const float *X, int64_t ldx, const MMOut &o, cudaStream_t st);
/* k_q16's several-row launch for the other quantized types (Q8_0, Q6_K, ...; mm_q16.cu) */
bool mm_q16_few_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st);
/* mm_float.cu: cuda_mm_router_route's launch (0, or FLOE_E_UNSUPPORTED) */
int router_route_launch(const KArgs &a, const float *x, float *logits, int NE, int K, int norm_topk, int sh_id,
                        int32_t *sel, float *w, unsigned *ctr, cudaStream_t st);

/* MoE addressing: which x row and which expert a launch row (blockIdx.y) uses. */
enum { MM_PLAIN = 0, MM_GLU = 1, MM_DOWN = 2 };

/* ---- loads ---- */
__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) { return *(const uint32_t *)p; }
/* 4 bytes at a 2-byte aligned address */
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
  return (uint32_t)((const uint16_t *)p)[0] | ((uint32_t)((const uint16_t *)p)[1] << 16);
}
/* 4 bytes at any address */
__device__ __forceinline__ uint32_t ld_u32_a1(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* ---- exact conversions (base.c floe_f16_to_f32, quant kq_e8m0_half) ---- */
__device__ __forceinline__ float mm_f16(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24: exact */
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}
/* mm_f16 of both halves of w (lo: bits 0-15): the hardware conversion (exact for every finite
 * value and the infinities), NaNs built as mm_f16 builds them (their payload kept), by selects */
__device__ __forceinline__ void mm_f16x2(uint32_t w, float *lo, float *hi) {
  float a, b;
  asm("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;}"
      : "=f"(a), "=f"(b)
      : "r"(w));
  const uint32_t hl = w & 0xFFFFu, hh = w >> 16;
  const bool nl = (hl & 0x7C00u) == 0x7C00u && (hl & 0x3FFu), nh = (hh & 0x7C00u) == 0x7C00u && (hh & 0x3FFu);
  *lo = nl ? __uint_as_float(((hl & 0x8000u) << 16) | 0x7F800000u | ((hl & 0x3FFu) << 13)) : a;
  *hi = nh ? __uint_as_float(((hh & 0x8000u) << 16) | 0x7F800000u | ((hh & 0x3FFu) << 13)) : b;
}
__device__ __forceinline__ float mm_bf16(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ float mm_e8m0_half(uint32_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}
/* MLX scale / bias element j of a row of sb_type values */
__device__ __forceinline__ float mm_sb(int sb_type, const uint8_t *p, int64_t j) {
  if (sb_type == FLOE_TYPE_F32) return ((const float *)p)[j];
  const uint32_t h = ((const uint16_t *)p)[j];
  return sb_type == FLOE_TYPE_F16 ? mm_f16(h) : mm_bf16(h);
}

/* ---- integer dot products of 4 bytes (exact) ---- */
__device__ __forceinline__ int dp4(uint32_t a, uint32_t b, int c) { return __dp4a((int)a, (int)b, c); }
/* unsigned bytes of a times signed bytes of b */
__device__ __forceinline__ int dp4us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

/* ---- the CPU's reductions, over lanes of a warp (value of lane i = v[i]; result in lane 0) ---- */
/* kred16: a[i]=v[i]+v[i+8]; b[i]=a[i]+a[i+4]; c[i]=b[i]+b[i+2]; c[0]+c[1] */
__device__ __forceinline__ float warp_red16(float v) {
  v = v + __shfl_down_sync(MM_FULL, v, 8);
  v = v + __shfl_down_sync(MM_FULL, v, 4);
  v = v + __shfl_down_sync(MM_FULL, v, 2);
  return v + __shfl_down_sync(MM_FULL, v, 1);
}
/* kred8: a[i]=v[i]+v[i+4]; b[i]=a[i]+a[i+2]; b[0]+b[1] */
__device__ __forceinline__ float warp_red8(float v) {
  v = v + __shfl_down_sync(MM_FULL, v, 4);
  v = v + __shfl_down_sync(MM_FULL, v, 2);
  return v + __shfl_down_sync(MM_FULL, v, 1);
}

/* 4 bytes of 4-bit indices (each byte 0..15) -> 4 bytes of the table t[16] (4 words). */
__device__ __forceinline__ uint32_t lut16(uint32_t nib, const uint32_t *t) {
  const uint32_t x = nib & 0x07070707u, s1 = x | (x >> 4);
  const uint32_t sel = (s1 & 0xFFu) | ((s1 >> 8) & 0xFF00u);
  const uint32_t lo = __byte_perm(t[0], t[1], sel), hi = __byte_perm(t[2], t[3], sel);
  const uint32_t m = ((nib >> 3) & 0x01010101u) * 0xFFu;
  return (lo & ~m) | (hi & m);
}

/* ---- launch entry points per file ---- */
/* mm_q16.cu: the 16-lane types (Q8_0, Q4_0, IQ4_NL, MXFP4, Q6_K, IQ4_XS, MLX 4/8-bit);
 * mm_k4.cu: Q4_K, Q5_K. mode MM_PLAIN: Y rows for nb activation rows; MM_GLU: slots (grid y),
 * gate a / up a2, x row slot / K; MM_DOWN: slots, x row = slot. Return false for another type. */
bool mm_q16_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                   const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st);
/* true when k_q16 computes a's type (mm_q16_launch takes it) */
bool mm_q16_has_type(const KArgs &a);
/* k_q16's MM_PLAIN launch (one warp a weight row) with each activation row's argmax keys into keys
 * (MMOut.keys); false: not a k_q16 type */
bool mm_q16_amax_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, float *Y, int64_t ldy,
                        unsigned long long *keys, cudaStream_t st);
/* mm_q4l.cu: the same types as mm_q16.cu with 4 lanes per thread (mm_api.cu picks one per shape,
 * cuda_mm_set_q16_impl) */
bool mm_q4l_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                   const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st);
bool mm_k4_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                  const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st);
/* One token's routing (k_moe_route_warp's, from the router's logits; the shared expert's gate
 * logit at logits[ne] when sh_id >= 0) for the gate+up launch that routes (mm_k4_glu_route_launch):
 * sel / w receive the k (+ 1) slots as cuda_moe_route(_sh) writes them. */
struct KRoute {
  const float *logits;
  int ne, k, norm_topk, sh_id;
  int32_t *sel;
  float *w;
};
/* the MoE gate+up+GLU of one token with its routing in the launch (mm_k4.cu k_k4w_rt); false where
 * it does not apply (the caller routes, then launches gate+up) */
bool mm_k4_glu_route_launch(const KArgs &a, const KArgs &a2, const KRoute &rt, const uint8_t *xq, float *Y,
                            int64_t ldy, cudaStream_t st);
/* mm_mma.cu (the kernels: mm_mma.cuh): the tensor-core kernels (Q4_K / Q5_K, rows of at most 16
 * superblocks): prefill's matmuls (false: not taken, run another kernel) and the grouped MoE modes
 * (grp from cuda_mm_moe_group; mm_mma_fits tells beforehand whether a mode takes them) */
bool mm_mma_fits(const KArgs &a, int mode);
bool mm_mma_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st);
/* k_k4mn: Q4_K / Q5_K for a few activation rows (2..15; one with cuda_mm_set_one_mma) on the
 * tensor cores, the CPU's bits; false: not taken (another type, or switched off) */
bool mm_mma_few_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st);
bool mm_mma_moe_launch(const KArgs &a, const KArgs &a2, int mode, int64_t slots, int K, const void *grp,
                       const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st);
/* mm_float.cu: the float path (any type), same modes, X float rows ldx apart */
void mm_float_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                     const float *X, int64_t ldx, float *Y, int64_t ldy, cudaStream_t st);
void mm_dequant_launch(const KArgs &a, const int32_t *rows, int64_t n, float *out, int64_t ldo, cudaStream_t st);
/* mm_act.cu */
void mm_act_launch(const KArgs &a, int64_t nb, const float *X, int64_t ldx, uint8_t *xq, size_t xs, cudaStream_t st);

/* Q4_K / Q5_K: get_scale_min_k4 of sub-block j from a superblock's first 16 bytes h (d, dmin in
 * h.x; the 12 scale bytes in h.y (0-3), h.z (4-7), h.w (8-11)); no indexed array, which would
 * live in local memory */
__device__ __forceinline__ int k4_scale(const uint4 &h, int j) {
  const int b = 8 * (j & 3), y = (int)((h.y >> b) & 0xFF);
  return j < 4 ? y & 63 : (int)((h.w >> b) & 0xF) | ((y >> 6) << 4);
}
__device__ __forceinline__ int k4_min(const uint4 &h, int j) {
  const int b = 8 * (j & 3), z = (int)((h.z >> b) & 0xFF);
  return j < 4 ? z & 63 : (int)((h.w >> b) >> 4 & 0xF) | ((z >> 6) << 4);
}

/* Weight prefetch into L2 before a kernel's griddepcontrol.wait (pdl.cuh): the rows of a matrix do
 * not depend on the previous kernel, so their HBM reads may start while it still runs (mm_k4.cu
 * says where). mm_pf_on: FLOE_CUDA_PF / cuda_mm_set_pf (mm_k4.cu). n bytes from p by the 32 lanes
 * of a warp, a 128-byte line each at a time. */
int mm_pf_on(void);
int mm_few_on(void); /* cuda_mm_set_few / FLOE_CUDA_FEW (mm_k4.cu) */
/* x blocks for g4 needed and gy block rows with at most cap blocks resident at once (cuda_mm_set_pf's
 * test cap instead when set; g4 itself without prefetch or without a cap): the grid of kernels
 * whose blocks loop over their work so that every block prefetches before the wait (mm_k4.cu) */
unsigned mm_grid_capped(int64_t g4, unsigned gy, int cap);
/* blocks of kernel k (threads a block) resident at once on this GPU; -1 when it cannot be asked */
template <typename F>
int mm_resident_blocks(F k, int threads) {
  int dev = 0, nsm = 0, per = 0;
  if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, threads, 0) == cudaSuccess && nsm > 0 && per > 0)
    return nsm * per;
  return -1;
}
/* mm_grid_capped for kernel K (THREADS a block), its resident blocks asked once per kernel */
template <auto K, int THREADS = 128>
unsigned mm_grid_of(int64_t g4, unsigned gy) {
  static int cap = 0; /* per kernel */
  if (!cap) cap = mm_resident_blocks(K, THREADS);
  return mm_grid_capped(g4, gy, cap);
}
/* the integer value of environment variable name, dflt when it is unset or empty */
static inline int mm_env_int(const char *name, int dflt) {
  const char *e = getenv(name);
  return e && e[0] ? atoi(e) : dflt;
}
__device__ __forceinline__ void mm_pf_l2(const uint8_t *p, size_t n, int lane) {
  for (size_t o = (size_t)lane * 128; o < n; o += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

/* Weight row r of expert e (bounds checked by the caller) */
__device__ __forceinline__ const uint8_t *mm_row(const KArgs &a, int e, int64_t r) {
  return a.data + (size_t)e * a.estride + (size_t)r * a.row_bytes;
}
#endif
