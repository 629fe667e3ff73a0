/* The MTP (multi-token prediction) module of Qwen3-Next and Qwen3.5: binding and forward.
 *
 * Math (Qwen3.5's MTP, as HF-style reference code and the default model's training recipe use it;
 * one block, shared embedding and lm_head):
 *   u_t   = fc( concat( enorm(embed(x_{t+1})), hnorm(h_t) ) )     embedding FIRST, fc [E][2E]
 *   u_t  += attn(norm(u_t))        the block's own gated full attention (its own KV cache, RoPE
 *   u_t  += moe(norm(u_t))         at position t), then MoE + sigmoid-gated shared expert
 *   g_t   = norm_mtp(u_t);  logits_t = lm_head(g_t)   -> predicts x_{t+2}
 * h_t is the trunk's FINAL-NORMED hidden state at position t (output_norm applied), so every
 * input row is normed; for a chained draft (k > 1) the module's own g_t takes h's place at the
 * next position, as SGLang / vLLM chain it (their MTP returns the normed hidden).
 * Norms are zero-centred (HF stores w, GGUF/MLX 1+w; held as 1+w here like every norm).
 *
 * Names: GGUF blk.{n_layer}.nextn.{eh_proj, enorm, hnorm, shared_head_norm} plus that block's
 * ordinary attention / MoE / shared-expert tensors; HF mtp.{fc, pre_fc_norm_embedding,
 * pre_fc_norm_hidden, norm} and mtp.layers.0.* (model_lname maps layer n_layer there). MLX
 * conversions (mlx-lm) drop mtp.*: such a directory simply has no MTP (n_mtp becomes 0); one that
 * keeps them under the HF names binds like HF, quantized or not.
 *
 * Memory and devices: the block's attention cache is layer n_layer of the session's kv_state
 * (kv.c). Under a memory budget its routed experts are streamed like the trunk's: they are layer
 * n_layer of the expert store (model_xs_view) and share the cache; an evaluation holds the stream
 * (xs_lock) like model_eval does. Exception: a model bound to a `floe pack` directory, whose pack
 * holds the trunk's experts only, uses the MTP block's in place through the source's mapping (not
 * counted in the budget). The forward runs the backend's attention / moe blocks; the fc and the
 * norms run on the host for the CPU backend (layers.c), on the device for a backend that has
 * mtp_begin / mtp_end (CUDA: the same operations, backend_cuda.c). model_spec_greedy hands a whole
 * greedy speculative step (MTP rows, chained drafts, verify, accept count) to a backend that runs
 * it as one device pass (backend.h spec_greedy) and keeps model_verify's bookkeeping. */
#include <stdio.h>
#include <string.h>

#include "experts/experts.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/model.h"

bool model_has_mtp(const model *m) { return m->mtp.on; }

bool model_mtp_runs(const model *m) {
  const model_backend *be = m->be;
  return m->mtp.on && be->keep_begin && be->keep_accept &&
         (be->device == MODEL_DEV_CPU || (be->mtp_begin && be->mtp_end));
}

void model_final_norm(const model *m, const float *x, int64_t n, float *y) {
  const int64_t E = m->hp.n_embd;
  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, m->output_norm, E, m->hp.rms_eps, y + t * E);
}

int model_mtp_bind(model *m, const model_src *src, char *err, size_t errlen) {
  floe_hparams *hp = &m->hp;
  if (hp->n_mtp <= 0 || (hp->arch != FLOE_ARCH_QWEN3NEXT && hp->arch != FLOE_ARCH_QWEN35MOE)) {
    hp->n_mtp = 0;
    return 0;
  }
  const int64_t l = hp->n_layer, E = hp->n_embd;
  char fc[128];
  if (src->kind == MODEL_SRC_GGUF) snprintf(fc, sizeof fc, "blk.%lld.nextn.eh_proj.weight", (long long)l);
  else snprintf(fc, sizeof fc, "mtp.fc.weight");
  if (!model_src_has(src, fc) || l + 1 >= FLOE_MAX_LAYERS) { /* declared but not shipped (transformers, mlx-lm drop it) */
    hp->n_mtp = 0;
    return 0;
  }
  hp->recurrent[l] = false;
  const float add = (src->kind == MODEL_SRC_HF && !src->mlx) ? 1.0f : 0.0f;
  int rc;
  char a[128], b[128], c[128];
  if (src->kind == MODEL_SRC_GGUF) {
    snprintf(a, sizeof a, "blk.%lld.nextn.enorm.weight", (long long)l);
    snprintf(b, sizeof b, "blk.%lld.nextn.hnorm.weight", (long long)l);
    snprintf(c, sizeof c, "blk.%lld.nextn.shared_head_norm.weight", (long long)l);
  } else {
    snprintf(a, sizeof a, "mtp.pre_fc_norm_embedding.weight");
    snprintf(b, sizeof b, "mtp.pre_fc_norm_hidden.weight");
    snprintf(c, sizeof c, "mtp.norm.weight");
  }
  if ((rc = model_bind_mat(m, src, fc, E, 2 * E, &m->mtp.fc, err, errlen)) ||
      (rc = model_bind_vec(m, src, a, E, add, &m->mtp.enorm, err, errlen)) ||
      (rc = model_bind_vec(m, src, b, E, add, &m->mtp.hnorm, err, errlen)) ||
      (rc = model_bind_vec(m, src, c, E, add, &m->mtp.norm, err, errlen)) ||
      (rc = model_bind_common(m, src, l, true, err, errlen)))
    return rc;
  if (hp->n_mtp > 1) hp->n_mtp = 1; /* only the first block is used (every shipped model has one) */
  m->mtp.on = true;
  return 0;
}

int model_mtp_eval(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0, int64_t first,
                   float *logits, float *h_out, char *err, size_t errlen) {
  const model *m = s->m;
  const floe_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd, V = hp->n_vocab, l = hp->n_layer;
  if (!m->mtp.on) return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "the model has no MTP module");
  const bool dev = s->be->mtp_begin != NULL; /* the fc and the norms on the backend's device */
  if (!dev && s->be->device != MODEL_DEV_CPU)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "MTP: the %s backend does not run the MTP block", s->be->name);
  if (n < 1 || n > MODEL_MAX_BATCH || 2 * n > MODEL_MAX_BATCH * hp->n_expert_used || pos0 < 0 || pos0 + n > s->kv.n_ctx || first < 0 || first > n)
    return floe_err(err, errlen, FLOE_E_INVALID, "MTP: %lld rows at position %lld do not fit the context of %lld",
                    (long long)n, (long long)pos0, (long long)s->kv.n_ctx);
  for (int64_t t = 0; t < n; t++)
    if (tok[t] < 0 || tok[t] >= V) return floe_err(err, errlen, FLOE_E_INVALID, "MTP: token %d out of range", tok[t]);
  int rc0 = model_ahead_drop(s, err, errlen);
  if (!rc0) rc0 = model_logits_settle(s, logits, err, errlen); /* the device's logits are rewritten */
  if (rc0) return rc0;
  const double t0 = floe_time_s();
  if (dev) {
    const int flags = (logits && n - first > 0 ? MODEL_EVAL_LOGITS : 0) | (h_out ? MODEL_EVAL_HIDDEN : 0);
    float *x = s->be->mtp_begin(s, tok, h, n, pos0, first, flags);
    if (m->xs) xs_lock(m->xs);
    s->xs_err = 0;
    s->be->attention(s, l, x, n, pos0, true);
    s->be->moe(s, l, x, n);
    if (m->xs) xs_unlock(m->xs);
    int rc = s->be->mtp_end(s, x, n, first, logits, h_out, err, errlen); /* ends the step in any case */
    if (s->xs_err) rc = floe_err(err, errlen, s->xs_err, "%s", s->xs_msg);
    s->ph[MODEL_PH_OTHER] += floe_time_s() - t0;
    return rc;
  }
  /* concat rows [enorm(embed) | hnorm(h)] in s->contrib ([B*K][E] >= [B][2E] since K >= 2 here) */
  float *cat = s->contrib, *x = s->x;
  for (int64_t t = 0; t < n; t++) {
    float *row = cat + t * 2 * E;
    model_embed_row(m, tok[t], s->h);
    layer_rmsnorm(s->h, m->mtp.enorm, E, hp->rms_eps, row);
    layer_rmsnorm(h + t * E, m->mtp.hnorm, E, hp->rms_eps, row + E);
  }
  layer_matmul(s, &m->mtp.fc, n, cat, 2 * E, x, E);
  if (m->xs) xs_lock(m->xs); /* one evaluation at a time per stream (experts.h) */
  s->xs_err = 0;
  s->be->attention(s, l, x, n, pos0, true);
  s->be->moe(s, l, x, n);
  if (m->xs) xs_unlock(m->xs);
  if (s->xs_err) return floe_err(err, errlen, s->xs_err, "%s", s->xs_msg);
  float *g = h_out ? h_out : s->y;
  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, m->mtp.norm, E, hp->rms_eps, g + t * E);
  if (logits && n - first > 0) layer_matmul(s, &m->output, n - first, g + first * E, E, logits, V);
  s->ph[MODEL_PH_OTHER] += floe_time_s() - t0;
  return 0;
}

bool model_spec_fused(const model_session *s) {
  return s->m->mtp.on && s->be->spec_greedy && s->be->keep_accept && s->spec_fused;
}

int model_spec_greedy(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0, int k,
                      int32_t *draft, int32_t *amax, int64_t *acc, float *hidden, float *logits, char *err,
                      size_t errlen) {
  const model *m = s->m;
  const int64_t V = m->hp.n_vocab, P = s->kv.n_past;
  if (!model_spec_fused(s))
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "speculative step: the %s backend has no one-pass step", s->be->name);
  if (k < 1 || k + 1 > KV_KEEP_MAX || n < 1 || n > KV_KEEP_MAX || pos0 < 0 || pos0 + n != P || P + k + 1 > s->kv.n_ctx)
    return floe_err(err, errlen, FLOE_E_INVALID,
                    "speculative step: %d drafts after %lld MTP rows at %lld (session at %lld of %lld)", k,
                    (long long)n, (long long)pos0, (long long)P, (long long)s->kv.n_ctx);
  for (int64_t t = 0; t < n; t++)
    if (tok[t] < 0 || tok[t] >= V) return floe_err(err, errlen, FLOE_E_INVALID, "MTP: token %d out of range", tok[t]);
  if (m->gguf && gguf_check_unchanged(m->gguf, err, errlen)) return FLOE_E_IO; /* as model_eval_h */
  if (m->st && st_model_check_unchanged(m->st, err, errlen)) return FLOE_E_IO;
  int rc0 = model_ahead_drop(s, err, errlen);
  if (!rc0) rc0 = model_logits_settle(s, logits, err, errlen); /* the device's logits are rewritten */
  if (rc0) return rc0;
  const double t0 = floe_time_s();
  if (m->xs) xs_lock(m->xs);
  s->xs_err = 0;
  s->greedy = -1;
  int rc = s->be->spec_greedy(s, tok, h, n, pos0, k, draft, amax, acc, hidden, logits, err, errlen);
  if (m->xs) xs_unlock(m->xs);
  if (!rc && s->xs_err) {
    s->be->keep_accept(s, 0);
    rc = floe_err(err, errlen, s->xs_err, "%s", s->xs_msg);
  }
  if (rc) return rc;
  s->verify_pos0 = P; /* pending until model_verify_accept, as model_verify leaves it */
  s->verify_n = k + 1;
  s->greedy = amax[*acc];
  s->n_eval_tok += k + 1;
  s->ph[MODEL_PH_OTHER] += floe_time_s() - t0;
  return 0;
}
