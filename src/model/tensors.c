/* The tensor list of each architecture: GGUF names and ggml shapes exactly as llama.cpp writes
 * and loads them (src/llama-arch.cpp name table; load_arch_tensors in src/models/qwen3moe.cpp,
 * qwen3next.cpp, qwen35moe.cpp; conversion/qwen.py).
 *
 *   global   token_embd {E, V}, output_norm {E}, output {E, V} (absent when tied)
 *   norms    attn_norm {E}; FFN pre-norm: ffn_norm (qwen3moe) / post_attention_norm (hybrids)
 *   full     attn_q {E, hd*H*(gate ? 2 : 1)} (q and gate interleaved per head), attn_k/v {E, hd*Hkv},
 *            attn_output {hd*H, E}, attn_q_norm / attn_k_norm {hd}
 *   GDN      attn_qkv {E, 2*Nk*dk + Nv*dv}, attn_gate {E, Nv*dv}, ssm_conv1d {K, 2*Nk*dk + Nv*dv},
 *            ssm_dt.bias {Nv}, ssm_a {Nv} (no ".weight"), ssm_norm {dv}, ssm_out {Nv*dv, E},
 *            qwen35moe: ssm_beta, ssm_alpha {E, Nv}; qwen3next: ssm_ba {E, 2*Nv} (the current
 *            converter splits in_proj_qkvz into attn_qkv + attn_gate; ssm_in is legacy only)
 *   MoE      ffn_gate_inp {E, X}, ffn_gate_exps / ffn_up_exps {E, F, X}, ffn_down_exps {F, E, X}
 *   shared   ffn_gate_inp_shexp {E}, ffn_gate_shexp / ffn_up_shexp {E, S}, ffn_down_shexp {S, E}
 *   MTP      blk.{n_layer+j}: a full-attention block with MoE + shared expert, plus
 *            nextn.eh_proj {2E, E}, nextn.enorm / nextn.hnorm / nextn.shared_head_norm {E}
 * where E = n_embd, V = n_vocab, H/Hkv heads of hd, Nk/Nv GDN key/value heads of dk/dv,
 * K conv kernel, X experts of width F, S shared-expert width. */
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "model/model_meta.h"

static const char *const kind_names[MODEL_K_COUNT] = {
    [MODEL_K_TOKEN_EMBD] = "token_embd", [MODEL_K_OUTPUT_NORM] = "output_norm", [MODEL_K_OUTPUT] = "output",
    [MODEL_K_ATTN_NORM] = "attn_norm", [MODEL_K_FFN_NORM] = "ffn_norm",
    [MODEL_K_ATTN_Q] = "attn_q", [MODEL_K_ATTN_K] = "attn_k", [MODEL_K_ATTN_V] = "attn_v",
    [MODEL_K_ATTN_OUT] = "attn_output", [MODEL_K_ATTN_Q_NORM] = "attn_q_norm", [MODEL_K_ATTN_K_NORM] = "attn_k_norm",
    [MODEL_K_SSM_QKV] = "attn_qkv", [MODEL_K_SSM_GATE] = "attn_gate", [MODEL_K_SSM_BETA] = "ssm_beta",
    [MODEL_K_SSM_ALPHA] = "ssm_alpha", [MODEL_K_SSM_BA] = "ssm_ba", [MODEL_K_SSM_CONV1D] = "ssm_conv1d",
    [MODEL_K_SSM_DT_BIAS] = "ssm_dt", [MODEL_K_SSM_A] = "ssm_a", [MODEL_K_SSM_NORM] = "ssm_norm",
    [MODEL_K_SSM_OUT] = "ssm_out", [MODEL_K_FFN_GATE_INP] = "ffn_gate_inp", [MODEL_K_FFN_GATE_EXPS] = "ffn_gate_exps",
    [MODEL_K_FFN_UP_EXPS] = "ffn_up_exps", [MODEL_K_FFN_DOWN_EXPS] = "ffn_down_exps",
    [MODEL_K_FFN_GATE_INP_SHEXP] = "ffn_gate_inp_shexp", [MODEL_K_FFN_GATE_SHEXP] = "ffn_gate_shexp",
    [MODEL_K_FFN_UP_SHEXP] = "ffn_up_shexp", [MODEL_K_FFN_DOWN_SHEXP] = "ffn_down_shexp",
    [MODEL_K_NEXTN_EH_PROJ] = "nextn.eh_proj", [MODEL_K_NEXTN_ENORM] = "nextn.enorm",
    [MODEL_K_NEXTN_HNORM] = "nextn.hnorm", [MODEL_K_NEXTN_SHARED_HEAD_NORM] = "nextn.shared_head_norm",
};

const char *model_tensor_kind_name(int kind) {
  return kind >= 0 && kind < MODEL_K_COUNT ? kind_names[kind] : "?";
}

#define POST_ATTN_NAME (1u << 31) /* internal: spell MODEL_K_FFN_NORM as post_attention_norm */

typedef struct tlist {
  model_tensor_desc *v;
  size_t n, cap;
  bool oom;
} tlist;

/* Appends one tensor. suffix is ".weight", ".bias" or "" (ssm_a has no suffix). */
static void add(tlist *l, int kind, int layer, const char *suffix, uint32_t flags, int64_t ne0, int64_t ne1,
                int64_t ne2) {
  if (l->oom) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 256;
    model_tensor_desc *v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = true;
      return;
    }
    l->v = v;
    l->cap = cap;
  }
  model_tensor_desc *d = &l->v[l->n++];
  const char *base = kind_names[kind];
  /* llama.cpp spells the qwen3moe FFN pre-norm "ffn_norm", the hybrids' "post_attention_norm". */
  if (flags & POST_ATTN_NAME) base = "post_attention_norm";
  flags &= ~POST_ATTN_NAME;
  if (layer >= 0) snprintf(d->name, sizeof d->name, "blk.%d.%s%s", layer, base, suffix);
  else snprintf(d->name, sizeof d->name, "%s%s", base, suffix);
  d->n_dims = ne2 > 0 ? 3 : ne1 > 0 ? 2 : 1;
  d->ne[0] = ne0;
  d->ne[1] = ne1 > 0 ? ne1 : 1;
  d->ne[2] = ne2 > 0 ? ne2 : 1;
  d->ne[3] = 1;
  d->flags = flags;
  d->kind = kind;
  d->layer = layer;
}

#define VEC MODEL_TF_VECTOR
#define NORM (MODEL_TF_VECTOR | MODEL_TF_NORM)
#define MAT MODEL_TF_MATRIX

static void add_full_attn(tlist *l, const floe_hparams *hp, int il, uint32_t mtp) {
  const int64_t E = hp->n_embd, hd = hp->head_dim;
  const int64_t q_rows = hd * hp->n_head * (hp->attn_gate ? 2 : 1);
  add(l, MODEL_K_ATTN_Q, il, ".weight", MAT | mtp, E, q_rows, 0);
  add(l, MODEL_K_ATTN_K, il, ".weight", MAT | mtp, E, hd * hp->n_head_kv, 0);
  add(l, MODEL_K_ATTN_V, il, ".weight", MAT | mtp, E, hd * hp->n_head_kv, 0);
  add(l, MODEL_K_ATTN_OUT, il, ".weight", MAT | mtp, hd * hp->n_head, E, 0);
  add(l, MODEL_K_ATTN_Q_NORM, il, ".weight", NORM | mtp, hd, 0, 0);
  add(l, MODEL_K_ATTN_K_NORM, il, ".weight", NORM | mtp, hd, 0, 0);
}

static void add_gdn(tlist *l, const floe_hparams *hp, int il) {
  const int64_t E = hp->n_embd;
  const int64_t key_dim = hp->ssm_d_state * hp->ssm_n_group, value_dim = hp->ssm_d_inner;
  const int64_t head_v_dim = hp->ssm_d_inner / hp->ssm_dt_rank, nv = hp->ssm_dt_rank;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  add(l, MODEL_K_SSM_QKV, il, ".weight", MAT, E, conv_dim, 0);
  add(l, MODEL_K_SSM_GATE, il, ".weight", MAT, E, value_dim, 0);
  if (hp->arch == FLOE_ARCH_QWEN35MOE) {
    add(l, MODEL_K_SSM_BETA, il, ".weight", MAT, E, nv, 0);
    add(l, MODEL_K_SSM_ALPHA, il, ".weight", MAT, E, nv, 0);
  } else {
    add(l, MODEL_K_SSM_BA, il, ".weight", MAT, E, 2 * nv, 0);
  }
  add(l, MODEL_K_SSM_CONV1D, il, ".weight", MODEL_TF_F32, hp->ssm_conv_kernel, conv_dim, 0);
  add(l, MODEL_K_SSM_DT_BIAS, il, ".bias", VEC, nv, 0, 0);
  add(l, MODEL_K_SSM_A, il, "", VEC, nv, 0, 0);
  add(l, MODEL_K_SSM_NORM, il, ".weight", NORM, head_v_dim, 0, 0);
  add(l, MODEL_K_SSM_OUT, il, ".weight", MAT, value_dim, E, 0);
}

static void add_moe(tlist *l, const floe_hparams *hp, int il, uint32_t mtp) {
  const int64_t E = hp->n_embd, F = hp->n_ff_exp, X = hp->n_expert, S = hp->n_ff_shexp;
  add(l, MODEL_K_FFN_GATE_INP, il, ".weight", MODEL_TF_F32 | mtp, E, X, 0);
  add(l, MODEL_K_FFN_GATE_EXPS, il, ".weight", MODEL_TF_EXPERTS | mtp, E, F, X);
  add(l, MODEL_K_FFN_UP_EXPS, il, ".weight", MODEL_TF_EXPERTS | mtp, E, F, X);
  add(l, MODEL_K_FFN_DOWN_EXPS, il, ".weight", MODEL_TF_EXPERTS | mtp, F, E, X);
  if (S > 0) {
    add(l, MODEL_K_FFN_GATE_INP_SHEXP, il, ".weight", VEC | mtp, E, 0, 0);
    add(l, MODEL_K_FFN_GATE_SHEXP, il, ".weight", MODEL_TF_SHEXP | mtp, E, S, 0);
    add(l, MODEL_K_FFN_UP_SHEXP, il, ".weight", MODEL_TF_SHEXP | mtp, E, S, 0);
    add(l, MODEL_K_FFN_DOWN_SHEXP, il, ".weight", MODEL_TF_SHEXP | mtp, S, E, 0);
  }
}

int model_tensor_list(const floe_hparams *hp, model_tensor_desc **out, size_t *n, char *err, size_t errlen) {
  *out = NULL;
  *n = 0;
  int rc = model_hparams_validate(hp, err, errlen);
  if (rc) return rc;
  const int64_t E = hp->n_embd, V = hp->n_vocab;
  const bool hybrid = hp->arch != FLOE_ARCH_QWEN3MOE;
  const uint32_t ffn_norm_spelling = hybrid ? POST_ATTN_NAME : 0;
  tlist l = {0};

  add(&l, MODEL_K_TOKEN_EMBD, -1, ".weight", MAT, E, V, 0);
  for (int il = 0; il < (int)hp->n_layer; il++) {
    add(&l, MODEL_K_ATTN_NORM, il, ".weight", NORM, E, 0, 0);
    if (hp->recurrent[il]) add_gdn(&l, hp, il);
    else add_full_attn(&l, hp, il, 0);
    add(&l, MODEL_K_FFN_NORM, il, ".weight", NORM | ffn_norm_spelling, E, 0, 0);
    add_moe(&l, hp, il, 0);
  }
  for (int j = 0; j < (int)hp->n_mtp; j++) {
    const int il = (int)hp->n_layer + j;
    const uint32_t m = MODEL_TF_MTP;
    add(&l, MODEL_K_ATTN_NORM, il, ".weight", NORM | m, E, 0, 0);
    add_full_attn(&l, hp, il, m);
    add(&l, MODEL_K_FFN_NORM, il, ".weight", NORM | m | ffn_norm_spelling, E, 0, 0);
    add_moe(&l, hp, il, m);
    add(&l, MODEL_K_NEXTN_EH_PROJ, il, ".weight", MAT | m, 2 * E, E, 0);
    add(&l, MODEL_K_NEXTN_ENORM, il, ".weight", NORM | m, E, 0, 0);
    add(&l, MODEL_K_NEXTN_HNORM, il, ".weight", NORM | m, E, 0, 0);
    add(&l, MODEL_K_NEXTN_SHARED_HEAD_NORM, il, ".weight", NORM | m, E, 0, 0);
  }
  add(&l, MODEL_K_OUTPUT_NORM, -1, ".weight", NORM, E, 0, 0);
  if (!hp->tied_embeddings) add(&l, MODEL_K_OUTPUT, -1, ".weight", MAT, E, V, 0);

  if (l.oom) {
    free(l.v);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory building the tensor list");
  }
  *out = l.v;
  *n = l.n;
  return 0;
}
