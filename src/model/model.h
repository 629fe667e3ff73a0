/* Model: weights bound from a GGUF file or an HF safetensors directory, and sessions that run the
 * forward pass (CPU, exact float path) for qwen3moe, qwen3next and qwen35moe.
 *
 * Canonical internal layout (every source is converted to it at load time, see arch/<arch>.c):
 *   - Norm weights are float32 multipliers: y = (x * rsqrt(mean(x^2)+eps)) * w. The zero-centred
 *     norms of Qwen3-Next / Qwen3.5 (HF `1+w`) are stored as 1+w (what GGUF and MLX hold); the
 *     GDN output norm (linear_attn.norm, plain w) and Qwen3-MoE's norms are stored as is.
 *   - Matrices are floe_mat in the file's own bytes (row r = output r), never re-quantized; a
 *     matrix whose data is not aligned to its element size is copied once.
 *   - GatedDeltaNet: the projections are either separate (qkv | z | b | a, Qwen3.5 HF and llama.cpp
 *     GGUF) or grouped per key head (Qwen3-Next HF in_proj_qkvz / in_proj_ba), in which case the
 *     projected rows are unpacked into q | k | v and z, b, a after the matmul. ssm_a holds -exp(A_log).
 *   - Value-head order is llama.cpp's, per architecture: qwen3next "grouped" (value head hv uses key
 *     head hv / (Nv/Nk), as HF), qwen35moe "tiled" (hv uses key head hv % Nk: llama.cpp's converter,
 *     _LinearAttentionVReorderBase). Qwen3.5 HF/MLX checkpoints are grouped, so their V rows of
 *     in_proj_qkv, in_proj_z/b/a rows, the conv1d V channels, dt_bias, A_log and out_proj's columns
 *     are permuted into tiled order at load time (copies; these are small non-expert tensors):
 *     every source then runs the same arithmetic, and HF and GGUF F32 logits are bit-identical.
 *   - MLX quantized directories (config.json "quantization"): a module is quantized iff
 *     "<module>.scales" exists (as mlx-lm loads); bits/group from hf_quant_for. Its floe_mat is
 *     FLOE_TYPE_MLX (codes .weight uint32, .scales, .biases); switch_mlp stacks [E][out][in*bits/32]
 *     are sliced per expert. MLX norms already hold 1+w (mlx-lm sanitize), so nothing is added.
 *   - Routed experts are one floe_mat per expert and projection (slices of 3-D stacks or HF's
 *     per-expert tensors).
 *
 * Row-exactness: model_eval() over n tokens gives, for every position, logits bit-identical to
 * evaluating the tokens one at a time: matmuls use row-exact kernels, and every other op (norms,
 * RoPE, attention over the cache, the GDN recurrence, which is run token by token, the MoE sum in
 * ascending expert order) does per-row arithmetic that does not depend on the batch.
 *
 * Memory: a model owns its file mappings and every buffer it converted; sessions own their state
 * and scratch. A model must outlive its sessions. A session is used by one thread at a time. */
#ifndef FLOE_MODEL_H
#define FLOE_MODEL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "experts/experts.h"
#include "quant/mat.h"
#include "kv/kv.h"
#include "model/backend.h"
#include "base/hparams.h"

typedef struct xstream xstream;

typedef struct model_layer {
  float *attn_norm;          /* [n_embd] input_layernorm */
  float *ffn_norm;           /* [n_embd] post_attention_layernorm */
  /* full attention */
  floe_mat wq;               /* [n_head*head_dim*(gate?2:1)][n_embd]; gated: per head [q(hd) | gate(hd)] */
  floe_mat wk, wv;           /* [n_head_kv*head_dim][n_embd] */
  floe_mat wo;               /* [n_embd][n_head*head_dim] */
  float *q_norm, *k_norm;    /* [head_dim] */
  /* GatedDeltaNet */
  bool qkvz_grouped;         /* ssm_qkvz holds HF Qwen3-Next's per-key-head groups */
  bool ba_grouped;           /* ssm_ba holds per-key-head [b(r) | a(r)] groups (Qwen3-Next HF and GGUF) */
  floe_mat ssm_qkvz;         /* grouped: [Nk*(2dk+2r*dv)][n_embd] */
  floe_mat ssm_ba;           /* grouped: [Nk*2r][n_embd] */
  floe_mat ssm_qkv;          /* separate: [2*Nk*dk + Nv*dv][n_embd], q | k | v */
  floe_mat ssm_z;            /* separate: [Nv*dv][n_embd] */
  floe_mat ssm_b, ssm_alpha; /* separate: [Nv][n_embd] */
  float *conv_w;             /* [C][K] */
  float *conv_wt;            /* [K][C]: conv_w transposed (model_load), so the conv vectorizes over channels */
  float *dt_bias;            /* [Nv] */
  float *ssm_a;              /* [Nv] = -exp(A_log) */
  float *ssm_norm;           /* [dv] gated RMSNorm weight (plain) */
  floe_mat ssm_out;          /* [n_embd][Nv*dv] */
  /* MoE */
  floe_mat router;           /* [n_expert][n_embd] */
  floe_mat *exp_gate, *exp_up; /* n_expert x [n_ff_exp][n_embd] */
  floe_mat *exp_down;        /* n_expert x [n_embd][n_ff_exp] */
  floe_mat sh_gate, sh_up;   /* [n_ff_shexp][n_embd] */
  floe_mat sh_down;          /* [n_embd][n_ff_shexp] */
  floe_mat sh_gate_inp;      /* [1][n_embd] */
} model_layer;

enum model_src_kind { MODEL_SRC_GGUF = 1, MODEL_SRC_HF = 2 };

struct hf_quant;

/* Where weights come from while binding. An MLX directory is kind MODEL_SRC_HF (HF names) with
 * mlx != NULL (its quantization block). */
typedef struct model_src {
  int kind;
  int64_t n_trunk;           /* trunk layers: HF names of layer l >= n_trunk are the MTP block's
                              * "mtp.layers.{l - n_trunk}." (0: no MTP naming) */
  gguf_file *g;
  st_model *st;
  const struct hf_quant *mlx;
} model_src;

/* A tensor as found in a source: shape row-major (shape[n_dims-1] contiguous), whatever the file's
 * own convention. type is a FLOE_TYPE_*. */
typedef struct model_tref {
  const char *name;
  uint32_t type;
  int n_dims;
  int64_t shape[4];
  int64_t n_elements;
  const uint8_t *data;
} model_tref;

typedef struct model model;
typedef struct model_session model_session;

/* A session's rows in a multi-session pass (model_eval_multi): rows [off, off + n) of the pass's
 * residual buffer, at the session's positions n_past.. */
struct model_rows {
  model_session *s;
  int64_t off, n;
};

/* One architecture: binds its tensors (GGUF and HF names) and builds one decoder layer from the
 * backend's blocks (s->be: attention, gdn, moe), never touching a device itself. A layer is its
 * token mixer (attention or GatedDeltaNet: reads and advances the session's own KV / recurrent
 * state) followed by its feed-forward block (router + experts: stateless per row). The split lets
 * model_eval_multi run the mixer per session and the feed-forward block once over the rows of all
 * sessions. */
typedef struct model_arch {
  int arch;
  int (*bind)(model *m, const model_src *src, char *err, size_t errlen);
  void (*mixer)(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0);
  void (*ffn)(model_session *s, int64_t l, float *x, int64_t n);
  /* The mixer of k sessions' rows of one pass (x: the pass's N rows; lead: the session whose
   * scratch the pass uses): the backend's attention_multi / gdn_multi, or the mixer per segment
   * when the backend has none. */
  void (*mixer_multi)(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N);
} model_arch;

extern const model_arch model_arch_qwen3moe, model_arch_qwen3next, model_arch_qwen35moe;
/* The body of every architecture's mixer_multi (model.c): the backend's gdn_multi for a recurrent
 * layer, attention_multi (with the output gate when gated) for an attention layer, or, where the
 * backend has none, m->arch->mixer per segment. */
void model_mixer_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N, bool gated);
/* The hybrid architectures' (Qwen3-Next, Qwen3.5-MoE) table entries: GatedDeltaNet on a recurrent
 * layer, gated attention on the others (model_mixer_multi with the gate for several sessions); and
 * every architecture's MoE feed-forward (the backend's moe). */
void model_hybrid_mixer(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0);
void model_hybrid_mixer_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N);
void model_moe_ffn(model_session *s, int64_t l, float *x, int64_t n);

struct model {
  floe_hparams hp;
  const model_arch *arch;
  int src_kind;              /* enum model_src_kind */
  bool src_mlx;              /* an MLX quantized directory (src_kind MODEL_SRC_HF) */
  bool copied;               /* the file(s) read into huge-page memory, not mapped (model_load_ex) */
  bool lanes;                /* matrices repacked for the CPU (model_pack_lanes): it stays on the CPU, unstreamed */
  bool v_tiled;              /* value head hv uses key head hv % Nk (else hv / (Nv/Nk)) */
  floe_mat tok_embd;         /* [n_vocab][n_embd] */
  floe_mat output;           /* [n_vocab][n_embd] (tok_embd when tied) */
  float *output_norm;        /* [n_embd] */
  model_layer *layers;       /* [n_layer + 1]: the trunk, then the MTP block's decoder layer (mtp.h) */
  /* The MTP (multi-token prediction) module, mtp.c. on: bound (hp.n_mtp > 0 then; a file that
   * declares MTP blocks without their weights gets hp.n_mtp = 0). layers[n_layer] is its decoder
   * layer (full gated attention + MoE + shared expert). */
  struct {
    bool on;
    floe_mat fc;             /* [n_embd][2 n_embd] on concat(enorm(embed(t+1)), hnorm(h_t)) */
    float *enorm, *hnorm;    /* pre_fc_norm_embedding / _hidden (GGUF nextn.enorm / .hnorm), 1+w */
    float *norm;             /* mtp.norm (GGUF nextn.shared_head_norm), 1+w */
  } mtp;
  gguf_file *gguf;
  st_model *st;
  void **owned;              /* buffers freed by model_free */
  size_t n_owned, cap_owned;
  size_t owned_bytes;        /* their total (resident weights for the memory budget) */
  char *path;                /* the weights' source (a pack's source model, not the pack) */
  xpack *pack;               /* routed experts bound into DIR/experts.floepack (src/experts/pack.c) */
  xstream *xs;               /* streaming: routed experts read into a cache, never through the mapping
                              * (set by model_stream_start; NULL: every expert is used in place) */
  const model_backend *be;   /* the device its sessions run on (model_use_backend; the CPU by default) */
  void *dev;                 /* the backend's per-model state (device copies of the weights) */
  /* device memory for weights + expert pool (bytes; 0: every weight on the device). Set before
   * model_use_backend: the CUDA backend then keeps the routed experts in a VRAM pool of what the
   * other weights leave, the rest in host memory (cuda_tier.c). */
  uint64_t gpu_mem;
};

/* A recurrent-state checkpoint of a session (model_session_checkpoint). TURN checkpoints (prompt
 * ends, turn starts) are kept in preference to INTERIOR ones (every N tokens of a long prompt). */
enum model_ckpt_kind { MODEL_CKPT_INTERIOR = 0, MODEL_CKPT_TURN = 1 };
typedef struct model_ckpt {
  kv_ckpt c;                 /* c.pos < 0: unused */
  int kind;                  /* enum model_ckpt_kind */
  uint64_t seq;              /* when it was last saved or used (larger: more recent) */
} model_ckpt;

#ifndef MODEL_MAX_BATCH
#define MODEL_MAX_BATCH 512  /* tokens per internal chunk of model_eval: large, so each routed expert is read once
                              * for many tokens (MoE prefill is bound by expert bytes / tokens per chunk) */
#endif

struct model_session {
  const model *m;
  const model_backend *be;   /* m->be */
  void *dev;                 /* the backend's session state (a device backend: its buffers, streams) */
  kv_state kv;               /* dimensions and n_past always; the buffers only on the CPU backend */
  floe_pool *pool;           /* NULL: single thread */
  bool pool_shared;          /* pool belongs to another session (model_session_share_pool) */
  float *buf;                /* one arena for all scratch below */
  float *h, *out, *y;        /* [B][n_embd] */
  float *q, *k, *v, *att;    /* [B][...] attention */
  float *scores, *kvtmp;     /* [n_ctx], [kv_dim*2] */
  float *mix, *z, *b, *a, *raw, *raw2, *o; /* GDN */
  float *rlog;               /* [B][n_expert] router logits */
  int32_t *sel;              /* [B][top-k] */
  float *selw;               /* [B][top-k] */
  float *contrib;            /* [B][top-k][n_embd] */
  float *eg, *eu, *ein, *eout; /* [16][max ff] gathered expert rows, [16][n_embd] */
  float *shg;                /* [B] shared-expert gate logits */
  int64_t ff_max;
  /* speed path (layers.c): quantized activations, per-thread scratch, MoE grouping, phase times */
  bool act_q;                /* 8-bit activations for quantized weights (model_session_set_exact) */
  size_t xq_row;             /* bytes reserved per quantized activation row */
  uint8_t *xq_h, *xq_m;      /* [B] rows: norm output (per layer), layer_matmul / second layout */
  uint8_t *xq_g, *xq_d;      /* [B*K] gathered expert inputs; [B*K + B] down inputs */
  float *x;                  /* [B][n_embd] residual stream of model_eval */
  float *tscr;               /* [n_threads][tscr_n] per-thread scratch */
  int64_t tscr_n;
  int32_t *ecnt, *eoff, *aidx; /* [n_expert], [n_expert], [B*K]: tokens grouped by expert */
  void *tasks;               /* matmul task list of one pool run (layers.c) */
  double ph[8];              /* seconds per enum model_phase, accumulated */
  int64_t n_eval_tok;        /* tokens evaluated since the last stats reset */
  int64_t greedy;            /* kern_argmax of the last evaluated position's logits; -1: not known */
  /* Deferred logits (backend.h MODEL_EVAL_LAZY): lazy_ok, set by the caller around an evaluation,
   * says it needs only the greedy pick of the last position unless it asks (model_logits_sync);
   * lazy_allowed, set by the backend's session_init, that the backend may defer them; lazy_dst:
   * the buffer whose logits are still on the device (NULL: none pending). */
  bool lazy_ok, lazy_allowed;
  float *lazy_dst;
  /* Decoding ahead (model.c eval_ahead, backend.h MODEL_EVAL_AHEAD): ahead_ok, set by the caller
   * around a one-token lazy evaluation, says the caller will most likely evaluate its greedy pick
   * next (greedy decoding): the device then starts that step before the host has read the pick.
   * ahead_pos: the position of that step in flight (-1: none), whose token is ahead_tok (the pick
   * returned); it is accepted when the next evaluation is that token, dropped (waited for, its state
   * never made current) by any other use of the session. n_ahead / n_ahead_drop: steps accepted /
   * dropped since the session began. */
  bool ahead_ok;
  int64_t ahead_pos;
  int32_t ahead_tok;
  int64_t n_ahead, n_ahead_drop;
  float *lg_multi;           /* a multi-session pass led by this session: its rows' logits (model_eval_multi),
                              * kept between passes (a fresh 1 MB a row each step was mapped, faulted in
                              * and unmapped again) */
  int64_t lg_multi_rows;     /* rows lg_multi holds */
  int64_t max_batch;         /* rows of one model_eval chunk: MODEL_MAX_BATCH, or more where the backend's
                              * session_init raised it (its scratch holds that many rows; CUDA, resident) */
  size_t bytes;              /* everything this session allocated (KV, state, scratch) */
  /* streaming (layers.c): the experts of one wave, their cache slots and readiness; an I/O error
   * met inside a layer (layers return void) is kept here and returned by model_eval */
  int32_t *xs_list, *xs_slot, *xs_tmp; /* [n_expert] */
  uint8_t *xs_ready;         /* [n_expert] */
  int32_t *ridx;             /* [B*K] routed rows of one wave */
  int xs_err;
  char xs_msg[384];
  /* checkpoints for rewinding (model_session_checkpoint / _rewind); invariant: each one describes
   * a prefix of the tokens now in the session (positions <= kv.n_past) */
  int64_t verify_pos0, verify_n; /* the kept chunk of model_verify awaiting model_verify_accept (n 0: none) */
  int64_t n_recorded; /* steps the backend recorded (CUDA graphs): model_session_recorded */
  /* tools (bench/route_sim): called by the CPU's MoE with each layer's routing, the n rows' top-k
   * expert ids (ascending per row); NULL: none */
  void (*route_cb)(void *user, int64_t l, const int32_t *sel, int64_t n, int64_t k);
  void *route_user;
  bool spec_fused;    /* the backend's spec_greedy serves greedy speculative steps (its session_init decides) */
  model_ckpt *ckpt;          /* [max_ckpt] */
  int max_ckpt;
  uint64_t ckpt_seq;
};

/* Phases timed by model_eval (model_session.ph). Router includes the shared expert's gate/up,
 * which share its pool run; experts = routed gate/up/down + shared down + the weighted sum. */
enum model_phase { MODEL_PH_ATTN = 0, MODEL_PH_GDN, MODEL_PH_ROUTER, MODEL_PH_EXPERTS, MODEL_PH_LMHEAD, MODEL_PH_OTHER,
                   MODEL_PH_N };

/* ---- loading ---- */
/* path: a .gguf file, an HF safetensors directory (config.json + *.safetensors), or a `floe pack`
 * directory (DIR/experts.floepack: its source model, with the routed experts bound into the pack). */
int model_load(const char *path, model **out, char *err, size_t errlen); /* mapped (FLOE_LOAD_MMAP) */
/* load: FLOE_LOAD_AUTO (copy when floe_copy_fits the file size), FLOE_LOAD_MMAP or FLOE_LOAD_COPY.
 * A pack directory's source is always mapped (its experts are streamed). */
int model_load_ex(const char *path, int load, model **out, char *err, size_t errlen);
/* Streaming (src/experts): from now on routed experts are read into a cache of params->cache_bytes
 * instead of being used through the mapping. Call before any session evaluates. */
struct xs_params;
int model_stream_start(model *m, const struct xs_params *p, char *err, size_t errlen);
void model_free(model *m);
/* lanes.c: the CPU's resident Q4_K / Q5_K matrices repacked with the rows in the lanes (kernels.h),
 * the same values faster; a model read into memory on the CPU backend only (else nothing). Returns
 * the bytes repacked. Call once, after the backend is chosen and before any session. */
uint64_t model_pack_lanes(model *m);
/* src/experts' view of m (its routed experts and sources): arrays allocated for the call. Layers
 * 0..n_layer-1, plus the MTP block as layer n_layer when it is bound and m is not bound to a pack. */
int model_xs_view(const model *m, xs_model *v);
void model_xs_view_free(xs_model *v);
/* xs_store_open / xpack_write of m's experts (through model_xs_view). */
int model_store_open(const model *m, bool direct, xs_store **out, char *err, size_t errlen);
int model_pack_write(const model *m, const char *source, const char *dir, char *err, size_t errlen);

/* ---- sessions ---- */
/* n_ctx <= 0: the model's trained context (capped at 4096). kv_type: enum kv_type; callers use
 * KV_BF16 by default (issue 3: "KV cache BF16 by default, F32 option"; engine.c does) and KV_F32
 * when asked (tests that compare with HF use F32). n_threads >= 1. */
int model_session_new(const model *m, int64_t n_ctx, int kv_type, int n_threads, model_session **out, char *err,
                      size_t errlen);
void model_session_free(model_session *s);
/* Forgets every token (and every checkpoint). */
void model_session_reset(model_session *s);
int64_t model_session_pos(const model_session *s);
/* How many evaluations so far recorded a replayable step (the CUDA backend's graphs: a capture and
 * instantiation cost milliseconds once). A step that recorded one is no measure of its usual cost
 * (engine_mtp.c's automatic k skips it). Always 0 on the CPU. */
int64_t model_session_recorded(const model_session *s);

/* ---- rewinding (partial prefix reuse) ----
 * Attention layers rewind for free (rows >= pos are dead); GatedDeltaNet layers only to a
 * checkpoint: an exact copy of every recurrent layer's S and conv window, so a session rewound and
 * re-fed the same tokens is bit-identical to a cold run. The engine chooses where to checkpoint. */
/* How many checkpoints the session keeps (0: none; a model without recurrent layers never needs
 * any). Drops the existing ones; their buffers are allocated on first save. 0 or FLOE_E_*. */
int model_session_set_ckpt_max(model_session *s, int max, char *err, size_t errlen);
/* Bytes one checkpoint holds (0: no recurrent layer). */
size_t model_session_ckpt_bytes(const model_session *s);
/* Saves the recurrent state at the current position (kind: enum model_ckpt_kind). One that
 * already exists at this position is only refreshed. When all max are in use, the least useful is
 * replaced: INTERIOR before TURN, then the least recently saved or used. 0 (also when nothing needs
 * saving) or FLOE_E_NOMEM (nothing saved, the session is unchanged). */
int model_session_checkpoint(model_session *s, int kind);
/* Moves the session back to the largest position <= pos that it can restore exactly: pos itself
 * without recurrent layers, else the largest checkpoint <= pos (0, a reset, when there is none).
 * pos >= the current position changes nothing. Checkpoints beyond the result are dropped (the
 * tokens after it are about to change). Returns the new position. */
int64_t model_session_rewind(model_session *s, int64_t pos);
/* The position model_session_rewind(s, pos) would reach, without changing anything. */
int64_t model_session_rewind_pos(const model_session *s, int64_t pos);
/* Positions of the checkpoints held, ascending (up to cap); returns how many are held. */
int model_session_ckpt_list(const model_session *s, int64_t *pos, int cap);
/* exact = true: activations stay float (the reference path: the HF tests, F32/BF16 weights).
 * Default false: matrices whose type has a quantized-activation kernel (Q8_0, Q4_K, ... see
 * kernels.h) get their input rows quantized to 8 bits once per matmul input (VNNI dot products;
 * per-row, so still row-exact; ~1e-2 relative per matmul). */
void model_session_set_exact(model_session *s, bool exact);
/* Weight bytes one decoded token reads (layers.c). */
uint64_t layer_decode_bytes(const model *m);
size_t layer_task_bytes(void);
/* Runs n tokens at positions n_past..n_past+n-1. logits: NULL, or [n][n_vocab] when all_logits,
 * else [n_vocab] for the last token. A prompt that does not fit the context is refused. */
int model_eval(model_session *s, const int32_t *tokens, int64_t n, float *logits, bool all_logits, char *err,
               size_t errlen);
/* The logits a deferred evaluation (lazy_ok) left on the device, copied into their buffer
 * (s->lazy_dst); nothing to do when none are pending. 0 or FLOE_E_*. */
int model_logits_sync(model_session *s, char *err, size_t errlen);
/* The step run ahead (ahead_pos >= 0) dropped: waited for, its state never made current; the
 * session's last evaluation stays as it was. Every use of a session other than the evaluation of
 * that step's token does this first. 0 or FLOE_E_*. */
int model_ahead_drop(model_session *s, char *err, size_t errlen);
/* Before an evaluation that rewrites the device's logits: pending deferred logits are dropped when
 * next (the evaluation's logits buffer) is their buffer, else fetched into it first. */
int model_logits_settle(model_session *s, const float *next, char *err, size_t errlen);
/* model_eval that also copies every position's final hidden state (the residual stream after the
 * last layer, before the output norm: what an MTP head reads) into hidden [n][n_embd] when not NULL. */
int model_eval_h(model_session *s, const int32_t *tokens, int64_t n, float *logits, bool all_logits, float *hidden,
                 char *err, size_t errlen);
/* ---- several sessions in one pass (continuous batching) ----
 * A segment: n tokens appended to session s (at its n_past); logits NULL or [n_vocab] for the
 * last of them. */
typedef struct model_seg {
  model_session *s;
  const int32_t *tokens;
  int64_t n;
  float *logits;
} model_seg;
/* Evaluates k segments of distinct sessions of one model. When the backend supports it
 * (backend.h multi_begin) and the rows fit one pass (MODEL_MAX_BATCH), they run as ONE forward
 * pass: the token mixers per session on its own state, the MoE (router, experts, shared expert)
 * and the logits once over all rows, so every weight is read once for all of them. Row-exactness
 * makes each session's results bit-identical to a model_eval of its segment alone. Otherwise (or
 * for the rows that do not fit) the segments are evaluated one after another. On error the
 * sessions' states are undefined: the caller resets every session of the call. *rows_out and
 * *segs_out (may be NULL): the rows and segments of the largest pass run. */
int model_eval_multi(const model_seg *seg, int k, int64_t *rows_out, int *segs_out, char *err, size_t errlen);
/* s drops its own worker threads and runs on those of `from` (same model, backend and thread
 * count): the sessions of one batch then share one set of threads instead of each keeping its
 * own spinning workers. `from` must outlive s and neither may run while the other does.
 * 0 or FLOE_E_INVALID (nothing changed). */
int model_session_share_pool(model_session *s, model_session *from, char *err, size_t errlen);

/* ---- speculative decoding (the trunk side) ----
 * model_verify evaluates n (1..KV_KEEP_MAX) tokens at n_past.. like model_eval_h with every row's
 * logits [n][n_vocab] and hidden [n][n_embd] (either may be NULL), but keeps the recurrent state
 * after each row instead of advancing it, and leaves n_past where it was. model_verify_accept(s, a)
 * must follow before anything else touches the session: the first a rows (0..n) stay, n_past
 * advances by a, and the recurrent state becomes the one after row a-1 by a pointer swap (no
 * copy). Attention rows past the accepted ones are dead, as after a rewind. Every row is computed
 * exactly as a single-token model_eval would (row-exact), so accepting a rows leaves the session
 * bit-identical to evaluating those a tokens one at a time. */
int model_verify(model_session *s, const int32_t *tokens, int64_t n, float *logits, float *hidden, char *err,
                 size_t errlen);
void model_verify_accept(model_session *s, int64_t a);

/* ---- the MTP module (mtp.c) ---- */
/* Binds the MTP block of a qwen3next / qwen35moe source into layers[n_layer] and m->mtp; a source
 * without its weights sets hp.n_mtp = 0 (not an error). */
int model_mtp_bind(model *m, const model_src *src, char *err, size_t errlen);
bool model_has_mtp(const model *m);
/* The model has an MTP block and its backend runs it and the speculative verify (keep_begin /
 * keep_accept): the CPU, and CUDA. */
bool model_mtp_runs(const model *m);
/* y[t] = output_norm(x[t]): the trunk's final-normed hidden state, what the MTP reads. */
void model_final_norm(const model *m, const float *x, int64_t n, float *y);
/* The MTP block on n rows at MTP positions pos0..pos0+n-1 (the block's own attention cache, kept
 * in the session; rows past pos0+n-1 become dead). Row t reads token tok[t] (the token after
 * position pos0+t) and h[t] (a normed hidden state at pos0+t: the trunk's model_final_norm, or the
 * MTP's own h_out of the previous draft when chaining). Writes h_out [n][n_embd] (mtp.norm output;
 * may be NULL) and logits of rows [first, n) into logits [n-first][n_vocab] (NULL: none).
 * FLOE_E_UNSUPPORTED on a backend that cannot run it (model_mtp_runs). */
int model_mtp_eval(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0, int64_t first,
                   float *logits, float *h_out, char *err, size_t errlen);
/* Whether model_spec_greedy runs on this session: its backend drafts, verifies and counts the
 * accepted drafts in one device pass (backend.h spec_greedy; CUDA unless FLOE_CUDA_MTP_FUSED=0).
 * Otherwise the caller composes model_mtp_eval, model_verify and its own argmaxes. */
bool model_spec_fused(const model_session *s);
/* A greedy speculative step with k (1..KV_KEEP_MAX-1) drafts, the same arithmetic as composing
 * model_mtp_eval (the n <= KV_KEEP_MAX rows tok/h at pos0.., pos0 + n == n_past, the last row's
 * logits giving d_1 = argmax; then for j = 2..k one row at n_past + j - 2 of (d_{j-1}, the
 * previous row's h_out) giving d_j) and model_verify([tok[n-1], d_1..d_k]); the argmaxes are the
 * device's (kern_argmax's index, like the host's). Returns draft[k], amax[k+1] (the argmax of
 * each verify row), *acc (the largest a <= k with draft[i] == amax[i] for i < a), hidden[k+1]
 * [n_embd] (the verify rows' final hidden states, model_verify's hidden; may be NULL) and logits
 * [n_vocab] (verify row *acc's logits; may be NULL); the session's greedy pick is amax[*acc]. The
 * verify chunk is left kept: model_verify_accept(s, *acc + 1) must follow, as after
 * model_verify. FLOE_E_UNSUPPORTED where !model_spec_fused(s). */
int model_spec_greedy(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0, int k,
                      int32_t *draft, int32_t *amax, int64_t *acc, float *hidden, float *logits, char *err,
                      size_t errlen);

/* Moves the model onto backend be (device dev_index for a GPU): uploads what the backend needs.
 * Call after loading, before any session exists; a streamed model (model_stream_start, before or
 * after) goes on a GPU only with an expert pool (gpu_mem): its misses come from the stream. 0 or FLOE_E_*; on failure the model stays on the CPU. */
int model_use_backend(model *m, const model_backend *be, int dev_index, char *err, size_t errlen);
/* Bytes of every matrix of the trunk (what a device backend copies). */
uint64_t model_weight_bytes(const model *m);
/* Routed experts tiered between a device pool and host memory (model.gpu_mem): counters since
 * the last reset. Each selected routed expert of each row is one lookup: found in the pool (hit),
 * copied into it, or computed by the CPU. */
typedef struct model_tier_stats {
  bool on;
  uint64_t pool_bytes;       /* the VRAM pool */
  int64_t slots;             /* experts it holds */
  bool pinned;               /* host expert memory page-locked (else copies are staged by the driver) */
  int cpu_mode;              /* -1 the cost model decides, 0 never the CPU, 1 the CPU whenever it can */
  uint64_t lookups, hits, copies, cpu;
  uint64_t h2d_bytes;        /* expert bytes copied host -> device */
  uint64_t pf_issued, pf_used; /* next-layer prefetch (FLOE_TIER_PF): experts copied ahead, then used */
  uint64_t graphs_recorded;  /* one-token steps' segments recorded as CUDA graphs (backend_cuda.c) */
  uint64_t graph_launches;   /* and the segment graphs launched (recorded or replayed) */
  double wait_s;             /* host time blocked on the device (the routing of each layer) */
  double cpu_s;              /* host time computing experts */
  double pcie_gbps;          /* cost model: measured host -> device copy rate */
  double gpu_gbps;           /* cost model: measured device memory rate (read + written) */
  double cpu_expert_s;       /* cost model: CPU seconds per expert (measured, running estimate) */
} model_tier_stats;
/* 0 and *out filled when m's experts are tiered, else FLOE_E_UNSUPPORTED (*out zeroed). */
int model_tier_stats_get(const model *m, model_tier_stats *out);
void model_tier_stats_reset(const model *m);

#ifdef FLOE_HAVE_CUDA
/* backend_cuda.c: CUDA devices present (0 without a driver); name and memory of device dev. */
int model_cuda_devices(void);
int model_cuda_mem(int dev, char *name, size_t name_len, size_t *free_b, size_t *total_b, char *err, size_t errlen);
#endif

/* ---- binding helpers for arch/<arch>.c ---- */
int model_src_find(const model_src *src, const char *name, model_tref *t);
bool model_src_has(const model_src *src, const char *name);
/* A 2-D weight of rows x cols (any tensor with that element count whose last dim is cols). */
int model_bind_mat(model *m, const model_src *src, const char *name, int64_t rows, int64_t cols, floe_mat *out,
                   char *err, size_t errlen);
/* Rows [row0, row0+rows) of slab e of a 3-D stack [n_slab][slab_rows][cols]. */
int model_bind_slab(model *m, const model_src *src, const char *name, int64_t n_slab, int64_t slab_rows, int64_t e,
                    int64_t row0, int64_t rows, int64_t cols, floe_mat *out, char *err, size_t errlen);
/* A vector of n elements converted to float32, plus `add` (1.0 for HF zero-centred norms). */
int model_bind_vec(model *m, const model_src *src, const char *name, int64_t n, float add, float **out, char *err,
                   size_t errlen);
/* Routed experts of layer l, from HF per-expert tensors (prefix "model.layers.L.mlp.experts."),
 * HF fused gate_up_proj/down_proj, or GGUF stacks ffn_{gate,up,down}_exps. */
int model_bind_experts(model *m, const model_src *src, int64_t l, char *err, size_t errlen);
void *model_own(model *m, size_t bytes); /* zeroed, freed with the model; NULL on failure */
/* Grouped -> tiled value-head reorder (qwen35moe from HF/MLX, see the layout notes above).
 * Tiled position p = j*Nk + g takes grouped head g*r + j (r = Nv/Nk).
 * rows: rows [row0, row0 + Nv*unit) of W, blocks of `unit` rows; W is replaced by a copy.
 * cols: each row's Nv blocks of `unit` columns (W->cols == Nv*unit); plain types and MLX whose
 * groups align with `unit` are permuted as stored, other MLX matrices are dequantized to F32.
 * vec: n = Nv*unit floats in place. */
int model_vtile_rows(model *m, floe_mat *W, int64_t row0, int64_t Nk, int64_t Nv, int64_t unit, char *err,
                     size_t errlen);
int model_vtile_cols(model *m, floe_mat *W, int64_t Nk, int64_t Nv, int64_t unit, char *err, size_t errlen);
int model_vtile_vec(float *v, int64_t Nk, int64_t Nv, int64_t unit);
/* Token row tok of the embedding as floats (any type, MLX included). */
void model_embed_row(const model *m, int32_t tok, float *dst);
/* Everything of layer l except the GatedDeltaNet projections: the two norms, full attention (when
 * the layer is not recurrent), router, routed and shared experts; and (l < 0) the global tensors.
 * zc: the source holds zero-centred norms without the +1 (HF Qwen3-Next / Qwen3.5). */
int model_bind_common(model *m, const model_src *src, int64_t l, bool zc, char *err, size_t errlen);
/* The GDN tensors that are named alike in both hybrids: conv1d, dt_bias, A (-exp(A_log)), norm, out. */
int model_bind_gdn_common(model *m, const model_src *src, int64_t l, char *err, size_t errlen);
/* Name of tensor `what` of layer l: GGUF "blk.L.<gguf>" or HF "model.layers.L.<hf>". */
const char *model_lname(const model_src *src, int64_t l, const char *gguf, const char *hf, char *buf, size_t n);

/* ---- shared layer math (layers.c) ---- */
/* Y[b] = W X[b] for b < nb (any nb), exact float path, split over the session's threads. */
void layer_matmul(model_session *s, const floe_mat *W, int64_t nb, const float *X, int64_t ldx, float *Y, int64_t ldy);
/* y = W x for one row x, and the greedy pick of y (kern_argmax(y, W->rows)) found by the threads
 * over the rows each computed, while they are in its cache */
int64_t layer_matmul_argmax(model_session *s, const floe_mat *W, const float *x, float *y);
void layer_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y);
/* a and b take the same quantized activation rows (type, columns, MLX format): a matmul reads the
 * rows prepared for b's layout only then, else the float path (every backend decides alike). */
bool layer_same_act(const floe_mat *a, const floe_mat *b);
/* The NeoX RoPE table of one position: cs[0..n_rot/2) cos, cs[n_rot/2..n_rot) sin of pos*inv_freq
 * (the CPU's float32 arithmetic; the CUDA kernels read rows of it, so both rotate by the same bits). */
void layer_rope_table(float *cs, int64_t n_rot, float theta, int64_t pos);
/* Full attention layer (with or without the sigmoid output gate). x += attn(norm(x)). */
void layer_attention(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0, bool gated);
/* GatedDeltaNet layer. x += gdn(norm(x)). */
void layer_gdn(model_session *s, int64_t l, float *x, int64_t n);
/* One value head's delta-rule step on its state S [dk][dv] (row-major), before the gated norm:
 *   S = (Sin ? Sin : S) * decay; kv = S^T k; delta = (v - kv) * beta; S += k delta^T; o = S^T q,
 * the sums over the key dimension in base/gdn_sum.h's order. kv: dv floats of scratch (left
 * holding delta). Sn: the next head's state, prefetched while this one runs (or NULL). */
void layer_gdn_head(float *S, const float *Sin, int64_t dk, int64_t dv, float decay, float beta, const float *k,
                    const float *q, const float *v, float *kv, float *o, const float *Sn);
/* The same two over the rows of several sessions (backend.h attention_multi, gdn_multi): the
 * projections once over all N rows in lead's scratch, the per-session part (cache / recurrent
 * state) per segment. Row for row the arithmetic of the single-session functions. */
void layer_attention_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N, bool gated);
void layer_gdn_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N);
/* MoE block (routed experts, plus the sigmoid-gated shared expert when present). x += moe(norm(x)). */
void layer_moe(model_session *s, int64_t l, float *x, int64_t n);
/* Several rows' experts in one pool run (xd_worker, the default) or the general path's three
 * (on = 0; FLOE_XD_MULTI=0 at start): for in-process A/B (bench_multi's "Ng" stream counts). */
void layer_xd_multi_set(int on);
#endif
