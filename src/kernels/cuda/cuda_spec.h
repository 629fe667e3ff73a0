/* CUDA kernels of a greedy speculative step's bookkeeping (backend_cuda.c's one-graph step), as
 * a plain C API with the conventions of cuda_ops.h (device pointers, `stream` a cudaStream_t,
 * launchers return void and never synchronize; everything that changes per step is read from
 * device memory, so a captured step replays at every position). */
#ifndef FLOE_CUDA_SPEC_H
#define FLOE_CUDA_SPEC_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The accept count of a greedy verify: *acc = the largest a <= k with draft[i] == amax[i] for
 * every i < a (draft: the k drafted tokens, amax[i]: the trunk's argmax of verify row i, whose
 * row predicts draft i). When dst is not NULL, row *acc of logits (rows of n floats) is copied
 * into dst. One launch; k <= 64. */
void cuda_spec_accept(const int32_t *draft, const int32_t *amax, int k, int32_t *acc, const float *logits, int64_t n,
                      float *dst, void *stream);
/* cuda_spec_accept with the verify rows' argmaxes read from their keys (keys: k + 1 rows of
 * CUDA_AMK_ROW words, cuda_mm_matmul_amax's) instead of amax; the argmaxes are also written to
 * amax_out[0..k] (what cuda_argmax_rows would have written). 0 when launched; -1 (nothing
 * launched) when k + 1 is over the 65 rows the launch reads. */
int cuda_spec_accept_keys(const int32_t *draft, const unsigned long long *keys, int32_t *amax_out, int k, int32_t *acc,
                           const float *logits, int64_t n, float *dst, void *stream);

#ifdef __cplusplus
}
#endif
#endif
