/* Model loading (GGUF file or HF safetensors directory), binding helpers for arch/<arch>.c,
 * sessions and the forward driver. See model.h for the canonical layout and invariants. */
#include "kernels/cpu/kernels.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "experts/experts.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "model/model_meta.h"
#include "quant/quant.h"

/* ---- ownership ---- */
void *model_own(model *m, size_t bytes) {
  if (m->n_owned == m->cap_owned) {
    size_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
    void **p = realloc(m->owned, cap * sizeof *p);
    if (!p) return NULL;
    m->owned = p;
    m->cap_owned = cap;
  }
  void *p = floe_aligned_alloc(64, bytes ? bytes : 64);
  if (!p) return NULL;
  memset(p, 0, bytes);
  m->owned[m->n_owned++] = p;
  m->owned_bytes += bytes;
  return p;
}

/* ---- value-head reorder (grouped -> tiled), llama.cpp _LinearAttentionVReorderBase ---- */
static int64_t vtile_src(int64_t p, int64_t Nk, int64_t r) { return (p % Nk) * r + p / Nk; }

/* Copies `rows` rows of row_bytes from src to dst, block b of `unit` rows of the permuted range
 * [row0, row0+Nv*unit) coming from block vtile_src(b). */
static void vtile_copy_rows(uint8_t *dst, const uint8_t *src, size_t rb, int64_t rows, int64_t row0, int64_t Nk,
                            int64_t Nv, int64_t unit) {
  memcpy(dst, src, (size_t)rows * rb);
  for (int64_t p = 0; p < Nv; p++)
    memcpy(dst + (size_t)(row0 + p * unit) * rb, src + (size_t)(row0 + vtile_src(p, Nk, Nv / Nk) * unit) * rb,
           (size_t)unit * rb);
}

int model_vtile_rows(model *m, floe_mat *W, int64_t row0, int64_t Nk, int64_t Nv, int64_t unit, char *err,
                     size_t errlen) {
  if (Nk < 1 || Nv % Nk || row0 < 0 || row0 + Nv * unit > W->rows)
    return floe_err(err, errlen, FLOE_E_FORMAT, "value-head reorder: %lld rows do not hold %lld heads of %lld",
                    (long long)W->rows, (long long)Nv, (long long)unit);
  if (Nk == Nv) return 0; /* r = 1: tiled == grouped */
  uint8_t *d = model_own(m, (size_t)W->rows * W->row_bytes);
  if (!d) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  vtile_copy_rows(d, W->data, W->row_bytes, W->rows, row0, Nk, Nv, unit);
  W->data = d;
  if (W->type == FLOE_TYPE_MLX) {
    uint8_t *sc = model_own(m, (size_t)W->rows * W->sb_row_bytes), *bi = model_own(m, (size_t)W->rows * W->sb_row_bytes);
    if (!sc || !bi) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    vtile_copy_rows(sc, W->scales, W->sb_row_bytes, W->rows, row0, Nk, Nv, unit);
    vtile_copy_rows(bi, W->biases, W->sb_row_bytes, W->rows, row0, Nk, Nv, unit);
    W->scales = sc;
    W->biases = bi;
  }
  return 0;
}

/* Permutes, in each of `rows` rows (stride rb), Nv blocks of bb bytes. */
static void vtile_copy_cols(uint8_t *dst, const uint8_t *src, size_t rb, int64_t rows, int64_t Nk, int64_t Nv,
                            size_t bb) {
  for (int64_t o = 0; o < rows; o++)
    for (int64_t p = 0; p < Nv; p++)
      memcpy(dst + (size_t)o * rb + (size_t)p * bb, src + (size_t)o * rb + (size_t)vtile_src(p, Nk, Nv / Nk) * bb, bb);
}

int model_vtile_cols(model *m, floe_mat *W, int64_t Nk, int64_t Nv, int64_t unit, char *err, size_t errlen) {
  if (Nk < 1 || Nv % Nk || W->cols != Nv * unit)
    return floe_err(err, errlen, FLOE_E_FORMAT, "value-head reorder: %lld columns are not %lld heads of %lld",
                    (long long)W->cols, (long long)Nv, (long long)unit);
  if (Nk == Nv) return 0;
  const floe_type_traits *ti = floe_type_info(W->type);
  if (W->type == FLOE_TYPE_MLX && unit % W->mlx.group == 0) { /* whole groups move: codes, scales, biases */
    const size_t sbe = W->mlx.sb_type == FLOE_TYPE_F32 ? 4 : 2, ng = (size_t)(unit / W->mlx.group);
    uint8_t *d = model_own(m, (size_t)W->rows * W->row_bytes);
    uint8_t *sc = model_own(m, (size_t)W->rows * W->sb_row_bytes), *bi = model_own(m, (size_t)W->rows * W->sb_row_bytes);
    if (!d || !sc || !bi) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    vtile_copy_cols(d, W->data, W->row_bytes, W->rows, Nk, Nv, (size_t)unit * (size_t)W->mlx.bits / 8);
    vtile_copy_cols(sc, W->scales, W->sb_row_bytes, W->rows, Nk, Nv, ng * sbe);
    vtile_copy_cols(bi, W->biases, W->sb_row_bytes, W->rows, Nk, Nv, ng * sbe);
    W->data = d;
    W->scales = sc;
    W->biases = bi;
    return 0;
  }
  if (W->type == FLOE_TYPE_MLX) { /* heads split groups: dequantize once to F32 (exact values) */
    float *f = model_own(m, (size_t)(W->rows * W->cols) * sizeof(float));
    if (!f) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    for (int64_t o = 0; o < W->rows; o++)
      quant_mlx_dequant_row(&W->mlx, (const uint8_t *)W->data + (size_t)o * W->row_bytes,
                            (const uint8_t *)W->scales + (size_t)o * W->sb_row_bytes,
                            (const uint8_t *)W->biases + (size_t)o * W->sb_row_bytes, f + o * W->cols, W->cols);
    floe_mat n = { .type = FLOE_TYPE_F32, .rows = W->rows, .cols = W->cols, .data = f,
                   .row_bytes = (size_t)W->cols * sizeof(float) };
    *W = n;
  } else if (!ti || ti->quantized) {
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "value-head reorder of a block-quantized matrix");
  }
  ti = floe_type_info(W->type);
  uint8_t *d = model_own(m, (size_t)W->rows * W->row_bytes);
  if (!d) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  vtile_copy_cols(d, W->data, W->row_bytes, W->rows, Nk, Nv, (size_t)unit * (size_t)ti->bytes);
  W->data = d;
  return 0;
}

int model_vtile_vec(float *v, int64_t Nk, int64_t Nv, int64_t unit) {
  if (Nk < 1 || Nv % Nk) return FLOE_E_FORMAT;
  if (Nk == Nv) return 0;
  float *t = malloc((size_t)(Nv * unit) * sizeof(float));
  if (!t) return FLOE_E_NOMEM;
  vtile_copy_rows((uint8_t *)t, (const uint8_t *)v, (size_t)unit * sizeof(float), Nv, 0, Nk, Nv, 1);
  memcpy(v, t, (size_t)(Nv * unit) * sizeof(float));
  free(t);
  return 0;
}

void model_embed_row(const model *m, int32_t tok, float *dst) {
  const floe_mat *W = &m->tok_embd;
  const uint8_t *row = (const uint8_t *)W->data + (size_t)tok * W->row_bytes;
  if (W->type == FLOE_TYPE_MLX)
    quant_mlx_dequant_row(&W->mlx, row, (const uint8_t *)W->scales + (size_t)tok * W->sb_row_bytes,
                          (const uint8_t *)W->biases + (size_t)tok * W->sb_row_bytes, dst, W->cols);
  else
    quant_dequant_row(W->type, row, dst, W->cols);
}

void model_free(model *m) {
  if (!m) return;
  if (m->be && m->be->model_fini) m->be->model_fini(m);
  xs_close(m->xs); /* waits for reads in flight */
  xpack_close(m->pack);
  free(m->path);
  for (size_t i = 0; i < m->n_owned; i++) floe_aligned_free(m->owned[i]);
  free(m->owned);
  free(m->layers);
  if (m->gguf) gguf_close(m->gguf);
  if (m->st) st_model_close(m->st);
  free(m);
}

/* ---- sources ---- */
static int st_type(int dtype) {
  switch (dtype) {
  case ST_F32: return FLOE_TYPE_F32;
  case ST_F16: return FLOE_TYPE_F16;
  case ST_BF16: return FLOE_TYPE_BF16;
  default: return -1;
  }
}

/* The tensor an HF name refers to: as is, or under the Qwen3.5 VLM prefixes (HF
 * model.language_model.*, MLX language_model.model.* and language_model.lm_head). */
static const st_tensor *st_resolve(const st_model *st, const char *name) {
  const st_tensor *x = st_find(st, name);
  char alt[512];
  if (!x && strncmp(name, "model.", 6) == 0) {
    snprintf(alt, sizeof alt, "model.language_model.%s", name + 6);
    x = st_find(st, alt);
    if (!x) {
      snprintf(alt, sizeof alt, "language_model.%s", name);
      x = st_find(st, alt);
    }
  }
  if (!x && strcmp(name, "lm_head.weight") == 0) x = st_find(st, "language_model.lm_head.weight");
  if (!x && strncmp(name, "mtp.", 4) == 0) { /* the MTP block: top level in Qwen3.5 / Qwen3-Next, else prefixed */
    static const char *const pre[] = { "model.", "language_model.", "model.language_model." };
    for (size_t i = 0; i < sizeof pre / sizeof pre[0] && !x; i++) {
      snprintf(alt, sizeof alt, "%s%s", pre[i], name);
      x = st_find(st, alt);
    }
  }
  return x;
}

static int find_st(const st_model *st, const char *name, model_tref *t) {
  const st_tensor *x = st_resolve(st, name);
  if (!x) return FLOE_E_NOTFOUND;
  int ty = st_type(x->dtype);
  if (ty < 0 || x->n_dims > 4) return FLOE_E_UNSUPPORTED;
  t->name = x->name;
  t->type = (uint32_t)ty;
  t->n_dims = x->n_dims;
  for (int i = 0; i < 4; i++) t->shape[i] = i < x->n_dims ? x->shape[i] : 1;
  t->n_elements = x->n_elements;
  t->data = x->data;
  return 0;
}

static int find_gguf(const gguf_file *g, const char *name, model_tref *t) {
  const gguf_tensor *x = gguf_find_tensor(g, name);
  if (!x) return FLOE_E_NOTFOUND;
  t->name = name;
  t->type = x->type;
  t->n_dims = (int)x->n_dims;
  t->n_elements = 1;
  for (int i = 0; i < 4; i++) t->shape[i] = 1;
  for (uint32_t i = 0; i < x->n_dims; i++) { /* ggml ne[0] is the contiguous dim: reverse */
    t->shape[x->n_dims - 1 - i] = x->ne[i];
    t->n_elements *= x->ne[i];
  }
  t->data = x->data;
  return 0;
}

int model_src_find(const model_src *src, const char *name, model_tref *t) {
  memset(t, 0, sizeof *t);
  return src->kind == MODEL_SRC_GGUF ? find_gguf(src->g, name, t) : find_st(src->st, name, t);
}

bool model_src_has(const model_src *src, const char *name) { /* present, whatever its dtype (MLX codes are U32) */
  model_tref t;
  return model_src_find(src, name, &t) != FLOE_E_NOTFOUND;
}

static int need(const model_src *src, const char *name, model_tref *t, char *err, size_t errlen) {
  int rc = model_src_find(src, name, t);
  if (rc == FLOE_E_NOTFOUND) return floe_err(err, errlen, rc, "tensor '%s' not found", name);
  if (rc) return floe_err(err, errlen, rc, "tensor '%s': unsupported dtype", name);
  const floe_type_traits *ti = floe_type_info(t->type);
  if (!ti || !ti->supported) return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "tensor '%s': unsupported type %u", name, t->type);
  return 0;
}

/* Matrix view of `rows` rows starting at element offset `elem0` (a multiple of cols). Copies the
 * rows when the data is not aligned to the element size (safetensors offsets may be odd). */
static int make_mat(model *m, const model_tref *t, int64_t elem0, int64_t rows, int64_t cols, floe_mat *out,
                    char *err, size_t errlen) {
  size_t rb = floe_row_bytes(t->type, cols);
  if (rb == 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "tensor '%s': %lld columns do not fit type blocks", t->name,
                    (long long)cols);
  const floe_type_traits *ti = floe_type_info(t->type);
  const uint8_t *p = t->data + (size_t)(elem0 / cols) * rb;
  memset(out, 0, sizeof *out);
  out->type = t->type;
  out->rows = rows;
  out->cols = cols;
  out->row_bytes = rb;
  size_t align = ti->quantized ? 2 : (size_t)ti->bytes;
  if (((uintptr_t)p % align) != 0) {
    uint64_t n;
    if (!floe_mul_ok((uint64_t)rows, rb, &n)) return floe_err(err, errlen, FLOE_E_OVERFLOW, "tensor '%s' too large", t->name);
    void *c = model_own(m, (size_t)n);
    if (!c) return floe_err(err, errlen, FLOE_E_NOMEM, "tensor '%s': out of memory", t->name);
    memcpy(c, p, (size_t)n);
    p = c;
  }
  out->data = p;
  return 0;
}

/* MLX affine matrix: rows [row0, row0+rows) of slab e of "<module>.weight" (uint32 codes, 2-D
 * [R][cols*bits/32] or 3-D switch_mlp [n_slab][R][cols*bits/32]) with "<module>.scales" and
 * "<module>.biases" [..][R][cols/group]. *found = false (and 0) when the module is not quantized
 * (no .scales, as mlx-lm decides), so the caller binds it as a dense tensor. n_slab = 0: 2-D. */
static int mlx_mat(model *m, const model_src *src, const char *name, int64_t n_slab, int64_t slab_rows, int64_t e,
                   int64_t row0, int64_t rows, int64_t cols, floe_mat *out, bool *found, char *err, size_t errlen) {
  *found = false;
  if (!src->mlx || src->kind != MODEL_SRC_HF) return 0;
  const st_tensor *q = st_resolve(src->st, name);
  if (!q) return 0; /* the dense path reports it */
  char base[512], sn[520], bn[520];
  size_t bl = strlen(q->name);
  if (bl > 7 && strcmp(q->name + bl - 7, ".weight") == 0) bl -= 7;
  if (bl >= sizeof base) return floe_err(err, errlen, FLOE_E_FORMAT, "tensor '%s': name too long", q->name);
  memcpy(base, q->name, bl);
  base[bl] = 0;
  snprintf(sn, sizeof sn, "%s.scales", base);
  snprintf(bn, sizeof bn, "%s.biases", base);
  const st_tensor *sc = st_find(src->st, sn), *bi = st_find(src->st, bn);
  if (!sc) return 0;
  *found = true;
  int bits = 0, group = 0;
  bool quantized = false;
  int rc = hf_quant_for(src->mlx, base, &bits, &group, &quantized);
  if (rc || !quantized)
    return floe_err(err, errlen, rc ? rc : FLOE_E_FORMAT, "%s: %s quantization (bits %d, group %d)", base,
                    rc ? "unsupported" : "config.json does not declare its", bits, group);
  const int sbt = sc->dtype == ST_BF16 ? FLOE_TYPE_BF16 : sc->dtype == ST_F16 ? FLOE_TYPE_F16 : FLOE_TYPE_F32;
  quant_mlx_fmt f = { bits, group, (uint32_t)sbt };
  const int nd = n_slab > 0 ? 3 : 2;
  const int64_t R = n_slab > 0 ? slab_rows : rows, S = n_slab > 0 ? n_slab : 1;
  if (!bi || q->dtype != ST_U32 || (sc->dtype != ST_BF16 && sc->dtype != ST_F16 && sc->dtype != ST_F32) ||
      bi->dtype != sc->dtype || !quant_mlx_fmt_valid(&f) || cols % group || (cols * bits) % 32 ||
      q->n_dims != nd || sc->n_dims != nd || bi->n_dims != nd || q->shape[nd - 1] != cols * bits / 32 ||
      sc->shape[nd - 1] != cols / group || bi->shape[nd - 1] != cols / group || q->shape[nd - 2] != R ||
      sc->shape[nd - 2] != R || bi->shape[nd - 2] != R || (nd == 3 && (q->shape[0] != S || sc->shape[0] != S ||
      bi->shape[0] != S)))
    return floe_err(err, errlen, FLOE_E_FORMAT,
                    "%s: MLX tensors do not match %lld x %lld at %d bits, group %d (codes U32, scales/biases alike)",
                    base, (long long)R, (long long)cols, bits, group);
  const size_t rb = quant_mlx_row_bytes(&f, cols), sbe = sbt == FLOE_TYPE_F32 ? 4 : 2;
  const size_t srb = (size_t)(cols / group) * sbe, r0 = (size_t)(e * R + row0);
  memset(out, 0, sizeof *out);
  out->type = FLOE_TYPE_MLX;
  out->rows = rows;
  out->cols = cols;
  out->row_bytes = rb;
  out->mlx = f;
  out->sb_row_bytes = srb;
  const uint8_t *pq = q->data + r0 * rb, *ps = sc->data + r0 * srb, *pb = bi->data + r0 * srb;
  if ((uintptr_t)pq % 4 || (uintptr_t)ps % sbe || (uintptr_t)pb % sbe) { /* safetensors offsets may be odd */
    uint8_t *c = model_own(m, (size_t)rows * (rb + 2 * srb));
    if (!c) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", base);
    memcpy(c, pq, (size_t)rows * rb);
    memcpy(c + (size_t)rows * rb, ps, (size_t)rows * srb);
    memcpy(c + (size_t)rows * (rb + srb), pb, (size_t)rows * srb);
    pq = c;
    ps = c + (size_t)rows * rb;
    pb = ps + (size_t)rows * srb;
  }
  out->data = pq;
  out->scales = ps;
  out->biases = pb;
  return 0;
}

int model_bind_mat(model *m, const model_src *src, const char *name, int64_t rows, int64_t cols, floe_mat *out,
                   char *err, size_t errlen) {
  model_tref t;
  bool mlx;
  int rc = mlx_mat(m, src, name, 0, rows, 0, 0, rows, cols, out, &mlx, err, errlen);
  if (rc || mlx) return rc;
  rc = need(src, name, &t, err, errlen);
  if (rc) return rc;
  if (t.shape[t.n_dims - 1] != cols || t.n_elements != rows * cols)
    return floe_err(err, errlen, FLOE_E_FORMAT, "tensor '%s': shape does not match %lld x %lld", name,
                    (long long)rows, (long long)cols);
  return make_mat(m, &t, 0, rows, cols, out, err, errlen);
}

int model_bind_slab(model *m, const model_src *src, const char *name, int64_t n_slab, int64_t slab_rows, int64_t e,
                    int64_t row0, int64_t rows, int64_t cols, floe_mat *out, char *err, size_t errlen) {
  model_tref t;
  bool mlx;
  int rc = mlx_mat(m, src, name, n_slab, slab_rows, e, row0, rows, cols, out, &mlx, err, errlen);
  if (rc || mlx) return rc;
  rc = need(src, name, &t, err, errlen);
  if (rc) return rc;
  if (t.n_dims != 3 || t.shape[0] != n_slab || t.shape[1] != slab_rows || t.shape[2] != cols)
    return floe_err(err, errlen, FLOE_E_FORMAT, "tensor '%s': shape does not match %lld x %lld x %lld", name,
                    (long long)n_slab, (long long)slab_rows, (long long)cols);
  return make_mat(m, &t, (e * slab_rows + row0) * cols, rows, cols, out, err, errlen);
}

int model_bind_vec(model *m, const model_src *src, const char *name, int64_t n, float add, float **out, char *err,
                   size_t errlen) {
  model_tref t;
  int rc = need(src, name, &t, err, errlen);
  if (rc) return rc;
  if (t.n_elements != n)
    return floe_err(err, errlen, FLOE_E_FORMAT, "tensor '%s': %lld elements, expected %lld", name,
                    (long long)t.n_elements, (long long)n);
  const floe_type_traits *ti = floe_type_info(t.type);
  if (ti->quantized || n % ti->blck)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "tensor '%s': quantized vectors are not supported", name);
  float *v = model_own(m, (size_t)n * sizeof(float));
  void *tmp = model_own(m, (size_t)n * (size_t)ti->bytes);
  if (!v || !tmp) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  memcpy(tmp, t.data, (size_t)n * (size_t)ti->bytes); /* unaligned source */
  quant_dequant_row(t.type, tmp, v, n);
  for (int64_t i = 0; i < n; i++) v[i] += add;
  *out = v;
  return 0;
}

int model_bind_experts(model *m, const model_src *src, int64_t l, char *err, size_t errlen) {
  const floe_hparams *hp = &m->hp;
  model_layer *L = &m->layers[l];
  const int64_t NE = hp->n_expert, E = hp->n_embd, I = hp->n_ff_exp;
  L->exp_gate = model_own(m, (size_t)NE * sizeof(floe_mat));
  L->exp_up = model_own(m, (size_t)NE * sizeof(floe_mat));
  L->exp_down = model_own(m, (size_t)NE * sizeof(floe_mat));
  if (!L->exp_gate || !L->exp_up || !L->exp_down) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  char a[256], b[256], c[256];
  int rc = 0;
  if (src->kind == MODEL_SRC_GGUF) {
    snprintf(a, sizeof a, "blk.%lld.ffn_gate_exps.weight", (long long)l);
    snprintf(b, sizeof b, "blk.%lld.ffn_up_exps.weight", (long long)l);
    snprintf(c, sizeof c, "blk.%lld.ffn_down_exps.weight", (long long)l);
    bool fused = !model_src_has(src, a);
    if (fused) snprintf(a, sizeof a, "blk.%lld.ffn_gate_up_exps.weight", (long long)l);
    for (int64_t e = 0; e < NE && !rc; e++) {
      if (fused) {
        rc = model_bind_slab(m, src, a, NE, 2 * I, e, 0, I, E, &L->exp_gate[e], err, errlen);
        if (!rc) rc = model_bind_slab(m, src, a, NE, 2 * I, e, I, I, E, &L->exp_up[e], err, errlen);
      } else {
        rc = model_bind_slab(m, src, a, NE, I, e, 0, I, E, &L->exp_gate[e], err, errlen);
        if (!rc) rc = model_bind_slab(m, src, b, NE, I, e, 0, I, E, &L->exp_up[e], err, errlen);
      }
      if (!rc) rc = model_bind_slab(m, src, c, NE, E, e, 0, E, I, &L->exp_down[e], err, errlen);
    }
    return rc;
  }
  char pre[128]; /* "model.layers.L." (the MTP block: "mtp.layers.J.") */
  model_lname(src, l, "", "", pre, sizeof pre);
  snprintf(a, sizeof a, "%smlp.switch_mlp.gate_proj.weight", pre);
  if (model_src_has(src, a)) { /* MLX (mlx-lm sanitize): stacks [E][out][in], quantized or dense */
    snprintf(b, sizeof b, "%smlp.switch_mlp.up_proj.weight", pre);
    snprintf(c, sizeof c, "%smlp.switch_mlp.down_proj.weight", pre);
    for (int64_t e = 0; e < NE && !rc; e++) {
      rc = model_bind_slab(m, src, a, NE, I, e, 0, I, E, &L->exp_gate[e], err, errlen);
      if (!rc) rc = model_bind_slab(m, src, b, NE, I, e, 0, I, E, &L->exp_up[e], err, errlen);
      if (!rc) rc = model_bind_slab(m, src, c, NE, E, e, 0, E, I, &L->exp_down[e], err, errlen);
    }
    return rc;
  }
  snprintf(a, sizeof a, "%smlp.experts.gate_up_proj", pre);
  if (model_src_has(src, a)) { /* transformers 5 fused layout: [E][2I][H], [E][H][I] */
    snprintf(c, sizeof c, "%smlp.experts.down_proj", pre);
    for (int64_t e = 0; e < NE && !rc; e++) {
      rc = model_bind_slab(m, src, a, NE, 2 * I, e, 0, I, E, &L->exp_gate[e], err, errlen);
      if (!rc) rc = model_bind_slab(m, src, a, NE, 2 * I, e, I, I, E, &L->exp_up[e], err, errlen);
      if (!rc) rc = model_bind_slab(m, src, c, NE, E, e, 0, E, I, &L->exp_down[e], err, errlen);
    }
    return rc;
  }
  for (int64_t e = 0; e < NE && !rc; e++) {
    snprintf(a, sizeof a, "%smlp.experts.%lld.gate_proj.weight", pre, (long long)e);
    snprintf(b, sizeof b, "%smlp.experts.%lld.up_proj.weight", pre, (long long)e);
    snprintf(c, sizeof c, "%smlp.experts.%lld.down_proj.weight", pre, (long long)e);
    rc = model_bind_mat(m, src, a, I, E, &L->exp_gate[e], err, errlen);
    if (!rc) rc = model_bind_mat(m, src, b, I, E, &L->exp_up[e], err, errlen);
    if (!rc) rc = model_bind_mat(m, src, c, E, I, &L->exp_down[e], err, errlen);
  }
  return rc;
}

const char *model_lname(const model_src *src, int64_t l, const char *gguf, const char *hf, char *buf, size_t n) {
  if (src->kind == MODEL_SRC_GGUF) {
    if (l < 0) snprintf(buf, n, "%s", gguf);
    else snprintf(buf, n, "blk.%lld.%s", (long long)l, gguf);
  } else {
    if (l < 0) snprintf(buf, n, "%s", hf);
    else if (src->n_trunk > 0 && l >= src->n_trunk) snprintf(buf, n, "mtp.layers.%lld.%s", (long long)(l - src->n_trunk), hf);
    else snprintf(buf, n, "model.layers.%lld.%s", (long long)l, hf);
  }
  return buf;
}

#define NM(g, h) model_lname(src, l, g, h, nm, sizeof nm)
#define TRY(x) do { if ((rc = (x))) return rc; } while (0)

int model_bind_common(model *m, const model_src *src, int64_t l, bool zc, char *err, size_t errlen) {
  const floe_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd, V = hp->n_vocab, hd = hp->head_dim;
  /* GGUF and MLX (mlx-lm sanitize) hold 1+w already; HF holds w */
  const float add = (zc && src->kind == MODEL_SRC_HF && !src->mlx) ? 1.0f : 0.0f;
  char nm[256];
  int rc;
  if (l < 0) {
    TRY(model_bind_mat(m, src, NM("token_embd.weight", "model.embed_tokens.weight"), V, E, &m->tok_embd, err, errlen));
    TRY(model_bind_vec(m, src, NM("output_norm.weight", "model.norm.weight"), E, add, &m->output_norm, err, errlen));
    const char *out = NM("output.weight", "lm_head.weight");
    if (model_src_has(src, out) || !hp->tied_embeddings)
      TRY(model_bind_mat(m, src, out, V, E, &m->output, err, errlen));
    else
      m->output = m->tok_embd;
    return 0;
  }
  model_layer *L = &m->layers[l];
  const bool gguf_post = src->kind == MODEL_SRC_GGUF && hp->arch != FLOE_ARCH_QWEN3MOE;
  TRY(model_bind_vec(m, src, NM("attn_norm.weight", "input_layernorm.weight"), E, add, &L->attn_norm, err, errlen));
  TRY(model_bind_vec(m, src, NM(gguf_post ? "post_attention_norm.weight" : "ffn_norm.weight",
                                "post_attention_layernorm.weight"), E, add, &L->ffn_norm, err, errlen));
  if (!hp->recurrent[l]) {
    const int64_t qrows = hp->n_head * hd * (hp->attn_gate ? 2 : 1), kvrows = hp->n_head_kv * hd;
    TRY(model_bind_mat(m, src, NM("attn_q.weight", "self_attn.q_proj.weight"), qrows, E, &L->wq, err, errlen));
    TRY(model_bind_mat(m, src, NM("attn_k.weight", "self_attn.k_proj.weight"), kvrows, E, &L->wk, err, errlen));
    TRY(model_bind_mat(m, src, NM("attn_v.weight", "self_attn.v_proj.weight"), kvrows, E, &L->wv, err, errlen));
    TRY(model_bind_mat(m, src, NM("attn_output.weight", "self_attn.o_proj.weight"), E, hp->n_head * hd, &L->wo, err,
                       errlen));
    TRY(model_bind_vec(m, src, NM("attn_q_norm.weight", "self_attn.q_norm.weight"), hd, add, &L->q_norm, err, errlen));
    TRY(model_bind_vec(m, src, NM("attn_k_norm.weight", "self_attn.k_norm.weight"), hd, add, &L->k_norm, err, errlen));
  }
  TRY(model_bind_mat(m, src, NM("ffn_gate_inp.weight", "mlp.gate.weight"), hp->n_expert, E, &L->router, err, errlen));
  TRY(model_bind_experts(m, src, l, err, errlen));
  if (hp->n_ff_shexp > 0) {
    const int64_t S = hp->n_ff_shexp;
    TRY(model_bind_mat(m, src, NM("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"), S, E, &L->sh_gate,
                       err, errlen));
    TRY(model_bind_mat(m, src, NM("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"), S, E, &L->sh_up, err,
                       errlen));
    TRY(model_bind_mat(m, src, NM("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"), E, S, &L->sh_down,
                       err, errlen));
    TRY(model_bind_mat(m, src, NM("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"), 1, E,
                       &L->sh_gate_inp, err, errlen));
  }
  return 0;
}

int model_bind_gdn_common(model *m, const model_src *src, int64_t l, char *err, size_t errlen) {
  const floe_hparams *hp = &m->hp;
  model_layer *L = &m->layers[l];
  const int64_t E = hp->n_embd, Nv = hp->ssm_dt_rank, vd = hp->ssm_d_inner, dv = vd / Nv;
  const int64_t C = 2 * hp->ssm_n_group * hp->ssm_d_state + vd, K = hp->ssm_conv_kernel;
  char nm[256];
  int rc;
  /* conv1d: HF [C, 1, K], GGUF {K, C}: both C rows of K */
  TRY(model_bind_vec(m, src, NM("ssm_conv1d.weight", "linear_attn.conv1d.weight"), C * K, 0.0f, &L->conv_w, err,
                     errlen));
  TRY(model_bind_vec(m, src, NM("ssm_dt.bias", "linear_attn.dt_bias"), Nv, 0.0f, &L->dt_bias, err, errlen));
  if (src->kind == MODEL_SRC_GGUF) {
    TRY(model_bind_vec(m, src, NM("ssm_a", ""), Nv, 0.0f, &L->ssm_a, err, errlen)); /* holds -exp(A_log) */
  } else {
    TRY(model_bind_vec(m, src, NM("", "linear_attn.A_log"), Nv, 0.0f, &L->ssm_a, err, errlen));
    for (int64_t i = 0; i < Nv; i++) L->ssm_a[i] = -expf(L->ssm_a[i]);
  }
  TRY(model_bind_vec(m, src, NM("ssm_norm.weight", "linear_attn.norm.weight"), dv, 0.0f, &L->ssm_norm, err, errlen));
  TRY(model_bind_mat(m, src, NM("ssm_out.weight", "linear_attn.out_proj.weight"), E, vd, &L->ssm_out, err, errlen));
  return 0;
}

/* ---- loading ---- */
static const model_arch *arch_of(int arch) {
  switch (arch) {
  case FLOE_ARCH_QWEN3MOE: return &model_arch_qwen3moe;
  case FLOE_ARCH_QWEN3NEXT: return &model_arch_qwen3next;
  case FLOE_ARCH_QWEN35MOE: return &model_arch_qwen35moe;
  default: return NULL;
  }
}

/* with_mtp: the MTP block's routed experts too, as layer n_layer (streamed like the trunk's). A
 * pack holds the trunk's experts only: its binding and writing use the trunk view, and a model
 * bound to a pack uses its MTP experts in place (through the source file's mapping). */
static int xs_view(const model *m, xs_model *v, bool with_mtp) {
  memset(v, 0, sizeof *v);
  const int64_t NL = m->hp.n_layer + (with_mtp ? 1 : 0);
  v->n_layer = NL;
  v->n_expert = m->hp.n_expert;
  v->n_expert_used = m->hp.n_expert_used;
  v->gate = calloc((size_t)NL, sizeof *v->gate);
  v->up = calloc((size_t)NL, sizeof *v->up);
  v->down = calloc((size_t)NL, sizeof *v->down);
  if (!v->gate || !v->up || !v->down) {
    model_xs_view_free(v);
    return FLOE_E_NOMEM;
  }
  for (int64_t l = 0; l < NL; l++) {
    v->gate[l] = m->layers[l].exp_gate;
    v->up[l] = m->layers[l].exp_up;
    v->down[l] = m->layers[l].exp_down;
  }
  v->gguf = m->gguf;
  v->st = m->st;
  v->pack = m->pack;
  v->owned_bytes = m->owned_bytes;
  return 0;
}

int model_xs_view(const model *m, xs_model *v) { return xs_view(m, v, m->mtp.on && !m->pack); }

void model_xs_view_free(xs_model *v) {
  free(v->gate);
  free(v->up);
  free(v->down);
  memset(v, 0, sizeof *v);
}

int model_store_open(const model *m, bool direct, xs_store **out, char *err, size_t errlen) {
  xs_model v;
  if (model_xs_view(m, &v)) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  int rc = xs_store_open(&v, direct, out, err, errlen);
  model_xs_view_free(&v);
  return rc;
}

int model_pack_write(const model *m, const char *source, const char *dir, char *err, size_t errlen) {
  if (m->lanes) return floe_err(err, errlen, FLOE_E_INVALID, "the model's matrices were repacked for the CPU: not the file's bytes");
  xs_model v;
  if (xs_view(m, &v, false)) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  int rc = xpack_write(&v, source, dir, err, errlen);
  model_xs_view_free(&v);
  return rc;
}

static uint64_t mat_bytes(const floe_mat *W) {
  if (!W || !W->data) return 0;
  return (uint64_t)W->rows * (W->row_bytes + (W->type == FLOE_TYPE_MLX ? 2 * W->sb_row_bytes : 0));
}

uint64_t model_weight_bytes(const model *m) {
  const floe_hparams *hp = &m->hp;
  uint64_t n = mat_bytes(&m->tok_embd) + mat_bytes(&m->output);
  for (int64_t l = 0; l < hp->n_layer; l++) {
    const model_layer *L = &m->layers[l];
    const floe_mat *one[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->ssm_qkvz, &L->ssm_ba, &L->ssm_qkv, &L->ssm_z,
                              &L->ssm_b, &L->ssm_alpha, &L->ssm_out, &L->router, &L->sh_gate, &L->sh_up,
                              &L->sh_down, &L->sh_gate_inp };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) n += mat_bytes(one[i]);
    for (int64_t e = 0; e < hp->n_expert && L->exp_gate; e++)
      n += mat_bytes(&L->exp_gate[e]) + mat_bytes(&L->exp_up[e]) + mat_bytes(&L->exp_down[e]);
  }
  return n;
}

int model_use_backend(model *m, const model_backend *be, int dev_index, char *err, size_t errlen) {
  if (be == m->be) return 0;
  if (m->be != &model_backend_cpu)
    return floe_err(err, errlen, FLOE_E_INVALID, "the model is already on the %s backend", m->be->name);
  if (m->lanes) return floe_err(err, errlen, FLOE_E_INVALID, "the model's matrices were repacked for the CPU");
  if (m->xs && be != &model_backend_cpu && !m->gpu_mem)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "streamed experts (--mem-budget) need --gpu-mem on the GPU");
  if (be->model_init) {
    int rc = be->model_init(m, dev_index, err, errlen);
    if (rc) return rc;
  }
  m->be = be;
  return 0;
}

int model_stream_start(model *m, const xs_params *p, char *err, size_t errlen) {
  if (m->xs) return floe_err(err, errlen, FLOE_E_INVALID, "expert streaming already started");
  if (m->lanes) return floe_err(err, errlen, FLOE_E_INVALID, "the model's matrices were repacked for the CPU: it is not streamed");
  xs_model v;
  if (model_xs_view(m, &v)) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  int rc = xs_open(&v, p, &m->xs, err, errlen);
  model_xs_view_free(&v);
  return rc;
}

static int model_load_src(const char *path, int load, model **out, char *err, size_t errlen);

int model_load(const char *path, model **out, char *err, size_t errlen) {
  return model_load_ex(path, FLOE_LOAD_MMAP, out, err, errlen);
}

/* bytes of the file, or of a directory's *.safetensors files; 0 if unknown */
static uint64_t model_file_bytes(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) return 0;
  if (!S_ISDIR(sb.st_mode)) return (uint64_t)sb.st_size;
  DIR *d = opendir(path);
  if (!d) return 0;
  uint64_t sum = 0;
  char p[4096];
  for (struct dirent *de; (de = readdir(d));) {
    const size_t n = strlen(de->d_name);
    if (n < 12 || strcmp(de->d_name + n - 12, ".safetensors")) continue;
    snprintf(p, sizeof p, "%s/%s", path, de->d_name);
    if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) sum += (uint64_t)sb.st_size;
  }
  closedir(d);
  return sum;
}

int model_load_ex(const char *path, int load, model **out, char *err, size_t errlen) {
  *out = NULL;
  if (load == FLOE_LOAD_AUTO) {
    const uint64_t b = model_file_bytes(path);
    load = b && floe_copy_fits(b) ? FLOE_LOAD_COPY : FLOE_LOAD_MMAP;
  }
  if (!xpack_is_dir(path)) return model_load_src(path, load, out, err, errlen);
  xpack *pk;
  int rc = xpack_open(path, &pk, err, errlen);
  if (rc) return rc;
  model *m;
  if ((rc = model_load_src(xpack_source(pk), FLOE_LOAD_MMAP, &m, err, errlen))) { /* experts come from the pack */
    xpack_close(pk);
    return rc;
  }
  xs_model v;
  if ((rc = xs_view(m, &v, false)) == 0) {
    rc = xpack_bind(pk, &v, err, errlen);
    model_xs_view_free(&v);
  } else {
    rc = floe_err(err, errlen, rc, "out of memory");
  }
  if (rc) {
    xpack_close(pk);
    model_free(m);
    return rc;
  }
  m->pack = pk;
  *out = m;
  return 0;
}

static int model_load_src(const char *path, int load, model **out, char *err, size_t errlen) {
  *out = NULL;
  const bool copy = load == FLOE_LOAD_COPY;
  model *m = calloc(1, sizeof *m);
  if (!m || !(m->path = strdup(path))) {
    free(m);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  model_src src = { 0 };
  struct stat sb;
  int rc;
  hf_config cfg; /* kept until binding is done: its quantization table is read by mlx_mat */
  memset(&cfg, 0, sizeof cfg);
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    if ((rc = hf_config_load(path, &cfg, err, errlen))) goto fail;
    m->hp = cfg.hp;
    if ((rc = st_model_open_ex(path, copy, &m->st, err, errlen))) goto fail;
    src.kind = MODEL_SRC_HF;
    src.st = m->st;
    if (cfg.quant.present) { /* MLX quantized directory */
      src.mlx = &cfg.quant;
      m->src_mlx = true;
    }
  } else {
    if ((rc = gguf_open_ex(path, copy, &m->gguf, err, errlen))) goto fail;
    if ((rc = model_hparams_from_gguf(m->gguf, &m->hp, err, errlen))) goto fail;
    src.kind = MODEL_SRC_GGUF;
    src.g = m->gguf;
  }
  src.n_trunk = m->hp.n_layer;
  m->src_kind = src.kind;
  m->copied = copy;
  const floe_hparams *hp = &m->hp;
  m->arch = arch_of(hp->arch);
  m->be = &model_backend_cpu;
  if (!m->arch) {
    rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: unsupported architecture", path);
    goto fail;
  }
  if (hp->n_layer < 1 || hp->n_layer > FLOE_MAX_LAYERS || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv ||
      hp->n_rot > hp->head_dim || hp->n_rot % 2 || hp->n_expert < 1 || hp->n_expert_used < 1 ||
      hp->n_expert_used > hp->n_expert) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: inconsistent hyper-parameters", path);
    goto fail;
  }
  for (int64_t l = 0; l < hp->n_layer; l++)
    if (hp->recurrent[l] && (hp->ssm_n_group < 1 || hp->ssm_dt_rank % hp->ssm_n_group ||
                             hp->ssm_d_inner % hp->ssm_dt_rank || hp->ssm_conv_kernel < 2)) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: inconsistent GatedDeltaNet sizes", path);
      goto fail;
    }
  m->layers = calloc((size_t)hp->n_layer + 1, sizeof *m->layers); /* + the MTP block's layer */
  if (!m->layers) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto fail;
  }
  if ((rc = m->arch->bind(m, &src, err, errlen))) goto fail;
  if ((rc = model_mtp_bind(m, &src, err, errlen))) goto fail;
  for (int64_t l = 0; l < hp->n_layer; l++) { /* the conv weights channel-major, after any reorder */
    model_layer *L = &m->layers[l];
    if (!hp->recurrent[l] || !L->conv_w) continue;
    const int64_t C = 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner, K = hp->ssm_conv_kernel;
    if (!(L->conv_wt = model_own(m, (size_t)(C * K) * sizeof(float)))) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      goto fail;
    }
    for (int64_t ch = 0; ch < C; ch++)
      for (int64_t q = 0; q < K; q++) L->conv_wt[q * C + ch] = L->conv_w[ch * K + q];
  }
  hf_config_free(&cfg);
  *out = m;
  return 0;
fail:
  hf_config_free(&cfg);
  model_free(m);
  return rc;
}

/* ---- sessions ---- */
int model_session_new(const model *m, int64_t n_ctx, int kv_type, int n_threads, model_session **out, char *err,
                      size_t errlen) {
  *out = NULL;
  const floe_hparams *hp = &m->hp;
  if (n_ctx <= 0) n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
  model_session *s = calloc(1, sizeof *s);
  if (!s) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  s->m = m;
  s->be = m->be;
  s->greedy = -1;
  s->ahead_pos = -1;
  s->act_q = true;
  s->max_batch = MODEL_MAX_BATCH;
  int rc = kv_init_dims(&s->kv, hp, n_ctx, kv_type, err, errlen);
  if (!rc) rc = s->be->session_init(s, n_threads, err, errlen);
  if (rc) {
    model_session_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void model_session_free(model_session *s) {
  if (!s) return;
  model_ahead_drop(s, NULL, 0);
  for (int i = 0; i < s->max_ckpt; i++) s->be->ckpt_free(s, &s->ckpt[i].c);
  free(s->ckpt);
  s->be->session_free(s);
  free(s->lg_multi);
  free(s);
}

void model_session_set_exact(model_session *s, bool exact) {
  model_ahead_drop(s, NULL, 0);
  s->act_q = !exact;
}

/* Forgets every token: the backend zeroes the recurrent state; attention rows past n_past are dead. */
static void session_state_reset(model_session *s) {
  model_ahead_drop(s, NULL, 0);
  s->be->state_reset(s);
  s->kv.n_past = 0;
}

void model_session_reset(model_session *s) {
  session_state_reset(s);
  for (int i = 0; i < s->max_ckpt; i++) s->ckpt[i].c.pos = -1; /* buffers kept for reuse */
}
int64_t model_session_pos(const model_session *s) { return s->kv.n_past; }
int64_t model_session_recorded(const model_session *s) { return s->n_recorded; }

/* ---- checkpoints ---- */
int model_session_set_ckpt_max(model_session *s, int max, char *err, size_t errlen) {
  if (max < 0 || max > 4096) return floe_err(err, errlen, FLOE_E_INVALID, "checkpoint count %d out of [0, 4096]", max);
  if (s->be->ckpt_bytes(s) == 0) max = 0; /* pure attention: rewinding needs no copy */
  model_ckpt *c = max ? calloc((size_t)max, sizeof *c) : NULL;
  if (max && !c) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  for (int i = 0; i < s->max_ckpt; i++) s->be->ckpt_free(s, &s->ckpt[i].c);
  free(s->ckpt);
  for (int i = 0; i < max; i++) c[i].c.pos = -1;
  s->ckpt = c;
  s->max_ckpt = max;
  return 0;
}

size_t model_session_ckpt_bytes(const model_session *s) { return s->be->ckpt_bytes(s); }

int model_session_checkpoint(model_session *s, int kind) {
  if (s->max_ckpt == 0) return 0;
  if (model_ahead_drop(s, NULL, 0)) return FLOE_E_IO;
  const int64_t pos = s->kv.n_past;
  model_ckpt *dst = NULL;
  for (int i = 0; i < s->max_ckpt; i++) {
    model_ckpt *c = &s->ckpt[i];
    if (c->c.pos == pos) { /* same tokens (invariant), same state: keep the copy */
      c->seq = ++s->ckpt_seq;
      if (kind > c->kind) c->kind = kind;
      return 0;
    }
    if (c->c.pos < 0) {
      if (!dst || dst->c.pos >= 0) dst = c;
    } else if (!dst || (dst->c.pos >= 0 && (c->kind < dst->kind || (c->kind == dst->kind && c->seq < dst->seq)))) {
      dst = c;
    }
  }
  dst->c.pos = -1; /* a failed save leaves the slot unused */
  int rc = s->be->ckpt_save(s, &dst->c);
  if (rc) return rc;
  dst->c.pos = pos;
  dst->kind = kind;
  dst->seq = ++s->ckpt_seq;
  return 0;
}

/* The checkpoint rewind(pos) restores (NULL: none, a reset). */
static model_ckpt *rewind_ckpt(const model_session *s, int64_t pos) {
  model_ckpt *best = NULL;
  for (int i = 0; i < s->max_ckpt; i++) {
    model_ckpt *c = &s->ckpt[i];
    if (c->c.pos >= 0 && c->c.pos <= pos && (!best || c->c.pos > best->c.pos)) best = c;
  }
  return best;
}

int64_t model_session_rewind_pos(const model_session *s, int64_t pos) {
  if (pos < 0) pos = 0;
  if (pos >= s->kv.n_past || s->be->ckpt_bytes(s) == 0) return pos < s->kv.n_past ? pos : s->kv.n_past;
  const model_ckpt *c = rewind_ckpt(s, pos);
  return c ? c->c.pos : 0;
}

int64_t model_session_rewind(model_session *s, int64_t pos) {
  kv_state *kv = &s->kv;
  if (pos < 0) pos = 0;
  if (pos >= kv->n_past) return kv->n_past;
  model_ahead_drop(s, NULL, 0);
  if (s->be->ckpt_bytes(s) == 0) {
    kv->n_past = pos;
    return pos;
  }
  model_ckpt *best = rewind_ckpt(s, pos);
  const int64_t to = best ? best->c.pos : 0;
  if (best) {
    FLOE_ASSERT(best->c.data && best->c.pos >= 0 && best->c.pos <= kv->n_past);
    s->be->ckpt_restore(s, &best->c);
    kv->n_past = best->c.pos;
    best->seq = ++s->ckpt_seq;
  } else {
    session_state_reset(s);
  }
  for (int i = 0; i < s->max_ckpt; i++)
    if (s->ckpt[i].c.pos > to) s->ckpt[i].c.pos = -1;
  return to;
}

int model_session_ckpt_list(const model_session *s, int64_t *pos, int cap) {
  int n = 0;
  for (int i = 0; i < s->max_ckpt; i++) {
    const int64_t p = s->ckpt[i].c.pos;
    if (p < 0) continue;
    int k = n < cap ? n : cap; /* insertion into the sorted prefix that fits */
    while (k > 0 && pos[k - 1] > p) {
      if (k < cap) pos[k] = pos[k - 1];
      k--;
    }
    if (k < cap) pos[k] = p;
    n++;
  }
  return n;
}

int model_verify(model_session *s, const int32_t *tokens, int64_t n, float *logits, float *hidden, char *err,
                 size_t errlen) {
  if (n < 1 || n > KV_KEEP_MAX)
    return floe_err(err, errlen, FLOE_E_INVALID, "verify: %lld rows (1..%d)", (long long)n, KV_KEEP_MAX);
  if (!s->be->keep_begin || !s->be->keep_accept)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "verify: the %s backend cannot keep per-row states", s->be->name);
  int rc = model_ahead_drop(s, err, errlen);
  if (rc) return rc;
  const int64_t pos0 = s->kv.n_past;
  rc = s->be->keep_begin(s, n);
  if (rc) return floe_err(err, errlen, rc, "verify: out of memory for %lld kept states", (long long)n);
  /* no logits buffer: the rows' logits are still needed for the greedy picks of the caller */
  rc = model_eval_h(s, tokens, n, logits, logits != NULL, hidden, err, errlen);
  if (rc) {
    s->be->keep_accept(s, 0);
    return rc;
  }
  s->kv.n_past = pos0; /* the chunk stays pending until model_verify_accept */
  s->verify_pos0 = pos0;
  s->verify_n = n;
  return 0;
}

void model_verify_accept(model_session *s, int64_t a) {
  FLOE_ASSERT(s->verify_n > 0 && a >= 0 && a <= s->verify_n && s->kv.n_past == s->verify_pos0);
  s->be->keep_accept(s, a);
  s->kv.n_past = s->verify_pos0 + a;
  s->verify_n = 0;
}

/* The layers and the logits of model_eval's validated tokens, chunk by chunk, through the
 * session's backend (backend.h). */
static int eval_chunks(model_session *s, const int32_t *tokens, int64_t n, float *logits, bool all_logits, float *hidden,
                       int xflags, char *err, size_t errlen) {
  const model *m = s->m;
  const model_backend *be = s->be;
  const floe_hparams *hp = &m->hp;
  const int64_t V = hp->n_vocab, E = hp->n_embd;
  const int64_t B = s->max_batch;
  for (int64_t c0 = 0; c0 < n; c0 += B) {
    const int64_t nb = n - c0 < B ? n - c0 : B;
    const int64_t pos0 = s->kv.n_past;
    const bool last = c0 + nb == n;
    if (m->xs) xs_lock(m->xs);
    s->xs_err = 0;
    const int64_t first = all_logits ? 0 : (last ? nb - 1 : nb);
    const bool greedy = logits && nb - first == 1 && last; /* the evaluation's last position alone */
    /* the caller needs only the greedy pick unless it asks (model_logits_sync): the logits may stay
     * on the device (one row, no hidden states) */
    const bool lazy = greedy && s->lazy_ok && s->lazy_allowed && be->logits_fetch && !all_logits && !hidden;
    const int flags = (logits && nb - first > 0 ? MODEL_EVAL_LOGITS : 0) | (hidden ? MODEL_EVAL_HIDDEN : 0) |
                      (lazy ? MODEL_EVAL_LAZY | xflags : 0);
    if (xflags && (!lazy || n != 1))
      return floe_err(err, errlen, FLOE_E_INVALID, "eval: a step run ahead must be one deferred greedy row");
    float *x = be->eval_begin(s, tokens + c0, nb, pos0, flags);
    be->embed(s, tokens + c0, nb, x);
    for (int64_t l = 0; l < hp->n_layer && !s->xs_err; l++) {
      m->arch->mixer(s, l, x, nb, pos0);
      m->arch->ffn(s, l, x, nb);
    }
    if (s->xs_err) { /* an expert could not be read: the state is undefined, the caller resets */
      if (m->xs) xs_unlock(m->xs);
      return floe_err(err, errlen, s->xs_err, "%s", s->xs_msg);
    }
    if (flags & MODEL_EVAL_LOGITS) {
      const double t0 = floe_time_s();
      be->logits(s, x, first, nb, all_logits ? logits + c0 * V : logits, greedy);
      s->ph[MODEL_PH_LMHEAD] += floe_time_s() - t0;
    }
    if (hidden) be->hidden(s, x, 0, nb, hidden + c0 * E);
    int rc = be->eval_end(s, nb, err, errlen);
    if (m->xs) xs_unlock(m->xs); /* held through the logits: the stream times whole evaluations */
    if (rc) return rc;
    s->kv.n_past += nb;
  }
  return 0;
}

/* ---- decoding ahead (model.h ahead_ok, backend.h MODEL_EVAL_AHEAD) ---- */
int model_ahead_drop(model_session *s, char *err, size_t errlen) {
  if (s->ahead_pos < 0) return 0;
  s->ahead_pos = -1;
  s->n_ahead_drop++;
  return s->be->ahead_end(s, false, err, errlen);
}

/* One greedy decode step of tok (the caller's checks done) with the next step run ahead: the step
 * in flight is accepted when it evaluated tok at this position (else dropped, and tok evaluated
 * without waiting), then the step for this one's pick is launched before the host reads that pick.
 * Why: the host's round trip between two steps (the pick's copy, the caller's work, the next
 * step's launch) then overlaps the device's work instead of idling it. The same kernels on the
 * same inputs compute every step (only where the state and the logits are written differs), so
 * the picks and logits are those of steps evaluated one at a time. 1: not applicable here (the
 * caller evaluates normally, after model_ahead_drop); else 0 or FLOE_E_*. */
static int eval_ahead(model_session *s, int32_t tok, float *logits, char *err, size_t errlen) {
  const model_backend *be = s->be;
  if (!s->ahead_ok || !be->pick_wait || !logits || !s->lazy_ok || !s->lazy_allowed || !be->logits_fetch ||
      s->m->xs || !be->ahead_ok(s, -1))
    return 1;
  int rc;
  if (s->ahead_pos >= 0 && s->ahead_pos == s->kv.n_past && tok == s->ahead_tok) {
    s->ahead_pos = -1;
    if ((rc = be->ahead_end(s, true, err, errlen))) return rc;
    s->kv.n_past++;
    s->n_ahead++;
    s->lazy_dst = logits; /* its logits, on the device */
  } else {
    if ((rc = model_ahead_drop(s, err, errlen))) return rc;
    if ((rc = eval_chunks(s, &tok, 1, logits, false, NULL, MODEL_EVAL_NOWAIT, err, errlen))) return rc;
  }
  /* the next step, for the pick not read yet (kept: accepted or dropped by the next call) */
  const int64_t pos = s->kv.n_past;
  if (pos < s->kv.n_ctx && be->ahead_ok(s, pos) && be->keep_begin(s, 1) == 0) {
    float *keep_dst = s->lazy_dst;
    rc = eval_chunks(s, &tok, 1, logits, false, NULL, MODEL_EVAL_NOWAIT | MODEL_EVAL_AHEAD, err, errlen);
    s->lazy_dst = keep_dst; /* the deferred logits stay the accepted step's */
    s->kv.n_past = pos;     /* pending until accepted */
    if (rc) {
      be->keep_accept(s, 0);
      return rc;
    }
    s->ahead_pos = pos;
  }
  if ((rc = be->pick_wait(s, err, errlen))) return rc;
  s->ahead_tok = (int32_t)s->greedy;
  return 0;
}

int model_eval(model_session *s, const int32_t *tokens, int64_t n, float *logits, bool all_logits, char *err,
               size_t errlen) {
  return model_eval_h(s, tokens, n, logits, all_logits, NULL, err, errlen);
}

int model_eval_h(model_session *s, const int32_t *tokens, int64_t n, float *logits, bool all_logits, float *hidden,
                 char *err, size_t errlen) {
  const model *m = s->m;
  const int64_t V = m->hp.n_vocab;
  if (n < 1) return floe_err(err, errlen, FLOE_E_INVALID, "eval: no tokens");
  if (n > s->kv.n_ctx - s->kv.n_past)
    return floe_err(err, errlen, FLOE_E_INVALID, "eval: %lld tokens at position %lld do not fit the context of %lld",
                    (long long)n, (long long)s->kv.n_past, (long long)s->kv.n_ctx);
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= V)
      return floe_err(err, errlen, FLOE_E_INVALID, "eval: token %d out of the vocabulary (%lld)", tokens[i],
                      (long long)V);
  /* a model file truncated under us would fault on its vanished pages: refuse cleanly instead */
  if (m->gguf && gguf_check_unchanged(m->gguf, err, errlen)) return FLOE_E_IO;
  if (m->st && st_model_check_unchanged(m->st, err, errlen)) return FLOE_E_IO;
  const double t_start = floe_time_s();
  double t_phases = 0;
  for (int i = 0; i < MODEL_PH_N; i++) t_phases += s->ph[i];
  s->greedy = -1;
  int rc = model_logits_settle(s, logits, err, errlen);
  if (rc) return rc;
  rc = n == 1 && !all_logits && !hidden ? eval_ahead(s, tokens[0], logits, err, errlen) : 1;
  if (rc == 1) rc = model_ahead_drop(s, err, errlen);
  else if (rc == 0) goto done;
  if (rc) return rc;
  rc = eval_chunks(s, tokens, n, logits, all_logits, hidden, 0, err, errlen);
  if (rc) return rc;
done:;
  /* "other": whatever the timed phases did not cover (embedding, driver) */
  double t_now = 0;
  for (int i = 0; i < MODEL_PH_N; i++) t_now += s->ph[i];
  s->ph[MODEL_PH_OTHER] += (floe_time_s() - t_start) - (t_now - t_phases);
  s->n_eval_tok += n;
  return 0;
}

/* ---- several sessions in one pass ---- */
int model_session_share_pool(model_session *s, model_session *from, char *err, size_t errlen) {
  if (s == from || s->pool_shared) return s->pool == from->pool ? 0 : floe_err(err, errlen, FLOE_E_INVALID, "share pool: already shared");
  if (s->m != from->m || s->be != from->be)
    return floe_err(err, errlen, FLOE_E_INVALID, "share pool: sessions of different models or backends");
  if (!s->pool && !from->pool) return 0; /* single-threaded: nothing to share */
  if (!s->pool || !from->pool || floe_pool_size(s->pool) != floe_pool_size(from->pool))
    return floe_err(err, errlen, FLOE_E_INVALID, "share pool: the sessions have different thread counts");
  floe_pool_free(s->pool);
  s->pool = from->pool;
  s->pool_shared = true;
  return 0;
}

/* model.h. Without the backend's multi-session op for the layer's kind, each session's rows go
 * through the architecture's mixer at that session's own positions and state. */
void model_mixer_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N, bool gated) {
  const bool rec = lead->m->hp.recurrent[l];
  if (rec && lead->be->gdn_multi) {
    lead->be->gdn_multi(lead, r, k, l, x, N);
    return;
  }
  if (!rec && lead->be->attention_multi) {
    lead->be->attention_multi(lead, r, k, l, x, N, gated);
    return;
  }
  const int64_t E = lead->m->hp.n_embd;
  for (int i = 0; i < k; i++) lead->m->arch->mixer(r[i].s, l, x + r[i].off * E, r[i].n, r[i].s->kv.n_past);
}

void model_hybrid_mixer(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0) {
  if (s->m->hp.recurrent[l])
    s->be->gdn(s, l, x, n);
  else
    s->be->attention(s, l, x, n, pos0, true);
}

void model_hybrid_mixer_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N) {
  model_mixer_multi(lead, r, k, l, x, N, true);
}

void model_moe_ffn(model_session *s, int64_t l, float *x, int64_t n) { s->be->moe(s, l, x, n); }

/* Checks one segment like model_eval_h does (the model file check is made once per call). */
static int seg_check(const model_seg *g, char *err, size_t errlen) {
  const model_session *s = g->s;
  if (g->n < 1) return floe_err(err, errlen, FLOE_E_INVALID, "eval: no tokens");
  if (g->n > s->kv.n_ctx - s->kv.n_past)
    return floe_err(err, errlen, FLOE_E_INVALID, "eval: %lld tokens at position %lld do not fit the context of %lld",
                    (long long)g->n, (long long)s->kv.n_past, (long long)s->kv.n_ctx);
  for (int64_t i = 0; i < g->n; i++)
    if (g->tokens[i] < 0 || g->tokens[i] >= s->m->hp.n_vocab)
      return floe_err(err, errlen, FLOE_E_INVALID, "eval: token %d out of the vocabulary (%lld)", g->tokens[i],
                      (long long)s->m->hp.n_vocab);
  return 0;
}

/* One batched pass over the segments seg[ord[0..k)], in that order (the caller put the segments
 * that want logits last, a multi-row one first among them, so the rows whose logits are wanted
 * are the contiguous tail [first, N)). lead = the first segment's session. */
static int eval_pass(const model_seg *seg, const int *ord, int k, int64_t N, char *err, size_t errlen) {
  model_session *lead = seg[ord[0]].s;
  const model *m = lead->m;
  const model_backend *be = lead->be;
  const floe_hparams *hp = &m->hp;
  const int64_t V = hp->n_vocab;
  int64_t off[k], first = N, nl = 0;
  int32_t *tok = malloc((size_t)N * sizeof *tok);
  if (!tok) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  for (int i = 0, o = 0; i < k; i++) {
    const model_seg *g = &seg[ord[i]];
    off[i] = o;
    memcpy(tok + o, g->tokens, (size_t)g->n * sizeof *tok);
    o += (int)g->n;
    if (g->logits) {
      if (first == N) first = o - 1;
      nl++;
    }
  }
  FLOE_ASSERT(first == N || N - first == nl); /* the wanted rows are the tail */
  if (nl > lead->lg_multi_rows) {
    float *p = realloc(lead->lg_multi, (size_t)(nl * V) * sizeof(float));
    if (!p) {
      free(tok);
      return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    }
    lead->lg_multi = p;
    lead->lg_multi_rows = nl;
  }
  float *lg = lead->lg_multi;
  if (m->xs) xs_lock(m->xs);
  lead->xs_err = 0;
  model_rows rows[k];
  for (int i = 0; i < k; i++) rows[i] = (model_rows){ seg[ord[i]].s, off[i], seg[ord[i]].n };
  float *x = be->multi_begin(lead, rows, k, N, first);
  be->embed(lead, tok, N, x);
  for (int64_t l = 0; l < hp->n_layer && !lead->xs_err; l++) {
    m->arch->mixer_multi(lead, rows, k, l, x, N);
    m->arch->ffn(lead, l, x, N);
  }
  int rc = 0;
  if (lead->xs_err) {
    rc = floe_err(err, errlen, lead->xs_err, "%s", lead->xs_msg);
  } else {
    if (nl) {
      const double t1 = floe_time_s();
      be->logits(lead, x, first, N, lg, false);
      lead->ph[MODEL_PH_LMHEAD] += floe_time_s() - t1;
    }
    rc = be->eval_end(lead, N, err, errlen);
  }
  if (m->xs) xs_unlock(m->xs);
  free(tok);
  if (rc) return rc;
  for (int i = 0, r = 0; i < k; i++) {
    const model_seg *g = &seg[ord[i]];
    if (g->logits) memcpy(g->logits, lg + (size_t)(r++) * (size_t)V, (size_t)V * sizeof(float));
    g->s->kv.n_past += g->n;
    g->s->greedy = -1;
    g->s->n_eval_tok += g->n;
  }
  return 0;
}

int model_logits_sync(model_session *s, char *err, size_t errlen) {
  float *dst = s->lazy_dst;
  if (!dst) return 0;
  int rc = model_ahead_drop(s, err, errlen);
  if (rc) return rc;
  s->lazy_dst = NULL;
  return s->be->logits_fetch(s, dst, err, errlen);
}

int model_logits_settle(model_session *s, const float *next, char *err, size_t errlen) {
  if (!s->lazy_dst) return 0;
  if (s->lazy_dst == next) { /* rewritten (or deferred again) by the next evaluation */
    s->lazy_dst = NULL;
    return 0;
  }
  return model_logits_sync(s, err, errlen);
}

int model_eval_multi(const model_seg *seg, int k, int64_t *rows_out, int *segs_out, char *err, size_t errlen) {
  if (rows_out) *rows_out = 0;
  if (segs_out) *segs_out = 0;
  if (k < 1) return floe_err(err, errlen, FLOE_E_INVALID, "eval: no segments");
  const model *m = seg[0].s->m;
  for (int i = 0; i < k; i++) {
    if (seg[i].s->m != m) return floe_err(err, errlen, FLOE_E_INVALID, "eval: sessions of different models");
    for (int j = 0; j < i; j++)
      if (seg[j].s == seg[i].s) return floe_err(err, errlen, FLOE_E_INVALID, "eval: a session twice in one pass");
    int rc = seg_check(&seg[i], err, errlen);
    if (rc) return rc;
  }
  if (m->gguf && gguf_check_unchanged(m->gguf, err, errlen)) return FLOE_E_IO;
  if (m->st && st_model_check_unchanged(m->st, err, errlen)) return FLOE_E_IO;
  for (int i = 0; i < k; i++) { /* as model_eval_h: the device's logits are rewritten by this pass */
    int rc = 0;
    if (k > 1) { /* several sessions: no step runs ahead */
      seg[i].s->ahead_ok = false;
      rc = model_ahead_drop(seg[i].s, err, errlen);
    }
    if (!rc) rc = model_logits_settle(seg[i].s, seg[i].logits, err, errlen);
    if (rc) return rc;
  }
  /* Which segments share the pass: all, when the backend can and the rows fit. The rows whose
   * logits are wanted must be a contiguous tail (be->logits takes a row range), so at most one
   * multi-row segment with logits joins; another one, or rows beyond one pass, are evaluated on
   * their own. */
  const model_backend *be0 = seg[0].s->be;
  const bool can = k > 1 && be0->multi_begin && (!be0->multi_ok || be0->multi_ok(seg[0].s));
  bool in[k];
  int64_t rows = 0, max_rows = 0;
  int multi = -1, n_in = 0, max_segs = 0;
  for (int i = 0; i < k; i++) {
    const model_seg *g = &seg[i];
    const bool ml = g->logits && g->n > 1;
    in[i] = can && rows + g->n <= MODEL_MAX_BATCH && !(ml && multi >= 0);
    if (!in[i]) continue;
    rows += g->n;
    n_in++;
    if (ml) multi = i;
  }
  for (int i = 0; i < k; i++) {
    if (in[i] && n_in > 1) continue;
    const model_seg *g = &seg[i]; /* alone: the single-session path (its greedy fast path included) */
    int rc = model_eval(g->s, g->tokens, g->n, g->logits, false, err, errlen);
    if (rc) return rc;
    if (g->n > max_rows) max_rows = g->n;
    max_segs = 1;
  }
  if (n_in > 1) {
    int ord[k], n_ord = 0; /* no logits; the multi-row one with logits; the one-row ones with logits */
    for (int i = 0; i < k; i++)
      if (in[i] && !seg[i].logits) ord[n_ord++] = i;
    if (multi >= 0) ord[n_ord++] = multi;
    for (int i = 0; i < k; i++)
      if (in[i] && seg[i].logits && i != multi) ord[n_ord++] = i;
    int rc = eval_pass(seg, ord, n_ord, rows, err, errlen);
    if (rc) return rc;
    if (rows > max_rows) max_rows = rows;
    max_segs = n_ord;
  }
  if (rows_out) *rows_out = max_rows;
  if (segs_out) *segs_out = max_segs;
  return 0;
}

#ifndef FLOE_HAVE_CUDA
/* without the CUDA backend nothing is tiered (backend_cuda.c has the real ones) */
int model_tier_stats_get(const model *m, model_tier_stats *out) {
  (void)m;
  memset(out, 0, sizeof *out);
  return FLOE_E_UNSUPPORTED;
}
void model_tier_stats_reset(const model *m) { (void)m; }
#endif
