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

#include <utility>

extern "C" int cuda_rt_pdl(void);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTER()                                           \
  do {                                                        \
    asm volatile("griddepcontrol.wait;" ::: "memory");        \
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
  } while (0)
#else
#define PDL_ENTER() \
  do {              \
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
