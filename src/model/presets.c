/* Architecture presets: the real hyper-parameters of released Qwen MoE models (for `floe synth`
 * models with real shapes) and tiny models for tests.
 *
 * Real values: /work/shared/reference/qwen-models.md §1 (HF configs), cross-checked with
 * llama.cpp's load_arch_hparams layer-count table (qwen35moe: 40 -> 35B-A3B, 60 -> 397B-A17B;
 * qwen3next: 48 -> 80B-A3B; qwen3moe: 48 -> 30B-A3B, 94 -> 235B-A22B). The 397B shared-expert
 * width (1024) comes from a third-party config only (see the reference note).
 *
 * Tiny presets: every dimension that is a row length (ne0) of a quantizable tensor is a multiple
 * of 256 (n_embd, n_head*head_dim, GDN value dim, n_ff_exp, n_ff_shexp), so every block type,
 * K-quants and IQ types included, can be used for all tensors. Trunk of 4 layers in the pattern
 * L,L,L,F (interval 4: 3 GatedDeltaNet + 1 full attention) plus one MTP block for the hybrids. */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "model/model_meta.h"

typedef struct preset {
  const char *name;
  floe_hparams hp;
} preset;

#define QWEN35_SECTIONS {11, 11, 10, 0}

static const preset presets[] = {
    {"qwen35moe-35b-a3b",
     {.arch = FLOE_ARCH_QWEN35MOE, .n_vocab = 248320, .n_embd = 2048, .n_layer = 40, .n_mtp = 1,
      .n_ctx_train = 262144, .n_head = 16, .n_head_kv = 2, .head_dim = 256, .n_rot = 64,
      .rope_sections = QWEN35_SECTIONS, .rope_theta = 1e7f, .rms_eps = 1e-6f, .attn_gate = true,
      .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 512, .n_ff_shexp = 512, .n_ff = 0, .norm_topk = true,
      .full_attn_interval = 4, .ssm_conv_kernel = 4, .ssm_d_state = 128, .ssm_n_group = 16,
      .ssm_dt_rank = 32, .ssm_d_inner = 4096}},
    {"qwen35moe-397b-a17b",
     {.arch = FLOE_ARCH_QWEN35MOE, .n_vocab = 248320, .n_embd = 4096, .n_layer = 60, .n_mtp = 1,
      .n_ctx_train = 262144, .n_head = 32, .n_head_kv = 2, .head_dim = 256, .n_rot = 64,
      .rope_sections = QWEN35_SECTIONS, .rope_theta = 1e7f, .rms_eps = 1e-6f, .attn_gate = true,
      .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 1024, .n_ff_shexp = 1024, .n_ff = 0, .norm_topk = true,
      .full_attn_interval = 4, .ssm_conv_kernel = 4, .ssm_d_state = 128, .ssm_n_group = 16,
      .ssm_dt_rank = 64, .ssm_d_inner = 8192}},
    {"qwen3next-80b-a3b",
     {.arch = FLOE_ARCH_QWEN3NEXT, .n_vocab = 151936, .n_embd = 2048, .n_layer = 48, .n_mtp = 1,
      .n_ctx_train = 262144, .n_head = 16, .n_head_kv = 2, .head_dim = 256, .n_rot = 64,
      .rope_theta = 1e7f, .rms_eps = 1e-6f, .attn_gate = true,
      .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 512, .n_ff_shexp = 512, .n_ff = 5120, .norm_topk = true,
      .full_attn_interval = 4, .ssm_conv_kernel = 4, .ssm_d_state = 128, .ssm_n_group = 16,
      .ssm_dt_rank = 32, .ssm_d_inner = 4096}},
    {"qwen3moe-30b-a3b",
     {.arch = FLOE_ARCH_QWEN3MOE, .n_vocab = 151936, .n_embd = 2048, .n_layer = 48, .n_mtp = 0,
      .n_ctx_train = 40960, .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_rot = 128,
      .rope_theta = 1e6f, .rms_eps = 1e-6f, .attn_gate = false,
      .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768, .n_ff_shexp = 0, .n_ff = 6144, .norm_topk = true}},
    {"qwen3moe-235b-a22b",
     {.arch = FLOE_ARCH_QWEN3MOE, .n_vocab = 151936, .n_embd = 4096, .n_layer = 94, .n_mtp = 0,
      .n_ctx_train = 40960, .n_head = 64, .n_head_kv = 4, .head_dim = 128, .n_rot = 128,
      .rope_theta = 1e6f, .rms_eps = 1e-6f, .attn_gate = false,
      .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 1536, .n_ff_shexp = 0, .n_ff = 12288, .norm_topk = true}},
    {"tiny-qwen35moe",
     {.arch = FLOE_ARCH_QWEN35MOE, .n_vocab = 1024, .n_embd = 256, .n_layer = 4, .n_mtp = 1,
      .n_ctx_train = 4096, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_rot = 16,
      .rope_sections = QWEN35_SECTIONS, .rope_theta = 1e7f, .rms_eps = 1e-6f, .attn_gate = true,
      .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_ff_shexp = 256, .n_ff = 0, .norm_topk = true,
      .full_attn_interval = 4, .ssm_conv_kernel = 4, .ssm_d_state = 64, .ssm_n_group = 2,
      .ssm_dt_rank = 4, .ssm_d_inner = 256}},
    {"tiny-qwen3next",
     {.arch = FLOE_ARCH_QWEN3NEXT, .n_vocab = 1024, .n_embd = 256, .n_layer = 4, .n_mtp = 1,
      .n_ctx_train = 4096, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_rot = 16,
      .rope_theta = 1e7f, .rms_eps = 1e-6f, .attn_gate = true,
      .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_ff_shexp = 256, .n_ff = 512, .norm_topk = true,
      .full_attn_interval = 4, .ssm_conv_kernel = 4, .ssm_d_state = 64, .ssm_n_group = 2,
      .ssm_dt_rank = 4, .ssm_d_inner = 256}},
    {"tiny-qwen3moe",
     {.arch = FLOE_ARCH_QWEN3MOE, .n_vocab = 1024, .n_embd = 256, .n_layer = 4, .n_mtp = 0,
      .n_ctx_train = 4096, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_rot = 64,
      .rope_theta = 1e6f, .rms_eps = 1e-6f, .attn_gate = false,
      .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_ff_shexp = 0, .n_ff = 512, .norm_topk = true}},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

static const char *const preset_names[] = {
    "qwen35moe-35b-a3b", "qwen35moe-397b-a17b", "qwen3next-80b-a3b", "qwen3moe-30b-a3b",
    "qwen3moe-235b-a22b", "tiny-qwen35moe", "tiny-qwen3next", "tiny-qwen3moe", NULL,
};

const char *const *model_preset_names(void) { return preset_names; }

void model_hparams_set_pattern(floe_hparams *hp) {
  memset(hp->recurrent, 0, sizeof hp->recurrent);
  if (hp->full_attn_interval <= 0) return;
  for (int64_t i = 0; i < hp->n_layer && i < FLOE_MAX_LAYERS; i++)
    hp->recurrent[i] = (i + 1) % hp->full_attn_interval != 0;
}

int model_preset(const char *name, floe_hparams *hp, char *err, size_t errlen) {
  _Static_assert(N_PRESETS + 1 == sizeof preset_names / sizeof preset_names[0], "preset name list");
  for (size_t i = 0; i < N_PRESETS; i++) {
    if (strcmp(presets[i].name, name)) continue;
    FLOE_ASSERT(!strcmp(preset_names[i], name));
    *hp = presets[i].hp;
    model_hparams_set_pattern(hp);
    return 0;
  }
  char list[512];
  size_t off = 0;
  list[0] = 0;
  for (size_t i = 0; i < N_PRESETS && off < sizeof list; i++)
    off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "", presets[i].name);
  return floe_err(err, errlen, FLOE_E_NOTFOUND, "unknown preset '%s' (presets: %s)", name, list);
}

int model_hparams_truncate(floe_hparams *hp, int64_t n_layer, char *err, size_t errlen) {
  if (n_layer < 1 || n_layer > hp->n_layer)
    return floe_err(err, errlen, FLOE_E_INVALID, "layer count %lld out of range 1..%lld", (long long)n_layer,
                    (long long)hp->n_layer);
  hp->n_layer = n_layer;
  /* The pattern is a function of the index only, so the first n layers keep theirs; recompute
   * to clear the flags of the dropped layers. */
  if (hp->full_attn_interval > 0) model_hparams_set_pattern(hp);
  else memset(hp->recurrent, 0, sizeof hp->recurrent);
  return 0;
}

int model_hparams_validate(const floe_hparams *hp, char *err, size_t errlen) {
  const char *an = floe_arch_name(hp->arch);
  if (hp->arch == FLOE_ARCH_UNKNOWN || !strcmp(an, "unknown"))
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "unknown architecture %d", hp->arch);
#define NEED(cond, ...) \
  do { if (!(cond)) return floe_err(err, errlen, FLOE_E_FORMAT, __VA_ARGS__); } while (0)
  /* Bounds keep every product below 2^63 and every dimension representable in a GGUF tensor. */
  const int64_t big = (int64_t)1 << 24;
  NEED(hp->n_vocab >= 1 && hp->n_vocab <= ((int64_t)1 << 26), "%s: vocab size %lld out of range", an, (long long)hp->n_vocab);
  NEED(hp->n_embd >= 1 && hp->n_embd <= big, "%s: embedding_length %lld out of range", an, (long long)hp->n_embd);
  NEED(hp->n_layer >= 1, "%s: no trunk layers (block_count %lld, nextn %lld)", an,
       (long long)(hp->n_layer + hp->n_mtp), (long long)hp->n_mtp);
  NEED(hp->n_mtp >= 0 && hp->n_mtp <= 8, "%s: nextn_predict_layers %lld out of range", an, (long long)hp->n_mtp);
  NEED(hp->n_layer + hp->n_mtp <= FLOE_MAX_LAYERS, "%s: block_count %lld exceeds FLOE_MAX_LAYERS (%d)", an,
       (long long)(hp->n_layer + hp->n_mtp), FLOE_MAX_LAYERS);
  NEED(hp->n_ctx_train >= 1, "%s: context_length %lld must be positive", an, (long long)hp->n_ctx_train);
  NEED(hp->n_head >= 1 && hp->n_head <= 4096, "%s: head_count %lld out of range", an, (long long)hp->n_head);
  NEED(hp->n_head_kv >= 1 && hp->n_head_kv <= hp->n_head, "%s: head_count_kv %lld out of range 1..%lld", an,
       (long long)hp->n_head_kv, (long long)hp->n_head);
  NEED(hp->n_head % hp->n_head_kv == 0, "%s: head_count %lld not a multiple of head_count_kv %lld", an,
       (long long)hp->n_head, (long long)hp->n_head_kv);
  NEED(hp->head_dim >= 2 && hp->head_dim <= 4096 && hp->head_dim % 2 == 0, "%s: key_length %lld out of range", an,
       (long long)hp->head_dim);
  NEED(hp->n_rot >= 2 && hp->n_rot <= hp->head_dim && hp->n_rot % 2 == 0,
       "%s: rope.dimension_count %lld must be even and <= key_length %lld", an, (long long)hp->n_rot,
       (long long)hp->head_dim);
  NEED(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f, "%s: layer_norm_rms_epsilon %g out of range", an, (double)hp->rms_eps);
  NEED(hp->rope_theta > 0.0f, "%s: rope.freq_base %g must be positive", an, (double)hp->rope_theta);
  NEED(hp->n_expert >= 1 && hp->n_expert <= 4096, "%s: expert_count %lld out of range", an, (long long)hp->n_expert);
  NEED(hp->n_expert_used >= 1 && hp->n_expert_used <= hp->n_expert, "%s: expert_used_count %lld out of range 1..%lld",
       an, (long long)hp->n_expert_used, (long long)hp->n_expert);
  NEED(hp->n_ff_exp >= 1 && hp->n_ff_exp <= big, "%s: expert_feed_forward_length %lld out of range", an,
       (long long)hp->n_ff_exp);
  NEED(hp->n_ff_shexp >= 0 && hp->n_ff_shexp <= big, "%s: expert_shared_feed_forward_length %lld out of range", an,
       (long long)hp->n_ff_shexp);
  NEED(hp->n_ff >= 0 && hp->n_ff <= big, "%s: feed_forward_length %lld out of range", an, (long long)hp->n_ff);
  NEED((int64_t)hp->n_head * hp->head_dim * 2 <= big, "%s: attention width too large", an);
  if (hp->arch == FLOE_ARCH_QWEN3MOE) {
    NEED(hp->n_mtp == 0, "%s: MTP blocks are not supported for qwen3moe", an);
    NEED(hp->n_ff_shexp == 0, "%s: qwen3moe has no shared expert", an);
    for (int64_t i = 0; i < hp->n_layer; i++) NEED(!hp->recurrent[i], "%s: layer %lld marked recurrent", an, (long long)i);
  } else {
    NEED(hp->attn_gate, "%s: gated attention expected", an);
    NEED(hp->n_ff_shexp >= 1, "%s: shared expert expected (expert_shared_feed_forward_length)", an);
    NEED(hp->ssm_conv_kernel >= 2 && hp->ssm_conv_kernel <= 16, "%s: ssm.conv_kernel %lld out of range", an,
         (long long)hp->ssm_conv_kernel);
    NEED(hp->ssm_d_state >= 1 && hp->ssm_d_state <= 4096, "%s: ssm.state_size %lld out of range", an,
         (long long)hp->ssm_d_state);
    NEED(hp->ssm_n_group >= 1 && hp->ssm_n_group <= 4096, "%s: ssm.group_count %lld out of range", an,
         (long long)hp->ssm_n_group);
    NEED(hp->ssm_dt_rank >= 1 && hp->ssm_dt_rank <= 4096, "%s: ssm.time_step_rank %lld out of range", an,
         (long long)hp->ssm_dt_rank);
    NEED(hp->ssm_dt_rank % hp->ssm_n_group == 0, "%s: ssm.time_step_rank %lld not a multiple of ssm.group_count %lld",
         an, (long long)hp->ssm_dt_rank, (long long)hp->ssm_n_group);
    NEED(hp->ssm_d_inner >= 1 && hp->ssm_d_inner <= big && hp->ssm_d_inner % hp->ssm_dt_rank == 0,
         "%s: ssm.inner_size %lld not a multiple of ssm.time_step_rank %lld", an, (long long)hp->ssm_d_inner,
         (long long)hp->ssm_dt_rank);
    NEED(hp->full_attn_interval >= 1, "%s: full_attention_interval %lld must be positive", an,
         (long long)hp->full_attn_interval);
  }
  for (int64_t i = hp->n_layer; i < FLOE_MAX_LAYERS; i++)
    NEED(!hp->recurrent[i], "%s: block %lld (MTP or beyond) marked recurrent", an, (long long)i);
#undef NEED
  return 0;
}
