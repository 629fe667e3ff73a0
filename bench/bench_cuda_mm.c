/* Speed of the CUDA matmul layer (src/kernels/cuda/cuda_mm.h) on decode shapes.
 *
 * First the device copy bandwidth (cudaMemcpy device to device of 1 GiB, bytes read + written),
 * then each kernel: the weight bytes one launch reads, microseconds per launch and GB/s, and the
 * GB/s as a fraction of the copy bandwidth. Weights rotate over enough copies (>= 256 MB in all,
 * well past the 50 MB L2) that every launch reads its matrix from HBM; expert launches draw their
 * 8 experts from a stack of 128 (ids from device memory, a new set per launch). Times: CUDA events
 * around groups of GROUP back-to-back launches, the median of REPS groups.
 * One line per kernel:  kernel shape type nb  bytes  us/launch  GB/s  %copy
 * Usage: bench_cuda_mm [reps]   (no device: prints "skipped: no CUDA device", exit 77)
 * FLOE_CUDA_MM_Q16=warp|lanes forces one implementation of the 16-lane types (default: by shape). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda_mm.h"
#include "kernels/cuda/cuda_rt.h"

#define GROUP 20
#define ROT_BYTES ((size_t)256 << 20)

static char err[256];
static int REPS = 25;
static void *ev0, *ev1;
static double copy_gbs;

static void die(const char *what) {
  fprintf(stderr, "bench_cuda_mm: %s: %s\n", what, err);
  exit(1);
}

static void *dmalloc(size_t n) {
  void *p;
  if (cuda_rt_malloc(&p, n, err, sizeof err)) die("malloc");
  return p;
}

static int cmp_f(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* median over REPS groups of the time per call of fn(ctx, i) (GROUP calls per group), in us */
static double time_us(void (*fn)(void *ctx, int i), void *ctx) {
  float *t = malloc(sizeof(float) * (size_t)REPS);
  int it = 0;
  for (int w = 0; w < GROUP; w++) fn(ctx, it++); /* warm up */
  for (int r = 0; r < REPS; r++) {
    cuda_rt_event_record(ev0, NULL);
    for (int k = 0; k < GROUP; k++) fn(ctx, it++);
    cuda_rt_event_record(ev1, NULL);
    if (cuda_rt_event_sync(ev1, err, sizeof err) || cuda_rt_event_ms(ev0, ev1, &t[r], err, sizeof err)) die("timing");
  }
  if (cuda_rt_check("bench", err, sizeof err)) die("launch");
  qsort(t, (size_t)REPS, sizeof *t, cmp_f);
  const double us = 1e3 * t[REPS / 2] / GROUP;
  free(t);
  return us;
}

static void report(const char *kernel, const char *shape, const char *type, int nb, double bytes, double us) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  printf("%-14s %-16s %-7s nb=%-3d %10.2f MB %9.2f us %8.1f GB/s %5.1f %%copy\n", kernel, shape, type, nb, bytes / 1e6, us,
         gbs, 100.0 * gbs / copy_gbs);
  fflush(stdout);
}

/* ---- copy bandwidth ---- */
typedef struct { void *a, *b; size_t n; } copy_ctx;
static void copy_fn(void *c_, int i) {
  copy_ctx *c = c_;
  (void)i;
  cuda_rt_d2d_async(c->b, c->a, c->n, NULL);
}

/* ---- weights on the device, in rotating copies ---- */
typedef struct {
  cuda_mat M[64];
  int ncopy;
  size_t bytes; /* of one copy */
  void *mem;
} dweights;

static dweights upload(uint32_t type, int64_t rows, int64_t cols, int nexp) {
  dweights w;
  memset(&w, 0, sizeof w);
  const floe_type_traits *tt = floe_type_info(type);
  const size_t rb = floe_row_bytes(type, cols);
  w.bytes = rb * (size_t)rows * (size_t)nexp;
  w.ncopy = (int)((ROT_BYTES + w.bytes - 1) / w.bytes);
  if (w.ncopy > 64) w.ncopy = 64;
  if (w.ncopy < 1) w.ncopy = 1;
  uint8_t *h = malloc(w.bytes);
  floe_rng rng;
  floe_rng_seed(&rng, 42);
  quant_fill_random(type, &rng, h, (int64_t)(w.bytes / (size_t)tt->bytes), 0.05f);
  const size_t stride = (w.bytes + 255) & ~(size_t)255;
  w.mem = dmalloc(stride * (size_t)w.ncopy);
  for (int c = 0; c < w.ncopy; c++) {
    if (cuda_rt_h2d((uint8_t *)w.mem + stride * (size_t)c, h, w.bytes, err, sizeof err)) die("upload");
    cuda_mat *M = &w.M[c];
    memset(M, 0, sizeof *M);
    M->type = type;
    M->rows = rows;
    M->cols = cols;
    M->data = (uint8_t *)w.mem + stride * (size_t)c;
    M->row_bytes = rb;
    M->n_expert = nexp;
    M->expert_stride = rb * (size_t)rows;
  }
  free(h);
  return w;
}

typedef struct {
  dweights *w, *w2;
  int64_t nb;
  const float *X;
  void *xq;
  size_t xs;
  float *Y;
  const int32_t *ids; /* NIDS sets of K ids */
  int K;
} mm_ctx;
#define NIDS 64

static void mm_fn(void *c_, int i) {
  mm_ctx *c = c_;
  const cuda_mat *M = &c->w->M[i % c->w->ncopy];
  cuda_mm_matmul(M, c->nb, c->X, M->cols, c->xq, c->xs, c->Y, M->rows, NULL);
}
static void act_fn(void *c_, int i) {
  mm_ctx *c = c_;
  (void)i;
  cuda_mm_act_quantize(&c->w->M[0], c->nb, c->X, c->w->M[0].cols, c->xq, c->xs, NULL);
}
static void glu_fn(void *c_, int i) {
  mm_ctx *c = c_;
  const int k = i % c->w->ncopy;
  cuda_mm_moe_gate_up(&c->w->M[k], &c->w2->M[k], 1, c->K, c->ids + (i % NIDS) * c->K, c->X, c->w->M[0].cols, c->xq,
                      c->xs, c->Y, c->w->M[0].rows, NULL);
}
static void down_fn(void *c_, int i) {
  mm_ctx *c = c_;
  const cuda_mat *M = &c->w->M[i % c->w->ncopy];
  cuda_mm_moe_down(M, 1, c->K, c->ids + (i % NIDS) * c->K, c->X, M->cols, c->xq, c->xs, c->Y, M->rows, NULL);
}

static void bench_matmul(uint32_t type, int64_t rows, int64_t cols, int nb, const float *dX, void *dxq, float *dY) {
  dweights w = upload(type, rows, cols, 1);
  const size_t xs = cuda_mm_act_bytes(&w.M[0]);
  if (xs) cuda_mm_act_quantize(&w.M[0], nb, dX, cols, dxq, xs, NULL);
  mm_ctx c = {&w, NULL, nb, dX, xs ? dxq : NULL, xs, dY, NULL, 1};
  char shape[32];
  snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
  report(xs ? "matmul_q" : "matmul_f", shape, floe_type_info(type)->name, nb, (double)w.bytes, time_us(mm_fn, &c));
  if (nb == 1 && xs) report("act_quantize", shape, floe_type_info(type)->name, 1, (double)cols * 4 + (double)xs,
                            time_us(act_fn, &c));
  cuda_rt_free(w.mem);
}

int main(int argc, char **argv) {
  if (argc > 1) REPS = atoi(argv[1]) > 2 ? atoi(argv[1]) : 3;
  if (cuda_rt_device_count() == 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  if (cuda_rt_init(0, err, sizeof err) || cuda_mm_init(err, sizeof err)) die("init");
  const char *impl = getenv("FLOE_CUDA_MM_Q16");
  if (impl) cuda_mm_set_q16_impl(strcmp(impl, "warp") == 0 ? CUDA_MM_Q16_WARP : strcmp(impl, "lanes") == 0 ? CUDA_MM_Q16_LANES : CUDA_MM_Q16_AUTO);
  char name[128];
  cuda_rt_device_name(0, name, sizeof name, err, sizeof err);
  printf("device: %s, L2 %.0f MB, reps %d x %d launches\n", name, cuda_rt_l2_bytes(0) / 1e6, REPS, GROUP);
  if (cuda_rt_event_create(&ev0, err, sizeof err) || cuda_rt_event_create(&ev1, err, sizeof err)) die("events");

  copy_ctx cc = {dmalloc((size_t)1 << 30), dmalloc((size_t)1 << 30), (size_t)1 << 30};
  copy_gbs = 1;
  const double cus = time_us(copy_fn, &cc);
  copy_gbs = 2.0 * (double)cc.n / (cus * 1e-6) / 1e9;
  printf("%-14s %-16s %-7s %-6s %10.2f MB %9.2f us %8.1f GB/s (read + written)\n", "copy_d2d", "1 GiB", "-", "", 2.0 * cc.n / 1e6,
         cus, copy_gbs);
  cuda_rt_free(cc.a);
  cuda_rt_free(cc.b);

  /* activations: 16 rows of up to 8192 values; quantized rows; outputs up to 248320 x 16 */
  const int64_t xmax = 8192, ymax = 248320 * 16;
  float *hx = malloc(sizeof(float) * (size_t)(xmax * 16));
  floe_rng rng;
  floe_rng_seed(&rng, 1);
  for (int64_t i = 0; i < xmax * 16; i++) hx[i] = floe_rng_normal(&rng);
  float *dX = dmalloc(sizeof(float) * (size_t)(xmax * 16));
  if (cuda_rt_h2d(dX, hx, sizeof(float) * (size_t)(xmax * 16), err, sizeof err)) die("upload x");
  void *dxq = dmalloc((size_t)16 << 20);
  float *dY = dmalloc(sizeof(float) * (size_t)ymax);

  static const uint32_t types[] = {FLOE_TYPE_Q4_K, FLOE_TYPE_Q6_K, FLOE_TYPE_Q8_0};
  static const int64_t shapes[][2] = {{248320, 2048}, {8192, 2048}, {2048, 4096}};
  for (int s = 0; s < 3; s++)
    for (int t = 0; t < 3; t++) bench_matmul(types[t], shapes[s][0], shapes[s][1], 1, dX, dxq, dY);
  /* batched rows: the weights are read once per launch */
  for (int t = 0; t < 3; t++) {
    bench_matmul(types[t], 8192, 2048, 4, dX, dxq, dY);
    bench_matmul(types[t], 8192, 2048, 16, dX, dxq, dY);
  }
  /* the other 16-lane types and a float-path type, one shape */
  bench_matmul(FLOE_TYPE_Q5_K, 8192, 2048, 1, dX, dxq, dY);
  bench_matmul(FLOE_TYPE_IQ4_XS, 8192, 2048, 1, dX, dxq, dY);
  bench_matmul(FLOE_TYPE_MXFP4, 8192, 2048, 1, dX, dxq, dY);
  bench_matmul(FLOE_TYPE_Q3_K, 8192, 2048, 1, dX, dxq, dY);
  bench_matmul(FLOE_TYPE_BF16, 8192, 2048, 1, dX, dxq, dY);

  /* experts: 8 of 128 per launch, Q4_K, gate+up 512 x 2048 and down 2048 x 512 */
  const int K = 8, NE = 128;
  int32_t hid[NIDS * 8];
  for (int i = 0; i < NIDS; i++)
    for (int j = 0; j < K; j++) {
      int e, dup;
      do {
        e = (int)(floe_rng_u64(&rng) % NE);
        dup = 0;
        for (int u = 0; u < j; u++) dup |= hid[i * K + u] == e;
      } while (dup);
      hid[i * K + j] = e;
    }
  int32_t *dids = dmalloc(sizeof hid);
  if (cuda_rt_h2d(dids, hid, sizeof hid, err, sizeof err)) die("ids");
  static const uint32_t etypes[] = {FLOE_TYPE_Q4_K, FLOE_TYPE_Q6_K, FLOE_TYPE_Q8_0};
  for (int t = 0; t < 3; t++) {
    dweights g = upload(etypes[t], 512, 2048, NE), u = upload(etypes[t], 512, 2048, NE);
    const size_t xs = cuda_mm_act_bytes(&g.M[0]);
    cuda_mm_act_quantize(&g.M[0], 1, dX, 2048, dxq, xs, NULL);
    mm_ctx c = {&g, &u, 1, dX, dxq, xs, dY, dids, K};
    const double per_expert = (double)g.bytes / NE;
    report("moe_gate_up", "8x(2x512x2048)", floe_type_info(etypes[t])->name, 1, 2 * K * per_expert, time_us(glu_fn, &c));
    cuda_rt_free(g.mem);
    cuda_rt_free(u.mem);
    dweights d = upload(etypes[t], 2048, 512, NE);
    const size_t xsd = cuda_mm_act_bytes(&d.M[0]);
    mm_ctx cd = {&d, NULL, 1, dX, dxq, xsd, dY, dids, K};
    report("moe_down+q", "8x(2048x512)", floe_type_info(etypes[t])->name, 1, K * (double)d.bytes / NE, time_us(down_fn, &cd));
    cuda_rt_free(d.mem);
  }
  if (cuda_rt_check("bench", err, sizeof err)) die("launch");
  cuda_rt_free(dids);
  cuda_rt_free(dX);
  cuda_rt_free(dxq);
  cuda_rt_free(dY);
  free(hx);
  return 0;
}
