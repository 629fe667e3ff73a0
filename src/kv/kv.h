/* Per-sequence state of a model: the KV cache of the full-attention layers, and the recurrent
 * state S and causal-conv window of the GatedDeltaNet layers.
 *
 * Layout (indexed by trunk layer; arrays of the other layer kind are NULL):
 *   k[l], v[l]:   [n_head_kv][n_ctx][head_dim], F32 or BF16 (kv_type), head-major: the rows one
 *                 kv head's attention reads are contiguous (position-major rows interleaved the
 *                 heads, and each core's hardware prefetcher fetched the other head's halves too).
 *   ssm[l]:       [Nv][dk][dv] float32 (HF Qwen3NextGatedDeltaNet layout: S^T k reads columns).
 *   conv[l]:      [K-1][C] float32, the last K-1 RAW (pre-conv) qkv vectors, oldest first.
 * n_past counts the positions already processed. kv_reset() zeroes the recurrent state and
 * n_past; the attention cache needs no clearing (only positions < n_past are read).
 *
 * Rewinding: attention rows at positions >= n_past are dead, so moving n_past back is enough for
 * attention layers. The GDN state cannot be rewound (S mixes every token into one matrix), so a
 * kv_ckpt keeps an exact copy (memcpy of the F32 buffers) of every recurrent layer's S and conv
 * window at one position; restoring it and setting n_past to that position gives the state a run
 * of the same tokens would have had, bit for bit.
 *
 * Kept states (speculative verify): with kv_keep_begin(n), the next chunk of n tokens leaves ssm[l]
 * and conv[l] untouched and writes the state after its row t into keep_ssm[l][t] / keep_conv[l][t]
 * (row 0 reads ssm[l], row t > 0 reads row t-1's kept state). kv_keep_accept(a) then makes the
 * state after row a-1 the current one by swapping pointers (no copy), or keeps the state before
 * the chunk (a = 0). The chunk's attention rows are written as usual; n_past is the caller's.
 * The MTP block (model.h) has one attention cache at index n_layer, allocated when hp->n_mtp > 0
 * (positions are MTP rows; the trunk's checkpoints never cover it).
 *
 * Memory: kv_state owns every buffer (the kept states too, whichever pointer they sit behind
 * after swaps); kv_free() releases them. A kv_ckpt owns its data. */
#ifndef FLOE_KV_H
#define FLOE_KV_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/hparams.h"

enum kv_type { KV_F32 = 0, KV_BF16 = 1 };

#define KV_KEEP_MAX 8 /* rows of one verify chunk whose recurrent states can be kept (1 + drafts) */

typedef struct kv_state {
  int kv_type;          /* enum kv_type */
  int64_t n_ctx;        /* positions the attention cache holds */
  int64_t n_layer;
  int64_t n_head_kv, head_dim;
  int64_t ssm_n, ssm_dk, ssm_dv; /* Nv, dk, dv */
  int64_t conv_k, conv_c;        /* kernel K, channels C */
  void *k[FLOE_MAX_LAYERS], *v[FLOE_MAX_LAYERS];
  float *ssm[FLOE_MAX_LAYERS];
  float *conv[FLOE_MAX_LAYERS];
  bool rec[FLOE_MAX_LAYERS];     /* layer l is recurrent (GatedDeltaNet) */
  float *keep_ssm[FLOE_MAX_LAYERS][KV_KEEP_MAX];  /* per-row states of a verify chunk (kv_keep_*) */
  float *keep_conv[FLOE_MAX_LAYERS][KV_KEEP_MAX];
  int64_t keep_n;       /* rows of the current chunk whose states are kept (0: update in place) */
  int64_t keep_alloc;   /* rows allocated in keep_* */
  int64_t n_past;
  size_t bytes;         /* total allocated */
} kv_state;

/* Fills the dimensions for hp without allocating any buffer (a backend that keeps the state in
 * its own memory uses them). 0 or FLOE_E_INVALID. */
int kv_init_dims(kv_state *kv, const floe_hparams *hp, int64_t n_ctx, int kv_type, char *err, size_t errlen);
/* Allocates the state for hp (attention layers: !hp->recurrent[l]). 0 or FLOE_E_*. */
int kv_init(kv_state *kv, const floe_hparams *hp, int64_t n_ctx, int kv_type, char *err, size_t errlen);
void kv_free(kv_state *kv);
void kv_reset(kv_state *kv);

/* A copy of the recurrent state (S and conv window of every GDN layer) after `pos` positions. */
typedef struct kv_ckpt {
  int64_t pos;   /* positions the copy covers; -1: slot unused */
  float *data;   /* kv_ckpt_bytes(); allocated by the first save */
} kv_ckpt;
/* Bytes one checkpoint holds (0 when the model has no recurrent layer: nothing to save). */
size_t kv_ckpt_bytes(const kv_state *kv);
/* Copies the current recurrent state into c (allocating c->data on first use); c->pos = n_past.
 * 0 or FLOE_E_NOMEM (c unchanged then). */
int kv_ckpt_save(const kv_state *kv, kv_ckpt *c);
/* Restores c's recurrent state and sets n_past = c->pos (c->pos <= n_past: attention rows at
 * positions < c->pos are the same tokens' rows, the caller guarantees it). */
void kv_ckpt_restore(kv_state *kv, const kv_ckpt *c);
void kv_ckpt_free(kv_ckpt *c);

/* The next chunk of n (1..KV_KEEP_MAX) tokens keeps the recurrent state after each row (buffers
 * allocated on first use); n = 0 turns it off. 0 or FLOE_E_NOMEM / FLOE_E_INVALID. */
int kv_keep_begin(kv_state *kv, int64_t n);
/* Ends a kept chunk: the state after row a-1 becomes current (pointer swap), a = 0 keeps the
 * state before the chunk. Turns keeping off. */
void kv_keep_accept(kv_state *kv, int64_t a);
/* The state pointers row t of a kept chunk reads (t = 0: the current ones) and writes. */
float *kv_ssm_in(const kv_state *kv, int64_t l, int64_t t);
float *kv_ssm_out(const kv_state *kv, int64_t l, int64_t t);
float *kv_conv_in(const kv_state *kv, int64_t l, int64_t t);
float *kv_conv_out(const kv_state *kv, int64_t l, int64_t t);

/* Store one position's K and V rows (n_head_kv * head_dim floats each, heads in order) of
 * attention layer l. */
void kv_put(const kv_state *kv, int64_t l, int64_t pos, const float *krow, const float *vrow);
/* Head kh's [n_ctx][head_dim] rows of layer l's K (v false) or V cache (float or bfloat16). */
const void *kv_head_rows(const kv_state *kv, int64_t l, bool v, int64_t kh);
#endif
