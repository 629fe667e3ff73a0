/* qwen35moe (Qwen3.5 / Qwen3.6 MoE: 35B-A3B ... 397B-A17B): same layer stack as qwen3next (3 GDN +
 * 1 gated full attention, MoE + shared expert, zero-centred norms, partial RoPE; the text-only
 * interleaved mRoPE equals 1-D RoPE because all three position axes are equal), but the GDN input
 * projections are separate: HF in_proj_qkv (q | k | v), in_proj_z, in_proj_b, in_proj_a; GGUF
 * attn_qkv, attn_gate, ssm_beta, ssm_alpha. Top-k weights are always renormalised.
 * Value-head order: llama.cpp's converter reorders V heads from HF's grouped order (value head hv
 * uses key head hv / r) to tiled order (hv uses key head hv % Nk; _LinearAttentionVReorderBase in
 * conversion/qwen.py). Tiled is floe's canonical layout for this architecture: from HF and MLX
 * directories the same permutation is applied at load time (model_vtile_*), so every source runs
 * identical arithmetic (HF and GGUF F32 logits are bit-identical). HF checkpoints of the VLM
 * prefix names with model.language_model., MLX with language_model.model. (model.c). */
#include "model/model.h"

#define NM(g, h) model_lname(src, l, g, h, nm, sizeof nm)

static int bind(model *m, const model_src *src, char *err, size_t errlen) {
  floe_hparams *hp = &m->hp;
  int rc;
  if (!hp->attn_gate || hp->n_ff_shexp <= 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "qwen35moe: needs the gated attention and a shared expert");
  hp->norm_topk = true;
  m->v_tiled = true;
  if ((rc = model_bind_common(m, src, -1, true, err, errlen))) return rc;
  const int64_t E = hp->n_embd, Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state, vd = hp->ssm_d_inner;
  const int64_t dv = vd / Nv, K = hp->ssm_conv_kernel;
  char nm[256];
  for (int64_t l = 0; l < hp->n_layer; l++) {
    model_layer *L = &m->layers[l];
    if ((rc = model_bind_common(m, src, l, true, err, errlen))) return rc;
    if (!hp->recurrent[l]) continue;
    if ((rc = model_bind_gdn_common(m, src, l, err, errlen))) return rc;
    if ((rc = model_bind_mat(m, src, NM("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"), 2 * Nk * dk + vd, E,
                             &L->ssm_qkv, err, errlen)) ||
        (rc = model_bind_mat(m, src, NM("attn_gate.weight", "linear_attn.in_proj_z.weight"), vd, E, &L->ssm_z, err,
                             errlen)) ||
        (rc = model_bind_mat(m, src, NM("ssm_beta.weight", "linear_attn.in_proj_b.weight"), Nv, E, &L->ssm_b, err,
                             errlen)) ||
        (rc = model_bind_mat(m, src, NM("ssm_alpha.weight", "linear_attn.in_proj_a.weight"), Nv, E, &L->ssm_alpha,
                             err, errlen)))
      return rc;
    if (src->kind == MODEL_SRC_GGUF) continue; /* llama.cpp's converter already tiled them */
    if ((rc = model_vtile_rows(m, &L->ssm_qkv, 2 * Nk * dk, Nk, Nv, dv, err, errlen)) ||
        (rc = model_vtile_rows(m, &L->ssm_z, 0, Nk, Nv, dv, err, errlen)) ||
        (rc = model_vtile_rows(m, &L->ssm_b, 0, Nk, Nv, 1, err, errlen)) ||
        (rc = model_vtile_rows(m, &L->ssm_alpha, 0, Nk, Nv, 1, err, errlen)) ||
        (rc = model_vtile_cols(m, &L->ssm_out, Nk, Nv, dv, err, errlen)))
      return rc;
    if ((rc = model_vtile_vec(L->conv_w + 2 * Nk * dk * K, Nk, Nv, dv * K)) ||
        (rc = model_vtile_vec(L->dt_bias, Nk, Nv, 1)) || (rc = model_vtile_vec(L->ssm_a, Nk, Nv, 1)))
      return floe_err(err, errlen, rc, "layer %lld: value-head reorder failed", (long long)l);
  }
  return 0;
}

const model_arch model_arch_qwen35moe = { FLOE_ARCH_QWEN35MOE, bind, model_hybrid_mixer, model_moe_ffn,
                                          model_hybrid_mixer_multi };
