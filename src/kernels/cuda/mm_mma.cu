/* The tensor-core matmuls' host side (mm_mma.cuh has the kernels and says how they work): the
 * switches, the MoE grouping's kernels and the entry points mm_api.cu calls. Each weight type's
 * kernels are instantiated in a file of their own (mm_mma_q4.cu, mm_mma_q5.cu), so that the three
 * compile in parallel. */
#include <stdlib.h>

#include "kernels/cuda/mm_mma.cuh"

namespace {

__global__ void k_grp_count(const int32_t *__restrict__ ids, int64_t slots, int nep, int32_t *__restrict__ grp,
                            GrpLayout L) {
  PDL_ENTER();
  const int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  const int e = ids[s];
  atomicAdd(&grp[L.cnt + (e >= 0 && e < nep ? e : nep)], 1);
}

/* one block: offsets, tiles (expert, first, count), the tile count in word 0, fill = 0 */
__global__ void k_grp_scan(int nep, int32_t *__restrict__ grp, GrpLayout L) {
  PDL_ENTER();
  const int n = nep + 1;
  __shared__ int32_t s_cnt[CUDA_MM_GROUP_MAX_EXPERT + 1], s_off[CUDA_MM_GROUP_MAX_EXPERT + 2],
      s_toff[CUDA_MM_GROUP_MAX_EXPERT + 2];
  /* the counts into shared memory by every thread first: a serial loop over global memory would
   * pay a load latency per expert (its stores may alias the next load) */
  for (int e = threadIdx.x; e < n; e += blockDim.x) s_cnt[e] = grp[L.cnt + e];
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t o = 0, to = 0;
    for (int e = 0; e < n; e++) {
      const int32_t c = s_cnt[e];
      s_off[e] = o;
      s_toff[e] = to;
      o += c;
      to += (c + MMA_NT - 1) / MMA_NT;
    }
    s_off[n] = o;
    s_toff[n] = to;
    grp[0] = to;
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= n; e += blockDim.x) grp[L.off + e] = s_off[e];
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int32_t c = s_cnt[e], o = s_off[e];
    grp[L.fill + e] = 0;
    for (int32_t i = 0, ti = s_toff[e]; i < c; i += MMA_NT, ti++) {
      grp[L.tiles + 3 * ti] = e;
      grp[L.tiles + 3 * ti + 1] = o + i;
      grp[L.tiles + 3 * ti + 2] = c - i < MMA_NT ? c - i : MMA_NT;
    }
  }
}

__global__ void k_grp_scatter(const int32_t *__restrict__ ids, int64_t slots, int nep, int32_t *__restrict__ grp,
                              GrpLayout L) {
  PDL_ENTER();
  const int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  int e = ids[s];
  if (e < 0 || e >= nep) e = nep;
  const int32_t p = grp[L.off + e] + atomicAdd(&grp[L.fill + e], 1);
  grp[L.perm + p] = (int32_t)s;
}

} // namespace

/* 1: the tensor-core kernels where they apply (default); 0: never (FLOE_CUDA_MMA=0). */
static int g_mma = -1;

static int mma_on(void) {
  if (g_mma < 0) {
    const char *e = getenv("FLOE_CUDA_MMA");
    g_mma = !(e && e[0] == '0');
  }
  return g_mma;
}

/* which tensor-core kernel (the same bits): 2 = k_k4mma2 with the L2 prefetch, 8-warp blocks (the
 * default: the fastest on the H200, bench/results.tsv), 1 = k_k4mma2 with the weights a
 * superblock ahead in registers, 0 = k_k4mma (FLOE_CUDA_MMA2=0/1/2) */
static int g_mma2 = -1;

int mm_mma2_impl(void) {
  if (g_mma2 < 0) {
    const char *e = getenv("FLOE_CUDA_MMA2");
    g_mma2 = e && (e[0] == '0' || e[0] == '1') ? e[0] - '0' : 2;
  }
  return g_mma2;
}


/* whether a's shape and type take the tensor-core kernels (GLU: one staged round; the grouped
 * modes: a stack cuda_mm_moe_group can group) */
bool mm_mma_fits(const KArgs &a, int mode) {
  if (!mma_on() || (a.type != FLOE_TYPE_Q4_K && a.type != FLOE_TYPE_Q5_K)) return false;
  const int64_t nsb = a.cols / 256;
  return nsb >= 1 && nsb <= 16 && (mode != MM_GLU || nsb <= MMA_SBC) &&
         (mode == MM_PLAIN || a.n_expert <= CUDA_MM_GROUP_MAX_EXPERT);
}

void cuda_mm_set_mma(int on) { g_mma = on ? 1 : 0; }

void cuda_mm_set_mma2(int impl) { g_mma2 = impl >= 0 && impl <= 2 ? impl : 2; }

/* mm_api.cu: prefill's matmuls (nb >= MMA_MIN_NB activation rows) */
bool mm_mma_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  if (!mm_mma_fits(a, MM_PLAIN)) return false;
  const int64_t gy = (nb + MMA_NT - 1) / MMA_NT;
  for (int64_t y0 = 0; y0 < gy; y0 += 65535) { /* grid y limit */
    const int64_t ny = gy - y0 < 65535 ? gy - y0 : 65535, b0 = y0 * MMA_NT;
    const int64_t n = nb - b0 < ny * MMA_NT ? nb - b0 : ny * MMA_NT;
    const auto run = a.type == FLOE_TYPE_Q4_K ? mm_mma_q4_launch : mm_mma_q5_launch;
    run(MM_PLAIN, a, a, 1, nullptr, 0, 0, (unsigned)ny, xq + (size_t)b0 * xs, xs, Y + b0 * ldy, ldy, n, st);
  }
  return true;
}

/* k_k4mn for 2..15 activation rows (FLOE_CUDA_FEW_MMA=0 or cuda_mm_set_few_mma(0): k_k4wn), and
 * for one row where FLOE_CUDA_ONE_MMA=1 (cuda_mm_set_one_mma; opt-in: a one-row step uses an
 * eighth of the mma's N) */
static int g_few_mma = -1, g_one_mma = -1;

void cuda_mm_set_few_mma(int on) { g_few_mma = on ? 1 : 0; }
void cuda_mm_set_one_mma(int on) { g_one_mma = on ? 1 : 0; }

bool mm_mma_few_launch(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st) {
  if (g_few_mma < 0) g_few_mma = mm_env_int("FLOE_CUDA_FEW_MMA", 1) != 0;
  if (g_one_mma < 0) g_one_mma = mm_env_int("FLOE_CUDA_ONE_MMA", 0) != 0;
  if (nb < 1 || nb > 15 || !(nb == 1 ? g_one_mma : g_few_mma) || a.cols < 256 || a.cols % 256) return false;
  if (a.type == FLOE_TYPE_Q4_K) mm_mma_q4_few(a, nb, xq, xs, o, st);
  else if (a.type == FLOE_TYPE_Q5_K) mm_mma_q5_few(a, nb, xq, xs, o, st);
  else return false;
  return true;
}

size_t cuda_mm_moe_group_bytes(int64_t slots, int n_expert) {
  return (size_t)grp_layout(slots, n_expert).total * sizeof(int32_t);
}

void cuda_mm_moe_group(const int32_t *ids, int64_t slots, int n_expert, void *grp, void *stream) {
  if (slots <= 0 || n_expert < 1 || n_expert > CUDA_MM_GROUP_MAX_EXPERT) return; /* see cuda_mm.h */
  const cudaStream_t st = (cudaStream_t)stream;
  const GrpLayout L = grp_layout(slots, n_expert);
  int32_t *g = (int32_t *)grp;
  cudaMemsetAsync(g + L.cnt, 0, (size_t)(n_expert + 1) * sizeof(int32_t), st);
  const unsigned nbk = (unsigned)((slots + 255) / 256);
  pdl_launch(k_grp_count, dim3(nbk), dim3(256), (size_t)0, st, ids, slots, n_expert, g, L);
  pdl_launch(k_grp_scan, dim3(1), dim3(256), (size_t)0, st, n_expert, g, L);
  pdl_launch(k_grp_scatter, dim3(nbk), dim3(256), (size_t)0, st, ids, slots, n_expert, g, L);
}

/* The grouped MoE kernels: false when the weights do not take them (the caller runs the per-slot
 * kernels). */
bool mm_mma_moe_launch(const KArgs &a, const KArgs &a2, int mode, int64_t slots, int K, const void *grp,
                       const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  if (!grp || !mm_mma_fits(a, mode) || (mode == MM_GLU && a2.type != a.type)) return false;
  const GrpLayout L = grp_layout(slots, a.n_expert);
  if (L.max_tiles > 65535) return false;
  const auto run = a.type == FLOE_TYPE_Q4_K ? mm_mma_q4_launch : mm_mma_q5_launch;
  run(mode == MM_GLU ? MM_GLU : MM_DOWN, a, a2, K, (const int32_t *)grp, slots, a.n_expert, (unsigned)L.max_tiles, xq,
      xs, Y, ldy, slots, st);
  return true;
}
