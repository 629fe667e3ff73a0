/* HF / MLX config.json reader: real-shaped configs in tests/fixtures/configs (values from
 * shared/reference/qwen-models.md) with every hparams field asserted, HF class defaults, the layer
 * pattern rules, the MLX quantization block and its lookup, and malformed configs (error code and
 * a distinguishing message substring). */
#include <math.h>
#include <sys/stat.h>

#include "base/base.h"
#include "format/hf_config.h"
#include "test.h"

static char err[512];

static int load_fixture(const char *name, hf_config *c) {
  int rc = hf_config_load(test_fixture(name), c, err, sizeof err);
  CHECK(rc == 0, "load %s: %d %s", name, rc, err);
  return rc;
}

static int parse(const char *json, hf_config *c) {
  err[0] = 0;
  return hf_config_parse(json, strlen(json), "config.json", c, err, sizeof err);
}

static void expect_fail(const char *json, int code, const char *sub) {
  hf_config c;
  int rc = parse(json, &c);
  CHECK(rc == code && strstr(err, sub) && !strchr(err, '\n'), "%s: rc %d (want %d), err \"%s\" (want \"%s\")", json, rc,
        code, err, sub);
  if (rc == 0) hf_config_free(&c);
}

/* Checks recurrent[i] == ((i+1) % 4 != 0) for all layers. */
static bool pattern4(const floe_hparams *h) {
  for (int i = 0; i < h->n_layer; i++)
    if (h->recurrent[i] != ((i + 1) % 4 != 0)) return false;
  for (int i = (int)h->n_layer; i < FLOE_MAX_LAYERS; i++)
    if (h->recurrent[i]) return false;
  return true;
}

static void test_qwen3_30b(void) {
  SECTION("Qwen3-30B-A3B (qwen3_moe)");
  hf_config c;
  if (load_fixture("configs/qwen3-30b-a3b.json", &c)) return;
  const floe_hparams *h = &c.hp;
  CHECK(h->arch == FLOE_ARCH_QWEN3MOE && !strcmp(c.model_type, "qwen3_moe"), "arch");
  CHECK(h->n_vocab == 151936 && h->n_embd == 2048 && h->n_layer == 48 && h->n_mtp == 0 && h->n_ctx_train == 40960,
        "sizes");
  CHECK(h->n_head == 32 && h->n_head_kv == 4 && h->head_dim == 128 && h->n_rot == 128, "attention");
  CHECK(h->rope_theta == 1e6f && h->rms_eps == 1e-6f && !h->attn_gate, "rope/eps/gate");
  CHECK(h->n_expert == 128 && h->n_expert_used == 8 && h->n_ff_exp == 768 && h->n_ff_shexp == 0 && h->norm_topk, "moe");
  CHECK(h->full_attn_interval == 0 && h->ssm_conv_kernel == 0 && h->ssm_d_state == 0 && h->ssm_n_group == 0 &&
            h->ssm_dt_rank == 0 && h->ssm_d_inner == 0,
        "no GDN");
  bool any = false;
  for (int i = 0; i < FLOE_MAX_LAYERS; i++) any |= h->recurrent[i];
  CHECK(!any && !h->tied_embeddings, "all full attention, untied");
  CHECK(c.bos_token_id == 151643 && c.n_eos == 1 && c.eos_token_id[0] == 151645 && c.pad_token_id == -1, "token ids");
  CHECK(!c.quant.present, "no quantization");
  hf_config_free(&c);
}

static void test_qwen3_next(void) {
  SECTION("Qwen3-Next-80B-A3B (qwen3_next)");
  hf_config c;
  if (load_fixture("configs/qwen3-next-80b-a3b.json", &c)) return;
  const floe_hparams *h = &c.hp;
  CHECK(h->arch == FLOE_ARCH_QWEN3NEXT, "arch");
  CHECK(h->n_vocab == 151936 && h->n_embd == 2048 && h->n_layer == 48 && h->n_ctx_train == 262144, "sizes");
  CHECK(h->n_mtp == 1, "MTP: num_nextn_predict_layers absent -> vLLM default 1 (got %lld)", (long long)h->n_mtp);
  CHECK(h->n_head == 16 && h->n_head_kv == 2 && h->head_dim == 256 && h->n_rot == 64, "attention");
  CHECK(h->rope_theta == 1e7f && h->rms_eps == 1e-6f && h->attn_gate, "rope/eps/gate");
  CHECK(h->n_expert == 512 && h->n_expert_used == 10 && h->n_ff_exp == 512 && h->n_ff_shexp == 512 && h->norm_topk,
        "moe");
  CHECK(h->full_attn_interval == 4 && pattern4(h) && h->recurrent[0] && !h->recurrent[3] && !h->recurrent[47], "pattern");
  CHECK(h->ssm_conv_kernel == 4 && h->ssm_d_state == 128 && h->ssm_n_group == 16 && h->ssm_dt_rank == 32 &&
            h->ssm_d_inner == 4096,
        "GDN");
  CHECK(!h->tied_embeddings && c.bos_token_id == 151643 && c.n_eos == 1 && c.eos_token_id[0] == 151645, "tie/ids");
  hf_config_free(&c);
}

static void check_35b_text(const hf_config *c) {
  const floe_hparams *h = &c->hp;
  CHECK(h->arch == FLOE_ARCH_QWEN35MOE && !strcmp(c->model_type, "qwen3_5_moe"), "arch");
  CHECK(h->n_vocab == 248320 && h->n_embd == 2048 && h->n_layer == 40 && h->n_mtp == 1 && h->n_ctx_train == 262144,
        "sizes");
  CHECK(h->n_head == 16 && h->n_head_kv == 2 && h->head_dim == 256 && h->n_rot == 64, "attention");
  CHECK(h->rope_theta == 1e7f && h->rms_eps == 1e-6f && h->attn_gate, "rope/eps/gate");
  CHECK(h->n_expert == 256 && h->n_expert_used == 8 && h->n_ff_exp == 512 && h->n_ff_shexp == 512 && h->norm_topk,
        "moe");
  CHECK(h->full_attn_interval == 4 && pattern4(h), "pattern from layer_types");
  CHECK(h->ssm_conv_kernel == 4 && h->ssm_d_state == 128 && h->ssm_n_group == 16 && h->ssm_dt_rank == 32 &&
            h->ssm_d_inner == 4096,
        "GDN");
  CHECK(!h->tied_embeddings && c->bos_token_id == -1 && c->n_eos == 1 && c->eos_token_id[0] == 248044, "tie/ids");
}

static void test_qwen35(void) {
  SECTION("Qwen3.5-35B-A3B (Qwen3_5MoeForConditionalGeneration, text_config, rope_parameters)");
  hf_config c;
  if (load_fixture("configs/qwen3.5-35b-a3b.json", &c) == 0) {
    check_35b_text(&c);
    CHECK(!c.quant.present, "no quantization");
    hf_config_free(&c);
  }
  SECTION("Qwen3.5-397B-A17B (no layer_types: interval rule; 4.x rope_theta spelling)");
  if (load_fixture("configs/qwen3.5-397b-a17b.json", &c)) return;
  const floe_hparams *h = &c.hp;
  CHECK(h->arch == FLOE_ARCH_QWEN35MOE, "arch");
  CHECK(h->n_vocab == 248320 && h->n_embd == 4096 && h->n_layer == 60 && h->n_mtp == 1 && h->n_ctx_train == 262144,
        "sizes");
  CHECK(h->n_head == 32 && h->n_head_kv == 2 && h->head_dim == 256 && h->n_rot == 64, "attention");
  CHECK(h->rope_theta == 1e7f && h->rms_eps == 1e-6f && h->attn_gate, "rope/eps/gate");
  CHECK(h->n_expert == 512 && h->n_expert_used == 10 && h->n_ff_exp == 1024 && h->n_ff_shexp == 1024 && h->norm_topk,
        "moe");
  CHECK(h->full_attn_interval == 4 && pattern4(h) && !h->recurrent[59] && h->recurrent[58], "pattern");
  CHECK(h->ssm_conv_kernel == 4 && h->ssm_d_state == 128 && h->ssm_n_group == 16 && h->ssm_dt_rank == 64 &&
            h->ssm_d_inner == 8192,
        "GDN");
  CHECK(!h->tied_embeddings && c.n_eos == 1 && c.eos_token_id[0] == 248044, "tie/ids");
  hf_config_free(&c);
}

static void test_mlx(void) {
  SECTION("MLX 4-bit Qwen3.5-35B-A3B with 8-bit mlp.gate / shared_expert_gate overrides");
  hf_config c;
  if (load_fixture("configs/qwen3.5-35b-a3b-mlx-4bit.json", &c)) return;
  check_35b_text(&c);
  const hf_quant *q = &c.quant;
  CHECK(q->present && q->mode == HF_QMODE_AFFINE && q->bits == 4 && q->group_size == 64 && q->n_over == 80,
        "defaults and 80 overrides (%zu)", q->n_over);
  int bits, group;
  bool quant;
  int rc = hf_quant_for(q, "language_model.model.layers.7.mlp.gate", &bits, &group, &quant);
  CHECK(rc == 0 && quant && bits == 8 && group == 64, "layers.7.mlp.gate 8-bit");
  rc = hf_quant_for(q, "language_model.model.layers.39.mlp.shared_expert_gate", &bits, &group, &quant);
  CHECK(rc == 0 && quant && bits == 8 && group == 64, "layers.39.shared_expert_gate 8-bit");
  rc = hf_quant_for(q, "language_model.model.layers.7.mlp.switch_mlp.up_proj", &bits, &group, &quant);
  CHECK(rc == 0 && quant && bits == 4 && group == 64, "switch_mlp.up_proj default 4-bit");
  rc = hf_quant_for(q, "language_model.model.layers.7.mlp.gat", &bits, &group, &quant);
  CHECK(rc == 0 && quant && bits == 4, "prefix of an override is not the override");
  for (size_t i = 1; i < q->n_over; i++)
    CHECK(strcmp(q->over[i - 1].module, q->over[i].module) < 0, "overrides sorted at %zu", i);
  hf_config_free(&c);
  hf_config_free(&c); /* idempotent */

  SECTION("quantization overrides: false, true, mode, bits");
  int r = parse("{\"model_type\":\"qwen3_next\",\"quantization_config\":{\"group_size\":32,\"bits\":6,"
                "\"a.b\":false,\"c\":{\"bits\":8},\"d\":{\"mode\":\"mxfp4\",\"group_size\":32},\"e\":true,"
                "\"g\":{\"bits\":7},\"h\":{\"group_size\":16},\"quant_note\":\"x\"}}",
                &c);
  CHECK(r == 0, "parse: %s", err);
  if (r == 0) {
    q = &c.quant;
    CHECK(q->present && q->bits == 6 && q->group_size == 32 && q->mode == HF_QMODE_AFFINE && q->n_over == 6, "defaults");
    rc = hf_quant_for(q, "a.b", &bits, &group, &quant);
    CHECK(rc == 0 && !quant, "false -> not quantized");
    rc = hf_quant_for(q, "c", &bits, &group, &quant);
    CHECK(rc == 0 && quant && bits == 8 && group == 32, "bits override inherits group");
    rc = hf_quant_for(q, "d", &bits, &group, &quant);
    CHECK(rc == FLOE_E_UNSUPPORTED && quant && bits == 6 && group == 32, "mxfp4 module unsupported");
    rc = hf_quant_for(q, "e", &bits, &group, &quant);
    CHECK(rc == 0 && quant && bits == 6 && group == 32, "true -> default");
    rc = hf_quant_for(q, "g", &bits, &group, &quant);
    CHECK(rc == FLOE_E_UNSUPPORTED && bits == 7, "7-bit affine unsupported");
    rc = hf_quant_for(q, "h", &bits, &group, &quant);
    CHECK(rc == FLOE_E_UNSUPPORTED && group == 16, "group 16 affine unsupported");
    rc = hf_quant_for(q, "zzz", &bits, &group, &quant);
    CHECK(rc == 0 && quant && bits == 6 && group == 32, "default 6-bit");
    hf_config_free(&c);
  }
  r = parse("{\"model_type\":\"qwen3_next\",\"quantization\":{\"mode\":\"nvfp4\"}}", &c);
  CHECK(r == 0 && c.quant.mode == HF_QMODE_NVFP4 && c.quant.group_size == 16 && c.quant.bits == 4, "nvfp4 defaults");
  rc = hf_quant_for(&c.quant, "x", &bits, &group, &quant);
  CHECK(rc == FLOE_E_UNSUPPORTED && quant && bits == 4 && group == 16, "nvfp4 lookup unsupported");
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_next\",\"quantization\":{\"mode\":\"mxfp8\"}}", &c);
  CHECK(r == 0 && c.quant.mode == HF_QMODE_MXFP8 && c.quant.group_size == 32 && c.quant.bits == 8, "mxfp8 defaults");
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_next\"}", &c);
  rc = hf_quant_for(&c.quant, "x", &bits, &group, &quant);
  CHECK(r == 0 && rc == 0 && !quant && bits == 0, "no quantization block: not quantized");
  hf_config_free(&c);
  CHECK(!strcmp(hf_qmode_name(HF_QMODE_MXFP4), "mxfp4") && !strcmp(hf_qmode_name(9), "?"), "mode names");
}

static void test_defaults(void) {
  SECTION("absent fields take the HF class defaults");
  hf_config c;
  int r = parse("{\"model_type\":\"qwen3_next\"}", &c);
  const floe_hparams *h = &c.hp;
  CHECK(r == 0 && h->n_vocab == 151936 && h->n_embd == 2048 && h->n_layer == 48 && h->n_ctx_train == 32768 &&
            h->n_head == 16 && h->n_head_kv == 2 && h->head_dim == 256 && h->n_rot == 64 && h->rope_theta == 10000.0f &&
            h->n_expert == 512 && h->n_expert_used == 10 && h->n_ff_shexp == 512 && h->norm_topk &&
            h->full_attn_interval == 4 && pattern4(h) && h->n_mtp == 1 && h->ssm_d_inner == 4096 && c.n_eos == 0,
        "qwen3_next defaults: %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_moe\"}", &c);
  CHECK(r == 0 && h->n_layer == 24 && h->n_head == 32 && h->head_dim == 64 && h->n_rot == 64 && !h->norm_topk &&
            h->n_expert == 128 && h->n_expert_used == 8 && h->n_ff_exp == 768 && h->n_ff_shexp == 0 && !h->attn_gate &&
            h->n_mtp == 0,
        "qwen3_moe defaults (head_dim = hidden/heads, norm_topk_prob false): %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_5_moe\"}", &c);
  CHECK(r == 0 && h->arch == FLOE_ARCH_QWEN35MOE && h->n_vocab == 248320 && h->n_layer == 40 && h->n_expert == 256 &&
            h->n_expert_used == 8 && h->n_mtp == 0 && h->norm_topk && pattern4(h),
        "qwen3_5_moe without text_config: text defaults: %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":1024,\"norm_topk_prob\":false,\"mtp_num_hidden_layers\":2,"
            "\"eos_token_id\":[5,6],\"bos_token_id\":4}",
            &c);
  CHECK(r == 0 && h->arch == FLOE_ARCH_QWEN35MOE && h->n_embd == 1024 && h->norm_topk && h->n_mtp == 2 &&
            c.n_eos == 2 && c.eos_token_id[0] == 5 && c.eos_token_id[1] == 6 && c.bos_token_id == 4,
        "qwen3_5_moe_text top level; norm_topk always on: %s", err);
  hf_config_free(&c);

  SECTION("layer pattern, rope and MTP spellings");
  r = parse("{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":4,\"layer_types\":[\"mamba\",\"attention\",\"mamba\","
            "\"attention\"],\"num_nextn_predict_layers\":2,\"rope_parameters\":{\"full_attention\":{\"rope_theta\":500000,"
            "\"partial_rotary_factor\":0.5}}}",
            &c);
  CHECK(r == 0 && h->recurrent[0] && !h->recurrent[1] && h->recurrent[2] && !h->recurrent[3] &&
            h->full_attn_interval == 2 && h->n_mtp == 2 && h->rope_theta == 500000.0f && h->n_rot == 128,
        "legacy names, interval found = 2, per-layer-type rope_parameters: %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":3,\"layer_types\":[\"full_attention\","
            "\"linear_attention\",\"linear_attention\"]}",
            &c);
  CHECK(r == 0 && !h->recurrent[0] && h->recurrent[1] && h->recurrent[2] && h->full_attn_interval == 0,
        "irregular pattern: interval 0: %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":6,\"full_attention_interval\":3}", &c);
  CHECK(r == 0 && h->recurrent[0] && h->recurrent[1] && !h->recurrent[2] && !h->recurrent[5] && h->full_attn_interval == 3,
        "interval 3: %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_next\",\"full_attention_interval\":1,\"num_hidden_layers\":2}", &c);
  CHECK(r == 0 && !h->recurrent[0] && !h->recurrent[1] && h->full_attn_interval == 1, "interval 1: all full: %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_moe\",\"rope_scaling\":{\"rope_type\":\"default\",\"rope_theta\":123.0},"
            "\"mlp_only_layers\":[99],\"sliding_window\":null,\"tie_word_embeddings\":true}",
            &c);
  CHECK(r == 0 && h->rope_theta == 123.0f && h->tied_embeddings, "rope_scaling theta, out-of-range mlp_only ignored: %s",
        err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_5_moe\",\"tie_word_embeddings\":true,\"text_config\":{\"num_hidden_layers\":8}}", &c);
  CHECK(r == 0 && h->tied_embeddings && h->n_layer == 8, "top-level tie_word_embeddings used when text_config lacks it");
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_5_moe\",\"tie_word_embeddings\":true,\"text_config\":{\"tie_word_embeddings\":false}}",
            &c);
  CHECK(r == 0 && !h->tied_embeddings, "text_config's tie_word_embeddings wins");
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_moe\",\"num_local_experts\":64}", &c);
  CHECK(r == 0 && h->n_expert == 64, "num_local_experts (transformers 5 spelling): %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_moe\",\"num_local_experts\":64,\"num_experts\":32}", &c);
  CHECK(r == 0 && h->n_expert == 32, "num_experts wins over num_local_experts: %s", err);
  hf_config_free(&c);
  r = parse("{\"model_type\":\"qwen3_moe\",\"partial_rotary_factor\":0.5,\"head_dim\":128}", &c);
  CHECK(r == 0 && h->n_rot == 64, "qwen3_moe partial_rotary_factor honoured");
  hf_config_free(&c);

  SECTION("hf_config_load on a directory");
  const char *dir = test_tmp("hfcfg_dir");
  mkdir(dir, 0755);
  char p[4200];
  snprintf(p, sizeof p, "%s/config.json", dir);
  FILE *f = fopen(p, "wb");
  fputs("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":3}", f);
  fclose(f);
  r = hf_config_load(dir, &c, err, sizeof err);
  CHECK(r == 0 && h->n_layer == 3, "dir load: %s", err);
  hf_config_free(&c);
  r = hf_config_load(test_tmp("hfcfg_nonexistent"), &c, err, sizeof err);
  CHECK(r == FLOE_E_NOTFOUND && strstr(err, "config.json: cannot open"), "missing dir: %s", err);
}

static void test_malformed(void) {
  SECTION("malformed and unsupported configs");
  expect_fail("{\"model_type\":\"llama\",\"hidden_size\":4096}", FLOE_E_UNSUPPORTED,
              "config.json: unsupported model_type 'llama' (floe runs qwen3_moe, qwen3_next, qwen3_5_moe)");
  expect_fail("{\"model_type\":\"qwen3_5\"}", FLOE_E_UNSUPPORTED, "unsupported model_type 'qwen3_5'");
  expect_fail("{\"hidden_size\":4096}", FLOE_E_FORMAT, "no \"model_type\" string");
  expect_fail("{\"model_type\":7}", FLOE_E_FORMAT, "no \"model_type\" string");
  expect_fail("{\"model_type\":\"qwen3_moe\"", FLOE_E_FORMAT, "JSON parse error");
  expect_fail("[1]", FLOE_E_FORMAT, "not a JSON object");
  expect_fail("", FLOE_E_FORMAT, "JSON parse error");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"hidden_size\":-5}", FLOE_E_INVALID, "hidden_size is -5, must be in [1,");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"hidden_size\":0}", FLOE_E_INVALID, "hidden_size is 0");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"hidden_size\":\"2048\"}", FLOE_E_FORMAT, "hidden_size is not an integer");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"hidden_size\":2048.5}", FLOE_E_FORMAT, "hidden_size is not an integer");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"hidden_size\":1e300}", FLOE_E_FORMAT, "hidden_size is not an integer");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"vocab_size\":0}", FLOE_E_INVALID, "vocab_size is 0");
  expect_fail("{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":300}", FLOE_E_INVALID,
              "num_hidden_layers is 300, must be in [1, 256]");
  expect_fail("{\"model_type\":\"qwen3_next\",\"num_attention_heads\":16,\"num_key_value_heads\":3}", FLOE_E_INVALID,
              "num_attention_heads 16 is not a multiple of num_key_value_heads 3");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"num_key_value_heads\":0}", FLOE_E_INVALID, "num_key_value_heads is 0");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"num_experts\":8,\"num_experts_per_tok\":10}", FLOE_E_INVALID,
              "num_experts_per_tok 10 exceeds num_experts 8");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"num_experts\":0}", FLOE_E_INVALID, "num_experts is 0");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":-1}", FLOE_E_INVALID, "moe_intermediate_size is -1");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"decoder_sparse_step\":2}", FLOE_E_UNSUPPORTED,
              "layer 0 is a dense MLP layer (decoder_sparse_step 2)");
  expect_fail("{\"model_type\":\"qwen3_next\",\"decoder_sparse_step\":0}", FLOE_E_INVALID, "decoder_sparse_step is 0");
  expect_fail("{\"model_type\":\"qwen3_next\",\"mlp_only_layers\":[3]}", FLOE_E_UNSUPPORTED,
              "layer 3 is a dense MLP layer (mlp_only_layers)");
  expect_fail("{\"model_type\":\"qwen3_next\",\"mlp_only_layers\":[\"3\"]}", FLOE_E_FORMAT, "mlp_only_layers holds");
  expect_fail("{\"model_type\":\"qwen3_next\",\"mlp_only_layers\":3}", FLOE_E_FORMAT, "mlp_only_layers is not a list");
  expect_fail("{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":3,\"layer_types\":[\"full_attention\"]}",
              FLOE_E_INVALID, "layer_types must be a list of num_hidden_layers (3) strings");
  expect_fail("{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":2,\"layer_types\":[\"full_attention\","
              "\"sliding_attention\"]}",
              FLOE_E_UNSUPPORTED, "layer_types[1] is 'sliding_attention'");
  expect_fail("{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":2,\"layer_types\":[1,2]}", FLOE_E_UNSUPPORTED,
              "layer_types[0] is '(not a string)'");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":2,\"layer_types\":[\"full_attention\","
              "\"linear_attention\"]}",
              FLOE_E_UNSUPPORTED, "qwen3_moe layers are all full_attention");
  expect_fail("{\"model_type\":\"qwen3_next\",\"full_attention_interval\":0}", FLOE_E_INVALID,
              "full_attention_interval is 0");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}",
              FLOE_E_UNSUPPORTED, "rope type 'yarn' is not supported");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"rope_parameters\":{\"type\":\"linear\"}}", FLOE_E_UNSUPPORTED,
              "rope type 'linear'");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"rope_theta\":0}", FLOE_E_INVALID, "rope_theta is 0, must be in (0,");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"rope_theta\":\"1e6\"}", FLOE_E_FORMAT, "rope_theta is not a number");
  expect_fail("{\"model_type\":\"qwen3_next\",\"partial_rotary_factor\":0.3}", FLOE_E_INVALID,
              "head_dim 256 * partial_rotary_factor 0.3 = 76.8 rotary dims");
  expect_fail("{\"model_type\":\"qwen3_next\",\"partial_rotary_factor\":1.5}", FLOE_E_INVALID,
              "partial_rotary_factor is 1.5");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"rms_norm_eps\":-1}", FLOE_E_INVALID, "rms_norm_eps is -1");
  expect_fail("{\"model_type\":\"qwen3_next\",\"linear_num_value_heads\":24}", FLOE_E_INVALID,
              "linear_num_value_heads 24 is not a multiple of linear_num_key_heads 16");
  expect_fail("{\"model_type\":\"qwen3_next\",\"linear_conv_kernel_dim\":0}", FLOE_E_INVALID,
              "linear_conv_kernel_dim is 0");
  expect_fail("{\"model_type\":\"qwen3_next\",\"shared_expert_intermediate_size\":0}", FLOE_E_INVALID,
              "shared_expert_intermediate_size is 0");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"use_sliding_window\":true}", FLOE_E_UNSUPPORTED, "use_sliding_window");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"norm_topk_prob\":1}", FLOE_E_FORMAT, "norm_topk_prob is not true/false");
  expect_fail("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"tie_word_embeddings\":\"no\"}}", FLOE_E_FORMAT,
              "text_config.tie_word_embeddings is not true/false");
  expect_fail("{\"model_type\":\"qwen3_5_moe\",\"text_config\":[1]}", FLOE_E_FORMAT, "text_config is not an object");
  expect_fail("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"model_type\":\"qwen3_5_text\"}}", FLOE_E_UNSUPPORTED,
              "text_config.model_type is 'qwen3_5_text'");
  expect_fail("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"num_hidden_layers\":0}}", FLOE_E_INVALID,
              "text_config.num_hidden_layers is 0");
  expect_fail("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"mtp_num_hidden_layers\":-1}}", FLOE_E_INVALID,
              "mtp_num_hidden_layers is -1");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"eos_token_id\":151936}", FLOE_E_INVALID,
              "eos_token_id must be up to 8 token ids below vocab_size 151936");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", FLOE_E_INVALID, "eos_token_id");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"bos_token_id\":-1}", FLOE_E_INVALID, "bos_token_id is not a token id");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}}",
              FLOE_E_UNSUPPORTED, "quant_method 'fp8' is not supported");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"quantization\":{\"bits\":9}}", FLOE_E_INVALID,
              "quantization.bits is 9, must be in [1, 8]");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"quantization\":{\"group_size\":0}}", FLOE_E_INVALID,
              "quantization.group_size is 0");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"quantization\":{\"mode\":\"int3\"}}", FLOE_E_UNSUPPORTED,
              "unknown quantization mode 'int3'");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"quantization\":{\"m.x\":{\"bits\":\"8\"}}}", FLOE_E_FORMAT,
              "quantization['m.x'].bits is not an integer");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"quantization\":{\"m\":{\"bits\":8},\"m\":false}}", FLOE_E_FORMAT,
              "quantization lists module 'm' twice");
  expect_fail("{\"model_type\":\"qwen3_moe\",\"quantization\":[]}", FLOE_E_FORMAT, "quantization is not an object");
}

int main(void) {
  test_qwen3_30b();
  test_qwen3_next();
  test_qwen35();
  test_mlx();
  test_defaults();
  test_malformed();
  return TEST_DONE();
}
