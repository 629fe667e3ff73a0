/* CUDA ops (src/kernels/cuda/cuda_ops.h) against the CPU math of src/model/layers.c, on fresh
 * random inputs of awkward sizes, every output poisoned (NaN) before each launch.
 * Bounds: bit-identical everywhere except
 *   - attention output: |gpu - cpu| <= 1e-4 * max|V| + 1e-6 (split-K softmax vs the CPU's single
 *     pass: rounding only); prefill rows vs decode of the same position: bit-identical;
 *   - GDN: |gpu - cpu| <= 1e-5 * (1 + |cpu|) (the decay's libm expf/log1pf vs the GPU's
 *     correctly-rounded double evaluation may differ by an ulp); how many elements are
 *     bit-identical is printed. Prefill vs token-by-token on the GPU: bit-identical.
 * The CPU references below mirror layers.c line by line (its helpers are static there; exp, sigmoid
 * and SiLU are base/vexp.h's, as on the CPU):
 * sumsq16, the attention softmax of attn_one, the conv / delta rule / gated norm of
 * gdn_conv_worker and gdn_heads_worker, router_softmax and the sorted top-k insert, the combine.
 * The routing and the combine run with both of their implementations (cuda_moe_set_route_impl,
 * cuda_mm_set_act2). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/gdn_sum.h"
#include "base/vexp.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda_mm.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_rt.h"
#include "model/model.h"
#include "quant/quant.h"
#include "test.h"

static floe_rng R;
static float urand(float lo, float hi) { return lo + (hi - lo) * floe_rng_uniform(&R); }

/* ---- device helpers ---- */
static void *dmalloc(size_t n) {
  void *d = NULL;
  char err[256];
  if (cuda_rt_malloc(&d, n, err, sizeof err)) printf("%s\n", err);
  return d;
}
static void h2d(void *d, const void *h, size_t n) {
  char err[256];
  if (cuda_rt_h2d(d, h, n, err, sizeof err)) printf("%s\n", err);
}
static void dmemset(void *d, int byte, size_t n) { cuda_rt_memset_async(d, byte, n, NULL); }
static void *dup_dev(const void *h, size_t n) {
  void *d = dmalloc(n);
  if (d && h) h2d(d, h, n);
  return d;
}
static void poison(void *d, size_t n) { dmemset(d, 0xff, n); } /* 0xffffffff: NaN */
static int sync_ok(void) {
  char err[256];
  const int rc = cuda_rt_device_sync(err, sizeof err);
  if (rc) printf("device error: %s\n", err);
  return rc == 0;
}
static void get(void *h, const void *d, size_t n) {
  char err[256];
  if (cuda_rt_d2h(h, d, n, err, sizeof err)) printf("%s\n", err);
}
static size_t n_diff_bits(const float *a, const float *b, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += memcmp(&a[i], &b[i], 4) != 0;
  return k;
}
static size_t n_nan(const float *a, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += a[i] != a[i];
  return k;
}

/* ---- CPU mirrors of layers.c ---- */
static float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static float fold16(float acc[16]) {
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; k++) acc[k] += acc[k + w];
  return acc[0];
}
static float sumsq16(const float *x, int64_t n) {
  float acc[16] = { 0 };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += x[i + k] * x[i + k];
  for (int k = 0; i + k < n; k++) acc[k] += x[i + k] * x[i + k];
  return fold16(acc);
}
static void rope_head(float *x, int64_t n_rot, const float *cs) {
  const int64_t h = n_rot / 2;
  for (int64_t j = 0; j < h; j++) {
    const float c = cs[j], sn = cs[h + j], a = x[j], b = x[j + h];
    x[j] = a * c - b * sn;
    x[j + h] = b * c + a * sn;
  }
}

/* ---- RMSNorm ---- */
static void test_norm(int64_t rows, int64_t n) {
  SECTION("rmsnorm (%lld rows of %lld) and the fused residual add", (long long)rows, (long long)n);
  const float eps = 1e-6f;
  float *x = malloc(rows * n * 4), *d = malloc(rows * n * 4), *w = malloc(n * 4), *y = malloc(rows * n * 4),
        *g = malloc(rows * n * 4), *gx = malloc(rows * n * 4);
  for (int64_t i = 0; i < rows * n; i++) x[i] = urand(-3, 3), d[i] = urand(-1, 1);
  for (int64_t i = 0; i < n; i++) w[i] = urand(0.5f, 1.5f);
  float *dx = dup_dev(x, rows * n * 4), *dd = dup_dev(d, rows * n * 4), *dw = dup_dev(w, n * 4), *dy = dup_dev(NULL, rows * n * 4);
  poison(dy, rows * n * 4);
  cuda_rmsnorm(dx, dw, dy, rows, n, eps, NULL);
  CHECK(sync_ok(), "rmsnorm ran");
  get(g, dy, rows * n * 4);
  for (int64_t r = 0; r < rows; r++) layer_rmsnorm(x + r * n, w, n, eps, y + r * n);
  CHECK(n_diff_bits(g, y, rows * n) == 0, "rmsnorm bit-identical (%zu differ)", n_diff_bits(g, y, rows * n));
  poison(dy, rows * n * 4);
  cuda_add_rmsnorm(dx, dd, dw, dy, rows, n, eps, NULL);
  CHECK(sync_ok(), "add_rmsnorm ran");
  get(g, dy, rows * n * 4);
  get(gx, dx, rows * n * 4);
  for (int64_t i = 0; i < rows * n; i++) x[i] += d[i];
  for (int64_t r = 0; r < rows; r++) layer_rmsnorm(x + r * n, w, n, eps, y + r * n);
  CHECK(n_diff_bits(gx, x, rows * n) == 0, "residual add bit-identical");
  CHECK(n_diff_bits(g, y, rows * n) == 0, "norm after add bit-identical (%zu differ)", n_diff_bits(g, y, rows * n));
  /* the pair (the MTP's input): row t = [norm(x_t) * w | norm(d_t) * w2] */
  float *w2 = malloc(n * 4), *yp = malloc(2 * rows * n * 4), *gp = malloc(2 * rows * n * 4);
  for (int64_t i = 0; i < n; i++) w2[i] = urand(-1.5f, 1.5f);
  float *dw2 = dup_dev(w2, n * 4), *dyp = dup_dev(NULL, 2 * rows * n * 4);
  poison(dyp, 2 * rows * n * 4);
  cuda_mm_norm_pair(dx, dw, dd, dw2, dyp, rows, n, eps, NULL);
  CHECK(sync_ok(), "norm pair ran");
  get(gp, dyp, 2 * rows * n * 4);
  for (int64_t r = 0; r < rows; r++) {
    layer_rmsnorm(x + r * n, w, n, eps, yp + 2 * r * n);
    layer_rmsnorm(d + r * n, w2, n, eps, yp + 2 * r * n + n);
  }
  CHECK(n_diff_bits(gp, yp, 2 * rows * n) == 0, "norm pair bit-identical (%zu differ)", n_diff_bits(gp, yp, 2 * rows * n));
  cuda_rt_free(dw2), cuda_rt_free(dyp);
  free(w2), free(yp), free(gp);
  cuda_rt_free(dx), cuda_rt_free(dd), cuda_rt_free(dw), cuda_rt_free(dy);
  free(x), free(d), free(w), free(y), free(g), free(gx);
}

/* ---- outputs quantized in their own launch (cuda_act_out: cuda_attn_q, cuda_gdn_step_q) ----
 * A matrix layout of `type` over cols columns, rows quantized in a kernel's launch (dxq), and the
 * check: the bytes cuda_mm_act_quantize writes for the same float rows (both buffers filled with
 * the same byte first, so the layouts' padding compares equal). */
typedef struct act_buf {
  cuda_mat W;
  size_t xs, bytes;
  uint8_t *dxq, *dref, *h1, *h2;
} act_buf;
static int act_unit_of(uint32_t type) { return type == FLOE_TYPE_Q8_0 ? 32 : 256; }
static void act_buf_init(act_buf *a, uint32_t type, int64_t cols, int64_t rows) {
  memset(a, 0, sizeof *a);
  a->W.type = type;
  a->W.rows = 1;
  a->W.cols = cols;
  a->W.n_expert = 1;
  a->xs = cuda_mm_act_bytes(&a->W);
  a->bytes = a->xs * (size_t)rows;
  a->dxq = dup_dev(NULL, a->bytes), a->dref = dup_dev(NULL, a->bytes);
  a->h1 = malloc(a->bytes), a->h2 = malloc(a->bytes);
  dmemset(a->dxq, 0xab, a->bytes);
}
static cuda_act_out act_buf_out(act_buf *a, int64_t row) {
  return (cuda_act_out){ &a->W, a->dxq + (size_t)row * a->xs, a->xs };
}
/* bytes of the rows at dxq that differ from cuda_mm_act_quantize of X (rows, ldx); SIZE_MAX when
 * the quantization did not run */
static size_t act_buf_diff(act_buf *a, const float *dX, int64_t rows, int64_t ldx) {
  const size_t nb = a->xs * (size_t)rows;
  dmemset(a->dref, 0xab, a->bytes);
  cuda_mm_act_quantize(&a->W, rows, dX, ldx, a->dref, a->xs, NULL);
  if (!sync_ok()) return SIZE_MAX;
  get(a->h1, a->dxq, nb), get(a->h2, a->dref, nb);
  size_t n = 0;
  for (size_t i = 0; i < nb; i++) n += a->h1[i] != a->h2[i];
  return n;
}
static void act_buf_free(act_buf *a) {
  cuda_rt_free(a->dxq), cuda_rt_free(a->dref);
  free(a->h1), free(a->h2);
}

/* ---- attention ---- */
/* CPU attention of one row (attn_one's arithmetic) for all heads: out [nh][hd] */
static void attn_ref(const cuda_attn_shape *sh, const float *q, const void *K, const void *V, int64_t np, float *out,
                     float *scr) {
  const int64_t hd = sh->head_dim, G = sh->n_head / sh->n_head_kv, qs = hd * (sh->gated ? 2 : 1);
  const size_t esz = sh->kv_bf16 ? 2 : 4;
  const float scale = (float)(1.0 / sqrt((double)hd));
  for (int64_t kh = 0; kh < sh->n_head_kv; kh++) {
    const void *Kh = (const char *)K + (size_t)kh * sh->n_ctx * hd * esz, *Vh = (const char *)V + (size_t)kh * sh->n_ctx * hd * esz;
    const float *q0 = q + kh * G * qs;
    float *o0 = out + kh * G * hd;
    kern_dot16_rows(q0, qs, (int)G, Kh, sh->kv_bf16, hd, np, hd, scr, sh->n_ctx);
    for (int64_t h = 0; h < G; h++) {
      float *sc = scr + h * sh->n_ctx, acc[16] = { 0 }, mx[16];
      const int64_t n16 = np / 16 * 16;
      for (int i = 0; i < 16; i++) mx[i] = -INFINITY;
      for (int64_t p = 0; p < n16; p += 16)
        for (int i = 0; i < 16; i++) {
          const float v = sc[p + i] * scale;
          sc[p + i] = v;
          mx[i] = v > mx[i] ? v : mx[i];
        }
      for (int64_t p = n16; p < np; p++) {
        const float v = sc[p] * scale;
        sc[p] = v;
        mx[0] = v > mx[0] ? v : mx[0];
      }
      float m0 = mx[0];
      for (int i = 1; i < 16; i++) m0 = mx[i] > m0 ? mx[i] : m0;
      for (int64_t p = 0; p < n16; p += 16)
        for (int i = 0; i < 16; i++) {
          sc[p + i] = floe_vexpf(sc[p + i] - m0);
          acc[i] += sc[p + i];
        }
      float sm = 0.0f;
      for (int i = 0; i < 16; i++) sm += acc[i];
      for (int64_t p = n16; p < np; p++) {
        sc[p] = floe_vexpf(sc[p] - m0);
        sm += sc[p];
      }
      for (int64_t p = 0; p < np; p++) sc[p] = sc[p] / sm;
      memset(o0 + h * hd, 0, (size_t)hd * 4);
    }
    kern_wsum_rows(scr, sh->n_ctx, (int)G, Vh, sh->kv_bf16, hd, np, hd, o0, hd);
    if (sh->gated)
      for (int64_t h = 0; h < G; h++)
        for (int64_t i = 0; i < hd; i++) o0[h * hd + i] *= floe_sigmoidf(q0[h * qs + hd + i]);
  }
}

/* The tensor-core order (cuda_attn_set_mma(1), bf16 caches): the rows of one prefill launch, of
 * launches of fewer rows, of each row's decode alone and of 32-row blocks are bit-identical, and
 * within the CPU bound. go: the CPU-order kernels' rows (at n0 >= 1000 the tensor-core sums must
 * differ from them somewhere: the mode ran). */
static void test_attn_tc(const cuda_attn_shape *sh, float *dq, void *dK, void *dV, int32_t *dpos, int32_t *dposv,
                         float *dout, void *dscr, const float *q, const void *Kc, const void *Vc, const float *go,
                         int64_t n0, int n_tok, float vmax) {
  const int64_t qdim = (int64_t)sh->n_head * sh->head_dim * (sh->gated ? 2 : 1), od = (int64_t)sh->n_head * sh->head_dim;
  float *gt = malloc(n_tok * od * 4), *g2 = malloc(n_tok * od * 4), *ro = malloc(od * 4);
  float *scr = malloc((size_t)(sh->n_head / sh->n_head_kv) * sh->n_ctx * 4);
  cuda_attn_set_mma(1);
  cuda_attn_set_mt(1);
  poison(dout, n_tok * od * 4);
  cuda_attn(sh, dq, dK, dV, dposv, n_tok, dout, dscr, NULL);
  const int ran = sync_ok();
  CHECK(ran, "tensor-core attention ran");
  if (ran) {
    get(gt, dout, n_tok * od * 4);
    CHECK(n_nan(gt, n_tok * od) == 0, "tensor-core order: every output written");
    double worst = 0.0;
    for (int64_t t = 0; t < n_tok; t++) {
      attn_ref(sh, q + t * qdim, Kc, Vc, n0 + t + 1, ro, scr);
      for (int64_t i = 0; i < od; i++) worst = fmax(worst, fabs((double)gt[t * od + i] - ro[i]));
    }
    const double bound = 1e-4 * vmax + 1e-6;
    CHECK(worst <= bound, "tensor-core order vs CPU: max |diff| %.3g <= %.3g", worst, bound);
    const size_t nd = n_diff_bits(gt, go, n_tok * od);
    printf("   tensor-core order: max |diff| vs CPU %.3g; %zu of %lld values differ from the CPU-order kernels\n",
           worst, nd, (long long)(n_tok * od));
    if (n0 >= 1000) CHECK(nd > 0, "tensor-core order: not the CPU-order kernels' bits (%zu differ)", nd);
    /* the same rows in other launches: fewer rows a launch, then 32 query rows a block (launches of
     * >= 16 rows), each compared bit for bit */
    for (int way = 0; way < 2; way++) {
      if (way == 1 && n_tok < 16) break;
      const int64_t step = way ? n_tok : 1 + n_tok / 3;
      cuda_attn_set_mt(way ? 2 : 1);
      poison(dout, n_tok * od * 4);
      for (int64_t t0 = 0; t0 < n_tok; t0 += step)
        cuda_attn(sh, dq + t0 * qdim, dK, dV, dposv + t0, n_tok - t0 < step ? n_tok - t0 : step, dout + t0 * od,
                  dscr, NULL);
      if (!sync_ok()) {
        CHECK(0, "tensor-core attention ran (%s)", way ? "32 query rows a block" : "fewer rows");
        break;
      }
      get(g2, dout, n_tok * od * 4);
      CHECK(n_diff_bits(g2, gt, n_tok * od) == 0, "tensor-core order, %s: the same bits (%zu differ)",
            way ? "32 query rows a block" : "launches of fewer rows", n_diff_bits(g2, gt, n_tok * od));
    }
    cuda_attn_set_mt(1);
    size_t ndiff = 0; /* the decode of each row alone */
    for (int64_t t = 0; t < n_tok; t++) {
      const int32_t p = (int32_t)(n0 + t);
      h2d(dpos, &p, 4);
      poison(dout, od * 4);
      cuda_attn(sh, dq + t * qdim, dK, dV, dpos, 1, dout, dscr, NULL);
      if (!sync_ok()) break;
      get(g2, dout, od * 4);
      ndiff += n_diff_bits(g2, gt + t * od, od);
    }
    CHECK(ndiff == 0, "tensor-core order: decode of each row == its prefill row, bit for bit (%zu differ)", ndiff);
    /* the one-tile-of-rows launches without the pipelined tile loop (three phases a tile): the same bits */
    cuda_attn_set_pipe(0);
    poison(dout, n_tok * od * 4);
    cuda_attn(sh, dq, dK, dV, dposv, n_tok, dout, dscr, NULL);
    if (sync_ok()) {
      get(g2, dout, n_tok * od * 4);
      CHECK(n_diff_bits(g2, gt, n_tok * od) == 0, "tensor-core order, three phases a tile: the same bits (%zu differ)",
            n_diff_bits(g2, gt, n_tok * od));
    } else {
      CHECK(0, "tensor-core attention ran (three phases a tile)");
    }
    cuda_attn_set_pipe(1);
    /* every part through the split-K scratch (no one-part shortcut): the same bits */
    cuda_attn_set_onep(0);
    poison(dout, n_tok * od * 4);
    cuda_attn(sh, dq, dK, dV, dposv, n_tok, dout, dscr, NULL);
    size_t nd1 = SIZE_MAX;
    if (sync_ok()) {
      get(g2, dout, n_tok * od * 4);
      nd1 = n_diff_bits(g2, gt, n_tok * od);
    }
    CHECK(nd1 == 0, "tensor-core order, every part through the scratch: the same bits (%zu differ)", nd1);
    cuda_attn_set_onep(1);
    /* launches of 2..15 rows (a verify's), a block per token (cuda_attn_set_r1(1), the default) and
     * 16 / HBH tokens a block (0): the same bits */
    for (int r1 = 1; r1 >= 0; r1--) {
      cuda_attn_set_r1(r1);
      poison(dout, n_tok * od * 4);
      for (int64_t t0 = 0; t0 < n_tok; t0 += 15)
        cuda_attn(sh, dq + t0 * qdim, dK, dV, dposv + t0, n_tok - t0 < 15 ? n_tok - t0 : 15, dout + t0 * od, dscr, NULL);
      size_t nd2 = SIZE_MAX;
      if (sync_ok()) {
        get(g2, dout, n_tok * od * 4);
        nd2 = n_diff_bits(g2, gt, n_tok * od);
      }
      CHECK(nd2 == 0, "tensor-core order, launches of up to 15 rows, %s: the same bits (%zu differ)",
            r1 ? "a block per token" : "16 / HBH tokens a block", nd2);
    }
    cuda_attn_set_r1(1);
    /* the output quantized in the launch for wo (cuda_attn_q), in three layouts, with and without
     * the one-part shortcut, all rows in one launch and each row's decode: the same outputs, and
     * cuda_mm_act_quantize's bytes where the block's heads are whole chunks / units */
    const int G = sh->n_head / sh->n_head_kv;
    int hbh = G < 16 ? G : 16;
    while (G % hbh) hbh--;
    static const uint32_t types[] = { FLOE_TYPE_Q4_K, FLOE_TYPE_Q8_0, FLOE_TYPE_Q6_K };
    for (int ti = 0; ti < 3; ti++) {
      if (od % act_unit_of(types[ti])) continue;
      act_buf ab;
      act_buf_init(&ab, types[ti], od, n_tok);
      const int expect = (int64_t)hbh * sh->head_dim % act_unit_of(types[ti]) == 0;
      for (int way = 0; way < 6; way++) { /* 4, 5: one launch with a block per token where it has 2..15 rows (the
                                            default); 0..3 with 16 / HBH tokens a block */
        const int onep = way & 1, dec = (way >> 1) & 1;
        cuda_attn_set_onep(onep);
        cuda_attn_set_r1(way >= 4);
        poison(dout, n_tok * od * 4);
        dmemset(ab.dxq, 0xab, ab.bytes);
        int rc = 1;
        if (!dec) {
          const cuda_act_out qo = act_buf_out(&ab, 0);
          rc = cuda_attn_q(sh, dq, dK, dV, dposv, n_tok, dout, dscr, &qo, NULL);
        } else
          for (int64_t t = 0; t < n_tok; t++) {
            const cuda_act_out qo = act_buf_out(&ab, t);
            rc &= cuda_attn_q(sh, dq + t * qdim, dK, dV, dposv + t, 1, dout + t * od, dscr, &qo, NULL);
          }
        CHECK(rc == expect, "%s, %s: cuda_attn_q quantizes (%d) where the blocks' %d heads x %d are whole %d-value units "
              "(%d)", ti == 1 ? "q8_0" : ti ? "q6_K" : "q4_K", dec ? "decode rows" : "one launch", rc, hbh,
              sh->head_dim, act_unit_of(types[ti]), expect);
        size_t nd = SIZE_MAX, nq = SIZE_MAX;
        if (sync_ok()) {
          get(g2, dout, n_tok * od * 4);
          nd = n_diff_bits(g2, gt, n_tok * od);
          nq = rc ? act_buf_diff(&ab, dout, n_tok, od) : 0;
        }
        CHECK(nd == 0 && nq == 0,
              "%s, %s, one-part shortcut %d: outputs the same bits (%zu differ), in-launch quantization == "
              "cuda_mm_act_quantize (%zu bytes differ)",
              ti == 1 ? "q8_0" : ti ? "q6_K" : "q4_K", dec ? "decode rows" : way >= 4 ? "one launch, a block per token" : "one launch", onep, nd, nq);
      }
      cuda_attn_set_onep(1);
      cuda_attn_set_r1(1);
      act_buf_free(&ab);
    }
  }
  cuda_attn_set_mma(0);
  free(gt), free(g2), free(ro), free(scr);
}

/* Fills the cache with n0 random positions, then prefills n_tok rows at pos0 = n0 (prep + attn)
 * and checks q, the written cache rows, the outputs, and the decode of each row alone. The prefill
 * runs with the row-group kernel (cuda_attn_set_rows(1)), then again in launches of fewer rows,
 * then with k_attn (a block per row): all bit-identical to the decode of each row alone (k_attn,
 * one row a launch). */
static int g_attn_cases; /* every other case loads the prep's norm weights before the wait (cuda_rt_set_prew) */

static void test_attn_case(int nh, int nkv, int hd, int n_rot, int gated, int bf16, int64_t n0, int n_tok, int n_split) {
  const int pw = g_attn_cases++ & 1;
  cuda_rt_set_prew(pw);
  SECTION("attention: %d/%d heads, hd %d, rot %d, %s, %s cache, %lld cached + %d rows, %d parts, FLOE_CUDA_PREW %d", nh,
          nkv, hd, n_rot, gated ? "gated" : "plain", bf16 ? "bf16" : "f32", (long long)n0, n_tok, n_split, pw);
  cuda_attn_shape sh = { nh, nkv, hd, n_rot, gated, bf16, n0 + n_tok + 3, 1e-6f, n_split };
  char err[256];
  CHECK(cuda_attn_check(&sh, err, sizeof err) == 0, "shape accepted");
  cuda_attn_set_mma(0); /* the CPU-order kernels first, whatever FLOE_CUDA_ATTN_MMA says */
  const int64_t qdim = (int64_t)nh * hd * (gated ? 2 : 1), kvd = (int64_t)nkv * hd, nctx = sh.n_ctx;
  const size_t esz = bf16 ? 2 : 4, cbytes = (size_t)nkv * nctx * hd * esz;
  const float theta = 1e7f;
  void *Kc = calloc(1, cbytes), *Vc = calloc(1, cbytes);
  float vmax = 0.0f;
  for (int64_t kh = 0; kh < nkv; kh++)
    for (int64_t p = 0; p < n0; p++)
      for (int64_t i = 0; i < hd; i++) {
        const size_t at = ((size_t)kh * nctx + p) * hd + i;
        const float kv = urand(-2, 2), vv = urand(-1, 1);
        if (bf16) {
          ((uint16_t *)Kc)[at] = floe_f32_to_bf16(kv);
          ((uint16_t *)Vc)[at] = floe_f32_to_bf16(vv);
        } else {
          ((float *)Kc)[at] = kv;
          ((float *)Vc)[at] = vv;
        }
      }
  float *q = malloc(n_tok * qdim * 4), *k = malloc(n_tok * kvd * 4), *v = malloc(n_tok * kvd * 4);
  float *qn = malloc(hd * 4), *kn = malloc(hd * 4);
  for (int64_t i = 0; i < n_tok * qdim; i++) q[i] = urand(-1, 1);
  for (int64_t i = 0; i < n_tok * kvd; i++) k[i] = urand(-1, 1), v[i] = urand(-1, 1);
  for (int i = 0; i < hd; i++) qn[i] = urand(0.5f, 4.0f), kn[i] = urand(0.5f, 2.0f);
  for (int64_t i = 0; i < n_tok * kvd; i++) vmax = fmaxf(vmax, fabsf(v[i]));
  vmax = fmaxf(vmax, 1.0f);
  float *cs = malloc((size_t)nctx * n_rot * 4);
  for (int64_t p = 0; p < nctx; p++) layer_rope_table(cs + p * n_rot, n_rot, theta, p);
  const int32_t pos0 = (int32_t)n0;
  float *dq = dup_dev(q, n_tok * qdim * 4), *dk = dup_dev(k, n_tok * kvd * 4), *dv = dup_dev(v, n_tok * kvd * 4);
  float *dqn = dup_dev(qn, hd * 4), *dkn = dup_dev(kn, hd * 4), *dcs = dup_dev(cs, (size_t)nctx * n_rot * 4);
  void *dK = dup_dev(Kc, cbytes), *dV = dup_dev(Vc, cbytes);
  int32_t *dpos = dup_dev(&pos0, 4);
  const size_t scb = cuda_attn_scratch_bytes(&sh, n_tok);
  void *dscr = dup_dev(NULL, scb);
  dmemset(dscr, 0, scb);
  float *dout = dup_dev(NULL, n_tok * (int64_t)nh * hd * 4);
  poison(dout, n_tok * (int64_t)nh * hd * 4);
  cuda_attn_prep(&sh, dq, dk, dv, dqn, dkn, dcs, dK, dV, dpos, n_tok, NULL);
  cuda_attn_set_rows(1);
  cuda_attn(&sh, dq, dK, dV, dpos, n_tok, dout, dscr, NULL);
  CHECK(sync_ok(), "prep + attention (row-group kernel) ran");
  /* CPU: norms, rope, cache rows */
  for (int64_t t = 0; t < n_tok; t++) {
    float *qt = q + t * qdim, *kt = k + t * kvd;
    const float *c = cs + (n0 + t) * n_rot;
    for (int h = 0; h < nh; h++) {
      float *qh = qt + (int64_t)h * hd * (gated ? 2 : 1);
      layer_rmsnorm(qh, qn, hd, 1e-6f, qh);
      rope_head(qh, n_rot, c);
    }
    for (int h = 0; h < nkv; h++) {
      layer_rmsnorm(kt + h * hd, kn, hd, 1e-6f, kt + h * hd);
      rope_head(kt + h * hd, n_rot, c);
      for (int64_t i = 0; i < hd; i++) {
        const size_t at = ((size_t)h * nctx + n0 + t) * hd + i;
        if (bf16) {
          ((uint16_t *)Kc)[at] = floe_f32_to_bf16(kt[h * hd + i]);
          ((uint16_t *)Vc)[at] = floe_f32_to_bf16(v[t * kvd + h * hd + i]);
        } else {
          ((float *)Kc)[at] = kt[h * hd + i];
          ((float *)Vc)[at] = v[t * kvd + h * hd + i];
        }
      }
    }
  }
  float *gq = malloc(n_tok * qdim * 4);
  get(gq, dq, n_tok * qdim * 4);
  CHECK(n_diff_bits(gq, q, n_tok * qdim) == 0, "q normed + rotated in place: bit-identical (%zu differ)",
        n_diff_bits(gq, q, n_tok * qdim));
  void *gK = malloc(cbytes), *gV = malloc(cbytes);
  get(gK, dK, cbytes);
  get(gV, dV, cbytes);
  CHECK(memcmp(gK, Kc, cbytes) == 0, "K cache (all positions) bit-identical");
  CHECK(memcmp(gV, Vc, cbytes) == 0, "V cache (all positions) bit-identical");
  const int64_t od = (int64_t)nh * hd;
  float *go = malloc(n_tok * od * 4), *ro = malloc(od * 4), *scr = malloc((size_t)(nh / nkv) * nctx * 4);
  get(go, dout, n_tok * od * 4);
  CHECK(n_nan(go, n_tok * od) == 0, "every output written");
  double worst = 0.0;
  for (int64_t t = 0; t < n_tok; t++) {
    attn_ref(&sh, q + t * qdim, Kc, Vc, n0 + t + 1, ro, scr);
    for (int64_t i = 0; i < od; i++) worst = fmax(worst, fabs((double)go[t * od + i] - ro[i]));
  }
  const double bound = 1e-4 * vmax + 1e-6;
  CHECK(worst <= bound, "output vs CPU: max |diff| %.3g <= %.3g", worst, bound);
  /* decode of each row alone: the same bits as the prefill row, with the heads batched per block
   * and (where the grid is small enough) a block per head (cuda_attn_set_spread) */
  float *g1 = malloc(od * 4), *g2 = malloc(n_tok * od * 4);
  /* the same rows in launches of fewer rows (other row groups, pos0 past the chunk's start), then
   * every row in its own blocks (k_attn, as the old prefill) */
  int32_t *pv = malloc(n_tok * 4);
  for (int64_t t = 0; t < n_tok; t++) pv[t] = (int32_t)(n0 + t);
  int32_t *dposv = dup_dev(pv, n_tok * 4);
  for (int way = 0; way < 2; way++) {
    const int64_t step = way ? n_tok : 1 + n_tok / 3;
    cuda_attn_set_rows(way ? 0 : 1);
    poison(dout, n_tok * od * 4);
    for (int64_t t0 = 0; t0 < n_tok; t0 += step)
      cuda_attn(&sh, dq + t0 * qdim, dK, dV, dposv + t0, n_tok - t0 < step ? n_tok - t0 : step, dout + t0 * od, dscr,
                NULL);
    if (!sync_ok()) {
      CHECK(0, "attention ran");
      break;
    }
    get(g2, dout, n_tok * od * 4);
    CHECK(n_diff_bits(g2, go, n_tok * od) == 0, "%s == the row-group prefill, bit for bit (%zu differ)",
          way ? "k_attn, all rows in one launch" : "the row-group kernel, launches of fewer rows",
          n_diff_bits(g2, go, n_tok * od));
  }
  cuda_attn_set_rows(0); /* decode: k_attn; heads batched with at most 8, 4, 2, 1 a block, then spread;
                            each with the scores' folds per value and transposed (head_dim 256) */
  for (int way = 0; way < 10; way++) {
    const int spread = way % 5 == 4, hbmax = spread ? 8 : 8 >> (way % 5);
    cuda_attn_set_fold_t(way >= 5);
    cuda_attn_set_spread(spread);
    cuda_attn_set_hb(hbmax);
    size_t ndiff = 0;
    for (int64_t t = 0; t < n_tok; t++) {
      const int32_t p = (int32_t)(n0 + t);
      h2d(dpos, &p, 4);
      poison(dout, od * 4);
      cuda_attn(&sh, dq + t * qdim, dK, dV, dpos, 1, dout, dscr, NULL);
      if (!sync_ok()) break;
      get(g1, dout, od * 4);
      ndiff += n_diff_bits(g1, go + t * od, od);
    }
    CHECK(ndiff == 0, "decode of each row (%s, at most %d heads a block%s) == its prefill row, bit for bit (%zu differ)",
          spread ? "a block per head where it fits" : "heads batched", hbmax, way >= 5 ? ", folds transposed" : "",
          ndiff);
  }
  cuda_attn_set_hb(8);
  cuda_attn_set_fold_t(0);
  /* the row-group prefill again after the decodes (whose parts lie after the counters) */
  cuda_attn_set_rows(1);
  poison(dout, n_tok * od * 4);
  cuda_attn(&sh, dq, dK, dV, dposv, n_tok, dout, dscr, NULL);
  if (sync_ok()) {
    get(g2, dout, n_tok * od * 4);
    CHECK(n_diff_bits(g2, go, n_tok * od) == 0, "row-group prefill after the decodes: the same bits (%zu differ)",
          n_diff_bits(g2, go, n_tok * od));
  } else
    CHECK(0, "row-group prefill after the decodes ran");
  printf("   max |diff| vs CPU %.3g (max|V| %.3g)\n", worst, vmax);
  if (bf16) test_attn_tc(&sh, dq, dK, dV, dpos, dposv, dout, dscr, q, Kc, Vc, go, n0, n_tok, vmax);
  cuda_rt_free(dq), cuda_rt_free(dk), cuda_rt_free(dv), cuda_rt_free(dqn), cuda_rt_free(dkn), cuda_rt_free(dcs);
  cuda_rt_free(dK), cuda_rt_free(dV), cuda_rt_free(dpos), cuda_rt_free(dscr), cuda_rt_free(dout);
  free(Kc), free(Vc), free(q), free(k), free(v), free(qn), free(kn), free(cs), free(gq), free(gK), free(gV);
  free(go), free(ro), free(scr), free(g1), free(g2), free(pv);
  cuda_rt_free(dposv);
}

/* ---- GatedDeltaNet ---- */
typedef struct gdn_ref {
  cuda_gdn_shape sh;
  int64_t C;
  float *wt, *conv, *S, *dtb, *A, *nw;
} gdn_ref;

/* gdn_conv_worker + gdn_heads_worker for one token */
static void gdn_ref_token(gdn_ref *g, const float *mix, const float *z, const float *b, const float *a, float *raw, float *o) {
  const cuda_gdn_shape *s = &g->sh;
  const int64_t C = g->C, K = s->conv_k, dk = s->dk, dv = s->dv, Nk = s->Nk, Nv = s->Nv, kd = Nk * dk, r = Nv / Nk;
  const float qscale = (float)(1.0 / sqrt((double)dk));
  for (int64_t ch = 0; ch < C; ch++) {
    float c = 0.0f;
    for (int64_t q = 0; q < K - 1; q++) c += g->wt[q * C + ch] * g->conv[q * C + ch];
    raw[ch] = floe_siluf(c + g->wt[(K - 1) * C + ch] * mix[ch]);
    for (int64_t q = 0; q + 1 < K - 1; q++) g->conv[q * C + ch] = g->conv[(q + 1) * C + ch];
    g->conv[(K - 2) * C + ch] = mix[ch];
  }
  for (int64_t h0 = 0; h0 < 2 * kd; h0 += dk) {
    float *v = raw + h0;
    const float rn = 1.0f / sqrtf(sumsq16(v, dk) + 1e-6f);
    for (int64_t i = 0; i < dk; i++) v[i] = h0 < kd ? (v[i] * rn) * qscale : v[i] * rn;
  }
  float kvv[1024], ka[GDN_ACC][128], oa[GDN_ACC][128];
  for (int64_t hv = 0; hv < Nv; hv++) {
    const int64_t kh = s->v_tiled ? hv % Nk : hv / r;
    const float *kk = raw + kd + kh * dk, *qq = raw + kh * dk, *vv = raw + 2 * kd + hv * dv;
    const float beta = floe_sigmoidf(b[hv]);
    const float decay = expf(g->A[hv] * softplusf_(a[hv] + g->dtb[hv]));
    float *S = g->S + hv * dk * dv, *oh = o + hv * dv;
    memset(ka, 0, sizeof ka);
    memset(oa, 0, sizeof oa);
    for (int64_t i = 0; i < dk; i++) /* row i into accumulator i % GDN_ACC (base/gdn_sum.h) */
      for (int64_t j = 0; j < dv; j++) {
        S[i * dv + j] *= decay;
        ka[i % GDN_ACC][j] += S[i * dv + j] * kk[i];
      }
    for (int64_t j = 0; j < dv; j++) {
      float t[GDN_ACC];
      for (int u = 0; u < GDN_ACC; u++) t[u] = ka[u][j];
      kvv[j] = (vv[j] - floe_gdn_fold8(t)) * beta;
    }
    for (int64_t i = 0; i < dk; i++)
      for (int64_t j = 0; j < dv; j++) {
        S[i * dv + j] += kk[i] * kvv[j];
        oa[i % GDN_ACC][j] += S[i * dv + j] * qq[i];
      }
    for (int64_t j = 0; j < dv; j++) {
      float t[GDN_ACC];
      for (int u = 0; u < GDN_ACC; u++) t[u] = oa[u][j];
      oh[j] = floe_gdn_fold8(t);
    }
    const float rr = 1.0f / sqrtf(sumsq16(oh, dv) / (float)dv + s->eps);
    for (int64_t j = 0; j < dv; j++) oh[j] = (g->nw[j] * (oh[j] * rr)) * floe_siluf(z[hv * dv + j]);
  }
}

static int g_gdn_cases; /* every other case's plain steps load the conv / norm weights before the wait */

static void test_gdn_case(int Nk, int Nv, int dk, int dv, int K, int tiled, int n_pre, int n_dec) {
  const int pw = g_gdn_cases++ & 1;
  cuda_rt_set_prew(pw);
  SECTION("gdn: Nk %d Nv %d dk %d dv %d K %d %s, %d prefill rows then %d decode steps, FLOE_CUDA_PREW %d", Nk, Nv, dk,
          dv, K, tiled ? "tiled" : "grouped", n_pre, n_dec, pw);
  gdn_ref g = { { Nk, Nv, dk, dv, K, tiled, 1e-6f, 0 }, 0, 0, 0, 0, 0, 0, 0 };
  char err[256];
  CHECK(cuda_gdn_check(&g.sh, err, sizeof err) == 0, "shape accepted");
  const int64_t C = 2 * (int64_t)Nk * dk + (int64_t)Nv * dv, vd = (int64_t)Nv * dv, n = n_pre + n_dec;
  const size_t Sn = (size_t)Nv * dk * dv;
  g.C = C;
  g.wt = malloc(K * C * 4), g.conv = malloc((K - 1) * C * 4), g.S = malloc(Sn * 4);
  g.dtb = malloc(Nv * 4), g.A = malloc(Nv * 4), g.nw = malloc(dv * 4);
  for (int64_t i = 0; i < K * C; i++) g.wt[i] = urand(-0.6f, 0.6f);
  for (int64_t i = 0; i < (K - 1) * C; i++) g.conv[i] = urand(-2, 2);
  for (size_t i = 0; i < Sn; i++) g.S[i] = urand(-0.5f, 0.5f);
  for (int i = 0; i < Nv; i++) g.dtb[i] = urand(-1, 1), g.A[i] = -expf(urand(-2, 1));
  for (int i = 0; i < dv; i++) g.nw[i] = urand(0.5f, 1.5f);
  float *mix = malloc(n * C * 4), *z = malloc(n * vd * 4), *b = malloc(n * Nv * 4), *a = malloc(n * Nv * 4);
  for (int64_t i = 0; i < n * C; i++) mix[i] = urand(-3, 3);
  for (int64_t i = 0; i < n * vd; i++) z[i] = urand(-3, 3);
  for (int64_t i = 0; i < n * Nv; i++) b[i] = urand(-4, 4), a[i] = urand(-4, 25); /* softplus above 20 too */
  float *dwt = dup_dev(g.wt, K * C * 4), *dconv = dup_dev(g.conv, (K - 1) * C * 4), *dS = dup_dev(g.S, Sn * 4);
  float *ddtb = dup_dev(g.dtb, Nv * 4), *dA = dup_dev(g.A, Nv * 4), *dnw = dup_dev(g.nw, dv * 4);
  float *dmix = dup_dev(mix, n * C * 4), *dz = dup_dev(z, n * vd * 4), *db = dup_dev(b, n * Nv * 4), *da = dup_dev(a, n * Nv * 4);
  float *draw = dup_dev(NULL, n * C * 4), *dout = dup_dev(NULL, n * vd * 4);
  /* a second state for the token-by-token run of the prefill rows */
  float *dconv2 = dup_dev(g.conv, (K - 1) * C * 4), *dS2 = dup_dev(g.S, Sn * 4), *dout2 = dup_dev(NULL, n * vd * 4);
  poison(draw, n * C * 4), poison(dout, n * vd * 4), poison(dout2, n * vd * 4);
  cuda_gdn_conv(&g.sh, dmix, dwt, dconv, draw, n_pre, NULL);
  cuda_gdn_recur(&g.sh, draw, dz, db, da, ddtb, dA, dnw, dS, dout, n_pre, NULL);
  for (int64_t t = 0; t < n_dec; t++) {
    const int64_t r = n_pre + t;
    cuda_gdn_step(&g.sh, dmix + r * C, dwt, dconv, draw + r * C, dz + r * vd, db + r * Nv, da + r * Nv, ddtb, dA, dnw,
                  dS, dout + r * vd, 1, NULL);
  }
  CHECK(sync_ok(), "gdn ran");
  float *graw = malloc(n * C * 4), *go = malloc(n * vd * 4), *gS = malloc(Sn * 4), *gconv = malloc((K - 1) * C * 4);
  get(graw, draw, n * C * 4), get(go, dout, n * vd * 4), get(gS, dS, Sn * 4), get(gconv, dconv, (K - 1) * C * 4);
  CHECK(n_nan(go, n * vd) == 0 && n_nan(graw, n * C) == 0, "every output written");
  float *rraw = malloc(n * C * 4), *ro = malloc(n * vd * 4);
  for (int64_t t = 0; t < n; t++) gdn_ref_token(&g, mix + t * C, z + t * vd, b + t * Nv, a + t * Nv, rraw + t * C, ro + t * vd);
  CHECK(n_diff_bits(graw, rraw, n * C) == 0, "conv + SiLU + L2 norms bit-identical (%zu differ)", n_diff_bits(graw, rraw, n * C));
  CHECK(n_diff_bits(gconv, g.conv, (K - 1) * C) == 0, "conv window bit-identical");
  double wo = 0, ws = 0;
  for (int64_t i = 0; i < n * vd; i++) wo = fmax(wo, fabs((double)go[i] - ro[i]) / (1.0 + fabs((double)ro[i])));
  for (size_t i = 0; i < Sn; i++) ws = fmax(ws, fabs((double)gS[i] - g.S[i]) / (1.0 + fabs((double)g.S[i])));
  CHECK(wo <= 1e-5, "o vs CPU: max rel diff %.3g (%zu of %lld not bit-identical)", wo, n_diff_bits(go, ro, n * vd),
        (long long)(n * vd));
  CHECK(ws <= 1e-5, "S vs CPU: max rel diff %.3g (%zu of %zu not bit-identical)", ws, n_diff_bits(gS, g.S, Sn), Sn);
  /* GPU prefill rows == the same rows token by token */
  for (int64_t t = 0; t < n_pre; t++) {
    cuda_gdn_conv(&g.sh, dmix + t * C, dwt, dconv2, draw + t * C, 1, NULL);
    cuda_gdn_recur(&g.sh, draw + t * C, dz + t * vd, db + t * Nv, da + t * Nv, ddtb, dA, dnw, dS2, dout2 + t * vd, 1, NULL);
  }
  CHECK(sync_ok(), "token-by-token run");
  float *go2 = malloc(n * vd * 4);
  get(go2, dout2, n_pre * vd * 4);
  CHECK(n_diff_bits(go2, go, n_pre * vd) == 0, "prefill rows == token-by-token rows, bit for bit");
  /* the decode steps again with pre_state (the states read before the wait), each after another
   * kernel that writes neither of them (a conv over scratch buffers), as the decode step's
   * projection: the same rows and states */
  {
    cuda_gdn_shape shp = g.sh;
    shp.pre_state = 1;
    cuda_rt_set_prew(1);
    /* from the states after the prefill rows (the token-by-token run's dconv2 / dS2) */
    get(gconv, dconv2, (K - 1) * C * 4);
    get(gS, dS2, Sn * 4);
    float *dconv3 = dup_dev(gconv, (K - 1) * C * 4), *dS3 = dup_dev(gS, Sn * 4), *dout3 = dup_dev(NULL, n * vd * 4);
    float *dconvx = dup_dev(g.conv, (K - 1) * C * 4), *drawx = dup_dev(NULL, C * 4), *draw3 = dup_dev(NULL, n * C * 4);
    for (int64_t t = 0; t < n_dec; t++) {
      const int64_t r = n_pre + t;
      cuda_gdn_conv(&g.sh, dmix + r * C, dwt, dconvx, drawx, 1, NULL);
      cuda_gdn_step(&shp, dmix + r * C, dwt, dconv3, draw3 + r * C, dz + r * vd, db + r * Nv, da + r * Nv, ddtb, dA,
                    dnw, dS3, dout3 + r * vd, 1, NULL);
    }
    CHECK(sync_ok(), "pre_state decode ran");
    float *go3 = malloc(n * vd * 4), *gS3 = malloc(Sn * 4), *gc3 = malloc((K - 1) * C * 4), *gS1 = malloc(Sn * 4);
    float *gc1 = malloc((K - 1) * C * 4);
    get(go3, dout3, n * vd * 4), get(gS3, dS3, Sn * 4), get(gc3, dconv3, (K - 1) * C * 4);
    get(gS1, dS, Sn * 4), get(gc1, dconv, (K - 1) * C * 4);
    CHECK(n_diff_bits(go3 + n_pre * vd, go + n_pre * vd, n_dec * vd) == 0 && n_diff_bits(gS3, gS1, Sn) == 0 &&
              n_diff_bits(gc3, gc1, (K - 1) * C) == 0,
          "pre_state: decode rows, S and conv windows bit-identical to the plain steps");
    cuda_rt_set_prew(0);
    free(go3), free(gS3), free(gc3), free(gS1), free(gc1);
    cuda_rt_free(dconv3), cuda_rt_free(dS3), cuda_rt_free(dout3), cuda_rt_free(dconvx), cuda_rt_free(drawx);
    cuda_rt_free(draw3);
  }
  cuda_rt_free(dwt), cuda_rt_free(dconv), cuda_rt_free(dS), cuda_rt_free(ddtb), cuda_rt_free(dA), cuda_rt_free(dnw);
  cuda_rt_free(dmix), cuda_rt_free(dz), cuda_rt_free(db), cuda_rt_free(da), cuda_rt_free(draw), cuda_rt_free(dout);
  cuda_rt_free(dconv2), cuda_rt_free(dS2), cuda_rt_free(dout2);
  free(g.wt), free(g.conv), free(g.S), free(g.dtb), free(g.A), free(g.nw), free(mix), free(z), free(b), free(a);
  free(graw), free(go), free(gS), free(gconv), free(rraw), free(ro), free(go2);
}

/* The random inputs of a GDN kept-chunk or quantizing-step case (n rows), on the host and on the
 * device (d*): conv weights, conv window, S, dt bias, A, norm weights, and the rows' mix, z, b, a */
typedef struct gdn_in {
  float *wt, *conv, *S, *dtb, *A, *nw, *mix, *z, *b, *a;
  float *dwt, *ddtb, *dA, *dnw, *dmix, *dz, *db, *da;
} gdn_in;
static void gdn_in_make(gdn_in *g, const cuda_gdn_shape *sh, int n) {
  const int Nv = sh->Nv, dv = sh->dv, K = sh->conv_k;
  const int64_t C = 2 * (int64_t)sh->Nk * sh->dk + (int64_t)Nv * dv, vd = (int64_t)Nv * dv;
  const size_t Sn = (size_t)Nv * sh->dk * dv, Cn = (size_t)(K - 1) * C;
  g->wt = malloc(K * C * 4), g->conv = malloc(Cn * 4), g->S = malloc(Sn * 4), g->dtb = malloc(Nv * 4);
  g->A = malloc(Nv * 4), g->nw = malloc(dv * 4), g->mix = malloc(n * C * 4), g->z = malloc(n * vd * 4);
  g->b = malloc(n * Nv * 4), g->a = malloc(n * Nv * 4);
  for (int64_t i = 0; i < K * C; i++) g->wt[i] = urand(-0.6f, 0.6f);
  for (size_t i = 0; i < Cn; i++) g->conv[i] = urand(-2, 2);
  for (size_t i = 0; i < Sn; i++) g->S[i] = urand(-0.5f, 0.5f);
  for (int i = 0; i < Nv; i++) g->dtb[i] = urand(-1, 1), g->A[i] = -expf(urand(-2, 1));
  for (int i = 0; i < dv; i++) g->nw[i] = urand(0.5f, 1.5f);
  for (int64_t i = 0; i < n * C; i++) g->mix[i] = urand(-3, 3);
  for (int64_t i = 0; i < n * vd; i++) g->z[i] = urand(-3, 3);
  for (int64_t i = 0; i < n * Nv; i++) g->b[i] = urand(-4, 4), g->a[i] = urand(-4, 25);
  g->dwt = dup_dev(g->wt, K * C * 4), g->ddtb = dup_dev(g->dtb, Nv * 4), g->dA = dup_dev(g->A, Nv * 4);
  g->dnw = dup_dev(g->nw, dv * 4), g->dmix = dup_dev(g->mix, n * C * 4), g->dz = dup_dev(g->z, n * vd * 4);
  g->db = dup_dev(g->b, n * Nv * 4), g->da = dup_dev(g->a, n * Nv * 4);
}
static void gdn_in_free(gdn_in *g) {
  cuda_rt_free(g->dwt), cuda_rt_free(g->ddtb), cuda_rt_free(g->dA), cuda_rt_free(g->dnw), cuda_rt_free(g->dmix);
  cuda_rt_free(g->dz), cuda_rt_free(g->db), cuda_rt_free(g->da);
  free(g->wt), free(g->conv), free(g->S), free(g->dtb), free(g->A), free(g->nw), free(g->mix), free(g->z), free(g->b);
  free(g->a);
}

/* Kept chunks (cuda_gdn_conv_p / cuda_gdn_recur_p with keep): n rows against n single-row
 * in-place steps. Row t's kept S and conv window are bit for bit the in-place state after t + 1
 * rows, raw and o are the in-place rows, and the state the chunk started from is untouched. Also
 * the in-place form through a pointer cell equals the plain launchers. */
static void test_gdn_keep_case(int Nk, int Nv, int dk, int dv, int K, int tiled, int n) {
  SECTION("gdn kept chunk: Nk %d Nv %d dk %d dv %d K %d %s, %d rows", Nk, Nv, dk, dv, K, tiled ? "tiled" : "grouped",
          n);
  const cuda_gdn_shape sh = { Nk, Nv, dk, dv, K, tiled, 1e-6f, 0 };
  const int64_t C = 2 * (int64_t)Nk * dk + (int64_t)Nv * dv, vd = (int64_t)Nv * dv;
  const size_t Sn = (size_t)Nv * dk * dv, Cn = (size_t)(K - 1) * C;
  gdn_in g;
  gdn_in_make(&g, &sh, n);
  float *conv = g.conv, *S = g.S, *dwt = g.dwt, *ddtb = g.ddtb, *dA = g.dA, *dnw = g.dnw, *dmix = g.dmix, *dz = g.dz;
  float *db = g.db;
  float *da = g.da;
  /* in place, one row at a time; the state after each row kept on the host */
  float *dconv = dup_dev(conv, Cn * 4), *dS = dup_dev(S, Sn * 4), *draw = dup_dev(NULL, n * C * 4);
  float *dout = dup_dev(NULL, n * vd * 4);
  float *rS = malloc(n * Sn * 4), *rconv = malloc(n * Cn * 4), *rraw = malloc(n * C * 4), *ro = malloc(n * vd * 4);
  for (int64_t t = 0; t < n; t++) {
    cuda_gdn_conv(&sh, dmix + t * C, dwt, dconv, draw + t * C, 1, NULL);
    cuda_gdn_recur(&sh, draw + t * C, dz + t * vd, db + t * Nv, da + t * Nv, ddtb, dA, dnw, dS, dout + t * vd, 1, NULL);
    get(rS + t * Sn, dS, Sn * 4), get(rconv + t * Cn, dconv, Cn * 4);
  }
  get(rraw, draw, n * C * 4), get(ro, dout, n * vd * 4);
  /* kept: the state behind a cell, n row buffers poisoned */
  float *kconv = dup_dev(conv, Cn * 4), *kS = dup_dev(S, Sn * 4);
  float *rowS[20], *rowC[20];
  CHECK(n <= 20, "at most 20 kept rows here");
  for (int t = 0; t < n; t++) {
    rowS[t] = dup_dev(NULL, Sn * 4), rowC[t] = dup_dev(NULL, Cn * 4);
    poison(rowS[t], Sn * 4), poison(rowC[t], Cn * 4);
  }
  float **cS = dup_dev(&kS, sizeof kS), **cC = dup_dev(&kconv, sizeof kconv);
  float **tS = dup_dev(rowS, n * sizeof *rowS), **tC = dup_dev(rowC, n * sizeof *rowC);
  poison(draw, n * C * 4), poison(dout, n * vd * 4);
  cuda_gdn_step_p(&sh, dmix, dwt, cC, tC, draw, dz, db, da, ddtb, dA, dnw, cS, tS, dout, n, NULL);
  CHECK(sync_ok(), "kept chunk ran");
  float *gS = malloc(Sn * 4), *gC = malloc(Cn * 4), *graw = malloc(n * C * 4), *go = malloc(n * vd * 4);
  get(graw, draw, n * C * 4), get(go, dout, n * vd * 4);
  CHECK(n_diff_bits(graw, rraw, n * C) == 0 && n_diff_bits(go, ro, n * vd) == 0,
        "raw and o bit-identical to the in-place rows (%zu, %zu differ)", n_diff_bits(graw, rraw, n * C),
        n_diff_bits(go, ro, n * vd));
  size_t ds = 0, dc = 0;
  for (int t = 0; t < n; t++) {
    get(gS, rowS[t], Sn * 4), get(gC, rowC[t], Cn * 4);
    ds += n_diff_bits(gS, rS + t * Sn, Sn);
    dc += n_diff_bits(gC, rconv + t * Cn, Cn);
  }
  CHECK(ds == 0 && dc == 0, "kept row states bit-identical to the in-place states (%zu S, %zu conv differ)", ds, dc);
  get(gS, kS, Sn * 4), get(gC, kconv, Cn * 4);
  CHECK(n_diff_bits(gS, S, Sn) == 0 && n_diff_bits(gC, conv, Cn) == 0, "the chunk's starting state untouched");
  /* in place through the cells: n rows at once == the plain launchers' rows and final state */
  poison(draw, n * C * 4), poison(dout, n * vd * 4);
  cuda_gdn_step_p(&sh, dmix, dwt, cC, NULL, draw, dz, db, da, ddtb, dA, dnw, cS, NULL, dout, n, NULL);
  CHECK(sync_ok(), "in place through the cells ran");
  get(go, dout, n * vd * 4), get(gS, kS, Sn * 4), get(gC, kconv, Cn * 4);
  CHECK(n_diff_bits(go, ro, n * vd) == 0 && n_diff_bits(gS, rS + (n - 1) * Sn, Sn) == 0 &&
            n_diff_bits(gC, rconv + (n - 1) * Cn, Cn) == 0,
        "in place through the cells == the plain launchers, bit for bit");
  for (int t = 0; t < n; t++) cuda_rt_free(rowS[t]), cuda_rt_free(rowC[t]);
  cuda_rt_free(cS), cuda_rt_free(cC), cuda_rt_free(tS), cuda_rt_free(tC), cuda_rt_free(kS), cuda_rt_free(kconv);
  cuda_rt_free(dconv), cuda_rt_free(dS), cuda_rt_free(draw), cuda_rt_free(dout);
  gdn_in_free(&g);
  free(rS), free(rconv), free(rraw), free(ro), free(gS), free(gC), free(graw), free(go);
}

/* The one-token step quantizing its output for ssm_out (cuda_gdn_step_q) against the step
 * without (cuda_gdn_step_p) from the same states, n steps each: o, S and the conv windows the same
 * bits, and the in-launch bytes == cuda_mm_act_quantize of o, for three ssm_out layouts (q4_K:
 * A256 with its position permutation, a chunk's value heads trading maxima in a cluster; q6_K:
 * A256 without; q8_0: A32, each head on its own). expect: whether the shape fits the fused
 * quantization (gdn_act_cluster; an A32 layout fits where dv is a multiple of 32); on: the switch
 * (cuda_gdn_set_act). */
static void test_gdn_act_case(int Nk, int Nv, int dk, int dv, int K, int tiled, int n, int expect256, int on) {
  SECTION("gdn step quantizing o: Nk %d Nv %d dk %d dv %d K %d %s, %d steps", Nk, Nv, dk, dv, K,
          tiled ? "tiled" : "grouped", n);
  const cuda_gdn_shape sh = { Nk, Nv, dk, dv, K, tiled, 1e-6f, 0 };
  const int64_t C = 2 * (int64_t)Nk * dk + (int64_t)Nv * dv, vd = (int64_t)Nv * dv;
  const size_t Sn = (size_t)Nv * dk * dv, Cn = (size_t)(K - 1) * C;
  gdn_in g;
  gdn_in_make(&g, &sh, n);
  float *conv = g.conv, *S = g.S, *dwt = g.dwt, *ddtb = g.ddtb, *dA = g.dA, *dnw = g.dnw, *dmix = g.dmix, *dz = g.dz;
  float *db = g.db;
  float *da = g.da, *draw = dup_dev(NULL, n * C * 4);
  float *dconv0 = dup_dev(conv, Cn * 4), *dS0 = dup_dev(S, Sn * 4), *dout0 = dup_dev(NULL, n * vd * 4);
  float **cS0 = dup_dev(&dS0, sizeof dS0), **cC0 = dup_dev(&dconv0, sizeof dconv0);
  poison(dout0, n * vd * 4);
  for (int64_t t = 0; t < n; t++)
    cuda_gdn_step_p(&sh, dmix + t * C, dwt, cC0, NULL, draw + t * C, dz + t * vd, db + t * Nv, da + t * Nv, ddtb, dA,
                    dnw, cS0, NULL, dout0 + t * vd, 1, NULL);
  CHECK(sync_ok(), "plain steps ran");
  float *ro = malloc(n * vd * 4), *rS = malloc(Sn * 4), *rC = malloc(Cn * 4);
  float *go = malloc(n * vd * 4), *gS = malloc(Sn * 4), *gC = malloc(Cn * 4);
  get(ro, dout0, n * vd * 4), get(rS, dS0, Sn * 4), get(rC, dconv0, Cn * 4);
  static const uint32_t types[] = { FLOE_TYPE_Q4_K, FLOE_TYPE_Q6_K, FLOE_TYPE_Q8_0 };
  for (int ti = 0; ti < 3; ti++) {
    if (vd % act_unit_of(types[ti])) continue;
    const char *tn = ti == 0 ? "q4_K" : ti == 1 ? "q6_K" : "q8_0";
    const int expect = on && (ti == 2 ? dv % 32 == 0 : expect256);
    act_buf ab;
    act_buf_init(&ab, types[ti], vd, n);
    float *dconv = dup_dev(conv, Cn * 4), *dS = dup_dev(S, Sn * 4), *dout = dup_dev(NULL, n * vd * 4);
    float **cS = dup_dev(&dS, sizeof dS), **cC = dup_dev(&dconv, sizeof dconv);
    poison(dout, n * vd * 4);
    int rc = 1;
    for (int64_t t = 0; t < n; t++) {
      const cuda_act_out qo = act_buf_out(&ab, t);
      rc &= cuda_gdn_step_q(&sh, dmix + t * C, dwt, cC, NULL, draw + t * C, dz + t * vd, db + t * Nv, da + t * Nv, ddtb,
                            dA, dnw, cS, NULL, dout + t * vd, 1, &qo, NULL);
    }
    CHECK(rc == expect, "%s: cuda_gdn_step_q quantizes (%d) where the shape fits (%d)", tn, rc, expect);
    size_t nq = SIZE_MAX;
    if (sync_ok()) {
      get(go, dout, n * vd * 4), get(gS, dS, Sn * 4), get(gC, dconv, Cn * 4);
      nq = rc ? act_buf_diff(&ab, dout, n, vd) : 0;
    }
    CHECK(n_diff_bits(go, ro, n * vd) == 0 && n_diff_bits(gS, rS, Sn) == 0 && n_diff_bits(gC, rC, Cn) == 0,
          "%s: o, S and conv windows bit-identical to the plain steps (%zu, %zu, %zu differ)", tn,
          n_diff_bits(go, ro, n * vd), n_diff_bits(gS, rS, Sn), n_diff_bits(gC, rC, Cn));
    CHECK(nq == 0, "%s: the step's quantization of o == cuda_mm_act_quantize (%zu bytes differ)", tn, nq);
    cuda_rt_free(dconv), cuda_rt_free(dS), cuda_rt_free(dout), cuda_rt_free(cS), cuda_rt_free(cC);
    act_buf_free(&ab);
  }
  cuda_rt_free(draw), cuda_rt_free(dconv0), cuda_rt_free(dS0), cuda_rt_free(dout0), cuda_rt_free(cS0);
  cuda_rt_free(cC0);
  gdn_in_free(&g);
  free(ro), free(rS), free(rC), free(go), free(gS), free(gC);
}

/* ---- MoE ---- */
static void route_ref(float *p, int64_t NE, int64_t K, bool norm, int32_t *sel, float *w) {
  float mx = -INFINITY, acc[16] = { 0 };
  for (int64_t e = 0; e < NE; e++) mx = p[e] > mx ? p[e] : mx;
  int64_t e = 0;
  for (; e + 16 <= NE; e += 16)
    for (int k = 0; k < 16; k++) p[e + k] = floe_vexpf(p[e + k] - mx), acc[k] += p[e + k];
  for (int k = 0; e + k < NE; k++) p[e + k] = floe_vexpf(p[e + k] - mx), acc[k] += p[e + k];
  const float sum = fold16(acc);
  for (e = 0; e < NE; e++) p[e] /= sum;
  int64_t nk = 0;
  for (e = 0; e < NE; e++) {
    const float pe = p[e];
    if (nk == K && !(pe > w[K - 1])) continue;
    int64_t u = nk < K ? nk++ : K - 1;
    for (; u > 0 && pe > w[u - 1]; u--) w[u] = w[u - 1], sel[u] = sel[u - 1];
    w[u] = pe, sel[u] = (int32_t)e;
  }
  if (norm) {
    float ws = 0.0f;
    for (int64_t j = 0; j < K; j++) ws += w[j];
    for (int64_t j = 0; j < K; j++) w[j] /= ws;
  }
  for (int64_t j = 1; j < K; j++)
    for (int64_t u = j; u > 0 && sel[u - 1] > sel[u]; u--) {
      int32_t ti = sel[u]; sel[u] = sel[u - 1]; sel[u - 1] = ti;
      float tw = w[u]; w[u] = w[u - 1]; w[u - 1] = tw;
    }
}

static void test_route(int NE, int K, int norm, int T, int levels) {
  SECTION("moe route: %d experts, top-%d, %s, %d tokens, logits of %d levels (ties)", NE, K, norm ? "renormalised" : "raw",
          T, levels);
  float *lg = malloc(T * NE * 4), *p = malloc(NE * 4), *rw = malloc(T * K * 4), *gw = malloc(T * K * 4);
  int32_t *rs = malloc(T * K * 4), *gs = malloc(T * K * 4);
  for (int i = 0; i < T * NE; i++) lg[i] = levels ? (float)(floe_rng_u64(&R) % levels) * 0.25f : urand(-4, 4);
  float *dl = dup_dev(lg, T * NE * 4), *dw = dup_dev(NULL, T * K * 4);
  int32_t *ds = dup_dev(NULL, T * K * 4);
  poison(dw, T * K * 4), poison(ds, T * K * 4);
  cuda_moe_route(dl, T, NE, K, norm, ds, dw, NULL);
  CHECK(sync_ok(), "route ran");
  get(gw, dw, T * K * 4), get(gs, ds, T * K * 4);
  for (int t = 0; t < T; t++) {
    memcpy(p, lg + t * NE, NE * 4);
    route_ref(p, NE, K, norm, rs + t * K, rw + t * K);
  }
  CHECK(memcmp(gs, rs, T * K * 4) == 0, "selected experts identical (ascending, ties to the lower index)");
  CHECK(n_diff_bits(gw, rw, T * K) == 0, "weights bit-identical");
  { /* the shared expert as slot K (cuda_moe_route_sh): slots [0, K) as above, slot K (NE, sigmoid) */
    const int ks = K + 1;
    float *shl = malloc(T * 4), *w2 = malloc(T * ks * 4);
    int32_t *s2 = malloc(T * ks * 4);
    for (int t = 0; t < T; t++) shl[t] = urand(-3, 3);
    float *dshl = dup_dev(shl, T * 4), *dw2 = dup_dev(NULL, T * ks * 4);
    int32_t *ds2 = dup_dev(NULL, T * ks * 4);
    poison(dw2, T * ks * 4), poison(ds2, T * ks * 4);
    cuda_moe_route_sh(dl, T, NE, K, norm, dshl, NE, ds2, dw2, NULL);
    CHECK(sync_ok(), "route with the shared slot ran");
    get(w2, dw2, T * ks * 4), get(s2, ds2, T * ks * 4);
    int ok = 1;
    for (int t = 0; t < T; t++) {
      ok &= memcmp(s2 + t * ks, rs + t * K, K * 4) == 0 && n_diff_bits(w2 + t * ks, rw + t * K, K) == 0;
      const float g = floe_sigmoidf(shl[t]);
      ok &= s2[t * ks + K] == NE && n_diff_bits(w2 + t * ks + K, &g, 1) == 0;
    }
    CHECK(ok, "shared slot: routed slots identical, slot K = (NE, sigmoid(logit)) bit for bit");
    cuda_rt_free(dshl), cuda_rt_free(dw2), cuda_rt_free(ds2);
    free(shl), free(w2), free(s2);
  }
  cuda_rt_free(dl), cuda_rt_free(dw), cuda_rt_free(ds);
  free(lg), free(p), free(rw), free(gw), free(rs), free(gs);
}

static void test_combine(int T, int K, int64_t n, int shared, int norm) {
  SECTION("moe combine: %d tokens, K %d, n %lld, %s, %s", T, K, (long long)n, shared ? "shared expert" : "no shared",
          norm ? "next norm fused" : "no norm");
  float *x = malloc(T * n * 4), *y = malloc(T * K * n * 4), *w = malloc(T * K * 4), *sh = malloc(T * n * 4);
  float *shl = malloc(T * 4), *nw = malloc(n * 4), *h = malloc(T * n * 4), *gx = malloc(T * n * 4), *gh = malloc(T * n * 4);
  for (int64_t i = 0; i < T * n; i++) x[i] = urand(-2, 2), sh[i] = urand(-1, 1);
  float *xin = malloc(T * n * 4);
  memcpy(xin, x, T * n * 4);
  for (int64_t i = 0; i < T * K * n; i++) y[i] = urand(-1, 1);
  for (int i = 0; i < T * K; i++) w[i] = urand(0, 0.3f);
  for (int i = 0; i < T; i++) shl[i] = urand(-3, 3);
  for (int64_t i = 0; i < n; i++) nw[i] = urand(0.5f, 1.5f);
  float *dx = dup_dev(x, T * n * 4), *dy = dup_dev(y, T * K * n * 4), *dw = dup_dev(w, T * K * 4), *dsh = dup_dev(sh, T * n * 4);
  float *dshl = dup_dev(shl, T * 4), *dnw = dup_dev(nw, n * 4), *dh = dup_dev(NULL, T * n * 4);
  poison(dh, T * n * 4);
  cuda_moe_combine(dx, dy, dw, K, shared ? dsh : NULL, shared ? dshl : NULL, norm ? dnw : NULL, dh, 1e-6f, T, n, NULL);
  CHECK(sync_ok(), "combine ran");
  get(gx, dx, T * n * 4), get(gh, dh, T * n * 4);
  float *acc = malloc(n * 4);
  for (int t = 0; t < T; t++) {
    memset(acc, 0, n * 4);
    for (int j = 0; j < K; j++)
      for (int64_t i = 0; i < n; i++) acc[i] += y[((int64_t)t * K + j) * n + i] * w[t * K + j];
    if (shared)
      for (int64_t i = 0; i < n; i++) acc[i] += sh[t * n + i] * floe_sigmoidf(shl[t]);
    for (int64_t i = 0; i < n; i++) x[t * n + i] += acc[i];
    if (norm) layer_rmsnorm(x + t * n, nw, n, 1e-6f, h + t * n);
  }
  CHECK(n_diff_bits(gx, x, T * n) == 0, "x bit-identical (%zu differ)", n_diff_bits(gx, x, T * n));
  if (norm) CHECK(n_diff_bits(gh, h, T * n) == 0, "fused norm bit-identical");
  if (shared) { /* the shared expert as slot K of K + 1 (cuda_moe_route_sh's layout): the same bits */
    const int ks = K + 1;
    float *y2 = malloc(T * ks * n * 4), *w2 = malloc(T * ks * 4), *gx2 = malloc(T * n * 4), *gh2 = malloc(T * n * 4);
    for (int t = 0; t < T; t++) {
      memcpy(y2 + (int64_t)t * ks * n, y + (int64_t)t * K * n, K * n * 4);
      memcpy(y2 + ((int64_t)t * ks + K) * n, sh + t * n, n * 4);
      memcpy(w2 + t * ks, w + t * K, K * 4);
      w2[t * ks + K] = floe_sigmoidf(shl[t]);
    }
    float *dx2 = dup_dev(NULL, T * n * 4), *dy2 = dup_dev(y2, T * ks * n * 4), *dw2 = dup_dev(w2, T * ks * 4);
    float *dh2 = dup_dev(NULL, T * n * 4);
    /* x as it was before the first combine: x - acc is not recoverable, so start again from gx's source */
    float *x0 = malloc(T * n * 4);
    for (int64_t i = 0; i < T * n; i++) x0[i] = xin[i];
    h2d(dx2, x0, T * n * 4);
    poison(dh2, T * n * 4);
    cuda_moe_combine(dx2, dy2, dw2, ks, NULL, NULL, norm ? dnw : NULL, dh2, 1e-6f, T, n, NULL);
    CHECK(sync_ok(), "combine (shared slot) ran");
    get(gx2, dx2, T * n * 4), get(gh2, dh2, T * n * 4);
    CHECK(n_diff_bits(gx2, x, T * n) == 0, "shared expert as slot K: x bit-identical");
    if (norm) CHECK(n_diff_bits(gh2, h, T * n) == 0, "shared expert as slot K: fused norm bit-identical");
    cuda_rt_free(dx2), cuda_rt_free(dy2), cuda_rt_free(dw2), cuda_rt_free(dh2);
    free(y2), free(w2), free(gx2), free(gh2), free(x0);
  }
  /* SiLU-GLU on the same buffers */
  float *g = malloc(T * n * 4);
  h2d(dh, sh, T * n * 4);
  cuda_silu_glu(dh, dx, T * n, NULL);
  CHECK(sync_ok(), "silu_glu ran");
  get(g, dh, T * n * 4);
  for (int64_t i = 0; i < T * n; i++) sh[i] = floe_siluf(sh[i]) * x[i];
  CHECK(n_diff_bits(g, sh, T * n) == 0, "silu_glu bit-identical");
  cuda_rt_free(dx), cuda_rt_free(dy), cuda_rt_free(dw), cuda_rt_free(dsh), cuda_rt_free(dshl), cuda_rt_free(dnw), cuda_rt_free(dh);
  free(x), free(y), free(w), free(sh), free(shl), free(nw), free(h), free(gx), free(gh), free(acc), free(g), free(xin);
}

/* ---- embedding ---- */
static void test_embed(uint32_t type, int64_t n_embd) {
  const floe_type_traits *tt = floe_type_info(type);
  SECTION("embedding rows: type %s, n_embd %lld", tt ? tt->name : "?", (long long)n_embd);
  char err[256];
  CHECK(cuda_embed_check(type, n_embd, err, sizeof err) == 0, "type accepted");
  const int64_t nv = 37;
  const size_t rb = floe_row_bytes(type, n_embd);
  uint8_t *tab = malloc(nv * rb);
  for (size_t i = 0; i < nv * rb; i++) tab[i] = (uint8_t)floe_rng_u64(&R);
  for (int64_t r = 0; r < nv; r++) { /* finite f16 scales / elements: NaN payloads are not the point */
    uint8_t *row = tab + r * rb;
    if (type == FLOE_TYPE_F16)
      for (int64_t i = 0; i < n_embd; i++)
        if ((row[2 * i + 1] & 0x7c) == 0x7c) row[2 * i + 1] &= 0xfb;
    if (type == FLOE_TYPE_BF16)
      for (int64_t i = 0; i < n_embd; i++)
        if ((row[2 * i + 1] & 0x7f) == 0x7f) row[2 * i + 1] &= 0xfe;
    if (type == FLOE_TYPE_F32)
      for (int64_t i = 0; i < n_embd; i++) { float f = urand(-5, 5); memcpy(row + 4 * i, &f, 4); }
    if (type == FLOE_TYPE_Q8_0 || type == FLOE_TYPE_Q4_K || type == FLOE_TYPE_Q6_K) {
      const size_t bb = tt->bytes;
      for (size_t o = 0; o < rb; o += bb) {
        const size_t at = type == FLOE_TYPE_Q6_K ? o + 208 : o;
        uint16_t hf = floe_f32_to_f16(urand(-0.1f, 0.1f));
        memcpy(row + at, &hf, 2);
        if (type == FLOE_TYPE_Q4_K) { hf = floe_f32_to_f16(urand(0, 0.05f)); memcpy(row + o + 2, &hf, 2); }
      }
    }
  }
  const int32_t tok[5] = { 3, 0, 36, 17, 37 /* out of range: NaN row */ };
  uint8_t *dt = dup_dev(tab, nv * rb);
  int32_t *dtok = dup_dev(tok, sizeof tok);
  float *dout = dup_dev(NULL, 5 * n_embd * 4), *go = malloc(5 * n_embd * 4), *ro = malloc(n_embd * 4);
  poison(dout, 5 * n_embd * 4);
  cuda_embed_rows(type, dt, rb, nv, n_embd, dtok, 5, dout, NULL);
  CHECK(sync_ok(), "embed ran");
  get(go, dout, 5 * n_embd * 4);
  size_t nd = 0;
  for (int t = 0; t < 4; t++) {
    quant_dequant_row(type, tab + tok[t] * rb, ro, n_embd);
    nd += n_diff_bits(go + t * n_embd, ro, n_embd);
  }
  CHECK(nd == 0, "rows bit-identical to quant_dequant_row (%zu differ)", nd);
  CHECK(n_nan(go + 4 * n_embd, n_embd) == (size_t)n_embd, "an id out of range gives a NaN row");
  { /* the MTP's norm pair reading these embedding rows in its launch == k_embed's rows, then the pair */
    float *w = malloc(n_embd * 4), *h = malloc(5 * n_embd * 4), *p1 = malloc(10 * n_embd * 4), *p2 = malloc(10 * n_embd * 4);
    for (int64_t i = 0; i < n_embd; i++) w[i] = urand(0.5f, 1.5f);
    for (int64_t i = 0; i < 5 * n_embd; i++) h[i] = urand(-2, 2);
    float *dw = dup_dev(w, n_embd * 4), *dh = dup_dev(h, 5 * n_embd * 4), *dp = dup_dev(NULL, 10 * n_embd * 4);
    poison(dp, 10 * n_embd * 4);
    cuda_mm_norm_pair(dout, dw, dh, dw, dp, 5, n_embd, 1e-6f, NULL);
    CHECK(sync_ok(), "norm pair ran");
    get(p1, dp, 10 * n_embd * 4);
    poison(dp, 10 * n_embd * 4);
    CHECK(cuda_mm_embed_norm_pair_act(NULL, type, dt, rb, nv, dtok, NULL, dw, dh, dw, dp, 5, n_embd, 1e-6f, NULL, 0, NULL) == 0,
          "embedding norm pair without a matrix: nothing quantized");
    CHECK(sync_ok(), "embedding norm pair ran");
    get(p2, dp, 10 * n_embd * 4);
    const size_t ne = n_diff_bits(p1, p2, 10 * n_embd);
    CHECK(ne == 0, "norm pair on the embedding rows read in its launch == k_embed then the pair, the NaN row too (%zu "
          "differ)", ne);
    /* the trunk's first norm: x set to the embedding rows and normed in one launch == k_embed's x,
       then the norm (x written, y) */
    float *dx = dup_dev(NULL, 5 * n_embd * 4), *dy = dup_dev(NULL, 5 * n_embd * 4), *dy2 = dup_dev(NULL, 5 * n_embd * 4);
    float *gx = malloc(5 * n_embd * 4), *gy = malloc(5 * n_embd * 4), *gy2 = malloc(5 * n_embd * 4);
    poison(dx, 5 * n_embd * 4), poison(dy, 5 * n_embd * 4), poison(dy2, 5 * n_embd * 4);
    cuda_rmsnorm(dout, dw, dy2, 5, n_embd, 1e-6f, NULL);
    cuda_mm_embed_norm_act(NULL, type, dt, rb, nv, dtok, NULL, dx, dw, dy, 5, n_embd, 1e-6f, NULL, 0, NULL);
    CHECK(sync_ok(), "embedding norm ran");
    get(gx, dx, 5 * n_embd * 4), get(gy, dy, 5 * n_embd * 4), get(gy2, dy2, 5 * n_embd * 4);
    const size_t nx = n_diff_bits(gx, go, 5 * n_embd), ny = n_diff_bits(gy, gy2, 5 * n_embd);
    CHECK(nx == 0 && ny == 0, "norm on the embedding rows written in its launch: x == k_embed's rows (%zu differ), y == "
          "the norm of them (%zu differ)", nx, ny);
    cuda_rt_free(dx), cuda_rt_free(dy), cuda_rt_free(dy2);
    free(gx), free(gy), free(gy2);
    cuda_rt_free(dw), cuda_rt_free(dh), cuda_rt_free(dp);
    free(w), free(h), free(p1), free(p2);
  }
  cuda_rt_free(dt), cuda_rt_free(dtok), cuda_rt_free(dout);
  free(tab), free(go), free(ro);
}

/* ---- argmax ---- */
static void argmax_case(const char *what, float *x, int64_t n, float *dx, void *dscr, int32_t *dout) {
  h2d(dx, x, n * 4);
  const int32_t bad = -7;
  h2d(dout, &bad, 4);
  cuda_argmax(dx, n, dout, dscr, NULL);
  int32_t g = -1;
  CHECK(sync_ok(), "argmax ran");
  get(&g, dout, 4);
  const int64_t r = kern_argmax(x, n);
  CHECK(g == r, "argmax %s: gpu %d cpu %lld", what, g, (long long)r);
}

static void test_argmax(void) {
  const int64_t n = 248323;
  SECTION("argmax over %lld", (long long)n);
  float *x = malloc(n * 4), *dx = dup_dev(NULL, n * 4);
  const size_t sb = cuda_argmax_scratch_bytes(n);
  void *dscr = dup_dev(NULL, sb);
  dmemset(dscr, 0, sb);
  int32_t *dout = dup_dev(NULL, 4);
  for (int64_t i = 0; i < n; i++) x[i] = urand(-10, 10);
  argmax_case("random", x, n, dx, dscr, dout);
  x[1000] = 50.0f, x[200000] = 50.0f, x[n - 1] = 50.0f;
  argmax_case("ties (first index)", x, n, dx, dscr, dout);
  x[5] = NAN, x[6] = NAN;
  argmax_case("with NaN", x, n, dx, dscr, dout);
  x[0] = 50.0f;
  argmax_case("max at 0 tied with later", x, n, dx, dscr, dout);
  for (int64_t i = 0; i < n; i++) x[i] = NAN;
  x[n - 1] = -1e30f;
  argmax_case("all NaN but the last", x, n, dx, dscr, dout);
  for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
  argmax_case("all -inf (0)", x, n, dx, dscr, dout);
  for (int64_t i = 0; i < n; i++) x[i] = (i % 3) ? -0.0f : 0.0f;
  argmax_case("+0 / -0 ties", x, n, dx, dscr, dout);
  float small[3] = { 1, 3, 3 };
  argmax_case("n = 3", small, 3, dx, dscr, dout);
  cuda_rt_free(dx), cuda_rt_free(dscr), cuda_rt_free(dout);
  free(x);
  /* several rows in one launch (a verify's rows), rows ld apart, with one-row launches through the
   * same scratch between and after: each row == kern_argmax, the counters back at zero between
   * launches */
  static const int64_t rn[][3] = { { 248320, 248323, 5 }, { 8192, 8192, 8 }, { 3, 7, 2 }, { 4097, 4100, 1 } };
  for (size_t c = 0; c < sizeof rn / sizeof rn[0]; c++) {
    const int64_t nn = rn[c][0], ld = rn[c][1];
    const int rows = (int)rn[c][2];
    SECTION("argmax of %d rows of %lld", rows, (long long)nn);
    float *xr = malloc((size_t)(rows * ld) * 4);
    for (int64_t i = 0; i < rows * ld; i++) xr[i] = urand(-10, 10);
    for (int r = 0; r < rows; r++) /* a tie in every row: the first index wins */
      xr[r * ld + (r * 977) % nn] = 60.0f, xr[r * ld + (r * 977 + 1) % nn] = 60.0f;
    if (rows > 1) xr[ld + nn - 1] = 70.0f; /* row 1's maximum at its last value */
    const size_t sbr = cuda_argmax_rows_scratch_bytes(nn, rows);
    CHECK(sbr >= cuda_argmax_scratch_bytes(nn), "the rows' scratch serves one row too");
    float *dxr = dup_dev(xr, (size_t)(rows * ld) * 4);
    void *ds = dup_dev(NULL, sbr);
    dmemset(ds, 0, sbr);
    int32_t *dor = dup_dev(NULL, 16 * 4), gr[16];
    for (int rep = 0; rep < 3; rep++) {
      if (rep == 2) { /* a one-row launch between: it shares row 0's place in the scratch */
        cuda_argmax(dxr, nn, dor, ds, NULL);
        CHECK(sync_ok(), "one row between them ran");
      }
      poison(dor, 16 * 4);
      cuda_argmax_rows(dxr, ld, nn, rows, dor, ds, NULL);
      CHECK(sync_ok(), "argmax rows ran");
      get(gr, dor, (size_t)rows * 4);
      int bad = -1;
      for (int r = 0; r < rows && bad < 0; r++)
        if (gr[r] != kern_argmax(xr + r * ld, nn)) bad = r;
      CHECK(bad < 0, "every row == kern_argmax (pass %d; first bad row %d)", rep, bad);
    }
    cuda_argmax(dxr + (rows - 1) * ld, nn, dor, ds, NULL);
    CHECK(sync_ok(), "one row after them ran");
    get(gr, dor, 4);
    CHECK(gr[0] == kern_argmax(xr + (rows - 1) * ld, nn), "one row through the same scratch");
    cuda_rt_free(dxr), cuda_rt_free(ds), cuda_rt_free(dor);
    free(xr);
  }
}

/* The launch trace (cuda_rt_trace_start / dump): two routings of 3 and 5 tokens (grids 3 and 5 of
 * one warp), recorded in launch order with the entry times non-decreasing. */
static void test_trace(void) {
  SECTION("launch trace");
  char err[256];
  if (!cuda_rt_trace_built()) { /* the default build: a clear refusal */
    err[0] = 0;
    CHECK(cuda_rt_trace_start(err, sizeof err) != 0 && strstr(err, "FLOE_CUDA_TRACE"),
          "a build without the trace refuses it by name (%s)", err);
    return;
  }
  CHECK(cuda_rt_trace_start(err, sizeof err) == 0, "trace armed");
  cuda_moe_set_route_impl(1);
  float *dl = dup_dev(NULL, 5 * 64 * 4), *dw = dup_dev(NULL, 5 * 4 * 4);
  int32_t *ds = dup_dev(NULL, 5 * 4 * 4);
  cuda_rt_memset_async(dl, 0, 5 * 64 * 4, NULL);
  cuda_moe_route(dl, 3, 64, 4, 1, ds, dw, NULL);
  cuda_moe_route(dl, 5, 64, 4, 1, ds, dw, NULL);
  CHECK(sync_ok(), "routed");
  FILE *f = tmpfile();
  CHECK(f && cuda_rt_trace_dump(f, err, sizeof err) == 0, "trace read back");
  if (!f) return;
  rewind(f);
  unsigned long long i, t, gx, gy, gz, bx, prev = 0;
  int n = 0, ok = 1;
  const unsigned long long want[2] = { 3, 5 };
  while (fscanf(f, "%llu %llu %llu %llu %llu %llu", &i, &t, &gx, &gy, &gz, &bx) == 6) {
    ok &= n < 2 && i == (unsigned long long)n && gx == want[n] && gy == 1 && gz == 1 && bx == 32 && t >= prev;
    prev = t;
    n++;
  }
  fclose(f);
  CHECK(n == 2 && ok, "two launches recorded in order with their grids (%d lines)", n);
  CHECK(cuda_rt_trace_start(err, sizeof err) == 0, "trace re-armed (zeroed)");
  f = tmpfile();
  n = 0;
  if (f && cuda_rt_trace_dump(f, err, sizeof err) == 0) {
    rewind(f);
    while (fscanf(f, "%llu %llu %llu %llu %llu %llu", &i, &t, &gx, &gy, &gz, &bx) == 6) n++;
  }
  if (f) fclose(f);
  CHECK(n == 0, "nothing recorded after re-arming (%d lines)", n);
}

int main(void) {
  /* the runtime's first call sets CUDA_MODULE_LOADING=EAGER where the user left it unset (the
   * kernels loaded at context creation, not at their first launch) and keeps a user's value;
   * checked with or without a device */
  const char *ml0 = getenv("CUDA_MODULE_LOADING");
  char ml_user[64];
  snprintf(ml_user, sizeof ml_user, "%s", ml0 ? ml0 : "");
  const int n_dev = cuda_rt_device_count();
  const char *ml = getenv("CUDA_MODULE_LOADING");
  if (!(ml && !strcmp(ml, ml0 ? ml_user : "EAGER"))) {
    printf("FAIL: CUDA_MODULE_LOADING after the first runtime call is '%s', expected '%s'\n", ml ? ml : "(unset)",
           ml0 ? ml_user : "EAGER");
    return 1;
  }
  if (n_dev <= 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  char name[256], err[256];
  if (cuda_rt_init(0, err, sizeof err) || cuda_rt_device_name(0, name, sizeof name, err, sizeof err)) {
    printf("%s\n", err);
    return 1;
  }
  printf("device: %s\n", name);
  floe_rng_seed(&R, 0x0c0ffee5ull ^ (uint64_t)floe_time_s());
  for (int impl = 0; impl < 2; impl++) { /* the sum of squares from the row, then from the squares' rows */
    printf("-- norms: %s\n", impl ? "squares in rows (sumsq16_rows)" : "the first form");
    cuda_mm_set_act2(impl);
    test_norm(3, 2050);
    test_norm(1, 2048);
    test_norm(2, 7);    /* fewer values than lanes */
    test_norm(2, 64);   /* E = 64: the fixtures' n_embd */
    test_norm(1, 6001); /* past the squares' shared-memory budget: the first form */
  }
  /* 35B-A3B shape at >= 32K positions, both cache types; then smaller awkward ones */
  test_attn_case(16, 2, 256, 64, 1, 1, 32771, 5, 64);
  test_attn_case(16, 2, 256, 64, 1, 0, 32771, 3, 64);
  test_attn_case(16, 2, 256, 64, 1, 1, 0, 7, 64);
  test_attn_case(32, 4, 128, 128, 0, 0, 1000, 9, 7);
  test_attn_case(12, 4, 128, 32, 1, 1, 200, 3, 256);
  /* the fixtures' and the default model's shapes: head_dim 16 / 32 / 64, groups 1..16 */
  test_attn_case(4, 2, 16, 16, 0, 0, 37, 3, 5);
  test_attn_case(4, 2, 16, 8, 1, 1, 300, 2, 3);
  test_attn_case(8, 2, 32, 32, 1, 0, 129, 4, 2);
  test_attn_case(16, 1, 32, 16, 0, 1, 5000, 2, 33);
  test_attn_case(16, 4, 64, 64, 1, 1, 2100, 3, 33);
  test_attn_case(6, 6, 64, 32, 0, 0, 70, 5, 1);
  test_attn_case(12, 1, 128, 64, 1, 1, 1500, 2, 16);
  test_attn_case(32, 2, 128, 64, 0, 1, 4000, 2, 33);
  test_attn_case(8, 2, 80, 32, 1, 1, 300, 2, 4); /* not a power of two: zero-padded to 128 */
  /* the 35B-A3B shape at a short context (n_split 1, 2): prefill and decode get a block per head */
  test_attn_case(16, 2, 256, 64, 1, 1, 600, 3, 1);
  test_attn_case(16, 2, 256, 64, 1, 0, 130, 2, 2);
  /* the row-group kernel (16 query rows a block) on awkward chunks: rows 1..130, depths crossing
   * tiles, parts and a change of part size inside a block's rows, GQA 1 / 4 / 8, 3 (15 query rows) */
  test_attn_case(16, 2, 256, 64, 1, 1, 0, 130, 3);     /* 35B-A3B shape from position 0 */
  test_attn_case(16, 2, 256, 64, 1, 1, 32740, 40, 64); /* 35B-A3B at 32K: 64 parts a row, size 512 -> 640 at row 28 */
  test_attn_case(16, 2, 256, 64, 0, 0, 1000, 41, 4);   /* f32 cache (16-position tiles) */
  test_attn_case(8, 8, 64, 64, 0, 1, 1000, 130, 4);    /* GQA 1 (16 rows a block), part size 256 -> 384 at row 24 */
  test_attn_case(8, 8, 128, 32, 1, 0, 2040, 33, 8);    /* part size 256 -> 384 at row 8 */
  test_attn_case(16, 4, 64, 64, 1, 1, 3000, 33, 5);    /* GQA 4 */
  test_attn_case(32, 4, 128, 128, 0, 1, 1000, 77, 7);  /* GQA 8, head_dim 128 */
  test_attn_case(12, 4, 128, 64, 1, 1, 100, 20, 2);    /* GQA 3: 5 rows a block */
  test_attn_case(4, 4, 16, 16, 0, 0, 5, 130, 2);       /* head_dim 16 (128-position tiles) */
  test_attn_case(8, 2, 32, 32, 1, 1, 300, 19, 3);      /* head_dim 32 */
  test_attn_case(8, 2, 80, 32, 1, 0, 250, 17, 2);      /* head_dim 80, zero-padded to 128 */
  test_attn_case(16, 2, 256, 64, 1, 1, 7, 1, 2);       /* one row */
  test_attn_case(16, 2, 256, 64, 1, 1, 125, 6, 1);     /* one split: one part a row, part size 128 -> 256 at row 3 */
  test_attn_case(32, 1, 64, 64, 0, 1, 130, 9, 3);      /* GQA 32: a block of 16 heads of one row */
  /* dk 128 (and 64 where k_gdn_step1 / k_gdn_recur2 take it), ten settings: one thread per column
   * with the token-by-token conv; two threads per column, the conv a block per token, one token
   * fused into one launch k_gdn_step1, prefill's S columns over several blocks with consecutive
   * tokens overlapped (k_gdn_recur_cols2 + k_gdn_gnorm); k_gdn_recur2 for every chunk with two
   * launches a token; the fused step with k_gdn_recur_cols (no overlap); the column-split
   * recurrence for decode steps too, with two and with four threads a column; the fused step and
   * the prefill with four threads a column (k_gdn_step1<DK, 4>, k_gdn_recur_cols2<4>); the chunked
   * loads of k_gdn_recur_cols3 with 2 / 4 / 8 threads a column (with 2 and 8 decode steps too; the
   * default prefill, 8 threads a column over 16 columns a block, is in the loop below). Decode steps go through cuda_gdn_step, compared with the CPU and with the
   * prefill rows, whose token-by-token rerun takes the two launches (k_gdn_recur2 where the decode
   * steps are not column-split: then the prefill kernel is checked bit for bit against it). */
  for (int impl = 0; impl < 10; impl++) {
    printf("-- gdn: %s\n", impl == 0   ? "one thread per column, serial conv"
                          : impl == 1 ? "fused decode step, prefill S columns split, tokens overlapped (k_gdn_recur_cols2)"
                          : impl == 2 ? "k_gdn_recur2 everywhere, decode as two launches"
                          : impl == 3 ? "fused decode step, prefill S columns split, tokens not overlapped"
                          : impl == 4 ? "decode steps too with S columns split (conv, k_gdn_recur_cols2, gnorm)"
                          : impl == 5 ? "prefill and decode with S columns split, four threads a column (k_gdn_recur_cols2<4>)"
                          : impl == 6 ? "four threads a column: the fused step k_gdn_step1<DK, 4>, prefill k_gdn_recur_cols2<4>"
                          : impl == 7 ? "chunked loads, two threads a column (k_gdn_recur_cols3<2>), decode steps too"
                          : impl == 8 ? "chunked loads, four threads a column (k_gdn_recur_cols3<4>)"
                                      : "chunked loads, eight threads a column (k_gdn_recur_cols3<8, 32>), decode steps too");
    cuda_gdn_set_impl(impl > 0);
    cuda_gdn_set_conv_par(impl > 0);
    cuda_gdn_set_fused(impl != 2);
    cuda_gdn_set_cols(impl == 1 || impl == 4 ? 2 : impl == 3 ? 1 : impl == 5 || impl == 6 ? 3 : impl >= 7 ? impl - 3 : 0);
    cuda_gdn_set_dec_cols(impl == 4 || impl == 5 || impl == 7 || impl == 9);
    cuda_gdn_set_step_nq(impl == 6 ? 4 : 2);
    test_gdn_case(16, 32, 128, 128, 4, 1, 9, 4);
    test_gdn_case(4, 12, 128, 96, 4, 0, 5, 3);
    test_gdn_case(2, 2, 128, 100, 8, 1, 3, 2);
    test_gdn_case(1, 3, 128, 8, 4, 0, 4, 2); /* dv 8: one warp, half its columns past dv */
    test_gdn_case(1, 10, 128, 8, 3, 1, 3, 2); /* 10 value heads a key head: past the cluster limit */
    test_gdn_case(2, 4, 128, 72, 4, 1, 300, 2); /* past a beta / decay batch; a part column group */
    test_gdn_case(1, 2, 128, 16, 4, 0, 257, 1); /* a batch of one token after the first */
    test_gdn_case(4, 8, 128, 40, 4, 0, 2, 1);   /* the shortest chunk */
    test_gdn_keep_case(16, 32, 128, 128, 4, 1, 5); /* the 35B-A3B shape, 1 + 4 drafts */
    test_gdn_keep_case(16, 32, 128, 128, 4, 1, 1); /* one kept row: the fused step */
    test_gdn_keep_case(2, 6, 128, 100, 8, 0, 8);
    test_gdn_keep_case(2, 6, 128, 100, 8, 0, 1);
    test_gdn_keep_case(1, 3, 128, 8, 4, 1, 2);
    test_gdn_keep_case(1, 3, 128, 8, 2, 1, 1);
    test_gdn_keep_case(4, 4, 128, 40, 5, 1, 1); /* one value head a key head: no cluster */
    /* dk 64 (the default model: Nk 4, Nv 4, dv 64, K 4): k_gdn_step1<64> / k_gdn_recur2<64> */
    test_gdn_case(4, 4, 64, 64, 4, 1, 5, 3);
    test_gdn_case(2, 6, 64, 40, 3, 0, 4, 2); /* a cluster of 3; a part warp of columns */
    test_gdn_keep_case(4, 4, 64, 64, 4, 1, 5);
    test_gdn_keep_case(4, 4, 64, 64, 4, 1, 1);
    test_gdn_keep_case(2, 6, 64, 40, 3, 0, 1);
    /* k_gdn_stepn's limits: 16 rows (its most), 17 (the two launches), a conv width other than 4;
     * split into 32-column blocks: dv 128 (4 a cluster), 72 (3, the last part), 40, 8 (one block) */
    if (impl == 0) { /* the fused step's quantization (the default impl's k_gdn_step1), switched on */
      cuda_gdn_set_impl(1), cuda_gdn_set_fused(1), cuda_gdn_set_cols(0), cuda_gdn_set_dec_cols(0);
      cuda_gdn_set_act(1);
      test_gdn_act_case(16, 32, 128, 128, 4, 1, 3, 1, 1); /* the 35B-A3B shape: clusters of 4 (2 key heads) */
      test_gdn_act_case(16, 32, 128, 128, 4, 0, 3, 1, 1); /* the 80B-A3B shape: clusters of 2 */
      test_gdn_act_case(4, 4, 64, 64, 4, 1, 3, 1, 1);     /* the default model: 4 heads a chunk, no GQA */
      test_gdn_act_case(2, 6, 64, 64, 3, 0, 2, 0, 1);     /* r 3: 4 key heads a chunk, Nk 2: no; q8_0 fits */
      test_gdn_act_case(2, 4, 128, 96, 4, 1, 2, 0, 1);    /* dv 96 does not divide 256; q8_0 fits (96 = 3 x 32) */
      cuda_gdn_set_act(0);
      test_gdn_act_case(16, 32, 128, 128, 4, 1, 2, 1, 0); /* switched off: the caller quantizes */
      cuda_gdn_set_impl(impl > 0), cuda_gdn_set_fused(impl != 2), cuda_gdn_set_cols(0), cuda_gdn_set_dec_cols(0);
    }
    test_gdn_keep_case(16, 32, 128, 128, 4, 1, 16);
    test_gdn_keep_case(4, 4, 64, 64, 4, 1, 16);
    test_gdn_keep_case(1, 3, 128, 8, 4, 1, 17);
    test_gdn_keep_case(2, 6, 64, 40, 3, 0, 11);
    test_gdn_keep_case(1, 10, 128, 72, 5, 1, 3); /* 10 value heads a key head */
    test_gdn_keep_case(1, 3, 128, 8, 4, 0, 6);
  }
  /* kept chunks as the two launches (FLOE_CUDA_GDN_STEPN=0), and in one launch with one block a
   * value head (1; the default, 2, splits a head's columns over a cluster) */
  for (int mode = 0; mode < 2; mode++) {
    printf("-- gdn kept chunks: %s\n", mode ? "k_gdn_stepn, one block a value head" : "k_gdn_conv + k_gdn_recur2");
    cuda_gdn_set_impl(1), cuda_gdn_set_fused(1), cuda_gdn_set_stepn(mode);
    test_gdn_keep_case(16, 32, 128, 128, 4, 1, 5);
    test_gdn_keep_case(4, 4, 64, 64, 4, 1, 4);
    test_gdn_keep_case(2, 6, 128, 100, 3, 0, 11);
    for (int nq = 2; nq <= 4 && mode; nq += 2) {
      cuda_gdn_set_step_nq(nq);
      test_gdn_keep_case(4, 4, 128, 72, 4, 1, 16);
      test_gdn_keep_case(2, 6, 64, 40, 4, 0, 7);
    }
    cuda_gdn_set_step_nq(2);
  }
  cuda_gdn_set_stepn(2);
  /* the split form with the row count as a template argument (the default for 2..5 rows, dv a
   * multiple of 32: a dk-128 block of nine warps) and the one kernel for every count */
  for (int nt = 0; nt < 2; nt++) {
    printf("-- gdn kept chunks: k_gdn_stepn split, %s\n", nt ? "the row count a template argument" : "one kernel for every count");
    cuda_gdn_set_stepn_nt(nt);
    for (int n = 2; n <= 5; n++) {
      test_gdn_keep_case(16, 32, 128, 128, 4, 1, n); /* the 35B-A3B shape */
      test_gdn_keep_case(4, 4, 64, 64, 4, 1, n);     /* the default model */
    }
    test_gdn_keep_case(2, 4, 128, 64, 4, 0, 3); /* dv 64: two blocks a head */
    test_gdn_keep_case(2, 4, 128, 96, 4, 1, 4); /* dv 96: three */
    test_gdn_keep_case(2, 4, 128, 64, 3, 1, 4); /* conv width 3: the general kernel */
  }
  cuda_gdn_set_stepn_nt(1);
  /* chunked loads over three beta / decay tables (700 tokens) and a part column group (dv 72) */
  for (int mode = 4; mode <= 7; mode++) { /* 7: eight threads a column, 16 columns a block */
    cuda_gdn_set_impl(1), cuda_gdn_set_fused(1), cuda_gdn_set_cols(mode), cuda_gdn_set_dec_cols(0);
    cuda_gdn_set_step_nq(2);
    test_gdn_case(2, 4, 128, 72, 4, 1, 700, 1);
    test_gdn_case(1, 3, 128, 7, 4, 0, 20, 1); /* rows of 277 floats: 4-byte copies */
    test_gdn_case(16, 32, 128, 128, 4, 1, 40, 1); /* the 35B-A3B shape */
  }
  cuda_gdn_set_impl(1), cuda_gdn_set_fused(1), cuda_gdn_set_cols(7), cuda_gdn_set_dec_cols(0), cuda_gdn_set_step_nq(2);
  test_gdn_case(16, 32, 128, 128, 4, 1, 260, 3); /* the 35B-A3B shape, a long chunk (the defaults) */
  cuda_gdn_set_impl(0);
  test_gdn_case(2, 6, 64, 64, 3, 1, 4, 2);
  /* the fixtures' and the default model's shapes: dk 16, dv 24 (not a multiple of 32), Nk 2 Nv 4 */
  test_gdn_case(2, 4, 16, 24, 4, 1, 6, 3);
  test_gdn_case(2, 4, 16, 24, 4, 0, 6, 3);
  test_gdn_case(4, 8, 64, 64, 4, 1, 5, 2);
  test_gdn_case(3, 9, 32, 40, 2, 0, 4, 2);
  test_gdn_case(2, 2, 128, 100, 8, 1, 3, 2);
  /* kept chunks at every key dim of k_gdn_recur (the default model: dk 64) */
  test_gdn_keep_case(4, 4, 64, 64, 4, 1, 5);
  test_gdn_keep_case(2, 4, 16, 24, 4, 0, 3);
  test_gdn_keep_case(3, 9, 32, 40, 2, 1, 8);
  test_gdn_keep_case(2, 2, 128, 100, 3, 0, 1);
  for (int impl = 0; impl < 2; impl++) { /* a block per token, then a warp per token (the default) */
    printf("-- routing: %s; combine: %s\n", impl ? "a warp per token" : "a block per token",
           impl ? "loads batched in registers" : "the first form");
    cuda_moe_set_route_impl(impl);
    cuda_mm_set_act2(impl);
    test_route(256, 8, 1, 5, 0);
    test_route(256, 8, 1, 5, 3);
    test_route(256, 8, 0, 1, 2);
    test_route(100, 6, 0, 4, 2);
    test_route(200, 9, 1, 3, 4);  /* not a multiple of 32 or 16 */
    test_route(40, 32, 1, 2, 3);  /* K = 32: every lane holds a pick */
    test_route(257, 8, 1, 2, 0);  /* the warp kernel's 16 experts a lane */
    test_route(512, 10, 1, 3, 5); /* Qwen3-Next-80B / Qwen3.5-397B: 512 experts, top-10 */
    test_route(512, 10, 1, 3, 0);
    test_route(700, 10, 0, 2, 4); /* 32 a lane, not a multiple of 32 */
    test_route(1024, 32, 1, 2, 3);
    test_combine(3, 8, 2050, 1, 1);
    test_combine(1, 8, 2048, 1, 1); /* the 35B-A3B shape, one token */
    test_combine(2, 13, 2000, 1, 1); /* two load batches */
    test_combine(2, 6, 1000, 0, 0);
    test_combine(2, 4, 64, 1, 1); /* E = 64: the fixtures' n_embd */
    test_route(64, 4, 1, 3, 2);
  }
  test_embed(FLOE_TYPE_F32, 2048);
  test_embed(FLOE_TYPE_F32, 64);
  test_embed(FLOE_TYPE_Q8_0, 64);
  test_embed(FLOE_TYPE_F16, 2050);
  test_embed(FLOE_TYPE_BF16, 2050);
  test_embed(FLOE_TYPE_Q8_0, 2080);
  test_embed(FLOE_TYPE_Q4_K, 2304);
  test_embed(FLOE_TYPE_Q6_K, 2304);
  test_argmax();
  test_trace();
  return TEST_DONE();
}
