/* floe_mat: a weight matrix in its file's own bytes, in any block format floe reads. The one
 * description of a weight that the loader fills and every backend's kernels read (the CPU's in
 * src/kernels/cpu, the GPU's copies in src/kernels/cuda), so it lives with the block formats. */
#ifndef FLOE_MAT_H
#define FLOE_MAT_H
#include <stddef.h>
#include <stdint.h>

#include "quant/quant.h"

/* A weight matrix: rows x cols, row-major, cols = the contiguous (ggml ne0) dimension. */
typedef struct floe_mat {
  uint32_t type;        /* FLOE_TYPE_* (incl. FLOE_TYPE_MLX) */
  int64_t rows, cols;
  const void *data;     /* row r at data + r * row_bytes */
  size_t row_bytes;
  /* MLX only */
  quant_mlx_fmt mlx;
  const void *scales, *biases; /* row r at + r * sb_row_bytes */
  size_t sb_row_bytes;
} floe_mat;
#endif
