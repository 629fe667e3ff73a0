/* CUDA kernels of every non-matmul operation of a decode step and of prefill (norms, attention,
 * GatedDeltaNet, MoE routing and combine, embedding, argmax, SiLU-GLU), as a plain C API.
 *
 * Conventions (shared with the other CUDA headers):
 *   - Pointers are device pointers; `stream` is a cudaStream_t (NULL: the legacy default stream).
 *   - Launchers return void, never synchronize and never allocate; launch errors surface at the
 *     next cuda_rt_check. Shapes are checked once by the cuda_*_check functions (0 or FLOE_E_* and
 *     a one-line message), not at every launch.
 *   - Graph replay: everything that changes per step (position, KV length, token ids, selected
 *     experts) is read by the kernels from device memory; host arguments are fixed shapes only,
 *     so a captured step replays at every position.
 *   - Scratch buffers that hold completion counters (attention, argmax) must be zeroed ONCE after
 *     allocation (cuda_rt_memset_async); each launch leaves its counters at zero again.
 *
 * Math: each op mirrors the CPU's float operations in the CPU's order (src/model/layers.c), with
 * --fmad=false and fmaf() where the CPU fuses, so GPU and CPU agree bit for bit unless stated:
 *   bit-identical: RMSNorm (+residual add), q/k norm + RoPE + KV write, the GDN conv / L2 norm /
 *     delta rule / gated norm (apart from the decay, below), MoE softmax / top-k / renorm /
 *     combine, embedding rows (F32, F16, BF16, Q8_0, Q4_K, Q6_K), argmax, SiLU-GLU.
 *   - GDN decay exp(A * softplus(a + dt_bias)): the CPU calls libm expf/log1pf; the GPU computes each
 *     in double and rounds to float (correctly rounded in practice; libm is within 0.5 ulp), so
 *     the two agree except, rarely, by one ulp of the decay.
 *   - Attention: the scores are the CPU's bits (16-lane FMA dot + fixed tree), the softmax and
 *     the weighted sum are split-K (flash decoding), so the output differs from the CPU's single
 *     pass by rounding only (test bound: 1e-4 of max|V|). Decode and prefill use the same split
 *     (it depends only on the row's KV length), so a prefill row equals the decode of that
 *     position bit for bit. That is the f32 caches' attention and, with cuda_attn_set_mma(0),
 *     the bf16 caches'; by default a bf16 cache's products go through the tensor cores instead:
 *     not the CPU's score bits, the same bound, and still one order per row for decode and prefill.
 *
 * Row-exactness: every kernel computes each row (token) with arithmetic that does not depend on
 * how many rows a launch has, so prefill rows equal decode rows. */
#ifndef FLOE_CUDA_OPS_H
#define FLOE_CUDA_OPS_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ---- RMSNorm (ops_norm.cu) ----
 * y[r] = (x[r] * (1/sqrtf(sumsq16(x[r])/n + eps))) * w, rows of n floats, contiguous.
 * cuda_add_rmsnorm first does x[r] += delta[r] (stored back into x), the residual add of the
 * previous block fused with the next block's norm; w == NULL: only the add (y unused). */
void cuda_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps, void *stream);
void cuda_add_rmsnorm(float *x, const float *delta, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
                      void *stream);

/* ---- full attention (ops_attn.cu, ops_attn_tc.cu) ---- */
typedef struct cuda_attn_shape {
  int n_head, n_head_kv, head_dim, n_rot;
  int gated;        /* wq rows hold per head [q(hd) | gate(hd)]; output *= sigmoid(gate) */
  int kv_bf16;      /* cache elements: 1 bfloat16, 0 float32 */
  int64_t n_ctx;    /* positions per head in the cache: K, V are [n_head_kv][n_ctx][head_dim] */
  float eps;        /* q/k norm */
  int n_split;      /* split-K parts per (row, kv head), fixed for a session (say 2*SMs/n_head_kv) */
} cuda_attn_shape;
/* 0 or FLOE_E_UNSUPPORTED / FLOE_E_INVALID: head_dim 1..256 (kernels for 16, 32, 64, 128, 256;
 * others run zero-padded to the next), n_head % n_head_kv == 0 (any group), n_rot even and
 * <= head_dim, n_split in [1, 256]. Call it once at setup, before any graph capture: on a device
 * it also grants the kernel its shared memory (up to ~200 KiB, an opt-in above 48 KiB). */
int cuda_attn_check(const cuda_attn_shape *sh, char *err, size_t errlen);
/* A good n_split for a device of n_sm SMs (<= 0: the current device; then 0 when it cannot be
 * asked): one wave of a decode row's blocks at long context (the kernel runs one block per SM).
 * Parts past a row's length exit at once, so it suits every length. The sessions cap their
 * n_split with it (H200, 35B-A3B shape at 128K: one launch 175 -> 162 us, decode 240 -> 258 tok/s). */
int cuda_attn_split_hint(const cuda_attn_shape *sh, int n_sm);
/* Tests and benchmarks: 1 = a block per query head where that grid fits in one wave of the device
 * (the default), 0 = always the head batches that read each K/V row once for several heads. The
 * same bits; FLOE_CUDA_ATTN_SPREAD=0 sets 0 at the first call. */
void cuda_attn_set_spread(int on);
/* Tests and benchmarks: the most query heads a block of the head-batched grid takes (1, 2, 4 or 8;
 * the largest power of two dividing the group and at most this). With head_dim 256, 2 or 4 heads
 * a block run two blocks per SM. The same bits; FLOE_CUDA_ATTN_HB=N sets N at the first call. */
void cuda_attn_set_hb(int hb_max);
/* Tests and benchmarks: 1 = decode attention (k_attn, head_dim 256) folds its 16-lane score sums
 * by transposition (15 shuffles for a pass's 16 values instead of 64), 0 = one fold per value (the
 * default). The same bits; FLOE_CUDA_ATTN_FOLDT=1 sets 1 at the first call. */
void cuda_attn_set_fold_t(int on);
/* Prefill attention: launches of >= min_rows rows run the row-group kernel, which streams each
 * K/V tile once for a block of rows (16 query rows (row, head) of one kv head) with each row's
 * arithmetic that of its decode (the same bits); 0 = every row its own blocks (flash-decoding, as
 * decode). Default 8; FLOE_CUDA_ATTN_ROWS=N sets N at setup (cuda_attn_check). */
void cuda_attn_set_rows(int min_rows);
/* bfloat16 caches: 1 = every launch (decode, few rows, prefill) runs the tensor-core kernel
 * (k_attn_tc; the default): q and the softmax weights as three exact bfloat16 terms each, the
 * products by mma.sync, one code path per row (row-exact among its launches; not the CPU's score
 * order, whose bits k_attn / k_attn_rows keep: 0). FLOE_CUDA_ATTN_MMA=0 sets 0 at setup. A session
 * must not switch it between its launches. f32 caches always take k_attn / k_attn_rows. */
void cuda_attn_set_mma(int on);
/* 1 while the tensor-core order is on (cuda_attn_set_mma or the environment) */
int cuda_attn_mma(void);
/* The tensor-core kernel's query rows a block in launches of >= 16 rows: 2 = 32 (the default: K/V
 * tiles read once for twice the rows), 1 = 16. The same bits; FLOE_CUDA_ATTN_MT=1 at setup. */
void cuda_attn_set_mt(int mt);
/* launches of one m16 tile of k_attn_tc: 1 = the pipelined tile loop (the default), 0 = three phases a
 * tile; the same bits (FLOE_CUDA_ATTN_PIPE=0) */
void cuda_attn_set_pipe(int on);
/* Tests: k_attn_tc's rows of one part written by their block without the split-K scratch (1, the
 * default; FLOE_CUDA_ATTN_ONEPART=0 at the first call: 0): the same bits either way */
void cuda_attn_set_onep(int on);
/* k_attn_tc's launches of 2..15 rows: a block per token (1, the default) or 16 / HBH tokens a block
 * (0; FLOE_CUDA_ATTN_R1=0); the same bits */
void cuda_attn_set_r1(int on);
/* Tests: cuda_attn_set_act(0) leaves cuda_attn_q's quantization to the caller (returns 0) */
void cuda_attn_set_act(int on);
/* 1 when a launch of n_tok rows runs the row-group kernel (its scratch is the same size) */
int cuda_attn_rows_used(int64_t n_tok);
/* Scratch of cuda_attn for up to n_tok rows: split partials + completion counters. Zero once.
 * Launches of any rows up to max(n_tok, 512) may share it in any order. */
size_t cuda_attn_scratch_bytes(const cuda_attn_shape *sh, int64_t n_tok);
/* Rows t < n_tok at positions pos = *pos0 + t (pos0: device int32):
 *   q [n_tok][n_head * hd * (gated ? 2 : 1)]: each head's q part RMS-normed with q_norm and
 *     rotated (NeoX, dims < n_rot) IN PLACE; the gate parts are untouched.
 *   k, v [n_tok][n_head_kv * hd]: k normed with k_norm and rotated, then k and v written to the
 *     caches at position pos (bfloat16: round to nearest even, as floe_f32_to_bf16).
 *   rope_cs: [>= n_ctx][n_rot] floats, row p = layer_rope_table(p) (uploaded once per theta). */
void cuda_attn_prep(const cuda_attn_shape *sh, float *q, const float *k, const float *v, const float *q_norm,
                    const float *k_norm, const float *rope_cs, void *kcache, void *vcache, const int32_t *pos0,
                    int64_t n_tok, void *stream);
/* out [n_tok][n_head * hd] = softmax(q k^T / sqrt(hd)) v over cache positions 0..pos (causal:
 * row t sees *pos0 + t + 1 positions), times sigmoid(gate) when gated. q as left by
 * cuda_attn_prep. One launch: split-K parts of ceil(np / n_split) positions (rounded up to 128),
 * parts past the row's length exit at once, the last part to finish combines. */
void cuda_attn(const cuda_attn_shape *sh, const float *q, const void *kcache, const void *vcache,
               const int32_t *pos0, int64_t n_tok, float *out, void *scratch, void *stream);

/* A block's output row quantized in the launch that computes it, for the matrix that reads it
 * next: W's activation layout (A32 or A256 types), rows xq, xs = cuda_mm_act_bytes(W) bytes apart
 * (row t of the launch at xq + t * xs); the bytes cuda_mm_act_quantize(W) writes for the output.
 * The *_q launchers return 1 when they wrote them, 0 when the caller must quantize (W NULL, another
 * layout, a shape or a kernel that cannot, or the switch off). */
struct cuda_mat;
typedef struct cuda_act_out {
  const struct cuda_mat *W;
  void *xq;
  size_t xs;
} cuda_act_out;
/* cuda_attn, quantizing out for qo (the tensor-core kernel with a bf16 cache, where each block's
 * heads are whole A256 chunks / A32 units; FLOE_CUDA_ATTN_ACT=0 at the first call: never) */
int cuda_attn_q(const cuda_attn_shape *sh, const float *q, const void *kcache, const void *vcache,
                const int32_t *pos0, int64_t n_tok, float *out, void *scratch, const cuda_act_out *qo, void *stream);

/* ---- GatedDeltaNet (ops_gdn.cu) ---- */
typedef struct cuda_gdn_shape {
  int Nk, Nv, dk, dv;  /* key heads, value heads, key / value head dims */
  int conv_k;          /* causal conv kernel K (window K-1) */
  int v_tiled;         /* value head hv uses key head hv % Nk (qwen35moe), else hv / (Nv/Nk) */
  float eps;           /* gated RMSNorm */
  /* 1: the kernel launched right before each one-token step writes neither the recurrent and conv
   * states nor their pointers (the decode step: the q|k|v|z|b|a projection), so the step reads
   * them before its griddepcontrol.wait (pdl.cuh); 0 (tests that run steps back to back): after */
  int pre_state;
} cuda_gdn_shape;
/* 0 or FLOE_E_UNSUPPORTED: dk 1..128, dv 2..128, Nv % Nk == 0 (any ratio), 2 <= K <= 8. */
int cuda_gdn_check(const cuda_gdn_shape *sh, char *err, size_t errlen);
/* Causal conv + SiLU + q/k L2 norms (q also * dk^-0.5) of n_tok tokens in order, C = 2*Nk*dk + Nv*dv:
 *   mix [n_tok][C] (q | k | v before the conv), conv_wt [K][C], conv_state [K-1][C] (updated),
 *   raw [n_tok][C] (out). */
/* Chunks of several tokens (not kept): 1 = the conv with a block per token (the default),
 * 0 = token by token; the same bits by construction (FLOE_CUDA_CONV_PAR=0 sets 0 at the first
 * launch; test_cuda_ops runs both). */
void cuda_gdn_set_conv_par(int on);
void cuda_gdn_conv(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *conv_state, float *raw,
                   int64_t n_tok, void *stream);
/* Delta-rule recurrence, token by token, and the gated RMSNorm:
 *   raw [n_tok][C] from cuda_gdn_conv, z [n_tok][Nv*dv], b, a [n_tok][Nv], dt_bias, ssm_a [Nv]
 *   (ssm_a = -exp(A_log)), norm_w [dv], S [Nv][dk][dv] (updated), o [n_tok][Nv*dv] (out). */
void cuda_gdn_recur(const cuda_gdn_shape *sh, const float *raw, const float *z, const float *b, const float *a,
                    const float *dt_bias, const float *ssm_a, const float *norm_w, float *S, float *o,
                    int64_t n_tok, void *stream);
/* The same two ops with the state behind a device pointer cell (*conv_state, *S: read by the
 * kernel at launch, so a recorded graph follows pointer swaps made between replays), and kept
 * chunks: keep NULL updates the state in place; keep != NULL (a device array of n_tok pointers,
 * n_tok <= 8) leaves the state as it was and writes the state after token t into keep[t] (same
 * layout), bit-identical to the in-place state after t + 1 tokens. */
void cuda_gdn_conv_p(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *const *conv_state,
                     float *const *keep, float *raw, int64_t n_tok, void *stream);
void cuda_gdn_recur_p(const cuda_gdn_shape *sh, const float *raw, const float *z, const float *b, const float *a,
                      const float *dt_bias, const float *ssm_a, const float *norm_w, float *const *S,
                      float *const *keep, float *o, int64_t n_tok, void *stream);
/* Tests and benchmarks: 1 = the two-threads-per-column recurrence for dk 128 (k_gdn_recur2, the
 * default), 0 = one thread per column (the same bits; FLOE_CUDA_GDN2=0 sets 0 at the first call). */
void cuda_gdn_set_impl(int two);
/* The conv and the recurrence together (cuda_gdn_conv then cuda_gdn_recur, the same arguments and
 * results; raw is written too). One token with the two-threads-per-column recurrence (dk 128, dv
 * <= 128, Nv / Nk <= 8, and a device with thread block clusters where Nv > Nk) runs as one launch,
 * kept (keep != NULL, one row) or in place; anything else as the two launches. */
void cuda_gdn_step(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *conv_state, float *raw,
                   const float *z, const float *b, const float *a, const float *dt_bias, const float *ssm_a,
                   const float *norm_w, float *S, float *o, int64_t n_tok, void *stream);
void cuda_gdn_step_p(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *const *conv_state,
                     float *const *conv_keep, float *raw, const float *z, const float *b, const float *a,
                     const float *dt_bias, const float *ssm_a, const float *norm_w, float *const *S,
                     float *const *S_keep, float *o, int64_t n_tok, void *stream);
/* cuda_gdn_step_p, quantizing o for qo (one token in place through the one launch, where an A256
 * chunk's value heads fit one thread block cluster: gdn_act_cluster) when switched on: off by
 * default (measured slower on the 35B-A3B), FLOE_CUDA_GDN_ACT=1 at the first call or
 * cuda_gdn_set_act(1) */
int cuda_gdn_step_q(const cuda_gdn_shape *sh, const float *mix, const float *conv_wt, float *const *conv_state,
                    float *const *conv_keep, float *raw, const float *z, const float *b, const float *a,
                    const float *dt_bias, const float *ssm_a, const float *norm_w, float *const *S,
                    float *const *S_keep, float *o, int64_t n_tok, const cuda_act_out *qo, void *stream);
/* Tests and benchmarks, the same bits either way: cuda_gdn_set_fused(0) runs cuda_gdn_step's one
 * token as the two launches (FLOE_CUDA_GDN_FUSED=0 at the first call). Prefill chunks (not kept,
 * dk 128): cuda_gdn_set_cols(2) runs the recurrence with S's columns split over several blocks,
 * consecutive tokens overlapped, and the gated norm after it; 3 the same with four threads a
 * column instead of two; 4 / 5 / 6 with each chunk of 8 tokens' inputs copied two chunks ahead
 * (k_gdn_recur_cols3) and 2 / 4 / 8 threads a column (6: the default), 7 the same as 6 with 16
 * columns a block instead of 32; 1 without the overlap; 0 k_gdn_recur2, a block per value head
 * (FLOE_CUDA_GDN_COLS=0 .. 7). */
void cuda_gdn_set_fused(int on);
/* cuda_gdn_set_act(1): cuda_gdn_step_q quantizes where it fits; 0: leaves it to the caller (returns 0) */
void cuda_gdn_set_act(int on);
/* Threads a column of the fused one-token step (k_gdn_step1): 2 (the default) or 4 (twice the warps,
 * half the rows a thread; FLOE_CUDA_GDN_STEP_NQ=4). The same bits either way. */
void cuda_gdn_set_step_nq(int nq);
void cuda_gdn_set_cols(int mode);
/* Kept chunks (the MTP verify) of 2..16 rows in one launch (k_gdn_stepn: the conv, the
 * recurrence and the gated norm): 2 (the default) with each value head's columns over a cluster
 * of 32-column blocks, 1 with one block a head; 0 as k_gdn_conv then the recurrence
 * (FLOE_CUDA_GDN_STEPN=0 / 1 / 2). The same bits. */
void cuda_gdn_set_stepn(int mode);
/* k_gdn_stepn's split form (mode 2) for 2..5 rows with the row count a template argument (1, the
 * default; a dk-128 block has a ninth warp for the conv's channels) or the one kernel for every
 * count (0; FLOE_CUDA_GDN_STEPN_NT=0). The same bits. */
void cuda_gdn_set_stepn_nt(int on);
/* 1: one-token steps (not kept) as the conv, the recurrence with S's columns over several blocks
 * (cuda_gdn_set_cols' kernel) and the gated norm: three launches over 4x the blocks of
 * k_gdn_step1's one block per value head (whose 32 blocks read and write the state through 32 of
 * the GPU's SMs). 0 (the default): k_gdn_step1. The same bits; FLOE_CUDA_GDN_DEC_COLS=1 sets 1 at
 * the first call. */
void cuda_gdn_set_dec_cols(int on);

/* ---- MoE (ops_moe.cu) ---- */
/* logits [n_tok][n_expert] -> softmax -> the K largest (descending, ties to the lower index) ->
 * renormalised when norm_topk -> sel [n_tok][K] in ascending expert order, w [n_tok][K] beside.
 * n_expert <= 1024, K <= n_expert, K <= 64. */
void cuda_moe_route(const float *logits, int64_t n_tok, int n_expert, int K, int norm_topk, int32_t *sel, float *w,
                    void *stream);
/* cuda_moe_route with the shared expert as one more slot: sel / w [n_tok][K + 1], slots [0, K) as
 * above, slot K = (sh_id, sigmoid(sh_logit[t])). cuda_moe_combine over K + 1 slots without a
 * separate shared expert then adds sh * sigmoid(logit) last, as the CPU does (a product does not
 * depend on its operands' order): the same bits as the separate form. */
void cuda_moe_route_sh(const float *logits, int64_t n_tok, int n_expert, int K, int norm_topk, const float *sh_logit,
                       int sh_id, int32_t *sel, float *w, void *stream);
/* Tests and benchmarks: 1 = a warp per token (k_moe_route_warp, the default where n_expert <= 256
 * and K <= 32), 0 = a block per token (the same bits; FLOE_CUDA_ROUTE_WARP=0 sets 0 at the first
 * call). */
void cuda_moe_set_route_impl(int warp);
/* x[t] += (sum_j w[t*K+j] * y[t*K+j]  +  sigmoid(sh_logit[t]) * sh[t]) in the CPU's order
 * (j ascending, then the shared expert); sh / sh_logit NULL: no shared expert. Then, when norm_w
 * is not NULL, h[t] = rmsnorm(x[t]) * norm_w (the next block's input norm, fused).
 * y [n_tok*K][n], sh [n_tok][n], x, h [n_tok][n]. */
void cuda_moe_combine(float *x, const float *y, const float *w, int K, const float *sh, const float *sh_logit,
                      const float *norm_w, float *h, float eps, int64_t n_tok, int64_t n, void *stream);
/* g[r] = silu(g[r]) * u[r] elementwise over n floats (the SiLU-GLU of glu_row). */
void cuda_silu_glu(float *g, const float *u, int64_t n, void *stream);

/* ---- embedding, argmax (ops_misc.cu) ---- */
/* 0 when cuda_embed_rows handles type (FLOE_TYPE_F32, F16, BF16, Q8_0, Q4_K, Q6_K) for rows of
 * n_embd elements, else FLOE_E_UNSUPPORTED (route the type to the matmul helper's dequant). */
int cuda_embed_check(uint32_t type, int64_t n_embd, char *err, size_t errlen);
/* out[t] = row tokens[t] of the table (n_vocab rows of row_bytes, type's blocks), dequantized
 * exactly as quant_dequant_row. tokens: device int32 [n_tok]; ids outside [0, n_vocab) give a
 * row of NaN (a visible error, never a read out of bounds). */
void cuda_embed_rows(uint32_t type, const void *data, size_t row_bytes, int64_t n_vocab, int64_t n_embd,
                     const int32_t *tokens, int64_t n_tok, float *out, void *stream);
/* Scratch of cuda_argmax over n floats. Zero once. */
size_t cuda_argmax_scratch_bytes(int64_t n);
/* *out = kern_argmax(x, n): the first index of the largest value, NaN never chosen, 0 when
 * nothing is larger than -inf. One launch (the last block to finish reduces). n < 2^31. */
void cuda_argmax(const float *x, int64_t n, int32_t *out, void *scratch, void *stream);
/* cuda_argmax, the index also written to out_h (the device's address of pinned host memory,
 * cuda_rt_host_dev_ptr) by the same launch: no copy after it */
void cuda_argmax_to(const float *x, int64_t n, int32_t *out, int32_t *out_h, void *scratch, void *stream);
/* out[r] = kern_argmax(x + r * ld, n) for rows r < rows, in one launch; scratch of
 * cuda_argmax_rows_scratch_bytes(n, rows) (zero once; it serves cuda_argmax over n too). Every
 * launch on one scratch uses the same n: row r's counter lies after rows 0..r-1's maxima, whose
 * count depends on n (row 0's counter, word 0, does not). */
size_t cuda_argmax_rows_scratch_bytes(int64_t n, int rows);
void cuda_argmax_rows(const float *x, int64_t ld, int64_t n, int rows, int32_t *out, void *scratch, void *stream);

/* A logits row's argmax gathered by the launch that writes it (cuda_mm_matmul_amax): CUDA_AMK_ROW
 * 8-byte words of slots a row, zero before that launch. cuda_amk_tokens: the index of each of rows
 * such rows (CUDA_AMK_ROW words apart) into out (device ints): cuda_argmax's index of the row. */
#define CUDA_AMK_ROW 128
void cuda_amk_tokens(const unsigned long long *keys, int rows, int32_t *out, void *stream);

/* Up to CUDA_COPY_PARTS copies of whole 4-byte words in one launch (src / dst: device addresses,
 * pinned host memory's included, cuda_rt_host_dev_ptr): a recorded step's inputs and outputs
 * without a copy node each. bytes a multiple of 4; an empty part (bytes 0) is skipped. */
#define CUDA_COPY_PARTS 4
typedef struct cuda_copy_part {
  const void *src;
  void *dst;
  size_t bytes;
} cuda_copy_part;
void cuda_copy_parts(const cuda_copy_part *p, int n, void *stream);

/* ---- decoding ahead (ops_misc.cu; backend_cuda.c MODEL_EVAL_AHEAD) ---- */
/* A step for the pick the host has not read: tok[0] = pick[0], pos[0] += 1 (device ints). */
void cuda_step_next(const int32_t *pick, int32_t *tok, int32_t *pos, void *stream);
/* A table of rows cells apart stride (device pointers): cell 0 and cell t of every row swapped. */
void cuda_tab_swap(float **tab, int64_t rows, int stride, int t, void *stream);

#ifdef __cplusplus
}
#endif
#endif
