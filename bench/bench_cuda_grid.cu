/* The floor of a persistent decode kernel on this GPU (issue 20's 1000 tok/s): one cooperative
 * launch that reads the 1.87 GB of a 35B-A3B Q4_K decode step in P phases separated by grid-wide
 * barriers, against ../shared/reference/gpu-floor.md's P kernels replayed as a CUDA graph
 * (1 kernel 0.443 ms, 200: 0.784, 400: 1.116, 800: 1.574).
 *
 *   nvcc -O3 -arch=sm_90 bench/bench_cuda_grid.cu -o bench_cuda_grid && ./bench_cuda_grid
 *   (scripts/gpu-test.sh gridsync builds and runs it)
 *
 * Prints, for each barrier (cg: cooperative_groups grid sync; flag: one counter and a generation
 * word, thread 0 of each block arriving with a release add and spinning with acquire loads):
 *  - the cost of one barrier: P empty phases, us a phase;
 *  - the step: P phases each reading 1.87 GB / P (every block its share, 16-byte loads), with and
 *    without an L2 prefetch of the block's share of the next phase issued before the barrier (what a
 *    persistent kernel can do that a graph boundary cannot): ms, GB/s, the tok/s that allows.
 * A block per SM and 1024 threads (BLOCKS_PER_SM / THREADS below), all resident: the cooperative
 * launch refuses otherwise. Not a test: numbers for bench/results.tsv. */
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

#define THREADS 1024
#define BLOCKS_PER_SM 1

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "bench_cuda_grid: %s: %s\n", #x, cudaGetErrorString(e_));                    \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

struct Bar {
  unsigned count; /* arrivals in the current generation */
  unsigned gen;   /* generation: bumped by the last block to arrive */
};

/* every block's thread 0 arrives; the last one resets the count and releases the others */
__device__ __forceinline__ void flag_sync(Bar *b, unsigned nblocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned g;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(&b->gen) : "memory");
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&b->count) : "memory");
    if (prev == nblocks - 1) {
      b->count = 0;
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&b->gen), "r"(g + 1) : "memory");
    } else {
      unsigned now;
      do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(&b->gen) : "memory");
      while (now == g);
    }
  }
  __syncthreads();
}

/* P phases; phase k reads int4s [k * per, (k + 1) * per) of src (per = 0: empty phases); pf: the
 * block's share of phase k + 1 prefetched into L2 before the barrier; mode 0: cg grid sync, 1: flag */
__global__ void __launch_bounds__(THREADS) k_phases(const int4 *__restrict__ src, size_t per, int P, int pf, int mode,
                                                    Bar *bar, int *sink) {
  cg::grid_group grid = cg::this_grid();
  const unsigned nb = gridDim.x;
  const size_t chunk = (per + nb - 1) / nb; /* int4s of a phase a block reads */
  int4 acc = make_int4(0, 0, 0, 0);
  for (int k = 0; k < P; k++) {
    const size_t b0 = (size_t)k * per + blockIdx.x * chunk;
    const size_t b1 = b0 + chunk < (size_t)(k + 1) * per ? b0 + chunk : (size_t)(k + 1) * per;
    for (size_t i = b0 + threadIdx.x; i < b1; i += THREADS) {
      const int4 v = __ldg(src + i);
      acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
    }
    if (pf && k + 1 < P) { /* the next phase's share, a 128-byte line per thread and step */
      const char *n0 = (const char *)(src + (size_t)(k + 1) * per + blockIdx.x * chunk);
      const size_t bytes = chunk * sizeof(int4);
      for (size_t o = (size_t)threadIdx.x * 128; o < bytes; o += (size_t)THREADS * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(n0 + o));
    }
    if (mode == 0) grid.sync();
    else flag_sync(bar, nb);
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x7fffffff) sink[0] = 1;
}

static float run(const int4 *src, size_t per, int P, int pf, int mode, Bar *bar, int *sink, int nblocks, int reps) {
  void *args[] = { (void *)&src, (void *)&per, (void *)&P, (void *)&pf, (void *)&mode, (void *)&bar, (void *)&sink };
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaLaunchCooperativeKernel((void *)k_phases, nblocks, THREADS, args, 0, 0)); /* warm-up */
  CK(cudaEventRecord(a));
  for (int r = 0; r < reps; r++) CK(cudaLaunchCooperativeKernel((void *)k_phases, nblocks, THREADS, args, 0, 0));
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / reps;
}

int main() {
  int dev = 0, sms = 0, coop = 0, per_sm = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_phases, THREADS, 0));
  if (!coop || per_sm < BLOCKS_PER_SM) {
    fprintf(stderr, "bench_cuda_grid: no cooperative launch of %d blocks an SM here\n", BLOCKS_PER_SM);
    return 1;
  }
  const int nblocks = sms * BLOCKS_PER_SM;
  const size_t total = 1870ull << 20; /* one 35B-A3B Q4_K decode step's weight bytes */
  int4 *buf;
  Bar *bar;
  int *sink;
  CK(cudaMalloc(&buf, total));
  CK(cudaMemset(buf, 1, total));
  CK(cudaMalloc(&bar, sizeof(Bar)));
  CK(cudaMemset(bar, 0, sizeof(Bar)));
  CK(cudaMalloc(&sink, 4));
  printf("%d SMs, %d blocks of %d threads\n", sms, nblocks, THREADS);
  const char *names[2] = { "cg", "flag" };
  for (int mode = 0; mode < 2; mode++) {
    const float ms = run(buf, 0, 1000, 0, mode, bar, sink, nblocks, 5);
    printf("barrier %-4s: 1000 empty phases %.3f ms = %.2f us a barrier\n", names[mode], ms, ms);
  }
  const int Ps[] = { 1, 100, 200, 400, 800 };
  for (int P : Ps) {
    const size_t per = total / P / sizeof(int4);
    for (int mode = 0; mode < 2; mode++)
      for (int pf = 0; pf < 2; pf++) {
        const float ms = run(buf, per, P, pf, mode, bar, sink, nblocks, 10);
        printf("read 1.87 GB in P=%d phases of %.2f MB, barrier %-4s, %s: %.3f ms = %.0f GB/s (=> %.0f tok/s floor)\n", P,
               total / P / 1e6, names[mode], pf ? "next phase prefetched" : "no prefetch      ", ms,
               total / ms / 1e6, 1000 / ms);
      }
  }
  return 0;
}
