/* MLX affine quantization (src/quant/quant_mlx.c):
 *  - hand-packed bytes for 3 and 6 bits (worked out from mlx's extract_bits) decode to the codes;
 *  - for every bit width: codes packed by an independent packer written the way mlx's quantize()
 *    writes them (uint32 words for 2/4/8 bits, 3- or 5-byte packs of a uint64 for 3/5/6 bits)
 *    dequantize to exactly s*q + b;
 *  - every bits x group x scale-type combination: row bytes, quantize -> dequantize error within
 *    |s|/2 plus the far-end clamp mlx's edge rescaling causes plus the scale/bias storage rounding, the dominant edge exact with F32 scales, negative
 *    scales occurring, and quant_mlx_dot_ref against a double dot of the dequantized values;
 *  - invalid formats are rejected. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "test.h"

static const int k_bits[] = { 2, 3, 4, 5, 6, 8 };
static const int k_groups[] = { 32, 64, 128 };
static const uint32_t k_sb[] = { FLOE_TYPE_F32, FLOE_TYPE_F16, FLOE_TYPE_BF16 };

static void put_sb(uint32_t t, void *p, int i, float v) {
  if (t == FLOE_TYPE_F32) ((float *)p)[i] = v;
  else ((uint16_t *)p)[i] = t == FLOE_TYPE_F16 ? floe_f32_to_f16(v) : floe_f32_to_bf16(v);
}

static float get_sb(uint32_t t, const void *p, int i) {
  if (t == FLOE_TYPE_F32) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return t == FLOE_TYPE_F16 ? floe_f16_to_f32(h) : floe_bf16_to_f32(h);
}

/* mlx-style packer: power-of-two widths fill uint32 words, 3/5/6 bits fill 3/5/3-byte packs of
 * 8/8/4 codes built in a uint64 (mlx quantize(): out_el |= code << (k * bits)). */
static void mlx_pack(int bits, const uint32_t *codes, int n, uint8_t *out) {
  if (bits == 2 || bits == 4 || bits == 8) {
    const int per = 32 / bits;
    for (int w = 0; w < n / per; w++) {
      uint32_t v = 0;
      for (int k = 0; k < per; k++) v |= codes[w * per + k] << (k * bits);
      memcpy(out + 4 * w, &v, 4);
    }
    return;
  }
  const int per = bits == 6 ? 4 : 8, bytes = bits == 5 ? 5 : 3;
  for (int p = 0; p < n / per; p++) {
    uint64_t v = 0;
    for (int k = 0; k < per; k++) v |= (uint64_t)codes[p * per + k] << (k * bits);
    for (int b = 0; b < bytes; b++) out[p * bytes + b] = (uint8_t)(v >> (8 * b));
  }
}

static void check_hand_cases(void) {
  SECTION("hand-packed 3-bit and 6-bit bytes");
  /* 3 bits, codes 1,2,3,4,5,6,7,0 -> 0x1F58D1 -> bytes D1 58 1F (mlx extract_bits, checked by hand) */
  uint8_t q3[12] = { 0xD1, 0x58, 0x1F };
  /* the other 24 codes of the group: zero */
  float s[1] = { 1.0f }, b[1] = { 0.0f }, out[32];
  quant_mlx_fmt f3 = { 3, 32, FLOE_TYPE_F32 };
  quant_mlx_dequant_row(&f3, q3, s, b, out, 32);
  const float want3[8] = { 1, 2, 3, 4, 5, 6, 7, 0 };
  CHECK(memcmp(out, want3, sizeof want3) == 0 && out[8] == 0 && out[31] == 0, "3-bit codes 1..7,0");
  /* 6 bits, codes 1,2,3,63 -> 0xFC3081 -> bytes 81 30 FC */
  uint8_t q6[24] = { 0x81, 0x30, 0xFC };
  quant_mlx_fmt f6 = { 6, 32, FLOE_TYPE_F32 };
  s[0] = 0.5f;
  b[0] = -1.0f;
  quant_mlx_dequant_row(&f6, q6, s, b, out, 32);
  CHECK(out[0] == -0.5f && out[1] == 0.0f && out[2] == 0.5f && out[3] == 30.5f && out[4] == -1.0f,
        "6-bit codes 1,2,3,63 with s=0.5 b=-1: %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4]);
  /* 4 bits: value k at bits 4k of each word */
  uint32_t w4[4] = { 0x76543210u, 0xFEDCBA98u, 0, 0 };
  quant_mlx_fmt f4 = { 4, 32, FLOE_TYPE_F32 };
  s[0] = 1.0f;
  b[0] = 0.0f;
  quant_mlx_dequant_row(&f4, w4, s, b, out, 32);
  int ok4 = 1;
  for (int k = 0; k < 16; k++) ok4 &= out[k] == (float)k;
  CHECK(ok4, "4-bit nibbles 0..15 in word order");
}

static void check_exact_codes(void) {
  SECTION("mlx-packed codes dequantize exactly, every width");
  for (size_t ib = 0; ib < 6; ib++) {
    const int bits = k_bits[ib];
    for (size_t is = 0; is < 3; is++) {
      quant_mlx_fmt f = { bits, 64, k_sb[is] };
      const int n = 256, ng = n / 64;
      uint32_t codes[256];
      for (int k = 0; k < n; k++) codes[k] = (uint32_t)(k * 37 + 11) & ((1u << bits) - 1);
      uint8_t q[256];
      memset(q, 0, sizeof q);
      mlx_pack(bits, codes, n, q);
      CHECK(quant_mlx_row_bytes(&f, n) == (size_t)n * bits / 8, "bits %d row bytes", bits);
      float sc[4 * 2], bi[4 * 2], out[256];
      for (int g = 0; g < ng; g++) {
        put_sb(f.sb_type, sc, g, (g % 2 ? -0.25f : 0.125f) * (g + 1)); /* exact in f16 and bf16 */
        put_sb(f.sb_type, bi, g, 1.5f - g);
      }
      quant_mlx_dequant_row(&f, q, sc, bi, out, n);
      int bad = 0;
      for (int k = 0; k < n; k++) {
        const float want = get_sb(f.sb_type, sc, k / 64) * (float)codes[k] + get_sb(f.sb_type, bi, k / 64);
        if (out[k] != want) bad++;
      }
      CHECK(bad == 0, "bits %d sb %u: %d values differ from s*q+b", bits, f.sb_type, bad);
    }
  }
}

static void check_combinations(void) {
  SECTION("quantize -> dequantize, every bits x group x scale type");
  floe_rng r;
  floe_rng_seed(&r, 3);
  const int n = 384; /* 3, 6 or 12 groups */
  float *x = malloc(n * sizeof(float)), *deq = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
  uint8_t *q = malloc(n + 1); /* 8-bit codes: n bytes, plus a guard byte */
  float sc[64], bi[64];
  for (size_t ib = 0; ib < 6; ib++)
    for (size_t ig = 0; ig < 3; ig++)
      for (size_t is = 0; is < 3; is++) {
        quant_mlx_fmt f = { k_bits[ib], k_groups[ig], k_sb[is] };
        CHECK(quant_mlx_fmt_valid(&f), "valid format");
        const int ng = n / f.group;
        /* Rows whose larger-magnitude edge alternates between the min and the max. */
        for (int j = 0; j < n; j++) {
          x[j] = 0.05f * floe_rng_normal(&r) + ((j / f.group) % 2 ? 0.03f : -0.03f);
          v[j] = floe_rng_normal(&r);
        }
        const size_t rb = quant_mlx_row_bytes(&f, n);
        CHECK(rb == (size_t)n * f.bits / 8, "row bytes %zu", rb);
        q[rb] = 0xA5;
        quant_mlx_quantize_row(&f, x, q, sc, bi, n);
        CHECK(q[rb] == 0xA5, "no write past the codes");
        quant_mlx_dequant_row(&f, q, sc, bi, deq, n);
        int bad = 0, neg = 0, edge_bad = 0;
        double e2 = 0, s2 = 0; /* rounding error should look like uniform noise of width |s| */
        const float nb = (float)((1 << f.bits) - 1);
        for (int g = 0; g < ng; g++) {
          const float s = get_sb(f.sb_type, sc, g), b = get_sb(f.sb_type, bi, g);
          if (s < 0) neg++;
          const double rnd = f.sb_type == FLOE_TYPE_F32 ? 1e-6 : f.sb_type == FLOE_TYPE_F16 ? 1.0 / 1024 : 1.0 / 128;
          float lo = INFINITY, hi = -INFINITY;
          for (int j = g * f.group; j < (g + 1) * f.group; j++) {
            lo = fminf(lo, x[j]);
            hi = fmaxf(hi, x[j]);
          }
          /* mlx rescales so the dominant edge is exact; when that shrinks |s|, the far end of the
           * range no longer fits in nb steps and is clamped: allow that excess too. */
          const double excess = fmax(0.0, (double)(hi - lo) - nb * fabs(s));
          const double tol = fabs(s) / 2 * (1 + 1e-5) + excess + rnd * (fabs(b) + nb * fabs(s)) + 1e-7;
          for (int j = g * f.group; j < (g + 1) * f.group; j++) {
            if (fabs(deq[j] - x[j]) > tol) bad++;
            e2 += (double)(deq[j] - x[j]) * (deq[j] - x[j]);
            s2 += (double)s * s;
          }
          const float edge = fabsf(lo) > fabsf(hi) ? lo : hi;
          if (f.sb_type == FLOE_TYPE_F32) {
            int found = 0;
            for (int j = g * f.group; j < (g + 1) * f.group; j++)
              if (x[j] == edge && deq[j] == edge) found = 1;
            if (!found) edge_bad++;
          }
        }
        CHECK(bad == 0, "bits %d group %d sb %u: %d values outside |s|/2 + storage rounding", f.bits, f.group,
              f.sb_type, bad);
        CHECK(sqrt(e2 / s2) < (f.sb_type == FLOE_TYPE_BF16 && f.bits >= 6 ? 0.8 : 0.4),
              "bits %d group %d sb %u: rms error %.3f*|s| (uniform rounding: 0.29)", f.bits, f.group, f.sb_type,
              sqrt(e2 / s2));
        CHECK(neg > 0 && neg < ng, "bits %d group %d sb %u: both scale signs occur (%d of %d negative)", f.bits,
              f.group, f.sb_type, neg, ng);
        if (f.sb_type == FLOE_TYPE_F32) CHECK(edge_bad == 0, "bits %d group %d: dominant edge exact", f.bits, f.group);
        double dd = 0, S = 0;
        for (int j = 0; j < n; j++) {
          dd += (double)deq[j] * v[j];
          S += fabs((double)deq[j] * v[j]);
        }
        const float d = quant_mlx_dot_ref(&f, q, sc, bi, v, n);
        CHECK(fabs(d - dd) <= 1e-5 * S, "bits %d group %d sb %u: dot_ref %g vs %g", f.bits, f.group, f.sb_type, d, dd);
      }
  free(x);
  free(deq);
  free(v);
  free(q);
}

static void check_invalid(void) {
  SECTION("invalid formats");
  const quant_mlx_fmt bad[] = { { 7, 64, FLOE_TYPE_BF16 }, { 1, 64, FLOE_TYPE_BF16 }, { 4, 16, FLOE_TYPE_BF16 },
                                { 4, 64, FLOE_TYPE_Q8_0 }, { 16, 64, FLOE_TYPE_F32 } };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(!quant_mlx_fmt_valid(&bad[i]), "bits %d group %d sb %u rejected", bad[i].bits, bad[i].group, bad[i].sb_type);
    CHECK(quant_mlx_row_bytes(&bad[i], 256) == 0, "row bytes 0 for an invalid format");
  }
  const quant_mlx_fmt ok = { 4, 64, FLOE_TYPE_BF16 };
  CHECK(quant_mlx_row_bytes(&ok, 100) == 0, "n not a multiple of the group -> 0");
  CHECK(quant_mlx_row_bytes(&ok, 2048) == 1024, "4-bit 2048 -> 1024 bytes");
  CHECK(!quant_mlx_fmt_valid(NULL), "NULL format rejected");
}

int main(void) {
  check_hand_cases();
  check_exact_codes();
  check_combinations();
  check_invalid();
  return TEST_DONE();
}
