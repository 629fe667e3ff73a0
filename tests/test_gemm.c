/* The batched AVX-512 kernel (kernels_gemm_avx512.c) against the scalar reference, bit for bit.
 *
 * For each type it implements (Q4_K, Q5_K): random weights (quant_fill_random) and activations
 * (normal, with outliers), awkward shapes (rows 1, 2, 3, 17, 37, 70; columns 256..4352, the last
 * taking the multi-chunk path), every nb from 1 to 16, sub-ranges [r0, r1) with odd r0, ldy > rows,
 * several seeds; then saturated inputs (all codes and scales at their maximum, activations at
 * +-127) that push the per-lane sums to the int16 bound the kernel relies on. The scalar result of
 * one activation row alone (nb = 1) is the oracle, so this also checks row-exactness. Finally
 * kern_matmul's dispatch (nb >= KGEMM_MIN_NB goes to this kernel) against the nb = 1 AVX-512 path,
 * and kern_matmul_batch with nb > 16 (Q4_K/Q5_K through this kernel, Q6_K/Q8_0 through the
 * blocked kern_matmul loop) against nb = 1. Then the same matrices packed with the rows in the lanes
 * (kern_k4_lanes_pack): each row recovered by kern_k4_lanes_row, and every path (the batched kernel,
 * AVX2 / scalar / the float path through the file's layout) equal to the unpacked matrix's, and the
 * packed kernel at 1..8 activation rows (lanes_few, the decode of several requests) against the
 * scalar reference directly, saturated inputs included. */
#include <math.h>

#include "kernels/cpu/kernels_internal.h"
#include "test.h"

static floe_rng rng;

typedef struct tcase {
  floe_mat W;
  void *data;
  float *X;
  uint8_t *xq;
  size_t ab;
} tcase;

/* extreme: activation rows of all +1, all -1 (every q = +-127, lane sums at the bound), random signs */
static void fill_x(float *x, int64_t n, int64_t cols, int extreme) {
  for (int64_t i = 0; i < n; i++) {
    if (extreme) {
      const int64_t kind = i / cols % 3;
      x[i] = kind == 0 ? 1.0f : kind == 1 ? -1.0f : floe_rng_uniform(&rng) < 0.5f ? -1.0f : 1.0f;
      continue;
    }
    x[i] = floe_rng_normal(&rng);
    if (floe_rng_uniform(&rng) < 1.0f / 64) x[i] = (floe_rng_uniform(&rng) < 0.5f ? -1 : 1) * (6 + 18 * floe_rng_uniform(&rng));
  }
}

/* every block's own d and dmin (test_vary_f16), from a generator of their own */
static floe_rng rng_sc;

static tcase make(uint32_t type, int64_t rows, int64_t cols, int nb, int extreme) {
  tcase c = {0};
  const floe_type_traits *tt = floe_type_info(type);
  c.W.type = type;
  c.W.rows = rows;
  c.W.cols = cols;
  c.W.row_bytes = floe_row_bytes(type, cols);
  c.data = malloc(c.W.row_bytes * (size_t)rows + 64);
  quant_fill_random(type, &rng, c.data, rows * (cols / tt->blck), 1.0f);
  for (int64_t blk = 0; (type == FLOE_TYPE_Q4_K || type == FLOE_TYPE_Q5_K) && blk < rows * (cols / 256); blk++) {
    /* d, dmin first */
    test_vary_f16(&rng_sc, (uint8_t *)c.data + (size_t)blk * tt->bytes);
    test_vary_f16(&rng_sc, (uint8_t *)c.data + (size_t)blk * tt->bytes + 2);
  }
  if (extreme) {
    /* every code and 6-bit scale/min at its maximum, d and dmin kept (finite) */
    for (int64_t blk = 0; blk < rows * (cols / 256); blk++) {
      uint8_t *b = (uint8_t *)c.data + (size_t)blk * tt->bytes;
      memset(b + 4, 0xFF, (size_t)tt->bytes - 4);
    }
  }
  c.W.data = c.data;
  c.X = malloc(sizeof(float) * (size_t)(nb * cols));
  fill_x(c.X, nb * cols, cols, extreme);
  c.ab = kern_act_bytes(&c.W);
  c.xq = floe_aligned_alloc(64, c.ab * (size_t)nb);
  kern_act_quantize_rows(&c.W, nb, c.X, cols, c.xq, c.ab);
  return c;
}

static void drop(tcase *c) {
  free(c->data);
  free(c->X);
  floe_aligned_free(c->xq);
}

/* Compares kern_gemm_q_avx512 on rows [r0, r1) with the scalar reference run one activation row
 * at a time; returns the number of differing outputs (bits), untouched outputs included. */
static int64_t compare(tcase *c, int nb, int64_t r0, int64_t r1) {
  const int64_t ldy = c->W.rows + 3;
  float *Yg = malloc(sizeof(float) * (size_t)(nb * ldy)), *Yr = malloc(sizeof(float) * (size_t)(nb * ldy));
  for (int64_t i = 0; i < nb * ldy; i++) Yg[i] = Yr[i] = -7.0f; /* sentinel outside [r0, r1) */
  kern_gemm_q_avx512(&c->W, nb, c->xq, c->ab, Yg, ldy, r0, r1);
  int prev = kern_isa_set(FLOE_ISA_SCALAR);
  for (int b = 0; b < nb; b++) kern_matmul(&c->W, 1, NULL, 0, c->xq + (size_t)b * c->ab, c->ab, Yr + b * ldy, ldy, r0, r1);
  kern_isa_set(prev);
  int64_t bad = 0;
  for (int64_t i = 0; i < nb * ldy; i++) bad += memcmp(&Yg[i], &Yr[i], 4) != 0;
  free(Yg);
  free(Yr);
  return bad;
}

int main(void) {
  floe_rng_seed(&rng_sc, 4242);
  if (kern_isa_set(FLOE_ISA_AVX512) < 0) {
    printf("no AVX-512 (VNNI/VBMI/GFNI): kernel not built for this CPU, nothing to test\n");
    return TEST_DONE();
  }
  const uint32_t types[] = {FLOE_TYPE_Q4_K, FLOE_TYPE_Q5_K};
  const char *tname[] = {"q4_K", "q5_K"};

  for (int ti = 0; ti < 2; ti++) {
    SECTION("%s: random inputs, every nb 1..16, awkward shapes, 3 seeds", tname[ti]);
    const int64_t shapes[][2] = {{1, 256}, {2, 512}, {3, 768}, {17, 2048}, {37, 1280}, {70, 512}, {5, 4352}};
    for (int seed = 0; seed < 3; seed++) {
      floe_rng_seed(&rng, 1000 + 17 * (uint64_t)seed + (uint64_t)ti);
      for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1];
        int64_t bad = 0;
        for (int nb = 1; nb <= 16; nb++) {
          tcase c = make(types[ti], rows, cols, nb, 0);
          bad += compare(&c, nb, 0, rows);
          drop(&c);
        }
        CHECK(bad == 0, "%s %lldx%lld seed %d nb 1..16: %lld outputs differ from the scalar reference", tname[ti],
              (long long)rows, (long long)cols, seed, (long long)bad);
      }
    }

    SECTION("%s: sub-ranges [r0, r1)", tname[ti]);
    floe_rng_seed(&rng, 77 + (uint64_t)ti);
    {
      tcase c = make(types[ti], 53, 1024, 11, 0);
      const int64_t ranges[][2] = {{1, 52}, {3, 4}, {16, 33}, {0, 53}, {52, 53}, {7, 7}};
      for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        int64_t bad = compare(&c, 11, ranges[i][0], ranges[i][1]);
        CHECK(bad == 0, "%s rows [%lld, %lld) nb 11: %lld outputs differ (or written outside the range)", tname[ti],
              (long long)ranges[i][0], (long long)ranges[i][1], (long long)bad);
      }
      drop(&c);
    }

    SECTION("%s: saturated codes, scales and activations (int16 bound of the 8-product lane sums)", tname[ti]);
    floe_rng_seed(&rng, 5 + (uint64_t)ti);
    for (int nb = 3; nb <= 16; nb += 13) {
      tcase c = make(types[ti], 19, 512, nb, 1);
      int64_t bad = compare(&c, nb, 0, 19);
      float y;
      int prev = kern_isa_set(FLOE_ISA_SCALAR);
      kern_matmul(&c.W, 1, NULL, 0, c.xq, c.ab, &y, 1, 0, 1);
      kern_isa_set(prev);
      CHECK(bad == 0 && isfinite(y), "%s saturated nb %d: %lld outputs differ (y0 %g)", tname[ti], nb, (long long)bad, y);
      drop(&c);
    }
  }

  SECTION("kern_matmul dispatch (nb >= %d to the batched kernel) vs nb = 1, AVX-512", KGEMM_MIN_NB);
  floe_rng_seed(&rng, 99);
  for (int ti = 0; ti < 2; ti++) {
    tcase c = make(types[ti], 45, 2048, 16, 0);
    float *Y = malloc(sizeof(float) * 16 * 45), *Y1 = malloc(sizeof(float) * 16 * 45);
    int64_t bad = 0;
    for (int nb = 1; nb <= 16; nb++) {
      kern_matmul(&c.W, nb, NULL, 0, c.xq, c.ab, Y, 45, 0, 45);
      for (int b = 0; b < nb; b++) kern_matmul(&c.W, 1, NULL, 0, c.xq + (size_t)b * c.ab, c.ab, Y1 + b * 45, 45, 0, 45);
      bad += memcmp(Y, Y1, sizeof(float) * (size_t)(nb * 45)) != 0;
    }
    CHECK(bad == 0, "%s: %lld of 16 batch sizes not row-exact through kern_matmul", tname[ti], (long long)bad);
    free(Y);
    free(Y1);
    drop(&c);
  }

  SECTION("kern_matmul_batch: nb > 16 (one transpose per 16 weight rows for every activation row), vs nb = 1");
  floe_rng_seed(&rng, 123);
  {
    /* Q4_K/Q5_K go to the batched kernel (4352 columns: more superblocks than one chunk); Q6_K
     * and Q8_0 take the blocked kern_matmul loop */
    const uint32_t bt[] = {FLOE_TYPE_Q4_K, FLOE_TYPE_Q5_K, FLOE_TYPE_Q6_K, FLOE_TYPE_Q8_0};
    const int64_t bshape[][3] = {{37, 2048, 70}, {19, 4352, 33}, {130, 512, 17}};
    for (int ti = 0; ti < 4; ti++)
      for (int si = 0; si < 3; si++) {
        const int64_t rows = bshape[si][0], cols = bshape[si][1], nb = bshape[si][2];
        tcase c = make(bt[ti], rows, cols, (int)nb, 0);
        const int64_t ldy = rows + 5;
        float *Y = malloc(sizeof(float) * (size_t)(nb * ldy)), *Y1 = malloc(sizeof(float) * (size_t)(nb * ldy));
        for (int64_t i = 0; i < nb * ldy; i++) Y[i] = Y1[i] = -7.0f;
        kern_matmul_batch(&c.W, nb, c.X, cols, c.xq, c.ab, Y, ldy, 1, rows);
        for (int64_t b = 0; b < nb; b++) kern_matmul(&c.W, 1, c.X + b * cols, cols, c.xq + (size_t)b * c.ab, c.ab, Y1 + b * ldy, ldy, 1, rows);
        int64_t bad = 0;
        for (int64_t i = 0; i < nb * ldy; i++) bad += memcmp(&Y[i], &Y1[i], 4) != 0;
        CHECK(bad == 0, "type %u %lldx%lld nb %lld rows [1, %lld): %lld outputs differ from nb = 1", bt[ti], (long long)rows,
              (long long)cols, (long long)nb, (long long)rows, (long long)bad);
        free(Y);
        free(Y1);
        drop(&c);
      }
  }
  SECTION("rows in the lanes, 1..8 activation rows (decode of several requests): against the scalar reference");
  floe_rng_seed(&rng, 4711);
  for (int ti = 0; ti < 2; ti++) {
    /* saturated (every code, scale and min at its maximum, activations +-127: the int16 bound of the
     * packed lane sums, both signs) and random; awkward row counts (a masked last block) and ranges;
     * 16640 columns: 65 superblocks, past what lanes_few forms its bsum pairs for once (LF_NSB) */
    const int64_t pshape[][2] = {{16, 256}, {33, 2048}, {50, 4352}, {21, 768}, {47, 1280}, {17, 16640}, {100, 512}};
    for (size_t si = 0; si < sizeof pshape / sizeof pshape[0]; si++)
      for (int extreme = 0; extreme < 2; extreme++) {
        const int64_t rows = pshape[si][0], cols = pshape[si][1], ldy = rows + 3;
        const int NB = 8;
        tcase c = make(types[ti], rows, cols, NB, extreme);
        floe_mat WL = c.W;
        uint8_t *ld = malloc(c.W.row_bytes * (size_t)rows);
        memcpy(ld, c.data, c.W.row_bytes * (size_t)rows);
        WL.data = ld;
        kern_k4_lanes_pack(&WL, ld);
        float *Y = malloc(sizeof(float) * (size_t)(NB * ldy)), *Yr = malloc(sizeof(float) * (size_t)(NB * ldy));
        /* whole pairs of blocks (kernels_internal.h k4l_sb), a range from a pair's second block, and
         * one ending inside a pair's first */
        const int64_t ranges[][2] = {{0, rows}, {1, rows - 2}, {rows - 5, rows}, {16, rows}, {0, 20}};
        int64_t bad = 0;
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++)
          for (int nb = 1; nb <= NB; nb++) {
            const int64_t r0 = ranges[ri][0], r1 = ranges[ri][1];
            if (r1 <= r0 || r1 > rows) continue;
            for (int64_t i = 0; i < NB * ldy; i++) Y[i] = Yr[i] = -7.0f;
            kern_matmul(&WL, nb, c.X, cols, c.xq, c.ab, Y, ldy, r0, r1);
            int prev = kern_isa_set(FLOE_ISA_SCALAR);
            for (int b = 0; b < nb; b++) kern_matmul(&c.W, 1, NULL, 0, c.xq + (size_t)b * c.ab, c.ab, Yr + b * ldy, ldy, r0, r1);
            kern_isa_set(prev);
            for (int64_t i = 0; i < NB * ldy; i++) bad += memcmp(&Y[i], &Yr[i], 4) != 0;
          }
        CHECK(bad == 0, "%s %lldx%lld%s lanes, nb 1..%d, 5 row ranges: %lld outputs differ from the scalar reference",
              tname[ti], (long long)rows, (long long)cols, extreme ? " saturated" : "", NB, (long long)bad);
        free(Y);
        free(Yr);
        free(ld);
        drop(&c);
      }
  }

  SECTION("rows in the lanes (kern_k4_lanes_pack): every path against the file's layout, bit for bit");
  floe_rng_seed(&rng, 31337);
  for (int ti = 0; ti < 2; ti++) {
    const int64_t lshape[][2] = {{16, 256}, {37, 1280}, {70, 512}, {48, 4352}, {21, 2048}, {100, 768}, {5, 768}};
    for (size_t si = 0; si < sizeof lshape / sizeof lshape[0]; si++) {
      const int64_t rows = lshape[si][0], cols = lshape[si][1], ldy = rows + 3;
      const int NB = 19;
      tcase c = make(types[ti], rows, cols, NB, rows == 5);
      floe_mat WL = c.W;
      uint8_t *ld = malloc(c.W.row_bytes * (size_t)rows);
      memcpy(ld, c.data, c.W.row_bytes * (size_t)rows);
      WL.data = ld;
      const int ok = kern_k4_lanes_ok(&WL);
      CHECK(ok == (rows >= 16), "%s %lldx%lld: kern_k4_lanes_ok %d", tname[ti], (long long)rows, (long long)cols, ok);
      if (!ok) {
        free(ld);
        drop(&c);
        continue;
      }
      kern_k4_lanes_pack(&WL, ld);
      /* the packed bytes are a permutation: rows come back whole, and at least one block moved */
      uint8_t *row = malloc(c.W.row_bytes);
      int64_t badrow = 0;
      for (int64_t r = 0; r < rows; r++) {
        kern_k4_lanes_row(&WL, r, row);
        badrow += memcmp(row, kw_row(&c.W, r), c.W.row_bytes) != 0;
      }
      CHECK(WL.k4_lanes && badrow == 0 && memcmp(ld, c.data, c.W.row_bytes * 16) != 0,
            "%s %lldx%lld: %lld rows not recovered by kern_k4_lanes_row", tname[ti], (long long)rows, (long long)cols,
            (long long)badrow);
      free(row);
      float *Y = malloc(sizeof(float) * (size_t)(NB * ldy)), *Y1 = malloc(sizeof(float) * (size_t)(NB * ldy));
      const int64_t ranges[][2] = {{0, rows}, {1, rows - 1}, {rows - 3, rows}, {5, 9}, {16, rows}, {0, 20}, {33, rows}};
      int64_t bad = 0, nbad = 0;
      for (int isa = FLOE_ISA_AVX512; isa >= FLOE_ISA_SCALAR; isa--) {
        if (kern_isa_set(isa) < 0) continue;
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
          const int64_t r0 = ranges[ri][0], r1 = ranges[ri][1];
          if (r1 <= r0 || r1 > rows) continue;
          for (int nb = 1; nb <= NB; nb += isa == FLOE_ISA_AVX512 ? 1 : 6) {
            for (int fl = 0; fl < 2; fl++) { /* the quantized path, then the float path (xq NULL) */
              if (fl && (isa != FLOE_ISA_AVX512 || nb > 3)) continue;
              for (int64_t i = 0; i < NB * ldy; i++) Y[i] = Y1[i] = -7.0f;
              const uint8_t *xq = fl ? NULL : c.xq;
              if (nb <= 16) kern_matmul(&WL, nb, c.X, cols, xq, c.ab, Y, ldy, r0, r1);
              else kern_matmul_batch(&WL, nb, c.X, cols, xq, c.ab, Y, ldy, r0, r1);
              kern_matmul_batch(&c.W, nb, c.X, cols, xq, c.ab, Y1, ldy, r0, r1);
              int64_t d = 0;
              for (int64_t i = 0; i < NB * ldy; i++) d += memcmp(&Y[i], &Y1[i], 4) != 0;
              bad += d;
              nbad += d != 0;
            }
          }
        }
      }
      kern_isa_set(FLOE_ISA_AVX512);
      CHECK(bad == 0, "%s %lldx%lld%s: %lld outputs differ from the file's layout in %lld calls (AVX-512, AVX2, scalar; "
            "nb 1..%d; 7 row ranges; quantized and float paths)", tname[ti], (long long)rows, (long long)cols,
            rows == 5 ? " saturated" : "", (long long)bad, (long long)nbad, NB);
      free(Y);
      free(Y1);
      free(ld);
      drop(&c);
    }
  }
  return TEST_DONE();
}
