/* HF / MLX config.json reader: see hf_config.h.
 *
 * Defaults are those of the transformers config classes (configuration_qwen3_moe.py,
 * configuration_qwen3_next.py, configuration_qwen3_5_moe.py); the layer pattern follows their
 * __post_init__: layer_types when given (legacy "mamba"/"attention" remapped), else layer i is
 * full attention iff (i+1) % full_attention_interval == 0. The MoE-vs-dense rule is
 * Qwen3MoeDecoderLayer's: layer i is sparse iff i not in mlp_only_layers and num_experts > 0 and
 * (i+1) % decoder_sparse_step == 0. */
#include "format/hf_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/model_meta.h"

typedef struct pctx {
  const char *name; /* file name for messages */
  const char *pre;  /* "" or "text_config." */
  char *err;
  size_t errlen;
} pctx;

static const cJSON *item(const cJSON *o, const char *key) {
  const cJSON *it = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
  return it && !cJSON_IsNull(it) ? it : NULL; /* null means "use the default", as in HF */
}

static bool is_int(const cJSON *it, int64_t *v) {
  if (!cJSON_IsNumber(it)) return false;
  double d = it->valuedouble;
  if (!(d >= -9007199254740991.0 && d <= 9007199254740991.0) || d != floor(d)) return false;
  *v = (int64_t)d;
  return true;
}

/* Integer field in [lo, hi], default def when absent or null. */
static int get_int(pctx *p, const cJSON *o, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
  const cJSON *it = item(o, key);
  int64_t v = def;
  if (it && !is_int(it, &v))
    return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: %s%s is not an integer", p->name, p->pre, key);
  if (v < lo || v > hi)
    return floe_err(p->err, p->errlen, FLOE_E_INVALID, "%s: %s%s is %lld, must be in [%lld, %lld]", p->name, p->pre,
                    key, (long long)v, (long long)lo, (long long)hi);
  *out = v;
  return 0;
}

/* Number field with lo < v <= hi. */
static int get_num(pctx *p, const cJSON *it, const char *key, double def, double lo, double hi, double *out) {
  double v = def;
  if (it && !cJSON_IsNumber(it))
    return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: %s%s is not a number", p->name, p->pre, key);
  if (it) v = it->valuedouble;
  if (!(v > lo && v <= hi))
    return floe_err(p->err, p->errlen, FLOE_E_INVALID, "%s: %s%s is %g, must be in (%g, %g]", p->name, p->pre, key, v,
                    lo, hi);
  *out = v;
  return 0;
}

static int get_bool(pctx *p, const cJSON *o, const char *key, bool def, bool *out) {
  const cJSON *it = item(o, key);
  if (!it) { *out = def; return 0; }
  if (!cJSON_IsBool(it))
    return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: %s%s is not true/false", p->name, p->pre, key);
  *out = cJSON_IsTrue(it);
  return 0;
}

/* ---- quantization ---- */

const char *hf_qmode_name(int mode) {
  switch (mode) {
  case HF_QMODE_AFFINE: return "affine";
  case HF_QMODE_MXFP4: return "mxfp4";
  case HF_QMODE_NVFP4: return "nvfp4";
  case HF_QMODE_MXFP8: return "mxfp8";
  default: return "?";
  }
}

static int qmode_from(pctx *p, const cJSON *it, int def, int *out) {
  if (!it) { *out = def; return 0; }
  if (!cJSON_IsString(it) || !it->valuestring)
    return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: quantization mode is not a string", p->name);
  for (int m = HF_QMODE_AFFINE; m <= HF_QMODE_MXFP8; m++)
    if (strcmp(it->valuestring, hf_qmode_name(m)) == 0) { *out = m; return 0; }
  char cb[64];
  return floe_err(p->err, p->errlen, FLOE_E_UNSUPPORTED, "%s: unknown quantization mode '%s'", p->name,
                  floe_show(cb, sizeof cb, it->valuestring));
}

static int cmp_over(const void *a, const void *b) {
  return strcmp(((const hf_quant_override *)a)->module, ((const hf_quant_override *)b)->module);
}

static int parse_quant(pctx *p, const cJSON *qj, hf_quant *q) {
  pctx qp = *p;
  qp.pre = "quantization.";
  char cb[256];
  if (!cJSON_IsObject(qj)) return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: quantization is not an object", p->name);
  const cJSON *qm = item(qj, "quant_method");
  if (qm) {
    /* An HF-side quantizer (fp8, gptq, awq, modelopt...): MLX never writes quant_method. */
    return floe_err(p->err, p->errlen, FLOE_E_UNSUPPORTED,
                    "%s: quantization_config quant_method '%s' is not supported (floe reads BF16/F16/F32 and MLX affine)",
                    p->name, cJSON_IsString(qm) && qm->valuestring ? floe_show(cb, sizeof cb, qm->valuestring) : "?");
  }
  int64_t v;
  int rc;
  q->present = true;
  if ((rc = qmode_from(&qp, item(qj, "mode"), HF_QMODE_AFFINE, &q->mode))) return rc;
  /* mlx defaults: affine 64/4; the fp modes fix their own group size */
  int64_t gdef = q->mode == HF_QMODE_NVFP4 ? 16 : q->mode == HF_QMODE_AFFINE ? 64 : 32;
  int64_t bdef = q->mode == HF_QMODE_MXFP8 ? 8 : 4;
  if ((rc = get_int(&qp, qj, "group_size", gdef, 1, 4096, &v))) return rc;
  q->group_size = (int)v;
  if ((rc = get_int(&qp, qj, "bits", bdef, 1, 8, &v))) return rc;
  q->bits = (int)v;
  size_t n = 0;
  for (const cJSON *e = qj->child; e; e = e->next)
    if (cJSON_IsObject(e) || cJSON_IsBool(e)) n++;
  q->over = calloc(n ? n : 1, sizeof *q->over);
  if (!q->over) return floe_err(p->err, p->errlen, FLOE_E_NOMEM, "%s: out of memory", p->name);
  for (const cJSON *e = qj->child; e; e = e->next) {
    if (!cJSON_IsObject(e) && !cJSON_IsBool(e)) continue; /* group_size, bits, mode, unknown scalars */
    hf_quant_override *o = &q->over[q->n_over];
    if (!(o->module = strdup(e->string))) return floe_err(p->err, p->errlen, FLOE_E_NOMEM, "%s: out of memory", p->name);
    q->n_over++;
    o->quantized = !cJSON_IsFalse(e);
    o->bits = q->bits;
    o->group_size = q->group_size;
    o->mode = q->mode;
    if (cJSON_IsObject(e)) {
      pctx op = *p;
      char pre[300];
      snprintf(pre, sizeof pre, "quantization['%s'].", floe_show(cb, sizeof cb, e->string));
      op.pre = pre;
      if ((rc = qmode_from(&op, item(e, "mode"), q->mode, &o->mode))) return rc;
      if ((rc = get_int(&op, e, "group_size", q->group_size, 1, 4096, &v))) return rc;
      o->group_size = (int)v;
      if ((rc = get_int(&op, e, "bits", q->bits, 1, 8, &v))) return rc;
      o->bits = (int)v;
    }
  }
  qsort(q->over, q->n_over, sizeof *q->over, cmp_over);
  for (size_t i = 1; i < q->n_over; i++)
    if (strcmp(q->over[i - 1].module, q->over[i].module) == 0)
      return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: quantization lists module '%s' twice", p->name,
                      floe_show(cb, sizeof cb, q->over[i].module));
  return 0;
}

int hf_quant_for(const hf_quant *q, const char *module_path, int *bits, int *group, bool *quantized) {
  *quantized = false;
  *bits = 0;
  *group = 0;
  if (!q || !q->present) return 0;
  int mode = q->mode, b = q->bits, g = q->group_size;
  bool quant = true;
  size_t lo = 0, hi = q->n_over;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(module_path, q->over[mid].module);
    if (c == 0) {
      const hf_quant_override *o = &q->over[mid];
      quant = o->quantized, mode = o->mode, b = o->bits, g = o->group_size;
      break;
    }
    if (c < 0) hi = mid; else lo = mid + 1;
  }
  if (!quant) return 0;
  *quantized = true;
  *bits = b;
  *group = g;
  if (mode != HF_QMODE_AFFINE) return FLOE_E_UNSUPPORTED;
  if (!(b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8)) return FLOE_E_UNSUPPORTED;
  if (!(g == 32 || g == 64 || g == 128)) return FLOE_E_UNSUPPORTED;
  return 0;
}

/* ---- rope ---- */

/* rope_parameters (transformers 5) or rope_scaling (4.x): may also be keyed by layer type. */
static const cJSON *rope_dict(const cJSON *o, const char *key) {
  const cJSON *r = item(o, key);
  if (!cJSON_IsObject(r)) return NULL;
  const cJSON *fa = item(r, "full_attention");
  return cJSON_IsObject(fa) ? fa : r;
}

/* First of o.key, o.rope_parameters.key, o.rope_scaling.key present. */
static const cJSON *rope_item(const cJSON *o, const char *key) {
  const cJSON *it = item(o, key);
  if (!it) it = item(rope_dict(o, "rope_parameters"), key);
  if (!it) it = item(rope_dict(o, "rope_scaling"), key);
  return it;
}

static int check_rope_type(pctx *p, const cJSON *o) {
  const char *dicts[2] = {"rope_parameters", "rope_scaling"};
  for (int k = 0; k < 2; k++) {
    const cJSON *r = rope_dict(o, dicts[k]);
    const cJSON *t = item(r, "rope_type");
    if (!t) t = item(r, "type");
    if (!t) continue;
    char cb[64];
    if (!cJSON_IsString(t) || !t->valuestring)
      return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: %s%s.rope_type is not a string", p->name, p->pre, dicts[k]);
    /* "mrope" is the Qwen2-VL spelling of the default rope with sections, a no-op for text */
    if (strcmp(t->valuestring, "default") && strcmp(t->valuestring, "mrope"))
      return floe_err(p->err, p->errlen, FLOE_E_UNSUPPORTED, "%s: rope type '%s' is not supported (only default RoPE)",
                      p->name, floe_show(cb, sizeof cb, t->valuestring));
  }
  return 0;
}

/* ---- token ids ---- */

static int get_token_ids(pctx *p, const cJSON *tc, const cJSON *root, hf_config *c) {
  int64_t v;
  const cJSON *it;
  c->bos_token_id = c->pad_token_id = -1;
  c->n_eos = 0;
  const char *keys[2] = {"bos_token_id", "pad_token_id"};
  int64_t *dst[2] = {&c->bos_token_id, &c->pad_token_id};
  for (int k = 0; k < 2; k++) {
    it = item(tc, keys[k]);
    if (!it) it = item(root, keys[k]);
    if (!it) continue;
    if (!is_int(it, &v) || v < 0 || v >= c->hp.n_vocab)
      return floe_err(p->err, p->errlen, FLOE_E_INVALID, "%s: %s is not a token id below vocab_size %lld", p->name,
                      keys[k], (long long)c->hp.n_vocab);
    *dst[k] = v;
  }
  it = item(tc, "eos_token_id");
  if (!it) it = item(root, "eos_token_id");
  if (!it) return 0;
  const cJSON *first = cJSON_IsArray(it) ? it->child : it;
  for (const cJSON *e = first; e; e = cJSON_IsArray(it) ? e->next : NULL) {
    if (c->n_eos == HF_MAX_EOS || !is_int(e, &v) || v < 0 || v >= c->hp.n_vocab)
      return floe_err(p->err, p->errlen, FLOE_E_INVALID,
                      "%s: eos_token_id must be up to %d token ids below vocab_size %lld", p->name, HF_MAX_EOS,
                      (long long)c->hp.n_vocab);
    c->eos_token_id[c->n_eos++] = v;
  }
  return 0;
}

/* ---- the text model ---- */

static int parse_text(pctx *p, const cJSON *tc, const cJSON *root, int arch, hf_config *c) {
  floe_hparams *h = &c->hp;
  int rc;
  int64_t v;
  bool hybrid = arch != FLOE_ARCH_QWEN3MOE;
  const int64_t BIG = (int64_t)1 << 30;
  h->arch = arch;
  /* class defaults: Qwen3MoeConfig / Qwen3NextConfig / Qwen3_5MoeTextConfig */
  int64_t d_vocab = arch == FLOE_ARCH_QWEN35MOE ? 248320 : 151936;
  int64_t d_layers = arch == FLOE_ARCH_QWEN3MOE ? 24 : arch == FLOE_ARCH_QWEN3NEXT ? 48 : 40;
  int64_t d_heads = arch == FLOE_ARCH_QWEN3MOE ? 32 : 16, d_kv = arch == FLOE_ARCH_QWEN3MOE ? 4 : 2;
  int64_t d_exp = arch == FLOE_ARCH_QWEN3MOE ? 128 : arch == FLOE_ARCH_QWEN3NEXT ? 512 : 256;
  int64_t d_topk = arch == FLOE_ARCH_QWEN3NEXT ? 10 : 8;
  int64_t d_ffe = arch == FLOE_ARCH_QWEN3MOE ? 768 : 512;

  if ((rc = get_int(p, tc, "vocab_size", d_vocab, 1, INT32_MAX, &h->n_vocab))) return rc;
  if ((rc = get_int(p, tc, "hidden_size", 2048, 1, 1 << 20, &h->n_embd))) return rc;
  if ((rc = get_int(p, tc, "num_hidden_layers", d_layers, 1, FLOE_MAX_LAYERS, &h->n_layer))) return rc;
  if ((rc = get_int(p, tc, "max_position_embeddings", 32768, 1, BIG, &h->n_ctx_train))) return rc;
  if ((rc = get_int(p, tc, "num_attention_heads", d_heads, 1, 4096, &h->n_head))) return rc;
  if ((rc = get_int(p, tc, "num_key_value_heads", d_kv, 1, 4096, &h->n_head_kv))) return rc;
  if (h->n_head % h->n_head_kv != 0)
    return floe_err(p->err, p->errlen, FLOE_E_INVALID,
                    "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", p->name,
                    (long long)h->n_head, (long long)h->n_head_kv);
  /* Qwen3MoeAttention: getattr(config, "head_dim", hidden_size // num_attention_heads) */
  int64_t d_hd = arch == FLOE_ARCH_QWEN3MOE ? h->n_embd / h->n_head : 256;
  if ((rc = get_int(p, tc, "head_dim", d_hd, 1, 4096, &h->head_dim))) return rc;
  double eps, theta, prf;
  if ((rc = get_num(p, item(tc, "rms_norm_eps"), "rms_norm_eps", 1e-6, 0.0, 0.1, &eps))) return rc;
  h->rms_eps = (float)eps;
  if ((rc = check_rope_type(p, tc))) return rc;
  if ((rc = get_num(p, rope_item(tc, "rope_theta"), "rope_theta", 10000.0, 0.0, 1e12, &theta))) return rc;
  h->rope_theta = (float)theta;
  if ((rc = get_num(p, rope_item(tc, "partial_rotary_factor"), "partial_rotary_factor", hybrid ? 0.25 : 1.0, 0.0, 1.0,
                    &prf)))
    return rc;
  double rot = (double)h->head_dim * prf;
  h->n_rot = (int64_t)rot;
  if ((double)h->n_rot != rot || h->n_rot % 2 != 0 || h->n_rot < 2)
    return floe_err(p->err, p->errlen, FLOE_E_INVALID,
                    "%s: head_dim %lld * partial_rotary_factor %g = %g rotary dims, not a positive even integer",
                    p->name, (long long)h->head_dim, prf, rot);
  if (arch == FLOE_ARCH_QWEN35MOE) {
    /* Qwen3_5RotaryEmbedding's mrope_section [t, h, w] (GGUF: padded to 4). Absent: the
     * canonical split of the rotary pairs, as llama.cpp's converter writes for Qwen3.5. */
    const cJSON *ms = rope_item(tc, "mrope_section");
    if (ms) {
      int n = cJSON_IsArray(ms) ? cJSON_GetArraySize(ms) : -1;
      if (n < 1 || n > 4)
        return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: mrope_section is not a list of 1 to 4 integers", p->name);
      int i = 0;
      for (const cJSON *e = ms->child; e; e = e->next, i++) {
        if (!is_int(e, &v) || v < 0 || v > 4096)
          return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: mrope_section[%d] is not an integer in [0, 4096]",
                          p->name, i);
        h->rope_sections[i] = (int32_t)v;
      }
    } else {
      model_rope_sections_canonical(h->n_rot, h->rope_sections);
    }
  }
  h->attn_gate = hybrid;
  bool sw;
  if ((rc = get_bool(p, tc, "use_sliding_window", false, &sw))) return rc;
  if (sw)
    return floe_err(p->err, p->errlen, FLOE_E_UNSUPPORTED, "%s: use_sliding_window is true; floe runs full attention only",
                    p->name);

  /* MoE */
  /* transformers 5 writes Qwen3MoeConfig's expert count as "num_local_experts" (attribute_map) */
  const char *ne_key = !item(tc, "num_experts") && item(tc, "num_local_experts") ? "num_local_experts" : "num_experts";
  if ((rc = get_int(p, tc, ne_key, d_exp, 1, 1 << 16, &h->n_expert))) return rc;
  if ((rc = get_int(p, tc, "num_experts_per_tok", d_topk, 1, 1 << 16, &h->n_expert_used))) return rc;
  if (h->n_expert_used > h->n_expert)
    return floe_err(p->err, p->errlen, FLOE_E_INVALID, "%s: num_experts_per_tok %lld exceeds num_experts %lld", p->name,
                    (long long)h->n_expert_used, (long long)h->n_expert);
  if ((rc = get_int(p, tc, "moe_intermediate_size", d_ffe, 1, 1 << 20, &h->n_ff_exp))) return rc;
  h->n_ff_shexp = 0;
  if (hybrid && (rc = get_int(p, tc, "shared_expert_intermediate_size", 512, 1, 1 << 20, &h->n_ff_shexp))) return rc;
  /* Qwen3.5 renormalises top-k unconditionally (no flag); Qwen3-MoE's class default is false */
  h->norm_topk = true;
  if (arch != FLOE_ARCH_QWEN35MOE && (rc = get_bool(p, tc, "norm_topk_prob", arch == FLOE_ARCH_QWEN3NEXT, &h->norm_topk)))
    return rc;
  if (arch != FLOE_ARCH_QWEN35MOE) {
    int64_t step;
    if ((rc = get_int(p, tc, "decoder_sparse_step", 1, 1, BIG, &step))) return rc;
    const cJSON *mlp_only = item(tc, "mlp_only_layers");
    if (mlp_only && !cJSON_IsArray(mlp_only))
      return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: mlp_only_layers is not a list", p->name);
    for (const cJSON *e = mlp_only ? mlp_only->child : NULL; e; e = e->next)
      if (!is_int(e, &v)) return floe_err(p->err, p->errlen, FLOE_E_FORMAT, "%s: mlp_only_layers holds a non-integer", p->name);
      else if (v >= 0 && v < h->n_layer)
        return floe_err(p->err, p->errlen, FLOE_E_UNSUPPORTED,
                        "%s: layer %lld is a dense MLP layer (mlp_only_layers); floe runs all-MoE models only", p->name,
                        (long long)v);
    for (int64_t i = 0; i < h->n_layer; i++)
      if ((i + 1) % step != 0)
        return floe_err(p->err, p->errlen, FLOE_E_UNSUPPORTED,
                        "%s: layer %lld is a dense MLP layer (decoder_sparse_step %lld); floe runs all-MoE models only",
                        p->name, (long long)i, (long long)step);
  }

  /* layer pattern */
  memset(h->recurrent, 0, sizeof h->recurrent);
  h->full_attn_interval = 0;
  const cJSON *lt = item(tc, "layer_types");
  if (lt) {
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != h->n_layer)
      return floe_err(p->err, p->errlen, FLOE_E_INVALID, "%s: layer_types must be a list of num_hidden_layers (%lld) strings",
                      p->name, (long long)h->n_layer);
    int i = 0;
    for (const cJSON *e = lt->child; e; e = e->next, i++) {
      const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
      char cb[64];
      if (s && (!strcmp(s, "linear_attention") || !strcmp(s, "mamba")) && hybrid) h->recurrent[i] = true;
      else if (s && (!strcmp(s, "full_attention") || !strcmp(s, "attention"))) h->recurrent[i] = false;
      else
        return floe_err(p->err, p->errlen, FLOE_E_UNSUPPORTED, "%s: layer_types[%d] is '%s'; %s", p->name, i,
                        s ? floe_show(cb, sizeof cb, s) : "(not a string)",
                        hybrid ? "floe runs linear_attention and full_attention layers" : "qwen3_moe layers are all full_attention");
    }
  }
  if (hybrid) {
    int64_t iv;
    if ((rc = get_int(p, tc, "full_attention_interval", 4, 1, FLOE_MAX_LAYERS, &iv))) return rc;
    if (!lt)
      for (int64_t i = 0; i < h->n_layer; i++) h->recurrent[i] = (i + 1) % iv != 0;
    /* full_attn_interval: the interval reproducing recurrent[] (config's first), 0 if irregular */
    for (int64_t k = 0; k <= h->n_layer && !h->full_attn_interval; k++) {
      int64_t cand = k == 0 ? iv : k;
      bool ok = true;
      for (int64_t i = 0; i < h->n_layer && ok; i++) ok = h->recurrent[i] == ((i + 1) % cand != 0);
      if (ok) h->full_attn_interval = cand;
    }
    if ((rc = get_int(p, tc, "linear_conv_kernel_dim", 4, 1, 64, &h->ssm_conv_kernel))) return rc;
    if ((rc = get_int(p, tc, "linear_key_head_dim", 128, 1, 4096, &h->ssm_d_state))) return rc;
    if ((rc = get_int(p, tc, "linear_num_key_heads", 16, 1, 4096, &h->ssm_n_group))) return rc;
    if ((rc = get_int(p, tc, "linear_num_value_heads", 32, 1, 4096, &h->ssm_dt_rank))) return rc;
    int64_t dv;
    if ((rc = get_int(p, tc, "linear_value_head_dim", 128, 1, 4096, &dv))) return rc;
    if (h->ssm_dt_rank % h->ssm_n_group != 0)
      return floe_err(p->err, p->errlen, FLOE_E_INVALID,
                      "%s: linear_num_value_heads %lld is not a multiple of linear_num_key_heads %lld", p->name,
                      (long long)h->ssm_dt_rank, (long long)h->ssm_n_group);
    h->ssm_d_inner = dv * h->ssm_dt_rank;
  }

  /* MTP: Next is read by vLLM as num_nextn_predict_layers (default 1); Qwen3.5 as mtp_num_hidden_layers */
  h->n_mtp = 0;
  if (arch == FLOE_ARCH_QWEN3NEXT) {
    const char *key = item(tc, "num_nextn_predict_layers") ? "num_nextn_predict_layers" : "mtp_num_hidden_layers";
    if ((rc = get_int(p, tc, key, 1, 0, 16, &h->n_mtp))) return rc;
  } else if (arch == FLOE_ARCH_QWEN35MOE) {
    if ((rc = get_int(p, tc, "mtp_num_hidden_layers", 0, 0, 16, &h->n_mtp))) return rc;
  }

  /* tie_word_embeddings: the text config's, else the top level's (Qwen3_5MoeConfig has its own) */
  const cJSON *tie_obj = item(tc, "tie_word_embeddings") || tc == root ? tc : root;
  pctx tp = *p;
  if (tie_obj == root) tp.pre = "";
  if ((rc = get_bool(&tp, tie_obj, "tie_word_embeddings", false, &h->tied_embeddings))) return rc;
  return get_token_ids(p, tc, root, c);
}

void hf_config_free(hf_config *c) {
  if (!c) return;
  for (size_t i = 0; i < c->quant.n_over; i++) free(c->quant.over[i].module);
  free(c->quant.over);
  c->quant.over = NULL;
  c->quant.n_over = 0;
}

int hf_config_parse(const char *json, size_t len, const char *name, hf_config *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  pctx p = {name ? name : "config.json", "", err, errlen};
  char cb[64] = {0};
  /* cJSON gets a NUL-terminated copy: it must never read past the caller's bytes */
  char *txt = malloc(len + 1);
  if (!txt) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", p.name);
  memcpy(txt, json, len);
  txt[len] = 0;
  cJSON *root = cJSON_ParseWithLength(txt, len);
  free(txt);
  if (!root) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: JSON parse error", p.name);
  int rc = 0, arch = FLOE_ARCH_UNKNOWN;
  const cJSON *tc = root, *mt = cJSON_IsObject(root) ? item(root, "model_type") : NULL;
  if (!cJSON_IsObject(root)) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: not a JSON object", p.name);
    goto done;
  }
  if (!cJSON_IsString(mt) || !mt->valuestring) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: no \"model_type\" string", p.name);
    goto done;
  }
  floe_show(cb, sizeof cb, mt->valuestring);
  memcpy(c->model_type, cb, sizeof c->model_type - 1); /* cb is NUL-padded up to its length */
  c->model_type[sizeof c->model_type - 1] = 0;
  const char *t = mt->valuestring;
  if (!strcmp(t, "qwen3_moe")) arch = FLOE_ARCH_QWEN3MOE;
  else if (!strcmp(t, "qwen3_next")) arch = FLOE_ARCH_QWEN3NEXT;
  else if (!strcmp(t, "qwen3_5_moe") || !strcmp(t, "qwen3_5_moe_text")) arch = FLOE_ARCH_QWEN35MOE;
  else {
    rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: unsupported model_type '%s' (floe runs qwen3_moe, qwen3_next, qwen3_5_moe)",
                  p.name, cb);
    goto done;
  }
  if (!strcmp(t, "qwen3_5_moe") && item(root, "text_config")) {
    tc = item(root, "text_config");
    const cJSON *tmt = cJSON_IsObject(tc) ? item(tc, "model_type") : NULL;
    if (!cJSON_IsObject(tc)) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: text_config is not an object", p.name);
      goto done;
    }
    if (tmt && (!cJSON_IsString(tmt) || strcmp(tmt->valuestring, "qwen3_5_moe_text"))) {
      rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: text_config.model_type is '%s', expected qwen3_5_moe_text", p.name,
                    cJSON_IsString(tmt) ? floe_show(cb, sizeof cb, tmt->valuestring) : "?");
      goto done;
    }
    p.pre = "text_config.";
  }
  if ((rc = parse_text(&p, tc, root, arch, c))) goto done;
  p.pre = "";
  const cJSON *q = item(root, "quantization");
  if (!q) q = item(root, "quantization_config");
  if (q) rc = parse_quant(&p, q, &c->quant);
done:
  cJSON_Delete(root);
  if (rc) hf_config_free(c);
  return rc;
}

int hf_config_load(const char *path, hf_config *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  size_t pl = strlen(path);
  bool is_json = pl >= 5 && !strcmp(path + pl - 5, ".json");
  char *fp = malloc(pl + 16);
  if (!fp) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  snprintf(fp, pl + 16, is_json ? "%s" : "%s/config.json", path);
  /* config.json files are a few KB (MLX ones with per-module overrides up to ~1 MB) */
  char *buf;
  size_t n = 0;
  int rc = floe_read_file(fp, (size_t)64 << 20, &buf, &n, err, errlen);
  if (rc == 0) rc = hf_config_parse(buf, n, fp, c, err, errlen);
  free(buf);
  free(fp);
  return rc;
}
