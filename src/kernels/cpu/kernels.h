/* CPU kernels: matrix x vector and matrix x small batch, for every tensor type, with runtime ISA
 * dispatch (scalar reference / AVX2 / AVX-512). Same signatures for every ISA.
 *
 * Two activation paths:
 *  - exact float path (xq == NULL): each weight is dequantized exactly and multiplied by the float
 *    activation, float accumulation. Used for reference tests and F32/F16/BF16 models.
 *  - quantized-activation path: the activation row is first converted by kern_act_quantize() to
 *    8-bit blocks (format chosen per weight type, see kernels.c) and the dot products use integer
 *    units (AVX-512 VNNI / AVX2 maddubs). Faster, within ~1e-2 relative of the float path.
 * Row-exactness: for every path, row b of a batched call is bit-identical to the same row computed
 * alone (nb = 1): each row's accumulation sequence does not depend on nb.
 *
 * What is vectorised (kernels_avx2.c / kernels_avx512.c):
 *  - quantized path: Q8_0, Q4_0, IQ4_NL, MXFP4, Q4_K, Q5_K, Q6_K, IQ4_XS, MLX 4-bit and 8-bit (any
 *    group, F32/F16/BF16 scales) decode in SIMD registers; the result is bit-identical in every
 *    ISA (scalar = AVX2 = AVX-512: one canonical order of float operations, kernels_internal.h).
 *    Other types have no quantized path (kern_act_bytes() == 0): use the float path.
 *  - float path: F32/F16/BF16 are converted in registers; every block type (and MLX) is
 *    dequantized per 256-value chunk with the scalar reference (quant_dequant_row) into a small
 *    buffer that all nb activation rows then dot with SIMD FMAs. Within 1e-5 * sum|w x| of
 *    quant_dot_ref; not bit-identical across ISAs.
 * Weights are read once per 8 (AVX-512) / 4 (AVX2) activation rows; the AVX-512 quantized path
 * takes weight rows in pairs when nb <= 2, and prefetches 4 KiB ahead (FLOE_KPF=bytes overrides,
 * 0 disables). The AVX-512 ISA needs F/BW/VL/DQ/VNNI/VBMI and GFNI. */
#ifndef FLOE_KERNELS_H
#define FLOE_KERNELS_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#include "quant/mat.h"
#include "quant/quant.h"

enum floe_isa { FLOE_ISA_SCALAR = 0, FLOE_ISA_AVX2 = 1, FLOE_ISA_AVX512 = 2 };

/* Best ISA this CPU supports (or FLOE_ISA env override: scalar|avx2|avx512). */
int kern_isa_best(void);
/* Force the ISA used by the calls below (tests run each variant); returns previous. Refuses
 * (returns -1) an ISA the CPU lacks. */
int kern_isa_set(int isa);
int kern_isa_get(void);
const char *kern_isa_name(int isa);

/* Bytes of one quantized activation row for weight matrix W (the format depends on the weight
 * type, and for MLX on the group size); 0 when the type has no quantized-activation path (then
 * pass xq = NULL). kern_act_quantize writes one such row from cols floats. Which types have the
 * path: kern_act_bytes(W) != 0 (Q8_0, Q4_0, IQ4_NL, MXFP4, Q4_K, Q5_K, Q6_K, IQ4_XS, MLX 4/8-bit). */
size_t kern_act_bytes(const floe_mat *W);
void kern_act_quantize(const floe_mat *W, const float *x, void *xq);
/* nb rows at once: X rows ldx floats apart, xq rows xq_stride bytes apart. */
void kern_act_quantize_rows(const floe_mat *W, int nb, const float *X, int64_t ldx, void *xq, size_t xq_stride);

/* Y[b][r] = dot(W row r, X[b]) for b in [0,nb), r in [r0,r1). X rows are cols floats apart
 * (ldx), Y rows ldy floats apart. xq: nb quantized rows, xq_stride bytes apart, or NULL for the
 * exact float path. 1 <= nb <= 16. */
void kern_matmul(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                 float *Y, int64_t ldy, int64_t r0, int64_t r1);

/* The float path of the AVX-512 kernels (no activation quantization) in scalar C, one float
 * operation at a time in the kernel's order: bit-identical to kern_matmul(..., xq = NULL, ...) under
 * FLOE_ISA_AVX512, and the order the CUDA float path follows for F32/F16/BF16 weights. */
void kern_mm_float_lanes_ref(const floe_mat *W, int nb, const float *X, int64_t ldx, float *Y, int64_t ldy,
                             int64_t r0, int64_t r1);
/* kern_matmul for any number of activation rows nb >= 1 (prefill): the same values, bit for bit,
 * as kern_matmul on groups of at most 16 rows; the AVX-512 Q4_K/Q5_K kernel prepares each block of
 * 16 weight rows once for all nb rows, other paths run the rows in blocks of 64 (kept in L2) while
 * the activation rows pass in groups of 16. */
void kern_matmul_batch(const floe_mat *W, int64_t nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                       float *Y, int64_t ldy, int64_t r0, int64_t r1);

/* Q4_K / Q5_K weights with the rows in the lanes (floe_mat.k4_lanes), for the AVX-512 batched
 * kernel: it then reads each block of 16 rows as it lies instead of transposing it on every call,
 * so one activation row costs it about what the one-row kernel's does and each further row little
 * more (the transposes were its fixed cost). Every kernel gives the same values, bit for bit, as on
 * the file's layout; paths other than that kernel (another ISA, the float path) put each block
 * back in the file's layout first, slowly.
 * A lanes block (16 rows x one superblock, 16 x 144 / 176 bytes: the same bytes as the 16 rows'
 * superblock k in the file, stored where the rows' superblocks 0.. lie, superblock-major): vector c
 * (64 bytes) lane i = code dword c of row i (32 vectors); Q5_K: 8 vectors, lane i = qh dword m of
 * row i; then bytes 0-15 of each row's superblock by planes (the batched kernel decodes the 16
 * rows' scales at once): d of row i at 2 i, dmin at 32 + 2 i, scale byte j at 64 + 16 j + i.
 * kern_k4_lanes_ok: whether W can be packed (the AVX-512 ISA selected, Q4_K / Q5_K, cols % 256
 * == 0, at least 16 rows, not packed yet). kern_k4_lanes_pack: W->data (writable, == data) packed
 * in place, W->k4_lanes set. kern_k4_lanes_row: row r in the file's layout (W->row_bytes bytes). */
int kern_k4_lanes_ok(const floe_mat *W);
void kern_k4_lanes_pack(floe_mat *W, void *data);
void kern_k4_lanes_row(const floe_mat *W, int64_t r, void *out);

/* Whether kern_matmul_batch runs nb quantized activation rows (a few decode rows of several
 * requests) faster in one call than in calls of 1-2 rows: the kernel then decodes each weight row
 * once for all of them (AVX-512 Q4_K/Q5_K, nb 3..8, rows of at most 4096 columns). The values are
 * the same either way. */
int kern_rows_together(const floe_mat *W, int64_t nb);

/* kern_matmul over all W->rows rows, split across the pool's threads (rows aligned to 16).
 * Bit-identical to the single-threaded call. pool may be NULL (one thread). */
void kern_matmul_mt(floe_pool *pool, const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq,
                    size_t xq_stride, float *Y, int64_t ldy);
/* Quantize nb activation rows once (split across the pool) then run kern_matmul_mt with them.
 * xq_buf must hold nb * kern_act_bytes(W) bytes (64-byte aligned); for types without a quantized
 * path it is unused and the exact float path runs. */
void kern_matmul_q_mt(floe_pool *pool, const floe_mat *W, int nb, const float *X, int64_t ldx, void *xq_buf,
                      float *Y, int64_t ldy);
/* ---- attention rows (float; same bits on every ISA) ----
 * kern_dot16_rows: out[a * ldo + b] = dot of row a of A (lda floats apart, na rows) and row b of
 * B (B_bf16: bfloat16 rows, else float; ldb elements apart, nb rows), n elements, n % 16 == 0, in
 * the 16-lane order: lane i = fma(A[j+i], B[j+i], lane i) over j = 0, 16, 32, ... (fused: one
 * rounding per step), then the fixed tree reduce16 (kernels_internal.h). Attention scores.
 * kern_wsum_rows: O[h * ldo + i] = fma(W[h * ldw + p], V[p * ldv + i], O[h * ldo + i]) for
 * p = 0 .. np-1 in order, h < nh, i < n. Attention output (W: softmax weights, V: the value
 * cache, bfloat16 or float). */
void kern_dot16_rows(const float *A, int64_t lda, int na, const void *B, int B_bf16, int64_t ldb, int64_t nb,
                     int64_t n, float *out, int64_t ldo);
void kern_wsum_rows(const float *W, int64_t ldw, int nh, const void *V, int V_bf16, int64_t ldv, int64_t np,
                    int64_t n, float *O, int64_t ldo);
/* Index of the largest of x[0..n): the first one on ties, NaN never chosen, 0 when nothing is
 * larger than -inf (greedy sampling). */
int64_t kern_argmax(const float *x, int64_t n);
/* kern_argmax found by parts (say, each thread over the rows it computed): key(v, i) orders the
 * candidates by value, then by the lower index, and is 0 for a value that is never chosen (NaN,
 * -inf); -0 counts as +0. The largest key of the parts' best candidates names kern_argmax's
 * result over the whole (kern_argmax_key_index; 0 when every key is 0). Indices below 2^32 - 1. */
static inline uint64_t kern_argmax_key(float v, int64_t i) {
  if (!(v > -INFINITY)) return 0;
  if (v == 0.0f) v = 0.0f;
  uint32_t b;
  memcpy(&b, &v, 4);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((uint64_t)b << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)i);
}
static inline int64_t kern_argmax_key_index(uint64_t key) { return key ? (int64_t)(0xFFFFFFFFu - (uint32_t)key) : 0; }
/* Reads x[0..n) once, front to back, and returns the XOR of its 64-bit words (a trailing n % 8
 * bytes are zero-padded to a word): a pure read stream, for measuring the read bandwidth of a
 * buffer (floe_engine_read_bandwidth); the value only keeps the reads from being dropped. */
uint64_t kern_read_xor(const void *x, size_t n);
#endif
