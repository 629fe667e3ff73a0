/* One element of a token embedding row, dequantized with quant_dequant_row's operations
 * (src/quant/quant.c: Q8_0 q*d; Q4_K (d*sc)*q - dmin*m; Q6_K (d*sc)*q), so rows are bit-identical to
 * the CPU's: k_embed (ops_misc.cu), and the norms that read their rows' embedding rows themselves
 * (mm_act.cu's embed_stage: the trunk's first norm, k_norm, and the MTP's norm pair, k_norm_pair).
 * The types are cuda_embed_check's. */
#ifndef FLOE_EMBED_CUH
#define FLOE_EMBED_CUH
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/ops_common.cuh"
extern "C" {
#include "base/base.h"
#include "quant/quant.h"
}

static __device__ __forceinline__ float f16_at(const uint8_t *p) {
  const uint16_t u = (uint16_t)p[0] | ((uint16_t)p[1] << 8);
  return __half2float(__ushort_as_half(u)); /* exact, subnormals included */
}

static __device__ __forceinline__ float embed_elem(uint32_t type, const uint8_t *row, int64_t i) {
  switch (type) {
  case FLOE_TYPE_F32: return ((const float *)row)[i];
  case FLOE_TYPE_F16: return f16_at(row + 2 * i);
  case FLOE_TYPE_BF16: return ops_bf16_to_f32((uint16_t)row[2 * i] | ((uint16_t)row[2 * i + 1] << 8));
  case FLOE_TYPE_Q8_0: {
    const uint8_t *b = row + (i / 32) * 34;
    return __fmul_rn((float)(int8_t)b[2 + i % 32], f16_at(b));
  }
  case FLOE_TYPE_Q4_K: {
    const uint8_t *b = row + (i / 256) * 144;
    const int e = (int)(i % 256), chunk = e / 64, w = e % 64, j = 2 * chunk + (w >= 32);
    const uint8_t *sc = b + 4, qb = b[16 + chunk * 32 + (w % 32)];
    const int q = w < 32 ? (qb & 0xF) : (qb >> 4);
    int s, m;
    if (j < 4) {
      s = sc[j] & 63;
      m = sc[j + 4] & 63;
    } else {
      s = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
      m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
    const float d1 = __fmul_rn(f16_at(b), (float)s), m1 = __fmul_rn(f16_at(b + 2), (float)m);
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);
  }
  case FLOE_TYPE_Q6_K: {
    const uint8_t *b = row + (i / 256) * 210;
    const int e = (int)(i % 256), n = e / 128, quarter = (e % 128) / 32, l = e % 32, is = l / 16;
    const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * n;
    const int lo = (quarter & 1) ? ql[l + 32] : ql[l];
    const int q = (((quarter & 2) ? (lo >> 4) : (lo & 0xF)) | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
    return __fmul_rn(__fmul_rn(f16_at(b + 208), (float)sc[is + 2 * quarter]), (float)q);
  }
  default: return __int_as_float(0x7fc00000);
  }
}

#endif
