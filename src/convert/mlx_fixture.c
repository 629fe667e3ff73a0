/* MLX test-fixture generator (convert_make_mlx_fixture, convert.h): an HF directory converted the
 * way `mlx_lm.convert -q --q-bits 4 --q-group-size 64` would, so floe convert's MLX path can be
 * tested without MLX. It follows mlx-lm (models/qwen3_next.py, qwen3_5.py, qwen3_5_moe.py sanitize;
 * utils.py quantize_model):
 *   - mtp.* dropped; Qwen3.5 keys moved under "language_model." (model.X -> language_model.model.X,
 *     lm_head -> language_model.lm_head);
 *   - experts stacked: experts.E.{gate,up,down}_proj.weight (or fused gate_up_proj / down_proj)
 *     -> switch_mlp.{gate,up,down}_proj.weight [E, out, in];
 *   - conv1d.weight [C, 1, K] -> [C, K, 1];
 *   - input/post_attention/final/q/k norm weights: w + 1 computed in the source dtype (MLX adds in
 *     bf16, so the stored value is bf16(w + 1));
 *   - every Linear / Embedding whose input size is a multiple of 64 quantized (MLX affine, group 64,
 *     4 bits; mlp.gate and mlp.shared_expert_gate 8 bits as the MoE quant_predicate asks), codes
 *     uint32, scales and biases in the source dtype; the others stay dense;
 *   - config.json gains "quantization" and "quantization_config" with the 8-bit overrides.
 * Deterministic: tensors are written sorted by name. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "convert/convert.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "format/st_writer.h"
#include "quant/quant.h"

#define GROUP 64

typedef struct fx {
  const st_model *st;
  st_writer *w;
  cJSON *quant;      /* the quantization object being built */
  bool q35;
  char *err;
  size_t errlen;
} fx;

static bool ends_with(const char *s, const char *sfx) {
  size_t a = strlen(s), b = strlen(sfx);
  return a >= b && !strcmp(s + a - b, sfx);
}

static uint32_t ty_of(int dtype) {
  return dtype == ST_BF16 ? FLOE_TYPE_BF16 : dtype == ST_F16 ? FLOE_TYPE_F16 : FLOE_TYPE_F32;
}

/* MLX name of an HF name (Qwen3.5 under language_model.). */
static void mlx_name(const fx *f, const char *hf, char *out, size_t n) {
  if (!f->q35) snprintf(out, n, "%s", hf);
  else if (!strncmp(hf, "model.language_model.", 21)) snprintf(out, n, "language_model.model.%s", hf + 21);
  else snprintf(out, n, "language_model.%s", hf);
}

/* Reads an HF tensor as floats (malloc'ed). */
static float *load_f(const st_tensor *t) {
  float *v = malloc((size_t)t->n_elements * sizeof(float) + 1);
  void *tmp = malloc((size_t)t->nbytes + 1);
  if (v && tmp) {
    memcpy(tmp, t->data, (size_t)t->nbytes);
    quant_dequant_row(ty_of(t->dtype), tmp, v, t->n_elements);
  }
  free(tmp);
  return v;
}

/* Writes a dense tensor from floats in dtype. */
static int put_dense(fx *f, const char *name, int dtype, int nd, const int64_t *shape, const float *v, int64_t n) {
  size_t es = st_dtype_size(dtype);
  uint8_t *buf = malloc((size_t)n * es + 1);
  if (!buf) return floe_err(f->err, f->errlen, FLOE_E_NOMEM, "out of memory");
  quant_quantize_row(ty_of(dtype), v, buf, n, NULL);
  int rc = st_writer_add(f->w, name, dtype, nd, shape, buf, f->err, f->errlen);
  free(buf);
  return rc;
}

/* A Linear/Embedding weight [.., out, in] (rows of `in` floats): quantized when in % 64 == 0. */
static int put_linear(fx *f, const char *name, int dtype, int nd, const int64_t *shape, const float *v) {
  const int64_t in = shape[nd - 1];
  int64_t rows = 1;
  for (int i = 0; i < nd - 1; i++) rows *= shape[i];
  if (in % GROUP) return put_dense(f, name, dtype, nd, shape, v, rows * in);
  char mod[512], nm[520];
  snprintf(mod, sizeof mod, "%.*s", (int)(strlen(name) - 7), name); /* without ".weight" */
  const bool eight = ends_with(mod, "mlp.gate") || ends_with(mod, "shared_expert_gate");
  quant_mlx_fmt fm = { eight ? 8 : 4, GROUP, ty_of(dtype) };
  if (eight) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "group_size", GROUP);
    cJSON_AddNumberToObject(o, "bits", 8);
    cJSON_AddItemToObject(f->quant, mod, o);
  }
  const size_t qb = quant_mlx_row_bytes(&fm, in), sbb = (size_t)(in / GROUP) * st_dtype_size(dtype);
  uint8_t *q = calloc((size_t)rows, qb), *s = calloc((size_t)rows, sbb), *b = calloc((size_t)rows, sbb);
  if (!q || !s || !b) {
    free(q), free(s), free(b);
    return floe_err(f->err, f->errlen, FLOE_E_NOMEM, "out of memory");
  }
  for (int64_t r = 0; r < rows; r++)
    quant_mlx_quantize_row(&fm, v + r * in, q + r * qb, s + r * sbb, b + r * sbb, in);
  int64_t qs[8], ss[8];
  for (int i = 0; i < nd; i++) qs[i] = ss[i] = shape[i];
  qs[nd - 1] = in * fm.bits / 32;
  ss[nd - 1] = in / GROUP;
  int rc = st_writer_add(f->w, name, ST_U32, nd, qs, q, f->err, f->errlen);
  snprintf(nm, sizeof nm, "%s.scales", mod);
  if (!rc) rc = st_writer_add(f->w, nm, dtype, nd, ss, s, f->err, f->errlen);
  snprintf(nm, sizeof nm, "%s.biases", mod);
  if (!rc) rc = st_writer_add(f->w, nm, dtype, nd, ss, b, f->err, f->errlen);
  free(q), free(s), free(b);
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Stacks the experts of one layer and projection into [E, out, in] and writes it quantized. */
static int put_experts(fx *f, const char *pfx, const char *proj, const hf_config *cfg) {
  const int64_t E = cfg->hp.n_expert, H = cfg->hp.n_embd, I = cfg->hp.n_ff_exp;
  const bool down = !strcmp(proj, "down");
  const int64_t out = down ? H : I, in = down ? I : H;
  float *v = malloc((size_t)(E * out * in) * sizeof(float));
  if (!v) return floe_err(f->err, f->errlen, FLOE_E_NOMEM, "out of memory");
  char nm[512], mn[512];
  int rc = 0;
  snprintf(nm, sizeof nm, "%smlp.experts.%s", pfx, down ? "down_proj" : "gate_up_proj");
  const st_tensor *fused = st_find(f->st, nm);
  int dtype = ST_F32;
  for (int64_t e = 0; e < E && !rc; e++) {
    const st_tensor *t;
    int64_t off = 0;
    if (fused) {
      t = fused;
      off = down ? e * H * I : (e * 2 * I + (!strcmp(proj, "up") ? I : 0)) * H;
    } else {
      snprintf(nm, sizeof nm, "%smlp.experts.%lld.%s_proj.weight", pfx, (long long)e, proj);
      t = st_find(f->st, nm);
    }
    if (!t) {
      rc = floe_err(f->err, f->errlen, FLOE_E_NOTFOUND, "fixture: tensor '%s' not found", nm);
      break;
    }
    float *x = load_f(t);
    if (!x) {
      rc = floe_err(f->err, f->errlen, FLOE_E_NOMEM, "out of memory");
      break;
    }
    memcpy(v + e * out * in, x + off, (size_t)(out * in) * sizeof(float));
    dtype = t->dtype;
    free(x);
  }
  if (!rc) {
    snprintf(nm, sizeof nm, "%smlp.switch_mlp.%s_proj.weight", pfx, proj);
    mlx_name(f, nm, mn, sizeof mn);
    int64_t shape[3] = { E, out, in };
    rc = put_linear(f, mn, dtype, 3, shape, v);
  }
  free(v);
  return rc;
}

int convert_make_mlx_fixture(const char *hf_dir, const char *out_dir, char *err, size_t errlen) {
  hf_config cfg;
  int rc = hf_config_load(hf_dir, &cfg, err, errlen);
  if (rc) return rc;
  st_model *st = NULL;
  char path[4096], cpath[4096];
  char **names = NULL;
  cJSON *root = NULL;
  char *json = NULL;
  fx f = { .q35 = cfg.hp.arch == FLOE_ARCH_QWEN35MOE, .err = err, .errlen = errlen };
  if ((rc = st_model_open(hf_dir, &st, err, errlen))) goto done;
  f.st = st;
  snprintf(cpath, sizeof cpath, "%s/config.json", hf_dir);
  if ((rc = floe_read_file(cpath, (size_t)64 << 20, &json, NULL, err, errlen))) goto done;
  root = cJSON_Parse(json);
  if (!root) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: not valid JSON", cpath);
    goto done;
  }
  f.quant = cJSON_CreateObject();
  cJSON_AddNumberToObject(f.quant, "group_size", GROUP);
  cJSON_AddNumberToObject(f.quant, "bits", 4);
  cJSON_AddStringToObject(f.quant, "mode", "affine");
  snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
  if ((rc = st_writer_open(path, &f.w, err, errlen))) goto done;
  if ((rc = st_writer_set_meta(f.w, "format", "mlx", err, errlen))) goto done;

  const size_t n = st_count(st);
  names = calloc(n + 1, sizeof *names);
  if (!names) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < n; i++) names[i] = (char *)st_tensor_at(st, i)->name;
  qsort(names, n, sizeof *names, cmp_str);
  static const char *const norm_keys[] = { ".input_layernorm.weight", ".post_attention_layernorm.weight",
                                           "model.norm.weight", ".q_norm.weight", ".k_norm.weight" };
  char mn[512];
  for (size_t i = 0; i < n && !rc; i++) {
    const st_tensor *t = st_find(st, names[i]);
    const char *nm = names[i];
    if (!strncmp(nm, "mtp.", 4) || strstr(nm, ".mtp.") || strstr(nm, "visual.")) continue;
    const char *ex = strstr(nm, "mlp.experts.");
    if (ex) { /* stacked once per layer, at its first expert tensor */
      char pfx[256];
      snprintf(pfx, sizeof pfx, "%.*s", (int)(ex - nm), nm);
      const bool first = ends_with(nm, "mlp.experts.0.down_proj.weight") || ends_with(nm, "mlp.experts.down_proj");
      if (first)
        for (int k = 0; k < 3 && !rc; k++) rc = put_experts(&f, pfx, k == 0 ? "gate" : k == 1 ? "up" : "down", &cfg);
      continue;
    }
    mlx_name(&f, nm, mn, sizeof mn);
    float *v = load_f(t);
    if (!v) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      break;
    }
    int64_t shape[ST_MAX_DIMS];
    for (int d = 0; d < t->n_dims; d++) shape[d] = t->shape[d];
    bool norm = false;
    for (size_t k = 0; k < sizeof norm_keys / sizeof norm_keys[0]; k++) norm |= ends_with(nm, norm_keys[k]);
    if (norm && t->n_dims == 1 && cfg.hp.arch != FLOE_ARCH_QWEN3MOE) {
      for (int64_t j = 0; j < t->n_elements; j++) { /* v + 1.0 in the source dtype */
        uint8_t tmp[4];
        float one = v[j] + 1.0f;
        quant_quantize_row(ty_of(t->dtype), &one, tmp, 1, NULL);
        quant_dequant_row(ty_of(t->dtype), tmp, &v[j], 1);
      }
      rc = put_dense(&f, mn, t->dtype, t->n_dims, shape, v, t->n_elements);
    } else if (strstr(nm, "conv1d.weight") && t->n_dims == 3 && t->shape[1] == 1) {
      shape[1] = t->shape[2];
      shape[2] = 1;
      rc = put_dense(&f, mn, t->dtype, 3, shape, v, t->n_elements);
    } else if (t->n_dims == 2 && (ends_with(nm, "_proj.weight") || ends_with(nm, "embed_tokens.weight") ||
                                  ends_with(nm, "lm_head.weight") || ends_with(nm, "mlp.gate.weight") ||
                                  ends_with(nm, "shared_expert_gate.weight"))) {
      rc = put_linear(&f, mn, t->dtype, 2, shape, v);
    } else {
      rc = put_dense(&f, mn, t->dtype, t->n_dims, shape, v, t->n_elements);
    }
    free(v);
  }
  if (rc) goto done;
  cJSON_AddItemToObject(root, "quantization_config", cJSON_Duplicate(f.quant, 1));
  cJSON_AddItemToObject(root, "quantization", f.quant);
  f.quant = NULL;
  rc = st_writer_finish(f.w, err, errlen);
  f.w = NULL;
  if (rc) goto done;
  char *txt = cJSON_Print(root);
  snprintf(path, sizeof path, "%s/config.json", out_dir);
  FILE *fp = txt ? fopen(path, "wb") : NULL;
  if (!fp || fputs(txt, fp) < 0 || fputc('\n', fp) < 0) rc = floe_err(err, errlen, FLOE_E_IO, "%s: cannot write", path);
  if (fp && fclose(fp) != 0 && !rc) rc = floe_err(err, errlen, FLOE_E_IO, "%s: cannot write", path);
  free(txt);
done:
  if (f.w) st_writer_abort(f.w);
  cJSON_Delete(f.quant);
  cJSON_Delete(root);
  free(json);
  free(names);
  if (st) st_model_close(st);
  hf_config_free(&cfg);
  return rc;
}
