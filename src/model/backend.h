/* The backend seam: the block operations of a forward pass, one table per device.
 *
 * The architecture files (arch/<arch>.c) build a layer from these blocks and never touch a device;
 * model_eval (model.c) drives a chunk of tokens through them: eval_begin, embed, the arch's layers,
 * then logits / hidden, eval_end. A backend owns everything of a session that lives on its device:
 * the KV cache and recurrent state, the scratch, and the copies of the recurrent state that
 * checkpoints keep. The CPU backend (backend_cpu.c, the block math in layers.c) is the reference
 * implementation; every other backend is checked against it op by op.
 *
 * The residual stream `x` handed to the blocks is the backend's own buffer ([B][n_embd] floats in
 * the backend's memory: host memory for the CPU, device memory for CUDA): only the backend reads
 * or writes it. Tokens, logits and hidden states cross the seam in host memory.
 *
 * Row-exactness is every backend's contract: the n rows of one call give, row for row, the bits
 * that n calls of one row give (model.h). */
#ifndef FLOE_BACKEND_H
#define FLOE_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct model model;
typedef struct model_session model_session;
typedef struct kv_ckpt kv_ckpt;
typedef struct model_rows model_rows;

enum model_device { MODEL_DEV_CPU = 0, MODEL_DEV_CUDA = 1 };
/* MODEL_EVAL_LAZY (with LOGITS, one row: the greedy pick of the evaluation's last position): the
 * logits may stay on the device; eval_end then sets s->lazy_dst (the logits buffer they belong
 * in) and logits_fetch copies them there when the model layer is asked (model_logits_sync). */
enum { MODEL_EVAL_LOGITS = 1, MODEL_EVAL_HIDDEN = 2, MODEL_EVAL_LAZY = 4, MODEL_EVAL_NOWAIT = 8, MODEL_EVAL_AHEAD = 16 };
/* Decoding ahead (model.c eval_ahead; only where the backend has pick_wait):
 *   MODEL_EVAL_NOWAIT (with LOGITS | LAZY, one row): eval_end launches the step and returns at once;
 *   its greedy pick is collected by pick_wait (s->greedy), its logits stay on the device (lazy).
 *   MODEL_EVAL_AHEAD (with LOGITS | LAZY | NOWAIT, one row, inside keep_begin(1)): the step's token is
 *   the greedy pick of the step launched just before it, which the host has not read yet (the
 *   device passes it on), at that step's position + 1; the tokens handed to eval_begin / embed are
 *   ignored. Its recurrent state is kept as a verify row's: ahead_end(true) makes it the current one
 *   (and its pick and logits the session's, collected by pick_wait), ahead_end(false) drops it. */

typedef struct model_backend {
  const char *name;          /* "cpu", "cuda" */
  int device;                /* enum model_device */
  /* Per-model state (the weights' device copies): model_use_backend calls model_init once the
   * model is bound, model_free calls model_fini. NULL: nothing to do (the CPU uses the binding). */
  int (*model_init)(model *m, int dev_index, char *err, size_t errlen);
  void (*model_fini)(model *m);
  /* Per-session state (KV, recurrent state, scratch): made by model_session_new after the
   * generic fields are set (s->m, s->kv's dimensions and n_ctx), freed by model_session_free. */
  int (*session_init)(model_session *s, int n_threads, char *err, size_t errlen);
  void (*session_free)(model_session *s);
  /* Forgets every token: the recurrent state is zeroed (attention rows past n_past are dead). */
  void (*state_reset)(model_session *s);
  /* Checkpoints: an exact copy of the recurrent state at the current position (kv.h kv_ckpt:
   * c->data is the backend's; ckpt_free releases it). */
  size_t (*ckpt_bytes)(const model_session *s);
  int (*ckpt_save)(model_session *s, kv_ckpt *c);
  void (*ckpt_restore)(model_session *s, const kv_ckpt *c);
  void (*ckpt_free)(model_session *s, kv_ckpt *c);
  /* One chunk of n tokens at positions pos0..pos0+n-1 (flags: MODEL_EVAL_*, what the driver will
   * ask of the chunk). eval_begin returns the residual buffer; eval_end finishes the chunk: the
   * logits, greedy pick and hidden states asked for are in host memory after it. Between them the
   * driver calls embed, the arch's layers, then logits / hidden (a backend that replays a
   * recorded step may ignore those calls: backend_cuda.c). */
  float *(*eval_begin)(model_session *s, const int32_t *tokens, int64_t n, int64_t pos0, int flags);
  int (*eval_end)(model_session *s, int64_t n, char *err, size_t errlen);
  /* x[t] = embedding of tokens[t], t < n */
  void (*embed)(model_session *s, const int32_t *tokens, int64_t n, float *x);
  /* x += attn(norm(x)) (gated: sigmoid output gate of qwen3next / qwen35moe) */
  void (*attention)(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0, bool gated);
  /* x += gdn(norm(x)): the GatedDeltaNet layer, recurrent state advanced token by token */
  void (*gdn)(model_session *s, int64_t l, float *x, int64_t n);
  /* x += moe(norm(x)): router, exact top-k, routed experts, sigmoid-gated shared expert */
  void (*moe)(model_session *s, int64_t l, float *x, int64_t n);
  /* Rows [first, n) of the chunk: logits[t - first] = output(norm(x[t])) into host memory
   * (n_vocab floats a row). greedy: also the argmax of the last row (s->greedy). */
  void (*logits)(model_session *s, const float *x, int64_t first, int64_t n, float *logits, bool greedy);
  /* The logits a MODEL_EVAL_LAZY evaluation left on the device (its one row) into dst (host). NULL:
   * the backend never defers them. 0 or FLOE_E_*. */
  int (*logits_fetch)(model_session *s, float *dst, char *err, size_t errlen);
  /* Speculative verify (model_verify, kv.h "kept states"): the next chunk of n rows (<= KV_KEEP_MAX)
   * keeps the GatedDeltaNet state (S and conv window) after each of its rows in per-row buffers
   * instead of advancing it in place: row 0 reads the current state, row t reads row t-1's. The
   * arithmetic is the in-place one. 0 or FLOE_E_*. */
  int (*keep_begin)(model_session *s, int64_t n);
  /* Ends the kept chunk: the state after row a-1 becomes the current one by swapping pointers
   * with the per-row buffer (a = 0: the state before the chunk stays). Never copies the state. */
  void (*keep_accept)(model_session *s, int64_t a);
  /* The MTP block's input and output (mtp.c model_mtp_eval) on the backend's device; NULL: mtp.c
   * computes them on the host with layers.c (the CPU backend). mtp_begin starts an evaluation of
   * n rows at MTP positions pos0.. and returns the residual buffer with
   * x[t] = fc(concat(enorm(embed(tok[t])), hnorm(h[t]))) (h: host rows) and the MTP layer's
   * normed attention input prepared; the driver then calls attention and moe with l = n_layer.
   * first and flags (MODEL_EVAL_LOGITS: logits wanted, MODEL_EVAL_HIDDEN: h_out wanted) say
   * what mtp_end will be asked (a backend may record the evaluation as one step). mtp_end
   * finishes it: g = norm(x) into h_out (host, may be NULL), the logits of rows [first, n) of g
   * into logits (host, may be NULL). 0 or FLOE_E_*. */
  float *(*mtp_begin)(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0, int64_t first,
                      int flags);
  int (*mtp_end)(model_session *s, float *x, int64_t n, int64_t first, float *logits, float *h_out, char *err,
                 size_t errlen);
  /* A greedy speculative step in one device pass (mtp.c model_spec_greedy has the contract; NULL:
   * the engine composes mtp_begin / mtp_end, model_verify and host argmaxes, one host round trip
   * each). Only used where session_init set s->spec_fused. The MTP rows tok/h (host, n rows at
   * pos0..) give draft 1 from their last row, drafts 2..k chain on the device (each draft's
   * argmax is the next row's token, its normed output the next row's h), then the trunk verifies
   * [tok[n-1], d_1..d_k] as a kept chunk (keep_begin) at n_past..; the argmax of each verify row,
   * the accept count, the rows' hidden states and the accepted row's logits come back in one
   * synchronization. On error no chunk is left kept. 0 or FLOE_E_*. */
  int (*spec_greedy)(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0, int k,
                     int32_t *draft, int32_t *amax, int64_t *acc, float *hidden, float *logits, char *err,
                     size_t errlen);
  /* The final hidden states (the residual stream after the last layer, before the output norm)
   * of rows [first, n) into host memory (n_embd floats a row). */
  void (*hidden)(model_session *s, const float *x, int64_t first, int64_t n, float *dst);
  /* Decoding ahead (the flags above; NULL: the backend never runs ahead). ahead_ok: whether a
   * MODEL_EVAL_AHEAD step may follow now at position pos (the last evaluation was a NOWAIT one-row
   * step or an accepted ahead step at pos - 1, and nothing else ran since; pos < 0: whether this
   * session can decode ahead at all, a step in flight or not). pick_wait: waits for the
   * last NOWAIT step (or accepted ahead step) whose pick was not collected; s->greedy = its pick.
   * ahead_end: the ahead step in flight becomes the session's (accept: its state by keep_accept(1)'s
   * swap, queued behind it, nothing waits) or is dropped (waits for it, then keep_accept(0)).
   * 0 or FLOE_E_*. */
  bool (*ahead_ok)(const model_session *s, int64_t pos);
  int (*pick_wait)(model_session *s, char *err, size_t errlen);
  int (*ahead_end)(model_session *s, bool accept, char *err, size_t errlen);
  /* Multi-session evaluation (model_eval_multi; NULL: the backend cannot, and the sessions are
   * evaluated one after another). Returns lead's residual buffer for a pass of n rows
   * (n <= MODEL_MAX_BATCH) that holds the rows of several sessions of one model, one segment after
   * another. The driver then calls embed, moe, logits and eval_end with lead on all n rows, and
   * attention / gdn with each segment's own session on its rows of that buffer (x offset by the
   * segment's first row): those blocks must use only the session's own state and scratch besides
   * the rows they are given. r / k: the pass's segments (model.h model_rows), first: the first
   * row whose logits the pass asks for (n: none), so that a backend can replay a recorded pass of
   * the same segments. */
  float *(*multi_begin)(model_session *lead, const model_rows *r, int k, int64_t n, int64_t first);
  /* Optional with multi_begin (NULL: always): false when lead's backend declines a multi-session
   * pass (the sessions are then evaluated one after another). */
  bool (*multi_ok)(const model_session *lead);
  /* Optional with multi_begin (NULL: the driver calls attention / gdn per segment): the mixer
   * over the rows of several sessions at once, the projections over all n rows in lead's scratch
   * and the cache / recurrent part per segment (model.h model_rows). */
  void (*attention_multi)(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t n,
                          bool gated);
  void (*gdn_multi)(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t n);
} model_backend;

extern const model_backend model_backend_cpu;
#ifdef FLOE_HAVE_CUDA
extern const model_backend model_backend_cuda;
#endif
#endif
