/* What the CUDA backend's two files share (backend_cuda.c: sessions, blocks, graphs;
 * backend_cuda_load.c: the model's upload to the device): the device copy of the model. */
#ifndef FLOE_BACKEND_CUDA_INTERNAL_H
#define FLOE_BACKEND_CUDA_INTERNAL_H
#ifdef FLOE_HAVE_CUDA
#include "kernels/cuda/cuda_mm.h"
#include "model/cuda_tier.h"
#include "model/model.h"

/* A device matrix and the host matrix it copies (the CPU's layout decisions read the host one). */
typedef struct dmat {
  cuda_mat d;
  const floe_mat *h;
} dmat;

typedef struct cu_layer {
  float *attn_norm, *ffn_norm, *q_norm, *k_norm; /* device copies, [n_embd] / [head_dim] */
  dmat wq, wk, wv, wo;
  /* GDN input projections: q|k|v rows, z, b, a. Grouped sources (Qwen3-Next HF / GGUF) have
   * their rows permuted at upload into this order, so no unpacking runs per token (each row's dot
   * product is unchanged). lay: the matrix whose layout the CPU quantizes the input for. */
  dmat qkv, z, b, a;
  const floe_mat *lay_gdn, *src_ba; /* host: the qkv(z) and b(a) matrices as the CPU sees them */
  float *conv_wt, *dt_bias, *ssm_a, *ssm_norm;
  dmat ssm_out;
  dmat router, sh_gate, sh_up, sh_down, sh_gate_inp;
  /* One-token steps read the matrices that share an input as one matrix (one launch instead of
   * two to four): q|k|v, qkv|z, b|a, router|shared-expert gate. The parts above are then views
   * into it (same device bytes); ncat = 0 where the parts cannot be joined (types differ, MLX). */
  dmat cat_qkv, cat_qkvz, cat_ba, cat_rt;
  /* q|k|v|z|b|a in one matrix where all four share a type and width (cat_qkvz and cat_ba are then
   * views of it; FLOE_CUDA_JOIN_GDN=0: not joined) */
  dmat cat_gdn;
  dmat gate, up, down; /* routed experts: stacks of n_expert, expert e at data + e * expert_stride */
  /* sh_in_stack: the shared expert is expert n_expert of the three stacks (its matrices have the
   * routed experts' layout): one gate+up and one down launch take K + 1 slots a token, the shared
   * expert's slot last (cuda_moe_route_sh), instead of separate launches. */
  bool sh_in_stack;
} cu_layer;

typedef struct cu_model {
  int dev;
  cu_layer *L;       /* [n_l]: the trunk's n_layer, then the MTP block's layer (index n_layer) */
  int64_t n_l;
  /* the MTP block (model.h m->mtp; NULL / empty without one): fc [E][2E], its three norms */
  dmat mtp_fc;
  float *mtp_enorm, *mtp_hnorm, *mtp_norm;
  dmat tok_embd, output;
  float *output_norm;
  void **allocs;
  size_t n_alloc, cap_alloc;
  uint64_t bytes; /* device bytes of the weights */
  char name[128];
  cu_tier *tier; /* model.gpu_mem: the routed experts in a VRAM pool, the rest in host memory (NULL: all on the device) */
} cu_model;

/* backend.h model_init / model_fini of the CUDA backend (backend_cuda_load.c) */
int cu_model_init(model *m, int dev, char *err, size_t errlen);
void cu_model_fini(model *m);
#endif
#endif
