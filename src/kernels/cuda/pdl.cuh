/* Programmatic dependent launch (Hopper and later): a kernel launched with pdl_launch may start
 * while the kernel before it in the stream is finishing, so its launch and block setup overlap
 * the previous kernel's tail (a one-token decode step is a chain of ~600 small kernels whose
 * boundaries cost more than their bytes: ../shared/reference/gpu-floor.md measures the floor).
 *
 * The contract, which every kernel launched through pdl_launch keeps: its first statement is
 * PDL_ENTER(). griddepcontrol.wait blocks until the previous grid has completed and its memory
 * is visible, so nothing the kernel reads or writes can race the previous one; then
 * griddepcontrol.launch_dependents lets the next kernel be scheduled (its blocks wait in turn).
 * Results are therefore exactly those of plain launches. Before sm_90 both are no-ops and the
 * attribute is not set. FLOE_CUDA_NO_PDL=1 turns it off (cuda_rt_pdl), for A/B measurements. */
#ifndef FLOE_CUDA_PDL_CUH
#define FLOE_CUDA_PDL_CUH
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_rt.h"

#include <utility>

extern "C" int cuda_rt_pdl(void);

/* The launch trace (a build with -DFLOE_CUDA_TRACE=ON; then FLOE_CUDA_TRACE=FILE at run time,
 * cuda_rt_trace_start): when this translation unit's pointer is set, block (0, 0, 0) of each
 * kernel records, right after its wait, the global timer and its grid into a ring of
 * CUDA_RT_TRACE_N entries (word 0: the count). In a step of dependent kernels the next kernel's
 * entry time minus this one's is what this kernel adds to the step, as the graph runs it. Each
 * translation unit has its own pointer (no relocatable device code), registered at start-up for
 * cuda_rt_trace_start to set. Other builds compile none of it: their kernels are unchanged. */
#ifdef FLOE_CUDA_TRACE
static __constant__ unsigned long long *c_pdl_trace;
extern "C" void cuda_rt_trace_register(int (*set)(unsigned long long *));
static int pdl_trace_set(unsigned long long *p) {
  return cudaMemcpyToSymbol(c_pdl_trace, &p, sizeof p) == cudaSuccess ? 0 : -1;
}
namespace {
struct PdlTraceReg {
  PdlTraceReg() { cuda_rt_trace_register(pdl_trace_set); }
};
static PdlTraceReg pdl_trace_reg;
} // namespace

static __device__ __forceinline__ void pdl_trace_mark() {
  unsigned long long *b = c_pdl_trace;
  if (b && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned long long i = atomicAdd(b, 1ull) % CUDA_RT_TRACE_N;
    b[1 + 2 * i] = t;
    b[2 + 2 * i] = (unsigned long long)gridDim.x | (unsigned long long)(gridDim.y & 0xFFFF) << 24 |
                   (unsigned long long)(gridDim.z & 0xFF) << 40 | (unsigned long long)blockDim.x << 48;
  }
}
#define PDL_TRACE_MARK() pdl_trace_mark()
#else
#define PDL_TRACE_MARK() \
  do {                   \
  } while (0)
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTER()                                           \
  do {                                                        \
    asm volatile("griddepcontrol.wait;" ::: "memory");        \
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    PDL_TRACE_MARK();                                         \
  } while (0)
/* PDL_ENTER's two halves, for a kernel that lets the next one be scheduled later than its entry
 * (PDL_WAIT() at entry, PDL_TRIGGER() once its own loads are in: the next kernel's blocks then
 * issue their pre-wait prefetches after them) */
#define PDL_WAIT()                                     \
  do {                                                 \
    asm volatile("griddepcontrol.wait;" ::: "memory"); \
    PDL_TRACE_MARK();                                  \
  } while (0)
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_ENTER() \
  do {              \
    PDL_TRACE_MARK(); \
  } while (0)
#define PDL_WAIT() PDL_ENTER()
#define PDL_TRIGGER() \
  do {                \
  } while (0)
#endif

template <typename... P, typename... A>
static inline void pdl_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = cuda_rt_pdl() ? 1 : 0;
  cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}
#endif
