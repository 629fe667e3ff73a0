/* MLX quantized directories loaded directly (model_load on tests/fixtures/mlx/<name>, made from the
 * HF fixtures by convert_make_mlx_fixture as `mlx_lm.convert -q` would: 4 bits, group 64, router and
 * shared-expert gate 8 bits, the 16/32/96-wide matrices left dense).
 *
 *  1. logits vs HF transformers run on the MLX-dequantized weights (models/<name>/ref_mlx4, see
 *     tests/model_ref_util.h): exact float path, ABS_TOL 2e-4 (as test_model_hf.c: floe and HF
 *     compute on the same weight values), argmax equal everywhere, greedy tokens equal while HF's
 *     top-2 margin exceeds MARGIN;
 *  2. the MLX directory and `floe convert --type f32` of it (the dequantized weights in a GGUF)
 *     give bit-identical logits (same values, same arithmetic, qwen35moe's tiled V heads included);
 *  3. row-exactness: one batch == one token at a time, bit for bit;
 *  4. model_vtile_cols / model_vtile_rows on MLX matrices (group-aligned heads move as stored,
 *     others are dequantized to F32): the dequantized result equals the permuted dequantized input;
 *  5. a config.json whose bits disagree with the tensors is refused with a message. */
#include "model_ref_util.h"
#include "test.h"

#define ABS_TOL 2e-4
#define MARGIN 1e-3

static int run_all(const model *m, const int32_t *tok, int64_t n, int64_t chunk, float *out) {
  char err[256];
  model_session *s;
  if (model_session_new(m, 256, KV_F32, 1, &s, err, sizeof err)) return -1;
  model_session_set_exact(s, true);
  int rc = 0;
  for (int64_t i = 0; i < n && !rc; i += chunk) {
    int64_t c = n - i < chunk ? n - i : chunk;
    rc = model_eval(s, tok + i, c, out + i * m->hp.n_vocab, true, err, sizeof err);
  }
  model_session_free(s);
  return rc;
}

static void test_model(const char *name) {
  char dir[1024], ref[1024], out[1024], err[256];
  SECTION("%s: MLX directory", name);
  snprintf(dir, sizeof dir, "%s", test_fixture("mlx/"));
  strncat(dir, name, sizeof dir - strlen(dir) - 1);
  snprintf(ref, sizeof ref, "%s", test_fixture("models/"));
  strncat(ref, name, sizeof ref - strlen(ref) - 1);
  strncat(ref, "/ref_mlx4", sizeof ref - strlen(ref) - 1);
  model *m = NULL, *g = NULL;
  int rc = model_load(dir, &m, err, sizeof err);
  CHECK(rc == 0, "%s: load MLX directory: %s", name, rc ? err : "ok");
  if (rc) return;
  const model_layer *L0 = &m->layers[0];
  CHECK(m->src_mlx && m->tok_embd.type == FLOE_TYPE_MLX && m->output.type == FLOE_TYPE_MLX &&
            m->tok_embd.mlx.bits == 4 && m->tok_embd.mlx.group == 64,
        "%s: embedding and lm_head bound as MLX 4-bit, group 64", name);
  CHECK(L0->router.type == FLOE_TYPE_MLX && L0->router.mlx.bits == 8 && L0->sh_gate_inp.type == FLOE_TYPE_MLX &&
            L0->sh_gate_inp.mlx.bits == 8,
        "%s: router and shared-expert gate MLX 8-bit (per-module override)", name);
  CHECK(L0->exp_gate[3].type == FLOE_TYPE_MLX && L0->exp_down[3].type == FLOE_TYPE_BF16,
        "%s: switch_mlp gate quantized, 16-wide down_proj dense BF16", name);
  CHECK(L0->attn_norm[0] > 0.5f && L0->attn_norm[0] < 1.5f, "%s: norms hold 1+w (no second +1): %g", name,
        L0->attn_norm[0]);

  ru_check_vs_hf(m, name, ref, ABS_TOL, MARGIN, 0.15); /* speed path bound: as test_model_quant.c */

  /* 2 + 3 */
  snprintf(out, sizeof out, "%s", test_tmp(name));
  strncat(out, "_mlx_f32.gguf", sizeof out - strlen(out) - 1);
  convert_opts o = { .in_dir = dir, .out_path = out, .type = FLOE_TYPE_F32, .expert_type = -1, .n_threads = 1 };
  rc = convert_model(&o, NULL, err, sizeof err);
  if (!rc) rc = model_load(out, &g, err, sizeof err);
  CHECK(rc == 0, "%s: floe convert --type f32 of the MLX directory: %s", name, rc ? err : "ok");
  const int64_t V = m->hp.n_vocab, n = 70;
  int32_t tok[70];
  for (int i = 0; i < n; i++) tok[i] = (i * 53 + 7) % (int)V;
  float *a = malloc((size_t)(n * V) * 4), *b = malloc((size_t)(n * V) * 4), *c = malloc((size_t)(n * V) * 4);
  int rc1 = run_all(m, tok, n, n, a), rc3 = run_all(m, tok, n, 1, c);
  int64_t d2 = -1, d3 = 0;
  if (!rc) {
    rc = run_all(g, tok, n, n, b);
    d2 = 0;
    for (int64_t i = 0; i < n; i++) d2 += memcmp(a + i * V, b + i * V, (size_t)V * 4) != 0;
  }
  for (int64_t i = 0; i < n; i++) d3 += memcmp(a + i * V, c + i * V, (size_t)V * 4) != 0;
  CHECK(rc == 0 && rc1 == 0 && d2 == 0, "%s: MLX directory and its F32 GGUF bit-identical (%lld of %lld positions differ)",
        name, (long long)d2, (long long)n);
  CHECK(rc3 == 0 && d3 == 0, "%s: one token at a time bit-identical to one batch (%lld differ)", name, (long long)d3);
  free(a);
  free(b);
  free(c);
  model_free(g);
  model_free(m);
  remove(out);
}

/* 4: V-head reorder of MLX matrices */
static void test_vtile(void) {
  SECTION("model_vtile_* on MLX matrices");
  floe_rng rng;
  floe_rng_seed(&rng, 42);
  const int64_t Nk = 2, Nv = 4;
  const int units[2] = { 64, 24 }; /* 64: whole groups move; 24: heads split groups -> F32 */
  for (int u = 0; u < 2; u++) {
    const int64_t unit = units[u], cols = Nv * unit, rows = 8;
    quant_mlx_fmt f = { 4, unit == 64 ? 64 : 32, FLOE_TYPE_BF16 };
    const size_t rb = quant_mlx_row_bytes(&f, cols), srb = (size_t)(cols / f.group) * 2;
    uint8_t *q = calloc(rows, rb), *s = calloc(rows, srb), *bi = calloc(rows, srb);
    float *x = malloc((size_t)cols * 4), *ref = malloc((size_t)(rows * cols) * 4), *got = malloc((size_t)cols * 4);
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t j = 0; j < cols; j++) x[j] = floe_rng_uniform(&rng) - 0.5f;
      quant_mlx_quantize_row(&f, x, q + r * rb, s + r * srb, bi + r * srb, cols);
      quant_mlx_dequant_row(&f, q + r * rb, s + r * srb, bi + r * srb, ref + r * cols, cols);
    }
    model *m = calloc(1, sizeof *m);
    floe_mat W = { .type = FLOE_TYPE_MLX, .rows = rows, .cols = cols, .data = q, .row_bytes = rb, .mlx = f,
                   .scales = s, .biases = bi, .sb_row_bytes = srb };
    char err[256];
    int rc = model_vtile_cols(m, &W, Nk, Nv, unit, err, sizeof err);
    int64_t bad = 0;
    for (int64_t r = 0; r < rows && !rc; r++) {
      if (W.type == FLOE_TYPE_MLX)
        quant_mlx_dequant_row(&W.mlx, (const uint8_t *)W.data + r * W.row_bytes,
                              (const uint8_t *)W.scales + r * W.sb_row_bytes, (const uint8_t *)W.biases + r * W.sb_row_bytes,
                              got, cols);
      else
        memcpy(got, (const uint8_t *)W.data + r * W.row_bytes, (size_t)cols * 4);
      for (int64_t p = 0; p < Nv; p++)
        bad += memcmp(got + p * unit, ref + r * cols + ru_vsrc(p, Nk, Nv) * unit, (size_t)unit * 4) != 0;
    }
    CHECK(rc == 0 && bad == 0 && (W.type == FLOE_TYPE_MLX) == (unit % f.group == 0),
          "vtile_cols unit %lld group %d: %s, %lld heads wrong", (long long)unit, f.group,
          W.type == FLOE_TYPE_MLX ? "kept MLX" : "dequantized to F32", (long long)bad);
    /* rows: 4 heads of 1 row after 2 leading rows */
    floe_mat R = { .type = FLOE_TYPE_MLX, .rows = rows, .cols = cols, .data = q, .row_bytes = rb, .mlx = f,
                   .scales = s, .biases = bi, .sb_row_bytes = srb };
    rc = model_vtile_rows(m, &R, 2, Nk, Nv, 1, err, sizeof err);
    bad = 0;
    for (int64_t r = 0; r < rows && !rc; r++) {
      int64_t src = r >= 2 && r < 2 + Nv ? 2 + ru_vsrc(r - 2, Nk, Nv) : r;
      quant_mlx_dequant_row(&R.mlx, (const uint8_t *)R.data + r * R.row_bytes,
                            (const uint8_t *)R.scales + r * R.sb_row_bytes, (const uint8_t *)R.biases + r * R.sb_row_bytes,
                            got, cols);
      bad += memcmp(got, ref + src * cols, (size_t)cols * 4) != 0;
    }
    CHECK(rc == 0 && bad == 0, "vtile_rows on MLX (unit %lld): %lld rows wrong", (long long)unit, (long long)bad);
    model_free(m);
    free(q); free(s); free(bi); free(x); free(ref); free(got);
  }
}

/* 5: a config whose bits disagree with the tensors */
static void test_bad_config(void) {
  SECTION("MLX errors");
  char src[1024], dir[1024], path[1200], err[256];
  snprintf(src, sizeof src, "%s", test_fixture("mlx/qwen3next"));
  snprintf(dir, sizeof dir, "%s", test_tmp("mlx_bad_bits"));
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/config.json", src);
  char *js = test_read_all(path, NULL);
  cJSON *c = js ? cJSON_Parse(js) : NULL;
  if (!c) {
    CHECK(0, "read %s", path);
    free(js);
    return;
  }
  cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "quantization"), "bits"), 8);
  cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "quantization_config"), "bits"), 8);
  char *txt = cJSON_Print(c);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (f) { fputs(txt, f); fclose(f); }
  char a[1200], b[1200];
  snprintf(a, sizeof a, "%s/model.safetensors", src);
  snprintf(b, sizeof b, "%s/model.safetensors", dir);
  ru_copy_file(a, b);
  model *m = NULL;
  int rc = model_load(dir, &m, err, sizeof err);
  CHECK(rc < 0 && !m && strstr(err, "MLX"), "bits 8 declared for 4-bit tensors refused: %s", rc ? err : "loaded");
  model_free(m);
  free(txt);
  cJSON_Delete(c);
  free(js);
  remove(path);
  remove(b);
  rmdir(dir);
}

int main(void) {
  test_model("qwen3next");
  test_model("qwen35moe");
  test_vtile();
  test_bad_config();
  return TEST_DONE();
}
