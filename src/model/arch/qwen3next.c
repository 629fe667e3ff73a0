/* qwen3next (Qwen3-Next-80B-A3B): hybrid, 3 GatedDeltaNet layers then 1 gated full-attention
 * layer; every layer MoE with a sigmoid-gated shared expert. Zero-centred norms (HF stores w,
 * GGUF 1+w). Partial RoPE (64 of 256 dims, NeoX), θ 1e7.
 * GDN projections: HF in_proj_qkvz / in_proj_ba grouped per key head g
 *   qkvz: [q_g(dk) | k_g(dk) | v_g(r*dv) | z_g(r*dv)],  ba: [b_g(r) | a_g(r)]
 * (HF Qwen3NextGatedDeltaNet.fix_query_key_value_ordering); llama.cpp's converter splits qkvz into
 * attn_qkv (q | k | v) + attn_gate (z) and keeps ssm_ba grouped. Value heads stay in grouped order
 * (value head hv uses key head hv / r, the repeat-interleave of qwen3next.cpp). */
#include "model/model.h"

#define NM(g, h) model_lname(src, l, g, h, nm, sizeof nm)

static int bind(model *m, const model_src *src, char *err, size_t errlen) {
  const floe_hparams *hp = &m->hp;
  int rc;
  if (!hp->attn_gate || hp->n_ff_shexp <= 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "qwen3next: needs the gated attention and a shared expert");
  m->v_tiled = false;
  if ((rc = model_bind_common(m, src, -1, true, err, errlen))) return rc;
  const int64_t E = hp->n_embd, Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state, vd = hp->ssm_d_inner;
  char nm[256];
  for (int64_t l = 0; l < hp->n_layer; l++) {
    model_layer *L = &m->layers[l];
    if ((rc = model_bind_common(m, src, l, true, err, errlen))) return rc;
    if (!hp->recurrent[l]) continue;
    if ((rc = model_bind_gdn_common(m, src, l, err, errlen))) return rc;
    L->ba_grouped = true;
    if ((rc = model_bind_mat(m, src, NM("ssm_ba.weight", "linear_attn.in_proj_ba.weight"), 2 * Nv, E, &L->ssm_ba, err,
                             errlen)))
      return rc;
    if (src->kind == MODEL_SRC_HF) {
      L->qkvz_grouped = true;
      rc = model_bind_mat(m, src, NM("", "linear_attn.in_proj_qkvz.weight"), 2 * Nk * dk + 2 * vd, E, &L->ssm_qkvz,
                          err, errlen);
    } else {
      rc = model_bind_mat(m, src, NM("attn_qkv.weight", ""), 2 * Nk * dk + vd, E, &L->ssm_qkv, err, errlen);
      if (!rc) rc = model_bind_mat(m, src, NM("attn_gate.weight", ""), vd, E, &L->ssm_z, err, errlen);
    }
    if (rc) return rc;
  }
  return 0;
}

const model_arch model_arch_qwen3next = { FLOE_ARCH_QWEN3NEXT, bind, model_hybrid_mixer, model_moe_ffn,
                                          model_hybrid_mixer_multi };
