/* floe convert: an HF safetensors directory (qwen3_moe, qwen3_next, qwen3_5_moe[_text]) or an MLX
 * quantized directory -> one GGUF file with llama.cpp's tensor names, shapes and metadata
 * (conversion/qwen.py + convert_hf_to_gguf.py), quantized as asked, tokenizer included.
 *
 * What is written (model/model_meta.h gives the list; see convert.c for every transform):
 *   - zero-centred RMSNorm weights of the hybrids get +1 (float32: (float)w + 1.0f), except
 *     linear_attn.norm; MLX directories already hold 1+w (mlx-lm sanitize) and are not touched;
 *   - ssm_a = -expf(A_log); ssm_dt.bias = dt_bias; ssm_conv1d {K, C} from [C,1,K] (HF) or [C,K,1] (MLX);
 *   - Qwen3-Next in_proj_qkvz (grouped per key head) is split into attn_qkv (q|k|v) + attn_gate (z);
 *     in_proj_ba is kept grouped as ssm_ba (as llama.cpp's Qwen3NextModel does);
 *   - Qwen3.5: V heads reordered grouped -> tiled (_LinearAttentionVReorderBase) in attn_qkv's V
 *     rows, attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt.bias, ssm_conv1d's V channels, and
 *     ssm_out's columns; prefixes model.language_model.* / language_model.model.* accepted,
 *     model.visual.* ignored;
 *   - experts: HF per-expert tensors, transformers-5 fused gate_up_proj/down_proj, or MLX
 *     switch_mlp stacks -> ffn_{gate,up,down}_exps {n_in, n_out, n_expert};
 *   - MTP (mtp.*) -> blk.{n_layer}.* + nextn.{eh_proj,enorm,hnorm,shared_head_norm}, when the
 *     directory has the weights (HF drops them; when absent nextn_predict_layers is not written).
 *
 * Types: vectors, norms, the router (ffn_gate_inp) and ssm_conv1d are always F32 (llama.cpp).
 * type applies to the other 2-D weights, expert_type to the routed expert stacks and the shared
 * expert's matrices. Defaults (-1): keep each tensor's source float type (F32, F16 or BF16); for
 * MLX-quantized tensors Q8_0. A row length the chosen block type does not divide falls back as
 * llama-quantize does (q2_K/q3_K/iq4_xs -> iq4_nl, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0),
 * and to F16 when that does not divide either (or for q8_0/q4_0/... directly, as the Python
 * converter's QuantError fallback does).
 *
 * Streaming: tensors are produced in chunks of rows (never the whole model in memory), each chunk
 * read, transformed and quantized on n_threads pool threads, and streamed to the GGUF writer,
 * which writes "<out>.tmp.<pid>" and renames it when complete. Everything is validated (config,
 * every source tensor, shapes, types) before the output file is created. */
#ifndef FLOE_CONVERT_H
#define FLOE_CONVERT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Progress of a long operation: done and total in bytes written (called from the calling thread). */
typedef void (*convert_progress_fn)(void *user, uint64_t done, uint64_t total);

typedef struct convert_opts {
  const char *in_dir;     /* model directory (config.json + *.safetensors) */
  const char *out_path;   /* .gguf to write */
  int type;               /* FLOE_TYPE_* for 2-D non-expert weights, -1 = default (see above) */
  int expert_type;        /* FLOE_TYPE_* for routed + shared experts, -1 = same as type */
  int n_threads;          /* >= 1 */
  const char *name;       /* general.name; NULL = the directory's base name */
  bool verbose;           /* one line per tensor on stderr */
  convert_progress_fn progress; /* may be NULL */
  void *progress_user;
} convert_opts;

typedef struct convert_stats {
  uint64_t n_tensors, bytes;   /* written */
  int64_t n_mtp;               /* MTP blocks written */
  bool mlx;                    /* source was an MLX directory */
  bool tokenizer;              /* tokenizer.json found and written */
  int n_fallback;              /* tensors stored in a fallback type */
} convert_stats;

/* True for the types convert can write (f32, f16, bf16 and every type with a quantizer). */
bool convert_type_ok(int type);

/* llama-quantize's fallback when the block of `type` does not divide a row of ne0 elements. */
uint32_t convert_fallback_type(uint32_t type, int64_t ne0);
/* general.file_type (llama.cpp's llama_ftype) of a model mostly of type t; 0 when it has none. */
uint32_t convert_file_type(uint32_t t);

/* Runs the conversion. stats may be NULL. Returns 0 or a negative FLOE_E_* with a one-line err. */
int convert_model(const convert_opts *o, convert_stats *stats, char *err, size_t errlen);

/* floe quantize: GGUF -> GGUF like llama-quantize. Every key is copied (general.file_type set for
 * `type`; a qwen35moe rope.dimension_sections that is not a valid split replaced by the canonical
 * one). Tensors that llama.cpp keeps F32 (vectors, norms, router, conv1d) and tensors floe does
 * not know are copied byte for byte; routed and shared experts take expert_type, output.weight
 * output_type, every other matrix type. A tensor already in its target type is copied byte for
 * byte; others are dequantized exactly and requantized (row-length fallback as convert). A source
 * tensor quantized to fewer bits per weight than its target is refused unless force: requantizing
 * cannot restore what was lost, and the result would only look precise. The output is written to
 * "<out>.tmp.<pid>" and renamed when complete. */
typedef struct quantize_opts {
  const char *in_path, *out_path;
  int type;        /* FLOE_TYPE_* (convert_type_ok) for the non-expert matrices */
  int expert_type; /* routed + shared experts; -1 = type */
  int output_type; /* output.weight; -1 = type */
  bool force;      /* allow a lower-precision source */
  int n_threads;   /* >= 1 */
  bool verbose;    /* one line per tensor on stderr */
  convert_progress_fn progress;
  void *progress_user;
} quantize_opts;

typedef struct quantize_stats {
  uint64_t n_tensors, n_copied, n_requantized, n_fallback;
  uint64_t bytes_in, bytes_out; /* tensor data */
} quantize_stats;

int quantize_model(const quantize_opts *o, quantize_stats *stats, char *err, size_t errlen);

/* Test-fixture generator: reads an HF directory (qwen3_next or qwen3_5_moe[_text]) and writes
 * out_dir/{config.json, model.safetensors} as mlx-lm would convert it with -q --q-bits 4
 * --q-group-size 64: sanitize (experts stacked into switch_mlp, conv1d to [C,K,1], +1 folded into
 * the zero-centred norms, mtp.* dropped, Qwen3.5 keys under language_model.), every Linear /
 * Embedding whose input size the group divides quantized with MLX affine (bits 4, group 64;
 * mlp.gate and mlp.shared_expert_gate 8 bits), scales/biases in the source dtype, and the
 * quantization block in config.json. out_dir must exist. */
int convert_make_mlx_fixture(const char *hf_dir, const char *out_dir, char *err, size_t errlen);
#endif
