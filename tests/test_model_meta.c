/* Presets, tensor lists (names and ggml shapes as llama.cpp writes them), hparams <-> GGUF round
 * trips and their validation, and the synthetic / tokenizer.json vocabularies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "format/hf_config.h"
#include "quant/quant.h"
#include "model/model_meta.h"
#include "test.h"
#include "tok/synth_vocab.h"

static const model_tensor_desc *find(const model_tensor_desc *d, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(d[i].name, name)) return &d[i];
  return NULL;
}

/* Checks that tensor `name` exists with shape {a, b, c} (0 = dimension absent). */
static void shape_is(const model_tensor_desc *d, size_t n, const char *name, int64_t a, int64_t b, int64_t c) {
  const model_tensor_desc *t = find(d, n, name);
  CHECK(t != NULL, "tensor %s present", name);
  if (!t) return;
  uint32_t nd = c ? 3 : b ? 2 : 1;
  CHECK(t->n_dims == nd && t->ne[0] == a && t->ne[1] == (b ? b : 1) && t->ne[2] == (c ? c : 1) && t->ne[3] == 1,
        "%s is {%lld, %lld, %lld} (n_dims %u), expected {%lld, %lld, %lld}", name, (long long)t->ne[0],
        (long long)t->ne[1], (long long)t->ne[2], t->n_dims, (long long)a, (long long)b, (long long)c);
}

static double n_params(const model_tensor_desc *d, size_t n, bool with_mtp) {
  double s = 0;
  for (size_t i = 0; i < n; i++)
    if (with_mtp || !(d[i].flags & MODEL_TF_MTP)) s += (double)d[i].ne[0] * (double)d[i].ne[1] * (double)d[i].ne[2];
  return s;
}

static void load(const char *preset, floe_hparams *hp, model_tensor_desc **d, size_t *n) {
  char err[256];
  CHECK(model_preset(preset, hp, err, sizeof err) == 0, "preset %s: %s", preset, err);
  int rc = model_tensor_list(hp, d, n, err, sizeof err);
  CHECK(rc == 0, "tensor list %s: %s", preset, err);
}

static void test_real_presets(void) {
  floe_hparams hp;
  model_tensor_desc *d;
  size_t n;

  SECTION("qwen35moe-35b-a3b");
  load("qwen35moe-35b-a3b", &hp, &d, &n);
  /* 30 GDN layers x 19 + 10 full x 16 + MTP 20 + token_embd/output_norm/output */
  CHECK(n == 753, "35B: %zu tensors, expected 753", n);
  CHECK(hp.recurrent[0] && hp.recurrent[1] && hp.recurrent[2] && !hp.recurrent[3] && !hp.recurrent[39] && hp.recurrent[38],
        "35B layer pattern L,L,L,F");
  shape_is(d, n, "token_embd.weight", 2048, 248320, 0);
  shape_is(d, n, "output.weight", 2048, 248320, 0);
  shape_is(d, n, "output_norm.weight", 2048, 0, 0);
  shape_is(d, n, "blk.0.attn_norm.weight", 2048, 0, 0);
  shape_is(d, n, "blk.0.post_attention_norm.weight", 2048, 0, 0);
  shape_is(d, n, "blk.0.attn_qkv.weight", 2048, 8192, 0);
  shape_is(d, n, "blk.0.attn_gate.weight", 2048, 4096, 0);
  shape_is(d, n, "blk.0.ssm_beta.weight", 2048, 32, 0);
  shape_is(d, n, "blk.0.ssm_alpha.weight", 2048, 32, 0);
  shape_is(d, n, "blk.0.ssm_conv1d.weight", 4, 8192, 0);
  shape_is(d, n, "blk.0.ssm_dt.bias", 32, 0, 0);
  shape_is(d, n, "blk.0.ssm_a", 32, 0, 0);
  shape_is(d, n, "blk.0.ssm_norm.weight", 128, 0, 0);
  shape_is(d, n, "blk.0.ssm_out.weight", 4096, 2048, 0);
  shape_is(d, n, "blk.0.ffn_gate_inp.weight", 2048, 256, 0);
  shape_is(d, n, "blk.0.ffn_gate_exps.weight", 2048, 512, 256);
  shape_is(d, n, "blk.0.ffn_up_exps.weight", 2048, 512, 256);
  shape_is(d, n, "blk.0.ffn_down_exps.weight", 512, 2048, 256);
  shape_is(d, n, "blk.0.ffn_gate_inp_shexp.weight", 2048, 0, 0);
  shape_is(d, n, "blk.0.ffn_gate_shexp.weight", 2048, 512, 0);
  shape_is(d, n, "blk.0.ffn_up_shexp.weight", 2048, 512, 0);
  shape_is(d, n, "blk.0.ffn_down_shexp.weight", 512, 2048, 0);
  shape_is(d, n, "blk.3.attn_q.weight", 2048, 8192, 0);
  shape_is(d, n, "blk.3.attn_k.weight", 2048, 512, 0);
  shape_is(d, n, "blk.3.attn_v.weight", 2048, 512, 0);
  shape_is(d, n, "blk.3.attn_output.weight", 4096, 2048, 0);
  shape_is(d, n, "blk.3.attn_q_norm.weight", 256, 0, 0);
  shape_is(d, n, "blk.3.attn_k_norm.weight", 256, 0, 0);
  CHECK(!find(d, n, "blk.3.attn_qkv.weight") && !find(d, n, "blk.0.attn_q.weight"), "35B: GDN/full tensors by layer type");
  CHECK(!find(d, n, "blk.0.ffn_norm.weight") && !find(d, n, "blk.0.ssm_ba.weight"), "35B: no qwen3moe/qwen3next names");
  shape_is(d, n, "blk.40.nextn.eh_proj.weight", 4096, 2048, 0);
  shape_is(d, n, "blk.40.nextn.enorm.weight", 2048, 0, 0);
  shape_is(d, n, "blk.40.nextn.hnorm.weight", 2048, 0, 0);
  shape_is(d, n, "blk.40.nextn.shared_head_norm.weight", 2048, 0, 0);
  shape_is(d, n, "blk.40.attn_q.weight", 2048, 8192, 0);
  shape_is(d, n, "blk.40.ffn_down_exps.weight", 512, 2048, 256);
  shape_is(d, n, "blk.40.post_attention_norm.weight", 2048, 0, 0);
  CHECK(!find(d, n, "blk.41.attn_norm.weight"), "35B: one MTP block");
  const model_tensor_desc *t = find(d, n, "blk.40.attn_q.weight");
  CHECK(t && (t->flags & MODEL_TF_MTP) && t->layer == 40, "35B: MTP flag and layer index");
  t = find(d, n, "blk.0.ffn_gate_exps.weight");
  CHECK(t && (t->flags & MODEL_TF_EXPERTS) && t->kind == MODEL_K_FFN_GATE_EXPS && t->layer == 0, "35B: expert flags");
  t = find(d, n, "blk.0.ssm_conv1d.weight");
  CHECK(t && (t->flags & MODEL_TF_F32), "conv1d is F32");
  t = find(d, n, "blk.0.ffn_gate_inp.weight");
  CHECK(t && (t->flags & MODEL_TF_F32), "router is F32");
  double p = n_params(d, n, false);
  CHECK(p > 34.0e9 && p < 36.5e9, "35B: %.2fB parameters without MTP", p / 1e9);
  free(d);

  SECTION("qwen35moe-397b-a17b");
  load("qwen35moe-397b-a17b", &hp, &d, &n);
  CHECK(n == 45 * 19 + 15 * 16 + 20 + 3, "397B: %zu tensors", n);
  shape_is(d, n, "blk.3.attn_q.weight", 4096, 16384, 0);
  shape_is(d, n, "blk.3.attn_k.weight", 4096, 512, 0);
  shape_is(d, n, "blk.0.ssm_conv1d.weight", 4, 12288, 0);
  shape_is(d, n, "blk.0.attn_gate.weight", 4096, 8192, 0);
  shape_is(d, n, "blk.0.ffn_gate_exps.weight", 4096, 1024, 512);
  shape_is(d, n, "blk.59.ffn_down_exps.weight", 1024, 4096, 512);
  shape_is(d, n, "blk.60.nextn.eh_proj.weight", 8192, 4096, 0);
  p = n_params(d, n, false);
  CHECK(p > 390e9 && p < 405e9, "397B: %.1fB parameters without MTP", p / 1e9);
  free(d);

  SECTION("qwen3next-80b-a3b");
  load("qwen3next-80b-a3b", &hp, &d, &n);
  CHECK(n == 36 * 18 + 12 * 16 + 20 + 3, "80B: %zu tensors", n);
  shape_is(d, n, "blk.0.ssm_ba.weight", 2048, 64, 0);
  shape_is(d, n, "blk.0.attn_qkv.weight", 2048, 8192, 0);
  shape_is(d, n, "blk.0.attn_gate.weight", 2048, 4096, 0);
  CHECK(!find(d, n, "blk.0.ssm_beta.weight") && !find(d, n, "blk.0.ssm_in.weight"), "80B: ssm_ba, no ssm_beta/ssm_in");
  shape_is(d, n, "blk.7.attn_q.weight", 2048, 8192, 0);
  shape_is(d, n, "blk.0.ffn_gate_exps.weight", 2048, 512, 512);
  shape_is(d, n, "blk.48.nextn.eh_proj.weight", 4096, 2048, 0);
  shape_is(d, n, "output.weight", 2048, 151936, 0);
  p = n_params(d, n, false);
  CHECK(p > 78e9 && p < 82e9, "80B: %.1fB parameters without MTP", p / 1e9);
  free(d);

  SECTION("qwen3moe-30b-a3b");
  load("qwen3moe-30b-a3b", &hp, &d, &n);
  CHECK(n == 48 * 12 + 3, "30B: %zu tensors", n);
  shape_is(d, n, "blk.0.attn_q.weight", 2048, 4096, 0);
  shape_is(d, n, "blk.0.attn_k.weight", 2048, 512, 0);
  shape_is(d, n, "blk.0.attn_output.weight", 4096, 2048, 0);
  shape_is(d, n, "blk.0.attn_q_norm.weight", 128, 0, 0);
  shape_is(d, n, "blk.0.ffn_norm.weight", 2048, 0, 0);
  shape_is(d, n, "blk.47.ffn_gate_exps.weight", 2048, 768, 128);
  shape_is(d, n, "blk.47.ffn_down_exps.weight", 768, 2048, 128);
  CHECK(!find(d, n, "blk.0.post_attention_norm.weight") && !find(d, n, "blk.0.ffn_gate_shexp.weight") &&
            !find(d, n, "blk.48.attn_norm.weight"),
        "30B: no post_attention_norm, no shared expert, no MTP");
  p = n_params(d, n, true);
  CHECK(p > 30.0e9 && p < 31.5e9, "30B: %.2fB parameters", p / 1e9);
  free(d);

  SECTION("qwen3moe-235b-a22b");
  load("qwen3moe-235b-a22b", &hp, &d, &n);
  CHECK(n == 94 * 12 + 3, "235B: %zu tensors", n);
  shape_is(d, n, "blk.93.attn_q.weight", 4096, 8192, 0);
  shape_is(d, n, "blk.93.attn_k.weight", 4096, 512, 0);
  shape_is(d, n, "blk.93.ffn_up_exps.weight", 4096, 1536, 128);
  p = n_params(d, n, true);
  CHECK(p > 233e9 && p < 237e9, "235B: %.1fB parameters", p / 1e9);
  free(d);
}

static void test_tiny_and_truncate(void) {
  SECTION("tiny presets, --layers truncation, unknown preset");
  const char *const *names = model_preset_names();
  int count = 0;
  for (; names[count]; count++) {
    floe_hparams hp;
    model_tensor_desc *d;
    size_t n;
    load(names[count], &hp, &d, &n);
    /* every row length of a quantizable tensor is a multiple of 256 in every preset */
    bool ok = true;
    for (size_t i = 0; i < n; i++)
      if (!(d[i].flags & (MODEL_TF_VECTOR | MODEL_TF_F32)) && d[i].ne[0] % 256) ok = false;
    CHECK(ok, "%s: all quantizable rows are multiples of 256", names[count]);
    if (!strncmp(names[count], "tiny-", 5)) {
      CHECK(hp.n_vocab >= 512 && hp.n_vocab <= 1024 && hp.n_layer == 4 && hp.n_expert == 8 && hp.n_expert_used == 2,
            "%s: tiny shape", names[count]);
      if (hp.arch != FLOE_ARCH_QWEN3MOE) {
        int nrec = 0;
        for (int i = 0; i < 4; i++) nrec += hp.recurrent[i];
        CHECK(nrec == 3 && !hp.recurrent[3] && hp.n_mtp == 1, "%s: L,L,L,F + MTP", names[count]);
      }
    }
    free(d);
  }
  CHECK(count == 8, "8 presets (%d)", count);

  floe_hparams hp;
  char err[512];
  CHECK(model_preset("qwen35moe-35b-a3b", &hp, err, sizeof err) == 0, "preset");
  CHECK(model_hparams_truncate(&hp, 6, err, sizeof err) == 0, "truncate to 6");
  CHECK(hp.n_layer == 6 && hp.n_mtp == 1 && hp.recurrent[4] && hp.recurrent[5] && !hp.recurrent[3] && !hp.recurrent[6] &&
            !hp.recurrent[39],
        "truncated pattern kept, MTP kept");
  model_tensor_desc *d;
  size_t n;
  CHECK(model_tensor_list(&hp, &d, &n, err, sizeof err) == 0, "list");
  CHECK(find(d, n, "blk.6.nextn.eh_proj.weight") && !find(d, n, "blk.7.attn_norm.weight") &&
            find(d, n, "blk.5.attn_qkv.weight"),
        "truncated: MTP block is blk.6");
  free(d);
  CHECK(model_hparams_truncate(&hp, 7, err, sizeof err) == FLOE_E_INVALID, "cannot grow");
  int rc = model_preset("no-such-model", &hp, err, sizeof err);
  CHECK(rc == FLOE_E_NOTFOUND && strstr(err, "tiny-qwen3next") && strstr(err, "qwen35moe-397b-a17b"),
        "unknown preset lists the names: %s", err);
}

static bool hp_equal(const floe_hparams *a, const floe_hparams *b) {
  return a->arch == b->arch && a->n_vocab == b->n_vocab && a->n_embd == b->n_embd && a->n_layer == b->n_layer &&
         a->n_mtp == b->n_mtp && a->n_ctx_train == b->n_ctx_train && a->n_head == b->n_head &&
         a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim && a->n_rot == b->n_rot &&
         !memcmp(a->rope_sections, b->rope_sections, sizeof a->rope_sections) && a->rope_theta == b->rope_theta &&
         a->rms_eps == b->rms_eps && a->attn_gate == b->attn_gate && a->n_expert == b->n_expert &&
         a->n_expert_used == b->n_expert_used && a->n_ff_exp == b->n_ff_exp && a->n_ff_shexp == b->n_ff_shexp &&
         a->n_ff == b->n_ff && a->norm_topk == b->norm_topk && a->full_attn_interval == b->full_attn_interval &&
         !memcmp(a->recurrent, b->recurrent, sizeof a->recurrent) && a->ssm_conv_kernel == b->ssm_conv_kernel &&
         a->ssm_d_state == b->ssm_d_state && a->ssm_n_group == b->ssm_n_group && a->ssm_dt_rank == b->ssm_dt_rank &&
         a->ssm_d_inner == b->ssm_d_inner && a->tied_embeddings == b->tied_embeddings;
}

/* Writes a metadata-only GGUF: hparams keys (optionally edited) + a short token list. */
typedef void (*edit_fn)(gguf_writer *w);
static int write_meta(const char *path, const floe_hparams *hp, edit_fn edit) {
  gguf_writer *w;
  char err[256];
  if (gguf_writer_open(path, &w, err, sizeof err)) return -1;
  if (hp && model_hparams_to_gguf(w, hp)) { gguf_writer_abort(w); return -1; }
  if (edit) edit(w);
  if (hp) {
    char **toks = malloc((size_t)hp->n_vocab * sizeof *toks);
    char *store = malloc((size_t)hp->n_vocab * 24);
    for (int64_t i = 0; i < hp->n_vocab; i++) {
      toks[i] = store + 24 * i;
      snprintf(toks[i], 24, "t%lld", (long long)i);
    }
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)hp->n_vocab);
    free(toks);
    free(store);
  }
  return gguf_writer_finish(w);
}

static int read_meta(const char *path, floe_hparams *hp, char *err, size_t errlen) {
  gguf_file *g;
  int rc = gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  rc = model_hparams_from_gguf(g, hp, err, errlen);
  gguf_close(g);
  return rc;
}

static void ed_unknown_arch(gguf_writer *w) { gguf_writer_add_str(w, "general.architecture", "llama"); }

static void test_roundtrip(void) {
  SECTION("hparams -> GGUF -> hparams, every preset");
  for (const char *const *p = model_preset_names(); *p; p++) {
    floe_hparams a, b;
    char err[512] = "";
    model_preset(*p, &a, err, sizeof err);
    const char *path = test_tmp("meta_roundtrip.gguf");
    CHECK(write_meta(path, &a, NULL) == 0, "%s: write", *p);
    int rc = read_meta(path, &b, err, sizeof err);
    CHECK(rc == 0, "%s: read back: %s", *p, err);
    CHECK(rc == 0 && hp_equal(&a, &b), "%s: round trip equal", *p);
    /* truncated + explicit irregular pattern round trips through attention.recurrent_layers */
    if (a.arch != FLOE_ARCH_QWEN3MOE) {
      model_hparams_truncate(&a, 3, err, sizeof err);
      a.recurrent[1] = false;
      CHECK(write_meta(path, &a, NULL) == 0, "%s: write irregular", *p);
      rc = read_meta(path, &b, err, sizeof err);
      CHECK(rc == 0 && hp_equal(&a, &b) && b.recurrent[0] && !b.recurrent[1] && b.recurrent[2],
            "%s: irregular pattern round trip (%s)", *p, err);
    }
  }

  SECTION("GGUF metadata validation");
  floe_hparams a, b;
  char err[512];
  const char *path = test_tmp("meta_bad.gguf");
  model_preset("tiny-qwen35moe", &a, err, sizeof err);
  floe_hparams bad = a;
  bad.n_head = 3; /* not a multiple of head_count_kv 2: refused by the writer */
  CHECK(write_meta(path, &bad, NULL) != 0, "writer refuses heads that do not divide");
  CHECK(write_meta(path, NULL, ed_unknown_arch) == 0, "write llama arch");
  int rc = read_meta(path, &b, err, sizeof err);
  CHECK(rc == FLOE_E_UNSUPPORTED && strstr(err, "llama"), "unknown architecture refused: %s", err);

  /* Hand-built files with one key wrong each. */
  struct { const char *key; uint32_t val; int expect; const char *what; } cases[] = {
      {"qwen35moe.attention.head_count", 3, FLOE_E_FORMAT, "head_count not multiple of head_count_kv"},
      {"qwen35moe.block_count", 300, FLOE_E_FORMAT, "block_count > FLOE_MAX_LAYERS"},
      {"qwen35moe.nextn_predict_layers", 5, FLOE_E_FORMAT, "nextn >= block_count"},
      {"qwen35moe.expert_used_count", 9, FLOE_E_FORMAT, "expert_used_count > expert_count"},
      {"qwen35moe.ssm.time_step_rank", 3, FLOE_E_FORMAT, "time_step_rank not a multiple of group_count"},
      {"qwen35moe.rope.dimension_count", 128, FLOE_E_FORMAT, "rope dims > head_dim"},
      {"qwen35moe.expert_count", 0, FLOE_E_FORMAT, "zero experts"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gguf_writer *w;
    gguf_writer_open(path, &w, err, sizeof err);
    /* write the override first: the writer rejects duplicate keys, so the regular writer must skip it */
    gguf_writer_add_u32(w, cases[i].key, cases[i].val);
    gguf_writer_add_str(w, "general.architecture", "qwen35moe");
    const char *keys[] = {"block_count", "context_length", "embedding_length", "attention.head_count",
                          "attention.head_count_kv", "attention.key_length", "attention.value_length",
                          "rope.dimension_count", "expert_count", "expert_used_count", "expert_feed_forward_length",
                          "expert_shared_feed_forward_length", "ssm.conv_kernel", "ssm.state_size", "ssm.group_count",
                          "ssm.time_step_rank", "ssm.inner_size", "full_attention_interval", "nextn_predict_layers"};
    const int64_t vals[] = {5, 4096, 256, 4, 2, 64, 64, 16, 8, 2, 256, 256, 4, 64, 2, 4, 256, 4, 1};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      char full[128];
      snprintf(full, sizeof full, "qwen35moe.%s", keys[k]);
      if (strcmp(full, cases[i].key)) gguf_writer_add_u32(w, full, (uint32_t)vals[k]);
    }
    gguf_writer_add_f32(w, "qwen35moe.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_add_f32(w, "qwen35moe.rope.freq_base", 1e7f);
    const char *toks[] = {"a", "b", "c", "d"};
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    CHECK(gguf_writer_finish(w) == 0, "write case %zu", i);
    err[0] = 0;
    rc = read_meta(path, &b, err, sizeof err);
    CHECK(rc == cases[i].expect, "%s: rc %d (%s)", cases[i].what, rc, err);
  }
  /* a missing required key */
  {
    gguf_writer *w;
    gguf_writer_open(path, &w, err, sizeof err);
    gguf_writer_add_str(w, "general.architecture", "qwen3moe");
    gguf_writer_add_u32(w, "qwen3moe.block_count", 4);
    gguf_writer_finish(w);
    rc = read_meta(path, &b, err, sizeof err);
    CHECK(rc == FLOE_E_FORMAT && strstr(err, "missing key qwen3moe.context_length"), "missing key named: %s", err);
  }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool is_token(char **sorted, uint64_t n, const char *s) {
  return bsearch(&s, sorted, n, sizeof *sorted, cmp_str) != NULL;
}

static void check_vocab(const synth_vocab *v, const char *what) {
  char **sorted = malloc(v->n * sizeof *sorted);
  memcpy(sorted, v->tokens, v->n * sizeof *sorted);
  qsort(sorted, v->n, sizeof *sorted, cmp_str);
  bool unique = true;
  for (uint64_t i = 1; i < v->n; i++)
    if (!strcmp(sorted[i - 1], sorted[i])) unique = false;
  CHECK(unique, "%s: tokens unique", what);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < v->n_merges; i++) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v->merges[i]);
    char *sp = strchr(buf, ' ');
    if (!sp || strchr(sp + 1, ' ')) { bad++; continue; }
    *sp = 0;
    char cat[256];
    snprintf(cat, sizeof cat, "%s%s", buf, sp + 1);
    if (!is_token(sorted, v->n, buf) || !is_token(sorted, v->n, sp + 1) || !is_token(sorted, v->n, cat)) bad++;
  }
  CHECK(bad == 0, "%s: every merge joins two tokens into a token (%llu bad of %llu)", what, (unsigned long long)bad,
        (unsigned long long)v->n_merges);
  free(sorted);
}

/* Copies a GGUF (every key except skip, then edit(w), then every tensor byte for byte). */
static int copy_gguf(const char *from, const char *to, const char *skip, edit_fn edit) {
  gguf_file *g;
  gguf_writer *w;
  char err[256];
  if (gguf_open(from, &g, err, sizeof err)) return -1;
  if (gguf_writer_open(to, &w, err, sizeof err)) { gguf_close(g); return -1; }
  gguf_writer_set_alignment(w, (uint32_t)g->alignment);
  for (uint64_t i = 0; i < g->n_kv; i++)
    if (!gguf_str_eq(g->kv[i].key, skip) && !gguf_str_eq(g->kv[i].key, "general.alignment")) gguf_writer_add_kv(w, &g->kv[i]);
  if (edit) edit(w);
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const gguf_tensor *t = &g->tensors[i];
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
    gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne);
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) gguf_writer_write_data(w, g->tensors[i].data, g->tensors[i].size);
  int rc = gguf_writer_finish(w);
  gguf_close(g);
  return rc;
}

static void ed_interval_2(gguf_writer *w) { gguf_writer_add_u32(w, "qwen35moe.full_attention_interval", 2); }

/* Reads rope.dimension_sections of a qwen35moe file as stored (not through the hparams). */
static bool file_sections(const char *path, int32_t out[4]) {
  gguf_file *g;
  char err[256];
  if (gguf_open(path, &g, err, sizeof err)) return false;
  uint32_t at;
  uint64_t n;
  const gguf_value *v = gguf_get_arr(g, "qwen35moe.rope.dimension_sections", &at, &n);
  bool ok = v && n == 4;
  for (uint64_t i = 0; ok && i < 4; i++) {
    int64_t x;
    ok = gguf_arr_i64(v, i, &x) == 0;
    out[i] = (int32_t)x;
  }
  gguf_close(g);
  return ok;
}

static void ed_sections_zero(gguf_writer *w) {
  static const int32_t z[4] = {0, 0, 0, 0};
  gguf_writer_add_arr(w, "qwen35moe.rope.dimension_sections", GGUF_TYPE_INT32, z, 4);
}

static void test_rope_sections(void) {
  SECTION("qwen35moe rope sections: validity under llama.cpp's interleaved rule");
  /* Brute-force oracle: pair i -> section s = i % sum; t/h/w per the interleave, else e. */
  for (int a = 0; a <= 6; a++)
    for (int b = 0; b <= 6; b++)
      for (int c = 0; c <= 6; c++)
        for (int d = 0; d <= 2; d++)
          for (int64_t n_rot = 2; n_rot <= 40; n_rot += 2) {
            const int32_t sec[4] = {a, b, c, d};
            const int sum = a + b + c + d;
            bool want = sum > 0 && sum <= 32;
            for (int64_t i = 0; want && i < n_rot / 2; i++) {
              int s = (int)(i % sum), k = s % 3;
              want = (k == 0 && s / 3 < a) || (k == 1 && s / 3 < b) || (k == 2 && s / 3 < c);
            }
            if (model_rope_sections_valid(sec, n_rot, 32) != want) {
              CHECK(0, "[%d,%d,%d,%d] n_rot %lld: valid should be %d", a, b, c, d, (long long)n_rot, want);
              return;
            }
          }
  CHECK(1, "validity matches the brute-force rule on 7x7x7x3 splits x 20 rotary sizes");
  int32_t sec[4];
  model_rope_sections_canonical(64, sec);
  CHECK(sec[0] == 11 && sec[1] == 11 && sec[2] == 10 && sec[3] == 0, "canonical split of 32 pairs is [11,11,10,0]");
  bool all = true;
  for (int64_t n_rot = 2; n_rot <= 512; n_rot += 2) {
    model_rope_sections_canonical(n_rot, sec);
    all = all && model_rope_sections_valid(sec, n_rot, n_rot) && sec[0] + sec[1] + sec[2] == n_rot / 2;
  }
  CHECK(all, "the canonical split is valid and covers n_rot/2 for every n_rot up to 512");
  const int32_t zero[4] = {0, 0, 0, 0}, hf422[4] = {4, 2, 2, 0}, real[4] = {11, 11, 10, 0};
  CHECK(!model_rope_sections_valid(zero, 16, 64), "[0,0,0,0] is not valid (ggml asserts a positive section)");
  CHECK(!model_rope_sections_valid(hf422, 16, 64), "[4,2,2,0] over 8 pairs leaves pair 7 on the 4th position");
  CHECK(model_rope_sections_valid(real, 16, 64), "[11,11,10,0] is valid for 8 pairs (sum 32 <= head_dim 64)");
  CHECK(!model_rope_sections_valid(real, 16, 16), "[11,11,10,0] is not valid when head_dim 16 < 32");

  SECTION("qwen35moe rope sections: HF config -> hparams");
  static const char *cfg_fmt =
      "{\"model_type\":\"qwen3_5_moe_text\",\"vocab_size\":512,\"hidden_size\":64,\"num_hidden_layers\":4,"
      "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":64,\"num_experts\":8,"
      "\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"shared_expert_intermediate_size\":32,"
      "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":16,"
      "\"linear_value_head_dim\":16,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e7,"
      "\"partial_rotary_factor\":0.25%s}}";
  char json[2048], err[512];
  hf_config c;
  snprintf(json, sizeof json, cfg_fmt, ",\"mrope_section\":[5,2,1],\"mrope_interleaved\":true");
  int rc = hf_config_parse(json, strlen(json), "cfg", &c, err, sizeof err);
  CHECK(rc == 0 && c.hp.rope_sections[0] == 5 && c.hp.rope_sections[1] == 2 && c.hp.rope_sections[2] == 1 &&
            c.hp.rope_sections[3] == 0,
        "mrope_section [5,2,1] is read as [5,2,1,0] (%s)", rc ? err : "");
  if (!rc) hf_config_free(&c);
  snprintf(json, sizeof json, cfg_fmt, "");
  rc = hf_config_parse(json, strlen(json), "cfg", &c, err, sizeof err);
  CHECK(rc == 0 && c.hp.n_rot == 16 && c.hp.rope_sections[0] == 3 && c.hp.rope_sections[1] == 3 &&
            c.hp.rope_sections[2] == 2 && c.hp.rope_sections[3] == 0,
        "no mrope_section: the canonical split of 8 pairs [3,3,2,0] (%s)", rc ? err : "");
  if (!rc) hf_config_free(&c);
  snprintf(json, sizeof json, cfg_fmt, ",\"mrope_section\":[1,2,3,4,5]");
  rc = hf_config_parse(json, strlen(json), "cfg", &c, err, sizeof err);
  CHECK(rc == FLOE_E_FORMAT && strstr(err, "mrope_section"), "5 sections refused: %s", err);
  if (!rc) hf_config_free(&c);
  snprintf(json, sizeof json, cfg_fmt, ",\"mrope_section\":[2,\"x\",1]");
  rc = hf_config_parse(json, strlen(json), "cfg", &c, err, sizeof err);
  CHECK(rc == FLOE_E_FORMAT && strstr(err, "mrope_section[1]"), "non-integer section refused: %s", err);
  if (!rc) hf_config_free(&c);

  SECTION("qwen35moe rope sections: GGUF writer and reader");
  floe_hparams hp, back;
  model_preset("tiny-qwen35moe", &hp, err, sizeof err);
  const char *path = test_tmp("meta_sections.gguf");
  int32_t got[4] = {-1, -1, -1, -1};
  hp.rope_sections[0] = 4, hp.rope_sections[1] = 3, hp.rope_sections[2] = 2, hp.rope_sections[3] = 0;
  CHECK(write_meta(path, &hp, NULL) == 0 && file_sections(path, got) && got[0] == 4 && got[1] == 3 && got[2] == 2 &&
            got[3] == 0,
        "a valid split is written as is: [%d,%d,%d,%d]", got[0], got[1], got[2], got[3]);
  memset(hp.rope_sections, 0, sizeof hp.rope_sections);
  CHECK(write_meta(path, &hp, NULL) == 0 && file_sections(path, got) && got[0] == 3 && got[1] == 3 && got[2] == 2 &&
            got[3] == 0,
        "[0,0,0,0] is written as the canonical split: [%d,%d,%d,%d]", got[0], got[1], got[2], got[3]);
  hp.rope_sections[0] = 4, hp.rope_sections[1] = 2, hp.rope_sections[2] = 2;
  CHECK(write_meta(path, &hp, NULL) == 0 && file_sections(path, got) && got[0] == 3 && got[1] == 3 && got[2] == 2,
        "[4,2,2,0] over 8 pairs is written as the canonical split: [%d,%d,%d,%d]", got[0], got[1], got[2], got[3]);
  /* An older floe file: [0,0,0,0] stored. floe still reads it (the forward pass does not use
   * the sections: text positions are equal). */
  model_preset("tiny-qwen35moe", &hp, err, sizeof err);
  const char *src = test_tmp("meta_sections_src.gguf");
  CHECK(write_meta(src, &hp, NULL) == 0, "write source");
  CHECK(copy_gguf(src, path, "qwen35moe.rope.dimension_sections", ed_sections_zero) == 0 && file_sections(path, got) &&
            !got[0] && !got[1] && !got[2] && !got[3],
        "old-style file with [0,0,0,0] written");
  rc = read_meta(path, &back, err, sizeof err);
  CHECK(rc == 0 && !back.rope_sections[0] && !back.rope_sections[1] && !back.rope_sections[2],
        "old-style [0,0,0,0] file still reads (%s)", rc ? err : "");

  SECTION("layer pattern vs tensors");
  const char *syn = test_tmp("meta_pattern_src.gguf");
  const char *bin = getenv("FLOE_BIN");
  if (!bin) {
    printf("FLOE_BIN not set: skipping the layer pattern check\n");
    return;
  }
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "\"%s\" synth --preset tiny-qwen35moe -o \"%s\" >/dev/null", bin, syn);
  CHECK(system(cmd) == 0, "%s", cmd);
  CHECK(copy_gguf(syn, path, "qwen35moe.full_attention_interval", ed_interval_2) == 0, "copy with interval 2");
  gguf_file *g = NULL;
  rc = gguf_open(path, &g, err, sizeof err);
  if (!rc) rc = model_hparams_from_gguf(g, &back, err, sizeof err);
  if (g) gguf_close(g);
  CHECK(rc == FLOE_E_FORMAT && strstr(err, "layer pattern mismatch") && strstr(err, "layer 1"),
        "interval 2 on an interval-4 file is a clear error: %s", err);
}

static void test_vocab(void) {
  SECTION("generated vocab");
  synth_vocab v;
  char err[256];
  CHECK(synth_vocab_generate(1024, &v, err, sizeof err) == 0, "generate 1024: %s", err);
  CHECK(v.n == 1024, "1024 tokens");
  CHECK(!strcmp(v.tokens[0], "!") && !strcmp(v.tokens[220], "\xC4\xA0") && !strcmp(v.tokens[198], "\xC4\x8A"),
        "GPT-2 byte order: 0 '!', 198 'Ċ', 220 'Ġ'");
  CHECK(v.n_merges == 1024 - 256 - 26 - 16, "merges fill the vocab (%llu)", (unsigned long long)v.n_merges);
  CHECK(!strcmp(v.tokens[256], "\xC4\xA0t") && !strcmp(v.merges[0], "\xC4\xA0 t"), "first merge 'Ġ t' (%s)", v.merges[0]);
  CHECK(v.eos >= 0 && !strcmp(v.tokens[v.eos], "<|im_end|>") && v.types[v.eos] == SYNTH_TOK_CONTROL, "eos <|im_end|> CONTROL");
  CHECK(v.bos >= 0 && !strcmp(v.tokens[v.bos], "<|endoftext|>") && v.pad == v.bos, "bos/pad <|endoftext|>");
  int found = 0;
  for (uint64_t i = 0; i < v.n; i++) {
    if (!strcmp(v.tokens[i], "<think>") && v.types[i] == SYNTH_TOK_USER_DEFINED) found++;
    if (!strcmp(v.tokens[i], "</tool_call>") && v.types[i] == SYNTH_TOK_USER_DEFINED) found++;
    if (!strcmp(v.tokens[i], "<|im_start|>") && v.types[i] == SYNTH_TOK_CONTROL) found++;
  }
  CHECK(found == 3, "special tokens and types");
  CHECK(!strcmp(v.tokens[1023], "[PAD1023]") && v.types[1023] == SYNTH_TOK_UNUSED, "padding tokens");
  CHECK(v.chat_template && strstr(v.chat_template, "<|im_start|>"), "ChatML template");
  check_vocab(&v, "1024");
  synth_vocab_free(&v);

  CHECK(synth_vocab_generate(151936, &v, err, sizeof err) == 0 && v.n == 151936, "generate 151936: %s", err);
  check_vocab(&v, "151936");
  synth_vocab v2;
  CHECK(synth_vocab_generate(151936, &v2, err, sizeof err) == 0, "again");
  bool same = v.n_merges == v2.n_merges;
  for (uint64_t i = 0; same && i < v.n; i++) same = !strcmp(v.tokens[i], v2.tokens[i]);
  CHECK(same, "deterministic");
  synth_vocab_free(&v2);
  synth_vocab_free(&v);
  CHECK(synth_vocab_generate(100, &v, err, sizeof err) == FLOE_E_INVALID, "too small refused");

  SECTION("tokenizer.json");
  const char *path = test_tmp("synth_tok/tokenizer.json");
  system("mkdir -p \"${FLOE_TMP:-/tmp}/synth_tok\" && rm -f \"${FLOE_TMP:-/tmp}/synth_tok/tokenizer_config.json\"");
  FILE *f = fopen(path, "w");
  CHECK(f != NULL, "create %s", path);
  if (!f) return;
  fputs("{\"version\":\"1.0\",\"added_tokens\":[{\"id\":6,\"content\":\"<|im_end|>\",\"special\":true},"
        "{\"id\":7,\"content\":\"<think>\",\"special\":false},{\"id\":8,\"content\":\"<|endoftext|>\",\"special\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"c\":3,\"abc\":4,\"\\u0120a\":5},"
        "\"merges\":[\"a b\",[\"ab\",\"c\"]]}}", f);
  fclose(f);
  CHECK(synth_vocab_from_tokenizer_json(path, 12, &v, err, sizeof err) == 0, "load: %s", err);
  CHECK(v.n == 12 && !strcmp(v.tokens[2], "ab") && !strcmp(v.tokens[5], "\xC4\xA0" "a"), "vocab ids");
  CHECK(v.n_merges == 2 && !strcmp(v.merges[0], "a b") && !strcmp(v.merges[1], "ab c"), "both merge forms");
  CHECK(v.types[6] == SYNTH_TOK_CONTROL && v.types[7] == SYNTH_TOK_USER_DEFINED && v.types[0] == SYNTH_TOK_NORMAL,
        "added token types");
  CHECK(v.eos == 6 && v.bos == 8 && v.pad == 8, "eos/bos/pad by name");
  CHECK(!strcmp(v.tokens[11], "[PAD11]") && v.types[11] == SYNTH_TOK_UNUSED, "padded to n_vocab");
  synth_vocab_free(&v);
  int rc = synth_vocab_from_tokenizer_json(path, 8, &v, err, sizeof err);
  CHECK(rc == FLOE_E_INVALID && strstr(err, "outside"), "more tokens than n_vocab refused: %s", err);
  rc = synth_vocab_from_tokenizer_json(test_tmp("synth_tok/missing.json"), 8, &v, err, sizeof err);
  CHECK(rc == FLOE_E_IO, "missing file: %s", err);
}

/* End to end: `floe synth` a tiny model, read it back, compare with the preset and the tensor
 * list, and check the values: finite, norms ~1, ssm_a < 0, matrix std ~ 1/sqrt(fan_in). */
static void test_synth_file(const char *preset, const char *type) {
  const char *bin = getenv("FLOE_BIN");
  if (!bin) {
    printf("FLOE_BIN not set: skipping the synth file check\n");
    return;
  }
  SECTION("floe synth %s --type %s, read back", preset, type);
  const char *path = test_tmp("meta_synth.gguf");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "\"%s\" synth --preset %s --type %s -o \"%s\" --seed 7 >/dev/null", bin, preset, type, path);
  CHECK(system(cmd) == 0, "%s", cmd);
  gguf_file *g;
  char err[512];
  if (gguf_open(path, &g, err, sizeof err)) {
    CHECK(0, "open: %s", err);
    return;
  }
  floe_hparams want, got;
  model_preset(preset, &want, err, sizeof err);
  int rc = model_hparams_from_gguf(g, &got, err, sizeof err);
  CHECK(rc == 0 && hp_equal(&want, &got), "hparams from the synth file equal the preset (%s)", rc ? err : "ok");
  model_tensor_desc *d;
  size_t n;
  model_tensor_list(&want, &d, &n, err, sizeof err);
  CHECK(g->n_tensors == n, "tensor count %llu == %zu", (unsigned long long)g->n_tensors, n);
  size_t mism = 0, nonfinite = 0, badnorm = 0, badstd = 0, bada = 0;
  for (size_t i = 0; i < n; i++) {
    const gguf_tensor *t = gguf_find_tensor(g, d[i].name);
    if (!t || t->n_dims != d[i].n_dims || memcmp(t->ne, d[i].ne, sizeof t->ne)) { mism++; continue; }
    const bool f32 = d[i].flags & (MODEL_TF_VECTOR | MODEL_TF_F32);
    if (f32 != (t->type == FLOE_TYPE_F32)) mism++;
    int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2];
    size_t rb = floe_row_bytes(t->type, ne0);
    float *row = malloc((size_t)ne0 * sizeof *row);
    double s = 0, s2 = 0;
    for (int64_t r = 0; r < rows; r++) {
      quant_dequant_row(t->type, t->data + (size_t)r * rb, row, ne0);
      for (int64_t j = 0; j < ne0; j++) {
        if (!isfinite(row[j])) nonfinite++;
        s += row[j];
        s2 += (double)row[j] * row[j];
      }
    }
    free(row);
    const double cnt = (double)ne0 * (double)rows, mean = s / cnt, sd = sqrt(s2 / cnt - mean * mean);
    if (d[i].flags & MODEL_TF_NORM) {
      if (fabs(mean - 1.0) > 0.05) badnorm++;
    } else if (d[i].kind == MODEL_K_SSM_A) {
      if (!(mean < 0)) bada++;
    } else if (!(d[i].flags & MODEL_TF_VECTOR) && d[i].kind != MODEL_K_TOKEN_EMBD && d[i].kind != MODEL_K_SSM_CONV1D) {
      const double want_sd = 1.0 / sqrt((double)ne0);
      if (sd < want_sd / 2.5 || sd > want_sd * 2.5) {
        badstd++;
        printf("  %s: std %.4f, want ~%.4f\n", d[i].name, sd, want_sd);
      }
    }
  }
  CHECK(mism == 0, "names, shapes and F32 placement match the tensor list (%zu mismatches)", mism);
  CHECK(nonfinite == 0, "all values finite (%zu NaN/Inf)", nonfinite);
  CHECK(badnorm == 0 && bada == 0, "norm weights ~1 (%zu off), ssm_a < 0 (%zu off)", badnorm, bada);
  CHECK(badstd == 0, "matrix std ~ 1/sqrt(fan_in) (%zu off)", badstd);
  uint32_t at;
  uint64_t nt = 0;
  CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &at, &nt) && nt == (uint64_t)want.n_vocab, "token list of n_vocab");
  gguf_str pre;
  CHECK(gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0 &&
            gguf_str_eq(pre, want.arch == FLOE_ARCH_QWEN35MOE ? "qwen35" : "qwen2"),
        "tokenizer.ggml.pre");
  free(d);
  gguf_close(g);
  remove(path);
}

int main(void) {
  test_real_presets();
  test_tiny_and_truncate();
  test_roundtrip();
  test_rope_sections();
  test_vocab();
  test_synth_file("tiny-qwen35moe", "q8_0");
  test_synth_file("tiny-qwen3next", "q4_K");
  test_synth_file("tiny-qwen3moe", "iq4_xs");
  test_synth_file("tiny-qwen35moe", "f16");
  return TEST_DONE();
}
