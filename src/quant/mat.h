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
  /* CPU, AVX-512, Q4_K / Q5_K only (kern_k4_lanes_pack): rows [0, rows & ~15) are stored as blocks
   * of 16 rows with the rows in the lanes (kernels.h); rows past them keep the file's layout. 0: the
   * file's own bytes. A backend that copies the file's rows (the GPU's) never sees such a matrix. */
  int k4_lanes;
  /* MLX only */
  quant_mlx_fmt mlx;
  const void *scales, *biases; /* row r at + r * sb_row_bytes */
  size_t sb_row_bytes;
} floe_mat;
#endif
