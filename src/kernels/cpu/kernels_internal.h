/* Internals shared by kernels.c (dispatch, scalar reference, activation quantization) and the ISA
 * files kernels_avx2.c / kernels_avx512.c. Not part of the kernels API.
 *
 * ---- The quantized-activation path: one canonical computation, three implementations ----
 * Every ISA computes exactly the same float operations in the same order, so the scalar code in
 * kernels.c is bit-for-bit the AVX2 and AVX-512 result. The model ("16-lane model"):
 *
 *   per output (weight row r, activation row b):
 *     float acc[16] = 0     (lane accumulators)
 *     float extra  = 0      (min / offset / bias terms, see per type)
 *     for each "step" (a run of 64 or 128 weights, see per type):
 *        int32 L[16]  exact integer lane sums (any SIMD grouping gives the same integers)
 *        float S[16]  lane scales (weight scale * activation scale, one float multiply)
 *        acc[i] = acc[i] + (float)L[i] * S[i]      (a multiply then an add, no FMA)
 *     y = reduce16(acc) + extra
 *   reduce16: a[i]=v[i]+v[i+8] (i<8); b[i]=a[i]+a[i+4] (i<4); c[i]=b[i]+b[i+2] (i<2); c[0]+c[1].
 * Lanes a step does not cover (an odd last block, a partial last MLX chunk) are left untouched.
 * Because each (r, b) pair runs its own copy of this sequence, the batched kernels are
 * row-exact: row b of a call with nb rows is bit-identical to a call with nb = 1.
 *
 * Activation formats (one quantized row per activation row; xq rows xq_stride bytes apart):
 *   KACT_A32  (Q8_0, Q4_0, IQ4_NL, MXFP4): per 32 values: int8 q[32] (natural order), float d.
 *             Layout: q[nblk*32] | d[nblk] | dexp[nblk*8] (each d 8 times, for SIMD loads).
 *   KACT_A256 (Q4_K, Q5_K, Q6_K, IQ4_XS): per 256 values: int8 q[256] in the weight type's decode
 *             order (kact_perm256), float d, int16 bsum[16] (sums of q over natural 16-runs).
 *             Layout: q[nsb*256] | d[nsb] | bsum[nsb*16].
 *   KACT_MLX  (MLX 4-bit and 8-bit): per group g: float d, float s = d * (sum of the group's
 *             quantized x), for the bias term; q in chunks of 128 values, zero
 *             padded; 4-bit chunks hold the even-indexed values then the odd-indexed ones (a code
 *             byte holds an even element in its low nibble, the next odd one in its high nibble).
 *             negcorr[16] per step: -(2^(bits-1)) * (sum of the lane's x values), so a lane
 *             starting from negcorr sums (code - 2^(bits-1)) * x: centring the codes keeps the
 *             float error proportional to |w| (uncentred 8-bit codes lose ~2 digits to the bias).
 *             dlane[16] per step: the d of each lane's group (a lane-scale vector load).
 *             Layout: q[nch*128] | d[ng] | s[ng] | negcorr[nsteps*16] (int32) | dlane[nsteps*16].
 *   Quantization: d = amax/127, q = round-to-nearest-even(x * (127/amax)), 0 when amax == 0.
 *
 * Per type, one step and its lanes ("4 products" = the 4 consecutive bytes of a dword lane):
 *   A32 types: a step is two blocks 2k, 2k+1; lanes 0-7 = block 2k (lane i: elements 4i..4i+3),
 *     lanes 8-15 = block 2k+1; L = sum of the 4 products w*x with w the signed decoded value
 *     (Q8_0 qs, Q4_0 nib-8, IQ4_NL kvalues, MXFP4 kvalues_mxfp4); S = dw*dx of the lane's block
 *     (MXFP4 dw = 2^(e-128)). extra = 0.
 *   Q4_K/Q5_K ("superblock model", replaces the 16-lane model for these two types): per output
 *     float acc[16] = 0; for each superblock k, two exact integers
 *       S1 = sum over the 256 positions of w*x*sc (u8 codes 0..15 / 0..31, int8 x, the 6-bit scale
 *            of the position's sub-block; |S1| < 2^26),
 *       S2 = sum_j m[j]*(bsum[2j] + bsum[2j+1]),
 *     then dd = d*dx, dm = dmin*dx (one float multiply each), t = (float)S1*dd - (float)S2*dm
 *     (two multiplies then a subtraction), acc[k % 16] = acc[k % 16] + t; y = reduce16(acc).
 *     A vector kernel may add t = +0 for padding superblocks: a slot starts at +0 and a sum is -0
 *     only when both addends are, so a slot is never -0 and slot + 0 = slot exactly. Any SIMD
 *     grouping gives the same S1, S2, so the batched kernel can put weight rows in the lanes (one
 *     output per lane, no reduction across lanes) and the one-row kernel can reduce 4
 *     superblocks at once (kq4_term below). Why: the 16-lane model cost every output a 16-lane
 *     cvt + multiply + add per superblock, which capped the batched kernel at ~35 % of VNNI peak.
 *     Activation order per 128: natural 32-runs 0,2,1,3 (xq position p: 32-run t = p/32 holds
 *     natural sub-block kperm_q4k[t]); the order does not change S1.
 *   Q6_K: natural order, D[s][i] = the 4-sum at positions 64s+4i..64s+4i+3, sc(s,i) =
 *     sc[4s+i/4], q = 0..63 (the -32 is taken out). Packed lanes (the vpackssdw + vpdpwssd order):
 *     lane 4j+t = sum over p = 0,1 of sc(a,i0) * (D[a][i0] + D[a][i0+1]), a = 2p + (t >= 2),
 *     i0 = 4j + 2(t%2); S = d*dx. Mins: 8 more lanes M[j] = 32*(sc[2j]*bsum[2j] +
 *     sc[2j+1]*bsum[2j+1]), macc[j] = macc[j] + (float)M[j] * S; extra = -reduce8(macc)
 *     (reduce8: a[i]=v[i]+v[i+4], b[i]=a[i]+a[i+2], b[0]+b[1]).
 *   IQ4_XS: activation order per 128: the first 16 of sub-blocks 0..3, then their last 16.
 *     Lane i, step s: positions 64s+4i..; sub-block 4*(s/2) + i/4; L[i] = sum_s (ls-32)*sum4(kv*x).
 *     S = d*dx, extra = 0.
 *   MLX 4-bit: a step is one chunk of 128 values (64 code bytes); lane i = the 4 code bytes
 *     4i..4i+3 of the chunk, both nibbles: L[i] = negcorr[i] + sum4(lo*x_even) + sum4(hi*x_odd);
 *     8-bit: a step is a chunk of 64 values, lane i = values 4i..4i+3. S[i] = scale_g * dx_g of
 *     the lane's group. Bias, with the centring offset o = 2^(bits-1) folded in:
 *     bacc[g mod 16] = bacc[g mod 16] + (bias_g + o*scale_g) * s_g over groups in order;
 *     extra = reduce16(bacc).
 */
#ifndef FLOE_KERNELS_INTERNAL_H
#define FLOE_KERNELS_INTERNAL_H
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "quant/tables.h"

/* Float path: rows are dequantized in chunks of this many values (a multiple of every block and
 * MLX group size), then dotted with every activation row. */
#define KERN_CHUNK 256
void kern_dequant_chunk(const floe_mat *W, int64_t r, int64_t j0, int64_t n, float *buf);

enum { KACT_NONE = 0, KACT_A32 = 1, KACT_A256 = 2, KACT_MLX = 3 };

/* Byte layout of one quantized activation row. */
typedef struct kact_layout {
  int kind;          /* KACT_* */
  int64_t nblk;      /* scale blocks: 32-blocks, superblocks or MLX groups */
  int64_t nq;        /* int8 values stored (padded to whole chunks for MLX) */
  size_t off_d;      /* float d[nblk] */
  size_t off_s;      /* A32: float dexp[nblk*8] (d repeated 8x, a lane-scale vector load);
                        A256: int16 bsum[nblk*16]; MLX: float s[nblk] */
  size_t off_c;      /* MLX: int32 negcorr[nq/step*16] */
  size_t off_e;      /* MLX: float dlane[nq/step*16], the d of each lane's group (0 past the end) */
  size_t bytes;
} kact_layout;

static inline size_t kact_round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Layout for weight matrix W; kind = KACT_NONE if the type has no quantized path. */
static inline kact_layout kact_layout_of(const floe_mat *W) {
  kact_layout L = {0};
  int64_t n = W->cols;
  switch (W->type) {
    case FLOE_TYPE_Q8_0: case FLOE_TYPE_Q4_0: case FLOE_TYPE_IQ4_NL: case FLOE_TYPE_MXFP4:
      if (n % 32) return L;
      L.kind = KACT_A32; L.nblk = n / 32; L.nq = n;
      L.off_d = kact_round64((size_t)n);
      L.off_s = L.off_d + kact_round64((size_t)L.nblk * 4);
      L.bytes = L.off_s + kact_round64((size_t)L.nblk * 32);
      return L;
    case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K: case FLOE_TYPE_Q6_K: case FLOE_TYPE_IQ4_XS:
      if (n % 256) return L;
      L.kind = KACT_A256; L.nblk = n / 256; L.nq = n;
      L.off_d = kact_round64((size_t)n);
      L.off_s = L.off_d + kact_round64((size_t)L.nblk * 4);
      L.bytes = L.off_s + kact_round64((size_t)L.nblk * 32);
      return L;
    case FLOE_TYPE_MLX:
      if ((W->mlx.bits != 4 && W->mlx.bits != 8) || !quant_mlx_fmt_valid(&W->mlx) || n % W->mlx.group)
        return L;
      L.kind = KACT_MLX; L.nblk = n / W->mlx.group; L.nq = (n + 127) / 128 * 128;
      L.off_d = kact_round64((size_t)L.nq);
      L.off_s = L.off_d + kact_round64((size_t)L.nblk * 4);
      L.off_c = L.off_s + kact_round64((size_t)L.nblk * 4);
      L.off_e = L.off_c + (size_t)(L.nq / (W->mlx.bits == 4 ? 128 : 64)) * 64;
      L.bytes = L.off_e + (size_t)(L.nq / (W->mlx.bits == 4 ? 128 : 64)) * 64;
      return L;
    default:
      return L;
  }
}

/* Q4_K/Q5_K activation order: 32-run t of each superblock holds natural sub-block kperm_q4k[t]. */
static const int kperm_q4k[8] = {0, 2, 1, 3, 4, 6, 5, 7};

/* Natural index (within a 256 superblock) of activation position p, per A256 type. */
static inline int kact_perm256(uint32_t type, int p) {
  switch (type) {
    case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K:
      return kperm_q4k[p / 32] * 32 + p % 32;
    case FLOE_TYPE_IQ4_XS: {
      int h = p / 128, r = p % 128;        /* half of the superblock */
      int hi = r / 64, k = (r % 64) / 16;  /* first/last 16, sub-block within the half */
      return h * 128 + k * 32 + hi * 16 + r % 16;
    }
    default:
      return p;
  }
}

/* Q4_K / Q5_K 6-bit scales and mins of a superblock (ggml get_scale_min_k4). */
static inline void kq_scales_k4(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
  for (int j = 0; j < 4; j++) {
    sc[j] = q[j] & 63;
    m[j] = q[j + 4] & 63;
  }
  for (int j = 4; j < 8; j++) {
    sc[j] = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/* Q4_K/Q5_K superblock model: one superblock's term. */
static inline float kq4_term(int32_t S1, int32_t S2, float d, float dmin, float dx) {
  const float dd = d * dx, dm = dmin * dx;
  return (float)S1 * dd - (float)S2 * dm;
}

/* IQ4_XS signed sub-block scales ls - 32. */
static inline void kq_scales_iq4xs(const uint8_t *b, int8_t ls[8]) {
  uint16_t sh;
  memcpy(&sh, b + 2, 2);
  for (int ib = 0; ib < 8; ib++) {
    int l = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
    ls[ib] = (int8_t)(l - 32);
  }
}

static inline float kq_f16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return floe_f16_to_f32(h);
}

/* E8M0 -> 2^(e-128) (MXFP4 block scale; kvalues_mxfp4 holds doubled values). */
static inline float kq_e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* MLX scale/bias element j of a row of sb_type values. */
static inline float kq_sb(uint32_t sb_type, const void *p, int64_t j) {
  if (sb_type == FLOE_TYPE_F32) {
    float f;
    memcpy(&f, (const uint8_t *)p + 4 * j, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const uint8_t *)p + 2 * j, 2);
  return sb_type == FLOE_TYPE_F16 ? floe_f16_to_f32(h) : floe_bf16_to_f32(h);
}

static inline float kred8(const float v[8]) {
  float a[4], b[2];
  for (int i = 0; i < 4; i++) a[i] = v[i] + v[i + 4];
  for (int i = 0; i < 2; i++) b[i] = a[i] + a[i + 2];
  return b[0] + b[1];
}

/* Q4_K/Q5_K 6-bit scales and mins (ggml get_scale_min_k4) of two superblocks at once (ISA files
 * only). raw: bytes 0-15 of superblock A in the low 128-bit lane, of B in the high one ([d, dmin]
 * f16, then the 12 scale bytes q[0..11]). Result, per lane: bytes 0-7 sc[0..7], bytes 8-15 m[0..7].
 *   sc[j<4] = q[j]&63   sc[j>=4] = (q[j+4]&15) | (q[j-4]>>6)<<4
 *   m[j<4]  = q[j+4]&63 m[j>=4]  = (q[j+4]>>4) | (q[j]>>6)<<4 */
#ifdef __AVX2__
#include <immintrin.h>
static inline __m256i kq4_scm2(__m256i raw) {
  const __m256i P = _mm256_shuffle_epi8(raw, _mm256_broadcastsi128_si256(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)));
  const __m256i H = _mm256_shuffle_epi8(raw, _mm256_broadcastsi128_si256(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11)));
  const __m256i lowA = _mm256_and_si256(P, _mm256_broadcastsi128_si256(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)));
  const __m256i lowB = _mm256_and_si256(_mm256_srli_epi16(P, 4), _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
  return _mm256_or_si256(_mm256_or_si256(lowA, lowB), _mm256_and_si256(_mm256_srli_epi16(H, 2), _mm256_set1_epi8(0x30)));
}
#endif

/* IQ4_XS scales ls - 32 as 8 bytes of a 64-bit word, with BMI2 pdep (ISA files only). */
#ifdef __BMI2__
#include <immintrin.h>
static inline uint64_t kq_scales_iq4xs_u64(const uint8_t *b) {
  uint16_t sh;
  uint32_t sl;
  memcpy(&sh, b + 2, 2);
  memcpy(&sl, b + 4, 4);
  uint64_t v = _pdep_u64(sl, 0x0F0F0F0F0F0F0F0Full) | _pdep_u64(sh, 0x3030303030303030ull);
  /* bytewise v - 32 (each byte 0..63): borrow-free via the 0x80 bit */
  return ((v | 0x8080808080808080ull) - 0x2020202020202020ull) ^ 0x8080808080808080ull;
}
#endif

/* The fixed 16-lane reduction every ISA uses. */
static inline float kred16(const float v[16]) {
  float a[8], b[4], c[2];
  for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; i++) c[i] = b[i] + b[i + 2];
  return c[0] + c[1];
}

/* Kernel entry points per ISA (same signature as kern_matmul, nb <= 16). */
typedef void (*kern_mm_fn)(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq,
                           size_t xq_stride, float *Y, int64_t ldy, int64_t r0, int64_t r1);
void kern_mm_float_avx2(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq,
                        size_t xq_stride, float *Y, int64_t ldy, int64_t r0, int64_t r1);
void kern_mm_q_avx2(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq,
                    size_t xq_stride, float *Y, int64_t ldy, int64_t r0, int64_t r1);
void kern_mm_float_avx512(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq,
                          size_t xq_stride, float *Y, int64_t ldy, int64_t r0, int64_t r1);
void kern_mm_q_avx512(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq,
                      size_t xq_stride, float *Y, int64_t ldy, int64_t r0, int64_t r1);

/* The body of kern_mm_q_<isa>: the per-type switch over the ISA file's static run_<type>
 * functions (one signature: W, layout, nb, xq, xs, Y, ldy, r0, r1). Each ISA file defines
 * run_q8_0 ... run_mlx8 its own way and expands this once, so the set of types with a quantized
 * path is written in one place. */
#define KERN_DEF_MM_Q(fname)                                                                          \
  void fname(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq_, size_t xs,     \
             float *Y, int64_t ldy, int64_t r0, int64_t r1) {                                         \
    (void)X;                                                                                          \
    (void)ldx;                                                                                        \
    kact_layout L = kact_layout_of(W);                                                                \
    const uint8_t *xq = xq_;                                                                          \
    switch (W->type) {                                                                                \
      case FLOE_TYPE_Q8_0: run_q8_0(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                        \
      case FLOE_TYPE_Q4_0: run_q4_0(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                        \
      case FLOE_TYPE_IQ4_NL: run_iq4_nl(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                    \
      case FLOE_TYPE_MXFP4: run_mxfp4(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                      \
      case FLOE_TYPE_Q4_K: run_q4_k(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                        \
      case FLOE_TYPE_Q5_K: run_q5_k(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                        \
      case FLOE_TYPE_Q6_K: run_q6_k(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                        \
      case FLOE_TYPE_IQ4_XS: run_iq4_xs(W, &L, nb, xq, xs, Y, ldy, r0, r1); break;                    \
      case FLOE_TYPE_MLX:                                                                             \
        if (W->mlx.bits == 4) run_mlx4(W, &L, nb, xq, xs, Y, ldy, r0, r1);                           \
        else run_mlx8(W, &L, nb, xq, xs, Y, ldy, r0, r1);                                             \
        break;                                                                                        \
      default: FLOE_ASSERT(!"no quantized path for this type");                                      \
    }                                                                                                 \
  }

/* kernels_gemm_avx512.c: Q4_K/Q5_K with several activation rows (any nb >= 1; kern_matmul sends
 * nb >= KGEMM_MIN_NB, kern_matmul_batch every nb), same results as kern_mm_q_avx512 bit for bit;
 * kern_gemm_avx512_supports(W) says whether W's type/shape is handled (and FLOE_GEMM=0 is not set). */
#define KGEMM_MIN_NB 3 /* bench_gemm: the batched kernel wins from 3 rows (2 is a tie) */
int kern_gemm_avx512_supports(const floe_mat *W);
/* Q4_K/Q5_K rows of at most K4_DEC_MAX superblocks with 3..K4_DEC_NB_MAX activation rows run the
 * one-row kernel's decode-once form (kernels_avx512.c k4_multi) instead of the batched kernel:
 * out of cache it is faster at every such nb (bench_matvec q4_K 8192x2048, 2 threads, loaded
 * machine: nb 4 2.4 vs 4.2-4.4 ms, nb 8 3.6-3.7 vs 4.6-6.1 ms; in cache nb 8 is 100 vs 86 us, but
 * a few decode rows of several requests stream their weights from memory). Two rows stay with the
 * one-row kernel run per row: in the decode of the 35B-A3B shape on a quiet machine the output
 * matrix took 10.2 ms that way and 14.0 decoded once (bench_multi, 2 sessions). */
#define K4_DEC_MAX 16
#define K4_DEC_NB_MAX 8
static inline int k4_dec_fits(const floe_mat *W, int64_t nb) {
  return (W->type == FLOE_TYPE_Q4_K || W->type == FLOE_TYPE_Q5_K) && nb >= 3 && nb <= K4_DEC_NB_MAX &&
         W->cols % 256 == 0 && W->cols / 256 <= K4_DEC_MAX;
}
/* kern_matmul / kern_matmul_batch take the batched kernel (with xq, AVX-512) */
static inline int kgemm_wants(const floe_mat *W, int64_t nb) {
  return nb >= KGEMM_MIN_NB && !k4_dec_fits(W, nb) && kern_gemm_avx512_supports(W);
}
void kern_gemm_q_avx512(const floe_mat *W, int64_t nb, const void *xq, size_t xq_stride, float *Y, int64_t ldy, int64_t r0,
                        int64_t r1);

/* kernels.c act_q8 (n % 16 == 0), bit-identical, AVX-512 */
float kern_act_q8_avx512(const float *x, int n, int8_t *q);
/* kernels.c kern_act_quantize for MLX 4/8-bit weights, bit-identical, AVX-512: values [c0, c1) of
 * the padded row, c0 and c1 multiples of max(group, step) (or c1 = nq) */
void kern_act_mlx_avx512(const floe_mat *W, const float *x, void *xq, int64_t c0, int64_t c1);

/* kernels.h kern_dot16_rows / kern_wsum_rows, bit-identical, AVX-512 (kernels_attn_avx512.c);
 * kern_dot16_rows_ref / kern_wsum_rows_ref are the scalar references in kernels.c */
void kern_dot16_rows_avx512(const float *A, int64_t lda, int na, const void *B, int B_bf16, int64_t ldb, int64_t nb,
                            int64_t n, float *out, int64_t ldo);
void kern_wsum_rows_avx512(const float *W, int64_t ldw, int nh, const void *V, int V_bf16, int64_t ldv, int64_t np,
                           int64_t n, float *O, int64_t ldo);
void kern_dot16_rows_ref(const float *A, int64_t lda, int na, const void *B, int B_bf16, int64_t ldb, int64_t nb,
                         int64_t n, float *out, int64_t ldo);
void kern_wsum_rows_ref(const float *W, int64_t ldw, int nh, const void *V, int V_bf16, int64_t ldv, int64_t np,
                        int64_t n, float *O, int64_t ldo);

/* kernels.h kern_argmax: the sequential reference (kernels.c) and AVX-512 (kernels_misc_avx512.c) */
int64_t kern_argmax_ref(const float *x, int64_t n);
int64_t kern_argmax_avx512(const float *x, int64_t n);
/* kernels.h kern_read_xor: the word loop (kernels.c) and AVX-512 (kernels_misc_avx512.c) */
uint64_t kern_read_xor_ref(const void *x, size_t n);
uint64_t kern_read_xor_avx512(const void *x, size_t n);

/* Pointers of a weight row and its MLX scales/biases. */
static inline const uint8_t *kw_row(const floe_mat *W, int64_t r) {
  return (const uint8_t *)W->data + (size_t)r * W->row_bytes;
}
#endif
