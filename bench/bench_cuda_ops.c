/* Times each CUDA op of cuda_ops.h at the Qwen3.5-35B-A3B shapes (n_embd 2048, 16 q / 2 kv heads,
 * head_dim 256, n_rot 64, gated; GDN Nk 16, Nv 32, dk = dv 128, K 4; 256 experts top-8; vocab
 * 248320) with CUDA events around REPS back-to-back launches; prints microseconds per launch,
 * one line per op. Attention decode at KV lengths 1, 8K, 32K, 128K (bf16 cache), and a 512-row
 * prefill chunk at depth 0, 32K, 128K with both prefill kernels and the tensor-core kernel
 * (k_attn_tc, also at each decode shape). Inputs are zeros or small constants (the timing does not
 * depend on the values).
 * `bench_cuda_ops attn KV SPLIT HB`: only one decode attention shape, on random K / V (attn_only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_rt.h"
#include "quant/quant.h"

#define REPS 200

static void *zdev(size_t n) {
  void *p = NULL;
  char err[256];
  if (cuda_rt_malloc(&p, n, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  cuda_rt_memset_async(p, 0, n, NULL);
  return p;
}
static void h2d(void *d, const void *h, size_t n) {
  char err[256];
  if (cuda_rt_h2d(d, h, n, err, sizeof err)) fprintf(stderr, "%s\n", err);
}

static void *ev0, *ev1;
#define TIME(label, reps, call)                                                          \
  do {                                                                                   \
    call;                                                                                \
    cuda_rt_event_record(ev0, NULL);                                                     \
    for (int r_ = 0; r_ < (reps); r_++) call;                                            \
    cuda_rt_event_record(ev1, NULL);                                                     \
    float ms_ = 0.0f;                                                                    \
    char e_[256];                                                                        \
    if (cuda_rt_device_sync(e_, sizeof e_) || cuda_rt_event_ms(ev0, ev1, &ms_, e_, sizeof e_)) \
      printf("%-44s ERROR %s\n", label, e_);                                            \
    else printf("%-44s %9.2f us\n", label, 1000.0 * ms_ / (reps));                      \
    fflush(stdout);                                                                      \
  } while (0)

/* bench_cuda_ops attn KV SPLIT HB: only the decode attention at KV positions (bf16 cache), SPLIT
 * parts, at most HB heads a block (0: k_attn_rows, the prefill kernel, for the one row): 5 launches, then 20 timed (for a profiler: ncu -k regex:k_attn
 * --launch-skip 5 --launch-count 1) */
static int attn_only(int64_t kv, int split, int hb) {
  const int64_t nctx = kv + 16;
  cuda_attn_shape sh = { 16, 2, 256, 64, 1, 1, nctx, 1e-6f, split };
  char err[256];
  if (cuda_attn_check(&sh, err, sizeof err)) {
    printf("%s\n", err);
    return 1;
  }
  if (hb > 0) cuda_attn_set_hb(hb);
  else cuda_attn_set_rows(1); /* HB 0: the prefill row-group kernel for the one row */
  const size_t cb = (size_t)2 * nctx * 256 * 2;
  /* random bf16 K / V in [-1, 1) (the timing should not ride on zeros) */
  uint16_t *h = malloc(cb);
  uint64_t st = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < cb / 2; i++) {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    const float f = (float)(int32_t)(st >> 40) / 8388608.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    h[i] = (uint16_t)(u >> 16);
  }
  void *kc = zdev(cb), *vc = zdev(cb);
  h2d(kc, h, cb);
  h2d(vc, h, cb);
  free(h);
  float *q = zdev(16 * 512 * 4), *ao = zdev(16 * 256 * 4);
  int32_t *pos = zdev(4);
  const int32_t p = (int32_t)kv - 1;
  h2d(pos, &p, 4);
  void *scr = zdev(cuda_attn_scratch_bytes(&sh, 1));
  for (int i = 0; i < 5; i++) cuda_attn(&sh, q, kc, vc, pos, 1, ao, scr, NULL);
  char lab[96];
  snprintf(lab, sizeof lab, "attn decode bf16 kv %lld split %d %s %d%s", (long long)kv, split, hb ? "hb" : "rows", hb,
           cuda_attn_mma() ? " (tensor cores)" : "");
  TIME(lab, 20, cuda_attn(&sh, q, kc, vc, pos, 1, ao, scr, NULL));
  return 0;
}

int main(int argc, char **argv) {
  if (cuda_rt_device_count() <= 0) {
    printf("skipped: no CUDA device\n");
    return 0;
  }
  char name[256], err[256];
  if (cuda_rt_init(0, err, sizeof err) || cuda_rt_device_name(0, name, sizeof name, err, sizeof err)) {
    printf("%s\n", err);
    return 1;
  }
  printf("device: %s, %d launches per figure\n", name, REPS);
  if (cuda_rt_event_create(&ev0, err, sizeof err) || cuda_rt_event_create(&ev1, err, sizeof err)) {
    printf("%s\n", err);
    return 1;
  }
  if (argc >= 5 && strcmp(argv[1], "attn") == 0) return attn_only(atoll(argv[2]), atoi(argv[3]), atoi(argv[4]));
  const int E = 2048, NE = 256, K = 8, I = 512, V = 248320;

  /* norms */
  float *x = zdev(E * 4), *d = zdev(E * 4), *w = zdev(E * 4), *y = zdev(E * 4);
  TIME("rmsnorm 1x2048", REPS, cuda_rmsnorm(x, w, y, 1, E, 1e-6f, NULL));
  TIME("add_rmsnorm 1x2048", REPS, cuda_add_rmsnorm(x, d, w, y, 1, E, 1e-6f, NULL));
  float *x512 = zdev(512 * E * 4), *y512 = zdev(512 * E * 4);
  TIME("rmsnorm 512x2048 (prefill)", 50, cuda_rmsnorm(x512, w, y512, 512, E, 1e-6f, NULL));

  /* attention */
  const int64_t ctxs[4] = { 1, 8192, 32768, 131072 };
  const int splits[3] = { 66, 64, 128 }; /* 66: cuda_attn_split_hint for 132 SMs at this shape */
  const int64_t nctx = 131072 + 16;
  cuda_attn_shape sh = { 16, 2, 256, 64, 1, 1, nctx, 1e-6f, 64 };
  const size_t cb = (size_t)2 * nctx * 256 * 2;
  void *kc = zdev(cb), *vc = zdev(cb);
  float *cs = zdev((size_t)nctx * 64 * 4);
  float *q = zdev(512 * 16 * 512 * 4), *kk = zdev(512 * 512 * 4), *vv = zdev(512 * 512 * 4);
  float *qn = zdev(256 * 4), *kn = zdev(256 * 4), *ao = zdev(512 * 16 * 256 * 4);
  int32_t *pos = zdev(4);
  if (cuda_attn_check(&sh, err, sizeof err)) {
    printf("%s\n", err);
    return 1;
  }
  printf("attn split hint for 132 SMs: %d; floor of a decode = K+V bytes / 4.3 TB/s: kv 128K bf16 %.1f us\n",
         cuda_attn_split_hint(&sh, 132), 2.0 * 2 * 256 * 131072 * 2 / 4.3e6);
  cuda_attn_shape sh128 = sh;
  sh128.n_split = 128;
  void *scr = zdev(cuda_attn_scratch_bytes(&sh128, 512));
  TIME("attn_prep decode (q/k norm, rope, kv write)", REPS, cuda_attn_prep(&sh, q, kk, vv, qn, kn, cs, kc, vc, pos, 1, NULL));
  cuda_attn_set_mma(0); /* the lines below name the kernels; "tensor cores": k_attn_tc */
  for (int s = 0; s < 3; s++) {
    sh.n_split = splits[s];
    for (int c = 0; c < 4; c++) {
      const int32_t p = (int32_t)ctxs[c] - 1;
      h2d(pos, &p, 4);
      char lab[96];
      snprintf(lab, sizeof lab, "attn decode bf16 kv %lld split %d", (long long)ctxs[c], splits[s]);
      TIME(lab, 100, cuda_attn(&sh, q, kc, vc, pos, 1, ao, scr, NULL));
      cuda_attn_set_mma(1); /* the tensor-core order (k_attn_tc) */
      snprintf(lab, sizeof lab, "attn decode bf16 kv %lld split %d tensor cores", (long long)ctxs[c], splits[s]);
      TIME(lab, 100, cuda_attn(&sh, q, kc, vc, pos, 1, ao, scr, NULL));
      cuda_attn_set_mma(0);
    }
  }
  /* the head batches of a block: 4 and 2 heads (head_dim 256) run two blocks per SM */
  for (int hb = 4; hb >= 2; hb /= 2) {
    cuda_attn_set_hb(hb);
    for (int s = 1; s < 3; s++) {
      sh.n_split = splits[s];
      for (int c = 1; c < 4; c++) {
        const int32_t p = (int32_t)ctxs[c] - 1;
        h2d(pos, &p, 4);
        char lab[96];
        snprintf(lab, sizeof lab, "attn decode bf16 kv %lld split %d hb %d", (long long)ctxs[c], splits[s], hb);
        TIME(lab, 100, cuda_attn(&sh, q, kc, vc, pos, 1, ao, scr, NULL));
      }
    }
  }
  cuda_attn_set_hb(8);
  sh.kv_bf16 = 0;
  sh.n_split = 64;
  void *kc32 = zdev(cb * 2), *vc32 = zdev(cb * 2);
  for (int c = 0; c < 4; c++) {
    const int32_t p = (int32_t)ctxs[c] - 1;
    h2d(pos, &p, 4);
    char lab[96];
    snprintf(lab, sizeof lab, "attn decode f32 kv %lld split 64", (long long)ctxs[c]);
    TIME(lab, 100, cuda_attn(&sh, q, kc32, vc32, pos, 1, ao, scr, NULL));
  }
  sh.kv_bf16 = 1;
  {
    const int32_t p = 32768 - 128;
    h2d(pos, &p, 4);
    cuda_attn_set_rows(0);
    TIME("attn prefill 128 rows at kv 32K bf16 split 64", 5, cuda_attn(&sh, q, kc, vc, pos, 128, ao, scr, NULL));
    const int32_t p0 = 0;
    h2d(pos, &p0, 4);
    TIME("attn_prep prefill 512 rows", 20, cuda_attn_prep(&sh, q, kk, vv, qn, kn, cs, kc, vc, pos, 512, NULL));
  }
  /* one 512-row prefill chunk at depth D (row t sees D + t + 1 positions), with a session's split
   * count (n_ctx / 512, 8..128): the row-group kernel in one launch, then k_attn in 32 launches of
   * 16 rows (the backend's loop before it). Floors: 16 heads x (256 + 256) fmaf per (row, position)
   * at the FP32 rate (33.5 T fmaf/s), and the K/V bytes (2 KiB a position) read once per row
   * (k_attn) or once per block of 2 rows (k_attn_rows, 8 heads x 2 rows a block) at 4.3 TB/s. */
  {
    int32_t pv[512];
    int32_t *dpv = zdev(512 * 4);
    const int64_t depths[3] = { 0, 32768, 131072 - 512 };
    const int nsp[3] = { 8, 64, 128 };
    for (int di = 0; di < 3; di++) {
      for (int t = 0; t < 512; t++) pv[t] = (int32_t)(depths[di] + t);
      h2d(dpv, pv, sizeof pv);
      sh.n_split = nsp[di];
      const double pairs = 512.0 * (double)depths[di] + 512.0 * 513.0 / 2.0;
      printf("chunk at depth %lld: %.3g G fmaf -> %.0f us at the FP32 rate; K/V bytes per row %.0f us, per 2 rows %.0f us\n",
             (long long)depths[di], pairs * 8192.0 / 1e9, pairs * 8192.0 / 33.5e6, pairs * 2048.0 / 4.3e6,
             pairs * 1024.0 / 4.3e6);
      char lab[96];
      const int reps = di ? 2 : 10;
      cuda_attn_set_rows(1);
      snprintf(lab, sizeof lab, "attn chunk 512 rows depth %lld rows kernel", (long long)depths[di]);
      TIME(lab, reps, cuda_attn(&sh, q, kc, vc, dpv, 512, ao, scr, NULL));
      cuda_attn_set_mma(1);
      snprintf(lab, sizeof lab, "attn chunk 512 rows depth %lld tensor cores", (long long)depths[di]);
      TIME(lab, reps, cuda_attn(&sh, q, kc, vc, dpv, 512, ao, scr, NULL));
      cuda_attn_set_mma(0);
      cuda_attn_set_rows(0);
      snprintf(lab, sizeof lab, "attn chunk 512 rows depth %lld k_attn x32", (long long)depths[di]);
      TIME(lab, reps, for (int t0 = 0; t0 < 512; t0 += 16) cuda_attn(&sh, q + t0 * 16 * 512, kc, vc, dpv + t0, 16,
                                                                     ao + t0 * 16 * 256, scr, NULL));
    }
    sh.n_split = 64;
  }

  /* GDN */
  cuda_gdn_shape g = { 16, 32, 128, 128, 4, 1, 1e-6f, 0 };
  const int C = 2 * 16 * 128 + 32 * 128, vd = 32 * 128;
  float *mix = zdev(512 * C * 4), *wt = zdev(4 * C * 4), *cst = zdev(3 * C * 4), *raw = zdev(512 * C * 4);
  float *z = zdev(512 * vd * 4), *b = zdev(512 * 32 * 4), *a = zdev(512 * 32 * 4), *dtb = zdev(32 * 4), *A = zdev(32 * 4);
  float *nw = zdev(128 * 4), *S = zdev((size_t)32 * 128 * 128 * 4), *o = zdev(512 * vd * 4);
  TIME("gdn_conv decode", REPS, cuda_gdn_conv(&g, mix, wt, cst, raw, 1, NULL));
  TIME("gdn_recur decode", REPS, cuda_gdn_recur(&g, raw, z, b, a, dtb, A, nw, S, o, 1, NULL));
  TIME("gdn_conv prefill 512", 20, cuda_gdn_conv(&g, mix, wt, cst, raw, 512, NULL));
  TIME("gdn_recur prefill 512", 20, cuda_gdn_recur(&g, raw, z, b, a, dtb, A, nw, S, o, 512, NULL));

  /* MoE */
  float *lg = zdev(512 * NE * 4), *sw = zdev(512 * K * 4), *ey = zdev((size_t)512 * K * E * 4), *she = zdev(512 * E * 4);
  float *shl = zdev(512 * 4), *h = zdev(512 * E * 4), *gg = zdev(K * I * 4), *uu = zdev(K * I * 4);
  int32_t *sel = zdev(512 * K * 4);
  TIME("moe_route 1 token 256 experts top-8", REPS, cuda_moe_route(lg, 1, NE, K, 1, sel, sw, NULL));
  TIME("moe_route 512 tokens", 20, cuda_moe_route(lg, 512, NE, K, 1, sel, sw, NULL));
  TIME("moe_combine 1 token K 8 + shared + norm", REPS, cuda_moe_combine(x, ey, sw, K, she, shl, w, h, 1e-6f, 1, E, NULL));
  TIME("moe_combine 512 tokens", 20, cuda_moe_combine(x512, ey, sw, K, she, shl, w, h, 1e-6f, 512, E, NULL));
  TIME("silu_glu 8x512 (+ shared 512)", REPS, cuda_silu_glu(gg, uu, K * I + I, NULL));

  /* embedding, argmax */
  const size_t rb = floe_row_bytes(FLOE_TYPE_Q4_K, E);
  void *tab = zdev(rb * 1024);
  int32_t *tok = zdev(512 * 4);
  float *eo = zdev(512 * E * 4);
  TIME("embed 1 row q4_K 2048", REPS, cuda_embed_rows(FLOE_TYPE_Q4_K, tab, rb, 1024, E, tok, 1, eo, NULL));
  TIME("embed 512 rows q4_K", 20, cuda_embed_rows(FLOE_TYPE_Q4_K, tab, rb, 1024, E, tok, 512, eo, NULL));
  float *logits = zdev((size_t)V * 4);
  void *ascr = zdev(cuda_argmax_scratch_bytes(V));
  TIME("argmax 248320", REPS, cuda_argmax(logits, V, tok, ascr, NULL));
  return 0;
}
