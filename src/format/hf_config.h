/* HF / MLX config.json reader: fills floe_hparams for qwen3_moe, qwen3_next and qwen3_5_moe
 * (Qwen3_5MoeForConditionalGeneration with "text_config", or a top-level qwen3_5_moe_text), plus
 * the MLX quantization block and the token ids the config declares.
 *
 * Absent fields take the HF config class defaults (transformers Qwen3MoeConfig, Qwen3NextConfig,
 * Qwen3_5MoeTextConfig), so a config reads as transformers would read it. Where transformers 5
 * moved a field (rope_theta / partial_rotary_factor into rope_parameters, or rope_scaling in 4.x),
 * both places are read. Everything is validated: types, ranges, head counts dividing, top-k <= n
 * experts, n_layer <= FLOE_MAX_LAYERS, the layer pattern. Configs floe cannot run correctly are
 * rejected with FLOE_E_UNSUPPORTED rather than half-read: other model types, dense-MLP layers
 * (decoder_sparse_step / mlp_only_layers), sliding-window attention, RoPE scaling types other than
 * the default, non-MLX quantization_config (quant_method ...).
 *
 * Memory: hf_config owns the quantization override table; free it with hf_config_free(). */
#ifndef FLOE_HF_CONFIG_H
#define FLOE_HF_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/hparams.h"

enum hf_qmode { HF_QMODE_AFFINE = 0, HF_QMODE_MXFP4, HF_QMODE_NVFP4, HF_QMODE_MXFP8 };

typedef struct hf_quant_override {
  char *module;   /* module path exactly as in config.json, e.g. "model.layers.0.mlp.gate" */
  bool quantized; /* false: the module is stored unquantized (JSON value false) */
  int bits, group_size, mode; /* inherit the default where the object omits them */
} hf_quant_override;

typedef struct hf_quant {
  bool present;           /* config had "quantization" (or "quantization_config") */
  int mode;               /* enum hf_qmode; "affine" when absent */
  int bits, group_size;   /* defaults for every quantized module */
  size_t n_over;
  hf_quant_override *over; /* sorted by module (binary search) */
} hf_quant;

#define HF_MAX_EOS 8

typedef struct hf_config {
  floe_hparams hp;
  hf_quant quant;
  char model_type[32];           /* top-level model_type as written */
  int64_t bos_token_id;          /* -1 when absent */
  int64_t pad_token_id;          /* -1 when absent */
  int n_eos;                     /* eos_token_id: an int or a list */
  int64_t eos_token_id[HF_MAX_EOS];
} hf_config;

/* path: a model directory (reads <dir>/config.json) or a .json file. 0 or negative FLOE_E_*. */
int hf_config_load(const char *path, hf_config *out, char *err, size_t errlen);
/* The same from JSON text (need not be NUL-terminated); name is used in messages. */
int hf_config_parse(const char *json, size_t len, const char *name, hf_config *out, char *err, size_t errlen);
void hf_config_free(hf_config *c);

/* Quantization of one module (path without ".weight", e.g. "model.layers.3.mlp.switch_mlp.up_proj").
 * Returns 0 and sets *quantized (and *bits / *group when quantized) from the module's override or
 * the default; no quantization block means *quantized = false. Returns FLOE_E_UNSUPPORTED when
 * the module is quantized with a mode or width floe cannot compute (mxfp4, nvfp4, mxfp8; affine
 * bits outside {2,3,4,5,6,8} or group outside {32,64,128}); the out values are still filled. */
int hf_quant_for(const hf_quant *q, const char *module_path, int *bits, int *group, bool *quantized);
const char *hf_qmode_name(int mode); /* "affine", "mxfp4", ... */
#endif
