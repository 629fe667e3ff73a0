/* floe convert: HF / MLX safetensors directory -> GGUF (llama.cpp layout). See convert.h.
 *
 * Structure: plan every output tensor first (find its source tensors, check their shapes and
 * dtypes, pick the output type), so a bad directory fails before the output file exists; then
 * write the header and stream each tensor in chunks of rows. Every output tensor is seen as a
 * matrix of `rows` rows of ne0 floats (ne1*ne2 rows: an expert stack is E*n_out rows), and each
 * output row comes from one source row through a row map (expert slabs, Qwen3-Next's grouped
 * qkvz, Qwen3.5's V-head reorder) and an element-wise op (+1, -exp, column reorder). So a chunk of
 * rows can be produced by any thread independently, in constant memory. */
#include "convert/convert.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "model/model_meta.h"
#include "quant/quant.h"
#include "tok/synth_vocab.h"

#define CHUNK_BYTES ((size_t)16 << 20) /* output bytes produced per pool run */

/* A source weight seen as rows x cols floats: a plain F32/F16/BF16 tensor, or an MLX affine
 * quantized one (uint32 codes in w, per-group scales and biases in s and b). 3-D stacks are
 * flattened: row e*n_out + r is row r of slab e. */
typedef struct src_mat {
  const st_tensor *w, *s, *b;
  quant_mlx_fmt fmt;
  uint32_t type;        /* FLOE_TYPE_F32/F16/BF16 of w (plain), or FLOE_TYPE_MLX */
  int64_t rows, cols;
  size_t row_bytes;     /* bytes of one row of w */
  size_t sb_row_bytes;  /* MLX: bytes of one row of scales (= of biases) */
} src_mat;

enum { MAP_DIRECT, MAP_EXPERTS, MAP_QKV, MAP_Z };  /* row maps */
enum { VP_NONE, VP_ROWS, VP_COLS };                /* Qwen3.5 V-head reorder */

typedef struct tplan {
  const model_tensor_desc *d;
  uint32_t type;         /* output ggml type */
  bool fallback;         /* type is a fallback for a row length the requested type does not divide */
  int64_t rows, cols;    /* output rows (ne1*ne2*ne3) of cols (ne0) */
  src_mat src;           /* the source (MAP_DIRECT/QKV/Z, stacked or fused experts) */
  src_mat *exp;          /* per-expert sources (HF model.layers.L.mlp.experts.E.*), n_expert of them */
  int map;
  int64_t per;           /* experts: output rows per expert */
  int64_t src_per, src_off; /* stacked/fused experts: source rows per expert, first row (up in gate_up) */
  int vperm;
  int64_t vfirst, vunit; /* VP_ROWS: rows [vfirst, vfirst + Nv*vunit) are V heads of vunit rows; VP_COLS: heads of vunit columns */
  float add;             /* +1 for zero-centred norms (HF layout) */
  bool neg_exp;          /* ssm_a = -exp(A_log) */
} tplan;

typedef struct conv {
  const convert_opts *o;
  hf_config cfg;
  floe_hparams hp;
  st_model *st;
  bool mlx;              /* MLX layout: norms hold 1+w, conv1d [C,K,1], switch_mlp stacks */
  bool zc;               /* zero-centred norms stored without the +1 (HF hybrids) */
  char base[32];         /* prefix of the trunk: "model.", "model.language_model.", "language_model.model." */
  char mtp_base[40];     /* prefix of the MTP weights, "" when none */
  const char *lm_head;   /* name of lm_head, NULL when absent */
  model_tensor_desc *descs;
  size_t n_descs;
  tplan *plans;
  size_t max_cols, max_raw, max_sb; /* scratch sizes */
  /* GDN sizes */
  int64_t Nk, Nv, dk, dv, kd, r;
} conv;

/* ---- types ---- */

bool convert_type_ok(int type) {
  if (type < 0) return false;
  const floe_type_traits *t = floe_type_info((uint32_t)type);
  return t && quant_can_quantize((uint32_t)type);
}

/* llama-quantize's fallback for a row length the block size does not divide (llama-quant.cpp,
 * convert_incompatible_tensor), then F16 as the Python converter's QuantError fallback does. */
uint32_t convert_fallback_type(uint32_t type, int64_t ne0) {
  uint32_t t = type;
  switch (type) {
  case FLOE_TYPE_Q2_K: case FLOE_TYPE_Q3_K: case FLOE_TYPE_IQ4_XS: t = FLOE_TYPE_IQ4_NL; break;
  case FLOE_TYPE_Q4_K: t = FLOE_TYPE_Q5_0; break;
  case FLOE_TYPE_Q5_K: t = FLOE_TYPE_Q5_1; break;
  case FLOE_TYPE_Q6_K: t = FLOE_TYPE_Q8_0; break;
  default: t = FLOE_TYPE_F16; break;
  }
  if (!floe_row_bytes(t, ne0)) t = FLOE_TYPE_F16;
  return t;
}

/* general.file_type (llama.cpp enum llama_ftype) of a uniform type: the "_S" (all one type) variants. */
uint32_t convert_file_type(uint32_t t) {
  switch (t) {
  case FLOE_TYPE_F32: return 0;
  case FLOE_TYPE_F16: return 1;
  case FLOE_TYPE_Q4_0: return 2;
  case FLOE_TYPE_Q4_1: return 3;
  case FLOE_TYPE_Q8_0: return 7;
  case FLOE_TYPE_Q5_0: return 8;
  case FLOE_TYPE_Q5_1: return 9;
  case FLOE_TYPE_Q2_K: return 10;
  case FLOE_TYPE_Q3_K: return 11;
  case FLOE_TYPE_Q4_K: return 14;
  case FLOE_TYPE_Q5_K: return 16;
  case FLOE_TYPE_Q6_K: return 18;
  case FLOE_TYPE_IQ4_NL: return 25;
  case FLOE_TYPE_IQ4_XS: return 30;
  case FLOE_TYPE_BF16: return 32;
  case FLOE_TYPE_MXFP4: return 38;
  default: return 0;
  }
}

static int plain_type(int dtype) {
  switch (dtype) {
  case ST_F32: return FLOE_TYPE_F32;
  case ST_F16: return FLOE_TYPE_F16;
  case ST_BF16: return FLOE_TYPE_BF16;
  default: return -1;
  }
}

/* ---- sources ---- */

static const st_tensor *find(const conv *c, const char *name) { return st_find(c->st, name); }

/* Name of a per-layer weight: trunk layers under base, MTP blocks (layer >= n_layer) under mtp_base. */
static const char *lname(const conv *c, int64_t layer, const char *suffix, char *buf, size_t n) {
  if (layer < c->hp.n_layer) snprintf(buf, n, "%slayers.%lld.%s", c->base, (long long)layer, suffix);
  else snprintf(buf, n, "%slayers.%lld.%s", c->mtp_base, (long long)(layer - c->hp.n_layer), suffix);
  return buf;
}

static const char *gname(const conv *c, const char *suffix, char *buf, size_t n) {
  snprintf(buf, n, "%s%s", c->base, suffix);
  return buf;
}

/* The innermost dimension that is not 1 (so [C,1,K], [C,K,1], [1,H] read as rows of K, K, H). */
static int64_t inner_dim(const st_tensor *t) {
  for (int i = t->n_dims - 1; i >= 0; i--)
    if (t->shape[i] != 1) return t->shape[i];
  return 1;
}

/* Opens `name` as rows of `cols` floats. MLX: "<module>.weight" with "<module>.scales" beside it. */
static int src_open(conv *c, const char *name, int64_t cols, src_mat *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  const st_tensor *w = find(c, name);
  if (!w) return floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: tensor '%s' not found", c->o->in_dir, name);
  m->w = w;
  m->cols = cols;
  size_t nl = strlen(name);
  char mod[512], sn[520], bn[520];
  if (nl > 7 && !strcmp(name + nl - 7, ".weight") && nl - 7 < sizeof mod) {
    memcpy(mod, name, nl - 7);
    mod[nl - 7] = 0;
    snprintf(sn, sizeof sn, "%s.scales", mod);
    snprintf(bn, sizeof bn, "%s.biases", mod);
    m->s = find(c, sn);
  }
  if (m->s) { /* MLX affine */
    m->b = find(c, bn);
    if (!c->cfg.quant.present)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: '%s' has scales but config.json has no quantization block",
                      c->o->in_dir, name);
    if (!m->b)
      return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: '%s' has scales but no biases (only MLX affine is supported)",
                      c->o->in_dir, name);
    int bits = 0, group = 0;
    bool q = false;
    int rc = hf_quant_for(&c->cfg.quant, mod, &bits, &group, &q);
    if (rc) return floe_err(err, errlen, rc, "%s: '%s': MLX %s quantization with %d bits, group %d is not supported",
                            c->o->in_dir, mod, hf_qmode_name(c->cfg.quant.mode), bits, group);
    int sbt = plain_type(m->s->dtype);
    if (w->dtype != ST_U32 || w->n_dims < 2 || sbt < 0 || m->b->dtype != m->s->dtype || m->s->n_dims != w->n_dims ||
        m->b->n_dims != w->n_dims)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: '%s': bad MLX quantized tensor (codes %s, scales %s)",
                      c->o->in_dir, name, st_dtype_name(w->dtype), st_dtype_name(m->s->dtype));
    for (int i = 0; i < w->n_dims - 1; i++)
      if (m->s->shape[i] != w->shape[i] || m->b->shape[i] != w->shape[i])
        return floe_err(err, errlen, FLOE_E_FORMAT, "%s: '%s': scales/biases shape does not match the codes",
                        c->o->in_dir, name);
    if (m->b->shape[w->n_dims - 1] != m->s->shape[w->n_dims - 1])
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: '%s': biases shape does not match scales", c->o->in_dir, name);
    m->fmt.bits = bits;
    m->fmt.group = group;
    m->fmt.sb_type = (uint32_t)sbt;
    const int64_t in = m->s->shape[w->n_dims - 1] * group;
    if (!quant_mlx_fmt_valid(&m->fmt) || in != cols || w->shape[w->n_dims - 1] * 32 != in * bits)
      return floe_err(err, errlen, FLOE_E_FORMAT,
                      "%s: '%s': MLX codes [.., %lld] with %d bits, group %d do not hold rows of %lld", c->o->in_dir,
                      name, (long long)w->shape[w->n_dims - 1], bits, group, (long long)cols);
    m->type = FLOE_TYPE_MLX;
    m->rows = (int64_t)(w->n_elements / w->shape[w->n_dims - 1]);
    m->row_bytes = quant_mlx_row_bytes(&m->fmt, cols);
    m->sb_row_bytes = (size_t)m->s->shape[w->n_dims - 1] * st_dtype_size(m->s->dtype);
    if ((uint64_t)m->rows * m->row_bytes != w->nbytes)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: '%s': MLX codes size mismatch", c->o->in_dir, name);
  } else {
    int t = plain_type(w->dtype);
    if (t < 0)
      return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16 or BF16 expected)",
                      c->o->in_dir, name, st_dtype_name(w->dtype));
    if (cols < 1 || w->n_elements % cols || (cols > 1 && inner_dim(w) != cols))
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': shape does not hold rows of %lld", c->o->in_dir,
                      name, (long long)cols);
    m->type = (uint32_t)t;
    m->rows = w->n_elements / cols;
    m->row_bytes = (size_t)cols * st_dtype_size(w->dtype);
  }
  if ((size_t)cols > c->max_cols) c->max_cols = (size_t)cols;
  if (m->row_bytes > c->max_raw) c->max_raw = m->row_bytes;
  if (m->sb_row_bytes > c->max_sb) c->max_sb = m->sb_row_bytes;
  return 0;
}

static int want_rows(const conv *c, const src_mat *m, int64_t rows, char *err, size_t errlen) {
  if (m->rows != rows)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s' has %lld rows of %lld, expected %lld", c->o->in_dir,
                    m->w->name, (long long)m->rows, (long long)m->cols, (long long)rows);
  return 0;
}

/* Reads source row r as floats. scratch: 64-aligned, max_raw + 2*max_sb (+ padding) bytes. */
static void src_row(const src_mat *m, int64_t r, float *dst, uint8_t *scratch, size_t sb_off) {
  const uint8_t *p = m->w->data + (size_t)r * m->row_bytes;
  if (m->type == FLOE_TYPE_MLX) {
    uint8_t *s = scratch + sb_off, *b = s + (m->sb_row_bytes + 63) / 64 * 64;
    memcpy(scratch, p, m->row_bytes);
    memcpy(s, m->s->data + (size_t)r * m->sb_row_bytes, m->sb_row_bytes);
    memcpy(b, m->b->data + (size_t)r * m->sb_row_bytes, m->sb_row_bytes);
    quant_mlx_dequant_row(&m->fmt, scratch, s, b, dst, m->cols);
  } else if (m->type == FLOE_TYPE_F32) {
    memcpy(dst, p, m->row_bytes);
  } else {
    memcpy(scratch, p, m->row_bytes); /* safetensors data is not aligned in general */
    quant_dequant_row(m->type, scratch, dst, m->cols);
  }
}

/* Grouped (HF) value head of tiled position p: llama.cpp's _reorder_v_heads puts head g*r + j
 * (key head g, j-th of its r value heads) at position j*Nk + g. */
static int64_t v_src(const conv *c, int64_t p) { return (p % c->Nk) * c->r + p / c->Nk; }

/* Which source row output row `row` comes from. */
static const src_mat *map_row(const conv *c, const tplan *p, int64_t row, int64_t *sr) {
  switch (p->map) {
  case MAP_EXPERTS: {
    const int64_t e = row / p->per, j = row % p->per;
    if (p->exp) {
      *sr = j;
      return &p->exp[e];
    }
    row = e * p->src_per + p->src_off + j;
    break;
  }
  case MAP_QKV: { /* grouped [Nk][q dk | k dk | v r*dv | z r*dv] -> q | k | v (HF fix_query_key_value_ordering) */
    const int64_t gq = 2 * c->dk + 2 * c->r * c->dv, rv = c->r * c->dv;
    if (row < c->kd) row = (row / c->dk) * gq + row % c->dk;
    else if (row < 2 * c->kd) row = ((row - c->kd) / c->dk) * gq + c->dk + (row - c->kd) % c->dk;
    else row = ((row - 2 * c->kd) / rv) * gq + 2 * c->dk + (row - 2 * c->kd) % rv;
    break;
  }
  case MAP_Z: {
    const int64_t gq = 2 * c->dk + 2 * c->r * c->dv, rv = c->r * c->dv;
    row = (row / rv) * gq + 2 * c->dk + rv + row % rv;
    break;
  }
  default: break;
  }
  if (p->vperm == VP_ROWS && row >= p->vfirst && row < p->vfirst + c->Nv * p->vunit) {
    const int64_t q = row - p->vfirst;
    row = p->vfirst + v_src(c, q / p->vunit) * p->vunit + q % p->vunit;
  }
  *sr = row;
  return &p->src;
}

/* Output row `row` of plan p as floats into dst (cols). tmp: cols floats of scratch. */
static void fill_row(const conv *c, const tplan *p, int64_t row, float *dst, float *tmp, uint8_t *scratch,
                     size_t sb_off) {
  int64_t sr;
  const src_mat *m = map_row(c, p, row, &sr);
  if (p->vperm == VP_COLS) {
    src_row(m, sr, tmp, scratch, sb_off);
    const int64_t u = p->vunit;
    for (int64_t q = 0; q < c->Nv; q++) memcpy(dst + q * u, tmp + v_src(c, q) * u, (size_t)u * sizeof(float));
  } else {
    src_row(m, sr, dst, scratch, sb_off);
  }
  if (p->add != 0.0f)
    for (int64_t i = 0; i < p->cols; i++) dst[i] = dst[i] + p->add; /* (float)w + 1.0f, as the loader computes */
  if (p->neg_exp)
    for (int64_t i = 0; i < p->cols; i++) dst[i] = -expf(dst[i]);
}

/* ---- planning ---- */

/* HF suffix (after "<base>layers.L.") of the tensors that map one to one. */
static const char *direct_suffix(int kind) {
  switch (kind) {
  case MODEL_K_ATTN_NORM: return "input_layernorm.weight";
  case MODEL_K_FFN_NORM: return "post_attention_layernorm.weight";
  case MODEL_K_ATTN_Q: return "self_attn.q_proj.weight";
  case MODEL_K_ATTN_K: return "self_attn.k_proj.weight";
  case MODEL_K_ATTN_V: return "self_attn.v_proj.weight";
  case MODEL_K_ATTN_OUT: return "self_attn.o_proj.weight";
  case MODEL_K_ATTN_Q_NORM: return "self_attn.q_norm.weight";
  case MODEL_K_ATTN_K_NORM: return "self_attn.k_norm.weight";
  case MODEL_K_SSM_BETA: return "linear_attn.in_proj_b.weight";
  case MODEL_K_SSM_ALPHA: return "linear_attn.in_proj_a.weight";
  case MODEL_K_SSM_BA: return "linear_attn.in_proj_ba.weight";
  case MODEL_K_SSM_CONV1D: return "linear_attn.conv1d.weight";
  case MODEL_K_SSM_DT_BIAS: return "linear_attn.dt_bias";
  case MODEL_K_SSM_A: return "linear_attn.A_log";
  case MODEL_K_SSM_NORM: return "linear_attn.norm.weight";
  case MODEL_K_SSM_OUT: return "linear_attn.out_proj.weight";
  case MODEL_K_FFN_GATE_INP: return "mlp.gate.weight";
  case MODEL_K_FFN_GATE_INP_SHEXP: return "mlp.shared_expert_gate.weight";
  case MODEL_K_FFN_GATE_SHEXP: return "mlp.shared_expert.gate_proj.weight";
  case MODEL_K_FFN_UP_SHEXP: return "mlp.shared_expert.up_proj.weight";
  case MODEL_K_FFN_DOWN_SHEXP: return "mlp.shared_expert.down_proj.weight";
  default: return NULL;
  }
}

static bool is_zc_norm(int kind) {
  switch (kind) {
  case MODEL_K_OUTPUT_NORM: case MODEL_K_ATTN_NORM: case MODEL_K_FFN_NORM: case MODEL_K_ATTN_Q_NORM:
  case MODEL_K_ATTN_K_NORM: case MODEL_K_NEXTN_ENORM: case MODEL_K_NEXTN_HNORM: case MODEL_K_NEXTN_SHARED_HEAD_NORM:
    return true;
  default: return false;
  }
}

static int plan_experts(conv *c, tplan *p, char *err, size_t errlen) {
  const model_tensor_desc *d = p->d;
  const int64_t E = c->hp.n_expert;
  const char *w = d->kind == MODEL_K_FFN_GATE_EXPS ? "gate" : d->kind == MODEL_K_FFN_UP_EXPS ? "up" : "down";
  char nm[512], sfx[128];
  p->map = MAP_EXPERTS;
  p->per = p->rows / E;
  snprintf(sfx, sizeof sfx, "mlp.switch_mlp.%s_proj.weight", w);
  if (find(c, lname(c, d->layer, sfx, nm, sizeof nm))) { /* MLX (or pre-stacked) [E, n_out, n_in] */
    p->src_per = p->per;
    int rc = src_open(c, nm, p->cols, &p->src, err, errlen);
    return rc ? rc : want_rows(c, &p->src, E * p->per, err, errlen);
  }
  const bool down = d->kind == MODEL_K_FFN_DOWN_EXPS;
  const char *fused[2] = { down ? "mlp.experts.down_proj" : "mlp.experts.gate_up_proj",
                           down ? "mlp.experts.down_proj.weight" : "mlp.experts.gate_up_proj.weight" };
  for (int k = 0; k < 2; k++) { /* transformers 5: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I] */
    if (!find(c, lname(c, d->layer, fused[k], nm, sizeof nm))) continue;
    p->src_per = down ? p->per : 2 * p->per;
    p->src_off = d->kind == MODEL_K_FFN_UP_EXPS ? p->per : 0;
    int rc = src_open(c, nm, p->cols, &p->src, err, errlen);
    return rc ? rc : want_rows(c, &p->src, E * p->src_per, err, errlen);
  }
  p->exp = calloc((size_t)E, sizeof *p->exp);
  if (!p->exp) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  for (int64_t e = 0; e < E; e++) {
    snprintf(sfx, sizeof sfx, "mlp.experts.%lld.%s_proj.weight", (long long)e, w);
    int rc = src_open(c, lname(c, d->layer, sfx, nm, sizeof nm), p->cols, &p->exp[e], err, errlen);
    if (!rc) rc = want_rows(c, &p->exp[e], p->per, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

static int plan_tensor(conv *c, tplan *p, char *err, size_t errlen) {
  const model_tensor_desc *d = p->d;
  const bool q35 = c->hp.arch == FLOE_ARCH_QWEN35MOE, reorder = q35 && c->Nk != c->Nv;
  char nm[512];
  const char *name = NULL;
  int rc;
  p->cols = d->ne[0];
  p->rows = d->ne[1] * d->ne[2] * d->ne[3];
  if (c->zc && is_zc_norm(d->kind)) p->add = 1.0f;
  switch (d->kind) {
  case MODEL_K_TOKEN_EMBD: name = gname(c, "embed_tokens.weight", nm, sizeof nm); break;
  case MODEL_K_OUTPUT_NORM: name = gname(c, "norm.weight", nm, sizeof nm); break;
  case MODEL_K_OUTPUT: name = c->lm_head; break;
  case MODEL_K_NEXTN_EH_PROJ: snprintf(nm, sizeof nm, "%sfc.weight", c->mtp_base); name = nm; break;
  case MODEL_K_NEXTN_ENORM: snprintf(nm, sizeof nm, "%spre_fc_norm_embedding.weight", c->mtp_base); name = nm; break;
  case MODEL_K_NEXTN_HNORM: snprintf(nm, sizeof nm, "%spre_fc_norm_hidden.weight", c->mtp_base); name = nm; break;
  case MODEL_K_NEXTN_SHARED_HEAD_NORM: snprintf(nm, sizeof nm, "%snorm.weight", c->mtp_base); name = nm; break;
  case MODEL_K_FFN_GATE_EXPS: case MODEL_K_FFN_UP_EXPS: case MODEL_K_FFN_DOWN_EXPS:
    return plan_experts(c, p, err, errlen);
  case MODEL_K_SSM_QKV:
    if (q35) {
      name = lname(c, d->layer, "linear_attn.in_proj_qkv.weight", nm, sizeof nm);
    } else {
      name = lname(c, d->layer, "linear_attn.in_proj_qkvz.weight", nm, sizeof nm);
      p->map = MAP_QKV;
    }
    break;
  case MODEL_K_SSM_GATE:
    if (q35) {
      name = lname(c, d->layer, "linear_attn.in_proj_z.weight", nm, sizeof nm);
    } else {
      name = lname(c, d->layer, "linear_attn.in_proj_qkvz.weight", nm, sizeof nm);
      p->map = MAP_Z;
    }
    break;
  default: {
    const char *sfx = direct_suffix(d->kind);
    if (!sfx) return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "tensor %s: no source mapping", d->name);
    name = lname(c, d->layer, sfx, nm, sizeof nm);
  }
  }
  if (d->kind == MODEL_K_SSM_A) p->neg_exp = true;
  if (reorder) {
    switch (d->kind) {
    case MODEL_K_SSM_QKV: case MODEL_K_SSM_CONV1D: p->vperm = VP_ROWS; p->vfirst = 2 * c->kd; p->vunit = c->dv; break;
    case MODEL_K_SSM_GATE: p->vperm = VP_ROWS; p->vunit = c->dv; break;
    case MODEL_K_SSM_BETA: case MODEL_K_SSM_ALPHA: p->vperm = VP_ROWS; p->vunit = 1; break;
    case MODEL_K_SSM_DT_BIAS: case MODEL_K_SSM_A: p->vperm = VP_COLS; p->vunit = 1; break;
    case MODEL_K_SSM_OUT: p->vperm = VP_COLS; p->vunit = c->dv; break;
    default: break;
    }
  }
  if (!name) return floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: no lm_head weight", c->o->in_dir);
  if ((rc = src_open(c, name, p->cols, &p->src, err, errlen))) return rc;
  int64_t want = p->rows;
  if (p->map == MAP_QKV || p->map == MAP_Z) want = c->Nk * (2 * c->dk + 2 * c->r * c->dv);
  return want_rows(c, &p->src, want, err, errlen);
}

/* Output type of a planned tensor (llama.cpp: 1-D, norms, router and conv1d stay F32). */
static void plan_type(conv *c, tplan *p) {
  const uint32_t f = p->d->flags;
  const src_mat *m = p->exp ? &p->exp[0] : &p->src;
  int t;
  if (f & (MODEL_TF_VECTOR | MODEL_TF_F32)) {
    p->type = FLOE_TYPE_F32;
    return;
  }
  t = (f & (MODEL_TF_EXPERTS | MODEL_TF_SHEXP)) && c->o->expert_type >= 0 ? c->o->expert_type : c->o->type;
  if (t < 0) t = m->type == FLOE_TYPE_MLX ? FLOE_TYPE_Q8_0 : (int)m->type;
  p->type = (uint32_t)t;
  if (!floe_row_bytes(p->type, p->cols)) {
    p->type = convert_fallback_type(p->type, p->cols);
    p->fallback = true;
  }
}

/* Finds the prefixes, the MLX layout, lm_head and the MTP weights; adjusts hp. */
static int probe(conv *c, char *err, size_t errlen) {
  static const char *const bases[] = { "model.", "model.language_model.", "language_model.model." };
  static const char *const mtps[] = { "mtp.", "model.mtp.", "language_model.mtp.", "model.language_model.mtp." };
  char nm[512];
  c->base[0] = 0;
  for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
    snprintf(nm, sizeof nm, "%sembed_tokens.weight", bases[i]);
    if (find(c, nm)) {
      snprintf(c->base, sizeof c->base, "%s", bases[i]);
      break;
    }
  }
  if (!c->base[0])
    return floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: tensor 'model.embed_tokens.weight' not found", c->o->in_dir);
  floe_hparams *hp = &c->hp;
  /* MLX: a quantization block, switch_mlp stacks, or conv1d already moved to [C, K, 1]. */
  c->mlx = c->cfg.quant.present || find(c, lname(c, 0, "mlp.switch_mlp.gate_proj.weight", nm, sizeof nm));
  for (int64_t l = 0; l < hp->n_layer && !c->mlx; l++) {
    if (!hp->recurrent[l]) continue;
    const st_tensor *t = find(c, lname(c, l, "linear_attn.conv1d.weight", nm, sizeof nm));
    if (t && t->n_dims == 3 && t->shape[2] == 1 && t->shape[1] > 1) c->mlx = true;
    break;
  }
  c->zc = hp->arch != FLOE_ARCH_QWEN3MOE && !c->mlx;
  c->lm_head = NULL;
  static const char *const heads[] = { "lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight" };
  for (size_t i = 0; i < sizeof heads / sizeof heads[0] && !c->lm_head; i++)
    if (find(c, heads[i])) c->lm_head = heads[i];
  if (!c->lm_head && !hp->tied_embeddings)
    return floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: tensor 'lm_head.weight' not found (tie_word_embeddings is false)",
                    c->o->in_dir);
  if (c->lm_head) hp->tied_embeddings = false; /* written as output.weight, as llama.cpp does */
  /* MTP: HF checkpoints of Qwen3-Next / Qwen3.5 carry mtp.*; transformers and mlx-lm drop them. */
  c->mtp_base[0] = 0;
  if (hp->n_mtp > 0 && !c->mlx)
    for (size_t i = 0; i < sizeof mtps / sizeof mtps[0]; i++) {
      snprintf(nm, sizeof nm, "%sfc.weight", mtps[i]);
      if (find(c, nm)) {
        snprintf(c->mtp_base, sizeof c->mtp_base, "%s", mtps[i]);
        break;
      }
    }
  if (!c->mtp_base[0]) hp->n_mtp = 0;
  c->Nk = hp->ssm_n_group;
  c->Nv = hp->ssm_dt_rank;
  c->dk = hp->ssm_d_state;
  c->dv = c->Nv ? hp->ssm_d_inner / c->Nv : 0;
  c->kd = c->Nk * c->dk;
  c->r = c->Nk ? c->Nv / c->Nk : 0;
  return 0;
}

/* ---- writing ---- */

typedef struct job {
  const conv *c;
  const tplan *p;
  int64_t r0, n;
  uint8_t *out;
  size_t rb;
  float **f, **tmp;
  uint8_t **scr;
  size_t sb_off;
  int rc[256];
} job;

static void job_run(void *ctx, int ith, int nth) {
  job *j = ctx;
  int64_t a, b;
  floe_split_range(j->n, 1, ith, nth, &a, &b);
  for (int64_t i = a; i < b; i++) {
    float *row = j->p->type == FLOE_TYPE_F32 ? (float *)(j->out + (size_t)i * j->rb) : j->f[ith];
    fill_row(j->c, j->p, j->r0 + i, row, j->tmp[ith], j->scr[ith], j->sb_off);
    if (j->p->type != FLOE_TYPE_F32 &&
        quant_quantize_row(j->p->type, row, j->out + (size_t)i * j->rb, j->p->cols, NULL) && ith < 256)
      j->rc[ith] = FLOE_E_UNSUPPORTED;
  }
}

static void plans_free(conv *c) {
  if (!c->plans) return;
  for (size_t i = 0; i < c->n_descs; i++) free(c->plans[i].exp);
  free(c->plans);
  c->plans = NULL;
}

static const char *base_name(const char *path, char *buf, size_t n) {
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') len--;
  size_t s = len;
  while (s > 0 && path[s - 1] != '/') s--;
  snprintf(buf, n, "%.*s", (int)(len - s), path + s);
  return buf;
}

int convert_model(const convert_opts *o, convert_stats *stats, char *err, size_t errlen) {
  conv cv;
  conv *c = &cv;
  memset(c, 0, sizeof *c);
  c->o = o;
  convert_stats st = { 0 };
  int rc = 0, nth = o->n_threads < 1 ? 1 : o->n_threads > 256 ? 256 : o->n_threads;
  gguf_writer *w = NULL;
  floe_pool *pool = NULL;
  synth_vocab voc = { 0 };
  bool have_voc = false;
  uint8_t *out = NULL;
  float **fb = NULL, **tb = NULL;
  uint8_t **sb = NULL;
  struct stat sbuf;

  if (o->type >= 0 && !convert_type_ok(o->type))
    return floe_err(err, errlen, FLOE_E_INVALID, "type %d cannot be written (no quantizer)", o->type);
  if (o->expert_type >= 0 && !convert_type_ok(o->expert_type))
    return floe_err(err, errlen, FLOE_E_INVALID, "expert type %d cannot be written (no quantizer)", o->expert_type);
  if (stat(o->in_dir, &sbuf) != 0 || !S_ISDIR(sbuf.st_mode))
    return floe_err(err, errlen, FLOE_E_IO, "%s: not a directory", o->in_dir);
  if ((rc = hf_config_load(o->in_dir, &c->cfg, err, errlen))) return rc;
  c->hp = c->cfg.hp;
  if ((rc = st_model_open(o->in_dir, &c->st, err, errlen))) goto done;
  if ((rc = probe(c, err, errlen))) goto done;
  if ((rc = model_tensor_list(&c->hp, &c->descs, &c->n_descs, err, errlen))) goto done;
  c->plans = calloc(c->n_descs, sizeof *c->plans);
  if (!c->plans) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < c->n_descs; i++) {
    c->plans[i].d = &c->descs[i];
    if ((rc = plan_tensor(c, &c->plans[i], err, errlen))) goto done;
    plan_type(c, &c->plans[i]);
    if (c->plans[i].fallback) st.n_fallback++;
  }

  /* Tokenizer (before the output file exists, so a bad one leaves nothing behind). */
  char tok[4096];
  snprintf(tok, sizeof tok, "%s/tokenizer.json", o->in_dir);
  if (access(tok, R_OK) == 0) {
    if ((rc = synth_vocab_from_tokenizer_json(tok, c->hp.n_vocab, &voc, err, errlen))) goto done;
    have_voc = true;
  }

  /* Header. */
  uint32_t ftype;
  if (o->type >= 0) ftype = convert_file_type((uint32_t)o->type);
  else ftype = convert_file_type(c->plans[0].type); /* token_embd: the source's float type, or q8_0 from MLX */
  char nbuf[256];
  if ((rc = gguf_writer_open(o->out_path, &w, err, errlen))) goto done;
  rc = model_hparams_to_gguf(w, &c->hp);
  if (!rc) rc = gguf_writer_add_str(w, "general.name", o->name ? o->name : base_name(o->in_dir, nbuf, sizeof nbuf));
  if (!rc) rc = gguf_writer_add_u32(w, "general.file_type", ftype);
  if (!rc) rc = gguf_writer_add_u32(w, "general.quantization_version", 2);
  if (!rc && have_voc) rc = synth_vocab_to_gguf(w, &voc, c->hp.arch == FLOE_ARCH_QWEN35MOE ? "qwen35" : "qwen2");
  for (size_t i = 0; i < c->n_descs && !rc; i++)
    rc = gguf_writer_add_tensor(w, c->descs[i].name, c->plans[i].type, c->descs[i].n_dims, c->descs[i].ne);
  if (!rc) rc = gguf_writer_write_header(w);
  if (rc) {
    floe_err(err, errlen, rc, "%s", gguf_writer_error(w));
    goto done;
  }

  /* Data: chunks of rows, produced on the pool. */
  pool = floe_pool_create(nth);
  fb = calloc((size_t)nth, sizeof *fb);
  tb = calloc((size_t)nth, sizeof *tb);
  sb = calloc((size_t)nth, sizeof *sb);
  out = floe_aligned_alloc(64, CHUNK_BYTES);
  if (!pool || !fb || !tb || !sb || !out) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  const size_t sb_off = (c->max_raw + 63) / 64 * 64, scr_bytes = sb_off + 2 * ((c->max_sb + 63) / 64 * 64) + 64;
  for (int t = 0; t < nth; t++) {
    fb[t] = floe_aligned_alloc(64, c->max_cols * sizeof(float) + 64);
    tb[t] = floe_aligned_alloc(64, c->max_cols * sizeof(float) + 64);
    sb[t] = floe_aligned_alloc(64, scr_bytes);
    if (!fb[t] || !tb[t] || !sb[t]) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      goto done;
    }
  }
  uint64_t total = 0; /* tensor bytes to write, for the progress callback */
  for (size_t i = 0; i < c->n_descs; i++)
    total += (uint64_t)floe_row_bytes(c->plans[i].type, c->plans[i].cols) * (uint64_t)c->plans[i].rows;
  for (size_t i = 0; i < c->n_descs; i++) {
    const tplan *p = &c->plans[i];
    const size_t rb = floe_row_bytes(p->type, p->cols);
    if (rb > CHUNK_BYTES) {
      rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "tensor %s: rows of %zu bytes are too long", p->d->name, rb);
      goto done;
    }
    const int64_t per_chunk = (int64_t)(CHUNK_BYTES / rb);
    if (o->verbose)
      fprintf(stderr, "  %-36s %-7s %6lld x %-6lld%s\n", p->d->name, floe_type_info(p->type)->name,
              (long long)p->cols, (long long)p->rows, p->fallback ? "  (fallback: the requested type's block does not divide the row)" : "");
    for (int64_t r0 = 0; r0 < p->rows; r0 += per_chunk) {
      job j = { .c = c, .p = p, .r0 = r0, .n = p->rows - r0 < per_chunk ? p->rows - r0 : per_chunk, .out = out,
                .rb = rb, .f = fb, .tmp = tb, .scr = sb, .sb_off = sb_off };
      floe_pool_run(pool, job_run, &j);
      for (int t = 0; t < nth; t++)
        if (j.rc[t]) {
          rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "tensor %s: cannot quantize to %s", p->d->name,
                        floe_type_info(p->type)->name);
          goto done;
        }
      if ((rc = gguf_writer_write_data(w, out, (size_t)j.n * rb))) {
        floe_err(err, errlen, rc, "%s", gguf_writer_error(w));
        goto done;
      }
      st.bytes += (uint64_t)j.n * rb;
      if (o->progress) o->progress(o->progress_user, st.bytes, total);
    }
    st.n_tensors++;
  }
  rc = gguf_writer_finish_err(w, err, errlen);
  w = NULL;
  st.n_mtp = c->hp.n_mtp;
  st.mlx = c->mlx;
  st.tokenizer = have_voc;
  if (stats && !rc) *stats = st;

done:
  if (w) gguf_writer_abort(w);
  if (fb)
    for (int t = 0; t < nth; t++) floe_aligned_free(fb[t]);
  if (tb)
    for (int t = 0; t < nth; t++) floe_aligned_free(tb[t]);
  if (sb)
    for (int t = 0; t < nth; t++) floe_aligned_free(sb[t]);
  free(fb);
  free(tb);
  free(sb);
  floe_aligned_free(out);
  if (pool) floe_pool_free(pool);
  if (have_voc) synth_vocab_free(&voc);
  plans_free(c);
  free(c->descs);
  if (c->st) st_model_close(c->st);
  hf_config_free(&c->cfg);
  return rc;
}
