/* floe convert (src/convert): HF and MLX fixtures -> GGUF.
 *
 *  1. names/shapes: every tensor of model_tensor_list() exists in the output with llama.cpp's
 *     name, n_dims and ne, and nothing else;
 *  2. values (F32 output): each tensor equals the expected value computed here independently from
 *     the source (straight tensors byte-equal to the source widened to f32; norms +1 for the HF
 *     hybrids; ssm_a = -exp(A_log); Qwen3-Next qkvz split; Qwen3.5 V heads tiled by the literal
 *     [Nk, r, d] -> [r, Nk, d] permute of llama.cpp's _reorder_v_heads; expert stacks);
 *  3. default types keep the source float type; q8_0 / q4_K outputs: types (with llama-quantize's
 *     fallbacks) and dequantized values within the type's error of the F32 conversion, including a
 *     256-wide model where q4_K is really used;
 *  4. the MLX fixtures (tests/fixtures/mlx/) convert, their F32 GGUF equals the MLX dequantization,
 *     and the generator reproduces them byte for byte;
 *  5. logits: the HF directory and its F32 (and default-type) GGUF give bit-identical logits
 *     through model_load/model_eval, for all three architectures (the loader puts Qwen3.5's V
 *     heads in llama.cpp's tiled order for every source);
 *  6. MTP weights (mtp.*) -> blk.{n_layer}.* + nextn.*, block_count and nextn_predict_layers;
 *  7. tokenizer.json + tokenizer_config.json go into tokenizer.ggml.* / tokenizer.chat_template;
 *  8. errors: not a directory, unsupported model_type, missing tensor, bad type, output in a
 *     missing directory: non-zero, one line, no temp file left. */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "format/st_writer.h"
#include "model/model.h"
#include "model/model_meta.h"
#include "quant/quant.h"
#include "test.h"

/* ---- source access (plain or MLX-quantized) ---- */
typedef struct src {
  st_model *st;
  hf_config cfg;
  bool mlx;
  char base[32];   /* "model." or "language_model.model." */
  char head[64];   /* lm_head name */
} src;

static float *get(const src *s, const char *name, int64_t *n) {
  const st_tensor *t = st_find(s->st, name);
  if (!t) return NULL;
  char mod[512], sn[520], bn[520];
  size_t nl = strlen(name);
  const st_tensor *sc = NULL, *bi = NULL;
  if (nl > 7 && !strcmp(name + nl - 7, ".weight")) {
    snprintf(mod, sizeof mod, "%.*s", (int)(nl - 7), name);
    snprintf(sn, sizeof sn, "%s.scales", mod);
    snprintf(bn, sizeof bn, "%s.biases", mod);
    sc = st_find(s->st, sn);
    bi = st_find(s->st, bn);
  }
  if (sc) {
    int bits, group;
    bool q;
    if (hf_quant_for(&s->cfg.quant, mod, &bits, &group, &q)) return NULL;
    quant_mlx_fmt f = { bits, group, sc->dtype == ST_BF16 ? FLOE_TYPE_BF16 : sc->dtype == ST_F16 ? FLOE_TYPE_F16 : FLOE_TYPE_F32 };
    const int64_t in = sc->shape[sc->n_dims - 1] * group, rows = sc->n_elements / sc->shape[sc->n_dims - 1];
    const size_t qb = quant_mlx_row_bytes(&f, in), sb = (size_t)sc->shape[sc->n_dims - 1] * st_dtype_size(sc->dtype);
    float *v = malloc((size_t)(rows * in) * 4);
    uint8_t *tq = malloc(qb + 64), *ts = malloc(sb + 64), *tb = malloc(sb + 64);
    for (int64_t r = 0; r < rows; r++) {
      memcpy(tq, t->data + r * qb, qb);
      memcpy(ts, sc->data + r * sb, sb);
      memcpy(tb, bi->data + r * sb, sb);
      quant_mlx_dequant_row(&f, tq, ts, tb, v + r * in, in);
    }
    free(tq), free(ts), free(tb);
    *n = rows * in;
    return v;
  }
  uint32_t ty = t->dtype == ST_BF16 ? FLOE_TYPE_BF16 : t->dtype == ST_F16 ? FLOE_TYPE_F16 : FLOE_TYPE_F32;
  float *v = malloc((size_t)t->n_elements * 4 + 4);
  void *tmp = malloc((size_t)t->nbytes + 4);
  memcpy(tmp, t->data, (size_t)t->nbytes);
  quant_dequant_row(ty, tmp, v, t->n_elements);
  free(tmp);
  *n = t->n_elements;
  return v;
}

static int src_open_dir(const char *dir, src *s) {
  char err[256];
  memset(s, 0, sizeof *s);
  if (hf_config_load(dir, &s->cfg, err, sizeof err) || st_model_open(dir, &s->st, err, sizeof err)) {
    printf("open %s: %s\n", dir, err);
    return -1;
  }
  s->mlx = s->cfg.quant.present;
  snprintf(s->base, sizeof s->base, "%s", st_find(s->st, "language_model.model.embed_tokens.weight") ? "language_model.model." : "model.");
  snprintf(s->head, sizeof s->head, "%s", st_find(s->st, "language_model.lm_head.weight") ? "language_model.lm_head.weight" : "lm_head.weight");
  s->cfg.hp.n_mtp = 0; /* no fixture carries MTP weights */
  return 0;
}

static void src_close(src *s) {
  st_model_close(s->st);
  hf_config_free(&s->cfg);
}

/* Tiles V heads: [Nk][r][unit] blocks -> [r][Nk][unit] (llama.cpp's reshape + permute(swap) + reshape). */
static void tile_blocks(const float *in, float *out, int64_t Nk, int64_t r, int64_t unit) {
  for (int64_t j = 0; j < r; j++)
    for (int64_t g = 0; g < Nk; g++) memcpy(out + (j * Nk + g) * unit, in + (g * r + j) * unit, (size_t)unit * 4);
}

/* Expected F32 contents of GGUF tensor d, or NULL when a source is missing. */
static float *expect(const src *s, const model_tensor_desc *d, int64_t count) {
  const floe_hparams *hp = &s->cfg.hp;
  const bool hyb = hp->arch != FLOE_ARCH_QWEN3MOE, q35 = hp->arch == FLOE_ARCH_QWEN35MOE;
  const int64_t Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state, vd = hp->ssm_d_inner;
  const int64_t dv = Nv ? vd / Nv : 0, r = Nk ? Nv / Nk : 0, kd = Nk * dk, E = hp->n_embd;
  char nm[512], pre[128];
  snprintf(pre, sizeof pre, "%slayers.%d.", s->base, d->layer);
  const char *sfx = NULL;
  bool plus1 = false;
  switch (d->kind) {
  case MODEL_K_TOKEN_EMBD: snprintf(nm, sizeof nm, "%sembed_tokens.weight", s->base); break;
  case MODEL_K_OUTPUT: snprintf(nm, sizeof nm, "%s", s->head); break;
  case MODEL_K_OUTPUT_NORM: snprintf(nm, sizeof nm, "%snorm.weight", s->base); plus1 = true; break;
  case MODEL_K_ATTN_NORM: sfx = "input_layernorm.weight"; plus1 = true; break;
  case MODEL_K_FFN_NORM: sfx = "post_attention_layernorm.weight"; plus1 = true; break;
  case MODEL_K_ATTN_Q: sfx = "self_attn.q_proj.weight"; break;
  case MODEL_K_ATTN_K: sfx = "self_attn.k_proj.weight"; break;
  case MODEL_K_ATTN_V: sfx = "self_attn.v_proj.weight"; break;
  case MODEL_K_ATTN_OUT: sfx = "self_attn.o_proj.weight"; break;
  case MODEL_K_ATTN_Q_NORM: sfx = "self_attn.q_norm.weight"; plus1 = true; break;
  case MODEL_K_ATTN_K_NORM: sfx = "self_attn.k_norm.weight"; plus1 = true; break;
  case MODEL_K_SSM_NORM: sfx = "linear_attn.norm.weight"; break;
  case MODEL_K_SSM_BA: sfx = "linear_attn.in_proj_ba.weight"; break;
  case MODEL_K_FFN_GATE_INP: sfx = "mlp.gate.weight"; break;
  case MODEL_K_FFN_GATE_INP_SHEXP: sfx = "mlp.shared_expert_gate.weight"; break;
  case MODEL_K_FFN_GATE_SHEXP: sfx = "mlp.shared_expert.gate_proj.weight"; break;
  case MODEL_K_FFN_UP_SHEXP: sfx = "mlp.shared_expert.up_proj.weight"; break;
  case MODEL_K_FFN_DOWN_SHEXP: sfx = "mlp.shared_expert.down_proj.weight"; break;
  case MODEL_K_SSM_QKV: sfx = q35 ? "linear_attn.in_proj_qkv.weight" : "linear_attn.in_proj_qkvz.weight"; break;
  case MODEL_K_SSM_GATE: sfx = q35 ? "linear_attn.in_proj_z.weight" : "linear_attn.in_proj_qkvz.weight"; break;
  case MODEL_K_SSM_BETA: sfx = "linear_attn.in_proj_b.weight"; break;
  case MODEL_K_SSM_ALPHA: sfx = "linear_attn.in_proj_a.weight"; break;
  case MODEL_K_SSM_CONV1D: sfx = "linear_attn.conv1d.weight"; break;
  case MODEL_K_SSM_DT_BIAS: sfx = "linear_attn.dt_bias"; break;
  case MODEL_K_SSM_A: sfx = "linear_attn.A_log"; break;
  case MODEL_K_SSM_OUT: sfx = "linear_attn.out_proj.weight"; break;
  default: break;
  }
  int64_t n = 0;
  float *v = NULL, *out = malloc((size_t)count * 4);
  if (d->kind == MODEL_K_FFN_GATE_EXPS || d->kind == MODEL_K_FFN_UP_EXPS || d->kind == MODEL_K_FFN_DOWN_EXPS) {
    const char *w = d->kind == MODEL_K_FFN_GATE_EXPS ? "gate" : d->kind == MODEL_K_FFN_UP_EXPS ? "up" : "down";
    if (s->mlx) {
      snprintf(nm, sizeof nm, "%smlp.switch_mlp.%s_proj.weight", pre, w);
      if (!(v = get(s, nm, &n)) || n != count) goto fail;
      memcpy(out, v, (size_t)count * 4);
    } else {
      const int64_t per = count / hp->n_expert;
      for (int64_t e = 0; e < hp->n_expert; e++) {
        snprintf(nm, sizeof nm, "%smlp.experts.%lld.%s_proj.weight", pre, (long long)e, w);
        free(v);
        if (!(v = get(s, nm, &n)) || n != per) goto fail;
        memcpy(out + e * per, v, (size_t)per * 4);
      }
    }
    free(v);
    return out;
  }
  if (sfx) snprintf(nm, sizeof nm, "%s%s", pre, sfx);
  if (!(v = get(s, nm, &n))) goto fail;
  if (!q35 && (d->kind == MODEL_K_SSM_QKV || d->kind == MODEL_K_SSM_GATE)) {
    const int64_t gq = 2 * dk + 2 * r * dv; /* grouped rows per key head: q dk | k dk | v r*dv | z r*dv */
    if (n != Nk * gq * E) goto fail;
    for (int64_t g = 0; g < Nk; g++) {
      const float *grp = v + g * gq * E;
      if (d->kind == MODEL_K_SSM_QKV) {
        memcpy(out + g * dk * E, grp, (size_t)(dk * E) * 4);
        memcpy(out + (kd + g * dk) * E, grp + dk * E, (size_t)(dk * E) * 4);
        memcpy(out + (2 * kd + g * r * dv) * E, grp + 2 * dk * E, (size_t)(r * dv * E) * 4);
      } else {
        memcpy(out + g * r * dv * E, grp + (2 * dk + r * dv) * E, (size_t)(r * dv * E) * 4);
      }
    }
    free(v);
    return out;
  }
  if (n != count) goto fail;
  memcpy(out, v, (size_t)count * 4);
  if (plus1 && hyb && !s->mlx)
    for (int64_t i = 0; i < n; i++) out[i] = v[i] + 1.0f;
  if (d->kind == MODEL_K_SSM_A)
    for (int64_t i = 0; i < n; i++) out[i] = -expf(v[i]);
  if (q35 && Nk != Nv) {
    float *t = malloc((size_t)count * 4);
    memcpy(t, out, (size_t)count * 4);
    switch (d->kind) {
    case MODEL_K_SSM_QKV: tile_blocks(t + 2 * kd * E, out + 2 * kd * E, Nk, r, dv * E); break;
    case MODEL_K_SSM_CONV1D: tile_blocks(t + 2 * kd * hp->ssm_conv_kernel, out + 2 * kd * hp->ssm_conv_kernel, Nk, r, dv * hp->ssm_conv_kernel); break;
    case MODEL_K_SSM_GATE: tile_blocks(t, out, Nk, r, dv * E); break;
    case MODEL_K_SSM_BETA: case MODEL_K_SSM_ALPHA: tile_blocks(t, out, Nk, r, E); break;
    case MODEL_K_SSM_DT_BIAS: case MODEL_K_SSM_A: tile_blocks(t, out, Nk, r, 1); break;
    case MODEL_K_SSM_OUT:
      for (int64_t o = 0; o < E; o++) tile_blocks(t + o * vd, out + o * vd, Nk, r, dv);
      break;
    default: break;
    }
    free(t);
  }
  free(v);
  return out;
fail:
  free(v);
  free(out);
  return NULL;
}

static int64_t nelem(const gguf_tensor *t) {
  int64_t n = 1;
  for (uint32_t i = 0; i < t->n_dims; i++) n *= t->ne[i];
  return n;
}

static float *deq(const gguf_tensor *t) {
  int64_t n = nelem(t);
  float *v = malloc((size_t)n * 4);
  quant_dequant_row(t->type, t->data, v, n);
  return v;
}

static int convert(const char *dir, const char *out, int type, int etype, convert_stats *st, char *err, size_t errlen) {
  convert_opts o = { .in_dir = dir, .out_path = out, .type = type, .expert_type = etype, .n_threads = 2 };
  return convert_model(&o, st, err, errlen);
}

/* 1 + 2: names, shapes and F32 values of a converted directory. */
static void check_f32(const char *what, const char *dir, const char *out) {
  src s;
  if (src_open_dir(dir, &s)) {
    CHECK(0, "%s: open source", what);
    return;
  }
  gguf_file *g = NULL;
  char err[256];
  CHECK(gguf_open(out, &g, err, sizeof err) == 0, "%s: output opens: %s", what, g ? "ok" : err);
  model_tensor_desc *ds = NULL;
  size_t nd = 0;
  CHECK(model_tensor_list(&s.cfg.hp, &ds, &nd, err, sizeof err) == 0, "%s: tensor list", what);
  if (g && ds) {
    CHECK(g->n_tensors == nd, "%s: %llu tensors, llama.cpp list has %zu", what, (unsigned long long)g->n_tensors, nd);
    size_t shape_ok = 0, val_ok = 0;
    for (size_t i = 0; i < nd; i++) {
      const gguf_tensor *t = gguf_find_tensor(g, ds[i].name);
      bool same = t && t->n_dims == ds[i].n_dims && t->type == FLOE_TYPE_F32;
      for (int k = 0; same && k < 4; k++) same = t->ne[k] == ds[i].ne[k];
      if (!same) {
        printf("  %s: %s missing or wrong shape/type\n", what, ds[i].name);
        continue;
      }
      shape_ok++;
      const int64_t n = nelem(t);
      float *e = expect(&s, &ds[i], n);
      if (e && memcmp(e, t->data, (size_t)n * 4) == 0) val_ok++;
      else printf("  %s: %s values differ from the expected transform\n", what, ds[i].name);
      free(e);
    }
    CHECK(shape_ok == nd, "%s: %zu/%zu tensors with llama.cpp's name, shape and type f32", what, shape_ok, nd);
    CHECK(val_ok == nd, "%s: %zu/%zu tensors hold exactly the expected values", what, val_ok, nd);
    gguf_str a;
    CHECK(gguf_get_str(g, "general.architecture", &a) == 0 && gguf_str_eq(a, floe_arch_name(s.cfg.hp.arch)),
          "%s: general.architecture", what);
    floe_hparams hp;
    CHECK(model_hparams_from_gguf(g, &hp, err, sizeof err) == 0 && hp.n_layer == s.cfg.hp.n_layer &&
              hp.n_expert == s.cfg.hp.n_expert && hp.n_mtp == 0 &&
              !memcmp(hp.recurrent, s.cfg.hp.recurrent, sizeof hp.recurrent),
          "%s: hparams read back", what);
    uint32_t ft = 99;
    CHECK(gguf_get_u32(g, "general.file_type", &ft) == 0 && ft == 0, "%s: general.file_type = %u (all f32)", what, ft);
  }
  free(ds);
  gguf_close(g);
  src_close(&s);
}

/* Max |a-b| / max|a| over rows. */
static double rel_err(const float *a, const float *b, int64_t n) {
  double m = 0, d = 0;
  for (int64_t i = 0; i < n; i++) {
    m = fmax(m, fabs(a[i]));
    d = fmax(d, fabs((double)a[i] - b[i]));
  }
  return m > 0 ? d / m : d;
}

static double type_tol(uint32_t t) {
  switch (t) {
  case FLOE_TYPE_F32: return 0;
  case FLOE_TYPE_F16: return 1e-3;
  case FLOE_TYPE_BF16: return 4e-3;
  case FLOE_TYPE_Q8_0: return 1.0 / 127 * 0.5 * 1.05 + 1e-3;
  case FLOE_TYPE_Q5_0: return 1.0 / 16 + 1e-3; /* d = -max/16: the opposite extreme may clip by one step */
  case FLOE_TYPE_Q5_1: return 1.0 / 31 + 1e-3;
  case FLOE_TYPE_Q4_K: return 0.12;
  default: return 0.2;
  }
}

/* 3: a quantized conversion vs the F32 one: expected types (llama-quantize fallbacks) and values. */
static void check_quant(const char *what, const char *dir, const char *f32, int type, const char *tmpname, bool real) {
  char err[256];
  const char *out = test_tmp(tmpname);
  convert_stats st;
  int rc = convert(dir, out, type, -1, &st, err, sizeof err);
  CHECK(rc == 0, "%s: convert to %s: %s", what, floe_type_info((uint32_t)type)->name, rc ? err : "ok");
  if (rc) return;
  gguf_file *a = NULL, *b = NULL;
  if (gguf_open(f32, &a, err, sizeof err) || gguf_open(out, &b, err, sizeof err)) {
    CHECK(0, "%s: open: %s", what, err);
    gguf_close(a);
    return;
  }
  size_t type_ok = 0, val_ok = 0, n_q = 0;
  for (uint64_t i = 0; i < a->n_tensors; i++) {
    const gguf_tensor *ta = &a->tensors[i];
    char nm[128];
    snprintf(nm, sizeof nm, "%.*s", (int)ta->name.len, ta->name.ptr);
    const gguf_tensor *tb = gguf_find_tensor(b, nm);
    if (!tb) continue;
    const bool f32 = ta->n_dims == 1 || strstr(nm, "ffn_gate_inp.") || strstr(nm, "ssm_conv1d");
    uint32_t want = f32 ? FLOE_TYPE_F32 : (uint32_t)type;
    if (!f32 && !floe_row_bytes(want, ta->ne[0])) {
      want = type == FLOE_TYPE_Q4_K ? FLOE_TYPE_Q5_0 : FLOE_TYPE_F16;
      if (!floe_row_bytes(want, ta->ne[0])) want = FLOE_TYPE_F16;
    }
    if (tb->type == want) type_ok++;
    else printf("  %s: %s is %s, expected %s\n", what, nm, floe_type_info(tb->type)->name, floe_type_info(want)->name);
    n_q += tb->type == (uint32_t)type;
    float *va = deq(ta), *vb = deq(tb);
    const int64_t ne0 = ta->ne[0], rows = nelem(ta) / ne0;
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) worst = fmax(worst, rel_err(va + r * ne0, vb + r * ne0, ne0));
    if (worst <= type_tol(tb->type)) val_ok++;
    else printf("  %s: %s (%s) row error %.3g > %.3g\n", what, nm, floe_type_info(tb->type)->name, worst, type_tol(tb->type));
    free(va);
    free(vb);
  }
  CHECK(b->n_tensors == a->n_tensors && type_ok == a->n_tensors, "%s: %s types as expected (%zu/%llu, %zu in %s)",
        what, floe_type_info((uint32_t)type)->name, type_ok, (unsigned long long)a->n_tensors, n_q,
        floe_type_info((uint32_t)type)->name);
  CHECK(val_ok == a->n_tensors, "%s: %s values within the type's error of f32 (%zu/%llu)", what,
        floe_type_info((uint32_t)type)->name, val_ok, (unsigned long long)a->n_tensors);
  if (real) CHECK(n_q > 0, "%s: some tensors really are %s", what, floe_type_info((uint32_t)type)->name);
  gguf_close(a);
  gguf_close(b);
  remove(out);
}

/* 5: logits of the HF directory vs the GGUF. */
static void check_logits(const char *what, const char *dir, const char *gg, bool exact) {
  char err[256];
  model *a = NULL, *b = NULL;
  int rc = model_load(dir, &a, err, sizeof err);
  if (!rc) rc = model_load(gg, &b, err, sizeof err);
  CHECK(rc == 0, "%s: both load: %s", what, rc ? err : "ok");
  if (!rc) {
    const int64_t V = a->hp.n_vocab, n = 80;
    int32_t tok[80];
    for (int i = 0; i < n; i++) tok[i] = (i * 53 + 7) % (int)V;
    float *la = malloc((size_t)(n * V) * 4), *lb = malloc((size_t)(n * V) * 4);
    model_session *sa = NULL, *sb = NULL;
    rc = model_session_new(a, 128, KV_F32, 1, &sa, err, sizeof err);
    if (!rc) rc = model_session_new(b, 128, KV_F32, 1, &sb, err, sizeof err);
    if (!rc) rc = model_eval(sa, tok, n, la, true, err, sizeof err);
    if (!rc) rc = model_eval(sb, tok, n, lb, true, err, sizeof err);
    double maxd = 0;
    int64_t diff = 0;
    for (int64_t i = 0; !rc && i < n; i++) diff += memcmp(la + i * V, lb + i * V, (size_t)V * 4) != 0;
    for (int64_t i = 0; !rc && i < n * V; i++) maxd = fmax(maxd, fabs((double)la[i] - lb[i]));
    if (exact)
      CHECK(rc == 0 && diff == 0, "%s: logits bit-identical (%lld of %lld positions differ, max %.3g)", what,
            (long long)diff, (long long)n, maxd);
    else
      CHECK(rc == 0 && maxd < 1e-5, "%s: logits within 1e-5 (max %.3g; V heads tiled as llama.cpp)", what, maxd);
    model_session_free(sa);
    model_session_free(sb);
    free(la);
    free(lb);
  }
  model_free(a);
  model_free(b);
}

static void test_hf(const char *name) {
  char dir[512], out[512], out2[512], err[256];
  SECTION("HF %s", name);
  snprintf(dir, sizeof dir, "%s", test_fixture(name));
  const char *base = strrchr(name, '/') + 1;
  snprintf(out, sizeof out, "%s.f32.gguf", test_tmp(base));
  convert_stats st;
  int rc = convert(dir, out, FLOE_TYPE_F32, -1, &st, err, sizeof err);
  CHECK(rc == 0, "%s: convert --type f32: %s", name, rc ? err : "ok");
  if (rc) return;
  CHECK(!st.mlx && st.n_mtp == 0 && !st.tokenizer && st.n_fallback == 0, "%s: stats (no MLX, MTP, tokenizer)", name);
  check_f32(name, dir, out);
  const bool exact = true;
  check_logits(name, dir, out, exact);

  /* default types: the source's float type for matrices, f32 for vectors/router/conv */
  snprintf(out2, sizeof out2, "%s.def.gguf", test_tmp(base));
  rc = convert(dir, out2, -1, -1, &st, err, sizeof err);
  CHECK(rc == 0, "%s: convert (default types): %s", name, rc ? err : "ok");
  gguf_file *g = NULL;
  src s;
  if (!rc && gguf_open(out2, &g, err, sizeof err) == 0 && src_open_dir(dir, &s) == 0) {
    const st_tensor *emb = st_find(s.st, "model.embed_tokens.weight");
    const uint32_t want = emb->dtype == ST_BF16 ? FLOE_TYPE_BF16 : FLOE_TYPE_F32;
    size_t ok = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
      const gguf_tensor *t = &g->tensors[i];
      const bool f32 = t->n_dims == 1 || memmem(t->name.ptr, t->name.len, "ffn_gate_inp.", 13) ||
                       memmem(t->name.ptr, t->name.len, "ssm_conv1d", 10);
      ok += t->type == (f32 ? FLOE_TYPE_F32 : want);
    }
    CHECK(ok == g->n_tensors, "%s: default types keep %s (%zu/%llu)", name, floe_type_info(want)->name, ok,
          (unsigned long long)g->n_tensors);
    uint32_t ft = 99;
    CHECK(gguf_get_u32(g, "general.file_type", &ft) == 0 && ft == (want == FLOE_TYPE_BF16 ? 32u : 0u),
          "%s: general.file_type %u", name, ft);
    src_close(&s);
  }
  gguf_close(g);
  if (!rc) check_logits("default types", dir, out2, exact);
  remove(out2);

  check_quant(name, dir, out, FLOE_TYPE_Q8_0, "cv_q8.gguf", true);
  check_quant(name, dir, out, FLOE_TYPE_Q4_K, "cv_q4k.gguf", false); /* no row is a multiple of 256 here: fallbacks only */
  remove(out);
}

/* ---- a qwen3moe HF directory written here (st_writer), 256 wide so q4_K applies ---- */
static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

static const char wide_config[] =
    "{\"model_type\":\"qwen3_moe\",\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":256,"
    "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":64,"
    "\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":256,\"intermediate_size\":512,"
    "\"vocab_size\":512,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,"
    "\"tie_word_embeddings\":false,\"norm_topk_prob\":true}";

/* skip: name of a tensor to leave out (missing-tensor test), or NULL. */
static int make_wide(const char *dir, const char *skip) {
  char path[1024], err[256];
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/config.json", dir);
  if (write_file(path, wide_config)) return -1;
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  st_writer *w;
  if (st_writer_open(path, &w, err, sizeof err)) return -1;
  struct { const char *name; int64_t r, c; } ts[] = {
    { "model.embed_tokens.weight", 512, 256 }, { "model.norm.weight", 0, 256 }, { "lm_head.weight", 512, 256 },
    { "model.layers.0.input_layernorm.weight", 0, 256 }, { "model.layers.0.post_attention_layernorm.weight", 0, 256 },
    { "model.layers.0.self_attn.q_proj.weight", 256, 256 }, { "model.layers.0.self_attn.k_proj.weight", 128, 256 },
    { "model.layers.0.self_attn.v_proj.weight", 128, 256 }, { "model.layers.0.self_attn.o_proj.weight", 256, 256 },
    { "model.layers.0.self_attn.q_norm.weight", 0, 64 }, { "model.layers.0.self_attn.k_norm.weight", 0, 64 },
    { "model.layers.0.mlp.gate.weight", 4, 256 },
  };
  floe_rng rng;
  floe_rng_seed(&rng, 7);
  float *buf = malloc(512 * 256 * 4);
  int rc = 0;
  for (size_t i = 0; i < sizeof ts / sizeof ts[0] + 12 && !rc; i++) {
    char nm[256];
    int64_t shape[2];
    int nd;
    if (i < sizeof ts / sizeof ts[0]) {
      snprintf(nm, sizeof nm, "%s", ts[i].name);
      nd = ts[i].r ? 2 : 1;
      shape[0] = ts[i].r ? ts[i].r : ts[i].c;
      shape[1] = ts[i].c;
    } else { /* experts, per-expert HF layout */
      size_t k = i - sizeof ts / sizeof ts[0];
      snprintf(nm, sizeof nm, "model.layers.0.mlp.experts.%zu.%s_proj.weight", k / 3, k % 3 == 0 ? "gate" : k % 3 == 1 ? "up" : "down");
      nd = 2;
      shape[0] = 256;
      shape[1] = 256;
    }
    if (skip && !strcmp(nm, skip)) continue;
    int64_t n = nd == 2 ? shape[0] * shape[1] : shape[0];
    for (int64_t j = 0; j < n; j++) buf[j] = 0.05f * floe_rng_normal(&rng);
    rc = st_writer_add(w, nm, ST_F32, nd, shape, buf, err, sizeof err);
  }
  free(buf);
  if (rc) {
    st_writer_abort(w);
    return -1;
  }
  return st_writer_finish(w, err, sizeof err);
}

static void test_wide(void) {
  SECTION("256-wide qwen3moe (written here): q4_K, q8_0, fused experts");
  const char *dir = test_tmp("cv_wide");
  char out[1024], err[256];
  CHECK(make_wide(dir, NULL) == 0, "wrote %s", dir);
  snprintf(out, sizeof out, "%s.f32.gguf", dir);
  int rc = convert(dir, out, FLOE_TYPE_F32, -1, NULL, err, sizeof err);
  CHECK(rc == 0, "wide: convert f32: %s", rc ? err : "ok");
  if (rc) return;
  check_f32("wide", dir, out);
  check_logits("wide", dir, out, true);
  check_quant("wide", dir, out, FLOE_TYPE_Q4_K, "cv_wide_q4k.gguf", true);
  check_quant("wide", dir, out, FLOE_TYPE_Q8_0, "cv_wide_q8.gguf", true);
  /* --expert-type differs from --type */
  char out2[1024];
  snprintf(out2, sizeof out2, "%s.mix.gguf", dir);
  rc = convert(dir, out2, FLOE_TYPE_Q8_0, FLOE_TYPE_Q4_K, NULL, err, sizeof err);
  gguf_file *g = NULL;
  if (!rc && !gguf_open(out2, &g, err, sizeof err)) {
    const gguf_tensor *e = gguf_find_tensor(g, "blk.0.ffn_up_exps.weight"), *q = gguf_find_tensor(g, "blk.0.attn_q.weight"),
                      *r = gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight");
    CHECK(e && q && r && e->type == FLOE_TYPE_Q4_K && q->type == FLOE_TYPE_Q8_0 && r->type == FLOE_TYPE_F32,
          "--type q8_0 --expert-type q4_K: experts q4_K, attention q8_0, router f32");
    uint32_t ft = 0;
    CHECK(gguf_get_u32(g, "general.file_type", &ft) == 0 && ft == 7, "general.file_type 7 (q8_0)");
  }
  CHECK(rc == 0 && g, "wide: mixed types convert: %s", rc ? err : "ok");
  gguf_close(g);
  remove(out2);
  remove(out);
}


/* ---- MTP: the qwen35moe fixture plus mtp.* weights (layer 2, a full-attention layer, copied as
 * mtp.layers.0, and random fc / norms), config mtp_num_hidden_layers = 1 ---- */
static void test_mtp(void) {
  SECTION("MTP (qwen35moe + mtp.* written here)");
  const char *dir = test_tmp("cv_mtp");
  char p[8192], err[256], out[1024];
  mkdir(dir, 0755);
  src s;
  if (src_open_dir(test_fixture("models/qwen35moe"), &s)) return;
  snprintf(p, sizeof p, "%s/config.json", test_fixture("models/qwen35moe"));
  FILE *f = fopen(p, "rb");
  char cfg[8192] = { 0 };
  size_t n = f ? fread(cfg, 1, sizeof cfg - 1, f) : 0;
  if (f) fclose(f);
  char *brace = strchr(cfg, '{');
  CHECK(n > 0 && brace, "read config");
  if (!brace) return;
  char cfg2[9000];
  snprintf(cfg2, sizeof cfg2, "{\"mtp_num_hidden_layers\": 1, %s", brace + 1);
  snprintf(p, sizeof p, "%s/config.json", dir);
  write_file(p, cfg2);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  st_writer *w;
  int rc = st_writer_open(p, &w, err, sizeof err);
  for (size_t i = 0; i < st_count(s.st) && !rc; i++) {
    const st_tensor *t = st_tensor_at(s.st, i);
    rc = st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data, err, sizeof err);
    if (!rc && !strncmp(t->name, "model.layers.2.", 15)) {
      char nm[512];
      snprintf(nm, sizeof nm, "mtp.layers.0.%s", t->name + 15);
      rc = st_writer_add(w, nm, t->dtype, t->n_dims, t->shape, t->data, err, sizeof err);
    }
  }
  float fc[64 * 128], nv[64];
  for (int i = 0; i < 64 * 128; i++) fc[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  for (int i = 0; i < 64; i++) nv[i] = 0.01f * (float)i;
  int64_t sfc[2] = { 64, 128 }, sn[1] = { 64 };
  if (!rc) rc = st_writer_add(w, "mtp.fc.weight", ST_F32, 2, sfc, fc, err, sizeof err);
  if (!rc) rc = st_writer_add(w, "mtp.pre_fc_norm_embedding.weight", ST_F32, 1, sn, nv, err, sizeof err);
  if (!rc) rc = st_writer_add(w, "mtp.pre_fc_norm_hidden.weight", ST_F32, 1, sn, nv, err, sizeof err);
  if (!rc) rc = st_writer_add(w, "mtp.norm.weight", ST_F32, 1, sn, nv, err, sizeof err);
  rc = rc ? (st_writer_abort(w), rc) : st_writer_finish(w, err, sizeof err);
  CHECK(rc == 0, "wrote %s: %s", dir, rc ? err : "ok");
  snprintf(out, sizeof out, "%s.gguf", dir);
  convert_stats st;
  rc = convert(dir, out, FLOE_TYPE_F32, -1, &st, err, sizeof err);
  CHECK(rc == 0 && st.n_mtp == 1, "converts with one MTP block: %s", rc ? err : "ok");
  gguf_file *g = NULL;
  if (!rc && !gguf_open(out, &g, err, sizeof err)) {
    uint32_t bc = 0, nn = 0;
    CHECK(gguf_get_u32(g, "qwen35moe.block_count", &bc) == 0 && bc == 7 &&
              gguf_get_u32(g, "qwen35moe.nextn_predict_layers", &nn) == 0 && nn == 1,
          "block_count 7 (6 + MTP), nextn_predict_layers 1");
    const gguf_tensor *eh = gguf_find_tensor(g, "blk.6.nextn.eh_proj.weight");
    CHECK(eh && eh->ne[0] == 128 && eh->ne[1] == 64 && !memcmp(eh->data, fc, sizeof fc), "nextn.eh_proj {128, 64} = mtp.fc");
    const char *norms[3] = { "blk.6.nextn.enorm.weight", "blk.6.nextn.hnorm.weight", "blk.6.nextn.shared_head_norm.weight" };
    for (int k = 0; k < 3; k++) {
      const gguf_tensor *t = gguf_find_tensor(g, norms[k]);
      int good = t && nelem(t) == 64;
      for (int i = 0; good && i < 64; i++) good = ((const float *)t->data)[i] == nv[i] + 1.0f;
      CHECK(good, "%s = w + 1", norms[k]);
    }
    const gguf_tensor *a = gguf_find_tensor(g, "blk.6.attn_q.weight"), *b = gguf_find_tensor(g, "blk.2.attn_q.weight");
    const gguf_tensor *c = gguf_find_tensor(g, "blk.6.ffn_down_exps.weight"), *d = gguf_find_tensor(g, "blk.2.ffn_down_exps.weight");
    const gguf_tensor *e = gguf_find_tensor(g, "blk.6.attn_norm.weight"), *h = gguf_find_tensor(g, "blk.2.attn_norm.weight");
    CHECK(a && b && c && d && e && h && a->size == b->size && !memcmp(a->data, b->data, a->size) && c->size == d->size &&
              !memcmp(c->data, d->data, c->size) && !memcmp(e->data, h->data, e->size),
          "MTP block tensors (attn_q, ffn_down_exps, attn_norm) = mtp.layers.0.*");
  }
  gguf_close(g);
  model *m = NULL;
  rc = model_load(out, &m, err, sizeof err);
  CHECK(rc == 0 && m->hp.n_layer == 6 && m->hp.n_mtp == 1, "the loader reads it: %s", rc ? err : "ok");
  model_free(m);
  remove(out);
  src_close(&s);
}

/* ---- MLX ---- */
static void test_mlx(const char *name) {
  char dir[512], out[512], err[256];
  SECTION("MLX %s", name);
  snprintf(dir, sizeof dir, "%s", test_fixture(name));
  const char *base = strrchr(name, '/') + 1;
  snprintf(out, sizeof out, "%s.mlx.gguf", test_tmp(base));
  convert_stats st;
  int rc = convert(dir, out, FLOE_TYPE_F32, -1, &st, err, sizeof err);
  CHECK(rc == 0, "%s: convert --type f32: %s", name, rc ? err : "ok");
  if (rc) return;
  CHECK(st.mlx, "%s: detected as MLX", name);
  check_f32(name, dir, out);
  /* default type for MLX-quantized tensors: q8_0 (fallback f16 where 32 does not divide the row) */
  rc = convert(dir, out, -1, -1, &st, err, sizeof err);
  gguf_file *g = NULL;
  if (!rc && !gguf_open(out, &g, err, sizeof err)) {
    const gguf_tensor *a = gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight"), *b = gguf_find_tensor(g, "token_embd.weight");
    CHECK(a && b && a->type == FLOE_TYPE_Q8_0 && b->type == FLOE_TYPE_Q8_0, "%s: MLX default type q8_0", name);
  }
  CHECK(rc == 0 && g, "%s: default-type conversion: %s", name, rc ? err : "ok");
  gguf_close(g);
  remove(out);

  /* the generator reproduces the committed fixture byte for byte */
  char hf[512], regen[512], a[600], b[600];
  snprintf(hf, sizeof hf, "%s", test_fixture(strstr(name, "qwen35") ? "models/qwen35moe" : "models/qwen3next"));
  snprintf(regen, sizeof regen, "%s", test_tmp(strstr(name, "qwen35") ? "mlx_regen35" : "mlx_regen3n"));
  mkdir(regen, 0755);
  rc = convert_make_mlx_fixture(hf, regen, err, sizeof err);
  CHECK(rc == 0, "%s: generator runs: %s", name, rc ? err : "ok");
  int same = 0;
  for (int k = 0; k < 2 && !rc; k++) {
    const char *f = k ? "config.json" : "model.safetensors";
    snprintf(a, sizeof a, "%s/%s", dir, f);
    snprintf(b, sizeof b, "%s/%s", regen, f);
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
      int x = fgetc(fa), y = fgetc(fb);
      if (x != y) eq = 0;
      if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    same += eq;
    remove(b);
  }
  CHECK(same == 2, "%s: regenerated fixture identical to the committed one", name);
  rmdir(regen);
}

/* ---- tokenizer ---- */
static void test_tokenizer(void) {
  SECTION("tokenizer.json + tokenizer_config.json");
  const char *dir = test_tmp("cv_tok");
  char p[8192], q[8192], out[1024], err[256];
  mkdir(dir, 0755);
  char src[PATH_MAX];
  if (!realpath(test_fixture("models/qwen3moe"), src)) snprintf(src, sizeof src, "%s", test_fixture("models/qwen3moe"));
  snprintf(p, sizeof p, "%s/config.json", dir);
  snprintf(q, sizeof q, "%s/config.json", src);
  remove(p);
  int rc = symlink(q, p);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  snprintf(q, sizeof q, "%s/model.safetensors", src);
  remove(p);
  rc |= symlink(q, p);
  snprintf(p, sizeof p, "%s/tokenizer.json", dir);
  rc |= write_file(p, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"c\":3},\"merges\":[\"a b\"]},"
                      "\"added_tokens\":[{\"id\":4,\"content\":\"<|im_end|>\",\"special\":true}]}");
  snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
  rc |= write_file(p, "{\"chat_template\":\"{{ messages }}\",\"eos_token\":\"<|im_end|>\"}");
  CHECK(rc == 0, "tokenizer dir set up");
  snprintf(out, sizeof out, "%s.gguf", dir);
  convert_stats st;
  rc = convert(dir, out, -1, -1, &st, err, sizeof err);
  CHECK(rc == 0 && st.tokenizer, "converts with the tokenizer: %s", rc ? err : "ok");
  gguf_file *g = NULL;
  if (!rc && !gguf_open(out, &g, err, sizeof err)) {
    uint32_t at;
    uint64_t n = 0;
    gguf_str s, pre, tpl;
    const gguf_value *v = gguf_get_arr(g, "tokenizer.ggml.tokens", &at, &n);
    CHECK(v && n == 512 && gguf_arr_str(v, 2, &s) == 0 && gguf_str_eq(s, "ab"), "tokens: %llu, token 2 = ab",
          (unsigned long long)n);
    CHECK(gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0 && gguf_str_eq(pre, "qwen2"), "pre-tokenizer qwen2");
    CHECK(gguf_get_str(g, "tokenizer.chat_template", &tpl) == 0 && gguf_str_eq(tpl, "{{ messages }}"), "chat template");
    uint32_t eos = 0;
    CHECK(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos) == 0 && eos == 4, "eos id 4");
  }
  gguf_close(g);
  remove(out);
}

/* ---- errors ---- */
static int tmp_left(const char *dir, const char *stem) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, stem, strlen(stem)) && strstr(e->d_name, ".tmp.")) n++;
  closedir(d);
  return n;
}

static void test_errors(void) {
  SECTION("errors");
  char err[256], out[1024];
  const char *tmpdir = test_tmp("");
  snprintf(out, sizeof out, "%s", test_tmp("cv_err.gguf"));
  struct { const char *what; const char *dir; int type; } cases[4];
  int nc = 0;
  /* not a model directory */
  cases[nc++] = (typeof(cases[0])){ "not a directory", test_fixture("models/nonexistent"), -1 };
  const char *empty = test_tmp("cv_empty");
  mkdir(empty, 0755);
  char emptyc[1024];
  snprintf(emptyc, sizeof emptyc, "%s", empty);
  cases[nc++] = (typeof(cases[0])){ "no config.json", emptyc, -1 };
  /* unsupported model_type */
  const char *llama = test_tmp("cv_llama");
  mkdir(llama, 0755);
  char p[1024], llamac[1024];
  snprintf(llamac, sizeof llamac, "%s", llama);
  snprintf(p, sizeof p, "%s/config.json", llama);
  write_file(p, "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":1}");
  cases[nc++] = (typeof(cases[0])){ "unsupported model_type", llamac, -1 };
  /* missing tensor */
  const char *miss = test_tmp("cv_missing");
  char missc[1024];
  snprintf(missc, sizeof missc, "%s", miss);
  make_wide(miss, "model.layers.0.mlp.experts.2.up_proj.weight");
  cases[nc++] = (typeof(cases[0])){ "missing tensor", missc, -1 };
  for (int i = 0; i < nc; i++) {
    err[0] = 0;
    int rc = convert(cases[i].dir, out, cases[i].type, -1, NULL, err, sizeof err);
    CHECK(rc < 0 && err[0] && !strchr(err, '\n'), "%s refused: %s", cases[i].what, err);
    struct stat sb;
    CHECK(stat(out, &sb) != 0 && tmp_left(tmpdir, "cv_err.gguf") == 0, "%s: no output, no temp file", cases[i].what);
  }
  CHECK(strstr(err, "experts.2.up_proj") != NULL, "missing tensor named in the message");
  /* bad type (no quantizer) */
  int rc = convert(test_fixture("models/qwen3moe"), out, FLOE_TYPE_IQ2_XXS, -1, NULL, err, sizeof err);
  CHECK(rc < 0, "type iq2_xxs refused: %s", err);
  rc = convert(test_fixture("models/qwen3moe"), out, -1, FLOE_TYPE_Q8_K, NULL, err, sizeof err);
  CHECK(rc < 0, "expert type q8_K refused: %s", err);
  /* output in a missing directory */
  char bad[1024];
  snprintf(bad, sizeof bad, "%s/no/such/dir/x.gguf", tmpdir);
  rc = convert(test_fixture("models/qwen3moe"), bad, -1, -1, NULL, err, sizeof err);
  CHECK(rc < 0 && !strchr(err, '\n'), "output in a missing directory refused: %s", err);
  struct stat sb;
  CHECK(stat(out, &sb) != 0 && tmp_left(tmpdir, "cv_err.gguf") == 0, "no output and no temp file after errors");
}

int main(void) {
  test_hf("models/qwen3moe");
  test_hf("models/qwen3next");
  test_hf("models/qwen35moe");
  test_wide();
  test_mtp();
  test_mlx("mlx/qwen3next");
  test_mlx("mlx/qwen35moe");
  test_tokenizer();
  test_errors();
  return TEST_DONE();
}
