/* CUDA matmul layer (src/kernels/cuda/cuda_mm.h) against the CPU kernels, on fresh random weights
 * and activations of awkward sizes, for every weight type floe reads.
 *
 *  - activation quantization: the GPU's bytes equal kern_act_quantize_rows' (every format);
 *  - quantized path: Y from cuda_mm_matmul equals kern_matmul_batch with the same quantized rows
 *    bit for bit, with the CPU's best ISA and with the scalar ISA, nb in {1,2,3,7,11,16,33}, with each
 *    kernel choice (Q4_K / Q5_K: k_k4, k_k4w, the few-row k_k4wn; F32 / F16 / BF16: k_plain,
 *    k_plain_tile (its float4 staging with aligned activation rows too), the few-row k_plainn and
 *    k_plain1n);
 *  - float path (every type, incl. those with a quantized path): bit-identical to the CPU's scalar
 *    float path, except F32/F16/BF16: bit-identical to the AVX-512 float path's order
 *    (kern_mm_float_lanes_ref, which test_kernels holds equal to that kernel); within 1e-5 *
 *    sum|w x| of the CPU's best ISA;
 *  - cuda_mm_dequant_rows equals quant_dequant_row / quant_mlx_dequant_row bit for bit (row ids
 *    from device memory; an id out of range gives NaN);
 *  - the 16-lane types (Q8_0, Q4_0, IQ4_NL, MXFP4, Q6_K, IQ4_XS, MLX 4/8) have two GPU
 *    implementations (cuda_mm_set_q16_impl): the checks above and the MoE checks run on both;
 *  - MoE: gate+up+SiLU-GLU and down over an expert stack, ids from device memory, equal a CPU loop
 *    of kern_matmul + the CPU's GLU (floe_siluf of base/vexp.h, the function layers.c calls) + kern_act_quantize, bit
 *    for bit; the shared-expert form (ids NULL); an invalid id gives NaN rows;
 *  - the norms with the quantization fused (cuda_mm_norm_act, cuda_mm_combine_act) equal the plain
 *    norm + cuda_mm_act_quantize, and the CPU's kern_act_quantize_rows; both implementations of the
 *    quantization and the combine (cuda_mm_set_act2), also alone on awkward sizes (check_act);
 *  - the tensor-core kernels (k_k4mma2 in both forms, k_k4mma) equal the CPU on activation row
 *    counts that leave partial passes, rows < 16 and not multiples of 64, 1..16 superblocks, and
 *    in the grouped MoE on skewed ids (an expert with more than a 32-slot tile, one with a single
 *    slot, one with none, an out-of-range id);
 *  - a joined matrix's parts into their own buffers (cuda_mm_matmul_parts) equal the CPU's rows of
 *    the whole matrix, in one few-row launch and in a launch per part;
 *  - outputs are poisoned (NaN bytes) before each launch, so an unwritten element fails;
 *  - sensitivity: every block's f16 scales vary (test_vary_f16), and changing one scale of the
 *    device copy must change the GPU result (a comparison that cannot fail would pass it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/vexp.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda_mm.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_rt.h"
#include "kernels/cuda/cuda_spec.h"
#include "test.h"

static floe_rng rng, rng_sc;
static char err[256];

static void fill_x(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    x[i] = floe_rng_normal(&rng);
    if (floe_rng_uniform(&rng) < 1.0f / 64) x[i] = (floe_rng_uniform(&rng) < 0.5f ? -1 : 1) * (6 + 18 * floe_rng_uniform(&rng));
  }
}

/* ---- host matrices (the helpers of test_kernels.c) ---- */
typedef struct {
  floe_mat W;
  uint8_t *data, *scales, *biases;
  size_t bytes, sb_bytes; /* of all rows (of all experts) */
} tmat;

static void vary_f16(uint8_t *p) { test_vary_f16(&rng_sc, p); }
static void vary_scales(uint32_t type, uint8_t *b, int64_t nblocks) {
  const size_t bytes = floe_type_info(type)->bytes;
  for (int64_t i = 0; i < nblocks; i++, b += bytes) switch (type) {
      case FLOE_TYPE_Q4_0: case FLOE_TYPE_Q5_0: case FLOE_TYPE_Q8_0: case FLOE_TYPE_IQ4_NL: case FLOE_TYPE_IQ4_XS:
      case FLOE_TYPE_IQ2_XXS: case FLOE_TYPE_IQ2_XS: case FLOE_TYPE_IQ2_S: case FLOE_TYPE_IQ3_XXS: case FLOE_TYPE_IQ3_S:
      case FLOE_TYPE_IQ1_S:
        vary_f16(b);
        break;
      case FLOE_TYPE_Q4_1: case FLOE_TYPE_Q5_1: case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K:
        vary_f16(b);
        vary_f16(b + 2);
        break;
      case FLOE_TYPE_Q6_K: case FLOE_TYPE_Q3_K: vary_f16(b + bytes - 2); break;
      case FLOE_TYPE_Q2_K: vary_f16(b + bytes - 4); vary_f16(b + bytes - 2); break;
      default: break;
    }
}

/* nexp matrices of rows x cols, contiguous (expert e at data + e * rows * row_bytes) */
static tmat make_mat(uint32_t type, int bits, int group, uint32_t sbt, int64_t rows, int64_t cols, int nexp) {
  tmat m;
  memset(&m, 0, sizeof m);
  m.W.type = type;
  m.W.rows = rows;
  m.W.cols = cols;
  if (type == FLOE_TYPE_MLX) {
    m.W.mlx = (quant_mlx_fmt){bits, group, sbt};
    m.W.row_bytes = quant_mlx_row_bytes(&m.W.mlx, cols);
    m.W.sb_row_bytes = (size_t)(cols / group) * (sbt == FLOE_TYPE_F32 ? 4 : 2);
    m.bytes = m.W.row_bytes * (size_t)(rows * nexp);
    m.sb_bytes = m.W.sb_row_bytes * (size_t)(rows * nexp);
    m.data = malloc(m.bytes + 64);
    m.scales = malloc(m.sb_bytes + 64);
    m.biases = malloc(m.sb_bytes + 64);
    float *src = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows * nexp; r++) {
      fill_x(src, cols);
      quant_mlx_quantize_row(&m.W.mlx, src, m.data + r * m.W.row_bytes, m.scales + r * m.W.sb_row_bytes,
                             m.biases + r * m.W.sb_row_bytes, cols);
    }
    free(src);
  } else {
    const floe_type_traits *tt = floe_type_info(type);
    m.W.row_bytes = floe_row_bytes(type, cols);
    m.bytes = m.W.row_bytes * (size_t)(rows * nexp);
    m.data = malloc(m.bytes + 64);
    quant_fill_random(type, &rng, m.data, rows * nexp * (cols / tt->blck), 1.0f);
    if (tt->quantized) vary_scales(type, m.data, rows * nexp * (cols / tt->blck));
  }
  m.W.data = m.data;
  m.W.scales = m.scales;
  m.W.biases = m.biases;
  return m;
}

static floe_mat expert_of(const tmat *m, int e) {
  floe_mat W = m->W;
  W.data = m->data + (size_t)e * m->W.row_bytes * (size_t)m->W.rows;
  if (m->scales) {
    W.scales = m->scales + (size_t)e * m->W.sb_row_bytes * (size_t)m->W.rows;
    W.biases = m->biases + (size_t)e * m->W.sb_row_bytes * (size_t)m->W.rows;
  }
  return W;
}

static void tmat_free(tmat *m) {
  free(m->data);
  free(m->scales);
  free(m->biases);
}

/* ---- device helpers ---- */
static void *dev_put(const void *src, size_t n) {
  void *p = NULL;
  if (cuda_rt_malloc(&p, n + 64, err, sizeof err) || (src && cuda_rt_h2d(p, src, n, err, sizeof err))) {
    printf("FATAL %s\n", err);
    exit(1);
  }
  return p;
}
static void dev_get(void *dst, const void *src, size_t n) {
  if (cuda_rt_device_sync(err, sizeof err) || cuda_rt_d2h(dst, src, n, err, sizeof err)) {
    printf("FATAL %s\n", err);
    exit(1);
  }
}
static void dev_poison(void *p, size_t n) { cuda_rt_memset_async(p, 0xFF, n, NULL); }

typedef struct {
  cuda_mat M;
  void *d, *s, *b;
} dmat;

static dmat upload(const tmat *m, int nexp) {
  dmat g;
  memset(&g, 0, sizeof g);
  g.d = dev_put(m->data, m->bytes);
  if (m->scales) {
    g.s = dev_put(m->scales, m->sb_bytes);
    g.b = dev_put(m->biases, m->sb_bytes);
  }
  g.M.type = m->W.type;
  g.M.rows = m->W.rows;
  g.M.cols = m->W.cols;
  g.M.data = g.d;
  g.M.row_bytes = m->W.row_bytes;
  g.M.mlx = m->W.mlx;
  g.M.scales = g.s;
  g.M.biases = g.b;
  g.M.sb_row_bytes = m->W.sb_row_bytes;
  g.M.n_expert = nexp;
  g.M.expert_stride = m->W.row_bytes * (size_t)m->W.rows;
  g.M.sb_expert_stride = m->W.sb_row_bytes * (size_t)m->W.rows;
  return g;
}
static void dmat_free(dmat *g) {
  cuda_rt_free(g->d);
  cuda_rt_free(g->s);
  cuda_rt_free(g->b);
}

static const char *tname(const floe_mat *W, char *buf, size_t n) {
  if (W->type == FLOE_TYPE_MLX)
    snprintf(buf, n, "mlx%d/g%d/%s", W->mlx.bits, W->mlx.group, floe_type_info(W->mlx.sb_type)->name);
  else snprintf(buf, n, "%s", floe_type_info(W->type)->name);
  return buf;
}

static int64_t first_diff(const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(a + i, b + i, 4)) return i;
  return -1;
}

/* ---- matmul, activation quantization, dequantization of one matrix ---- */
static const int NBS[] = {1, 2, 3, 7, 11, 16, 33};
#define NBMAX 33

/* F32/F16/BF16: the GPU follows the AVX-512 float order (kern_mm_float_lanes_ref) */
static int plain_type(uint32_t t) { return t == FLOE_TYPE_F32 || t == FLOE_TYPE_F16 || t == FLOE_TYPE_BF16; }

/* activation row padding of check_matrix: 3 makes the rows' starts unaligned; 4 keeps them 16-byte
 * aligned where cols is a multiple of 4 (k_plain_tile's float4 staging) */
static int64_t g_ldx_pad = 3;

static void check_matrix(uint32_t type, int bits, int group, uint32_t sbt, int64_t rows, int64_t cols) {
  tmat m = make_mat(type, bits, group, sbt, rows, cols, 1);
  const floe_mat *W = &m.W;
  char nm[64];
  tname(W, nm, sizeof nm);
  dmat g = upload(&m, 1);
  const int64_t ldx = cols + g_ldx_pad, ldy = rows + 5;
  float *X = malloc(sizeof(float) * (size_t)(ldx * NBMAX));
  fill_x(X, ldx * NBMAX);
  float *dX = dev_put(X, sizeof(float) * (size_t)(ldx * NBMAX));
  const size_t ab = kern_act_bytes(W);
  CHECK(cuda_mm_act_bytes(&g.M) == ab, "%s %lldx%lld: act bytes %zu == %zu", nm, (long long)rows, (long long)cols,
        cuda_mm_act_bytes(&g.M), ab);
  CHECK(cuda_mm_type_supported(W->type, cols, &W->mlx, err, sizeof err) == 0, "%s supported: %s", nm, err);
  uint8_t *xq = NULL, *xq_g = NULL;
  void *dxq = NULL;
  if (ab) {
    xq = malloc(ab * NBMAX);
    xq_g = malloc(ab * NBMAX);
    memset(xq, 0xA5, ab * NBMAX);
    memset(xq_g, 0xA5, ab * NBMAX);
    kern_act_quantize_rows(W, NBMAX, X, ldx, xq, ab);
    dxq = dev_put(xq_g, ab * NBMAX); /* the same 0xA5 padding as the CPU buffer */
    cuda_mm_act_quantize(&g.M, NBMAX, dX, ldx, dxq, ab, NULL);
    dev_get(xq_g, dxq, ab * NBMAX);
    size_t bad = 0;
    while (bad < ab * NBMAX && xq[bad] == xq_g[bad]) bad++;
    CHECK(bad == ab * NBMAX, "%s %lldx%lld: act quantize bytes equal (first diff at %zu of %zu)", nm, (long long)rows,
          (long long)cols, bad, ab * NBMAX);
  }
  float *Yc = malloc(sizeof(float) * (size_t)(ldy * NBMAX)), *Ys = malloc(sizeof(float) * (size_t)(ldy * NBMAX));
  float *Yg = malloc(sizeof(float) * (size_t)(ldy * NBMAX));
  float *dY = dev_put(NULL, sizeof(float) * (size_t)(ldy * NBMAX));
  const int best = kern_isa_get();
  /* the 16-lane types have two implementations (cuda_mm_set_q16_impl), Q4_K / Q5_K two for one
   * activation row (cuda_mm_set_k4w): check both */
  const int kq = type == FLOE_TYPE_Q4_K || type == FLOE_TYPE_Q5_K;
  /* F32 / F16 / BF16: k_plain and k_plain_tile for several activation rows (cuda_mm_set_plain_tile) */
  const int pt = plain_type(type);
  /* impl 2 (Q4_K / Q5_K, F32 / F16 / BF16): the few-row kernels (k_k4wn, k_plainn; cuda_mm_set_few);
   * impl 3 / 4 (Q4_K / Q5_K, 1..15 rows): k_k4w with its rounds' loads in batches of 2 / 4 and
   * k_k4wn with the next round's weights loaded ahead (cuda_mm_set_k4w_pipe) */
  /* impl 5 (Q4_K / Q5_K): k_k4w2, two weight rows a warp at once (cuda_mm_set_k4w_pair; one
   * activation row, the grid capped at 3 blocks so that warps have several rows); impl 6: k_k4w
   * and k_k4s with 4 lanes a superblock (cuda_mm_set_k4v(2); one activation row, the same capped
   * grid); impl 7: k_k4w2 with the 4-lane dot; impl 8: the few-row kernel with 4 lanes a
   * superblock (k_k4vn, cuda_mm_set_k4v(3); 2..15 rows); impl 9: the tensor-core k_k4mn (1..15
   * rows; impls 2..8 run with it off: cuda_mm_set_few_mma(0)) */
  /* F32 / F16 / BF16: impl 2 k_plainn, impl 3 k_plain1n (a block row per activation row,
   * cuda_mm_set_plain1n) */
  /* the other quantized types (k_q16): impl 0 one warp a row (for 2..4 activation rows: one for
   * all of them), 1 the lanes kernel, 2 / 3 one warp a row for each 1 / 2 of 2..4 activation rows
   * (cuda_mm_set_q16_few_nb; 2 is the default) */
  const bool q16 = ab && !kq && !pt;
  const int nimpl = kq ? 10 : pt ? 4 : ab ? 4 : 1;
  for (int impl = 0; impl < nimpl; impl++)
  for (size_t t = 0; t < sizeof NBS / sizeof NBS[0]; t++) {
    const int nb = NBS[t];
    if (q16 && impl >= 2 && (nb < 2 || nb > 4)) continue;
    cuda_mm_set_q16_few_nb(q16 && impl == 2 ? 1 : q16 && impl == 3 ? 2 : 4);
    if (impl >= 3 && nb > 15) continue;
    if (impl >= 5 && impl <= 7 && nb > 1) continue;
    if (impl == 8 && nb < 2) continue;
    cuda_mm_set_few_mma(impl == 9);
    cuda_mm_set_one_mma(impl == 9);
    cuda_mm_set_k4w_pipe(impl == 3 ? 2 : impl == 4 ? 4 : 1);
    cuda_mm_set_k4w_pair(impl == 5 || impl == 7);
    cuda_mm_set_k4v(impl == 6 ? 2 : impl == 7 ? 1 : impl == 8 ? 3 : 0);
    cuda_mm_set_q16_impl(nimpl == 1 || kq || pt ? CUDA_MM_Q16_AUTO : impl == 1 ? CUDA_MM_Q16_LANES : CUDA_MM_Q16_WARP);
    cuda_mm_set_plain_tile(!pt || impl >= 1);
    cuda_mm_set_k4w(kq && impl >= 1);
    cuda_mm_set_few(impl >= 2);
    cuda_mm_set_plain1n(pt && impl == 3);
    cuda_mm_set_pf(1, kq && impl != 0 && impl != 2 ? 3 : 0); /* k_k4w: 3 blocks, its warps loop over rows */
    for (int path = ab ? 0 : 1; path < 2; path++) { /* 0: quantized, 1: float */
      if (impl >= 1 && path == 1 && !pt) break; /* the float path has one implementation */
      const uint8_t *q = path == 0 ? xq : NULL;
      memset(Yc, 0, sizeof(float) * (size_t)(ldy * nb));
      memset(Ys, 0, sizeof(float) * (size_t)(ldy * nb));
      kern_matmul_batch(W, nb, X, ldx, q, ab, Yc, ldy, 0, rows);
      if (path == 1 && plain_type(type)) {
        kern_mm_float_lanes_ref(W, nb, X, ldx, Ys, ldy, 0, rows);
      } else {
        kern_isa_set(FLOE_ISA_SCALAR);
        kern_matmul_batch(W, nb, X, ldx, q, ab, Ys, ldy, 0, rows);
        kern_isa_set(best);
      }
      dev_poison(dY, sizeof(float) * (size_t)(ldy * nb));
      cuda_mm_matmul(&g.M, nb, dX, ldx, path == 0 ? dxq : NULL, ab, dY, ldy, NULL);
      CHECK(cuda_rt_check("matmul", err, sizeof err) == 0, "%s launch: %s", nm, err);
      dev_get(Yg, dY, sizeof(float) * (size_t)(ldy * nb));
      int64_t bad_s = -1, bad_c = -1;
      double worst = 0;
      for (int b = 0; b < nb && bad_s < 0; b++) {
        int64_t d = first_diff(Ys + b * ldy, Yg + b * ldy, rows);
        if (d >= 0) bad_s = b * ldy + d;
      }
      if (path == 0) {
        for (int b = 0; b < nb && bad_c < 0; b++) {
          int64_t d = first_diff(Yc + b * ldy, Yg + b * ldy, rows);
          if (d >= 0) bad_c = b * ldy + d;
        }
      } else { /* the best ISA's float path: within 1e-5 * sum |w x| */
        float *buf = malloc(sizeof(float) * (size_t)cols);
        for (int b = 0; b < nb; b++)
          for (int64_t r = 0; r < rows; r++) {
            if (W->type == FLOE_TYPE_MLX)
              quant_mlx_dequant_row(&W->mlx, m.data + r * W->row_bytes, m.scales + r * W->sb_row_bytes,
                                    m.biases + r * W->sb_row_bytes, buf, cols);
            else quant_dequant_row(W->type, m.data + r * W->row_bytes, buf, cols);
            double S = 0;
            for (int64_t j = 0; j < cols; j++) S += fabs((double)buf[j] * X[b * ldx + j]);
            const double e = fabs((double)Yg[b * ldy + r] - Yc[b * ldy + r]) / (S > 0 ? S : 1);
            if (!(e <= worst)) worst = e;
          }
        free(buf);
      }
      CHECK(bad_s < 0, "%s %lldx%lld nb=%d %s path%s: GPU == CPU %s bit for bit (first diff at %lld: gpu %.9g cpu %.9g)",
            nm, (long long)rows, (long long)cols, nb, path ? "float" : "quantized",
            nimpl == 1 ? "" : kq ? (impl == 0 ? " (k_k4)" : impl == 1 ? " (k_k4w)" : impl == 2 ? " (k_k4wn)"
                                    : impl == 3 ? " (k_k4w / k_k4wn, loads ahead: 2)"
                                    : impl == 4 ? " (k_k4w / k_k4wn, loads ahead: 4)"
                                    : impl == 5 ? " (k_k4w2, two rows a warp)"
                                    : impl == 6 ? " (k_k4w / k_k4s, 4 lanes a superblock)"
                                    : impl == 7 ? " (k_k4w2, 4 lanes a superblock)"
                                    : impl == 8 ? " (k_k4vn, 4 lanes a superblock)"
                                                : " (k_k4mn, tensor cores)")
            : pt ? (impl == 0 ? " (k_plain)" : impl == 1 ? " (k_plain_tile)" : impl == 2 ? " (k_plainn)" : " (k_plain1n)")
            : impl == 0 ? " (warp per row, 2..4 activation rows in one)" : impl == 1 ? " (4 lanes per thread)"
            : impl == 2 ? " (warp per row and activation row)" : " (warp per row and 2 activation rows)",
            path == 1 && plain_type(type) ? "AVX-512 order (lanes ref)" : "scalar", (long long)bad_s,
            bad_s >= 0 ? Yg[bad_s] : 0.0, bad_s >= 0 ? Ys[bad_s] : 0.0);
      if (path == 0)
        CHECK(bad_c < 0, "%s %lldx%lld nb=%d quantized: GPU == CPU %s bit for bit (first diff at %lld)", nm,
              (long long)rows, (long long)cols, nb, kern_isa_name(best), (long long)bad_c);
      else
        CHECK(worst <= 1e-5, "%s %lldx%lld nb=%d float: |GPU - CPU %s| <= 1e-5 sum|wx| (%.3g)", nm, (long long)rows,
              (long long)cols, nb, kern_isa_name(best), worst);
    }
  }
  cuda_mm_set_q16_impl(CUDA_MM_Q16_AUTO);
  cuda_mm_set_q16_few_nb(2); /* the default */
  cuda_mm_set_k4w(0);
  cuda_mm_set_k4w_pipe(1);
  cuda_mm_set_k4w_pair(1);
  cuda_mm_set_k4v(2); /* the defaults */
  cuda_mm_set_pf(1, 0);
  cuda_mm_set_plain_tile(1);
  cuda_mm_set_plain1n(1);
  cuda_mm_set_k4s(1);
  cuda_mm_set_few(1);
  cuda_mm_set_few_mma(1);
  cuda_mm_set_one_mma(0);
  /* a changed scale must change the result: the comparisons above can fail */
  if (floe_type_info(type) && floe_type_info(type)->quantized) {
    uint8_t *row0 = malloc(W->row_bytes);
    memcpy(row0, m.data, W->row_bytes);
    const int doff = type == FLOE_TYPE_Q6_K || type == FLOE_TYPE_Q3_K ? (int)floe_type_info(type)->bytes - 2
                     : type == FLOE_TYPE_Q2_K ? (int)floe_type_info(type)->bytes - 4
                     : type == FLOE_TYPE_IQ1_M ? 55 : 0;
    row0[doff] ^= 0x10;
    if (type == FLOE_TYPE_MXFP4) row0[0] ^= 0x11; /* the E8M0 exponent */
    cuda_rt_h2d(g.d, row0, W->row_bytes, err, sizeof err);
    cuda_mm_matmul(&g.M, 1, dX, ldx, ab ? dxq : NULL, ab, dY, ldy, NULL);
    kern_isa_set(FLOE_ISA_SCALAR);
    kern_matmul_batch(W, 1, X, ldx, ab ? xq : NULL, ab, Ys, ldy, 0, rows);
    kern_isa_set(best);
    dev_get(Yg, dY, sizeof(float) * (size_t)rows);
    CHECK(memcmp(Yg, Ys, 4) != 0, "%s: a changed block scale changes row 0 (gpu %.9g, cpu of the unchanged %.9g)", nm,
          Yg[0], Ys[0]);
    cuda_rt_h2d(g.d, m.data, W->row_bytes, err, sizeof err);
    free(row0);
  } else if (type == FLOE_TYPE_MLX) {
    uint8_t sv[4];
    memcpy(sv, m.scales, 4);
    sv[1] ^= 0x08;
    cuda_rt_h2d(g.s, sv, 4, err, sizeof err);
    cuda_mm_matmul(&g.M, 1, dX, ldx, ab ? dxq : NULL, ab, dY, ldy, NULL);
    kern_isa_set(FLOE_ISA_SCALAR);
    kern_matmul_batch(W, 1, X, ldx, ab ? xq : NULL, ab, Ys, ldy, 0, rows);
    kern_isa_set(best);
    dev_get(Yg, dY, sizeof(float) * (size_t)rows);
    CHECK(memcmp(Yg, Ys, 4) != 0, "%s: a changed group scale changes row 0", nm);
    cuda_rt_h2d(g.s, m.scales, 4, err, sizeof err);
  }
  /* exact dequantization of rows named by a device array (the last one out of range) */
  {
    const int32_t ids[4] = {(int32_t)rows - 1, 0, (int32_t)(rows / 2), (int32_t)rows};
    int32_t *dids = dev_put(ids, sizeof ids);
    const int64_t ldo = cols + 1;
    float *D = malloc(sizeof(float) * (size_t)(4 * ldo)), *R = malloc(sizeof(float) * (size_t)cols);
    float *dD = dev_put(NULL, sizeof(float) * (size_t)(4 * ldo));
    dev_poison(dD, sizeof(float) * (size_t)(4 * ldo));
    cuda_mm_dequant_rows(&g.M, dids, 4, dD, ldo, NULL);
    dev_get(D, dD, sizeof(float) * (size_t)(4 * ldo));
    int ok = 1;
    for (int i = 0; i < 3; i++) {
      const int64_t r = ids[i];
      if (W->type == FLOE_TYPE_MLX)
        quant_mlx_dequant_row(&W->mlx, m.data + r * W->row_bytes, m.scales + r * W->sb_row_bytes,
                              m.biases + r * W->sb_row_bytes, R, cols);
      else quant_dequant_row(W->type, m.data + r * W->row_bytes, R, cols);
      ok &= memcmp(R, D + i * ldo, sizeof(float) * (size_t)cols) == 0;
    }
    int nan = 1;
    for (int64_t j = 0; j < cols; j++) nan &= isnan(D[3 * ldo + j]);
    CHECK(ok, "%s %lldx%lld: dequant rows == quant_dequant_row bit for bit", nm, (long long)rows, (long long)cols);
    CHECK(nan, "%s: dequant of an out-of-range row id gives NaN", nm);
    free(D);
    free(R);
    cuda_rt_free(dD);
    cuda_rt_free(dids);
  }
  cuda_rt_free(dY);
  cuda_rt_free(dX);
  cuda_rt_free(dxq);
  free(Yc);
  free(Ys);
  free(Yg);
  free(X);
  free(xq);
  free(xq_g);
  dmat_free(&g);
  tmat_free(&m);
}

/* ---- a joined matrix's parts into their own buffers (cuda_mm_matmul_parts): each part's rows equal
 * the CPU's rows of the whole matrix bit for bit, with the few-row kernels (one launch) and
 * without them (a matmul per part on a view), for 4 parts, 3 and 2 ---- */
static void check_parts(uint32_t type, int64_t rows, int64_t cols, int nb, int64_t s1, int64_t s2, int64_t s3, int few) {
  tmat m = make_mat(type, 0, 0, 0, rows, cols, 1);
  const floe_mat *W = &m.W;
  dmat g = upload(&m, 1);
  const int64_t ldx = cols + 3, ld[4] = {s1 + 1, s2 - s1 + 2, s3 - s2 + 3, rows - s3 + 4};
  float *X = malloc(sizeof(float) * (size_t)(ldx * nb));
  fill_x(X, ldx * nb);
  const size_t ab = kern_act_bytes(W);
  uint8_t *xq = NULL;
  void *dxq = NULL;
  if (ab) {
    xq = malloc(ab * (size_t)nb);
    kern_act_quantize_rows(W, nb, X, ldx, xq, ab);
    dxq = dev_put(xq, ab * (size_t)nb);
  }
  float *dX = dev_put(X, sizeof(float) * (size_t)(ldx * nb));
  float *Yc = calloc((size_t)(rows * nb), sizeof(float));
  kern_matmul_batch(W, nb, X, ldx, xq, ab, Yc, rows, 0, rows);
  if (!ab) { /* the float path's order: the AVX-512 lanes (as check_matrix) */
    memset(Yc, 0, sizeof(float) * (size_t)(rows * nb));
    kern_mm_float_lanes_ref(W, nb, X, ldx, Yc, rows, 0, rows);
  }
  float *dY[4], *Yg[4];
  for (int p = 0; p < 4; p++) {
    dY[p] = dev_put(NULL, sizeof(float) * (size_t)(ld[p] * nb));
    dev_poison(dY[p], sizeof(float) * (size_t)(ld[p] * nb));
    Yg[p] = malloc(sizeof(float) * (size_t)(ld[p] * nb));
  }
  cuda_mm_set_few(few);
  cuda_mm_set_few_mma(few == 2);
  cuda_mm_set_k4w(1);
  cuda_mm_matmul_parts(&g.M, nb, dX, ldx, dxq, ab, dY[0], ld[0], s1, dY[1], ld[1], s2, dY[2], ld[2], s3, dY[3], ld[3], NULL);
  CHECK(cuda_rt_check("parts", err, sizeof err) == 0, "parts launch: %s", err);
  cuda_mm_set_few(1);
  cuda_mm_set_few_mma(1);
  cuda_mm_set_k4w(0);
  const int64_t b0[5] = {0, s1, s2, s3, rows};
  int64_t bad = -1;
  int badp = 0;
  for (int p = 0; p < 4; p++) {
    dev_get(Yg[p], dY[p], sizeof(float) * (size_t)(ld[p] * nb));
    for (int b = 0; b < nb && bad < 0; b++)
      for (int64_t r = b0[p]; r < b0[p + 1] && bad < 0; r++)
        if (memcmp(&Yg[p][b * ld[p] + r - b0[p]], &Yc[b * rows + r], 4)) bad = b * rows + r, badp = p;
  }
  CHECK(bad < 0, "%s %lldx%lld nb=%d parts at %lld %lld %lld %s: each part == the CPU's rows bit for bit "
        "(first diff: part %d, row %lld)", floe_type_info(type)->name, (long long)rows, (long long)cols, nb,
        (long long)s1, (long long)s2, (long long)s3,
        few == 2 ? "one launch (tensor cores for Q4_K / Q5_K)" : few ? "one launch" : "a launch per part", badp,
        (long long)bad);
  for (int p = 0; p < 4; p++) {
    cuda_rt_free(dY[p]);
    free(Yg[p]);
  }
  free(X);
  free(xq);
  free(Yc);
  cuda_rt_free(dxq);
  cuda_rt_free(dX);
  dmat_free(&g);
  tmat_free(&m);
}

/* ---- the tensor-core path: nb activation rows through cuda_mm_matmul, GPU == CPU bit for bit ---- */
static void check_mma(uint32_t type, int64_t rows, int64_t cols, int nb, int on) {
  tmat m = make_mat(type, 0, 0, 0, rows, cols, 1);
  const floe_mat *W = &m.W;
  dmat g = upload(&m, 1);
  const int64_t ldx = cols + 5, ldy = rows + 3;
  float *X = malloc(sizeof(float) * (size_t)(ldx * nb));
  fill_x(X, ldx * nb);
  const size_t ab = kern_act_bytes(W);
  uint8_t *xq = malloc(ab * (size_t)nb);
  kern_act_quantize_rows(W, nb, X, ldx, xq, ab);
  void *dxq = dev_put(xq, ab * (size_t)nb);
  float *Yc = calloc((size_t)(ldy * nb), sizeof(float)), *Yg = malloc(sizeof(float) * (size_t)(ldy * nb));
  float *dY = dev_put(NULL, sizeof(float) * (size_t)(ldy * nb));
  kern_matmul_batch(W, nb, X, ldx, xq, ab, Yc, ldy, 0, rows);
  cuda_mm_set_mma(on);
  dev_poison(dY, sizeof(float) * (size_t)(ldy * nb));
  cuda_mm_matmul(&g.M, nb, NULL, ldx, dxq, ab, dY, ldy, NULL);
  CHECK(cuda_rt_check("mma", err, sizeof err) == 0, "mma launch: %s", err);
  dev_get(Yg, dY, sizeof(float) * (size_t)(ldy * nb));
  int64_t bad = -1;
  for (int b = 0; b < nb && bad < 0; b++) {
    const int64_t d = first_diff(Yc + b * ldy, Yg + b * ldy, rows);
    if (d >= 0) bad = b * ldy + d;
  }
  CHECK(bad < 0, "%s %lldx%lld nb=%d %s: GPU == CPU bit for bit (first diff at %lld: gpu %.9g cpu %.9g)",
        floe_type_info(type)->name, (long long)rows, (long long)cols, nb, on ? "tensor cores" : "k_k4", (long long)bad,
        bad >= 0 ? Yg[bad] : 0.0, bad >= 0 ? Yc[bad] : 0.0);
  free(X);
  free(xq);
  free(Yc);
  free(Yg);
  cuda_rt_free(dxq);
  cuda_rt_free(dY);
  dmat_free(&g);
  tmat_free(&m);
}

/* ---- MoE ---- */

/* grouped: the prefill form (cuda_mm_moe_group, then the _grp calls: the tensor-core kernels for
 * Q4_K / Q5_K), which must give the same bits */
static int g_skew; /* check_moe's ids: 0 random; 1 skewed (expert 0 in every token: runs past one 32-slot tile;
                      expert 1 one slot; expert NE-1 none; the rest random), for the grouped kernels' edges */
static void check_moe(uint32_t type, int bits, int group, uint32_t sbt, int64_t E, int64_t I, int T, int K, int shared,
                      int grouped, int n_exp) {
  const int NE = shared ? 1 : n_exp;
  tmat mg = make_mat(type, bits, group, sbt, I, E, NE), mu = make_mat(type, bits, group, sbt, I, E, NE);
  tmat md = make_mat(type, bits, group, sbt, E, I, NE);
  char nm[64];
  tname(&mg.W, nm, sizeof nm);
  dmat gg = upload(&mg, NE), gu = upload(&mu, NE), gd = upload(&md, NE);
  const int S = T * K;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)S);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < K; j++) {
      int e;
      do { /* K distinct experts per token, as a top-k gives */
        e = shared ? 0 : (int)(floe_rng_u64(&rng) % NE);
        if (g_skew && !shared) e = j == 0 ? 0 : t == 0 && j == 1 ? 1 : 2 + (int)(floe_rng_u64(&rng) % (NE - 3));
        int dup = 0;
        for (int u = 0; u < j; u++) dup |= ids[t * K + u] == e;
        if (!dup) break;
      } while (1);
      ids[t * K + j] = e;
    }
  const int bad_slot = !shared && S > 1 ? S - 1 : -1; /* an id out of range: a NaN row */
  int32_t *dids = NULL;
  if (!shared) {
    int32_t *ids2 = malloc(sizeof(int32_t) * (size_t)S);
    memcpy(ids2, ids, sizeof(int32_t) * (size_t)S);
    if (bad_slot >= 0) ids2[bad_slot] = NE;
    dids = dev_put(ids2, sizeof(int32_t) * (size_t)S);
    free(ids2);
  }
  float *X = malloc(sizeof(float) * (size_t)(E * T));
  fill_x(X, E * T);
  float *dX = dev_put(X, sizeof(float) * (size_t)(E * T));
  const size_t ab = kern_act_bytes(&mg.W), abd = kern_act_bytes(&md.W);
  uint8_t *xq = ab ? malloc(ab * (size_t)T) : NULL;
  void *dxq = NULL, *dxqd = NULL;
  if (ab) {
    kern_act_quantize_rows(&mg.W, T, X, E, xq, ab);
    dxq = dev_put(NULL, ab * (size_t)T);
    cuda_mm_act_quantize(&gg.M, T, dX, E, dxq, ab, NULL);
  }
  if (abd) dxqd = dev_put(NULL, abd * (size_t)S);
  /* CPU: per slot, gate and up rows, the GLU, the down input quantized, the down rows */
  float *H = malloc(sizeof(float) * (size_t)(S * I)), *U = malloc(sizeof(float) * (size_t)I);
  float *Y = malloc(sizeof(float) * (size_t)(S * E));
  uint8_t *hq = abd ? malloc(abd) : NULL;
  const int best = kern_isa_get();
  /* the float path's reference; the quantized path gives the same bits on every ISA (test_kernels),
   * so it keeps the fastest (the grouped checks' references are the bulk of this test's time) */
  if (!ab) kern_isa_set(FLOE_ISA_SCALAR);
  for (int s = 0; s < S; s++) {
    const int t = s / K, e = ids[s];
    const floe_mat Wg = expert_of(&mg, e), Wu = expert_of(&mu, e), Wd = expert_of(&md, e);
    float *h = H + (size_t)s * I;
    if (plain_type(type)) {
      kern_mm_float_lanes_ref(&Wg, 1, X + t * E, E, h, I, 0, I);
      kern_mm_float_lanes_ref(&Wu, 1, X + t * E, E, U, I, 0, I);
    } else {
      kern_matmul(&Wg, 1, X + t * E, E, xq ? xq + (size_t)t * ab : NULL, ab, h, I, 0, I);
      kern_matmul(&Wu, 1, X + t * E, E, xq ? xq + (size_t)t * ab : NULL, ab, U, I, 0, I);
    }
    for (int64_t i = 0; i < I; i++) h[i] = floe_siluf(h[i]) * U[i];
    if (abd) kern_act_quantize(&Wd, h, hq);
    if (plain_type(type)) kern_mm_float_lanes_ref(&Wd, 1, h, I, Y + (size_t)s * E, E, 0, E);
    else kern_matmul(&Wd, 1, h, I, hq, abd, Y + (size_t)s * E, E, 0, E);
  }
  kern_isa_set(best);
  float *dH = dev_put(NULL, sizeof(float) * (size_t)(S * I)), *dY = dev_put(NULL, sizeof(float) * (size_t)(S * E));
  float *Hg = malloc(sizeof(float) * (size_t)(S * I)), *Yg = malloc(sizeof(float) * (size_t)(S * E));
  dev_poison(dH, sizeof(float) * (size_t)(S * I));
  dev_poison(dY, sizeof(float) * (size_t)(S * E));
  void *dgrp = NULL;
  if (grouped) {
    dgrp = dev_put(NULL, cuda_mm_moe_group_bytes(S, NE));
    cuda_mm_moe_group(dids, S, NE, dgrp, NULL);
    cuda_mm_moe_gate_up_grp(&gg.M, &gu.M, T, K, dids, dgrp, dX, E, dxq, ab, dH, I, NULL);
  } else {
    cuda_mm_moe_gate_up(&gg.M, &gu.M, T, K, dids, dX, E, dxq, ab, dH, I, NULL);
  }
  dev_get(Hg, dH, sizeof(float) * (size_t)(S * I));
  /* the down kernel reads the CPU's h (so the two checks are independent) */
  cuda_rt_h2d(dH, H, sizeof(float) * (size_t)(S * I), err, sizeof err);
  if (grouped) cuda_mm_moe_down_grp(&gd.M, T, K, dids, dgrp, dH, I, dxqd, abd, dY, E, NULL);
  else cuda_mm_moe_down(&gd.M, T, K, dids, dH, I, dxqd, abd, dY, E, NULL);
  CHECK(cuda_rt_check("moe", err, sizeof err) == 0, "moe %s launch: %s", nm, err);
  dev_get(Yg, dY, sizeof(float) * (size_t)(S * E));
  int ok_h = 1, ok_y = 1, nan_ok = 1;
  for (int s = 0; s < S; s++) {
    if (s == bad_slot) {
      for (int64_t i = 0; i < I; i++) nan_ok &= isnan(Hg[(size_t)s * I + i]);
      for (int64_t i = 0; i < E; i++) nan_ok &= isnan(Yg[(size_t)s * E + i]);
      continue;
    }
    ok_h &= first_diff(H + (size_t)s * I, Hg + (size_t)s * I, I) < 0;
    ok_y &= first_diff(Y + (size_t)s * E, Yg + (size_t)s * E, E) < 0;
  }
  CHECK(ok_h, "moe %s E=%lld I=%lld T=%d K=%d%s%s%s: gate+up+GLU == CPU bit for bit", nm, (long long)E, (long long)I,
        T, K, shared ? " (shared)" : "", grouped ? " (grouped by expert)" : "", g_skew ? " (skewed ids)" : "");
  CHECK(ok_y, "moe %s E=%lld I=%lld T=%d K=%d%s%s%s: down == CPU bit for bit", nm, (long long)E, (long long)I, T, K,
        shared ? " (shared)" : "", grouped ? " (grouped by expert)" : "", g_skew ? " (skewed ids)" : "");
  if (bad_slot >= 0) CHECK(nan_ok, "moe %s: an expert id out of range gives NaN rows", nm);
  free(ids);
  free(X);
  free(xq);
  free(H);
  free(U);
  free(Y);
  free(hq);
  free(Hg);
  free(Yg);
  cuda_rt_free(dgrp);
  cuda_rt_free(dids);
  cuda_rt_free(dX);
  cuda_rt_free(dxq);
  cuda_rt_free(dxqd);
  cuda_rt_free(dH);
  cuda_rt_free(dY);
  dmat_free(&gg);
  dmat_free(&gu);
  dmat_free(&gd);
  tmat_free(&mg);
  tmat_free(&mu);
  tmat_free(&md);
}

/* Activation quantization alone (cuda_mm_act_quantize) with both implementations
 * (cuda_mm_set_act2), against kern_act_quantize_rows byte for byte, padding included: rows of
 * random values, one row with an all-zero unit and a huge value, a column count that leaves a
 * partial 256-chunk (A32), more chunks than a block has warps, and rows past the staging limit. */
static void check_act(uint32_t type, int64_t cols, int nb) {
  tmat m = make_mat(type, 0, 0, 0, 1, cols, 1);
  char nm[64];
  tname(&m.W, nm, sizeof nm);
  dmat g = upload(&m, 1);
  const int64_t ldx = cols + 3;
  const size_t ab = kern_act_bytes(&m.W);
  float *X = malloc(sizeof(float) * (size_t)(ldx * nb));
  fill_x(X, ldx * nb);
  const int64_t U = floe_type_info(type)->blck == 256 ? 256 : 32;
  for (int64_t j = 0; j < U && nb > 1; j++) X[ldx + j] = 0.0f; /* row 1: an all-zero unit, then a huge value */
  if (nb > 1 && cols > U) X[ldx + U] = 3e38f;
  uint8_t *qc = malloc(ab * (size_t)nb), *qg = malloc(ab * (size_t)nb);
  memset(qc, 0xA5, ab * (size_t)nb);
  kern_act_quantize_rows(&m.W, nb, X, ldx, qc, ab);
  float *dX = dev_put(X, sizeof(float) * (size_t)(ldx * nb));
  void *dq = dev_put(NULL, ab * (size_t)nb);
  for (int impl = 0; impl < 2; impl++) {
    cuda_mm_set_act2(impl);
    memset(qg, 0xA5, ab * (size_t)nb);
    cuda_rt_h2d(dq, qg, ab * (size_t)nb, err, sizeof err);
    cuda_mm_act_quantize(&g.M, nb, dX, ldx, dq, ab, NULL);
    CHECK(cuda_rt_check("act", err, sizeof err) == 0, "%s act quantize launch: %s", nm, err);
    dev_get(qg, dq, ab * (size_t)nb);
    size_t bad = 0;
    while (bad < ab * (size_t)nb && qc[bad] == qg[bad]) bad++;
    CHECK(bad == ab * (size_t)nb, "%s cols=%lld rows=%d act quantize (%s) bytes == kern_act_quantize_rows (first diff %zu of %zu)",
          nm, (long long)cols, nb, impl ? "warp per chunk" : "block per row", bad, ab * (size_t)nb);
  }
  cuda_mm_set_act2(1);
  cuda_rt_free(dX), cuda_rt_free(dq);
  free(X), free(qc), free(qg);
  dmat_free(&g);
  tmat_free(&m);
}

/* The heads that gather their rows' argmax in their launch (cuda_mm_matmul_amax, the one-pass
 * speculative step's FLOE_CUDA_SPEC_AMAX): the logits the same bits as cuda_mm_matmul's, each row's
 * gathered index the CPU's kern_argmax of those logits (ties: rows 5 and 9 of W equal, so two
 * logits tie in every activation row, and the lower index wins), read by cuda_amk_tokens, by the
 * accept launch (cuda_spec_accept_keys: its argmaxes and count) and by the embedding norm (the
 * last row's token written and used). */
static void check_amax(uint32_t type, int64_t rows, int64_t cols) {
  tmat m = make_mat(type, 0, 0, 0, rows, cols, 1);
  memcpy(m.data + 9 * m.W.row_bytes, m.data + 5 * m.W.row_bytes, m.W.row_bytes);
  char nm[64];
  tname(&m.W, nm, sizeof nm);
  dmat g = upload(&m, 1);
  const size_t ab = kern_act_bytes(&m.W);
  const int want_ok = ab && rows < 16384 && type != FLOE_TYPE_Q4_K && type != FLOE_TYPE_Q5_K; /* k_q16's types */
  CHECK(cuda_mm_amax_ok(&g.M, 1) == want_ok, "%s %lldx%lld: the launch gathers the argmax: %d (want %d)", nm,
        (long long)rows, (long long)cols, cuda_mm_amax_ok(&g.M, 1), want_ok);
  if (!want_ok) {
    dmat_free(&g);
    tmat_free(&m);
    return;
  }
  for (int nb = 1; nb <= 5; nb++) {
    float *X = malloc(sizeof(float) * (size_t)(cols * nb));
    fill_x(X, cols * nb);
    uint8_t *xq = malloc(ab * (size_t)nb);
    kern_act_quantize_rows(&m.W, nb, X, cols, xq, ab);
    void *dxq = dev_put(xq, ab * (size_t)nb);
    const size_t kb = (size_t)nb * CUDA_AMK_ROW * 8, yb = sizeof(float) * (size_t)(rows * nb);
    unsigned long long *dk = dev_put(NULL, kb);
    cuda_rt_memset_async(dk, 0, kb, NULL);
    float *dY = dev_put(NULL, yb), *dY2 = dev_put(NULL, yb), *Y = malloc(yb), *Y2 = malloc(yb);
    dev_poison(dY, yb), dev_poison(dY2, yb);
    const int ok = cuda_mm_matmul_amax(&g.M, nb, dxq, ab, dY, rows, dk, NULL);
    cuda_mm_matmul(&g.M, nb, NULL, 0, dxq, ab, dY2, rows, NULL);
    int32_t *dt = dev_put(NULL, 4 * 8), t[8], want[8];
    cuda_amk_tokens(dk, nb, dt, NULL);
    CHECK(cuda_rt_check("amax", err, sizeof err) == 0, "%s amax launch: %s", nm, err);
    dev_get(Y, dY, yb), dev_get(Y2, dY2, yb), dev_get(t, dt, 4 * (size_t)nb);
    int tok_ok = ok;
    for (int b = 0; b < nb; b++) {
      want[b] = (int32_t)kern_argmax(Y2 + (size_t)b * rows, rows);
      tok_ok &= t[b] == want[b];
    }
    CHECK(ok && memcmp(Y, Y2, yb) == 0, "%s %lldx%lld nb=%d: gathering launch (%d): logits == cuda_mm_matmul's", nm,
          (long long)rows, (long long)cols, nb, ok);
    CHECK(tok_ok, "%s %lldx%lld nb=%d: gathered argmax == kern_argmax of every row (row 0: %d vs %d)", nm,
          (long long)rows, (long long)cols, nb, t[0], want[0]);
    if (nb >= 2) { /* the accept launch: drafts equal to the argmaxes of rows 0..a-1, then one off */
      const int k = nb - 1;
      int32_t dr[8], out[16];
      const int a = k / 2 + (nb & 1);
      for (int i = 0; i < k; i++) dr[i] = i < a ? want[i] : want[i] + 1;
      int32_t *ddr = dev_put(dr, 4 * (size_t)k), *dout = dev_put(NULL, 4 * 16);
      float *drow = dev_put(NULL, sizeof(float) * (size_t)rows), *row = malloc(sizeof(float) * (size_t)rows);
      cuda_rt_memset_async(dout, 0xFF, 4 * 16, NULL);
      const int rc = cuda_spec_accept_keys(ddr, dk, dout, k, dout + 8, dY2, rows, drow, NULL);
      /* 65 drafts are over the launch's 65 rows: refused, nothing launched (dout keeps its 0xFF) */
      const int rc_big = cuda_spec_accept_keys(ddr, dk, dout + 12, 65, dout + 8, dY2, rows, NULL, NULL);
      dev_get(out, dout, 4 * 16), dev_get(row, drow, sizeof(float) * (size_t)rows);
      CHECK(rc == 0 && rc_big == -1 && out[12] == -1, "%s nb=%d: the accept launch takes k = %d (rc %d) and refuses 65 (rc %d)",
            nm, nb, k, rc, rc_big);
      int am_ok = out[8] == a && memcmp(row, Y2 + (size_t)a * rows, sizeof(float) * (size_t)rows) == 0;
      for (int i = 0; i <= k; i++) am_ok &= out[i] == want[i];
      CHECK(am_ok, "%s nb=%d: the accept launch on the keys: argmaxes, count %d (want %d), the accepted row", nm, nb,
            out[8], a);
      cuda_rt_free(ddr), cuda_rt_free(dout), cuda_rt_free(drow);
      free(row);
    }
    { /* the embedding norm's last row from the keys: its token written, its row the embedding of it
         (an F32 table of rows x 4 floats whose row r is r, r, r, r) */
      const int64_t E = 4;
      float *tab = malloc(sizeof(float) * (size_t)(rows * E)), w[4] = {1, 1, 1, 1}, x[8 * 4];
      for (int64_t r = 0; r < rows * E; r++) tab[r] = (float)(r / E);
      int32_t tk[8];
      for (int b = 0; b < nb; b++) tk[b] = b; /* the last one is overwritten by the keys' */
      float *dtab = dev_put(tab, sizeof(float) * (size_t)(rows * E)), *dw = dev_put(w, sizeof w);
      float *dx = dev_put(NULL, sizeof x), *dyn = dev_put(NULL, sizeof x);
      int32_t *dtk = dev_put(tk, 4 * (size_t)nb);
      cuda_mm_embed_norm_act(NULL, FLOE_TYPE_F32, dtab, 4 * (size_t)E, rows, dtk, dk + (size_t)(nb - 1) * CUDA_AMK_ROW,
                             dx, dw, dyn, nb, E, 1e-6f, NULL, 0, NULL);
      dev_get(x, dx, 4 * (size_t)(nb * E)), dev_get(tk, dtk, 4 * (size_t)nb);
      int e_ok = tk[nb - 1] == want[nb - 1];
      for (int b = 0; b < nb; b++)
        for (int64_t i = 0; i < E; i++) e_ok &= x[b * E + i] == (float)(b == nb - 1 ? want[nb - 1] : b);
      CHECK(e_ok, "%s nb=%d: the embedding norm's last row from the keys: token %d (want %d) and its row", nm, nb,
            tk[nb - 1], want[nb - 1]);
      cuda_rt_free(dtab), cuda_rt_free(dw), cuda_rt_free(dx), cuda_rt_free(dyn), cuda_rt_free(dtk);
      free(tab);
    }
    cuda_rt_free(dxq), cuda_rt_free(dk), cuda_rt_free(dY), cuda_rt_free(dY2), cuda_rt_free(dt);
    free(X), free(xq), free(Y), free(Y2);
  }
  dmat_free(&g);
  tmat_free(&m);
}

/* The norms with the quantization fused (cuda_mm_norm_act, cuda_mm_combine_act): the normed rows
 * equal the plain norm's (cuda_add_rmsnorm / cuda_moe_combine, held to the CPU by test_cuda_ops),
 * the x written back equals, and the quantized bytes equal cuda_mm_act_quantize of those rows and
 * the CPU's kern_act_quantize_rows. */
static int g_act2 = 1; /* the quantizer form set by cuda_mm_set_act2 (check_norm_act's norm pair) */
static void check_norm_act(uint32_t type, int bits, int group, uint32_t sbt, int64_t n, int T) {
  tmat m = make_mat(type, bits, group, sbt, 3, n, 1);
  char nm[64];
  tname(&m.W, nm, sizeof nm);
  dmat g = upload(&m, 1);
  const size_t ab = kern_act_bytes(&m.W), xs = (ab + 63) / 64 * 64 + 64; /* a padded stride */
  const int K = 3 + (int)(n / 256 + 5 * T) % 14; /* 3..16 slots: one and two of the combine's load batches */
  float *x = malloc(sizeof(float) * (size_t)(n * T)), *dl = malloc(sizeof(float) * (size_t)(n * T));
  float *w = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)(n * T * K));
  float *wt = malloc(sizeof(float) * (size_t)(T * K)), *sh = malloc(sizeof(float) * (size_t)(n * T));
  float *shl = malloc(sizeof(float) * (size_t)T);
  fill_x(x, n * T), fill_x(dl, n * T), fill_x(y, n * T * K), fill_x(sh, n * T);
  for (int64_t i = 0; i < n; i++) w[i] = 0.5f + (float)(floe_rng_u64(&rng) % 1000) / 1000.0f;
  for (int i = 0; i < T * K; i++) wt[i] = (float)(floe_rng_u64(&rng) % 1000) / 3000.0f;
  for (int t = 0; t < T; t++) shl[t] = (float)(floe_rng_u64(&rng) % 600) / 100.0f - 3.0f;
  const size_t fb = sizeof(float) * (size_t)(n * T);
  float *dw = dev_put(w, sizeof(float) * (size_t)n), *ddl = dev_put(dl, fb), *dy = dev_put(y, fb * K);
  float *dwt = dev_put(wt, sizeof(float) * (size_t)(T * K)), *dsh = dev_put(sh, fb), *dshl = dev_put(shl, 4 * (size_t)T);
  float *dx1 = dev_put(x, fb), *dx2 = dev_put(x, fb), *dh1 = dev_put(NULL, fb), *dh2 = dev_put(NULL, fb);
  uint8_t *q1 = malloc(xs * T), *q2 = malloc(xs * T), *qc = malloc(xs * T);
  float *h1 = malloc(fb), *h2 = malloc(fb), *x1 = malloc(fb), *x2 = malloc(fb);
  void *dq1 = dev_put(NULL, xs * T), *dq2 = dev_put(NULL, xs * T);
  for (int form = 0; form < 2; form++) { /* 0: add + norm, 1: combine + norm */
    cuda_rt_h2d(dx1, x, fb, err, sizeof err);
    cuda_rt_h2d(dx2, x, fb, err, sizeof err);
    memset(q1, 0x5A, xs * T), memset(q2, 0x5A, xs * T), memcpy(qc, q1, xs * T);
    cuda_rt_h2d(dq1, q1, xs * T, err, sizeof err);
    cuda_rt_h2d(dq2, q2, xs * T, err, sizeof err);
    dev_poison(dh1, fb), dev_poison(dh2, fb);
    if (form == 0) {
      cuda_mm_norm_act(&g.M, dx1, ddl, dw, dh1, T, n, 1e-6f, dq1, xs, NULL);
      cuda_add_rmsnorm(dx2, ddl, dw, dh2, T, n, 1e-6f, NULL);
    } else {
      cuda_mm_combine_act(&g.M, dx1, dy, dwt, K, dsh, dshl, dw, dh1, 1e-6f, T, n, dq1, xs, NULL);
      cuda_moe_combine(dx2, dy, dwt, K, dsh, dshl, dw, dh2, 1e-6f, T, n, NULL);
    }
    cuda_mm_act_quantize(&g.M, T, dh2, n, dq2, xs, NULL);
    CHECK(cuda_rt_check("norm_act", err, sizeof err) == 0, "%s norm_act launch: %s", nm, err);
    dev_get(h1, dh1, fb), dev_get(h2, dh2, fb), dev_get(x1, dx1, fb), dev_get(x2, dx2, fb);
    dev_get(q1, dq1, xs * T), dev_get(q2, dq2, xs * T);
    kern_act_quantize_rows(&m.W, T, h2, n, qc, xs);
    const char *fn = form ? "combine" : "add+norm";
    CHECK(memcmp(h1, h2, fb) == 0 && memcmp(x1, x2, fb) == 0, "%s n=%lld T=%d %s fused: normed rows and x equal the plain norm's",
          nm, (long long)n, T, fn);
    int qok = 1, cok = 1;
    for (int t = 0; t < T; t++) {
      qok &= memcmp(q1 + (size_t)t * xs, q2 + (size_t)t * xs, ab) == 0;
      cok &= memcmp(q1 + (size_t)t * xs, qc + (size_t)t * xs, ab) == 0;
    }
    CHECK(qok, "%s n=%lld T=%d %s fused: quantized bytes == cuda_mm_act_quantize", nm, (long long)n, T, fn);
    CHECK(cok, "%s n=%lld T=%d %s fused: quantized bytes == kern_act_quantize_rows", nm, (long long)n, T, fn);
  }
  /* the embedding forms below: an F32 table of x's T rows read through the tokens reversed (dtk),
     against the norms on those rows given in that order (xr) */
  int32_t *tk = malloc(sizeof(int32_t) * (size_t)T);
  float *xr = malloc(fb);
  for (int t = 0; t < T; t++) tk[t] = T - 1 - t, memcpy(xr + (size_t)t * n, x + (size_t)(T - 1 - t) * n, 4 * (size_t)n);
  int32_t *dtk = dev_put(tk, sizeof(int32_t) * (size_t)T);
  { /* the trunk's first norm on embedding rows written in its launch == the norm on those rows: x
       written, the normed rows, the quantized bytes */
    float *dtab = dev_put(x, fb);
    cuda_rt_h2d(dx2, xr, fb, err, sizeof err);
    dev_poison(dx1, fb), dev_poison(dh1, fb), dev_poison(dh2, fb), dev_poison(dq1, xs * T), dev_poison(dq2, xs * T);
    cuda_mm_embed_norm_act(&g.M, FLOE_TYPE_F32, dtab, 4 * (size_t)n, T, dtk, NULL, dx1, dw, dh1, T, n, 1e-6f, dq1, xs, NULL);
    cuda_mm_norm_act(&g.M, dx2, NULL, dw, dh2, T, n, 1e-6f, dq2, xs, NULL);
    CHECK(cuda_rt_check("embed_norm_act", err, sizeof err) == 0, "%s embed norm launch: %s", nm, err);
    dev_get(h1, dh1, fb), dev_get(h2, dh2, fb), dev_get(x1, dx1, fb), dev_get(x2, dx2, fb);
    dev_get(q1, dq1, xs * T), dev_get(q2, dq2, xs * T);
    int ok = memcmp(h1, h2, fb) == 0 && memcmp(x1, x2, fb) == 0 && memcmp(x1, xr, fb) == 0;
    for (int t = 0; t < T; t++) ok &= memcmp(q1 + (size_t)t * xs, q2 + (size_t)t * xs, ab) == 0;
    CHECK(ok, "%s n=%lld T=%d norm on embedding rows written in its launch: x, the normed rows and the quantized "
          "bytes == the norm on those rows", nm, (long long)n, T);
    cuda_rt_free(dtab);
  }
  { /* the MTP's norm pair with the quantization of its 2n-value rows for a 2n-column matrix */
    tmat m2 = make_mat(type, bits, group, sbt, 3, 2 * n, 1);
    dmat g2 = upload(&m2, 1);
    const size_t ab2 = kern_act_bytes(&m2.W), xs2 = (ab2 + 63) / 64 * 64 + 64, fb2 = 2 * fb;
    float *dp1 = dev_put(NULL, fb2), *dp2 = dev_put(NULL, fb2), *p1 = malloc(fb2), *p2 = malloc(fb2);
    void *dr1 = dev_put(NULL, xs2 * T), *dr2 = dev_put(NULL, xs2 * T);
    uint8_t *r1 = malloc(xs2 * T), *r2 = malloc(xs2 * T);
    cuda_rt_h2d(dx1, x, fb, err, sizeof err);
    dev_poison(dp1, fb2), dev_poison(dp2, fb2), dev_poison(dr1, xs2 * T), dev_poison(dr2, xs2 * T);
    const int qd = cuda_mm_norm_pair_act(&g2.M, dx1, dw, ddl, dw, dp1, T, n, 1e-6f, dr1, xs2, NULL);
    cuda_mm_norm_pair(dx1, dw, ddl, dw, dp2, T, n, 1e-6f, NULL);
    cuda_mm_act_quantize(&g2.M, T, dp2, 2 * n, dr2, xs2, NULL);
    CHECK(cuda_rt_check("norm_pair_act", err, sizeof err) == 0, "%s norm pair launch: %s", nm, err);
    const int want = n % 256 == 0 && type != FLOE_TYPE_MLX && g_act2;
    CHECK(qd == want, "%s n=%lld T=%d norm pair: %s", nm, (long long)n, T, want ? "quantized in the launch" : "not quantized (refused)");
    dev_get(p1, dp1, fb2), dev_get(p2, dp2, fb2), dev_get(r1, dr1, xs2 * T), dev_get(r2, dr2, xs2 * T);
    CHECK(memcmp(p1, p2, fb2) == 0, "%s n=%lld T=%d norm pair (quantizing): the normed rows == cuda_mm_norm_pair's", nm,
          (long long)n, T);
    if (qd) {
      int ok = 1;
      for (int t = 0; t < T; t++) ok &= memcmp(r1 + (size_t)t * xs2, r2 + (size_t)t * xs2, ab2) == 0;
      CHECK(ok, "%s n=%lld T=%d norm pair: its quantized rows == cuda_mm_act_quantize of the 2n-value rows", nm,
            (long long)n, T);
    }
    { /* x1's rows read as embedding rows in the launch (the table dx1 holds x): the same normed rows
         and quantized bytes as the pair on x1's rows in that order */
      float *dxr = dev_put(xr, fb);
      dev_poison(dp1, fb2), dev_poison(dp2, fb2), dev_poison(dr1, xs2 * T), dev_poison(dr2, xs2 * T);
      const int qe = cuda_mm_embed_norm_pair_act(&g2.M, FLOE_TYPE_F32, dx1, 4 * (size_t)n, T, dtk, NULL, dw, ddl, dw, dp1, T,
                                                 n, 1e-6f, dr1, xs2, NULL);
      const int qr = cuda_mm_norm_pair_act(&g2.M, dxr, dw, ddl, dw, dp2, T, n, 1e-6f, dr2, xs2, NULL);
      CHECK(cuda_rt_check("embed_norm_pair", err, sizeof err) == 0, "%s embed norm pair launch: %s", nm, err);
      dev_get(p1, dp1, fb2), dev_get(p2, dp2, fb2), dev_get(r1, dr1, xs2 * T), dev_get(r2, dr2, xs2 * T);
      int ok = qe == qr && memcmp(p1, p2, fb2) == 0;
      for (int t = 0; qe && t < T; t++) ok &= memcmp(r1 + (size_t)t * xs2, r2 + (size_t)t * xs2, ab2) == 0;
      CHECK(ok, "%s n=%lld T=%d norm pair on embedding rows read in the launch (quantized %d / %d): the same rows and "
            "bytes as on those rows given", nm, (long long)n, T, qe, qr);
      cuda_rt_free(dxr);
    }
    cuda_rt_free(dp1), cuda_rt_free(dp2), cuda_rt_free(dr1), cuda_rt_free(dr2);
    free(p1), free(p2), free(r1), free(r2);
    dmat_free(&g2);
    tmat_free(&m2);
  }
  void *frees[] = {dw, ddl, dy, dwt, dsh, dshl, dx1, dx2, dh1, dh2, dq1, dq2, dtk};
  for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) cuda_rt_free(frees[i]);
  free(x), free(dl), free(w), free(y), free(wt), free(sh), free(shl), free(q1), free(q2), free(qc);
  free(h1), free(h2), free(x1), free(x2), free(tk), free(xr);
  dmat_free(&g);
  tmat_free(&m);
}

/* The router with the routing in its last block (cuda_mm_router_route) against the two steps
 * (cuda_mm_matmul on the float path, then cuda_moe_route / cuda_moe_route_sh), bit for bit; run
 * three times (the block counter must come back to 0). */
static void check_router_route(uint32_t type, int NE, int K, int norm, int sh, int64_t E) {
  const int64_t rows = NE + (sh ? 1 : 0);
  tmat m = make_mat(type, 0, 0, 0, rows, E, 1);
  dmat g = upload(&m, 1);
  const int ks = K + (sh ? 1 : 0);
  float *x = malloc(sizeof(float) * (size_t)E);
  fill_x(x, E);
  float *dx = dev_put(x, sizeof(float) * (size_t)E), *dl1 = dev_put(NULL, 4 * (size_t)rows), *dl2 = dev_put(NULL, 4 * (size_t)rows);
  float *dw1 = dev_put(NULL, 4 * (size_t)ks), *dw2 = dev_put(NULL, 4 * (size_t)ks);
  int32_t *ds1 = dev_put(NULL, 4 * (size_t)ks), *ds2 = dev_put(NULL, 4 * (size_t)ks);
  unsigned *ctr = dev_put(NULL, 16);
  cuda_rt_memset_async(ctr, 0, 16, NULL);
  cuda_mm_matmul(&g.M, 1, dx, E, NULL, 0, dl2, rows, NULL);
  if (sh) cuda_moe_route_sh(dl2, 1, NE, K, norm, dl2 + NE, NE, ds2, dw2, NULL);
  else cuda_moe_route(dl2, 1, NE, K, norm, ds2, dw2, NULL);
  float l1[1100], l2[1100], w1[80], w2[80];
  int32_t s1[80], s2[80];
  dev_get(l2, dl2, 4 * (size_t)rows), dev_get(w2, dw2, 4 * (size_t)ks), dev_get(s2, ds2, 4 * (size_t)ks);
  int ok = 1, rc = 0;
  for (int rep = 0; rep < 3; rep++) {
    dev_poison(dl1, 4 * (size_t)rows), dev_poison(dw1, 4 * (size_t)ks), dev_poison(ds1, 4 * (size_t)ks);
    rc |= cuda_mm_router_route(&g.M, dx, dl1, NE, K, norm, sh ? NE : -1, ds1, dw1, ctr, NULL);
    dev_get(l1, dl1, 4 * (size_t)rows), dev_get(w1, dw1, 4 * (size_t)ks), dev_get(s1, ds1, 4 * (size_t)ks);
    ok &= memcmp(l1, l2, 4 * (size_t)rows) == 0 && memcmp(w1, w2, 4 * (size_t)ks) == 0 &&
          memcmp(s1, s2, 4 * (size_t)ks) == 0;
  }
  CHECK(cuda_rt_check("router_route", err, sizeof err) == 0 && rc == 0, "router+route %s NE=%d K=%d: launched (%s)",
        floe_type_info(type)->name, NE, K, err);
  CHECK(ok, "router+route %s NE=%d K=%d norm=%d shared=%d E=%lld: logits, experts and weights == the two steps, 3 runs",
        floe_type_info(type)->name, NE, K, norm, sh, (long long)E);
  /* a matrix of the wrong shape is refused, nothing launched */
  CHECK(cuda_mm_router_route(&g.M, dx, dl1, NE + 5, K, norm, sh ? NE : -1, ds1, dw1, ctr, NULL) == FLOE_E_UNSUPPORTED,
        "router+route: a row count other than NE (+1) is refused");
  CHECK(cuda_mm_router_route(&g.M, dx, dl1, 1025, K, norm, -1, ds1, dw1, ctr, NULL) == FLOE_E_UNSUPPORTED,
        "router+route: more than 1024 experts are refused (two launches instead)");
  CHECK(cuda_mm_router_route(&g.M, dx, dl1, NE, 33, norm, sh ? NE : -1, ds1, dw1, ctr, NULL) == FLOE_E_UNSUPPORTED,
        "router+route: more than 32 experts a token are refused (two launches instead)");
  void *fr[] = {dx, dl1, dl2, dw1, dw2, ds1, ds2, ctr};
  for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) cuda_rt_free(fr[i]);
  free(x);
  dmat_free(&g);
  tmat_free(&m);
}

/* One token's routing in the gate+up launch (cuda_mm_moe_gate_up_route) against the two steps
 * (cuda_moe_route / cuda_moe_route_sh, then cuda_mm_moe_gate_up on their ids), bit for bit: the
 * selections, their weights and every GLU output, three runs on poisoned outputs. Logits with ties
 * (two experts' equal) test the lower index's pick. Rows of up to two superblocks (k_k4s's) and
 * the switch off are refused with nothing launched. */
static void check_glu_route(uint32_t type, int NE, int K, int norm, int sh, int64_t E, int64_t I) {
  const int nst = NE + (sh ? 1 : 0), ks = K + (sh ? 1 : 0);
  tmat mg = make_mat(type, 0, 0, 0, I, E, nst), mu = make_mat(type, 0, 0, 0, I, E, nst);
  dmat gg = upload(&mg, nst), gu = upload(&mu, nst);
  float *x = malloc(sizeof(float) * (size_t)E), lg[1100];
  fill_x(x, E);
  for (int e = 0; e <= NE; e++) lg[e] = 2.0f * floe_rng_normal(&rng);
  lg[NE / 3] = lg[NE / 2]; /* a tie */
  const size_t ab = cuda_mm_act_bytes(&gg.M);
  float *dx = dev_put(x, sizeof(float) * (size_t)E), *dl = dev_put(lg, 4 * (size_t)(NE + 1));
  void *dxq = dev_put(NULL, ab);
  cuda_mm_act_quantize(&gg.M, 1, dx, E, dxq, ab, NULL);
  float *dw1 = dev_put(NULL, 4 * (size_t)ks), *dw2 = dev_put(NULL, 4 * (size_t)ks);
  int32_t *ds1 = dev_put(NULL, 4 * (size_t)ks), *ds2 = dev_put(NULL, 4 * (size_t)ks);
  float *dh1 = dev_put(NULL, 4 * (size_t)(ks * I)), *dh2 = dev_put(NULL, 4 * (size_t)(ks * I));
  if (sh) cuda_moe_route_sh(dl, 1, NE, K, norm, dl + NE, NE, ds2, dw2, NULL);
  else cuda_moe_route(dl, 1, NE, K, norm, ds2, dw2, NULL);
  cuda_mm_moe_gate_up(&gg.M, &gu.M, 1, ks, ds2, dx, E, dxq, ab, dh2, I, NULL);
  float w1[40], w2[40], *h1 = malloc(4 * (size_t)(ks * I)), *h2 = malloc(4 * (size_t)(ks * I));
  int32_t s1[40], s2[40];
  dev_get(w2, dw2, 4 * (size_t)ks), dev_get(s2, ds2, 4 * (size_t)ks), dev_get(h2, dh2, 4 * (size_t)(ks * I));
  const int nsb = (int)(E / 256), want = nsb > 2 ? 0 : FLOE_E_UNSUPPORTED;
  cuda_mm_set_k4w(1); /* the decode kernels' defaults (the section before leaves k_k4w off) */
  int ok = 1, rc = 0;
  for (int rep = 0; rep < 3; rep++) {
    dev_poison(dw1, 4 * (size_t)ks), dev_poison(ds1, 4 * (size_t)ks), dev_poison(dh1, 4 * (size_t)(ks * I));
    rc |= cuda_mm_moe_gate_up_route(&gg.M, &gu.M, dl, NE, K, norm, sh ? NE : -1, ds1, dw1, dxq, dh1, I, NULL) != want;
    if (want) break;
    dev_get(w1, dw1, 4 * (size_t)ks), dev_get(s1, ds1, 4 * (size_t)ks), dev_get(h1, dh1, 4 * (size_t)(ks * I));
    ok &= memcmp(w1, w2, 4 * (size_t)ks) == 0 && memcmp(s1, s2, 4 * (size_t)ks) == 0 &&
          memcmp(h1, h2, 4 * (size_t)(ks * I)) == 0;
  }
  CHECK(cuda_rt_check("glu_route", err, sizeof err) == 0 && rc == 0, "route+gate+up %s NE=%d K=%d E=%lld: %s (%s)",
        floe_type_info(type)->name, NE, K, (long long)E, want ? "refused" : "launched", err);
  if (!want) {
    CHECK(ok, "route+gate+up %s NE=%d K=%d norm=%d shared=%d E=%lld I=%lld: experts, weights, GLU rows == the two "
              "steps, 3 runs", floe_type_info(type)->name, NE, K, norm, sh, (long long)E, (long long)I);
    cuda_mm_set_route_glu(0);
    CHECK(cuda_mm_moe_gate_up_route(&gg.M, &gu.M, dl, NE, K, norm, sh ? NE : -1, ds1, dw1, dxq, dh1, I, NULL) ==
              FLOE_E_UNSUPPORTED, "route+gate+up: off (cuda_mm_set_route_glu(0)) is refused");
    cuda_mm_set_route_glu(1);
  }
  cuda_mm_set_k4w(0); /* as found */
  void *fr[] = {dx, dl, dxq, dw1, dw2, ds1, ds2, dh1, dh2};
  for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) cuda_rt_free(fr[i]);
  free(x), free(h1), free(h2);
  dmat_free(&gg), dmat_free(&gu);
  tmat_free(&mg), tmat_free(&mu);
}

int main(void) {
  if (cuda_rt_device_count() == 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  if (cuda_rt_init(0, err, sizeof err) || cuda_mm_init(err, sizeof err)) {
    printf("FAIL cannot initialise the device: %s\n0 passed, 1 failed\n", err);
    return 1;
  }
  char dn[128];
  cuda_rt_device_name(0, dn, sizeof dn, err, sizeof err);
  printf("device: %s; CPU ISA %s\n", dn, kern_isa_name(kern_isa_get()));
  floe_rng_seed(&rng, 20261201);
  floe_rng_seed(&rng_sc, 7);

  SECTION("unsupported types are refused");
  CHECK(cuda_mm_type_supported(FLOE_TYPE_Q8_K, 256, NULL, err, sizeof err) == FLOE_E_UNSUPPORTED && err[0],
        "q8_K refused: %s", err);
  CHECK(cuda_mm_type_supported(FLOE_TYPE_Q4_K, 200, NULL, err, sizeof err) == FLOE_E_UNSUPPORTED, "q4_K 200 cols refused: %s", err);

  static const uint32_t types[] = {FLOE_TYPE_Q8_0, FLOE_TYPE_Q4_0, FLOE_TYPE_IQ4_NL, FLOE_TYPE_MXFP4, FLOE_TYPE_Q4_K,
                                   FLOE_TYPE_Q5_K, FLOE_TYPE_Q6_K, FLOE_TYPE_IQ4_XS, FLOE_TYPE_F32, FLOE_TYPE_F16,
                                   FLOE_TYPE_BF16, FLOE_TYPE_Q4_1, FLOE_TYPE_Q5_0, FLOE_TYPE_Q5_1, FLOE_TYPE_Q2_K,
                                   FLOE_TYPE_Q3_K, FLOE_TYPE_IQ2_XXS, FLOE_TYPE_IQ2_XS, FLOE_TYPE_IQ2_S,
                                   FLOE_TYPE_IQ3_XXS, FLOE_TYPE_IQ3_S, FLOE_TYPE_IQ1_S, FLOE_TYPE_IQ1_M};
  /* rows: not multiples of 4, 16, 32; columns: 1, 3, odd and 16+ blocks (a Q4_K slot gets two
   * superblocks past 16) */
  static const int64_t rows_of[] = {1, 19, 67};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const uint32_t t = types[ti];
    const int blck = floe_type_info(t)->blck;
    SECTION("%s", floe_type_info(t)->name);
    const int64_t cols_of[] = {blck == 1 ? 13 : blck, blck == 1 ? 200 : 3 * blck, blck == 1 ? 1000 : (blck == 32 ? 13 : 18) * blck,
                               blck == 256 ? 256 * 37 : 32 * 71};
    for (int ci = 0; ci < 4; ci++)
      for (int ri = 0; ri < 3; ri++) {
        if (ci == 3 && ri != 1) continue; /* the long rows once */
        check_matrix(t, 0, 0, 0, rows_of[ri], cols_of[ci]);
      }
  }
  SECTION("Q4_K / Q5_K rows of two superblocks (k_k4s: 2 rows a warp; one superblock: 4, above)");
  check_matrix(FLOE_TYPE_Q4_K, 0, 0, 0, 67, 512);
  check_matrix(FLOE_TYPE_Q5_K, 0, 0, 0, 2048 + 3, 512);
  SECTION("float matrices of the router's shape (k_plain_tile: whole chunks, rows past the last tile)");
  check_matrix(FLOE_TYPE_F32, 0, 0, 0, 257, 2048);
  check_matrix(FLOE_TYPE_BF16, 0, 0, 0, 1, 2048 + 64);
  g_ldx_pad = 4; /* aligned rows: k_plain_tile stages whole chunks by float4, a partial last chunk as before */
  check_matrix(FLOE_TYPE_F32, 0, 0, 0, 257, 2048);
  check_matrix(FLOE_TYPE_F16, 0, 0, 0, 33, 1000);
  g_ldx_pad = 3;
  SECTION("router with the routing fused");
  check_router_route(FLOE_TYPE_F32, 256, 8, 1, 1, 2048);
  check_router_route(FLOE_TYPE_F32, 256, 8, 1, 0, 2048);
  check_router_route(FLOE_TYPE_F32, 100, 6, 0, 1, 1000);
  check_router_route(FLOE_TYPE_BF16, 512, 10, 1, 1, 2048);
  check_router_route(FLOE_TYPE_F32, 257, 8, 1, 0, 2048);   /* 16 experts a lane */
  check_router_route(FLOE_TYPE_F32, 1000, 16, 1, 1, 300);  /* 32 a lane; rows not a multiple of 4 */
  check_router_route(FLOE_TYPE_F16, 40, 32, 0, 1, 77);     /* K = 32; a 77-value tail */
  check_router_route(FLOE_TYPE_F16, 60, 4, 1, 0, 200);
  check_router_route(FLOE_TYPE_F32, 500, 32, 1, 0, 64);  /* the largest K */
  SECTION("the routing in the gate+up launch (one token)");
  check_glu_route(FLOE_TYPE_Q4_K, 256, 8, 1, 1, 2048, 512); /* the 35B-A3B shape */
  check_glu_route(FLOE_TYPE_Q4_K, 256, 8, 1, 0, 2048, 512);
  check_glu_route(FLOE_TYPE_Q5_K, 100, 6, 0, 1, 768, 72);   /* rows not a multiple of 4 */
  check_glu_route(FLOE_TYPE_Q4_K, 512, 10, 1, 1, 1280, 40); /* 16 experts a lane */
  check_glu_route(FLOE_TYPE_Q5_K, 1000, 32, 1, 0, 1024, 8); /* 32 a lane, the largest K */
  check_glu_route(FLOE_TYPE_Q4_K, 64, 4, 1, 1, 512, 64);    /* two superblocks: k_k4s's rows, refused */
  SECTION("activation quantization, both implementations");
  check_act(FLOE_TYPE_Q4_K, 256, 3);
  check_act(FLOE_TYPE_Q4_K, 4096, 2);     /* the 35B-A3B's GatedDeltaNet output: 16 chunks */
  check_act(FLOE_TYPE_Q4_K, 256 * 17, 2); /* more chunks than a block's warps */
  check_act(FLOE_TYPE_Q5_K, 256 * 37, 2); /* past the first form's staging limit */
  check_act(FLOE_TYPE_Q6_K, 256 * 3, 9);
  check_act(FLOE_TYPE_IQ4_XS, 256 * 5, 2);
  check_act(FLOE_TYPE_Q8_0, 32, 2);
  check_act(FLOE_TYPE_Q8_0, 32 * 13, 3);  /* a partial 256-chunk */
  check_act(FLOE_TYPE_Q4_0, 32 * 71, 2);
  check_act(FLOE_TYPE_IQ4_NL, 32 * 300, 2);
  check_act(FLOE_TYPE_MXFP4, 32 * 9, 2);
  for (int v = 0; v < 6; v++) {
    /* each quantizer form with the weights loaded after / before the wait (and the late trigger) */
    const int impl = v & 1, pw = v < 2 ? 0 : v < 4 ? 1 : 3;
    SECTION("norms with the quantization fused (%s, FLOE_CUDA_PREW %d)",
            impl ? "warp per chunk, combine loads batched" : "first forms", pw);
    cuda_rt_set_prew(pw);
    cuda_mm_set_act2(impl);
    g_act2 = impl;
    check_norm_act(FLOE_TYPE_Q4_K, 0, 0, 0, 2048, 1);
    check_norm_act(FLOE_TYPE_Q4_K, 0, 0, 0, 256 * 3, 3);
    check_norm_act(FLOE_TYPE_Q8_0, 0, 0, 0, 32 * 37, 2);
    check_norm_act(FLOE_TYPE_Q8_0, 0, 0, 0, 256, 2); /* the default model's width: its MTP norm pair quantizes */
    check_norm_act(FLOE_TYPE_IQ4_XS, 0, 0, 0, 256 * 5, 1);
    check_norm_act(FLOE_TYPE_Q6_K, 0, 0, 0, 256 * 9, 2);
    check_norm_act(FLOE_TYPE_Q5_K, 0, 0, 0, 256 * 12, 1); /* past the combine's register path */
    check_norm_act(FLOE_TYPE_MLX, 4, 64, FLOE_TYPE_BF16, 64 * 7, 2);
    check_norm_act(FLOE_TYPE_MLX, 8, 32, FLOE_TYPE_F16, 32 * 40, 1);
  }
  cuda_rt_set_prew(0);
  cuda_mm_set_act2(1);
  g_act2 = 1;
  SECTION("heads gathering their argmax (cuda_mm_matmul_amax)");
  check_amax(FLOE_TYPE_Q8_0, 8192, 256);  /* the default model's head */
  check_amax(FLOE_TYPE_Q6_K, 1003, 512);
  check_amax(FLOE_TYPE_IQ4_XS, 67, 256);
  check_amax(FLOE_TYPE_Q4_0, 19, 64);
  check_amax(FLOE_TYPE_Q4_K, 67, 512);     /* not gathered: k_k4 */
  check_amax(FLOE_TYPE_Q8_0, 16384, 64);   /* not gathered: the lanes kernel's size */
  SECTION("mlx");
  static const int mbits[] = {4, 8, 2, 3, 5, 6};
  static const int mgroups[] = {32, 64, 128};
  static const uint32_t msb[] = {FLOE_TYPE_BF16, FLOE_TYPE_F16, FLOE_TYPE_F32};
  for (int bi = 0; bi < 6; bi++)
    for (int gi = 0; gi < 3; gi++) {
      const int g = mgroups[gi];
      const uint32_t sb = msb[(bi + gi) % 3];
      check_matrix(FLOE_TYPE_MLX, mbits[bi], g, sb, 19, g);            /* one group, a partial chunk */
      check_matrix(FLOE_TYPE_MLX, mbits[bi], g, sb, 67, g < 128 ? 64 * 7 : 128 * 7); /* a partial last chunk */
      check_matrix(FLOE_TYPE_MLX, mbits[bi], g, sb, 5, 128 * 21);      /* > 16 groups per bias lane */
    }

  static const uint32_t moe_types[] = {FLOE_TYPE_Q4_K, FLOE_TYPE_Q5_K, FLOE_TYPE_Q6_K, FLOE_TYPE_Q8_0, FLOE_TYPE_IQ4_XS,
                                       FLOE_TYPE_MXFP4, FLOE_TYPE_Q3_K, FLOE_TYPE_BF16};
  static const int impls[] = {CUDA_MM_Q16_WARP, CUDA_MM_Q16_LANES, CUDA_MM_Q16_LANES};
  for (int im = 0; im < 3; im++) { /* both implementations of the 16-lane types; k_k4w without and
                                      with the prefetch (and a 2-block grid: its warps loop) */
    SECTION("moe (16-lane types: %s; Q4_K / Q5_K: %s)", im == 0 ? "warp per row" : "4 lanes per thread",
            im == 0 ? "k_k4" : im == 1 ? "k_k4w" : "k_k4w / k_k4s for short rows, prefetch, 2 blocks");
    cuda_mm_set_q16_impl(impls[im]);
    cuda_mm_set_k4w(im >= 1);
    cuda_mm_set_pf(im == 2, im == 2 ? 2 : 0);
    cuda_mm_set_k4s(im == 2); /* rows of 1-2 superblocks: k_k4w (im 1) and k_k4s (im 2) */
    for (size_t i = 0; i < sizeof moe_types / sizeof moe_types[0]; i++) {
      if (im >= 1 && (!floe_type_info(moe_types[i])->quantized || moe_types[i] == FLOE_TYPE_Q3_K))
        continue; /* one implementation */
      if (im == 2 && moe_types[i] != FLOE_TYPE_Q4_K && moe_types[i] != FLOE_TYPE_Q5_K) continue;
      for (int qx = im == 2 ? 0 : 1; qx < 2; qx++) /* k_k4s: the down input quantized by k_act, then in the launch */
      for (int pp = 1; pp <= (im >= 1 && (moe_types[i] == FLOE_TYPE_Q4_K || moe_types[i] == FLOE_TYPE_Q5_K) ? 8 : 1);
           pp *= 2) { /* k_k4w: its rounds' loads 1, 2, 4 rounds ahead; 8: 4 lanes a superblock (k_k4s: 8 only) */
        if (im == 2 && pp != 1 && pp != 8) continue;
        cuda_mm_set_down_qx(qx);
        cuda_mm_set_k4w_pipe(pp == 8 ? 1 : pp);
        cuda_mm_set_k4v(pp == 8 ? 2 : 0);
        check_moe(moe_types[i], 0, 0, 0, 512, 256, 3, 2, 0, 0, 5);
        check_moe(moe_types[i], 0, 0, 0, 512, 768, 1, 4, 0, 0, 5);
        check_moe(moe_types[i], 0, 0, 0, 256, 512, 2, 1, 1, 0, 5);
        if (im == 2) check_moe(moe_types[i], 0, 0, 0, 2048, 512, 1, 9, 0, 0, 12); /* a decode step's 9 slots, 35B rows */
      }
    }
    if (im == 2) continue;
    check_moe(FLOE_TYPE_MLX, 4, 64, FLOE_TYPE_BF16, 512, 256, 3, 2, 0, 0, 5);
    check_moe(FLOE_TYPE_MLX, 8, 32, FLOE_TYPE_F16, 256, 512, 2, 3, 0, 0, 5);
    if (im == 0) check_moe(FLOE_TYPE_MLX, 6, 64, FLOE_TYPE_BF16, 256, 512, 2, 2, 0, 0, 5);
  }
  cuda_mm_set_q16_impl(CUDA_MM_Q16_AUTO);
  cuda_mm_set_k4w(0);
  cuda_mm_set_pf(1, 0);
  cuda_mm_set_k4s(1);
  cuda_mm_set_down_qx(0);
  cuda_mm_set_k4w_pipe(1);
  cuda_mm_set_k4v(2); /* the default */

  /* prefill: the tensor-core kernels (mm_mma.cu) against the CPU, and k_k4 (FLOE_CUDA_MMA=0) too;
   * rows not multiples of 16 / 64, activation rows not multiples of 32, 1..16 superblocks, and
   * past 16 (not taken: k_k4 runs them) */
  /* k_k4mma2 (cuda_mm_set_mma2 1 and 2) and k_k4mma (0): passes of 16 with 1 or 2 live n-tiles
   * (20, 41: a last pass of 4 / 9 rows; 17: one row), rows < 16 (a warp's partial prefetch),
   * superblocks 9..16 taken in pairs (9, 11, 16) */
  SECTION("joined matrices' parts into their own buffers (cuda_mm_matmul_parts)");
  static const uint32_t ptypes[] = {FLOE_TYPE_Q4_K, FLOE_TYPE_Q5_K, FLOE_TYPE_F32, FLOE_TYPE_BF16, FLOE_TYPE_Q8_0};
  static const int pnb[] = {2, 3, 5, 8, 13};
  for (size_t ti = 0; ti < sizeof ptypes / sizeof ptypes[0]; ti++)
    for (size_t k = 0; k < sizeof pnb / sizeof pnb[0]; k++)
      for (int few = 0; few < 3; few++) { /* 2: Q4_K / Q5_K by k_k4mn, 1: by k_k4wn */
        const int64_t cols = ptypes[ti] == FLOE_TYPE_F32 || ptypes[ti] == FLOE_TYPE_BF16 ? 1000 : 256 * 5;
        check_parts(ptypes[ti], 75, cols, pnb[k], 33, 57, 75, few); /* three parts */
        check_parts(ptypes[ti], 41, cols, pnb[k], 40, 41, 41, few); /* two: the last of one row (a shared gate) */
        check_parts(ptypes[ti], 90, cols, pnb[k], 51, 80, 85, few); /* four (q|k|v, z, b, a) */
      }

  SECTION("tensor-core matmuls (Q4_K / Q5_K, 16+ activation rows; k_k4mma2 both forms, k_k4mma, k_k4)");
  static const int64_t mshape[][3] = {{67, 2048, 33},    {130, 4096, 45},   {19, 512, 16},  {200, 256 * 3, 97},
                                      {64, 256, 32},     {70, 256 * 18, 20}, {257, 1024, 130}, {5, 512, 24},
                                      {150, 256 * 11, 41}, {33, 256 * 9, 17}, {129, 256 * 16, 20}};
  static const int impl_of[] = {2, 1, 0, -1}; /* cuda_mm_set_mma2; -1: no tensor cores (k_k4) */
  for (int ti = 0; ti < 2; ti++)
    for (size_t i = 0; i < sizeof mshape / sizeof mshape[0]; i++)
      for (int v = 0; v < 4; v++) {
        cuda_mm_set_mma2(impl_of[v] < 0 ? 2 : impl_of[v]);
        check_mma(ti ? FLOE_TYPE_Q5_K : FLOE_TYPE_Q4_K, mshape[i][0], mshape[i][1], (int)mshape[i][2], impl_of[v] >= 0);
      }
  cuda_mm_set_mma(1);
  for (int v = 0; v < 3; v++) {
    cuda_mm_set_mma2(impl_of[v]);
    SECTION("moe grouped by expert (prefill), tensor-core kernel %s",
            impl_of[v] == 0   ? "k_k4mma"
            : impl_of[v] == 1 ? "k_k4mma2 (registers ahead)"
                              : "k_k4mma2 (L2 prefetch, default)");
    for (int ti = 0; ti < 2; ti++) {
      const uint32_t t = ti ? FLOE_TYPE_Q5_K : FLOE_TYPE_Q4_K;
      check_moe(t, 0, 0, 0, 512, 256, 100, 4, 0, 1, 6);  /* ~67 slots an expert: several tiles each */
      check_moe(t, 0, 0, 0, 2048, 512, 37, 8, 0, 1, 20); /* the 35B-A3B row lengths */
      check_moe(t, 0, 0, 0, 256 * 3, 256 * 3, 5, 3, 0, 1, 9);
      g_skew = 1; /* expert 0: 37 / 45 slots (a 32-slot tile and a 5 / 13-slot one), expert 1: one, the last: none */
      check_moe(t, 0, 0, 0, 2048, 512, 37, 8, 0, 1, 24);
      check_moe(t, 0, 0, 0, 512, 256 * 10, 45, 3, 0, 1, 7); /* down of 10 superblocks: in pairs */
      g_skew = 0;
    }
  }
  cuda_mm_set_mma2(2);
  check_moe(FLOE_TYPE_Q6_K, 0, 0, 0, 512, 256, 40, 4, 0, 1, 6); /* no tensor-core kernel: the per-slot ones */
  check_moe(FLOE_TYPE_Q4_K, 0, 0, 0, 256 * 9, 256, 20, 2, 0, 1, 4); /* gate+up past 8 superblocks: per slot */
  return TEST_DONE();
}
