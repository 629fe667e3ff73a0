/* Reference quantizers: ggml's algorithms (ggml/src/ggml-quants.c), re-implemented so that the
 * same input gives the same bytes as ggml (tests/test_quant_golden.c requantizes ggml's `src`
 * and compares with ggml's `q`). The float operations follow ggml's order exactly; the build
 * uses -ffp-contract=off, as does the ggml build that made the golden files.
 *
 * Which ggml path each type follows (ggml's quantize_<type>() entry point):
 *   no imatrix : quantize_row_<type>_ref for q4_0 q4_1 q5_0 q5_1 q8_0 q2_K..q6_K mxfp4;
 *                iq4_nl/iq4_xs always use their search (ntry 7) with weights x^2.
 *   imatrix    : the *_impl variants (weights = imatrix * sqrt(sigma2 + x^2)); q8_0, mxfp4,
 *                f16 and bf16 ignore it.
 * With an imatrix, src is ONE row and imatrix has its n entries (sigma2 is taken over the row,
 * as ggml does). Without one, rows can be concatenated freely.
 * IQ1/IQ2/IQ3 quantizers are not implemented (quant_can_quantize() says false). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_internal.h"
#include "quant/tables.h"

#define GROUP_MAX_EPS 1e-15f
#define QMIN(a, b) ((a) < (b) ? (a) : (b))
#define QMAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- 32-element block types ---- */

static void q8_0_ref(const float *x, uint8_t *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32, y += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = QMAX(amax, fabsf(x[j]));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    for (int j = 0; j < 32; j++) y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
  }
}

static void q4_0_ref(const float *x, uint8_t *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32, y += 18) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
      if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    for (int j = 0; j < 16; j++) {
      const int a = QMIN(15, (int)(x[j] * id + 8.5f)), b = QMIN(15, (int)(x[j + 16] * id + 8.5f));
      y[2 + j] = (uint8_t)(a | (b << 4));
    }
  }
}

static void q4_1_ref(const float *x, uint8_t *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32, y += 20) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15;
    const float id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    wr_f16(y + 2, min);
    for (int j = 0; j < 16; j++) {
      const int a = QMIN(15, (int)((x[j] - min) * id + 0.5f));
      const int b = QMIN(15, (int)((x[j + 16] - min) * id + 0.5f));
      y[4 + j] = (uint8_t)(a | (b << 4));
    }
  }
}

/* Q5 layout helper: 32 5-bit codes -> qh (u32, bit j = 5th bit of element j) + 16 nibble bytes. */
static void pack_q5(const uint8_t *L, uint8_t *qh_out, uint8_t *qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; j++) {
    qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
    qh |= (uint32_t)((L[j] >> 4) & 1) << j;
    qh |= (uint32_t)((L[j + 16] >> 4) & 1) << (j + 16);
  }
  wr_u32(qh_out, qh);
}

static void q5_0_ref(const float *x, uint8_t *y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; i++, x += 32, y += 22) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
      if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)QMIN(31, (int)(x[j] * id + 16.5f));
    pack_q5(L, y + 2, y + 6);
  }
}

static void q5_1_ref(const float *x, uint8_t *y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; i++, x += 32, y += 24) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 31;
    const float id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    wr_f16(y + 2, min);
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)(int)((x[j] - min) * id + 0.5f);
    pack_q5(L, y + 4, y + 8);
  }
}

static int best_index_mxfp4(float x, float e) {
  int best = 0;
  float best_err = fabsf(kvalues_mxfp4[0] * e - x);
  for (int i = 1; i < 16; i++) {
    const float err = fabsf(kvalues_mxfp4[i] * e - x);
    if (err < best_err) { best = i; best_err = err; }
  }
  return best;
}

static void mxfp4_ref(const float *x, uint8_t *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32, y += 17) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
      if (amax < fabsf(x[j])) amax = fabsf(x[j]);
    /* ggml: (uint8_t)(floorf(log2f(amax)) - 2 + 127); the int step keeps the cast defined. */
    const uint8_t e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
    const float d = e8m0_half(e);
    y[0] = e;
    for (int j = 0; j < 16; j++)
      y[1 + j] = (uint8_t)(best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + 16], d) << 4));
  }
}

/* ---- scale searches shared by the K-quants (ggml make_*_quants) ---- */

/* Symmetric levels -nmax..nmax-1; returns the scale, L[i] = level + nmax. rmse_type 1 weights
 * by x^2 (or qw), and tries 18 nearby scales for the best weighted fit. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++) {
    const float ax = fabsf(x[i]);
    if (ax > amax) { amax = ax; max = x[i]; }
  }
  if (amax < GROUP_MAX_EPS) {
    memset(L, 0, (size_t)n);
    return 0.f;
  }
  float iscale = -nmax / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + QMAX(-nmax, QMIN(nmax - 1, nearest_int(iscale * x[i]))));
    return 1 / iscale;
  }
  bool return_early = false;
  if (rmse_type < 0) {
    rmse_type = -rmse_type;
    return_early = true;
  }
#define QX_W(i)                                                                                   \
  (qw ? qw[i] : rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x[i]) \
                                                                                   : sqrtf(fabsf(x[i])))
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = nearest_int(iscale * x[i]);
    l = QMAX(-nmax, QMIN(nmax - 1, l));
    L[i] = (int8_t)(l + nmax);
    const float w = QX_W(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; is++) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; i++) {
      int l = nearest_int(iscale * x[i]);
      l = QMAX(-nmax, QMIN(nmax - 1, l));
      const float w = QX_W(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; i++)
        L[i] = (int8_t)(nmax + QMAX(-nmax, QMIN(nmax - 1, nearest_int(iscale * x[i]))));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
#undef QX_W
  return scale;
}

/* Q3_K reference scale search: levels -nmax..nmax-1, x^2 weights, coordinate descent. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++) {
    const float ax = fabsf(x[i]);
    if (ax > amax) { amax = ax; max = x[i]; }
  }
  if (amax < GROUP_MAX_EPS) {
    memset(L, 0, (size_t)n);
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = nearest_int(iscale * x[i]);
    l = QMAX(-nmax, QMIN(nmax - 1, l));
    L[i] = (int8_t)l;
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; itry++) {
    int n_changed = 0;
    for (int i = 0; i < n; i++) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = QMAX(-nmax, QMIN(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (int8_t)new_l;
            sumlx = slx;
            suml2 = sl2;
            n_changed++;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric levels 0..nmax with a min <= 0: x ~ scale*L - the_min (ggml make_qkx2_quants). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    memset(L, 0, (size_t)n);
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; i++) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)QMAX(0, QMIN(nmax, l));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? fabsf(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
      int l = nearest_int(iscale * (x[i] - min));
      l = QMAX(0, QMIN(nmax, l));
      Laux[i] = (uint8_t)l;
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; i++) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        memcpy(L, Laux, (size_t)n);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

/* As make_qkx2_quants, for the imatrix paths (ggml make_qkx3_quants, with its guard against a
 * min that sits at or near max). */
static float make_qkx3_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights ? weights[0] : x[0] * x[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights ? weights[i] : x[i] * x[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max <= min) {
    memset(L, 0, (size_t)n);
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_mad = 0;
  for (int i = 0; i < n; i++) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)QMAX(0, QMIN(nmax, l));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    best_mad += (weights ? weights[i] : x[i] * x[i]) * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
      const float v = iscale * (x[i] - min);
      const int l = v > 0 ? nearest_int(QMIN(v, (float)nmax)) : 0;
      Laux[i] = (uint8_t)l;
      const float w = weights ? weights[i] : x[i] * x[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float mad = 0;
      for (int i = 0; i < n; i++) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        mad += (weights ? weights[i] : x[i] * x[i]) * diff;
      }
      if (mad < best_mad) {
        memcpy(L, Laux, (size_t)n);
        best_mad = mad;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

/* Non-negative values (sub-block scales) onto 0..nmax with weights (ggml make_qp_quants). */
static float make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
  float max = 0;
  for (int i = 0; i < n; i++) max = QMAX(max, x[i]);
  if (max < GROUP_MAX_EPS) {
    memset(L, 0, (size_t)n);
    return 0.f;
  }
  float iscale = nmax / max;
  for (int i = 0; i < n; i++) L[i] = (uint8_t)nearest_int(iscale * x[i]);
  const float scale = 1 / iscale;
  float best_mse = 0;
  for (int i = 0; i < n; i++) {
    const float diff = x[i] - scale * L[i];
    best_mse += qw[i] * diff * diff;
  }
  for (int is = -4; is <= 4; is++) {
    if (is == 0) continue;
    const float iscale_is = (0.1f * is + nmax) / max;
    const float scale_is = 1 / iscale_is;
    float mse = 0;
    for (int i = 0; i < n; i++) {
      const int l = QMIN(nmax, nearest_int(iscale_is * x[i]));
      const float diff = x[i] - scale_is * l;
      mse += qw[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = iscale_is;
    }
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    const int l = QMIN(nmax, nearest_int(iscale * x[i]));
    L[i] = (uint8_t)l;
    const float w = qw[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; itry++) {
    int n_changed = 0;
    for (int i = 0; i < n; i++) {
      const float w = qw[i];
      float slx = sumlx - w * x[i] * L[i];
      float sl2 = suml2 - w * L[i] * L[i];
      if (slx > 0 && sl2 > 0) {
        const int new_l = QMIN(nmax, nearest_int(x[i] * sl2 / slx));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (uint8_t)new_l;
            sumlx = slx;
            suml2 = sl2;
            n_changed++;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* imatrix-weighted variants of the 32-element types (ggml quantize_row_q4_0_impl ...). */
static float row_sigma2(const float *x, int64_t n) {
  float s = 0;
  for (int64_t j = 0; j < n; j++) s += x[j] * x[j];
  return s / n;
}

static void q4_0_imat(const float *x, uint8_t *y, int64_t n, const float *qw) {
  const float sigma2 = row_sigma2(x, n);
  float w[32];
  int8_t L[32];
  for (int64_t ib = 0; ib < n / 32; ib++, y += 18) {
    const float *xb = x + 32 * ib, *q = qw + 32 * ib;
    for (int j = 0; j < 32; j++) w[j] = q[j] * sqrtf(sigma2 + xb[j] * xb[j]);
    wr_f16(y, make_qx_quants(32, 8, xb, L, 1, w));
    for (int j = 0; j < 16; j++) y[2 + j] = (uint8_t)(L[j] | (L[j + 16] << 4));
  }
}

static void q5_0_imat(const float *x, uint8_t *y, int64_t n, const float *qw) {
  const float sigma2 = row_sigma2(x, n);
  float w[32];
  int8_t L[32];
  for (int64_t ib = 0; ib < n / 32; ib++, y += 22) {
    const float *xb = x + 32 * ib, *q = qw + 32 * ib;
    for (int j = 0; j < 32; j++) w[j] = q[j] * sqrtf(sigma2 + xb[j] * xb[j]);
    wr_f16(y, make_qx_quants(32, 16, xb, L, 1, w));
    pack_q5((const uint8_t *)L, y + 2, y + 6);
  }
}

static void q4_1_q5_1_imat(const float *x, uint8_t *y, int64_t n, const float *qw, int nmax) {
  const float sigma2 = row_sigma2(x, n);
  const int bytes = nmax == 15 ? 20 : 24;
  float w[32];
  uint8_t L[32], Laux[32];
  for (int64_t ib = 0; ib < n / 32; ib++, y += bytes) {
    const float *xb = x + 32 * ib, *q = qw + 32 * ib;
    for (int j = 0; j < 32; j++) w[j] = q[j] * sqrtf(sigma2 + xb[j] * xb[j]);
    float min;
    const float d = make_qkx3_quants(32, nmax, xb, w, L, &min, Laux, -0.9f, 0.05f, 36);
    wr_f16(y, d);
    wr_f16(y + 2, -min);
    if (nmax == 15)
      for (int j = 0; j < 16; j++) y[4 + j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    else
      pack_q5(L, y + 4, y + 8);
  }
}

/* ---- K-quants ---- */

/* Pack 256 2-bit codes: byte l of each 32-byte group holds elements l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
  for (int j = 0; j < 256; j += 128)
    for (int l = 0; l < 32; l++)
      qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* Q2_K block: scales[16] @0, qs[64] @16, d @80, dmin @82. */
static void q2_k_requant_pack(const float *x, uint8_t *y, uint8_t *L) {
  const float dd = rd_f16(y + 80), dmin = rd_f16(y + 82);
  for (int j = 0; j < 16; j++) {
    const float d = dd * (y[j] & 0xF);
    if (!d) continue;
    const float m = dmin * (y[j] >> 4);
    for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (uint8_t)QMAX(0, QMIN(3, nearest_int((x[16 * j + ii] + m) / d)));
  }
  pack_2bit(L, y + 16);
}

static void q2_k_ref(const float *x, uint8_t *y, int64_t nb) {
  uint8_t L[256], Laux[16];
  float weights[16], mins[16], scales[16];
  const float q4scale = 15.f;
  for (int64_t i = 0; i < nb; i++, x += 256, y += 84) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
      for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < 16; j++) y[j] = (uint8_t)nearest_int(iscale * scales[j]);
      wr_f16(y + 80, max_scale / q4scale);
    } else {
      memset(y, 0, 16);
      wr_f16(y + 80, 0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < 16; j++) y[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
      wr_f16(y + 82, max_min / q4scale);
    } else {
      wr_f16(y + 82, 0.f);
    }
    q2_k_requant_pack(x, y, L);
  }
}

static void q2_k_imat(const float *x, uint8_t *y, int64_t nb, const float *qw_all) {
  uint8_t L[256], Laux[16], Ls[16], Lm[16];
  float mins[16], scales[16], sw[16], weight[16];
  for (int64_t i = 0; i < nb; i++, x += 256, y += 84) {
    memset(sw, 0, sizeof sw);
    float sumx2 = 0;
    for (int j = 0; j < 256; j++) sumx2 += x[j] * x[j];
    const float sigma2 = sumx2 / 256;
    for (int j = 0; j < 16; j++) {
      const float *qw = qw_all + 256 * i + 16 * j;
      for (int l = 0; l < 16; l++) weight[l] = qw[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
      for (int l = 0; l < 16; l++) sw[j] += weight[l];
      scales[j] = make_qkx3_quants(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
    }
    const float dm = make_qp_quants(16, 15, scales, Ls, sw);
    const float mm = make_qp_quants(16, 15, mins, Lm, sw);
    wr_f16(y + 80, dm);
    wr_f16(y + 82, mm);
    for (int j = 0; j < 16; j++) y[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    q2_k_requant_pack(x, y, L);
  }
}

/* Q3_K block: hmask[32] @0, qs[64] @32, scales[12] @96, d @108. `l` is the 6-bit code (0..63). */
static void q3_k_put_scale(uint8_t *sc, int j, int l) {
  if (j < 8) sc[j] = (uint8_t)(l & 0xF);
  else sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
  sc[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

static void q3_k_requant_pack(const float *x, uint8_t *y, int8_t *L) {
  int8_t sc[16];
  quant_q3k_scales(y + 96, sc);
  const float dd = rd_f16(y + 108);
  for (int j = 0; j < 16; j++) {
    const float d = dd * sc[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (int8_t)(QMAX(-4, QMIN(3, nearest_int(x[16 * j + ii] / d))) + 4);
  }
  memset(y, 0, 32);
  int m = 0;
  uint8_t hm = 1;
  for (int j = 0; j < 256; j++) {
    if (L[j] > 3) {
      y[m] |= hm;
      L[j] -= 4;
    }
    if (++m == 32) {
      m = 0;
      hm <<= 1;
    }
  }
  pack_2bit((const uint8_t *)L, y + 32);
}

static void q3_k_ref(const float *x, uint8_t *y, int64_t nb) {
  int8_t L[256];
  float scales[16];
  for (int64_t i = 0; i < nb; i++, x += 256, y += 110) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; j++) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = fabsf(scales[j]);
      if (scale > amax) { amax = scale; max_scale = scales[j]; }
    }
    memset(y + 96, 0, 12);
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; j++) {
        const int8_t l = (int8_t)nearest_int(iscale * scales[j]);
        q3_k_put_scale(y + 96, j, QMAX(-32, QMIN(31, l)) + 32);
      }
      wr_f16(y + 108, 1 / iscale);
    } else {
      wr_f16(y + 108, 0.f);
    }
    q3_k_requant_pack(x, y, L);
  }
}

static void q3_k_imat(const float *x, uint8_t *y, int64_t nb, const float *qw_all) {
  int8_t L[256], Ls[16];
  float scales[16], weight[16], sw[16];
  for (int64_t i = 0; i < nb; i++, x += 256, y += 110) {
    float sumx2 = 0;
    for (int j = 0; j < 256; j++) sumx2 += x[j] * x[j];
    const float sigma2 = 2 * sumx2 / 256;
    for (int j = 0; j < 16; j++) {
      const float *qw = qw_all + 256 * i + 16 * j;
      for (int l = 0; l < 16; l++) weight[l] = qw[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
      float sumw = 0;
      for (int l = 0; l < 16; l++) sumw += weight[l];
      sw[j] = sumw;
      scales[j] = make_qx_quants(16, 4, x + 16 * j, L + 16 * j, 1, weight);
    }
    memset(y + 96, 0, 12);
    const float d_block = make_qx_quants(16, 32, scales, Ls, 1, sw);
    for (int j = 0; j < 16; j++) q3_k_put_scale(y + 96, j, Ls[j]);
    wr_f16(y + 108, d_block);
    q3_k_requant_pack(x, y, L);
  }
}

/* Q4_K/Q5_K scales[12] packing of 8 (scale, min) 6-bit pairs. */
static void k4_put_scales(uint8_t *s, const uint8_t *ls, const uint8_t *lm) {
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
      s[j] |= (uint8_t)((lm[j] >> 4) << 6);
    }
  }
}

/* Q4_K (nmax 15) / Q5_K (nmax 31): d @0, dmin @2, scales @4; final codes into L. */
static void k45_requant(const float *x, const uint8_t *y, uint8_t *L, int nmax) {
  uint8_t sc, m;
  for (int j = 0; j < 8; j++) {
    quant_k4_scale_min(j, y + 4, &sc, &m);
    const float d = rd_f16(y) * sc;
    if (!d) continue;
    const float dm = rd_f16(y + 2) * m;
    for (int ii = 0; ii < 32; ii++) L[32 * j + ii] = (uint8_t)QMAX(0, QMIN(nmax, nearest_int((x[32 * j + ii] + dm) / d)));
  }
}

static void k45_pack(const uint8_t *L, uint8_t *y, int nmax) {
  if (nmax == 15) {
    uint8_t *q = y + 16;
    for (int j = 0; j < 256; j += 64, q += 32)
      for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    return;
  }
  uint8_t *qh = y + 16, *ql = y + 48;
  memset(qh, 0, 32);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < 256; n += 64) {
    for (int j = 0; j < 32; j++) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
      if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
      ql[j] = (uint8_t)(l1 | (l2 << 4));
    }
    m1 <<= 2;
    m2 <<= 2;
    ql += 32;
  }
}

static void k45_ref(const float *x, uint8_t *y, int64_t nb, int nmax) {
  const int bytes = nmax == 15 ? 144 : 176;
  const float rmin = nmax == 15 ? -1.f : -0.5f;
  const int nstep = nmax == 15 ? 20 : 15;
  uint8_t L[256], Laux[32], ls[8], lm[8];
  float weights[32], mins[8], scales[8];
  for (int64_t i = 0; i < nb; i++, x += 256, y += bytes) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = sqrtf(sum_x2 / 32);
      for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
      ls[j] = (uint8_t)QMIN(63, (uint8_t)nearest_int(inv_scale * scales[j]));
      lm[j] = (uint8_t)QMIN(63, (uint8_t)nearest_int(inv_min * mins[j]));
    }
    memset(y + 4, 0, 12);
    k4_put_scales(y + 4, ls, lm);
    wr_f16(y, max_scale / 63.f);
    wr_f16(y + 2, max_min / 63.f);
    k45_requant(x, y, L, nmax);
    k45_pack(L, y, nmax);
  }
}

static void k45_imat(const float *x, uint8_t *y, int64_t nb, const float *qw_all, int nmax) {
  const int bytes = nmax == 15 ? 144 : 176;
  uint8_t L[256], Laux[32], Ls[8], Lm[8];
  float weights[32], sw[8], mins[8], scales[8];
  for (int64_t i = 0; i < nb; i++, x += 256, y += bytes) {
    float sum_x2 = 0;
    for (int l = 0; l < 256; l++) sum_x2 += x[l] * x[l];
    const float sigma2 = 2 * sum_x2 / 256;
    for (int j = 0; j < 8; j++) {
      const float *qw = qw_all + 256 * i + 32 * j;
      for (int l = 0; l < 32; l++) weights[l] = qw[l] * sqrtf(sigma2 + x[32 * j + l] * x[32 * j + l]);
      float sumw = 0;
      for (int l = 0; l < 32; l++) sumw += weights[l];
      sw[j] = sumw;
      scales[j] = make_qkx3_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
    }
    const float d_block = make_qp_quants(8, 63, scales, Ls, sw);
    const float m_block = make_qp_quants(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; j++) {
      Ls[j] = QMIN(63, Ls[j]);
      Lm[j] = QMIN(63, Lm[j]);
    }
    memset(y + 4, 0, 12);
    k4_put_scales(y + 4, Ls, Lm);
    wr_f16(y, d_block);
    wr_f16(y + 2, m_block);
    k45_requant(x, y, L, nmax);
    k45_pack(L, y, nmax);
  }
}

/* Q6_K block: ql[128] @0, qh[64] @128, scales[16] @192, d @208. qw may be NULL. */
static void q6_k_quant(const float *x, uint8_t *y, int64_t nb, const float *qw_all) {
  int8_t L[256];
  float scales[16];
  for (int64_t i = 0; i < nb; i++, x += 256, y += 210) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ib++) {
      const float *qw = qw_all ? qw_all + 256 * i + 16 * ib : NULL;
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, qw);
      scales[ib] = scale;
      if (fabsf(scale) > max_abs_scale) {
        max_abs_scale = fabsf(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
      memset(y, 0, 210);
      continue;
    }
    const float iscale = -128.f / max_scale;
    wr_f16(y + 208, 1 / iscale);
    int8_t *sc = (int8_t *)(y + 192);
    for (int ib = 0; ib < 16; ib++) sc[ib] = (int8_t)QMIN(127, nearest_int(iscale * scales[ib]));
    const float dd = rd_f16(y + 208);
    for (int j = 0; j < 16; j++) {
      const float d = dd * sc[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ii++)
        L[16 * j + ii] = (int8_t)(QMAX(-32, QMIN(31, nearest_int(x[16 * j + ii] / d))) + 32);
    }
    uint8_t *ql = y, *qh = y + 128;
    for (int j = 0; j < 256; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; l++) {
        const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = (uint8_t)(q1 | (q3 << 4));
        ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
        qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                          ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

/* ---- IQ4_NL / IQ4_XS (ggml quantize_row_iq4_nl_impl with 16 values, ntry 7) ---- */

/* Index of the level nearest to x in the sorted table (ties to the upper level). */
static int best_index_int8(int n, const int8_t *val, float x) {
  if (x <= val[0]) return 0;
  if (x >= val[n - 1]) return n - 1;
  int ml = 0, mu = n - 1;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) mu = mav;
    else ml = mav;
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* One super-block of sbs (32 for IQ4_NL, 256 for IQ4_XS) elements. Writes the f16 scale to dh,
 * codes to q4 and, for IQ4_XS, the 6-bit sub-block scales to scales_h/scales_l. */
static void iq4_impl(int sbs, const float *x, uint8_t *dh, uint8_t *q4, uint8_t *scales_h, uint8_t *scales_l,
                     const float *qw_all) {
  const int8_t *values = kvalues_iq4nl;
  const int ntry = 7, bs = 32;
  float weight[32], scales[8];
  uint8_t L[256];
  float sigma2 = 0;
  for (int j = 0; j < sbs; j++) sigma2 += x[j] * x[j];
  sigma2 *= 2.f / sbs;
  memset(q4, 0, (size_t)sbs / 2);
  wr_f16(dh, 0.f);
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < sbs / bs; ib++) {
    const float *xb = x + ib * bs;
    uint8_t *Lb = L + ib * bs;
    if (qw_all) {
      const float *qw = qw_all + ib * bs;
      for (int j = 0; j < bs; j++) weight[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
    } else {
      for (int j = 0; j < bs; j++) weight[j] = xb[j] * xb[j];
    }
    float amax = 0, max = 0;
    for (int j = 0; j < bs; j++) {
      const float ax = fabsf(xb[j]);
      if (ax > amax) { amax = ax; max = xb[j]; }
    }
    if (amax < GROUP_MAX_EPS) {
      scales[ib] = 0;
      memset(Lb, 0, (size_t)bs);
      continue;
    }
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < bs; j++) {
      const int l = best_index_int8(16, values, id * xb[j]);
      Lb[j] = (uint8_t)l;
      const float q = values[l], w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; itry++) {
      id = (itry + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < bs; j++) {
        const int l = best_index_int8(16, values, id * xb[j]);
        const float q = values[l], w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    if (fabsf(d) > amax_scale) {
      amax_scale = fabsf(d);
      max_scale = d;
    }
  }
  if (sbs / bs > 1) {
    wr_u16(scales_h, 0);
    const float d = -max_scale / 32;
    wr_f16(dh, d);
    const float id = d ? 1 / d : 0.f;
    uint16_t sh = 0;
    for (int ib = 0; ib < sbs / bs; ib++) {
      int l = QMAX(-32, QMIN(31, nearest_int(id * scales[ib])));
      const float dl = d * l;
      const float idl = dl ? 1 / dl : 0.f;
      const float *xb = x + ib * bs;
      for (int j = 0; j < bs; j++) L[ib * bs + j] = (uint8_t)best_index_int8(16, values, idl * xb[j]);
      l += 32;
      if (ib % 2 == 0) scales_l[ib / 2] = (uint8_t)(l & 0xF);
      else scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
      sh |= (uint16_t)((l >> 4) << 2 * (ib % 8));
    }
    wr_u16(scales_h, sh);
  } else {
    wr_f16(dh, scales[0]);
    const float id = scales[0] ? 1 / scales[0] : 0;
    for (int j = 0; j < sbs; j++) L[j] = (uint8_t)best_index_int8(16, values, id * x[j]);
  }
  for (int i = 0; i < sbs / 32; i++)
    for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

/* ---- dispatch ---- */

bool quant_can_quantize(uint32_t type) {
  switch (type) {
  case FLOE_TYPE_F32: case FLOE_TYPE_F16: case FLOE_TYPE_BF16: case FLOE_TYPE_Q8_0:
  case FLOE_TYPE_Q4_0: case FLOE_TYPE_Q4_1: case FLOE_TYPE_Q5_0: case FLOE_TYPE_Q5_1:
  case FLOE_TYPE_Q2_K: case FLOE_TYPE_Q3_K: case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K:
  case FLOE_TYPE_Q6_K: case FLOE_TYPE_IQ4_NL: case FLOE_TYPE_IQ4_XS: case FLOE_TYPE_MXFP4:
    return true;
  default:
    return false;
  }
}

int quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n, const float *imatrix) {
  const floe_type_traits *tt = floe_type_info(type);
  if (!tt || !quant_can_quantize(type) || n < 0 || n % tt->blck) return FLOE_E_UNSUPPORTED;
  uint8_t *y = dst;
  const int64_t nb = n / tt->blck;
  switch (type) {
  case FLOE_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
  case FLOE_TYPE_F16: for (int64_t i = 0; i < n; i++) wr_u16(y + 2 * i, floe_f32_to_f16(src[i])); break;
  case FLOE_TYPE_BF16: for (int64_t i = 0; i < n; i++) wr_u16(y + 2 * i, floe_f32_to_bf16(src[i])); break;
  case FLOE_TYPE_Q8_0: q8_0_ref(src, y, nb); break;
  case FLOE_TYPE_MXFP4: mxfp4_ref(src, y, nb); break;
  case FLOE_TYPE_Q4_0: imatrix ? q4_0_imat(src, y, n, imatrix) : q4_0_ref(src, y, nb); break;
  case FLOE_TYPE_Q4_1: imatrix ? q4_1_q5_1_imat(src, y, n, imatrix, 15) : q4_1_ref(src, y, nb); break;
  case FLOE_TYPE_Q5_0: imatrix ? q5_0_imat(src, y, n, imatrix) : q5_0_ref(src, y, nb); break;
  case FLOE_TYPE_Q5_1: imatrix ? q4_1_q5_1_imat(src, y, n, imatrix, 31) : q5_1_ref(src, y, nb); break;
  case FLOE_TYPE_Q2_K: imatrix ? q2_k_imat(src, y, nb, imatrix) : q2_k_ref(src, y, nb); break;
  case FLOE_TYPE_Q3_K: imatrix ? q3_k_imat(src, y, nb, imatrix) : q3_k_ref(src, y, nb); break;
  case FLOE_TYPE_Q4_K: imatrix ? k45_imat(src, y, nb, imatrix, 15) : k45_ref(src, y, nb, 15); break;
  case FLOE_TYPE_Q5_K: imatrix ? k45_imat(src, y, nb, imatrix, 31) : k45_ref(src, y, nb, 31); break;
  case FLOE_TYPE_Q6_K: q6_k_quant(src, y, nb, imatrix); break;
  case FLOE_TYPE_IQ4_NL:
    for (int64_t i = 0; i < nb; i++)
      iq4_impl(32, src + 32 * i, y + 18 * i, y + 18 * i + 2, NULL, NULL, imatrix ? imatrix + 32 * i : NULL);
    break;
  case FLOE_TYPE_IQ4_XS:
    for (int64_t i = 0; i < nb; i++) {
      uint8_t *b = y + 136 * i;
      iq4_impl(256, src + 256 * i, b, b + 8, b + 2, b + 4, imatrix ? imatrix + 256 * i : NULL);
    }
    break;
  default: return FLOE_E_UNSUPPORTED;
  }
  return 0;
}
