/* Routed experts tiered between a VRAM pool and host memory for the CUDA backend (--gpu-mem).
 * cuda_tier.c has the design; backend_cuda.c calls these from its MoE block. */
#ifndef FLOE_CUDA_TIER_H
#define FLOE_CUDA_TIER_H
#ifdef FLOE_HAVE_CUDA
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_mm.h"
#include "model/model.h"

typedef struct cu_tier cu_tier;
typedef struct cu_tier_sess cu_tier_sess;

/* A pool of pool_bytes of VRAM for the routed experts of layers [0, n_l) (the trunk's, then the
 * MTP block's). sh_slot[l]: layer l's shared expert has the routed experts' layout and takes a
 * pool slot of its own for good (it is slot K of the expert launches); else it is uploaded apart
 * by the caller. Fills the pool with experts, copies the host page-locking status into the stats.
 * FLOE_E_NOMEM with the minimum when the pool cannot hold one step's experts. */
int cu_tier_open(const model *m, int64_t n_l, uint64_t pool_bytes, const bool *sh_slot, cu_tier **out, char *err,
                 size_t errlen);
void cu_tier_close(cu_tier *t);
/* The bytes the pool needs at least (one layer's experts at once, the shared ones). */
uint64_t cu_tier_min_bytes(const model *m, int64_t n_l, const bool *sh_slot);
/* Layer l's expert stacks as the kernels see them: the pool, expert id = pool slot. */
void cu_tier_views(const cu_tier *t, int64_t l, cuda_mat *gate, cuda_mat *up, cuda_mat *down);
/* The slot of layer l's shared expert (sh_slot[l]). */
int32_t cu_tier_shared_slot(const cu_tier *t, int64_t l);

/* A session's side: pinned staging, the device slot ids, CPU threads for the misses. */
int cu_tier_sess_open(cu_tier *t, int n_threads, int64_t rows, int ks, size_t xq_row, cu_tier_sess **out, char *err,
                      size_t errlen);
void cu_tier_sess_close(cu_tier_sess *ts);

/* One MoE step of layer l, n rows of ks slots each (the routed top-k, then the shared expert in
 * slot K when sh). pred: NULL, or (cu_tier_pf, one row) the next layer's predicted top-k (device),
 * whose experts the pool lacks are then copied ahead on a stream of their own. Waits for the routing (sel, device) and, when the CPU may compute experts
 * (cpu_ok: one row, quantized inputs), the input row x and its quantized form xq (device, xs bytes); decides
 * where each selected expert is computed; enqueues the copies of the experts brought into VRAM;
 * *sid: device slot ids for the expert kernels (-1 where the CPU computes the expert: those rows
 * come out NaN, then cu_tier_end overwrites them). 0 or FLOE_E_* (msg). */
int cu_tier_begin(cu_tier_sess *ts, int64_t l, const int32_t *sel, const int32_t *pred, int64_t n, int ks, bool sh,
                  const float *x, const uint8_t *xq, size_t xs, bool cpu_ok, void *stream, const int32_t **sid,
                  char *msg, size_t msglen);
/* After the expert kernels are enqueued: the CPU computes its experts (the same bits as the GPU's
 * kernels) and their output rows are copied into Y (device, rows of E floats, slot-major). */
int cu_tier_end(cu_tier_sess *ts, float *Y, void *stream, char *msg, size_t msglen);
/* After the evaluation's stream has synchronized (every copy landed): the expert-cache slots the
 * last step held (--mem-budget) go back, so other sessions' steps may use them. */
void cu_tier_done(cu_tier_sess *ts);
/* The experts the CPU computes in the step cu_tier_begin decided (0: cu_tier_end does nothing). */
int cu_tier_cpu_jobs(const cu_tier_sess *ts);
/* The backend's recorded segments of tiered steps (model_tier_stats graphs_recorded / graph_launches). */
void cu_tier_count_graphs(cu_tier_sess *ts, int recorded, int launched);
void cu_tier_stats(const cu_tier *t, model_tier_stats *out);
/* Whether cu_tier_begin uses pred (device, K ids: the next layer's predicted top-k): the next
 * layer's experts copied ahead into the pool (page-locked host experts, unless FLOE_TIER_PF=0),
 * and with --mem-budget read ahead into the expert cache (FLOE_TIER_READAHEAD=1, --prefetch next). */
bool cu_tier_pf(const cu_tier *t);
void cu_tier_stats_reset(cu_tier *t);
#endif
#endif
