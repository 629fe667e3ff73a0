/* Type table: ggml type ids -> name, block size, block bytes (the traits GGUF readers need).
 * Values follow ggml's type_traits (ggml.c). Plain integer/f64 types are listed so GGUF tensor
 * infos can be sized, but floe does not compute with them (supported = false); I64 likewise. */
#include <strings.h>

#include "quant/quant.h"

static const floe_type_traits g_types[FLOE_TYPE_COUNT_GGML] = {
  [FLOE_TYPE_F32]     = { "f32",     1,   4,   false, true },
  [FLOE_TYPE_F16]     = { "f16",     1,   2,   false, true },
  [FLOE_TYPE_Q4_0]    = { "q4_0",    32,  18,  true,  true },
  [FLOE_TYPE_Q4_1]    = { "q4_1",    32,  20,  true,  true },
  [FLOE_TYPE_Q5_0]    = { "q5_0",    32,  22,  true,  true },
  [FLOE_TYPE_Q5_1]    = { "q5_1",    32,  24,  true,  true },
  [FLOE_TYPE_Q8_0]    = { "q8_0",    32,  34,  true,  true },
  [FLOE_TYPE_Q8_1]    = { "q8_1",    32,  36,  true,  false },
  [FLOE_TYPE_Q2_K]    = { "q2_K",    256, 84,  true,  true },
  [FLOE_TYPE_Q3_K]    = { "q3_K",    256, 110, true,  true },
  [FLOE_TYPE_Q4_K]    = { "q4_K",    256, 144, true,  true },
  [FLOE_TYPE_Q5_K]    = { "q5_K",    256, 176, true,  true },
  [FLOE_TYPE_Q6_K]    = { "q6_K",    256, 210, true,  true },
  [FLOE_TYPE_Q8_K]    = { "q8_K",    256, 292, true,  false },
  [FLOE_TYPE_IQ2_XXS] = { "iq2_xxs", 256, 66,  true,  true },
  [FLOE_TYPE_IQ2_XS]  = { "iq2_xs",  256, 74,  true,  true },
  [FLOE_TYPE_IQ3_XXS] = { "iq3_xxs", 256, 98,  true,  true },
  [FLOE_TYPE_IQ1_S]   = { "iq1_s",   256, 50,  true,  true },
  [FLOE_TYPE_IQ4_NL]  = { "iq4_nl",  32,  18,  true,  true },
  [FLOE_TYPE_IQ3_S]   = { "iq3_s",   256, 110, true,  true },
  [FLOE_TYPE_IQ2_S]   = { "iq2_s",   256, 82,  true,  true },
  [FLOE_TYPE_IQ4_XS]  = { "iq4_xs",  256, 136, true,  true },
  [FLOE_TYPE_I8]      = { "i8",      1,   1,   false, false },
  [FLOE_TYPE_I16]     = { "i16",     1,   2,   false, false },
  [FLOE_TYPE_I32]     = { "i32",     1,   4,   false, false },
  [FLOE_TYPE_I64]     = { "i64",     1,   8,   false, false },
  [FLOE_TYPE_F64]     = { "f64",     1,   8,   false, false },
  [FLOE_TYPE_IQ1_M]   = { "iq1_m",   256, 56,  true,  true },
  [FLOE_TYPE_BF16]    = { "bf16",    1,   2,   false, true },
  [FLOE_TYPE_MXFP4]   = { "mxfp4",   32,  17,  true,  true },
};

const floe_type_traits *floe_type_info(uint32_t type) {
  if (type >= FLOE_TYPE_COUNT_GGML || !g_types[type].name) return NULL;
  return &g_types[type];
}

int floe_type_from_name(const char *name) {
  if (!name) return -1;
  for (int t = 0; t < FLOE_TYPE_COUNT_GGML; t++)
    if (g_types[t].name && strcasecmp(g_types[t].name, name) == 0) return t;
  return -1;
}

size_t floe_row_bytes(uint32_t type, int64_t n) {
  const floe_type_traits *tt = floe_type_info(type);
  if (!tt || n < 0 || n % tt->blck) return 0;
  uint64_t bytes;
  if (!floe_mul_ok((uint64_t)(n / tt->blck), (uint64_t)tt->bytes, &bytes) || bytes > SIZE_MAX) return 0;
  return (size_t)bytes;
}
