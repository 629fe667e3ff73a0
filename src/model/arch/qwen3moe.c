/* qwen3moe (Qwen3-30B-A3B, 235B-A22B): every layer full attention (no output gate, RoPE on all
 * head dims, θ 1e6) + MoE (softmax -> top-k -> renormalise, no shared expert). Norms are plain
 * Llama RMSNorm (weight stored as is in HF and GGUF), q_norm/k_norm per head.
 * Tensor names: HF model.layers.L.{input_layernorm, post_attention_layernorm, self_attn.*_proj,
 * self_attn.{q,k}_norm, mlp.gate, mlp.experts.*}; GGUF blk.L.{attn_norm, ffn_norm, attn_*,
 * ffn_gate_inp, ffn_*_exps} (model/tensors.c). */
#include "model/model.h"

static int bind(model *m, const model_src *src, char *err, size_t errlen) {
  int rc;
  if (m->hp.attn_gate || m->hp.n_ff_shexp > 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "qwen3moe: unexpected output gate or shared expert");
  for (int64_t l = 0; l < m->hp.n_layer; l++)
    if (m->hp.recurrent[l]) return floe_err(err, errlen, FLOE_E_FORMAT, "qwen3moe: layer %lld marked recurrent", (long long)l);
  if ((rc = model_bind_common(m, src, -1, false, err, errlen))) return rc;
  for (int64_t l = 0; l < m->hp.n_layer; l++)
    if ((rc = model_bind_common(m, src, l, false, err, errlen))) return rc;
  return 0;
}

static void mixer(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0) {
  s->be->attention(s, l, x, n, pos0, false);
}

/* no layer is recurrent (bind), so this is always the attention branch */
static void mixer_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N) {
  model_mixer_multi(lead, r, k, l, x, N, false);
}

const model_arch model_arch_qwen3moe = { FLOE_ARCH_QWEN3MOE, bind, mixer, model_moe_ffn, mixer_multi };
