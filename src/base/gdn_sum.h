/* The GatedDeltaNet recurrence's sums over the key dimension (S^T k and S^T q of each value
 * column), in the one order the CPU, the CUDA kernels and the tests that mirror them share:
 * GDN_ACC running accumulators, row i added to accumulator i % GDN_ACC in row order, then
 * floe_gdn_fold8's fixed tree. A single running sum made every column a chain of dk (128)
 * dependent adds on the GPU; eight give chains of dk / 8 beside each other, and the CPU, whose
 * vectors run over the columns, does the same adds into eight rows of accumulators. Every add is
 * a separate float add (-ffp-contract=off, --fmad=false). */
#ifndef FLOE_GDN_SUM_H
#define FLOE_GDN_SUM_H

#define GDN_ACC 8

#if defined(__CUDACC__)
#define FLOE_GS static __host__ __device__ __forceinline__
#else
#define FLOE_GS static inline __attribute__((always_inline))
#endif

FLOE_GS float floe_gdn_fold8(const float a[GDN_ACC]) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}
#undef FLOE_GS
#endif
