/* AVX2 (+FMA, F16C) kernels: the float path and the quantized-activation path.
 *
 * The quantized path follows the models of kernels_internal.h exactly (Q4_K/Q5_K: the superblock
 * model, exact S1/S2 by the vector code then one scalar term per superblock; the other types: the
 * 16-lane model): the 16 lanes are a
 * pair of ymm registers (lanes 0-7, 8-15), so a 64-byte step of the model is two 32-byte halves.
 * Integer dot products: vpmaddubsw (u8 x s8 pairs, never saturating for the value ranges used
 * here) then vpmaddwd with ones (4 products per dword) or with an int16 scale (pairs times the
 * sub-block scale). Signed x signed uses vpabsb / vpsignb. MLX 8-bit codes (0..255) are split into
 * bit 7 and bits 0-6 so vpmaddubsw cannot saturate.
 */
#include <immintrin.h>

#include "kernels/cpu/kernels_internal.h"

#define NBG 4

static inline float red16(__m256 lo, __m256 hi) {
  __m256 a = _mm256_add_ps(lo, hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(e);
}

static inline __m256 lanes_add(__m256 acc, __m256i L, __m256 S) {
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(L), S));
}

static inline float f16s(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

static inline float red8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

static inline int32_t hsum_i32(__m256i v) {
  __m128i a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(1, 0, 3, 2)));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(a);
}

/* sum of 4 products u8 w * s8 x per dword (pairs must not saturate) */
static inline __m256i dot_us(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}
/* signed w * signed x, 4 products per dword */
static inline __m256i dot_ss(__m256i w, __m256i x) { return dot_us(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)); }

/* ================= A32 types ================= */

static inline __m256i a32_dec(const int T, const uint8_t *b, float *d) {
  if (T == FLOE_TYPE_Q8_0) {
    *d = f16s(b);
    return _mm256_loadu_si256((const __m256i *)(b + 2));
  }
  const uint8_t *qs = b + (T == FLOE_TYPE_MXFP4 ? 1 : 2);
  __m128i q = _mm_loadu_si128((const __m128i *)qs);
  __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
  if (T == FLOE_TYPE_Q4_0) {
    *d = f16s(b);
    return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
  }
  if (T == FLOE_TYPE_IQ4_NL) {
    *d = f16s(b);
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)), nib);
  }
  *d = kq_e8m0_half(b[0]);
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_mxfp4)), nib);
}

static inline __attribute__((always_inline)) void a32_row(const int T, const int NB, const floe_mat *W,
                                                          const kact_layout *L, int64_t r, const uint8_t *xq,
                                                          size_t xs, float *Y, int64_t ldy) {
  const int bytes = T == FLOE_TYPE_Q8_0 ? 34 : T == FLOE_TYPE_MXFP4 ? 17 : 18;
  const uint8_t *row = kw_row(W, r);
  __m256 alo[NBG], ahi[NBG];
  for (int b = 0; b < NB; b++) alo[b] = ahi[b] = _mm256_setzero_ps();
  const int64_t nblk = L->nblk;
  for (int64_t k = 0; k < nblk; k += 2) {
    float d0, d1 = 0;
    __m256i w0 = a32_dec(T, row + k * bytes, &d0);
    const int two = k + 1 < nblk;
    __m256i w1 = two ? a32_dec(T, row + (k + 1) * bytes, &d1) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
      const uint8_t *x = xq + b * xs;
      const float *dx = (const float *)(x + L->off_d);
      __m256i L0 = dot_ss(w0, _mm256_loadu_si256((const __m256i *)(x + 32 * k)));
      alo[b] = lanes_add(alo[b], L0, _mm256_set1_ps(d0 * dx[k]));
      if (two) {
        __m256i L1 = dot_ss(w1, _mm256_loadu_si256((const __m256i *)(x + 32 * k + 32)));
        ahi[b] = lanes_add(ahi[b], L1, _mm256_set1_ps(d1 * dx[k + 1]));
      }
    }
  }
  for (int b = 0; b < NB; b++) Y[b * ldy + r] = red16(alo[b], ahi[b]) + 0.0f;
}

/* ================= A256 types ================= */

static inline __attribute__((always_inline)) void a256_row(const int T, const int NB, const floe_mat *W,
                                                           const kact_layout *L, int64_t r, const uint8_t *xq,
                                                           size_t xs, float *Y, int64_t ldy) {
  const int bytes = T == FLOE_TYPE_Q4_K ? 144 : T == FLOE_TYPE_Q5_K ? 176 : T == FLOE_TYPE_Q6_K ? 210 : 136;
  const uint8_t *row = kw_row(W, r);
  const __m256i m4 = _mm256_set1_epi8(15);
  __m256 alo[NBG], ahi[NBG], macc[NBG];
  float kacc[NBG][16]; /* Q4_K/Q5_K */
  for (int b = 0; b < NB; b++) {
    alo[b] = ahi[b] = macc[b] = _mm256_setzero_ps();
    for (int i = 0; i < 16; i++) kacc[b][i] = 0.0f;
  }
  for (int64_t k = 0; k < L->nblk; k++) {
    const uint8_t *bk = row + k * bytes;
    __m256i w[4][2], sv[4][2], sx[4][2]; /* weights (u8 or |w|), int16 scales, signs (IQ4_XS) */
    __m256i aux = _mm256_setzero_si256();
    float d, dm = 0;
    if (T == FLOE_TYPE_Q4_K || T == FLOE_TYPE_Q5_K) {
      uint8_t sc[8], m[8];
      kq_scales_k4(bk + 4, sc, m);
      d = f16s(bk);
      dm = f16s(bk + 2);
      __m128i mv = _mm_loadl_epi64((const __m128i *)m);
      aux = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
      const uint8_t *qs = bk + (T == FLOE_TYPE_Q4_K ? 16 : 48);
      __m256i qh = _mm256_loadu_si256((const __m256i *)(bk + 16));
#pragma GCC unroll 4
      for (int s = 0; s < 4; s++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
          __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 64 * (s / 2) + 32 * h));
          __m256i v = (s & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
          int j = 4 * (s / 2) + (s & 1) + 2 * h; /* sub-block, and the qh bit of Q5_K */
          if (T == FLOE_TYPE_Q5_K) {
            __m256i bit = _mm256_set1_epi8((char)(1 << j));
            __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
            v = _mm256_or_si256(v, _mm256_and_si256(on, _mm256_set1_epi8(16)));
          }
          w[s][h] = v;
          sv[s][h] = _mm256_set1_epi16((short)sc[j]);
        }
    } else if (T == FLOE_TYPE_Q6_K) {
      d = f16s(bk + 208);
      const int8_t *sc = (const int8_t *)(bk + 192);
      aux = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
      const __m256i m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 4
      for (int s = 0; s < 4; s++) {
        int n = s / 2;
        __m256i qh = _mm256_loadu_si256((const __m256i *)(bk + 128 + 32 * n));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
          __m256i l = _mm256_loadu_si256((const __m256i *)(bk + 64 * n + 32 * h));
          __m256i v = (s & 1) ? _mm256_and_si256(_mm256_srli_epi16(l, 4), m4) : _mm256_and_si256(l, m4);
          __m256i hb;
          if (!(s & 1)) hb = h ? _mm256_slli_epi16(qh, 2) : _mm256_slli_epi16(qh, 4);
          else hb = h ? _mm256_srli_epi16(qh, 2) : qh;
          w[s][h] = _mm256_or_si256(v, _mm256_and_si256(hb, m30));
          sv[s][h] = _mm256_set_m128i(_mm_set1_epi16(sc[4 * s + 2 * h + 1]), _mm_set1_epi16(sc[4 * s + 2 * h]));
        }
      }
    } else { /* IQ4_XS */
      int8_t ls[8];
      uint64_t lsv = kq_scales_iq4xs_u64(bk);
      memcpy(ls, &lsv, 8);
      d = f16s(bk);
      const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
#pragma GCC unroll 4
      for (int s = 0; s < 4; s++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
          __m256i q = _mm256_loadu_si256((const __m256i *)(bk + 8 + 64 * (s / 2) + 32 * h));
          __m256i v = (s & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
          __m256i kv = _mm256_shuffle_epi8(tab, v);
          w[s][h] = _mm256_abs_epi8(kv);
          sx[s][h] = kv;
          int j = 4 * (s / 2) + 2 * h;
          sv[s][h] = _mm256_set_m128i(_mm_set1_epi16(ls[j + 1]), _mm_set1_epi16(ls[j]));
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
      const uint8_t *xb = xq + b * xs;
      const int8_t *x = (const int8_t *)xb + 256 * k;
      const float dx = ((const float *)(xb + L->off_d))[k];
      __m256i Llo = _mm256_setzero_si256(), Lhi = _mm256_setzero_si256(), X[4][2];
#pragma GCC unroll 4
      for (int s = 0; s < 4; s++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + 64 * s));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + 64 * s + 32));
        if (T == FLOE_TYPE_IQ4_XS) {
          x0 = _mm256_sign_epi8(x0, sx[s][0]);
          x1 = _mm256_sign_epi8(x1, sx[s][1]);
        }
        X[s][0] = _mm256_madd_epi16(_mm256_maddubs_epi16(w[s][0], x0), sv[s][0]);
        X[s][1] = _mm256_madd_epi16(_mm256_maddubs_epi16(w[s][1], x1), sv[s][1]);
        if (T == FLOE_TYPE_IQ4_XS) {
          Llo = _mm256_add_epi32(Llo, X[s][0]);
          Lhi = _mm256_add_epi32(Lhi, X[s][1]);
        }
      }
      if (T != FLOE_TYPE_IQ4_XS) {
        /* the packed lane order of the model (vphaddd per 128-bit lane = vpackssdw + vpdpwssd) */
        Llo = _mm256_add_epi32(_mm256_hadd_epi32(X[0][0], X[1][0]), _mm256_hadd_epi32(X[2][0], X[3][0]));
        Lhi = _mm256_add_epi32(_mm256_hadd_epi32(X[0][1], X[1][1]), _mm256_hadd_epi32(X[2][1], X[3][1]));
      }
      if (T == FLOE_TYPE_Q4_K || T == FLOE_TYPE_Q5_K) {
        /* the superblock model: exact S1 and S2, then one scalar term per superblock */
        __m256i bs = _mm256_loadu_si256((const __m256i *)((const int16_t *)(xb + L->off_s) + 16 * k));
        const int32_t S1 = hsum_i32(_mm256_add_epi32(Llo, Lhi)), S2 = hsum_i32(_mm256_madd_epi16(aux, bs));
        kacc[b][k % 16] = kacc[b][k % 16] + kq4_term(S1, S2, d, dm, dx);
        continue;
      }
      const float S = d * dx;
      const __m256 Sv = _mm256_set1_ps(S);
      alo[b] = lanes_add(alo[b], Llo, Sv);
      ahi[b] = lanes_add(ahi[b], Lhi, Sv);
      if (T != FLOE_TYPE_IQ4_XS) {
        __m256i bs = _mm256_loadu_si256((const __m256i *)((const int16_t *)(xb + L->off_s) + 16 * k));
        __m256i M = _mm256_madd_epi16(aux, bs);
        if (T == FLOE_TYPE_Q6_K) M = _mm256_slli_epi32(M, 5);
        macc[b] = _mm256_add_ps(macc[b], _mm256_mul_ps(_mm256_cvtepi32_ps(M), _mm256_set1_ps(T == FLOE_TYPE_Q6_K ? S : dm * dx)));
      }
    }
  }
  if (T == FLOE_TYPE_Q4_K || T == FLOE_TYPE_Q5_K)
    for (int b = 0; b < NB; b++) Y[b * ldy + r] = kred16(kacc[b]);
  else
    for (int b = 0; b < NB; b++) Y[b * ldy + r] = red16(alo[b], ahi[b]) - red8(macc[b]);
}

/* ================= MLX 4-bit / 8-bit ================= */

static inline __attribute__((always_inline)) void mlx_row(const int BITS, const int NB, const floe_mat *W,
                                                          const kact_layout *L, int64_t r, const uint8_t *xq,
                                                          size_t xs, float *Y, int64_t ldy) {
  const quant_mlx_fmt *f = &W->mlx;
  const int g = f->group;
  const uint32_t sbt = f->sb_type;
  const uint8_t *row = kw_row(W, r);
  const uint8_t *scl = (const uint8_t *)W->scales + (size_t)r * W->sb_row_bytes;
  const uint8_t *bia = (const uint8_t *)W->biases + (size_t)r * W->sb_row_bytes;
  const int64_t n = W->cols;
  const int ST = BITS == 4 ? 128 : 64, LW = ST / 16;
  const int ngs = ST / g > 0 ? ST / g : 1;
  __m256i gi[2];
  for (int h = 0; h < 2; h++) {
    int idx[8];
    for (int i = 0; i < 8; i++) idx[i] = (8 * h + i) * LW / g;
    gi[h] = _mm256_loadu_si256((const __m256i *)idx);
  }
  const __m256i m4 = _mm256_set1_epi8(15);
  __m256 alo[NBG], ahi[NBG];
  for (int b = 0; b < NB; b++) alo[b] = ahi[b] = _mm256_setzero_ps();
  for (int64_t c = 0; c < n; c += ST) {
    const int64_t rem = n - c;
    const int full = rem >= ST;
    const int nlanes = full ? 16 : (int)(rem / LW);
    const int64_t g0 = c / g;
    const int ng = full ? ngs : (int)((rem + g - 1) / g);
    const uint8_t *cb = row + c * BITS / 8;
    uint8_t pad[64];
    if (!full) {
      memset(pad, 0, sizeof pad);
      memcpy(pad, cb, (size_t)(rem * BITS / 8));
      cb = pad;
    }
    __m256i wl[2], wh[2];
    for (int h = 0; h < 2; h++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(cb + 32 * h));
      if (BITS == 4) {
        wl[h] = _mm256_and_si256(q, m4);
        wh[h] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      } else {
        wl[h] = _mm256_and_si256(q, _mm256_set1_epi8(0x7F));
        wh[h] = _mm256_and_si256(q, _mm256_set1_epi8((char)0x80));
      }
    }
    float sw[8] = {0};
    for (int j = 0; j < ng; j++) sw[j] = kq_sb(sbt, scl, g0 + j);
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
      const uint8_t *xb = xq + b * xs;
      const int8_t *x = (const int8_t *)xb + c;
      const float *dx = (const float *)(xb + L->off_d) + g0;
      float pr[8] = {0};
      for (int j = 0; j < ng; j++) pr[j] = sw[j] * dx[j];
      __m256 prv = _mm256_loadu_ps(pr);
      const int32_t *nc = (const int32_t *)(xb + L->off_c) + c / ST * 16;
      __m256i Lh[2];
      for (int h = 0; h < 2; h++) {
        if (BITS == 4)
          Lh[h] = _mm256_add_epi32(dot_us(wl[h], _mm256_loadu_si256((const __m256i *)(x + 32 * h))),
                                   dot_us(wh[h], _mm256_loadu_si256((const __m256i *)(x + 64 + 32 * h))));
        else {
          __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * h));
          Lh[h] = _mm256_add_epi32(dot_us(wl[h], xv), dot_us(wh[h], xv));
        }
        Lh[h] = _mm256_add_epi32(Lh[h], _mm256_loadu_si256((const __m256i *)(nc + 8 * h)));
      }
      if (nlanes > 0) alo[b] = lanes_add(alo[b], Lh[0], _mm256_permutevar8x32_ps(prv, gi[0]));
      if (nlanes > 8) ahi[b] = lanes_add(ahi[b], Lh[1], _mm256_permutevar8x32_ps(prv, gi[1]));
      /* a partial chunk covers whole 8-lane halves or less: lanes past nlanes hold 0 * 0 (+0),
       * which leaves the accumulator bits unchanged (an accumulator is never -0). */
    }
  }
  for (int b = 0; b < NB; b++) {
    const uint8_t *xb = xq + b * xs;
    const float *sx = (const float *)(xb + L->off_s);
    __m256 blo = _mm256_setzero_ps(), bhi = _mm256_setzero_ps();
    for (int64_t k = 0; k < L->nblk; k += 16) {
      float bv[16] = {0}, sv[16] = {0};
      int cnt = L->nblk - k < 16 ? (int)(L->nblk - k) : 16;
      for (int i = 0; i < cnt; i++) {
        bv[i] = kq_sb(sbt, bia, k + i) + (float)(1 << (BITS - 1)) * kq_sb(sbt, scl, k + i);
        sv[i] = sx[k + i];
      }
      blo = _mm256_add_ps(blo, _mm256_mul_ps(_mm256_loadu_ps(bv), _mm256_loadu_ps(sv)));
      bhi = _mm256_add_ps(bhi, _mm256_mul_ps(_mm256_loadu_ps(bv + 8), _mm256_loadu_ps(sv + 8)));
    }
    Y[b * ldy + r] = red16(alo[b], ahi[b]) + red16(blo, bhi);
  }
}

#define DEF_RUN(name, rowfn, T)                                                                    \
  static void name(const floe_mat *W, const kact_layout *L, int nb, const uint8_t *xq, size_t xs, \
                   float *Y, int64_t ldy, int64_t r0, int64_t r1) {                                 \
    for (int64_t r = r0; r < r1; r++)                                                              \
      for (int b0 = 0; b0 < nb; b0 += NBG) {                                                       \
        const uint8_t *x = xq + (size_t)b0 * xs;                                                    \
        float *y = Y + b0 * ldy;                                                                    \
        switch (nb - b0) {                                                                          \
          case 1: rowfn(T, 1, W, L, r, x, xs, y, ldy); break;                                       \
          case 2: rowfn(T, 2, W, L, r, x, xs, y, ldy); break;                                       \
          case 3: rowfn(T, 3, W, L, r, x, xs, y, ldy); break;                                       \
          default: rowfn(T, 4, W, L, r, x, xs, y, ldy); break;                                      \
        }                                                                                           \
      }                                                                                             \
  }

DEF_RUN(run_q8_0, a32_row, FLOE_TYPE_Q8_0)
DEF_RUN(run_q4_0, a32_row, FLOE_TYPE_Q4_0)
DEF_RUN(run_iq4_nl, a32_row, FLOE_TYPE_IQ4_NL)
DEF_RUN(run_mxfp4, a32_row, FLOE_TYPE_MXFP4)
DEF_RUN(run_q4_k, a256_row, FLOE_TYPE_Q4_K)
DEF_RUN(run_q5_k, a256_row, FLOE_TYPE_Q5_K)
DEF_RUN(run_q6_k, a256_row, FLOE_TYPE_Q6_K)
DEF_RUN(run_iq4_xs, a256_row, FLOE_TYPE_IQ4_XS)
DEF_RUN(run_mlx4, mlx_row, 4)
DEF_RUN(run_mlx8, mlx_row, 8)

KERN_DEF_MM_Q(kern_mm_q_avx2)

/* ================= float path ================= */

void kern_mm_float_avx2(const floe_mat *W, int nb, const float *X, int64_t ldx, const void *xq, size_t xs,
                        float *Y, int64_t ldy, int64_t r0, int64_t r1) {
  (void)xq;
  (void)xs;
  const uint32_t type = W->type;
  const int plain = type == FLOE_TYPE_F32 || type == FLOE_TYPE_F16 || type == FLOE_TYPE_BF16;
  float buf[KERN_CHUNK] __attribute__((aligned(32)));
  for (int64_t r = r0; r < r1; r++) {
    __m256 acc[16][4];
    for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = _mm256_setzero_ps();
    float tail[16] = {0};
    const uint8_t *row = kw_row(W, r);
    for (int64_t j0 = 0; j0 < W->cols; j0 += KERN_CHUNK) {
      int64_t n = W->cols - j0 < KERN_CHUNK ? W->cols - j0 : KERN_CHUNK;
      int64_t nv = n & ~(int64_t)7; /* vector part */
      if (plain) {
        for (int64_t j = 0; j < nv; j += 8) {
          __m256 v;
          if (type == FLOE_TYPE_F32) v = _mm256_loadu_ps((const float *)row + j0 + j);
          else {
            __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + j0 + j));
            v = type == FLOE_TYPE_F16 ? _mm256_cvtph_ps(h)
                                      : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
          }
          _mm256_store_ps(buf + j, v);
        }
        for (int64_t j = nv; j < n; j++) {
          const uint8_t *p = row + (size_t)(j0 + j) * (type == FLOE_TYPE_F32 ? 4 : 2);
          buf[j] = type == FLOE_TYPE_F32 ? *(const float *)p : kq_sb(type, p, 0);
        }
      } else {
        kern_dequant_chunk(W, r, j0, n, buf);
      }
      for (int b = 0; b < nb; b++) {
        const float *x = X + b * ldx + j0;
        __m256 a0 = acc[b][0], a1 = acc[b][1], a2 = acc[b][2], a3 = acc[b][3];
        int64_t j = 0;
        for (; j + 32 <= nv; j += 32) {
          a0 = _mm256_fmadd_ps(_mm256_load_ps(buf + j), _mm256_loadu_ps(x + j), a0);
          a1 = _mm256_fmadd_ps(_mm256_load_ps(buf + j + 8), _mm256_loadu_ps(x + j + 8), a1);
          a2 = _mm256_fmadd_ps(_mm256_load_ps(buf + j + 16), _mm256_loadu_ps(x + j + 16), a2);
          a3 = _mm256_fmadd_ps(_mm256_load_ps(buf + j + 24), _mm256_loadu_ps(x + j + 24), a3);
        }
        for (; j < nv; j += 8) a0 = _mm256_fmadd_ps(_mm256_load_ps(buf + j), _mm256_loadu_ps(x + j), a0);
        for (; j < n; j++) tail[b] += buf[j] * x[j];
        acc[b][0] = a0, acc[b][1] = a1, acc[b][2] = a2, acc[b][3] = a3;
      }
    }
    for (int b = 0; b < nb; b++) {
      __m256 s = _mm256_add_ps(_mm256_add_ps(acc[b][0], acc[b][1]), _mm256_add_ps(acc[b][2], acc[b][3]));
      __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
      q = _mm_add_ps(q, _mm_movehl_ps(q, q));
      q = _mm_add_ss(q, _mm_movehdup_ps(q));
      Y[b * ldy + r] = _mm_cvtss_f32(q) + tail[b];
    }
  }
}
