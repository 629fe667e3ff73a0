/* Shared by the tests that compare floe with HF reference fixtures (test_model_hf, test_llama_gguf,
 * test_model_speed, test_model_quant, test_model_mlx, test_default_model): reading a reference
 * (meta.json and logits.bin, the format of tools/reference/make_fixtures.py), running tokens
 * through a fresh session, and the references of quantized models.
 *
 * A quantized GGUF (Q8_0, Q4_K) of a model is compared against HF run on the dequantized
 * weights. The dequantized weights are made here, on the CPU, with floe's own
 * quantizers (byte-exact with ggml) and dequantizers, as HF-layout safetensors directories (F32,
 * the HF fixture's names and shapes), and HF transformers is run on them on the GPU machine
 * (tools/reference/make_fixtures.py --from-dir). The references live in
 * tests/fixtures/models/<name>/ref_<q>/{logits.bin, meta.json}; the weights themselves are not
 * stored: the tests re-quantize the HF fixture (deterministic) and compare.
 *
 *  - q8_0 / q4_k: every HF tensor is rounded through the type `floe convert --type T` gives its GGUF
 *    tensor (convert.h): vectors, norms, the router, conv1d and the shared-expert gate stay F32;
 *    other matrices take T, falling back as llama-quantize does when T's block does not divide the
 *    row (q4_K -> q5_0, then F16; q8_0 -> F16). Quantization is per row, so row permutations of the
 *    conversion (qkvz split, V-head reorder of rows) commute with it; Qwen3.5's out_proj is
 *    quantized in llama.cpp's tiled column order (its blocks straddle value heads), so it is
 *    permuted to tiled, rounded, and permuted back.
 *  - mlx4: the MLX fixture made by convert_make_mlx_fixture (mlx-lm -q: 4 bits, group 64, 8 bits for
 *    mlp.gate / shared_expert_gate) mapped back to HF names: quantized modules dequantized, switch_mlp
 *    slabs split per expert, bf16(1+w) norms turned back into (1+w)-1 for HF's zero-centred norms.
 */
#ifndef FLOE_TEST_MODEL_REF_UTIL_H
#define FLOE_TEST_MODEL_REF_UTIL_H
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "format/st_writer.h"
#include "model/model.h"
#include "quant/quant.h"
#include "test.h"

static inline int ru_copy_file(const char *from, const char *to) {
  size_t n;
  char *b = test_read_all(from, &n);
  if (!b) return -1;
  FILE *f = fopen(to, "wb");
  int rc = f && fwrite(b, 1, n, f) == n ? 0 : -1;
  if (f) fclose(f);
  free(b);
  return rc;
}

static inline bool ru_ends(const char *s, const char *sfx) {
  size_t a = strlen(s), b = strlen(sfx);
  return a >= b && !strcmp(s + a - b, sfx);
}

/* floats of `count` elements of a F32/F16/BF16 tensor starting at element e0 (malloc'ed) */
static inline float *ru_floats(const st_tensor *t, int64_t e0, int64_t count) {
  uint32_t ty = t->dtype == ST_BF16 ? FLOE_TYPE_BF16 : t->dtype == ST_F16 ? FLOE_TYPE_F16 : FLOE_TYPE_F32;
  if (t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F32) return NULL;
  size_t es = st_dtype_size(t->dtype);
  void *tmp = malloc((size_t)count * es + 1);
  float *v = malloc((size_t)count * sizeof(float) + 1);
  memcpy(tmp, t->data + (size_t)e0 * es, (size_t)count * es);
  quant_dequant_row(ty, tmp, v, count);
  free(tmp);
  return v;
}

/* GGUF type floe convert gives the tensor behind HF tensor `name` for --type type (see above);
 * -1: stored F32. */
static inline int ru_gguf_type(const char *name, const st_tensor *t, int type) {
  if (t->n_dims < 2 || ru_ends(name, ".mlp.gate.weight") || ru_ends(name, "shared_expert_gate.weight") ||
      strstr(name, "conv1d"))
    return -1;
  int64_t cols = t->shape[t->n_dims - 1];
  int ty = type;
  if (cols % floe_type_info((uint32_t)ty)->blck) ty = ty == FLOE_TYPE_Q4_K ? FLOE_TYPE_Q5_0 : FLOE_TYPE_F16;
  if (cols % floe_type_info((uint32_t)ty)->blck) ty = FLOE_TYPE_F16;
  return ty;
}

static inline void ru_roundtrip_row(int ty, float *x, int64_t n) {
  size_t rb = floe_row_bytes((uint32_t)ty, n);
  void *q = malloc(rb + 16);
  quant_quantize_row((uint32_t)ty, x, q, n, NULL);
  quant_dequant_row((uint32_t)ty, q, x, n);
  free(q);
}

/* tiled position p of Nv heads takes grouped head (p % Nk) * r + p / Nk */
static inline int64_t ru_vsrc(int64_t p, int64_t Nk, int64_t Nv) { return (p % Nk) * (Nv / Nk) + p / Nk; }

static inline int ru_write_dir_begin(const char *hf_dir, const char *out_dir, st_writer **w) {
  char a[1100], b[1100], err[256];
  mkdir(out_dir, 0755);
  snprintf(a, sizeof a, "%s/config.json", hf_dir);
  snprintf(b, sizeof b, "%s/config.json", out_dir);
  if (ru_copy_file(a, b)) return -1;
  snprintf(b, sizeof b, "%s/model.safetensors", out_dir);
  if (st_writer_open(b, w, err, sizeof err)) {
    printf("st_writer: %s\n", err);
    return -1;
  }
  return 0;
}

/* HF dir -> out_dir with every tensor rounded through its GGUF type for --type `type`. */
static inline int ru_make_gguf_deq(const char *hf_dir, const char *out_dir, int type) {
  char err[256];
  hf_config cfg;
  st_model *st = NULL;
  st_writer *w = NULL;
  if (hf_config_load(hf_dir, &cfg, err, sizeof err) || st_model_open(hf_dir, &st, err, sizeof err)) {
    printf("%s: %s\n", hf_dir, err);
    return -1;
  }
  const floe_hparams *hp = &cfg.hp;
  int rc = ru_write_dir_begin(hf_dir, out_dir, &w);
  for (size_t i = 0; i < st_count(st) && !rc; i++) {
    const st_tensor *t = st_tensor_at(st, i);
    float *v = ru_floats(t, 0, t->n_elements);
    if (!v) { rc = -1; break; }
    int ty = ru_gguf_type(t->name, t, type);
    if (ty >= 0) {
      const int64_t cols = t->shape[t->n_dims - 1], rows = t->n_elements / cols;
      const bool tiled = hp->arch == FLOE_ARCH_QWEN35MOE && ru_ends(t->name, "linear_attn.out_proj.weight") &&
                         hp->ssm_n_group != hp->ssm_dt_rank;
      const int64_t Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dv = Nv ? hp->ssm_d_inner / Nv : 0;
      float *row = malloc((size_t)cols * sizeof(float));
      for (int64_t r = 0; r < rows; r++) {
        float *x = v + r * cols;
        if (tiled) {
          for (int64_t p = 0; p < Nv; p++) memcpy(row + p * dv, x + ru_vsrc(p, Nk, Nv) * dv, (size_t)dv * 4);
          ru_roundtrip_row(ty, row, cols);
          for (int64_t p = 0; p < Nv; p++) memcpy(x + ru_vsrc(p, Nk, Nv) * dv, row + p * dv, (size_t)dv * 4);
        } else {
          ru_roundtrip_row(ty, x, cols);
        }
      }
      free(row);
    }
    rc = st_writer_add(w, t->name, ST_F32, t->n_dims, t->shape, v, err, sizeof err);
    free(v);
  }
  if (rc) st_writer_abort(w);
  else rc = st_writer_finish(w, err, sizeof err);
  if (rc) printf("%s: %s\n", out_dir, err);
  st_model_close(st);
  hf_config_free(&cfg);
  return rc;
}

/* MLX dir (made from hf_dir by convert_make_mlx_fixture) -> HF-named F32 dir of its dequantized
 * weights. */
static inline int ru_make_mlx_deq(const char *hf_dir, const char *mlx_dir, const char *out_dir) {
  char err[256];
  hf_config cfg, mcfg;
  st_model *st = NULL, *ms = NULL;
  st_writer *w = NULL;
  if (hf_config_load(hf_dir, &cfg, err, sizeof err) || hf_config_load(mlx_dir, &mcfg, err, sizeof err) ||
      st_model_open(hf_dir, &st, err, sizeof err) || st_model_open(mlx_dir, &ms, err, sizeof err)) {
    printf("%s: %s\n", mlx_dir, err);
    return -1;
  }
  const bool q35 = cfg.hp.arch == FLOE_ARCH_QWEN35MOE;
  int rc = ru_write_dir_begin(hf_dir, out_dir, &w);
  for (size_t i = 0; i < st_count(st) && !rc; i++) {
    const st_tensor *t = st_tensor_at(st, i);
    char mn[512], base[512], sn[600], bn[600];
    long long L = -1, E = -1;
    char proj[32] = "";
    int64_t slab = 0;
    if (sscanf(t->name, "model.layers.%lld.mlp.experts.%lld.%31[a-z_].weight", &L, &E, proj) == 3) {
      snprintf(mn, sizeof mn, "%smodel.layers.%lld.mlp.switch_mlp.%s.weight", q35 ? "language_model." : "", L, proj);
      slab = E;
    } else {
      snprintf(mn, sizeof mn, "%s%s", q35 ? "language_model." : "", t->name);
    }
    snprintf(base, sizeof base, "%.*s", (int)(strlen(mn) - (ru_ends(mn, ".weight") ? 7 : 0)), mn);
    snprintf(sn, sizeof sn, "%s.scales", base);
    snprintf(bn, sizeof bn, "%s.biases", base);
    const st_tensor *q = st_find(ms, mn), *sc = st_find(ms, sn), *bi = st_find(ms, bn);
    if (!q) { printf("mlx: %s missing\n", mn); rc = -1; break; }
    const int64_t cols = t->shape[t->n_dims - 1], rows = t->n_elements / cols;
    float *v = NULL;
    if (sc && bi) {
      int bits, group;
      bool quantized;
      hf_quant_for(&mcfg.quant, base, &bits, &group, &quantized);
      quant_mlx_fmt f = { bits, group, sc->dtype == ST_BF16 ? FLOE_TYPE_BF16 : sc->dtype == ST_F16 ? FLOE_TYPE_F16 : FLOE_TYPE_F32 };
      const size_t qrb = quant_mlx_row_bytes(&f, cols), se = st_dtype_size(sc->dtype), srb = (size_t)(cols / group) * se;
      if (!quantized || q->nbytes < (size_t)((slab + 1) * rows) * qrb || sc->nbytes < (size_t)((slab + 1) * rows) * srb) {
        printf("mlx: %s: unexpected quantization\n", mn);
        rc = -1;
        break;
      }
      v = malloc((size_t)t->n_elements * sizeof(float));
      uint8_t *qb = malloc(qrb), *sb = malloc(srb), *bb = malloc(srb);
      for (int64_t r = 0; r < rows; r++) {
        const int64_t R = slab * rows + r;
        memcpy(qb, q->data + (size_t)R * qrb, qrb);
        memcpy(sb, sc->data + (size_t)R * srb, srb);
        memcpy(bb, bi->data + (size_t)R * srb, srb);
        quant_mlx_dequant_row(&f, qb, sb, bb, v + r * cols, cols);
      }
      free(qb); free(sb); free(bb);
    } else {
      v = ru_floats(q, slab * t->n_elements, t->n_elements);
    }
    if (!v) { rc = -1; break; }
    static const char *const zc[] = { ".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                                      ".q_norm.weight", ".k_norm.weight" };
    for (size_t k = 0; k < 5; k++)
      if (ru_ends(t->name, zc[k]) && t->n_dims == 1)
        for (int64_t j = 0; j < t->n_elements; j++) v[j] -= 1.0f; /* HF adds the 1 back: exact */
    rc = st_writer_add(w, t->name, ST_F32, t->n_dims, t->shape, v, err, sizeof err);
    free(v);
  }
  if (rc) st_writer_abort(w);
  else rc = st_writer_finish(w, err, sizeof err);
  if (rc) printf("%s: %s\n", out_dir, err);
  st_model_close(st);
  st_model_close(ms);
  hf_config_free(&cfg);
  hf_config_free(&mcfg);
  return rc;
}

/* ---- comparing a floe model with a stored reference (same format as the HF fixtures) ---- */
static inline int ru_argmax(const float *x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return (int)b;
}

/* A stored reference: meta.json (parsed) and logits.bin (`bytes` bytes of floats: every prompt's
 * rows, prompt after prompt). */
typedef struct ru_ref {
  char *js;
  cJSON *meta;
  float *logits;
  size_t bytes;
} ru_ref;

/* Reads dir/meta.json and dir/logits.bin; 0 when both are there and the JSON parses. Whatever was
 * read is kept for ru_ref_free either way. */
static inline int ru_ref_load(const char *dir, ru_ref *r) {
  char path[1200];
  memset(r, 0, sizeof *r);
  snprintf(path, sizeof path, "%s/meta.json", dir);
  r->js = test_read_all(path, NULL);
  snprintf(path, sizeof path, "%s/logits.bin", dir);
  r->logits = (float *)test_read_all(path, &r->bytes);
  r->meta = r->js ? cJSON_Parse(r->js) : NULL;
  return r->meta && r->logits ? 0 : -1;
}

static inline void ru_ref_free(ru_ref *r) {
  cJSON_Delete(r->meta);
  free(r->js);
  free(r->logits);
  memset(r, 0, sizeof *r);
}

/* Prompt p of r's meta.json ("prompts"): its T tokens then HF's G greedy ones (malloc'ed), and
 * off, where its [T + G][V] logits start in r->logits. NULL when those logits are not all in the
 * file (or out of memory). */
static inline int32_t *ru_ref_prompt(const ru_ref *r, const cJSON *p, int64_t V, int64_t *T, int64_t *G,
                                     int64_t *off) {
  const cJSON *jt = cJSON_GetObjectItem(p, "tokens"), *jg = cJSON_GetObjectItem(p, "greedy");
  *T = cJSON_GetArraySize(jt);
  *G = cJSON_GetArraySize(jg);
  *off = (int64_t)cJSON_GetObjectItem(p, "logits_offset")->valuedouble;
  const int64_t n = *T + *G;
  if ((size_t)(*off + n * V) * 4 > r->bytes) return NULL;
  int32_t *tok = malloc((size_t)n * sizeof *tok);
  if (!tok) return NULL;
  for (int64_t i = 0; i < *T; i++) tok[i] = cJSON_GetArrayItem(jt, (int)i)->valueint;
  for (int64_t i = 0; i < *G; i++) tok[*T + i] = cJSON_GetArrayItem(jg, (int)i)->valueint;
  return tok;
}

/* tok[0..n) through a fresh session of m (`threads` threads, kv: enum kv_type, exact: see
 * model_session_set_exact; false is a new session's default) in chunks of `chunk` tokens (0: all
 * at once); every position's logits into out [n][V]. The context, 1024, holds more than one
 * internal batch (test_model_speed crosses a MODEL_MAX_BATCH boundary). */
static inline int ru_run(const model *m, const int32_t *tok, int64_t n, int64_t chunk, int threads, int kv, bool exact,
                         float *out) {
  char err[256];
  model_session *s;
  const int64_t V = m->hp.n_vocab;
  if (model_session_new(m, 1024, kv, threads, &s, err, sizeof err)) {
    printf("session: %s\n", err);
    return -1;
  }
  model_session_set_exact(s, exact);
  if (chunk <= 0) chunk = n;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t c = n - i < chunk ? n - i : chunk;
    if (model_eval(s, tok + i, c, out + i * V, true, err, sizeof err)) {
      printf("eval: %s\n", err);
      model_session_free(s);
      return -1;
    }
  }
  model_session_free(s);
  return 0;
}

typedef struct ru_result {
  double max_abs;      /* max |floe - HF| over every logit */
  double mean_abs;     /* mean |floe - HF| */
  int64_t n_pos, argmax_same;
  int64_t greedy_match, greedy_n; /* greedy decode (floe's own tokens) vs HF's, first divergence */
  double margin_at_div;           /* HF's top-2 margin where the tokens diverged (0 when none) */
  int rc;
} ru_result;

/* Runs every reference prompt through m (one batch: prompt + HF's continuation), and a greedy
 * decode of the prompt. kv: enum kv_type. exact: the exact float path (model_session_set_exact),
 * else the quantized-activation speed path. */
static inline void ru_compare(const model *m, const char *ref_dir, int kv, bool exact, ru_result *res) {
  char err[256];
  memset(res, 0, sizeof *res);
  ru_ref rf;
  const int lrc = ru_ref_load(ref_dir, &rf);
  const float *ref = rf.logits;
  res->rc = -1;
  if (lrc) goto done;
  const int64_t V = m->hp.n_vocab;
  cJSON *p;
  cJSON_ArrayForEach(p, cJSON_GetObjectItem(rf.meta, "prompts")) {
    int64_t T, G, off;
    int32_t *tok = ru_ref_prompt(&rf, p, V, &T, &G, &off);
    if (!tok) goto done;
    const int64_t n = T + G;
    float *lg = malloc((size_t)(n * V) * 4);
    model_session *s;
    if (model_session_new(m, 512, kv, 1, &s, err, sizeof err)) {
      printf("session: %s\n", err);
      goto done;
    }
    model_session_set_exact(s, exact);
    if (model_eval(s, tok, n, lg, true, err, sizeof err)) {
      printf("eval: %s\n", err);
      goto done;
    }
    for (int64_t i = 0; i < n * V; i++) {
      const double d = fabs((double)lg[i] - (double)ref[off + i]);
      res->max_abs = fmax(res->max_abs, isnan(d) ? INFINITY : d);
      res->mean_abs += d;
    }
    for (int64_t i = 0; i < n; i++) res->argmax_same += ru_argmax(lg + i * V, V) == ru_argmax(ref + off + i * V, V);
    res->n_pos += n;
    /* greedy: prompt, then floe's own argmax one token at a time */
    model_session_reset(s);
    float *l1 = malloc((size_t)V * 4);
    int rc = model_eval(s, tok, T, l1, false, err, sizeof err);
    int64_t i = 0;
    for (; i < G && rc == 0; i++) {
      int32_t t = ru_argmax(l1, V);
      if (t != tok[T + i]) {
        const float *r = ref + off + (T - 1 + i) * V;
        int a = ru_argmax(r, V);
        float second = -INFINITY;
        for (int64_t k = 0; k < V; k++)
          if (k != a && r[k] > second) second = r[k];
        res->margin_at_div = r[a] - second;
        break;
      }
      rc = model_eval(s, &t, 1, l1, false, err, sizeof err);
    }
    res->greedy_match += i;
    res->greedy_n += G;
    free(l1);
    model_session_free(s);
    free(lg);
    free(tok);
  }
  if (res->n_pos > 0) res->mean_abs /= (double)(res->n_pos * m->hp.n_vocab);
  res->rc = 0;
done:
  ru_ref_free(&rf);
}
/* m (quantized, label e.g. "qwen3next q4_k") against HF on the dequantized weights in ref: the
 * exact float path within abs_tol with equal argmax and greedy tokens (or HF's own top-2 margin
 * below `margin` where they diverge); the quantized-activation path (8-bit activations, kernels.h:
 * ~1e-2 relative per matmul) only bounded in mean (act_mean_tol): on these tiny random models a
 * router choice or a near-tie flips. */
static inline void ru_check_vs_hf(const model *m, const char *label, const char *ref, double abs_tol, double margin,
                                  double act_mean_tol) {
  ru_result r;
  ru_compare(m, ref, KV_F32, true, &r);
  printf("  %s: max|logit - HF(deq)| = %.3g over %lld positions; argmax equal %lld/%lld; greedy %lld/%lld\n", label,
         r.max_abs, (long long)r.n_pos, (long long)r.argmax_same, (long long)r.n_pos, (long long)r.greedy_match,
         (long long)r.greedy_n);
  CHECK(r.rc == 0 && r.n_pos > 0, "%s: reference %s readable", label, ref);
  CHECK(r.max_abs <= abs_tol, "%s: exact float path within %.0e of HF (got %.3g)", label, abs_tol, r.max_abs);
  CHECK(r.argmax_same == r.n_pos, "%s: argmax equal at every position (%lld/%lld)", label, (long long)r.argmax_same,
        (long long)r.n_pos);
  CHECK(r.greedy_match == r.greedy_n || r.margin_at_div < margin,
        "%s: greedy tokens equal to HF's (%lld/%lld; HF margin at the first difference %.3g)", label,
        (long long)r.greedy_match, (long long)r.greedy_n, r.margin_at_div);
  ru_compare(m, ref, KV_F32, false, &r);
  printf("  %s quantized activations: max %.3g, mean %.3g; argmax equal %lld/%lld; greedy %lld/%lld\n", label,
         r.max_abs, r.mean_abs, (long long)r.argmax_same, (long long)r.n_pos, (long long)r.greedy_match,
         (long long)r.greedy_n);
  CHECK(r.rc == 0 && r.mean_abs <= act_mean_tol, "%s: quantized-activation path mean |d| %.3g <= %.2g", label,
        r.mean_abs, act_mean_tol);
}
#endif
