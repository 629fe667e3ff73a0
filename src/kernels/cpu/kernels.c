/* CPU kernels: ISA dispatch, the scalar versions of both paths, activation quantization and the
 * threaded wrappers.
 *
 * The scalar quantized path below is written plainly from the 16-lane model documented in
 * kernels_internal.h; kernels_avx2.c and kernels_avx512.c must reproduce it bit for bit
 * (tests/test_kernels.c checks this). The scalar float path dequantizes each block with the
 * quant reference and accumulates in element order, so it equals quant_dot_ref exactly. */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels_internal.h"

/* ---- ISA selection ---- */

static int g_isa = -1;

static bool isa_supported(int isa) {
  const floe_cpu *c = floe_cpu_features();
  switch (isa) {
    case FLOE_ISA_SCALAR: return true;
    case FLOE_ISA_AVX2: return c->avx2 && c->fma && c->f16c;
    case FLOE_ISA_AVX512:
      return c->avx2 && c->fma && c->f16c && c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq &&
             c->avx512vnni && c->avx512vbmi && __builtin_cpu_supports("gfni");
    default: return false;
  }
}

int kern_isa_best(void) {
  const char *e = getenv("FLOE_ISA");
  if (e) {
    for (int i = FLOE_ISA_AVX512; i >= 0; i--)
      if (strcmp(e, kern_isa_name(i)) == 0 && isa_supported(i)) return i;
  }
  for (int i = FLOE_ISA_AVX512; i > 0; i--)
    if (isa_supported(i)) return i;
  return FLOE_ISA_SCALAR;
}

int kern_isa_get(void) {
  int v = __atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
  if (v < 0) {
    v = kern_isa_best();
    __atomic_store_n(&g_isa, v, __ATOMIC_RELEASE);
  }
  return v;
}

int kern_isa_set(int isa) {
  if (!isa_supported(isa)) return -1;
  int prev = kern_isa_get();
  __atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
  return prev;
}

const char *kern_isa_name(int isa) {
  switch (isa) {
    case FLOE_ISA_SCALAR: return "scalar";
    case FLOE_ISA_AVX2: return "avx2";
    case FLOE_ISA_AVX512: return "avx512";
    default: return "?";
  }
}

/* ---- dequantization of a chunk of one row (shared by every ISA's float path) ---- */

void kern_dequant_chunk(const floe_mat *W, int64_t r, int64_t j0, int64_t n, float *buf) {
  const uint8_t *row = kw_row(W, r);
  if (W->type == FLOE_TYPE_MLX) {
    const quant_mlx_fmt *f = &W->mlx;
    size_t sbe = f->sb_type == FLOE_TYPE_F32 ? 4 : 2;
    const uint8_t *sc = (const uint8_t *)W->scales + (size_t)r * W->sb_row_bytes + (size_t)(j0 / f->group) * sbe;
    const uint8_t *bi = (const uint8_t *)W->biases + (size_t)r * W->sb_row_bytes + (size_t)(j0 / f->group) * sbe;
    quant_mlx_dequant_row(f, row + (size_t)(j0 * f->bits / 8), sc, bi, buf, n);
    return;
  }
  const floe_type_traits *tt = floe_type_info(W->type);
  quant_dequant_row(W->type, row + (size_t)(j0 / tt->blck) * (size_t)tt->bytes, buf, n);
}

/* ---- scalar float path: element order, equals quant_dot_ref ---- */

static void mm_float_scalar(const floe_mat *W, int nb, const float *X, int64_t ldx, float *Y, int64_t ldy,
                            int64_t r0, int64_t r1) {
  float buf[KERN_CHUNK];
  for (int64_t r = r0; r < r1; r++) {
    float acc[16] = {0};
    for (int64_t j0 = 0; j0 < W->cols; j0 += KERN_CHUNK) {
      int64_t n = W->cols - j0 < KERN_CHUNK ? W->cols - j0 : KERN_CHUNK;
      kern_dequant_chunk(W, r, j0, n, buf);
      for (int b = 0; b < nb; b++) {
        const float *x = X + b * ldx + j0;
        float a = acc[b];
        for (int64_t j = 0; j < n; j++) a += buf[j] * x[j];
        acc[b] = a;
      }
    }
    for (int b = 0; b < nb; b++) Y[b * ldy + r] = acc[b];
  }
}

/* ---- the AVX-512 float path's order, in scalar C ----
 * kern_mm_float_avx512 sums a row in 64 lanes of fused multiply-adds: per 256-value chunk, values
 * j < 64*floor(n/64) go to lane j % 64, the rest in 16-value steps to lanes j % 16 (a masked step
 * adds fma(0, 0, a) = a + 0 to the unused lanes); then per 16 lanes (a0 + a1) + (a2 + a3), then the
 * 16 lanes by halves (i + 8, i + 4, i + 2, i + 1: gcc's _mm512_reduce_add_ps). This function does
 * exactly those float operations one at a time: the oracle of that kernel and of the CUDA float
 * path for F32/F16/BF16 (kernels/cuda/mm_float.cu), which follows the same order. */
void kern_mm_float_lanes_ref(const floe_mat *W, int nb, const float *X, int64_t ldx, float *Y, int64_t ldy,
                             int64_t r0, int64_t r1) {
  float buf[KERN_CHUNK];
  for (int64_t r = r0; r < r1; r++)
    for (int b = 0; b < nb; b++) {
      float acc[64] = {0};
      const float *x = X + b * ldx;
      for (int64_t j0 = 0; j0 < W->cols; j0 += KERN_CHUNK) {
        const int64_t n = W->cols - j0 < KERN_CHUNK ? W->cols - j0 : KERN_CHUNK;
        kern_dequant_chunk(W, r, j0, n, buf);
        int64_t j = 0;
        for (; j + 64 <= n; j += 64)
          for (int k = 0; k < 64; k++) acc[k] = fmaf(buf[j + k], x[j0 + j + k], acc[k]);
        for (; j < n; j += 16)
          for (int k = 0; k < 16; k++) acc[k] = j + k < n ? fmaf(buf[j + k], x[j0 + j + k], acc[k]) : acc[k] + 0.0f;
      }
      float v[16];
      for (int i = 0; i < 16; i++) v[i] = (acc[i] + acc[16 + i]) + (acc[32 + i] + acc[48 + i]);
      for (int h = 8; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) v[i] = v[i + h] + v[i];
      Y[b * ldy + r] = v[0];
    }
}

/* ---- activation quantization ---- */

/* Quantize n values to int8 with one scale; returns d. q[i] for i in [0,n). */
static float act_q8_scalar(const float *x, int n, int8_t *q) {
  float amax = 0;
  for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
  if (!(amax > 0)) {
    memset(q, 0, (size_t)n);
    return 0;
  }
  const float id = 127.0f / amax;
  for (int i = 0; i < n; i++) {
    float v = nearbyintf(x[i] * id);
    q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
  }
  return amax / 127.0f;
}

/* The same values from every ISA (kernels_avx512.c: kern_act_q8_avx512, tested bit-equal). */
static float (*act_q8_fn(void))(const float *, int, int8_t *) {
  return kern_isa_get() == FLOE_ISA_AVX512 ? kern_act_q8_avx512 : act_q8_scalar;
}

size_t kern_act_bytes(const floe_mat *W) { return kact_layout_of(W).bytes; }

/* Units a row's quantization splits into without changing a byte: A32 blocks of 32, A256
 * superblocks, MLX runs of max(group, step) values (whole groups and whole steps, so a step's
 * lane d values come from the same unit). kern_act_quantize = act_quantize_range over all units. */
static int64_t act_units(const floe_mat *W, const kact_layout *L, int64_t *unit_vals) {
  if (L->kind != KACT_MLX) {
    *unit_vals = L->kind == KACT_A32 ? 32 : 256;
    return L->nblk;
  }
  const int64_t st = W->mlx.bits == 4 ? 128 : 64, u = W->mlx.group > st ? W->mlx.group : st;
  *unit_vals = u;
  return (L->nq + u - 1) / u;
}

/* Units [u0, u1) of one activation row (see act_units). Each unit writes only its own q, d,
 * dexp / bsum / s, negcorr and dlane entries, so disjoint ranges can run on different threads. */
static void act_quantize_range(const floe_mat *W, const kact_layout *Lp, const float *x, void *xq_, int64_t u0, int64_t u1) {
  const kact_layout L = *Lp;
  float (*const act_q8)(const float *, int, int8_t *) = act_q8_fn();
  uint8_t *xq = xq_;
  int8_t *q = (int8_t *)xq;
  float *d = (float *)(xq + L.off_d);
  switch (L.kind) {
    case KACT_A32: {
      float *dexp = (float *)(xq + L.off_s);
      for (int64_t k = u0; k < u1; k++) {
        d[k] = act_q8(x + 32 * k, 32, q + 32 * k);
        for (int i = 0; i < 8; i++) dexp[8 * k + i] = d[k];
      }
      break;
    }
    case KACT_A256: {
      int16_t *bs = (int16_t *)(xq + L.off_s);
      for (int64_t k = u0; k < u1; k++) {
        int8_t nat[256];
        d[k] = act_q8(x + 256 * k, 256, nat);
        /* the permutations move runs of 16: copy by runs */
        for (int p = 0; p < 256; p += 16) memcpy(q + 256 * k + p, nat + kact_perm256(W->type, p), 16);
        for (int g = 0; g < 16; g++) {
          int s = 0;
          for (int i = 0; i < 16; i++) s += nat[16 * g + i];
          bs[16 * k + g] = (int16_t)s;
        }
      }
      break;
    }
    case KACT_MLX: {
      int64_t uv;
      act_units(W, &L, &uv);
      /* values [c0, c1) of the padded row; groups [c0/g, min(c1, n)/g) */
      const int64_t c0 = u0 * uv, c1 = u1 * uv < L.nq ? u1 * uv : L.nq;
      if (act_q8 == kern_act_q8_avx512) {
        kern_act_mlx_avx512(W, x, xq, c0, c1);
        break;
      }
      const int g = W->mlx.group;
      const int64_t n = W->cols, e1 = c1 < n ? c1 : n;
      float *s = (float *)(xq + L.off_s);
      int8_t *nat = malloc((size_t)(c1 - c0)); /* natural order, index - c0 */
      if (!nat) FLOE_ASSERT(!"out of memory");
      memset(nat, 0, (size_t)(c1 - c0));
      for (int64_t k = c0 / g; k < e1 / g; k++) {
        int8_t *nk = nat + (g * k - c0);
        d[k] = act_q8(x + g * k, g, nk);
        /* the bias multiplies the sum of the *quantized* x, so the result is exactly
         * sum_j w_j * xhat_j (rounding aside) and its error scales with |w|, not with |bias| */
        int32_t isum = 0;
        for (int i = 0; i < g; i++) isum += nk[i];
        s[k] = d[k] * (float)isum;
      }
      int32_t *nc = (int32_t *)(xq + L.off_c);
      if (W->mlx.bits == 4) {
        for (int64_t c = c0; c < c1; c += 128)
          for (int i = 0; i < 64; i++) {
            q[c + i] = nat[c - c0 + 2 * i];
            q[c + 64 + i] = nat[c - c0 + 2 * i + 1];
          }
        for (int64_t c = c0; c < c1; c += 128)
          for (int i = 0; i < 16; i++) {
            int32_t t = 0;
            for (int k = 0; k < 8; k++) t += nat[c - c0 + 8 * i + k];
            nc[c / 128 * 16 + i] = -8 * t;
          }
      } else {
        memcpy(q + c0, nat, (size_t)(c1 - c0));
        for (int64_t c = c0; c < c1; c += 64)
          for (int i = 0; i < 16; i++) {
            int32_t t = 0;
            for (int k = 0; k < 4; k++) t += nat[c - c0 + 4 * i + k];
            nc[c / 64 * 16 + i] = -128 * t;
          }
      }
      free(nat);
      const int step = W->mlx.bits == 4 ? 128 : 64;
      float *dl = (float *)(xq + L.off_e);
      for (int64_t c = c0; c < c1; c += step)
        for (int i = 0; i < 16; i++) {
          int64_t e0 = c + (int64_t)i * (step / 16);
          dl[c / step * 16 + i] = e0 < W->cols ? d[e0 / g] : 0.0f;
        }
      break;
    }
    default:
      break;
  }
}

void kern_act_quantize(const floe_mat *W, const float *x, void *xq) {
  const kact_layout L = kact_layout_of(W);
  int64_t uv;
  act_quantize_range(W, &L, x, xq, 0, act_units(W, &L, &uv));
}

void kern_act_quantize_rows(const floe_mat *W, int nb, const float *X, int64_t ldx, void *xq, size_t xq_stride) {
  for (int b = 0; b < nb; b++) kern_act_quantize(W, X + b * ldx, (uint8_t *)xq + (size_t)b * xq_stride);
}

/* ---- scalar quantized path: the 16-lane model, plainly ---- */

static inline int32_t sum4(const int8_t *w, const int8_t *x) {
  return w[0] * x[0] + w[1] * x[1] + w[2] * x[2] + w[3] * x[3];
}

static inline void lanes_add(float acc[16], const int32_t L[16], const float S[16], int lo, int hi) {
  for (int i = lo; i < hi; i++) acc[i] = acc[i] + (float)L[i] * S[i];
}

/* Signed decoded values of one 32-block of an A32 type; returns its scale. */
static float dec_a32(uint32_t type, const uint8_t *b, int8_t w[32]) {
  switch (type) {
    case FLOE_TYPE_Q8_0:
      memcpy(w, b + 2, 32);
      return kq_f16(b);
    case FLOE_TYPE_Q4_0:
      for (int j = 0; j < 16; j++) {
        w[j] = (int8_t)((b[2 + j] & 15) - 8);
        w[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
      }
      return kq_f16(b);
    case FLOE_TYPE_IQ4_NL:
      for (int j = 0; j < 16; j++) {
        w[j] = kvalues_iq4nl[b[2 + j] & 15];
        w[j + 16] = kvalues_iq4nl[b[2 + j] >> 4];
      }
      return kq_f16(b);
    case FLOE_TYPE_MXFP4:
      for (int j = 0; j < 16; j++) {
        w[j] = kvalues_mxfp4[b[1 + j] & 15];
        w[j + 16] = kvalues_mxfp4[b[1 + j] >> 4];
      }
      return kq_e8m0_half(b[0]);
    default:
      FLOE_ASSERT(!"not an A32 type");
      return 0;
  }
}

static float dot_a32_scalar(const floe_mat *W, const uint8_t *row, const uint8_t *xq, const kact_layout *L) {
  const floe_type_traits *tt = floe_type_info(W->type);
  const int8_t *q = (const int8_t *)xq;
  const float *dx = (const float *)(xq + L->off_d);
  float acc[16] = {0};
  for (int64_t k = 0; k < L->nblk; k += 2) {
    int32_t Lv[16];
    float S[16];
    int nh = k + 1 < L->nblk ? 2 : 1;
    for (int h = 0; h < nh; h++) {
      int8_t w[32];
      float dw = dec_a32(W->type, row + (size_t)(k + h) * (size_t)tt->bytes, w);
      float s = dw * dx[k + h];
      for (int i = 0; i < 8; i++) {
        Lv[8 * h + i] = sum4(w + 4 * i, q + 32 * (k + h) + 4 * i);
        S[8 * h + i] = s;
      }
    }
    lanes_add(acc, Lv, S, 0, 8 * nh);
  }
  return kred16(acc) + 0.0f;
}

/* Weights of one superblock in activation order (u8 codes for Q4_K/Q5_K/Q6_K, signed for IQ4_XS)
 * and the integer scale of each 4-group (64 entries: step s, lane i -> [16s+i]). */
static void dec_a256(uint32_t type, const uint8_t *b, int8_t w[256], int32_t lsc[64]) {
  int8_t nat[256];
  int nsc[16]; /* scale per natural 16-run */
  switch (type) {
    case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K: {
      uint8_t sc[8], m[8];
      kq_scales_k4(b + 4, sc, m);
      const uint8_t *qs = b + (type == FLOE_TYPE_Q4_K ? 16 : 48);
      const uint8_t *qh = b + 16;
      for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
          int lo = qs[32 * j + l] & 15, hi = qs[32 * j + l] >> 4;
          if (type == FLOE_TYPE_Q5_K) {
            lo |= ((qh[l] >> (2 * j)) & 1) << 4;
            hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
          }
          nat[64 * j + l] = (int8_t)lo;
          nat[64 * j + 32 + l] = (int8_t)hi;
        }
      for (int g = 0; g < 16; g++) nsc[g] = sc[g / 2];
      break;
    }
    case FLOE_TYPE_Q6_K: {
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t *sc = (const int8_t *)(b + 192);
      for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
          const uint8_t *L = ql + 64 * n, *H = qh + 32 * n;
          nat[128 * n + l] = (int8_t)((L[l] & 15) | ((H[l] & 3) << 4));
          nat[128 * n + l + 32] = (int8_t)((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4));
          nat[128 * n + l + 64] = (int8_t)((L[l] >> 4) | (((H[l] >> 4) & 3) << 4));
          nat[128 * n + l + 96] = (int8_t)((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4));
        }
      for (int g = 0; g < 16; g++) nsc[g] = sc[g];
      break;
    }
    case FLOE_TYPE_IQ4_XS: {
      int8_t ls[8];
      kq_scales_iq4xs(b, ls);
      const uint8_t *qs = b + 8;
      for (int ib = 0; ib < 8; ib++)
        for (int j = 0; j < 16; j++) {
          nat[32 * ib + j] = kvalues_iq4nl[qs[16 * ib + j] & 15];
          nat[32 * ib + 16 + j] = kvalues_iq4nl[qs[16 * ib + j] >> 4];
        }
      for (int g = 0; g < 16; g++) nsc[g] = ls[g / 2];
      break;
    }
    default:
      FLOE_ASSERT(!"not an A256 type");
  }
  for (int p = 0; p < 256; p++) w[p] = nat[kact_perm256(type, p)];
  for (int p = 0; p < 256; p += 4) lsc[p / 4] = nsc[kact_perm256(type, p) / 16];
}

static float dot_a256_scalar(const floe_mat *W, const uint8_t *row, const uint8_t *xq, const kact_layout *L) {
  const floe_type_traits *tt = floe_type_info(W->type);
  const int8_t *q = (const int8_t *)xq;
  const float *dx = (const float *)(xq + L->off_d);
  const int16_t *bs = (const int16_t *)(xq + L->off_s);
  float acc[16] = {0}, macc[8] = {0};
  if (W->type == FLOE_TYPE_Q4_K || W->type == FLOE_TYPE_Q5_K) {
    /* the superblock model (kernels_internal.h) */
    for (int64_t k = 0; k < L->nblk; k++) {
      const uint8_t *b = row + (size_t)k * (size_t)tt->bytes;
      const int8_t *x = q + 256 * k;
      const int16_t *bsk = bs + 16 * k;
      int8_t w[256];
      int32_t lsc[64], S1 = 0, S2 = 0;
      uint8_t sc[8], m[8];
      dec_a256(W->type, b, w, lsc);
      for (int p = 0; p < 256; p++) S1 += w[p] * x[p] * lsc[p / 4];
      kq_scales_k4(b + 4, sc, m);
      for (int j = 0; j < 8; j++) S2 += m[j] * (bsk[2 * j] + bsk[2 * j + 1]);
      acc[k % 16] = acc[k % 16] + kq4_term(S1, S2, kq_f16(b), kq_f16(b + 2), dx[k]);
    }
    return kred16(acc);
  }
  for (int64_t k = 0; k < L->nblk; k++) {
    const uint8_t *b = row + (size_t)k * (size_t)tt->bytes;
    const int8_t *x = q + 256 * k;
    const int16_t *bsk = bs + 16 * k;
    int8_t w[256];
    int32_t lsc[64], Lv[16] = {0};
    float S[16];
    dec_a256(W->type, b, w, lsc);
    int32_t D[4][16];
    for (int s = 0; s < 4; s++)
      for (int i = 0; i < 16; i++) D[s][i] = sum4(w + 64 * s + 4 * i, x + 64 * s + 4 * i);
    if (W->type == FLOE_TYPE_IQ4_XS) {
      for (int s = 0; s < 4; s++)
        for (int i = 0; i < 16; i++) Lv[i] += lsc[16 * s + i] * D[s][i];
    } else {
      /* packed lanes: lane 4j+t takes two adjacent 4-sums of step 2p + (t >= 2), p = 0, 1 */
      for (int l = 0; l < 16; l++)
        for (int p = 0; p < 2; p++) {
          int a = 2 * p + (l % 4 >= 2), i0 = 4 * (l / 4) + 2 * (l % 2);
          Lv[l] += lsc[16 * a + i0] * (D[a][i0] + D[a][i0 + 1]);
        }
    }
    float d = W->type == FLOE_TYPE_Q6_K ? kq_f16(b + 208) : kq_f16(b);
    float s = d * dx[k];
    for (int i = 0; i < 16; i++) S[i] = s;
    lanes_add(acc, Lv, S, 0, 16);
    if (W->type == FLOE_TYPE_Q6_K) {
      const int8_t *sc = (const int8_t *)(b + 192);
      for (int j = 0; j < 8; j++) macc[j] = macc[j] + (float)(32 * (sc[2 * j] * bsk[2 * j] + sc[2 * j + 1] * bsk[2 * j + 1])) * s;
    }
  }
  return kred16(acc) - kred8(macc);
}

static float dot_mlx_scalar(const floe_mat *W, int64_t r, const uint8_t *xq, const kact_layout *L) {
  const quant_mlx_fmt *f = &W->mlx;
  const uint8_t *row = kw_row(W, r);
  const void *scl = (const uint8_t *)W->scales + (size_t)r * W->sb_row_bytes;
  const void *bia = (const uint8_t *)W->biases + (size_t)r * W->sb_row_bytes;
  const int8_t *q = (const int8_t *)xq;
  const float *dx = (const float *)(xq + L->off_d), *sx = (const float *)(xq + L->off_s);
  const int32_t *nc = (const int32_t *)(xq + L->off_c);
  const float off = (float)(1 << (f->bits - 1));
  const int g = f->group;
  const int64_t n = W->cols;
  float acc[16] = {0}, bacc[16] = {0};
  const int step = f->bits == 4 ? 128 : 64; /* values per step */
  for (int64_t c = 0; c < n; c += step) {
    int32_t Lv[16];
    float S[16];
    int nl = 0; /* lanes covered */
    for (int i = 0; i < 16; i++) {
      int64_t e0 = c + (int64_t)i * (step / 16); /* first value of the lane */
      if (e0 >= n) break;
      int32_t v = nc[c / step * 16 + i];
      if (f->bits == 4) {
        for (int t = 0; t < 4; t++) {
          uint8_t byte = row[c / 2 + 4 * i + t];
          v += (byte & 15) * q[c + 4 * i + t] + (byte >> 4) * q[c + 64 + 4 * i + t];
        }
      } else {
        for (int t = 0; t < 4; t++) v += row[c + 4 * i + t] * q[c + 4 * i + t];
      }
      Lv[i] = v;
      int64_t grp = e0 / g;
      S[i] = kq_sb(f->sb_type, scl, grp) * dx[grp];
      nl = i + 1;
    }
    lanes_add(acc, Lv, S, 0, nl);
  }
  for (int64_t k = 0; k < L->nblk; k++) bacc[k % 16] = bacc[k % 16] + (kq_sb(f->sb_type, bia, k) + off * kq_sb(f->sb_type, scl, k)) * sx[k];
  return kred16(acc) + kred16(bacc);
}

static void mm_q_scalar(const floe_mat *W, int nb, const void *xq, size_t xq_stride, float *Y, int64_t ldy,
                        int64_t r0, int64_t r1) {
  kact_layout L = kact_layout_of(W);
  for (int64_t r = r0; r < r1; r++)
    for (int b = 0; b < nb; b++) {
      const uint8_t *x = (const uint8_t *)xq + (size_t)b * xq_stride;
      float y;
      switch (L.kind) {
        case KACT_A32: y = dot_a32_scalar(W, kw_row(W, r), x, &L); break;
        case KACT_A256: y = dot_a256_scalar(W, kw_row(W, r), x, &L); break;
        case KACT_MLX: y = dot_mlx_scalar(W, r, x, &L); break;
        default: FLOE_ASSERT(!"no quantized path for this type"); y = 0;
      }
      Y[b * ldy + r] = y;
    }
}

/* ---- rows in the lanes (kernels.h) ---- */

int kern_k4_lanes_ok(const floe_mat *W) {
  return kern_isa_get() == FLOE_ISA_AVX512 && !W->k4_lanes && (W->type == FLOE_TYPE_Q4_K || W->type == FLOE_TYPE_Q5_K) &&
         W->cols % 256 == 0 && W->rows >= 16;
}

/* Row i's superblock (file layout, sb bytes at f) <-> its place in a lanes block (at p): d (file
 * bytes 0-1) at hdr + 2 i, dmin (2-3) at hdr + 32 + 2 i, scale byte j (4 + j) at hdr + 64 + 16 j + i;
 * Q5_K's qh dword m (file bytes 16 + 4m) at 2048 + 64 m + 4 i; code dword c (file bytes qo + 4c) at
 * 64 c + 4 i. */
static void k4_lanes_sb(uint32_t type, int i, uint8_t *f, uint8_t *p, int to_lanes) {
  const int q5 = type == FLOE_TYPE_Q5_K, qo = q5 ? 48 : 16, hdr = q5 ? 2560 : 2048;
#define K4MV(lanes_off, file_off, n) (to_lanes ? memcpy(p + (lanes_off), f + (file_off), n) : memcpy(f + (file_off), p + (lanes_off), n))
  K4MV(hdr + 2 * i, 0, 2);
  K4MV(hdr + 32 + 2 * i, 2, 2);
  for (int j = 0; j < 12; j++) K4MV(hdr + 64 + 16 * j + i, 4 + j, 1);
  for (int m = 0; q5 && m < 8; m++) K4MV(2048 + 64 * m + 4 * i, 16 + 4 * m, 4);
  for (int c = 0; c < 32; c++) K4MV(64 * c + 4 * i, qo + 4 * c, 4);
#undef K4MV
}

void kern_k4_lanes_pack(floe_mat *W, void *data) {
  FLOE_ASSERT(data == W->data && !W->k4_lanes);
  const size_t sb = W->type == FLOE_TYPE_Q4_K ? 144 : 176, nsb = (size_t)(W->cols / 256), blk = 16 * W->row_bytes;
  uint8_t *tmp = malloc(blk);
  FLOE_ASSERT(tmp);
  for (int64_t rb = 0; rb + 16 <= W->rows; rb += 16) {
    uint8_t *p = (uint8_t *)data + (size_t)rb * W->row_bytes;
    memcpy(tmp, p, blk);
    for (size_t k = 0; k < nsb; k++)
      for (int i = 0; i < 16; i++) k4_lanes_sb(W->type, i, tmp + i * W->row_bytes + k * sb, p + k * 16 * sb, 1);
  }
  free(tmp);
  W->k4_lanes = 1;
}

void kern_k4_lanes_row(const floe_mat *W, int64_t r, void *out) {
  uint8_t *o = out;
  if (!W->k4_lanes || r >= (W->rows & ~(int64_t)15)) {
    memcpy(o, kw_row(W, r), W->row_bytes);
    return;
  }
  const size_t sb = W->type == FLOE_TYPE_Q4_K ? 144 : 176, nsb = (size_t)(W->cols / 256);
  uint8_t *p = (uint8_t *)kw_row(W, r & ~(int64_t)15);
  for (size_t k = 0; k < nsb; k++) k4_lanes_sb(W->type, (int)(r & 15), o + k * sb, p + k * 16 * sb, 0);
}

/* A lanes matrix on any path but the AVX-512 batched kernel: each row put back in the file's
 * layout in a buffer, then the row run as a one-row matrix. */
static void mm_lanes_other(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                           float *Y, int64_t ldy, int64_t r0, int64_t r1) {
  floe_mat F = *W;
  F.k4_lanes = 0;
  F.rows = 1;
  uint8_t *buf = malloc(W->row_bytes);
  FLOE_ASSERT(buf);
  F.data = buf;
  for (int64_t r = r0; r < r1; r++) {
    kern_k4_lanes_row(W, r, buf);
    kern_matmul(&F, nb, X, ldx, xq, xq_stride, Y + r, ldy, 0, 1);
  }
  free(buf);
}

/* ---- dispatch ---- */

void kern_matmul(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                 float *Y, int64_t ldy, int64_t r0, int64_t r1) {
  FLOE_ASSERT(nb >= 1 && nb <= 16);
  if (r1 <= r0) return;
  if (W->k4_lanes && !(xq && kern_isa_get() == FLOE_ISA_AVX512)) {
    mm_lanes_other(W, nb, X, ldx, xq, xq_stride, Y, ldy, r0, r1);
    return;
  }
  switch (kern_isa_get()) {
    case FLOE_ISA_AVX512:
      if (xq && (W->k4_lanes || kgemm_wants(W, nb))) kern_gemm_q_avx512(W, nb, xq, xq_stride, Y, ldy, r0, r1);
      else if (xq) kern_mm_q_avx512(W, nb, X, ldx, xq, xq_stride, Y, ldy, r0, r1);
      else kern_mm_float_avx512(W, nb, X, ldx, xq, xq_stride, Y, ldy, r0, r1);
      return;
    case FLOE_ISA_AVX2:
      if (xq) kern_mm_q_avx2(W, nb, X, ldx, xq, xq_stride, Y, ldy, r0, r1);
      else kern_mm_float_avx2(W, nb, X, ldx, xq, xq_stride, Y, ldy, r0, r1);
      return;
    default:
      if (xq) mm_q_scalar(W, nb, xq, xq_stride, Y, ldy, r0, r1);
      else mm_float_scalar(W, nb, X, ldx, Y, ldy, r0, r1);
  }
}

int kern_rows_together(const floe_mat *W, int64_t nb) {
  return kern_isa_get() == FLOE_ISA_AVX512 && (W->k4_lanes || k4_dec_fits(W, nb));
}

#define KB_RBLK 64 /* rows per block when nb > 16: the block stays in L2 while each 16-row group passes */

void kern_matmul_batch(const floe_mat *W, int64_t nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                       float *Y, int64_t ldy, int64_t r0, int64_t r1) {
  FLOE_ASSERT(nb >= 1);
  if (r1 <= r0) return;
  if (kern_isa_get() == FLOE_ISA_AVX512 && xq && (W->k4_lanes || kgemm_wants(W, nb))) {
    kern_gemm_q_avx512(W, nb, xq, xq_stride, Y, ldy, r0, r1);
    return;
  }
  const int64_t blk = nb > 16 ? KB_RBLK : r1 - r0;
  for (int64_t rb = r0; rb < r1; rb += blk) {
    const int64_t re = rb + blk < r1 ? rb + blk : r1;
    for (int64_t b = 0; b < nb; b += 16) {
      const int n = (int)(nb - b < 16 ? nb - b : 16);
      kern_matmul(W, n, X ? X + b * ldx : NULL, ldx, xq ? (const uint8_t *)xq + (size_t)b * xq_stride : NULL, xq_stride,
                  Y + b * ldy, ldy, rb, re);
    }
  }
}

/* ---- threaded wrappers ---- */

typedef struct mt_ctx {
  const floe_mat *W;
  int nb;
  const float *X;
  int64_t ldx;
  const void *xq;
  size_t xq_stride;
  float *Y;
  int64_t ldy;
  void *qbuf;     /* kern_matmul_q_mt: where to quantize */
  int arrived;    /* kern_matmul_q_mt: threads done quantizing (the barrier) */
} mt_ctx;

static void mt_matmul(void *ctx_, int ith, int nth) {
  mt_ctx *c = ctx_;
  int64_t r0, r1;
  /* contiguous halves in 16-row units: 512 rows -> 256 + 256, row pairs never cut, and Y is
   * written in whole 64-byte lines per thread (16 floats) */
  floe_split_range(c->W->rows, 16, ith, nth, &r0, &r1);
  kern_matmul(c->W, c->nb, c->X, c->ldx, c->xq, c->xq_stride, c->Y, c->ldy, r0, r1);
}

void kern_matmul_mt(floe_pool *pool, const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq,
                    size_t xq_stride, float *Y, int64_t ldy) {
  mt_ctx c = {W, nb, X, ldx, xq, xq_stride, Y, ldy, NULL, 0};
  floe_pool_run(pool, mt_matmul, &c);
}

/* Quantize then multiply in one parallel region. The activation rows are cut into nb * P parts
 * (P = ceil(nth / nb) parts per row, in act_units: 16 A32 blocks / 1 superblock / one MLX unit at
 * least) and the parts dealt out to the threads, so with nb = 1 each of 2 threads quantizes half
 * of the row instead of thread 0 quantizing all of it before the others start; then a spin barrier
 * (every thread needs the whole row), then each thread's rows. The bytes are those of
 * kern_act_quantize (the units are independent), so the result is the 1-thread result. */
static void mt_quant_matmul(void *ctx_, int ith, int nth) {
  mt_ctx *c = ctx_;
  const kact_layout L = kact_layout_of(c->W);
  int64_t uv;
  const int64_t nu = act_units(c->W, &L, &uv);
  const int P = nth > c->nb ? (nth + c->nb - 1) / c->nb : 1;
  const int64_t align = L.kind == KACT_A32 ? 16 : 1; /* A32: 16 blocks = whole 64-byte lines of d */
  int64_t i0, i1;
  floe_split_range((int64_t)c->nb * P, 1, ith, nth, &i0, &i1);
  for (int64_t i = i0; i < i1; i++) {
    const int64_t b = i / P;
    int64_t u0, u1;
    floe_split_range(nu, align, (int)(i % P), P, &u0, &u1);
    if (u1 > u0) act_quantize_range(c->W, &L, c->X + b * c->ldx, (uint8_t *)c->qbuf + (size_t)b * c->xq_stride, u0, u1);
  }
  if (nth > 1) {
    /* release: this thread's bytes; acquire: everyone's. Spin with pause; yield when the other
     * threads are not running (an oversubscribed machine) rather than burn the time slice. */
    __atomic_add_fetch(&c->arrived, 1, __ATOMIC_ACQ_REL);
    for (int spins = 0; __atomic_load_n(&c->arrived, __ATOMIC_ACQUIRE) < nth; spins++) {
      if (spins < 1024) __builtin_ia32_pause();
      else sched_yield();
    }
  }
  mt_matmul(c, ith, nth);
}

void kern_matmul_q_mt(floe_pool *pool, const floe_mat *W, int nb, const float *X, int64_t ldx, void *xq_buf,
                      float *Y, int64_t ldy) {
  size_t ab = kern_act_bytes(W);
  if (!ab) {
    kern_matmul_mt(pool, W, nb, X, ldx, NULL, 0, Y, ldy);
    return;
  }
  mt_ctx c = {W, nb, X, ldx, xq_buf, ab, Y, ldy, xq_buf, 0};
  floe_pool_run(pool, mt_quant_matmul, &c);
}

/* ---- attention rows (kernels.h) ----
 * Plain loops in the documented order with fused multiply-adds (fmaf: one rounding, the same on
 * every ISA); the Haswell clone (hardware FMA) stands in for ISAs without a dedicated kernel, the
 * baseline clone computes the same bits through libm's fmaf (slow, correct). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define KREF_CLONES __attribute__((target_clones("arch=haswell", "default"), optimize("O3")))
#else
#define KREF_CLONES
#endif

KREF_CLONES void kern_dot16_rows_ref(const float *A, int64_t lda, int na, const void *B, int B_bf16, int64_t ldb,
                                     int64_t nb, int64_t n, float *out, int64_t ldo) {
  for (int64_t b = 0; b < nb; b++)
    for (int a = 0; a < na; a++) {
      const float *x = A + a * lda;
      float acc[16] = { 0 };
      if (B_bf16) {
        const uint16_t *y = (const uint16_t *)B + b * ldb;
        for (int64_t j = 0; j < n; j += 16)
          for (int i = 0; i < 16; i++) acc[i] = fmaf(x[j + i], floe_bf16_to_f32(y[j + i]), acc[i]);
      } else {
        const float *y = (const float *)B + b * ldb;
        for (int64_t j = 0; j < n; j += 16)
          for (int i = 0; i < 16; i++) acc[i] = fmaf(x[j + i], y[j + i], acc[i]);
      }
      out[a * ldo + b] = kred16(acc);
    }
}

KREF_CLONES void kern_wsum_rows_ref(const float *W, int64_t ldw, int nh, const void *V, int V_bf16, int64_t ldv,
                                    int64_t np, int64_t n, float *O, int64_t ldo) {
  for (int64_t p = 0; p < np; p++)
    for (int h = 0; h < nh; h++) {
      const float w = W[h * ldw + p];
      float *o = O + h * ldo;
      if (V_bf16) {
        const uint16_t *v = (const uint16_t *)V + p * ldv;
        for (int64_t i = 0; i < n; i++) o[i] = fmaf(w, floe_bf16_to_f32(v[i]), o[i]);
      } else {
        const float *v = (const float *)V + p * ldv;
        for (int64_t i = 0; i < n; i++) o[i] = fmaf(w, v[i], o[i]);
      }
    }
}

void kern_dot16_rows(const float *A, int64_t lda, int na, const void *B, int B_bf16, int64_t ldb, int64_t nb,
                     int64_t n, float *out, int64_t ldo) {
  if (kern_isa_get() == FLOE_ISA_AVX512) kern_dot16_rows_avx512(A, lda, na, B, B_bf16, ldb, nb, n, out, ldo);
  else kern_dot16_rows_ref(A, lda, na, B, B_bf16, ldb, nb, n, out, ldo);
}

void kern_wsum_rows(const float *W, int64_t ldw, int nh, const void *V, int V_bf16, int64_t ldv, int64_t np,
                    int64_t n, float *O, int64_t ldo) {
  if (kern_isa_get() == FLOE_ISA_AVX512) kern_wsum_rows_avx512(W, ldw, nh, V, V_bf16, ldv, np, n, O, ldo);
  else kern_wsum_rows_ref(W, ldw, nh, V, V_bf16, ldv, np, n, O, ldo);
}

/* ---- argmax (kernels.h) ---- */
int64_t kern_argmax_ref(const float *x, int64_t n) {
  int64_t best = 0;
  float bv = -INFINITY;
  for (int64_t i = 0; i < n; i++)
    if (x[i] > bv) { /* NaN compares false: never chosen */
      bv = x[i];
      best = i;
    }
  return best;
}

int64_t kern_argmax(const float *x, int64_t n) {
  return kern_isa_get() == FLOE_ISA_AVX512 ? kern_argmax_avx512(x, n) : kern_argmax_ref(x, n);
}

/* ---- read stream (kernels.h) ---- */
uint64_t kern_read_xor_ref(const void *x, size_t n) {
  const uint8_t *p = x;
  uint64_t h = 0, w;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    memcpy(&w, p + i, 8);
    h ^= w;
  }
  if (i < n) {
    w = 0;
    memcpy(&w, p + i, n - i);
    h ^= w;
  }
  return h;
}

uint64_t kern_read_xor(const void *x, size_t n) {
  return kern_isa_get() == FLOE_ISA_AVX512 ? kern_read_xor_avx512(x, n) : kern_read_xor_ref(x, n);
}
