/* Tensor element types and their block formats: the scalar reference (the oracle).
 *
 * Type ids are ggml's (so GGUF tensor infos map 1:1). Every block type has:
 *   - exact dequantization (same float32 operations, same order as ggml's reference, so the golden
 *     vectors in tests/fixtures/quant match bit for bit; this file is built with -ffp-contract=off),
 *   - a reference dot product with a float32 vector: dequantize each element exactly, multiply by
 *     x, accumulate in float in element order. Fast kernels (src/kernels/cpu) are tested against it,
 *   - a reference quantizer where floe needs one (conversion, synthetic models),
 *   - a random-block generator with sane magnitudes (synthetic models).
 * MLX affine quantization is not a ggml type: its codes, scales and biases live in three tensors,
 * so it has its own functions below (FLOE_TYPE_MLX is a floe-only pseudo id). */
#ifndef FLOE_QUANT_H
#define FLOE_QUANT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

enum floe_type {
  FLOE_TYPE_F32 = 0, FLOE_TYPE_F16 = 1, FLOE_TYPE_Q4_0 = 2, FLOE_TYPE_Q4_1 = 3,
  FLOE_TYPE_Q5_0 = 6, FLOE_TYPE_Q5_1 = 7, FLOE_TYPE_Q8_0 = 8, FLOE_TYPE_Q8_1 = 9,
  FLOE_TYPE_Q2_K = 10, FLOE_TYPE_Q3_K = 11, FLOE_TYPE_Q4_K = 12, FLOE_TYPE_Q5_K = 13,
  FLOE_TYPE_Q6_K = 14, FLOE_TYPE_Q8_K = 15, FLOE_TYPE_IQ2_XXS = 16, FLOE_TYPE_IQ2_XS = 17,
  FLOE_TYPE_IQ3_XXS = 18, FLOE_TYPE_IQ1_S = 19, FLOE_TYPE_IQ4_NL = 20, FLOE_TYPE_IQ3_S = 21,
  FLOE_TYPE_IQ2_S = 22, FLOE_TYPE_IQ4_XS = 23, FLOE_TYPE_I8 = 24, FLOE_TYPE_I16 = 25,
  FLOE_TYPE_I32 = 26, FLOE_TYPE_I64 = 27, FLOE_TYPE_F64 = 28, FLOE_TYPE_IQ1_M = 29,
  FLOE_TYPE_BF16 = 30, FLOE_TYPE_MXFP4 = 39,
  FLOE_TYPE_COUNT_GGML = 40,
  FLOE_TYPE_MLX = 100, /* MLX affine: codes + per-group scale/bias in separate tensors */
};

typedef struct floe_type_traits {
  const char *name;   /* ggml spelling: "f32", "q4_K", "iq2_xxs", "bf16" ... */
  int32_t blck;       /* elements per block (1 for plain types) */
  int32_t bytes;      /* bytes per block */
  bool quantized;     /* block-quantized (not a plain scalar type) */
  bool supported;     /* floe can dequantize it (tensor data type) */
} floe_type_traits;

/* Traits of a ggml type id, or NULL for ids floe does not know. */
const floe_type_traits *floe_type_info(uint32_t type);
/* Parse a type name, case-insensitive ("q4_k", "Q4_K", "iq4_xs", "f16"); -1 if unknown. */
int floe_type_from_name(const char *name);
/* Bytes of one row of n elements; 0 if n is not a multiple of the block size or type unknown. */
size_t floe_row_bytes(uint32_t type, int64_t n);

/* Exact dequantization of n elements (n a multiple of the block size). */
void quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);
/* Reference dot: sum over j in order of dequant(w)[j] * x[j], float accumulation. */
float quant_dot_ref(uint32_t type, const void *w, const float *x, int64_t n);
/* True if quant_quantize_row supports the type. */
bool quant_can_quantize(uint32_t type);
/* Quantize n floats into blocks (ggml's reference algorithm where stated; see quant.c).
 * imatrix may be NULL. Returns 0, or FLOE_E_UNSUPPORTED for types without a quantizer. */
int quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n, const float *imatrix);
/* Fill nblocks blocks of `type` with random but valid data whose dequantized values have a
 * standard deviation of about `scale` (and no NaN/Inf). Deterministic for the rng state. */
void quant_fill_random(uint32_t type, floe_rng *rng, void *dst, int64_t nblocks, float scale);

/* ---- MLX affine ----
 * w[o][i] = scales[o][i/group] * q[o][i] + biases[o][i/group]; q is `bits` wide, packed
 * LSB-first into little-endian uint32 words along the row (6-bit and 3-bit/5-bit codes straddle
 * words as a plain bit stream). scales/biases are F32, F16 or BF16 (sb_type). */
typedef struct quant_mlx_fmt { int bits; int group; uint32_t sb_type; } quant_mlx_fmt;
bool quant_mlx_fmt_valid(const quant_mlx_fmt *f);
size_t quant_mlx_row_bytes(const quant_mlx_fmt *f, int64_t n); /* bytes of the packed codes */
void quant_mlx_dequant_row(const quant_mlx_fmt *f, const void *q, const void *scales, const void *biases,
                           float *dst, int64_t n);
float quant_mlx_dot_ref(const quant_mlx_fmt *f, const void *q, const void *scales, const void *biases,
                        const float *x, int64_t n);
/* MLX quantizer (min/max per group, as mlx's quantize()). */
void quant_mlx_quantize_row(const quant_mlx_fmt *f, const float *src, void *q, void *scales, void *biases, int64_t n);
#endif
