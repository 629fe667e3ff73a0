/* The Q4_K instantiations of the tensor-core kernels (mm_mma.cuh), in a file of their own so
 * that they compile beside the Q5_K ones (mm_mma_q5.cu) and the host side (mm_mma.cu). */
#include "kernels/cuda/mm_mma.cuh"

void mm_mma_q4_launch(int mode, const KArgs &a, const KArgs &a2, int K, const int32_t *grp, int64_t gslots, int gnep,
                      unsigned gy, const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t nb, cudaStream_t st) {
  mma_launch_t<FLOE_TYPE_Q4_K>(mode, a, a2, K, grp, gslots, gnep, gy, xq, xs, Y, ldy, nb, st);
}

void mm_mma_q4_few(const KArgs &a, int64_t nb, const uint8_t *xq, size_t xs, const MMOut &o, cudaStream_t st) {
  launch_mn<FLOE_TYPE_Q4_K>(a, nb, xq, xs, o, st);
}
