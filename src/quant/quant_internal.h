/* Helpers shared by the .c files of src/quant (not part of the quant API). */
#ifndef FLOE_QUANT_INTERNAL_H
#define FLOE_QUANT_INTERNAL_H
#include <stdint.h>
#include <string.h>

#include "base/base.h"

static inline uint16_t rd_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void wr_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline float rd_f16(const uint8_t *p) { return floe_f16_to_f32(rd_u16(p)); }
static inline void wr_f16(uint8_t *p, float f) { wr_u16(p, floe_f32_to_f16(f)); }

/* E8M0 exponent e -> 2^(e-128) (half the E8M0 value: kvalues_mxfp4 holds doubled E2M1 values).
 * e = 0 and 1 are the float32 subnormals 2^-128 and 2^-127 (ggml GGML_E8M0_TO_FP32_HALF). */
static inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Round to nearest, ties to even, for |f| <= 4194303 (ggml nearest_int: add 1.5*2^23). */
static inline int nearest_int(float f) {
  float v = f + 12582912.f;
  int32_t i;
  memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

void quant_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m);
void quant_q3k_scales(const uint8_t *p, int8_t out[16]);
#endif
