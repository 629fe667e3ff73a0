/* Token embedding rows and greedy argmax on the GPU (cuda_ops.h).
 *   k_embed: block per token, a thread per element; dequantization with quant_dequant_row's
 *     operations (src/quant/quant.c: Q8_0 q*d; Q4_K (d*sc)*q - dmin*m; Q6_K (d*sc)*q), so rows are
 *     bit-identical. Other types go to the matmul helper's row dequant (cuda_embed_check says).
 *   k_argmax: each block the largest kern_argmax_key of its share, the last block to finish the
 *     largest of those (a counter in scratch it resets): kern_argmax's index.
 *   k_step_next, k_tab_swap: a step run ahead takes its token from the step before (its argmax),
 *     and its acceptance swaps the state table's cells in stream order (no host copy, no wait). */
#include <cuda_fp16.h>

extern "C" {
#include "base/base.h"
#include "quant/quant.h"
}
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/amk.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/pdl.cuh"

extern "C" int cuda_embed_check(uint32_t type, int64_t n_embd, char *err, size_t errlen) {
  int blck = 0;
  switch (type) {
  case FLOE_TYPE_F32: case FLOE_TYPE_F16: case FLOE_TYPE_BF16: blck = 1; break;
  case FLOE_TYPE_Q8_0: blck = 32; break;
  case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q6_K: blck = 256; break;
  default: return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "cuda embedding: type %u not handled here", type);
  }
  if (n_embd <= 0 || n_embd % blck)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda embedding: %lld elements per row", (long long)n_embd);
  return 0;
}

static __global__ void k_embed(uint32_t type, const uint8_t *data, size_t row_bytes, int64_t n_vocab, int64_t n_embd,
                               const int32_t *tokens, float *out) {
  PDL_ENTER();
  const int64_t t = blockIdx.x;
  const int32_t tok = tokens[t];
  const bool ok = tok >= 0 && tok < n_vocab;
  const uint8_t *row = data + (size_t)(ok ? tok : 0) * row_bytes;
  for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x)
    out[t * n_embd + i] = ok ? embed_elem(type, row, i) : __int_as_float(0x7fc00000);
}

extern "C" void cuda_embed_rows(uint32_t type, const void *data, size_t row_bytes, int64_t n_vocab, int64_t n_embd,
                                const int32_t *tokens, int64_t n_tok, float *out, void *stream) {
  if (n_tok <= 0) return;
  pdl_launch(k_embed, dim3((unsigned)n_tok), dim3(256), (size_t)(0), OPS_STREAM(stream), type, (const uint8_t *)data, row_bytes, n_vocab, n_embd,
                                                           tokens, out);
}

/* ---- argmax ---- */
#define AMAX_THREADS 256
#define AMAX_PER_BLOCK 4096
#define AMAX_MAX_BLOCKS 1024

static int amax_blocks(int64_t n) {
  int64_t b = (n + AMAX_PER_BLOCK - 1) / AMAX_PER_BLOCK;
  if (b < 1) b = 1;
  return (int)(b < AMAX_MAX_BLOCKS ? b : AMAX_MAX_BLOCKS);
}

extern "C" size_t cuda_argmax_scratch_bytes(int64_t n) { return (size_t)amax_blocks(n) * 8 + 8; }

static __device__ __forceinline__ unsigned long long block_max_u64(unsigned long long k) {
  __shared__ unsigned long long wk[AMAX_THREADS / 32];
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, k, s);
    k = o > k ? o : k;
  }
  if ((threadIdx.x & 31) == 0) wk[threadIdx.x >> 5] = k;
  __syncthreads();
  k = 0;
  for (int w = 0; w < AMAX_THREADS / 32; w++) k = wk[w] > k ? wk[w] : k;
  __syncthreads();
  return k;
}

/* row blockIdx.y of x (rows ld apart) in its own region of the scratch, gridDim.x + 1 8-byte words
 * from word row * (gridDim.x + 1): the counter, then its blocks' maxima (row 0's region is a
 * one-row launch's: the layouts share the scratch) */
static __global__ void __launch_bounds__(AMAX_THREADS)
    k_argmax(const float *x, int64_t ld, int64_t n, int32_t *out, unsigned long long *scr, int32_t *out_h) {
  PDL_ENTER();
  __shared__ bool last;
  const int row = blockIdx.y;
  x += (int64_t)row * ld;
  unsigned int *cnt = (unsigned int *)(scr + (int64_t)row * (gridDim.x + 1));
  unsigned long long *part = scr + (int64_t)row * (gridDim.x + 1) + 1;
  unsigned long long best = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const unsigned long long k = amax_key(x[i], (uint32_t)i);
    best = k > best ? k : best;
  }
  best = block_max_u64(best);
  if (threadIdx.x == 0) {
    part[blockIdx.x] = best;
    __threadfence();
    last = atomicAdd(cnt, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  best = 0;
  for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
    const unsigned long long k = __ldcg(part + b);
    best = k > best ? k : best;
  }
  best = block_max_u64(best);
  if (threadIdx.x == 0) {
    const int32_t v = best ? (int32_t)(0xFFFFFFFFu - (uint32_t)best) : 0;
    out[row] = v;
    if (out_h) { /* pinned host memory: read after the host synchronizes with the stream */
      out_h[row] = v;
      __threadfence_system();
    }
    *cnt = 0;
  }
}

extern "C" size_t cuda_argmax_rows_scratch_bytes(int64_t n, int rows) {
  return (size_t)(rows > 1 ? rows : 1) * ((size_t)amax_blocks(n) * 8 + 8);
}

/* out_h: the picks also into pinned host memory (its device address), or NULL */
static void argmax_launch(const float *x, int64_t ld, int64_t n, int rows, int32_t *out, int32_t *out_h, void *scratch,
                          void *stream) {
  if (n <= 0 || rows <= 0) return;
  pdl_launch(k_argmax, dim3(amax_blocks(n), rows), dim3(AMAX_THREADS), (size_t)(0), OPS_STREAM(stream), x, ld, n, out,
             (unsigned long long *)scratch, out_h);
}

extern "C" void cuda_argmax_rows(const float *x, int64_t ld, int64_t n, int rows, int32_t *out, void *scratch,
                                 void *stream) {
  argmax_launch(x, ld, n, rows, out, NULL, scratch, stream);
}

extern "C" void cuda_argmax(const float *x, int64_t n, int32_t *out, void *scratch, void *stream) {
  cuda_argmax_rows(x, n, n, 1, out, scratch, stream);
}

extern "C" void cuda_argmax_to(const float *x, int64_t n, int32_t *out, int32_t *out_h, void *scratch, void *stream) {
  argmax_launch(x, n, n, 1, out, out_h, scratch, stream);
}

static __global__ void k_amk_tokens(const unsigned long long *keys, int32_t *out) {
  PDL_ENTER();
  const int32_t t = amk_token(keys + (size_t)blockIdx.x * CUDA_AMK_ROW);
  if (threadIdx.x == 0) out[blockIdx.x] = t;
}

extern "C" void cuda_amk_tokens(const unsigned long long *keys, int rows, int32_t *out, void *stream) {
  if (rows <= 0) return;
  pdl_launch(k_amk_tokens, dim3((unsigned)rows), dim3(32), (size_t)0, OPS_STREAM(stream), keys, out);
}

static __global__ void k_step_next(const int32_t *pick, int32_t *tok, int32_t *pos) {
  PDL_ENTER();
  if (threadIdx.x == 0) {
    tok[0] = pick[0];
    pos[0] = pos[0] + 1;
  }
}

extern "C" void cuda_step_next(const int32_t *pick, int32_t *tok, int32_t *pos, void *stream) {
  pdl_launch(k_step_next, dim3(1), dim3(32), (size_t)0, OPS_STREAM(stream), pick, tok, pos);
}

static __global__ void k_tab_swap(float **tab, int64_t rows, int stride, int t) {
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
    float **c = tab + r * stride;
    float *p = c[0];
    c[0] = c[t];
    c[t] = p;
  }
}

extern "C" void cuda_tab_swap(float **tab, int64_t rows, int stride, int t, void *stream) {
  if (rows <= 0 || t <= 0 || t >= stride) return;
  k_tab_swap<<<1, 128, 0, OPS_STREAM(stream)>>>(tab, rows, stride, t);
}

struct CopyParts {
  const uint32_t *src[CUDA_COPY_PARTS];
  uint32_t *dst[CUDA_COPY_PARTS];
  int64_t n[CUDA_COPY_PARTS];
};

static __global__ void k_copy_parts(CopyParts c) {
  PDL_ENTER();
  const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, st = (int64_t)gridDim.x * blockDim.x;
#pragma unroll
  for (int p = 0; p < CUDA_COPY_PARTS; p++)
    for (int64_t i = t; i < c.n[p]; i += st) c.dst[p][i] = c.src[p][i];
  __threadfence_system(); /* host memory written: visible once the host synchronizes */
}

extern "C" void cuda_copy_parts(const cuda_copy_part *p, int n, void *stream) {
  CopyParts c = {};
  int64_t most = 0;
  for (int i = 0; i < n && i < CUDA_COPY_PARTS; i++) {
    c.src[i] = (const uint32_t *)p[i].src;
    c.dst[i] = (uint32_t *)p[i].dst;
    c.n[i] = (int64_t)(p[i].bytes / 4);
    most = c.n[i] > most ? c.n[i] : most;
  }
  if (most == 0) return;
  const int64_t blocks = (most + 255) / 256;
  pdl_launch(k_copy_parts, dim3((unsigned)(blocks < 64 ? blocks : 64)), dim3(256), (size_t)0, OPS_STREAM(stream), c);
}
