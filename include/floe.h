/* floe public API.
 *
 * The CLI and the server use only this header: they never see tensors. Two opaque handles:
 * floe_engine = a loaded model (weights, tokenizer; immutable, shareable), floe_session = one
 * mutable context (KV cache, recurrent state, sampler) used by one thread at a time.
 * Fallible calls return 0 or a negative FLOE_E_* code and write a one-line message into err. */
#ifndef FLOE_H
#define FLOE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOE_VERSION "0.2.0"

enum {
  FLOE_OK = 0,
  FLOE_E_IO = -1,          /* open/read/write/mmap failed */
  FLOE_E_FORMAT = -2,      /* malformed file: bad magic, truncated, out-of-range offset, ... */
  FLOE_E_UNSUPPORTED = -3, /* valid but not supported: unknown tensor type, architecture */
  FLOE_E_INVALID = -4,     /* bad argument or value */
  FLOE_E_NOMEM = -5,       /* allocation failed or memory budget too small */
  FLOE_E_NOTFOUND = -6,    /* missing key or tensor */
  FLOE_E_OVERFLOW = -7,    /* size arithmetic overflow, absurd dimensions */
  FLOE_E_CONTEXT = -8,     /* prompt + generation do not fit the context */
  FLOE_E_CANCELLED = -9,   /* stopped by the caller */
};

/* Human-readable name of an error code ("malformed file", ...). */
const char *floe_strerror(int code);

/* ---- engine ---- */
typedef struct floe_engine floe_engine;
typedef struct floe_session floe_session;

/* Streaming I/O engines, prefetchers and cache policies (floe_engine_params). */
enum { FLOE_IO_AUTO = 0, FLOE_IO_URING = 1, FLOE_IO_PREAD = 2 };
/* FLOE_PREFETCH_RESID (with NEXT): layer L+1's router sees the residual stream after layer L's
 * attention, normed with layer L+1's own ffn_norm, instead of layer L's normed MoE input. */
enum { FLOE_PREFETCH_NEXT = 1, FLOE_PREFETCH_PREV = 2, FLOE_PREFETCH_RESID = 4 };
enum { FLOE_CACHE_LRU = 0, FLOE_CACHE_LFU = 1 };
/* How the model file is held: AUTO reads it into memory backed by 2 MiB huge pages when it fits
 * comfortably (MemAvailable minus max(2 GiB, 20 %)) and no memory budget is set, else maps it;
 * MMAP maps it (pages load on first use, 4 KiB pages: slower decode); COPY always reads it in. */
enum { FLOE_LOAD_AUTO = 0, FLOE_LOAD_MMAP = 1, FLOE_LOAD_COPY = 2 };
/* Where the forward pass runs. AUTO: a CUDA GPU when one is present, the binary was built with
 * CUDA, and the model fits the GPU's free memory (no --mem-budget); otherwise the CPU, and
 * floe_model_info.device_note says why when a CUDA device was there to choose.
 * CUDA: the GPU device_index, or an error. */
enum { FLOE_DEVICE_AUTO = 0, FLOE_DEVICE_CPU = 1, FLOE_DEVICE_CUDA = 2 };

typedef struct floe_engine_params {
  const char *model; /* GGUF file, HF / MLX safetensors directory, or a `floe pack` directory */
  int n_threads;     /* 0: all cores */
  /* Memory budget (bytes; 0: none, every weight used in place through the file mapping). With a
   * budget, routed experts are streamed from disk: non-expert weights stay mapped (counted), and
   * experts are read (never through the mapping) into a cache sized so that weights + KV + scratch
   * + cache fit the budget. Refused with the minimum when one layer's top-k experts do not fit.
   * Peak RSS <= budget + slack, the slack being what floe does not count: binary, libc, tokenizer,
   * thread stacks, allocator overhead; documented as 64 MiB (measured <= 36 MiB on
   * Qwen3-Next-80B: peak RSS - mapped non-expert weights - expert cache, bench/results.tsv). */
  uint64_t mem_budget;
  int load;          /* FLOE_LOAD_* (default AUTO; with a memory budget always MMAP) */
  int io;            /* FLOE_IO_*: a pread thread pool (AUTO, the default: measured faster) or io_uring */
  bool io_direct;    /* O_DIRECT reads (default: buffered, no readahead) */
  int prefetch;      /* FLOE_PREFETCH_* mask (default FLOE_PREFETCH_NEXT) */
  int cache_policy;  /* FLOE_CACHE_* (default LRU) */
  int io_depth;      /* chunks in flight (default 64) */
  int io_threads;    /* pread workers (default 16) */
  uint64_t io_chunk; /* read split size (default 512 KiB) */
  bool io_verify;    /* pack layout: check each expert block's checksum */
  int mtp;           /* floe_gen_params.mtp when a request leaves it at -1: -1 auto (init), 0 off, 1..4 */
  bool io_no_prefault; /* don't populate the expert cache's memory in the background at start
                        * (then slots fault their pages in on first fill, on the decode's time) */
  int device;          /* FLOE_DEVICE_* (default AUTO) */
  int device_index;    /* the GPU of FLOE_DEVICE_CUDA (cuda:N; default 0) */
  /* GPU memory for the weights (bytes; 0: every weight on the GPU). With a size, the non-expert
   * weights go on the GPU, the routed experts stay in host memory and a VRAM pool of what is left
   * (minus ~1.5 GiB kept for the sessions' KV and scratch) holds the ones used most recently; a
   * selected expert that is not there is copied in, or computed by the CPU threads while the GPU
   * does the rest (a measured cost model picks). The output is the fully resident GPU run's, bit
   * for bit. Implies the CUDA device (AUTO uses it even when the model does not fit). */
  uint64_t gpu_mem;
  /* Loading progress, called from floe_engine_open's thread while a model file is read into
   * memory (FLOE_LOAD_COPY, or AUTO choosing it): bytes read and the file's size, per file.
   * NULL: none. A mapped file loads on first use and reports nothing. */
  void (*progress)(void *user, uint64_t done, uint64_t total);
  void *progress_user;
} floe_engine_params;

void floe_engine_params_init(floe_engine_params *p);
int floe_engine_open(const floe_engine_params *p, floe_engine **out, char *err, size_t errlen);
void floe_engine_close(floe_engine *e);

typedef struct floe_model_info {
  const char *arch;      /* "qwen35moe", ... */
  int64_t n_vocab, n_embd, n_layer, n_ctx_train;
  int64_t n_expert, n_expert_used;
  int n_mtp;             /* MTP blocks in the file */
  uint64_t weight_bytes; /* all tensor data */
  uint64_t expert_bytes; /* routed experts */
  uint64_t decode_bytes; /* weight bytes one decoded token reads (top-k experts, output matrix, ...) */
  /* streaming (0 without a memory budget; cache figures once the first session exists) */
  uint64_t mem_budget, resident_bytes, cache_bytes, expert_slot_bytes;
  int64_t cache_slots;
  bool copied;           /* weights read into huge-page memory (FLOE_LOAD_COPY, or AUTO chose it) */
  uint64_t lanes_bytes;  /* of those, Q4_K / Q5_K bytes repacked for the CPU's batched kernel (FLOE_LANES=0: none) */
  const char *device;    /* "cpu" or "cuda" */
  char gpu_name[128];    /* the GPU's name ("" on the CPU) */
  uint64_t vram_bytes;   /* the GPU's total memory (0 on the CPU) */
  /* the device memory floe holds at the floe_engine_info call: the GPU's free memory before the
   * model was loaded minus its free memory now (weights, expert pool, every live session's KV,
   * state, scratch and recorded graphs; not the CUDA context); 0 on the CPU */
  uint64_t vram_used_bytes;
  char device_note[256]; /* FLOE_DEVICE_AUTO chose the CPU although a CUDA device is present: why */
} floe_model_info;
void floe_engine_info(const floe_engine *e, floe_model_info *out);
/* Is the engine still usable? FLOE_E_IO with the reason when a model file it maps shrank after
 * loading (every evaluation would fail), else 0. Cheap (an fstat per file). */
int floe_engine_check(const floe_engine *e, char *err, size_t errlen);
/* The read bandwidth of the memory the weights sit in: every byte of the model file's resident
 * copy read front to back by n_threads threads (each its own contiguous part, the shape of
 * bench/membw), `passes` times; *gbps = the best pass. Decode streams from these very pages, so
 * this is the roofline's bandwidth without the placement of a separate test buffer. Only for a
 * GGUF file read into memory (floe_model_info.copied) with every expert resident: FLOE_E_UNSUPPORTED
 * otherwise (a mapped file would measure page-cache faults, a streamed one the disk). */
int floe_engine_read_bandwidth(const floe_engine *e, int n_threads, int passes, double *gbps, char *err, size_t errlen);

/* ---- tokenizer ---- */
/* Encodes text; *ids is malloc'ed (free()). parse_special: control tokens like <|im_start|> in
 * the text become their ids (chat prompts); off for untrusted user text. */
int floe_tokenize(const floe_engine *e, const char *text, size_t len, bool parse_special, int32_t **ids,
                  size_t *n, char *err, size_t errlen);
/* Raw bytes of one token (not NUL-terminated), NULL if out of range. */
const char *floe_token_piece(const floe_engine *e, int32_t id, size_t *len);
bool floe_token_is_eog(const floe_engine *e, int32_t id);
/* Id of the token whose text is exactly `text` ("<|im_end|>", "<think>", ...), -1 if none. */
int32_t floe_token_find(const floe_engine *e, const char *text);

/* ---- chat template ---- */
typedef struct floe_chat_tool_call {
  const char *id;        /* may be NULL */
  const char *name;
  const char *arguments; /* JSON object text */
} floe_chat_tool_call;

typedef struct floe_chat_msg {
  const char *role;      /* system, developer, user, assistant, tool */
  const char *content;   /* may be NULL (assistant with tool calls) */
  const char *reasoning; /* assistant reasoning_content, may be NULL */
  const floe_chat_tool_call *tool_calls;
  size_t n_tool_calls;
  const char *tool_call_id; /* tool messages */
  const char *name;         /* tool messages: the tool's name, may be NULL */
} floe_chat_msg;

typedef struct floe_chat_opts {
  const char *tools_json;     /* JSON array of OpenAI tool definitions, or NULL */
  bool add_generation_prompt; /* end with the assistant turn's opening */
  bool enable_thinking;       /* Qwen3 / 3.5 thinking mode */
  bool raw_tool_args;         /* Qwen3: replay tool-call argument text verbatim (bytes the model sampled) */
} floe_chat_opts;

/* Renders a conversation with the model family's chat template (Qwen3 or Qwen3.5/3.6 ChatML).
 * *out is malloc'ed (free()). */
int floe_chat_render(const floe_engine *e, const floe_chat_msg *msgs, size_t n, const floe_chat_opts *o, char **out,
                     char *err, size_t errlen);

/* ---- sessions ---- */
typedef struct floe_session_params {
  int64_t n_ctx; /* 0: the model's trained context, capped at 4096 */
  bool kv_f32;   /* F32 KV cache (default BF16) */
  /* Exact float activations. Default (false): matrices of a type with an integer kernel (Q8_0,
   * Q4_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, MLX 4/8-bit) get their input rows quantized to
   * 8 bits (per 32 / 256 values / MLX group) and use VNNI dot products: ~1e-2 relative per matmul,
   * still row-exact (prefill == stepwise, bit for bit). F32/F16/BF16 weights are always exact. */
  bool exact_act;
  /* Partial prefix reuse on models with GatedDeltaNet layers (qwen3next, qwen35moe), whose state
   * cannot be rewound: the session keeps exact copies of the recurrent state at chosen positions
   * (the end of each prompt, the starts of its last two <|im_start|> turns, and every
   * checkpoint_every tokens inside long prompts), and a prompt that leaves the cached history
   * resumes from the largest one at or before the divergence. Pure-attention models rewind to
   * the divergence itself and keep none. With a memory budget their memory is counted. */
  int n_checkpoints;        /* copies kept (0: default 8; < 0: none, only whole-history reuse) */
  int64_t checkpoint_every; /* interior copies every this many prompt tokens (0: default 1024; < 0: none) */
  /* Run on the worker threads of this session (same engine and thread count; it must outlive the
   * new one, and the two must not run at the same time): the sessions a server steps together
   * share one set of threads. NULL: the session starts its own. */
  struct floe_session *share_threads;
  /* With a memory budget, the first session sizes the expert cache from what the budget leaves:
   * budget_sessions > 0 keeps room for that many more sessions of its size (the slots of a server). */
  int budget_sessions;
} floe_session_params;
void floe_session_params_init(floe_session_params *p);
int floe_session_new(floe_engine *e, const floe_session_params *p, floe_session **out, char *err, size_t errlen);
void floe_session_free(floe_session *s);
int64_t floe_session_n_ctx(const floe_session *s);
/* Tokens currently held in the session's cache. */
int64_t floe_session_n_past(const floe_session *s);
void floe_session_reset(floe_session *s);
/* Appends tokens to the context. logits: NULL, or n_vocab floats for the last position (or
 * n * n_vocab for every position when all_logits). */
int floe_session_eval(floe_session *s, const int32_t *ids, size_t n, float *logits, bool all_logits, char *err,
                      size_t errlen);

/* Prompt tokens floe_generate would reuse from this session's cache for `prompt` (what
 * floe_gen_result.n_reused will say): the common prefix with the history, or, when the prompt
 * leaves the history, the largest position at or before the divergence (and before the last
 * prompt token) that the session can restore. */
int64_t floe_session_reusable(const floe_session *s, const int32_t *prompt, size_t n);
/* Positions of the recurrent-state checkpoints the session holds, ascending (up to cap of them
 * written); returns how many it holds (0 for pure-attention models). */
int floe_session_checkpoints(const floe_session *s, int64_t *pos, int cap);

/* Time spent per phase by the session's evaluations since the last reset (seconds, wall clock).
 * router includes the shared expert's gate/up (same pool run); experts = routed gate/up/down,
 * shared down and the weighted sum; other = embedding and what the phases do not cover. */
typedef struct floe_session_stats {
  double attn_s, gdn_s, router_s, experts_s, lm_head_s, other_s;
  int64_t n_tokens; /* tokens evaluated */
  /* streaming (engine-wide counters, zero without a memory budget) */
  uint64_t bytes_read, reads;        /* expert bytes read from disk, read requests */
  uint64_t expert_hits, expert_misses; /* demand lookups found in the cache (or in flight) / read */
  uint64_t prefetch_issued, prefetch_used, prefetch_wasted;
  double io_wait_s;                  /* time the forward pass waited for expert reads */
  double prefetch_precision, prefetch_recall; /* predicted experts that were used / used experts predicted; -1: none */
  /* I/O roofline terms: seconds with a read in flight; compute no read could overlap (per
   * evaluation: start -> first read queued, plus last read done -> logits; all of it when nothing
   * was read); seconds the cache arena's background population took (0: running or off; -1: the
   * kernel refused MADV_POPULATE_WRITE, slots fault their pages in on first fill). */
  double disk_busy_s, serial_s, prefault_s;
  /* speculative decoding with the model's MTP head (floe_gen_params.mtp), since the last reset:
   * decode steps that drafted, tokens drafted / accepted per draft position (position j counts
   * only steps whose drafts 1..j-1 were all accepted, so accepted[j]/drafted[j] is the conditional
   * rate), tokens the trunk produced in speculative steps (accepted + one per step), the draft
   * count of the last step, and the seconds spent in draft + verify steps; mtp_k_steps[k]: the
   * decode steps of speculative generations taken with k drafts (k = 0: plain steps, e.g. where
   * the automatic choice found that drafting does not pay) */
  int64_t mtp_steps, mtp_drafted[4], mtp_accepted[4], mtp_tokens;
  int mtp_k_last;
  double mtp_step_s;
  int64_t mtp_k_steps[5];
  /* experts tiered VRAM <- host (floe_engine_params.gpu_mem; engine-wide, zero otherwise): the
   * pool, then per selected routed expert: found in VRAM, copied in, computed by the CPU; bytes
   * copied; host seconds waiting for each layer's routing and computing experts; the cost model's
   * inputs (measured copy GB/s, CPU seconds per expert) */
  bool tier_on, tier_pinned;
  uint64_t tier_pool_bytes;
  int64_t tier_slots;
  uint64_t tier_lookups, tier_hits, tier_copies, tier_cpu, tier_h2d_bytes;
  uint64_t tier_pf_issued, tier_pf_used; /* experts copied ahead for the next layer, then used */
  uint64_t tier_graph_launches;          /* one-token steps' recorded segments launched (CUDA graphs) */
  double tier_wait_s, tier_cpu_s, tier_pcie_gbps, tier_cpu_expert_s;
  double tier_gpu_gbps; /* the cost model's device memory rate (its t_gpu a selected expert) */
} floe_session_stats;
void floe_session_stats_get(const floe_session *s, floe_session_stats *out);
/* Resets the session's times and the engine's streaming counters. */
void floe_session_stats_reset(floe_session *s);
/* Streaming: demand hits and misses of layer l since the last reset (0 when not streaming);
 * l = n_layer is the MTP block (its experts stream too, except from a `floe pack` directory). */
void floe_engine_layer_stats(const floe_engine *e, int64_t l, uint64_t *hits, uint64_t *misses);

/* ---- generation ---- */
/* Greedy pick over n logits: the index of the largest, the lowest on ties, NaN never chosen
 * (0 when none is above -inf); vectorized where the CPU allows. */
int32_t floe_argmax(const float *logits, size_t n);
/* floe_argmax of the logits of the session's last evaluated position, without copying them (a
 * decode step finds it while computing the logits, each thread over its rows); -1 when the
 * session holds no tokens. */
int32_t floe_session_argmax(const floe_session *s);

typedef struct floe_sampling {
  float temperature; /* <= 0: greedy */
  int32_t top_k;     /* <= 0: off */
  float top_p;       /* 1: off */
  float min_p;       /* 0: off */
  uint64_t seed;
} floe_sampling;

typedef struct floe_gen_params {
  floe_sampling sampling;
  int64_t max_tokens;         /* <= 0: until end of generation or the context is full */
  const char *const *stop;    /* stop strings (not emitted), may be NULL */
  size_t n_stop;
  int n_top_logprobs;         /* 0..20: alternatives reported per token */
  bool logprobs;              /* report the chosen token's log-probability */
  /* Polled (with floe_generate's user) before each prefill step of at most 256 tokens, so a long
   * prompt can be abandoned: non-zero stops at once, floe_generate returns 0 with finish =
   * CANCELLED and n_gen = 0, and the session keeps the prompt tokens evaluated so far (a retry of
   * the same prompt continues from there). NULL: never asked. */
  int (*should_stop)(void *user);
  /* Speculative decoding with the model's MTP head: drafts per step. -1 (floe_gen_params_init's
   * default): chosen automatically from the measured acceptance and step cost (0 when it does
   * not pay, e.g. streamed experts whose union a verify step must read) for greedy requests;
   * sampled requests take it as 0, since the random draws depend on each step's k and the
   * automatic k on timing, so a seed would not reproduce its sample; 0: off; 1..4: forced
   * (sampled output then reproducible for a given seed and k).
   * Lossless: every verified row is bit-identical to single-token decode, so greedy output equals
   * mtp = 0 exactly, and sampled output follows the same distribution (speculative-sampling rule).
   * Ignored when the model has no MTP module. */
  int mtp;
} floe_gen_params;
void floe_gen_params_init(floe_gen_params *p);

enum floe_finish { FLOE_FINISH_NONE = 0, FLOE_FINISH_STOP, FLOE_FINISH_LENGTH, FLOE_FINISH_CANCELLED };

/* One generated token. text: the bytes this token makes visible, always whole UTF-8 characters
 * (an incomplete character is held back until it completes) and never part of a stop string. */
typedef struct floe_token_event {
  int32_t id;
  const char *text;
  size_t text_len;
  float logprob;                  /* when logprobs */
  int n_top;
  const int32_t *top_ids;         /* n_top alternatives, best first */
  const float *top_logprobs;
} floe_token_event;
/* Return non-zero to stop generation (finish = CANCELLED). */
typedef int (*floe_token_cb)(void *user, const floe_token_event *ev);

typedef struct floe_gen_result {
  int64_t n_prompt;    /* prompt tokens */
  int64_t n_reused;    /* prompt tokens whose state was reused from the session (prefix cache) */
  int64_t n_gen;       /* generated tokens (including a final end-of-generation token) */
  int finish;          /* enum floe_finish */
  double prefill_s, decode_s;
} floe_gen_result;

/* Runs prompt, then samples until end of generation, a stop string, max_tokens or the callback
 * says stop. Prefix cache: the session's state is reused up to the common prefix of its history
 * and the prompt (all of it when the history is a prefix of the prompt; else up to the largest
 * restorable position, see floe_session_reusable); the result is bit-identical to a cold run. */
int floe_generate(floe_session *s, const int32_t *prompt, size_t n_prompt, const floe_gen_params *p,
                  floe_token_cb cb, void *user, floe_gen_result *res, char *err, size_t errlen);

/* ---- several generations stepped together (continuous batching) ----
 * floe_generate is floe_gen_begin, floe_gen_step until floe_gen_done, then floe_gen_end. A server
 * steps the generations of several sessions together: each step evaluates the next rows of all of
 * them (one prompt chunk, or the last chosen token) in ONE batched forward pass where the backend
 * supports it (the token mixers per session, the MoE and the logits over all rows), so a request
 * joins or leaves between steps and a long prompt delays the others by at most one chunk. Every
 * row is computed exactly as alone, so a generation's output does not depend on what runs beside
 * it (nor on the chunk size). Speculative decoding (mtp) is used only in steps where the
 * generation is the only one that is not done; its output is the same either way. */
typedef struct floe_gen floe_gen;
/* Starts a generation on s (prefix reuse as floe_generate; nothing evaluated yet). p's stop
 * strings, cb and user must stay valid until floe_gen_end; the prompt is copied. */
int floe_gen_begin(floe_session *s, const int32_t *prompt, size_t n_prompt, const floe_gen_params *p,
                   floe_token_cb cb, void *user, floe_gen **out, char *err, size_t errlen);
/* What one step evaluated: the rows and sessions of its largest forward pass (sessions > 1: a
 * batched pass), and the rows evaluated in all. */
typedef struct floe_step_info {
  int64_t rows, rows_total;
  int sessions;
} floe_step_info;
/* One step of the generations g[0..n) (on distinct sessions of one engine; those already done are
 * skipped): each emits its next token (callbacks run here) or takes its next prompt chunk of at
 * most prefill_chunk tokens (<= 0 or more than the session's chunk: the session's chunk, 512 rows
 * on the CPU, up to FLOE_CUDA_CHUNK on a GPU), then all rows are evaluated.
 * info may be NULL. An evaluation error ends the generations of that pass (floe_gen_end returns
 * it). Returns 0. */
int floe_gen_step(floe_gen *const *g, int n, int64_t prefill_chunk, floe_step_info *info);
bool floe_gen_done(const floe_gen *g);
/* True while the generation still has prompt tokens to evaluate (its next step is a chunk). */
bool floe_gen_prefilling(const floe_gen *g);
/* Frees the generation: its status (0 or the error that ended it, message in err) and *res. */
int floe_gen_end(floe_gen *g, floe_gen_result *res, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
