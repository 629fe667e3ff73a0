/* CPU kernels against the quant reference, for every type x every ISA this CPU has x both paths.
 *
 * For each type and shape (awkward column counts: 1 block, 2, 7, 13 blocks, and 18 for the
 * 256-blocks; rows 1, 3, 17, 33):
 *  - float path: |y - quant_dot_ref| <= 1e-5 * S (S = sum |w_j x_j|), every ISA;
 *  - quantized path (types that have one): |y - ref| <= 1e-2 * S on standard-normal x (the
 *    README's guidance for 8-bit activations); on every x (incl. outliers, where 8-bit blocks
 *    alone lose more than 1e-2) |y - ref(xhat)| <= 1e-4 * S with xhat the quantized activation;
 *    and the AVX2 / AVX-512 results equal the scalar result bit for bit;
 *  - row-exactness: row b of a call with nb in {2,3,4,7,8,16} is bit-identical to the nb = 1 call,
 *    for every ISA and path (nb 3..8 of Q4_K/Q5_K rows up to 16 superblocks: the decode-once form);
 *  - attention rows: kern_dot16_rows / kern_wsum_rows on every ISA bit-identical to the scalar
 *    references, F32 and BF16 cache rows, awkward row counts, strides and lengths; the reference
 *    itself against a plain double-checked formula of its documented order;
 *  - threads: kern_matmul_mt / kern_matmul_q_mt with a 2-thread pool equal the 1-thread call bit
 *    for bit; kern_matmul_q_mt with 1-4 threads and nb 1-3 (the activation quantized in parts by
 *    the threads) writes the same quantized rows as kern_act_quantize and the same Y.
 * Weights come from quant_fill_random (ggml types) or quant_mlx_quantize_row (MLX); x is standard
 * normal with ~1/64 outliers of magnitude 6..24. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "test.h"

#define NBMAX 16

static floe_rng rng;

static void fill_x_(float *x, int64_t n, int outliers) {
  for (int64_t i = 0; i < n; i++) {
    x[i] = floe_rng_normal(&rng);
    if (outliers && floe_rng_uniform(&rng) < 1.0f / 64)
      x[i] = (floe_rng_uniform(&rng) < 0.5f ? -1 : 1) * (6 + 18 * floe_rng_uniform(&rng));
  }
}
static void fill_x(float *x, int64_t n) { fill_x_(x, n, 1); }

/* The activation as the quantized path sees it: 8-bit per block of `blk` values, d = amax/127
 * (the format documented in kernels_internal.h), dequantized back to floats. */
static void act_dequant(const float *x, int64_t n, int blk, float *xh) {
  for (int64_t k = 0; k < n; k += blk) {
    float amax = 0;
    for (int i = 0; i < blk; i++) amax = fmaxf(amax, fabsf(x[k + i]));
    float id = amax > 0 ? 127.0f / amax : 0, d = amax / 127.0f;
    for (int i = 0; i < blk; i++) xh[k + i] = nearbyintf(x[k + i] * id) * d;
  }
}
static int act_block(const floe_mat *W) {
  switch (W->type) {
    case FLOE_TYPE_Q8_0: case FLOE_TYPE_Q4_0: case FLOE_TYPE_IQ4_NL: case FLOE_TYPE_MXFP4: return 32;
    case FLOE_TYPE_MLX: return W->mlx.group;
    default: return 256;
  }
}

typedef struct {
  floe_mat W;
  void *data, *scales, *biases;
} tmat;

static void tmat_free(tmat *m) {
  free(m->data);
  free(m->scales);
  free(m->biases);
}

/* Every block's f16 scale fields get their own factor (test_vary_f16), from a generator of their
 * own: the draws of weights and activations stay those the tolerances were set on. */
static floe_rng rng_sc;
static void vary_f16(uint8_t *p) { test_vary_f16(&rng_sc, p); }
static void vary_scales(uint32_t type, uint8_t *b, int64_t nblocks) {
  const size_t bytes = floe_type_info(type)->bytes;
  for (int64_t i = 0; i < nblocks; i++, b += bytes) switch (type) {
      case FLOE_TYPE_Q4_0: case FLOE_TYPE_Q5_0: case FLOE_TYPE_Q8_0: case FLOE_TYPE_IQ4_NL: case FLOE_TYPE_IQ4_XS:
        vary_f16(b); /* d first */
        break;
      case FLOE_TYPE_Q4_1: case FLOE_TYPE_Q5_1: case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K:
        vary_f16(b); /* d, then the min or dmin */
        vary_f16(b + 2);
        break;
      case FLOE_TYPE_Q6_K: vary_f16(b + bytes - 2); break; /* d last */
      case FLOE_TYPE_Q2_K: vary_f16(b + bytes - 4); vary_f16(b + bytes - 2); break; /* d, dmin last */
      default: break;
    }
}

static tmat make_ggml(uint32_t type, int64_t rows, int64_t cols) {
  tmat m = {0};
  const floe_type_traits *tt = floe_type_info(type);
  m.W.type = type;
  m.W.rows = rows;
  m.W.cols = cols;
  m.W.row_bytes = floe_row_bytes(type, cols);
  m.data = malloc(m.W.row_bytes * (size_t)rows + 64);
  quant_fill_random(type, &rng, m.data, rows * (cols / tt->blck), 1.0f);
  vary_scales(type, m.data, rows * (cols / tt->blck));
  m.W.data = m.data;
  return m;
}

static tmat make_mlx(int bits, int group, uint32_t sbt, int64_t rows, int64_t cols) {
  tmat m = {0};
  m.W.type = FLOE_TYPE_MLX;
  m.W.rows = rows;
  m.W.cols = cols;
  m.W.mlx = (quant_mlx_fmt){bits, group, sbt};
  m.W.row_bytes = quant_mlx_row_bytes(&m.W.mlx, cols);
  m.W.sb_row_bytes = (size_t)(cols / group) * (sbt == FLOE_TYPE_F32 ? 4 : 2);
  m.data = malloc(m.W.row_bytes * (size_t)rows + 64);
  m.scales = malloc(m.W.sb_row_bytes * (size_t)rows + 64);
  m.biases = malloc(m.W.sb_row_bytes * (size_t)rows + 64);
  float *src = malloc(sizeof(float) * (size_t)cols);
  for (int64_t r = 0; r < rows; r++) {
    fill_x(src, cols);
    quant_mlx_quantize_row(&m.W.mlx, src, (uint8_t *)m.data + r * m.W.row_bytes,
                           (uint8_t *)m.scales + r * m.W.sb_row_bytes, (uint8_t *)m.biases + r * m.W.sb_row_bytes, cols);
  }
  free(src);
  m.W.data = m.data;
  m.W.scales = m.scales;
  m.W.biases = m.biases;
  return m;
}

/* reference dot and S for row r, activation x */
static void ref_dot(const floe_mat *W, int64_t r, const float *x, float *buf, double *ref, double *S) {
  const uint8_t *row = (const uint8_t *)W->data + r * W->row_bytes;
  if (W->type == FLOE_TYPE_MLX) {
    const uint8_t *sc = (const uint8_t *)W->scales + r * W->sb_row_bytes, *bi = (const uint8_t *)W->biases + r * W->sb_row_bytes;
    *ref = quant_mlx_dot_ref(&W->mlx, row, sc, bi, x, W->cols);
    quant_mlx_dequant_row(&W->mlx, row, sc, bi, buf, W->cols);
  } else {
    *ref = quant_dot_ref(W->type, row, x, W->cols);
    quant_dequant_row(W->type, row, buf, W->cols);
  }
  double s = 0;
  for (int64_t j = 0; j < W->cols; j++) s += fabs((double)buf[j] * x[j]);
  *S = s;
}

static int isas[3], n_isa;

typedef struct {
  int fl_ref, q_ref, q_bits, rowex, mt;
  double fl_worst, q_worst, qh_worst; /* worst |err| / S */
} tstats;

/* Runs every check on one matrix; returns after recording into st. */
static void check_mat(const char *name, const floe_mat *W, floe_pool *pool, tstats *st) {
  const int64_t rows = W->rows, cols = W->cols;
  float *X = malloc(sizeof(float) * (size_t)(NBMAX * cols));
  /* odd activation rows: standard normal (the README's setting for the 1e-2 guidance); even rows
   * also carry outliers */
  for (int b = 0; b < NBMAX; b++) fill_x_(X + b * cols, cols, !(b & 1));
  double *ref = malloc(sizeof(double) * (size_t)(NBMAX * rows)), *S = malloc(sizeof(double) * (size_t)(NBMAX * rows));
  double *refh = malloc(sizeof(double) * (size_t)(NBMAX * rows)), *Sh = malloc(sizeof(double) * (size_t)(NBMAX * rows));
  float *buf = malloc(sizeof(float) * (size_t)cols), *xh = malloc(sizeof(float) * (size_t)cols);
  const size_t ab = kern_act_bytes(W);
  for (int b = 0; b < NBMAX; b++) {
    if (ab) act_dequant(X + b * cols, cols, act_block(W), xh);
    for (int64_t r = 0; r < rows; r++) {
      ref_dot(W, r, X + b * cols, buf, &ref[b * rows + r], &S[b * rows + r]);
      if (ab) ref_dot(W, r, xh, buf, &refh[b * rows + r], &Sh[b * rows + r]);
    }
  }
  void *xq = ab ? floe_aligned_alloc(64, ab * NBMAX) : NULL;
  if (xq) kern_act_quantize_rows(W, NBMAX, X, cols, xq, ab);
  float *Y1 = malloc(sizeof(float) * (size_t)(NBMAX * rows)), *Yn = malloc(sizeof(float) * (size_t)(NBMAX * rows));
  float *Yscalar_q = malloc(sizeof(float) * (size_t)(NBMAX * rows));
  static const int nbs[] = {2, 3, 4, 7, 8, 9, 16};
  for (int path = 0; path < (xq ? 2 : 1); path++) {
    const void *xqp = path ? xq : NULL;
    const double tol = path ? 1e-2 : 1e-5;
    for (int ii = 0; ii < n_isa; ii++) {
      kern_isa_set(isas[ii]);
      const char *in = kern_isa_name(isas[ii]);
      /* nb = 1 for every activation row */
      for (int b = 0; b < NBMAX; b++)
        kern_matmul(W, 1, X + b * cols, cols, xqp ? (const uint8_t *)xq + b * ab : NULL, ab, Y1 + b * rows, rows, 0, rows);
      double worst = 0, worsth = 0;
      int bad = 0, badh = 0;
      for (int b = 0; b < NBMAX; b++)
        for (int64_t r = 0; r < rows; r++) {
          double e = fabs(Y1[b * rows + r] - ref[b * rows + r]), s = S[b * rows + r];
          double rel = e / (s > 1e-30 ? s : 1e-30);
          /* the float path on every row; the quantized path against the exact reference on the
           * outlier-free rows, and on every row against the reference computed with the
           * quantized activation xhat (the kernel's own arithmetic: 1e-4 * S) */
          if (!path || (b & 1)) {
            if (rel > worst) worst = rel;
            if (!(e <= tol * s + 1e-30)) bad++;
          }
          if (path) {
            double eh = fabs(Y1[b * rows + r] - refh[b * rows + r]), sh = Sh[b * rows + r];
            if (eh / (sh > 1e-30 ? sh : 1e-30) > worsth) worsth = eh / (sh > 1e-30 ? sh : 1e-30);
            if (!(eh <= 1e-4 * sh + 1e-30)) badh++;
          }
        }
      CHECK(bad == 0, "%s %s rows=%lld cols=%lld %s path: %d outputs off the reference (worst %.3g*S, tol %.0e)", name, in,
            (long long)rows, (long long)cols, path ? "quantized" : "float", bad, worst, tol);
      if (path)
        CHECK(badh == 0, "%s %s rows=%lld cols=%lld quantized path: %d outputs off the xhat reference (worst %.3g*S, tol 1e-4)",
              name, in, (long long)rows, (long long)cols, badh, worsth);
      if (path && worsth > st->qh_worst) st->qh_worst = worsth;
      if (path) {
        st->q_ref++;
        if (worst > st->q_worst) st->q_worst = worst;
      } else {
        st->fl_ref++;
        if (worst > st->fl_worst) st->fl_worst = worst;
      }
      /* the AVX-512 float path follows kern_mm_float_lanes_ref's order bit for bit (the CUDA
       * float path's oracle for F32/F16/BF16) */
      if (!path && isas[ii] == FLOE_ISA_AVX512) {
        memset(Yn, 0, sizeof(float) * (size_t)(NBMAX * rows));
        kern_mm_float_lanes_ref(W, NBMAX, X, cols, Yn, rows, 0, rows);
        CHECK(memcmp(Yn, Y1, sizeof(float) * (size_t)(NBMAX * rows)) == 0,
              "%s avx512 rows=%lld cols=%lld float path == kern_mm_float_lanes_ref bit for bit", name, (long long)rows,
              (long long)cols);
      }
      /* cross-ISA bit equality of the quantized path */
      if (path) {
        if (isas[ii] == FLOE_ISA_SCALAR) memcpy(Yscalar_q, Y1, sizeof(float) * (size_t)(NBMAX * rows));
        else {
          CHECK(memcmp(Yscalar_q, Y1, sizeof(float) * (size_t)(NBMAX * rows)) == 0,
                "%s %s rows=%lld cols=%lld quantized path differs from scalar bit-wise", name, in, (long long)rows, (long long)cols);
          st->q_bits++;
        }
      }
      /* row-exactness */
      for (size_t k = 0; k < sizeof nbs / sizeof nbs[0]; k++) {
        int nb = nbs[k];
        memset(Yn, 0, sizeof(float) * (size_t)(NBMAX * rows));
        kern_matmul(W, nb, X, cols, xqp, ab, Yn, rows, 0, rows);
        CHECK(memcmp(Yn, Y1, sizeof(float) * (size_t)(nb * rows)) == 0, "%s %s %s nb=%d rows not bit-identical to nb=1", name, in,
              path ? "quantized" : "float", nb);
        st->rowex++;
      }
      /* threads: partial row ranges */
      if (pool && ii == n_isa - 1) {
        memset(Yn, 0, sizeof(float) * (size_t)(NBMAX * rows));
        if (path) {
          void *xq2 = floe_aligned_alloc(64, ab * NBMAX);
          kern_matmul_q_mt(pool, W, 7, X, cols, xq2, Yn, rows);
          free(xq2);
        } else {
          kern_matmul_mt(pool, W, 7, X, cols, NULL, 0, Yn, rows);
        }
        CHECK(memcmp(Yn, Y1, sizeof(float) * (size_t)(7 * rows)) == 0, "%s %s threaded result differs", name, path ? "quantized" : "float");
        st->mt++;
      }
    }
  }
  kern_isa_set(isas[n_isa - 1]);
  floe_aligned_free(xq);
  free(refh), free(Sh), free(xh);
  free(X), free(ref), free(S), free(buf), free(Y1), free(Yn), free(Yscalar_q);
}

static void report(const char *name, const tstats *st) {
  printf("  %-22s float-vs-ref %2d (worst %.1e*S)  quant-vs-ref %2d (worst %.1e*S, vs xhat %.1e)  quant-bit-equal %2d  row-exact %3d  threads %d\n",
         name, st->fl_ref, st->fl_worst, st->q_ref, st->q_worst, st->qh_worst, st->q_bits, st->rowex, st->mt);
}

/* kern_dot16_rows / kern_wsum_rows: every ISA equals the scalar reference bit for bit, and the
 * reference follows its documented order (checked against a direct transcription here). */
static float red16_direct(const float *v) {
  float a[8], b[4];
  for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

static void test_attention_rows(void) {
  SECTION("attention rows (kern_dot16_rows, kern_wsum_rows)");
  static const int64_t lens[] = { 16, 48, 128, 256, 20, 272, 1040 }; /* 1040: past QK_MAX_N */
  int nd = 0, nw = 0, bad_d = 0, bad_w = 0, bad_ref = 0;
  for (int bf = 0; bf < 2; bf++)
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      /* cache rows contiguous (ldb == n, as in the KV cache: the PV prefetch then runs in address
       * order) or strided; up to 4 blocks of 64 positions */
      const int64_t n = lens[li], lda = n + 3, ldb = li % 2 ? n : n + 16 * bf + 5;
      const int64_t np = 1 + (int64_t)(floe_rng_u64(&rng) % 230);
      float *A = malloc(sizeof(float) * 9 * lda), *Bf = malloc(sizeof(float) * np * ldb);
      uint16_t *Bh = malloc(2 * np * ldb);
      for (int64_t i = 0; i < 9 * lda; i++) A[i] = floe_rng_normal(&rng);
      for (int64_t i = 0; i < np * ldb; i++) {
        Bh[i] = floe_f32_to_bf16(floe_rng_normal(&rng));
        Bf[i] = bf ? floe_bf16_to_f32(Bh[i]) : floe_rng_normal(&rng) * 3.0f;
      }
      const void *B = bf ? (const void *)Bh : (const void *)Bf;
      const int64_t ldo = np + 7, ldw = np + 2;
      float *ref = malloc(sizeof(float) * 9 * ldo), *got = malloc(sizeof(float) * 9 * ldo);
      float *W = malloc(sizeof(float) * 9 * ldw), *O0 = malloc(sizeof(float) * 9 * (n + 9));
      float *Or = malloc(sizeof(float) * 9 * (n + 9)), *Og = malloc(sizeof(float) * 9 * (n + 9));
      for (int64_t i = 0; i < 9 * ldw; i++) W[i] = (float)(floe_rng_u64(&rng) % 1000) / 997.0f;
      for (int64_t i = 0; i < 9 * (n + 9); i++) O0[i] = floe_rng_normal(&rng);
      for (int na = 1; na <= 9; na++) {
        if (n % 16 == 0) {
          int prev = kern_isa_set(FLOE_ISA_SCALAR);
          memset(ref, 0, sizeof(float) * 9 * ldo);
          kern_dot16_rows(A, lda, na, B, bf, ldb, np, n, ref, ldo);
          for (int a = 0; a < na; a++) /* the documented order, written out */
            for (int64_t b = 0; b < np; b++) {
              float acc[16] = { 0 };
              for (int64_t j = 0; j < n; j += 16)
                for (int i = 0; i < 16; i++) acc[i] = fmaf(A[a * lda + j + i], Bf[b * ldb + j + i], acc[i]);
              const float d = red16_direct(acc); /* Bf holds B's values (BF16 widened) */
              bad_ref += memcmp(&d, &ref[a * ldo + b], 4) != 0;
            }
          for (int ii = 1; ii < n_isa; ii++) {
            kern_isa_set(isas[ii]);
            memset(got, 0, sizeof(float) * 9 * ldo);
            kern_dot16_rows(A, lda, na, B, bf, ldb, np, n, got, ldo);
            bad_d += memcmp(ref, got, sizeof(float) * 9 * ldo) != 0;
            nd++;
          }
          kern_isa_set(prev);
        }
        const int64_t ldo2 = n + 9;
        int prev = kern_isa_set(FLOE_ISA_SCALAR);
        memcpy(Or, O0, sizeof(float) * 9 * ldo2);
        kern_wsum_rows(W, ldw, na, B, bf, ldb, np, n, Or, ldo2);
        for (int h = 0; h < na; h++) /* the documented order, written out */
          for (int64_t i = 0; i < n; i++) {
            float o = O0[h * ldo2 + i];
            for (int64_t p = 0; p < np; p++) o = fmaf(W[h * ldw + p], Bf[p * ldb + i], o);
            bad_ref += memcmp(&o, &Or[h * ldo2 + i], 4) != 0;
          }
        for (int ii = 1; ii < n_isa; ii++) {
          kern_isa_set(isas[ii]);
          memcpy(Og, O0, sizeof(float) * 9 * ldo2);
          kern_wsum_rows(W, ldw, na, B, bf, ldb, np, n, Og, ldo2);
          bad_w += memcmp(Or, Og, sizeof(float) * 9 * ldo2) != 0;
          nw++;
        }
        kern_isa_set(prev);
      }
      free(A), free(Bf), free(Bh), free(ref), free(got), free(W), free(O0), free(Or), free(Og);
    }
  CHECK(nd > 0 && bad_d == 0, "kern_dot16_rows: %d of %d ISA runs differ from scalar", bad_d, nd);
  CHECK(nw > 0 && bad_w == 0, "kern_wsum_rows: %d of %d ISA runs differ from scalar", bad_w, nw);
  CHECK(bad_ref == 0, "references follow their documented order (%d values differ)", bad_ref);
}

/* kern_read_xor: every ISA gives the reference's value at every start offset (0-9 bytes past a
 * 64-byte boundary, and odd) and awkward length, and the reference is the XOR of the words it
 * documents (a changed byte anywhere changes it). */
static void test_read_xor(void) {
  SECTION("read_xor");
  static const size_t lens[] = { 0, 1, 7, 8, 9, 63, 64, 65, 255, 256, 257, 1000, 4099, 100003 };
  const size_t cap = 100003 + 128;
  uint8_t *buf = floe_aligned_alloc(64, cap);
  for (size_t i = 0; i < cap; i++) buf[i] = (uint8_t)floe_rng_u64(&rng);
  int bad = 0, runs = 0, bad_ref = 0;
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (size_t off = 0; off < 10; off++) {
      const uint8_t *x = buf + off + (off == 9 ? 54 : 0);
      const size_t n = lens[li];
      int prev = kern_isa_set(FLOE_ISA_SCALAR);
      const uint64_t ref = kern_read_xor(x, n);
      uint64_t want = 0;
      for (size_t i = 0; i < n; i++) want ^= (uint64_t)x[i] << (8 * (i % 8));
      bad_ref += ref != want;
      for (int ii = 1; ii < n_isa; ii++) {
        kern_isa_set(isas[ii]);
        bad += kern_read_xor(x, n) != ref;
        runs++;
      }
      kern_isa_set(prev);
    }
  /* one flipped bit, far inside the vector loop, changes the value */
  int prev = kern_isa_set(isas[n_isa - 1]);
  const uint64_t before = kern_read_xor(buf, 100003);
  buf[50001] ^= 4;
  const uint64_t after = kern_read_xor(buf, 100003);
  kern_isa_set(prev);
  floe_aligned_free(buf);
  CHECK(bad_ref == 0, "read_xor reference is the XOR of the little-endian words (%d differ)", bad_ref);
  CHECK(runs > 0 && bad == 0, "read_xor: %d of %d ISA runs differ from the reference", bad, runs);
  CHECK(before != after, "read_xor sees a flipped bit");
}

/* kern_argmax: every ISA gives the reference's index (first maximum, NaN never chosen, 0 when
 * nothing is above -inf) on awkward lengths with ties, NaNs, infinities and signed zeros. */
static void test_argmax(void) {
  SECTION("argmax");
  static const int64_t lens[] = { 1, 2, 15, 16, 17, 31, 33, 100, 1000, 248320 };
  int bad = 0, runs = 0, bad_ref = 0, bad_parts = 0, runs_parts = 0;
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int variant = 0; variant < 7; variant++) {
      const int64_t n = lens[li];
      float *x = malloc(sizeof(float) * (size_t)n);
      for (int64_t i = 0; i < n; i++) {
        const uint64_t u = floe_rng_u64(&rng);
        x[i] = variant == 1 ? (float)(u % 7) : floe_rng_normal(&rng); /* 1: many ties */
        if (variant == 2 && u % 5 == 0) x[i] = NAN;
        if (variant == 3) x[i] = u % 3 ? -INFINITY : NAN;          /* nothing above -inf */
        if (variant == 4) x[i] = u % 2 ? 0.0f : -0.0f;               /* signed-zero ties */
        if (variant == 5 && i == n - 1) x[i] = INFINITY;             /* the very last element */
        if (variant == 6) x[i] = i == 0 ? NAN : u % 2 ? -INFINITY : NAN; /* a NaN first, then -inf: 0 */
      }
      int prev = kern_isa_set(FLOE_ISA_SCALAR);
      const int64_t ref = kern_argmax(x, n);
      /* the documented rule, written out */
      int64_t want = 0;
      float bv = -INFINITY;
      for (int64_t i = 0; i < n; i++)
        if (x[i] > bv) bv = x[i], want = i;
      bad_ref += ref != want;
      for (int ii = 1; ii < n_isa; ii++) {
        kern_isa_set(isas[ii]);
        bad += kern_argmax(x, n) != ref;
        runs++;
      }
      /* by parts (layer_matmul_argmax: each thread over the rows it computed, in any order): the
       * largest kern_argmax_key of the parts' picks names the same index */
      for (int ii = 0; ii < n_isa; ii++) {
        kern_isa_set(isas[ii]);
        int64_t cut[9] = { 0 };
        const int np = 1 + (int)(floe_rng_u64(&rng) % 8);
        for (int c = 1; c < np; c++) cut[c] = (int64_t)(floe_rng_u64(&rng) % (uint64_t)n);
        cut[np] = n;
        for (int a = 1; a < np; a++) /* sort the cuts */
          for (int b = a; b > 0 && cut[b - 1] > cut[b]; b--) {
            const int64_t t = cut[b]; cut[b] = cut[b - 1]; cut[b - 1] = t;
          }
        uint64_t best = 0;
        for (int c = np - 1; c >= 0; c--) { /* back to front: the order of the parts does not matter */
          if (cut[c + 1] <= cut[c]) continue;
          const int64_t i = cut[c] + kern_argmax(x + cut[c], cut[c + 1] - cut[c]);
          const uint64_t k = kern_argmax_key(x[i], i);
          best = k > best ? k : best;
        }
        bad_parts += kern_argmax_key_index(best) != ref;
        runs_parts++;
      }
      kern_isa_set(prev);
      free(x);
    }
  CHECK(bad_ref == 0, "argmax reference follows its rule (%d differ)", bad_ref);
  CHECK(runs > 0 && bad == 0, "argmax: %d of %d ISA runs differ from the reference", bad, runs);
  CHECK(runs_parts > 0 && bad_parts == 0, "argmax by parts: %d of %d runs differ from the reference", bad_parts, runs_parts);
}

int main(void) {
  floe_rng_seed(&rng, 1234);
  floe_rng_seed(&rng_sc, 99);
  isas[n_isa++] = FLOE_ISA_SCALAR;
  if (kern_isa_set(FLOE_ISA_AVX2) >= 0) isas[n_isa++] = FLOE_ISA_AVX2;
  if (kern_isa_set(FLOE_ISA_AVX512) >= 0) isas[n_isa++] = FLOE_ISA_AVX512;
  printf("ISAs:");
  for (int i = 0; i < n_isa; i++) printf(" %s", kern_isa_name(isas[i]));
  printf("\n");
  floe_pool *pool = floe_pool_create(2);

  SECTION("ggml types");
  static const uint32_t types[] = {
      FLOE_TYPE_F32, FLOE_TYPE_F16, FLOE_TYPE_BF16, FLOE_TYPE_Q4_0, FLOE_TYPE_Q4_1, FLOE_TYPE_Q5_0, FLOE_TYPE_Q5_1,
      FLOE_TYPE_Q8_0, FLOE_TYPE_Q2_K, FLOE_TYPE_Q3_K, FLOE_TYPE_Q4_K, FLOE_TYPE_Q5_K, FLOE_TYPE_Q6_K,
      FLOE_TYPE_IQ2_XXS, FLOE_TYPE_IQ2_XS, FLOE_TYPE_IQ2_S, FLOE_TYPE_IQ3_XXS, FLOE_TYPE_IQ3_S, FLOE_TYPE_IQ1_S,
      FLOE_TYPE_IQ1_M, FLOE_TYPE_IQ4_NL, FLOE_TYPE_IQ4_XS, FLOE_TYPE_MXFP4};
  static const int64_t rowsv[] = {1, 3, 17, 33};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    const floe_type_traits *tt = floe_type_info(types[t]);
    tstats st = {0};
    /* block counts 1, 2, 7, 13 (plain types: 1, 7, 33, 100, 1000 columns) */
    const int64_t blk_plain[] = {1, 7, 33, 100, 1000}, blk_q[] = {1, 2, 7, 13, 18};
    /* 18 superblocks: the Q4_K/Q5_K slot wrap (k % 16), a partial group of 4 */
    const int nshape = tt->blck == 1 ? 5 : tt->blck == 256 ? 5 : 4;
    for (int s = 0; s < nshape; s++)
      for (int ri = 0; ri < 4; ri++) { /* every row count with every width (4-row blocks of 2-superblock rows) */
        int64_t cols = tt->blck == 1 ? blk_plain[s] : blk_q[s] * tt->blck;
        int64_t rows = rowsv[(s + ri) % 4];
        tmat m = make_ggml(types[t], rows, cols);
        check_mat(tt->name, &m.W, pool, &st);
        tmat_free(&m);
      }
    report(tt->name, &st);
  }

  SECTION("MLX affine: bits x group x scale type");
  static const int bitsv[] = {2, 3, 4, 5, 6, 8}, groupv[] = {32, 64, 128};
  static const uint32_t sbv[] = {FLOE_TYPE_F32, FLOE_TYPE_F16, FLOE_TYPE_BF16};
  for (int bi = 0; bi < 6; bi++)
    for (int gi = 0; gi < 3; gi++)
      for (int si = 0; si < 3; si++) {
        char name[64];
        snprintf(name, sizeof name, "mlx%d g%d %s", bitsv[bi], groupv[gi], floe_type_info(sbv[si])->name);
        tstats st = {0};
        const int64_t ngroups[] = {1, 3, 13};
        for (int s = 0; s < 3; s++) {
          tmat m = make_mlx(bitsv[bi], groupv[gi], sbv[si], rowsv[(s + si) % 4], ngroups[s] * groupv[gi]);
          check_mat(name, &m.W, pool, &st);
          tmat_free(&m);
        }
        report(name, &st);
      }

  SECTION("MLX 4/8-bit, 37 groups (the AVX-512 row-pair kernel's several 16-group windows, partial last one)");
  for (int bi = 0; bi < 2; bi++)
    for (int gi = 0; gi < 3; gi++)
      for (int si = 0; si < 3; si++) {
        char name[64];
        snprintf(name, sizeof name, "mlx%d g%d %s x37", bi ? 8 : 4, groupv[gi], floe_type_info(sbv[si])->name);
        tstats st = {0};
        tmat m = make_mlx(bi ? 8 : 4, groupv[gi], sbv[si], 5, 37 * groupv[gi]);
        check_mat(name, &m.W, pool, &st);
        tmat_free(&m);
        report(name, &st);
      }

  SECTION("kern_matmul_q_mt: 1-4 threads, nb 1-3, quantization split across threads");
  {
    /* the activation row is quantized in parts by the pool's threads (kernels.c mt_quant_matmul):
     * the quantized bytes must equal kern_act_quantize's and Y the 1-thread kern_matmul, for row
     * counts that split unevenly (odd, below 16, not a multiple of 16) and rows with few units
     * (1 superblock, 13 A32 blocks, a partial last MLX step) */
    floe_pool *pools[4];
    for (int t = 0; t < 4; t++) pools[t] = floe_pool_create(t + 1);
    int nok = 0;
    for (int mi = 0; mi < 9; mi++) {
      static const int64_t rws[] = {1, 3, 17, 33, 47, 130};
      const int64_t rows = rws[mi % 6];
      tmat m = mi == 0   ? make_ggml(FLOE_TYPE_Q8_0, rows, 13 * 32)
               : mi == 1 ? make_ggml(FLOE_TYPE_Q8_0, rows, 2048)
               : mi == 2 ? make_ggml(FLOE_TYPE_Q4_K, rows, 256)
               : mi == 3 ? make_ggml(FLOE_TYPE_Q4_K, rows, 1280)
               : mi == 4 ? make_ggml(FLOE_TYPE_IQ4_XS, rows, 2048)
               : mi == 5 ? make_mlx(4, 64, FLOE_TYPE_BF16, rows, 2048)
               : mi == 6 ? make_mlx(4, 128, FLOE_TYPE_F16, rows, 13 * 128)
               : mi == 7 ? make_mlx(8, 32, FLOE_TYPE_BF16, rows, 1312) /* 41 groups: padding past n in two units */
                         : make_mlx(4, 32, FLOE_TYPE_F32, rows, 1344);
      const int64_t cols = m.W.cols;
      const size_t ab = kern_act_bytes(&m.W);
      float *X = malloc(sizeof(float) * (size_t)(3 * cols));
      for (int b = 0; b < 3; b++) fill_x(X + b * cols, cols);
      uint8_t *xr = floe_aligned_alloc(64, 3 * ab), *xt = floe_aligned_alloc(64, 3 * ab);
      float *Yr = malloc(sizeof(float) * (size_t)(3 * rows)), *Yt = malloc(sizeof(float) * (size_t)(3 * rows));
      for (int ii = 0; ii < n_isa; ii++) {
        kern_isa_set(isas[ii]);
        memset(xr, 0x5A, 3 * ab);
        kern_act_quantize_rows(&m.W, 3, X, cols, xr, ab);
        for (int nb = 1; nb <= 3; nb++) {
          kern_matmul(&m.W, nb, X, cols, xr, ab, Yr, rows, 0, rows);
          for (int t = 0; t < 4; t++) {
            memset(xt, 0x5A, 3 * ab);
            memset(Yt, 0, sizeof(float) * (size_t)(3 * rows));
            kern_matmul_q_mt(pools[t], &m.W, nb, X, cols, xt, Yt, rows);
            CHECK(memcmp(xt, xr, (size_t)nb * ab) == 0, "type %u cols=%lld %s nb=%d %d threads: quantized rows differ", m.W.type,
                  (long long)cols, kern_isa_name(isas[ii]), nb, t + 1);
            CHECK(memcmp(Yt, Yr, sizeof(float) * (size_t)(nb * rows)) == 0, "type %u rows=%lld cols=%lld %s nb=%d %d threads: Y differs",
                  m.W.type, (long long)rows, (long long)cols, kern_isa_name(isas[ii]), nb, t + 1);
            nok++;
          }
        }
      }
      kern_isa_set(isas[n_isa - 1]);
      floe_aligned_free(xr), floe_aligned_free(xt);
      free(X), free(Yr), free(Yt);
      tmat_free(&m);
    }
    for (int t = 0; t < 4; t++) floe_pool_free(pools[t]);
    printf("  threaded calls equal to 1 thread (quantized rows and Y): %d\n", nok);
  }

  SECTION("activation quantization is the same for every ISA");
  {
    /* kern_act_quantize is scalar code shared by all ISAs; check it is deterministic and that
     * kern_act_bytes is 0 exactly for the types without a quantized path. */
    tmat m = make_ggml(FLOE_TYPE_Q5_1, 1, 64);
    CHECK(kern_act_bytes(&m.W) == 0, "q5_1 has no quantized path (act bytes %zu)", kern_act_bytes(&m.W));
    tmat_free(&m);
    tmat k = make_ggml(FLOE_TYPE_Q4_K, 1, 512);
    CHECK(kern_act_bytes(&k.W) > 512, "q4_K act bytes %zu", kern_act_bytes(&k.W));
    tmat_free(&k);
    /* the ISA-specific quantizers (AVX-512 act_q8) write the same bytes as the scalar one, on
     * normal rows with outliers, an all-zero block, and tiny / huge magnitudes */
    static const uint32_t qt[] = {FLOE_TYPE_Q8_0, FLOE_TYPE_Q4_0, FLOE_TYPE_IQ4_NL, FLOE_TYPE_MXFP4,
                                  FLOE_TYPE_Q4_K, FLOE_TYPE_Q5_K, FLOE_TYPE_Q6_K, FLOE_TYPE_IQ4_XS};
    int nq = 0;
    for (size_t t = 0; t < sizeof qt / sizeof qt[0] + 6; t++) {
      tmat m = t < sizeof qt / sizeof qt[0] ? make_ggml(qt[t], 1, 1280)
                                            : make_mlx(t % 2 ? 8 : 4, 32 << (t % 3), FLOE_TYPE_BF16, 1, (32 << (t % 3)) < 128 ? 1344 : 1280); /* 1344: a partial last step */
      const int64_t cols = m.W.cols;
      float *x = malloc(sizeof(float) * (size_t)cols);
      fill_x(x, cols);
      for (int i = 256; i < 512; i++) x[i] = 0;
      for (int i = 512; i < 768; i++) x[i] *= 1e-30f;
      for (int i = 768; i < 1024; i++) x[i] *= 1e30f;
      const size_t ab = kern_act_bytes(&m.W);
      uint8_t *ref = malloc(ab), *got = malloc(ab);
      int prev = kern_isa_set(FLOE_ISA_SCALAR);
      memset(ref, 0x5A, ab);
      kern_act_quantize(&m.W, x, ref);
      for (int ii = 1; ii < n_isa; ii++) {
        kern_isa_set(isas[ii]);
        memset(got, 0x5A, ab);
        kern_act_quantize(&m.W, x, got);
        CHECK(memcmp(ref, got, ab) == 0, "type %u (t=%zu) %s activation quantization differs from scalar", m.W.type, t,
              kern_isa_name(isas[ii]));
        nq++;
      }
      kern_isa_set(prev);
      free(ref), free(got), free(x);
      tmat_free(&m);
    }
    printf("  quantized activation rows bit-equal to scalar: %d\n", nq);
  }
  test_attention_rows();
  test_argmax();
  test_read_xor();

  /* last, so that the random inputs of the sections above stay what they were */
  SECTION("F32 rows of whole 64-value steps (the AVX-512 path without the chunk copy)");
  {
    tstats st = {0};
    static const int64_t colsv[] = {64, 1088, 2048};
    for (int s = 0; s < 3; s++)
      for (int ri = 0; ri < 4; ri++) {
        tmat m = make_ggml(FLOE_TYPE_F32, rowsv[ri], colsv[s]);
        check_mat("f32 64-steps", &m.W, pool, &st);
        tmat_free(&m);
      }
    report("f32 64-steps", &st);
  }
  floe_pool_free(pool);
  return TEST_DONE();
}
