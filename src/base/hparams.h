/* Model hyper-parameters: one struct for the three architectures, filled from GGUF metadata
 * (model/gguf_meta.c), from HF/MLX config.json (format/hf_config.c) or from a synth preset
 * (model/presets.c). Names follow llama.cpp's GGUF keys; comments give the HF config name. */
#ifndef FLOE_HPARAMS_H
#define FLOE_HPARAMS_H
#include <stdbool.h>
#include <stdint.h>

enum floe_arch {
  FLOE_ARCH_UNKNOWN = 0,
  FLOE_ARCH_QWEN3MOE,  /* GGUF "qwen3moe",  HF qwen3_moe */
  FLOE_ARCH_QWEN3NEXT, /* GGUF "qwen3next", HF qwen3_next */
  FLOE_ARCH_QWEN35MOE, /* GGUF "qwen35moe", HF qwen3_5_moe / qwen3_5_moe_text */
};

#define FLOE_MAX_LAYERS 256

typedef struct floe_hparams {
  int arch;                 /* enum floe_arch */
  int64_t n_vocab;          /* vocab_size (embedding rows) */
  int64_t n_embd;           /* hidden_size */
  int64_t n_layer;          /* num_hidden_layers: trunk layers, WITHOUT the MTP block(s) */
  int64_t n_mtp;            /* nextn_predict_layers / mtp_num_hidden_layers (0 = none) */
  int64_t n_ctx_train;      /* max_position_embeddings */
  /* attention */
  int64_t n_head;           /* num_attention_heads */
  int64_t n_head_kv;        /* num_key_value_heads */
  int64_t head_dim;         /* head_dim (attention.key_length == value_length) */
  int64_t n_rot;            /* rotary dims: head_dim * partial_rotary_factor */
  int32_t rope_sections[4]; /* qwen35moe mrope_section ([11,11,10,0]); zeros elsewhere */
  float rope_theta;         /* rope_theta */
  float rms_eps;            /* rms_norm_eps */
  bool attn_gate;           /* gated attention output (qwen3next, qwen35moe) */
  /* MoE */
  int64_t n_expert;         /* num_experts */
  int64_t n_expert_used;    /* num_experts_per_tok */
  int64_t n_ff_exp;         /* moe_intermediate_size */
  int64_t n_ff_shexp;       /* shared_expert_intermediate_size, 0 = no shared expert */
  int64_t n_ff;             /* dense intermediate_size (feed_forward_length); 0 = absent (qwen35moe) */
  bool norm_topk;           /* renormalise top-k weights */
  /* hybrid (GatedDeltaNet) layers */
  int64_t full_attn_interval;        /* full_attention_interval (4); 0 for qwen3moe */
  bool recurrent[FLOE_MAX_LAYERS];   /* layer i is a GatedDeltaNet layer */
  int64_t ssm_conv_kernel;  /* linear_conv_kernel_dim (4) */
  int64_t ssm_d_state;      /* linear_key_head_dim (dk) */
  int64_t ssm_n_group;      /* linear_num_key_heads (Nk) */
  int64_t ssm_dt_rank;      /* linear_num_value_heads (Nv) */
  int64_t ssm_d_inner;      /* linear_value_head_dim * Nv */
  bool tied_embeddings;     /* tie_word_embeddings */
} floe_hparams;

const char *floe_arch_name(int arch);      /* GGUF spelling: "qwen3moe", ... */
int floe_arch_from_name(const char *name); /* GGUF spelling -> FLOE_ARCH_*, or FLOE_ARCH_UNKNOWN */
#endif
