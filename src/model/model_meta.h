/* Model metadata: architecture presets, the per-architecture tensor list (GGUF names and ggml
 * shapes exactly as llama.cpp's converter writes them), and hparams <-> GGUF metadata.
 *
 * Sources (read through the search tool): llama.cpp src/llama-arch.cpp (name table),
 * src/models/{qwen3moe,qwen3next,qwen35moe}.cpp (load_arch_tensors / load_arch_hparams),
 * conversion/qwen.py (Qwen3NextModel, _LinearAttentionVReorderBase, the MTP mixin), and
 * /work/shared/reference/{gguf-llamacpp,qwen-models}.md.
 *
 * Conventions:
 *   - ne[] is ggml order: ne[0] is the contiguous (input) dimension. A matrix W with
 *     y = W x, x of size n_in, y of size n_out, has ne = {n_in, n_out}. Expert stacks are
 *     {n_in, n_out, n_expert}: expert e is the contiguous slab e*ne0*ne1.
 *   - {arch}.block_count INCLUDES the MTP (nextn) blocks; floe_hparams.n_layer does not.
 *     The MTP block j has index n_layer + j: "blk.{n_layer+j}.nextn.eh_proj.weight" etc.
 *   - qwen3next / qwen35moe RMSNorm weights are stored with the "+1" folded in (converter,
 *     conversion/qwen.py: every "*norm.weight" except linear_attn.norm), so their neutral
 *     value is 1.0 like qwen3moe's; ssm_norm (linear_attn.norm) is stored as is (init 1.0).
 *   - ssm_a holds -exp(A_log); ssm_dt.bias holds dt_bias; ssm_conv1d is {kernel, channels}.
 *
 * Memory: model_tensor_list() returns a malloc'ed array the caller frees with free(). */
#ifndef FLOE_MODEL_META_H
#define FLOE_MODEL_META_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "floe.h"
#include "format/gguf.h"
#include "base/hparams.h"

/* ---- presets ---- */
/* Fills *hp with the named preset (real hyper-parameters of a released model, or a tiny test
 * model). Returns 0, or FLOE_E_NOTFOUND (then err lists the known names). */
int model_preset(const char *name, floe_hparams *hp, char *err, size_t errlen);
/* NULL-terminated list of preset names. */
const char *const *model_preset_names(void);
/* Sets the layer-type pattern (hp->recurrent) from full_attn_interval: layer i < n_layer is a
 * GatedDeltaNet layer iff (i+1) % interval != 0 (llama.cpp load_arch_hparams). No-op for
 * qwen3moe (interval 0). */
void model_hparams_set_pattern(floe_hparams *hp);
/* Cuts the trunk to n_layer layers (1 <= n <= hp->n_layer), keeping the hybrid pattern and
 * the MTP block(s). */
int model_hparams_truncate(floe_hparams *hp, int64_t n_layer, char *err, size_t errlen);
/* Structural checks shared by the GGUF reader and the presets: positive sizes, heads divide,
 * layer count <= FLOE_MAX_LAYERS, rope dims <= head_dim, GDN heads divide, ... */
int model_hparams_validate(const floe_hparams *hp, char *err, size_t errlen);

/* ---- tensor list ---- */
enum model_tensor_flags {
  MODEL_TF_VECTOR = 1u << 0,  /* 1-D (norm weights, biases, ssm_a, shared-expert gate): F32 */
  MODEL_TF_NORM = 1u << 1,    /* an RMSNorm weight (neutral value 1.0) */
  MODEL_TF_MATRIX = 1u << 2,  /* 2-D non-expert weight: takes the "--type" */
  MODEL_TF_EXPERTS = 1u << 3, /* 3-D routed expert stack {n_in, n_out, n_expert} */
  MODEL_TF_SHEXP = 1u << 4,   /* shared-expert matrix: takes the expert type like the stacks */
  MODEL_TF_F32 = 1u << 5,     /* always stored F32 by llama.cpp's converter (router, conv1d) */
  MODEL_TF_MTP = 1u << 6,     /* belongs to an MTP (nextn) block */
};

/* Which weight a tensor is (for initialisation and binding). */
enum model_tensor_kind {
  MODEL_K_TOKEN_EMBD, MODEL_K_OUTPUT_NORM, MODEL_K_OUTPUT,
  MODEL_K_ATTN_NORM, MODEL_K_FFN_NORM, /* ffn_norm (qwen3moe) or post_attention_norm */
  MODEL_K_ATTN_Q, MODEL_K_ATTN_K, MODEL_K_ATTN_V, MODEL_K_ATTN_OUT, MODEL_K_ATTN_Q_NORM, MODEL_K_ATTN_K_NORM,
  MODEL_K_SSM_QKV, MODEL_K_SSM_GATE, MODEL_K_SSM_BETA, MODEL_K_SSM_ALPHA, MODEL_K_SSM_BA,
  MODEL_K_SSM_CONV1D, MODEL_K_SSM_DT_BIAS, MODEL_K_SSM_A, MODEL_K_SSM_NORM, MODEL_K_SSM_OUT,
  MODEL_K_FFN_GATE_INP, MODEL_K_FFN_GATE_EXPS, MODEL_K_FFN_UP_EXPS, MODEL_K_FFN_DOWN_EXPS,
  MODEL_K_FFN_GATE_INP_SHEXP, MODEL_K_FFN_GATE_SHEXP, MODEL_K_FFN_UP_SHEXP, MODEL_K_FFN_DOWN_SHEXP,
  MODEL_K_NEXTN_EH_PROJ, MODEL_K_NEXTN_ENORM, MODEL_K_NEXTN_HNORM, MODEL_K_NEXTN_SHARED_HEAD_NORM,
  MODEL_K_COUNT,
};

#define MODEL_TENSOR_NAME_MAX 64

typedef struct model_tensor_desc {
  char name[MODEL_TENSOR_NAME_MAX]; /* GGUF name, e.g. "blk.3.attn_q.weight", "blk.0.ssm_a" */
  uint32_t n_dims;
  int64_t ne[4];  /* ggml order; unused dims are 1 */
  uint32_t flags; /* MODEL_TF_* */
  int32_t kind;   /* enum model_tensor_kind */
  int32_t layer;  /* block index (MTP blocks: n_layer + j), -1 for global tensors */
} model_tensor_desc;

/* All tensors of a model with these hparams, in the order floe writes them (token_embd,
 * blocks 0..n_layer-1, MTP blocks, output_norm, output). */
int model_tensor_list(const floe_hparams *hp, model_tensor_desc **out, size_t *n, char *err, size_t errlen);
/* Short name of a kind ("attn_q", "ffn_down_exps", ...). */
const char *model_tensor_kind_name(int kind);

/* ---- hparams <-> GGUF ---- */
/* Reads and validates the architecture keys (and n_vocab from {arch}.vocab_size, the token
 * list or token_embd; tied_embeddings from the absence of output.weight). */
int model_hparams_from_gguf(const gguf_file *g, floe_hparams *hp, char *err, size_t errlen);
/* Writes general.architecture and the {arch}.* keys (not general.name, not the tokenizer).
 * qwen35moe's rope.dimension_sections is hp->rope_sections when that is a valid split, else the
 * canonical split (older floe files carry [0,0,0,0], on which llama.cpp aborts). */
int model_hparams_to_gguf(gguf_writer *w, const floe_hparams *hp);

/* ---- qwen35moe rope sections ----
 * Qwen3.5 applies interleaved multimodal RoPE; for text the t/h/w positions are equal, so every
 * split gives the same result in HF. llama.cpp (ggml IMROPE) gives rotary pair i the angle of
 * section s = i % sum(sections): t when s%3==0 && s < 3*sec[0], h when s%3==1 && s < 3*sec[1],
 * w when s%3==2 && s < 3*sec[2], otherwise the 4th ("e") position, which is 0 for text. A split
 * is valid (text-equivalent in llama.cpp) when every rotary pair falls in t, h or w and
 * 0 < sum <= head_dim. */
bool model_rope_sections_valid(const int32_t sec[4], int64_t n_rot, int64_t head_dim);
/* The canonical interleaved split of n_rot/2 pairs: {ceil(P/3), ceil((P-1)/3), ceil((P-2)/3), 0}
 * ({11,11,10,0} for the released models' 32 pairs, the default llama.cpp's converter writes). */
void model_rope_sections_canonical(int64_t n_rot, int32_t sec[4]);
#endif
