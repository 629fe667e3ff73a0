/* CUDA matrix x vector / small-batch matmuls for every weight type floe reads, the GPU twin of
 * src/kernels/cpu (kernels.h): activation quantization, quantized-activation matmuls, the exact
 * float path, exact row dequantization, and the MoE expert kernels (fused gate+up+SiLU-GLU, down).
 *
 * Results (what the tests check, tests/test_cuda_mm.c):
 *  - cuda_mm_act_quantize writes the same bytes as kern_act_quantize_rows.
 *  - quantized path (xq != NULL; types with cuda_mm_act_bytes != 0: Q8_0, Q4_0, IQ4_NL, MXFP4,
 *    Q4_K, Q5_K, Q6_K, IQ4_XS, MLX 4/8-bit): every output is bit-identical to kern_matmul with
 *    the same xq, on every CPU ISA: each output runs its own copy of the canonical sequence of
 *    float operations (kernels_internal.h, "16-lane model" / "superblock model"); only the exact
 *    integer lane sums are computed in a GPU-friendly grouping.
 *  - float path (xq == NULL; every type, required for the others: F32, F16, BF16, Q4_1, Q5_0,
 *    Q5_1, Q2_K, Q3_K, the IQ1/IQ2/IQ3 types, MLX 2/3/5/6-bit): weights decoded exactly (the
 *    quant reference's float operations) into on-chip shared memory, 256 values of 32 rows at a
 *    time, then each output accumulates in element order: bit-identical to the CPU's SCALAR float
 *    path (kern_isa_set(FLOE_ISA_SCALAR), = quant_dot_ref); the CPU's AVX2/AVX-512 float paths
 *    differ from it within 1e-5 * sum|w x| (kernels.h).
 *  - cuda_mm_dequant_rows equals quant_dequant_row / quant_mlx_dequant_row bit for bit.
 *  - MoE: each output row is the same bits as the CPU: gate and up by the matmul above, then
 *    g = x / (1 + vexpf(-x)) * u with the CPU's vexpf (src/model/layers.c) operation by operation;
 *    the down input is quantized per slot by the activation quantizer, as the CPU does.
 *
 * Calls: all launchers are asynchronous on `stream` (a cudaStream_t, NULL = default stream),
 * return void and never synchronize; launch errors surface at cuda_rt_check(). They never take
 * per-step values as host arguments where a decode step would change them: expert ids (and the
 * embedding row) are read from device memory, so a step can be captured in a CUDA graph once
 * and replayed. cuda_mm_init() must have run once on the current device before any launch (it
 * uploads the IQ grid tables); cuda_mm_type_supported() tells the loader which matrices can go
 * to the GPU. Shapes are checked by the caller (the loader): launchers assume a supported type.
 *
 * Layout of the work (each lane's / slot's sequence of float adds stays in one thread, in order):
 * Q4_K/Q5_K: 8 threads per weight row, thread j takes whole superblocks j, j+8, ... (slots j and
 * j+8). 16-lane types, two implementations picked by shape (cuda_mm_set_q16_impl): a warp per row
 * (lanes 0-15 own the lane accumulators, lanes 16-31 compute the odd steps and hand their
 * products over by shuffle) or 4 threads per row of 4 lanes each. Activation rows are taken in
 * tiles of 1, 4 or 16 per launch block, so nb <= 16 reads each weight once per launch.
 * Speed (H200, bench_cuda_mm, copy 4.24 TB/s): far from the copy bandwidth yet: 1.7-1.8 TB/s on
 * the 248320 x 2048 output head (Q4_K, Q6_K), 0.7-0.9 TB/s on 8192 x 2048, 10-12 us per MoE
 * launch of 8 experts; the float path of the block types ~0.1 TB/s (bench/results.tsv). */
#ifndef FLOE_CUDA_MM_H
#define FLOE_CUDA_MM_H
#include <stddef.h>
#include <stdint.h>

#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix in device memory: floe_mat's layout with device pointers. For a stack of
 * experts (one projection of one layer), expert e's matrix starts at data + e * expert_stride
 * (and its MLX scales/biases at scales/biases + e * sb_expert_stride); n_expert = 1 and strides 0
 * for a plain matrix. */
typedef struct cuda_mat {
  uint32_t type;            /* FLOE_TYPE_* (incl. FLOE_TYPE_MLX) */
  int64_t rows, cols;       /* of one expert */
  const void *data;         /* device; row r at data + r * row_bytes */
  size_t row_bytes;
  quant_mlx_fmt mlx;        /* MLX only */
  const void *scales, *biases; /* device, MLX only; row r at + r * sb_row_bytes */
  size_t sb_row_bytes;
  int32_t n_expert;         /* experts in the stack (1: a plain matrix) */
  size_t expert_stride, sb_expert_stride; /* bytes between experts */
} cuda_mat;

/* Uploads the lookup tables (IQ grids, 4-bit value tables) to the current device; once per
 * device, before any launch (idempotent). */
int cuda_mm_init(char *err, size_t errlen);

/* 0 when W (a host floe_mat: type, cols, MLX format) can be computed on the GPU, else
 * FLOE_E_UNSUPPORTED with a one-line reason (say, "iq1_m: no CUDA kernel"). */
int cuda_mm_type_supported(uint32_t type, int64_t cols, const quant_mlx_fmt *mlx, char *err, size_t errlen);

/* Bytes of one quantized activation row for W (= kern_act_bytes of the same layout); 0 when the
 * type has no quantized-activation path (then use the float path, xq = NULL). */
size_t cuda_mm_act_bytes(const cuda_mat *W);

/* cuda_mm_matmul of a joined matrix (matrices stacked by rows) whose parts go to their own
 * buffers: rows [0, s1) to Y (ldy), [s1, s2) to Y2 (ldy2), [s2, s3) to Y3 (ldy3), [s3, rows) to
 * Y4 (ldy4); s3 = rows: three parts, s2 = s3 = rows: two. One launch where the few-row kernels
 * take the call (cuda_mm_set_few), else one cuda_mm_matmul per part on a view of its rows: each
 * output is cuda_mm_matmul's bits. */
void cuda_mm_matmul_parts(const cuda_mat *W, int64_t nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                          float *Y, int64_t ldy, int64_t s1, float *Y2, int64_t ldy2, int64_t s2, float *Y3,
                          int64_t ldy3, int64_t s3, float *Y4, int64_t ldy4, void *stream);

/* The decode step's router in one launch: logits[r] = W row r . x (cuda_mm_matmul with nb = 1 on
 * the float path: W F32 / F16 / BF16) for the NE expert rows and, when sh_id >= 0, one more row
 * (the shared expert's gate); then the routing of cuda_moe_route (sh_id < 0) or cuda_moe_route_sh
 * (slot K = (sh_id, sigmoid(logits[NE]))) by the grid's last block, the same bits. ctr: a device
 * counter, 0 before the call and again after it. 0, or FLOE_E_UNSUPPORTED (another type, NE >
 * 512, K > 64, rows != NE (+ 1)): nothing launched, run the two steps instead. */
int cuda_mm_router_route(const cuda_mat *W, const float *x, float *logits, int NE, int K, int norm_topk, int sh_id,
                         int32_t *sel, float *w, unsigned *ctr, void *stream);

/* The norms of cuda_ops.h with the quantization of their output fused in (one launch):
 * cuda_mm_norm_act: y = rmsnorm(x (+= delta when delta is not NULL)) * w per row, bit-identical to
 * cuda_add_rmsnorm / cuda_rmsnorm; cuda_mm_combine_act: cuda_moe_combine. Then, when W and xq are
 * not NULL and W has an activation layout, xq row t = the bytes cuda_mm_act_quantize(W) writes for
 * row t of y (h). W == NULL: the plain norm (cuda_ops.h's functions are these). */
void cuda_mm_norm_act(const cuda_mat *W, float *x, const float *delta, const float *w, float *y, int64_t n_rows,
                      int64_t n, float eps, void *xq, size_t xq_stride, void *stream);
/* cuda_mm_norm_act on x's rows set to the token embedding rows of tok[0..n_rows) (device ints; the
 * matrix edata of etype, erow_bytes a row, n_vocab rows; a type cuda_embed_check takes) in the same
 * launch: x and y (and xq) as cuda_embed_rows into x, then cuda_mm_norm_act(delta NULL), bit for bit.
 * keys not NULL: the last row's token is the argmax those keys gathered (cuda_mm_matmul_amax),
 * written to tok[n_rows - 1] too. */
void cuda_mm_embed_norm_act(const cuda_mat *W, uint32_t etype, const void *edata, size_t erow_bytes, int64_t n_vocab,
                            int32_t *tok, const unsigned long long *keys, float *x, const float *w, float *y,
                            int64_t n_rows, int64_t n, float eps, void *xq, size_t xq_stride, void *stream);
/* Two norms in one launch (the MTP's input): y row t (2n floats) = [rmsnorm(x1 row t) * w1 |
 * rmsnorm(x2 row t) * w2], each half cuda_rmsnorm's bits. */
void cuda_mm_norm_pair(const float *x1, const float *w1, const float *x2, const float *w2, float *y, int64_t n_rows,
                       int64_t n, float eps, void *stream);
/* cuda_mm_norm_pair, and when W (2n columns) has an activation layout that the warp quantizer
 * writes in whole 256-value chunks (n a multiple of 256, not MLX, FLOE_CUDA_ACT2 on) xq row t =
 * cuda_mm_act_quantize(W) of y row t, in the same launch: returns 1 then, else 0 (xq not written). */
int cuda_mm_norm_pair_act(const cuda_mat *W, const float *x1, const float *w1, const float *x2, const float *w2,
                          float *y, int64_t n_rows, int64_t n, float eps, void *xq, size_t xq_stride, void *stream);
/* cuda_mm_norm_pair_act with x1's rows the token embedding rows of tok[0..n_rows) (device ints; the
 * matrix edata of etype, erow_bytes a row, n_vocab rows; a type cuda_embed_check takes), dequantized
 * in the launch with cuda_embed_rows' values: the same outputs as cuda_embed_rows then
 * cuda_mm_norm_pair_act, one launch. keys: as cuda_mm_embed_norm_act's. */
int cuda_mm_embed_norm_pair_act(const cuda_mat *W, uint32_t etype, const void *edata, size_t erow_bytes,
                                int64_t n_vocab, int32_t *tok, const unsigned long long *keys, const float *w1,
                                const float *x2, const float *w2, float *y, int64_t n_rows, int64_t n, float eps,
                                void *xq, size_t xq_stride, void *stream);
void cuda_mm_combine_act(const cuda_mat *W, float *x, const float *y, const float *w, int K, const float *sh,
                         const float *sh_logit, const float *norm_w, float *h, float eps, int64_t n_tok, int64_t n,
                         void *xq, size_t xq_stride, void *stream);

/* xq row b (xq + b * xq_stride) = kern_act_quantize(W, X + b * ldx), for b in [0, nb).
 * xq_stride: a multiple of 64 (cuda_mm_act_bytes is), xq 64-byte aligned (the kernels read the
 * rows with 16-byte loads). */
void cuda_mm_act_quantize(const cuda_mat *W, int64_t nb, const float *X, int64_t ldx, void *xq, size_t xq_stride,
                          void *stream);

/* Y[b * ldy + r] = dot(W row r, X row b) for r in [0, W->rows), b in [0, nb), any nb >= 1.
 * xq != NULL: the quantized path (xq rows xq_stride bytes apart, from cuda_mm_act_quantize with
 * a matrix of the same layout; X unused). xq == NULL: the float path on X (rows ldx floats apart). */
void cuda_mm_matmul(const cuda_mat *W, int64_t nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                    float *Y, int64_t ldy, void *stream);
/* cuda_mm_matmul through the quantized rows xq (nb of them), and each activation row b's argmax
 * gathered into keys + b * CUDA_AMK_ROW (cuda_ops.h; zero before the launch): 1 then; 0 where W's
 * launch does not gather them (cuda_mm_amax_ok false: nothing launched). Y the same bits as
 * cuda_mm_matmul's; the keys' index cuda_argmax's of each row. */
int cuda_mm_amax_ok(const cuda_mat *W, int64_t nb);
int cuda_mm_matmul_amax(const cuda_mat *W, int64_t nb, const void *xq, size_t xq_stride, float *Y, int64_t ldy,
                        unsigned long long *keys, void *stream);

/* out[i * ldo + j] = dequantized W row rows[i], element j (j < cols), i in [0, n): rows is a
 * DEVICE array (say, the token ids, for the embedding), or NULL for rows 0 .. n-1. A row id
 * outside [0, W->rows) gives a row of NaN. */
void cuda_mm_dequant_rows(const cuda_mat *W, const int32_t *rows, int64_t n, float *out, int64_t ldo, void *stream);

/* MoE gate+up+SiLU-GLU for T tokens x K slots: slot s = t * K + j uses expert e = ids[s] (a
 * DEVICE array of T * K int32; ids == NULL: expert 0 for every slot, K = 1, the shared expert)
 * and writes H[s * ldh + i] = silu(gate_e row i . x_t) * (up_e row i . x_t), i < gate->rows.
 * x_t: xq + t * xq_stride (quantized path, gate and up of one layout) or X + t * ldx (xq NULL).
 * An id outside [0, n_expert) gives a row of NaN. */
void cuda_mm_moe_gate_up(const cuda_mat *gate, const cuda_mat *up, int64_t T, int K, const int32_t *ids,
                         const float *X, int64_t ldx, const void *xq, size_t xq_stride, float *H, int64_t ldh,
                         void *stream);

/* One token's routing and its experts' gate+up+GLU in one launch (the decode step): the routing
 * of cuda_moe_route (sh_id < 0) or cuda_moe_route_sh (the shared expert's gate logit at
 * logits[n_expert], its slot K with id sh_id) from the router's logits, sel / w written as those
 * write them, then H as cuda_mm_moe_gate_up(T = 1, K (+ 1), sel, ..., xq) writes it: the same bits.
 * 0 when launched; FLOE_E_UNSUPPORTED where it does not apply (types other than Q4_K / Q5_K,
 * other kernel settings, no quantized input, more than 1024 experts or 32 a token;
 * cuda_mm_set_route_glu(0) / FLOE_CUDA_ROUTE_GLU=0): then nothing was launched. */
int cuda_mm_moe_gate_up_route(const cuda_mat *gate, const cuda_mat *up, const float *logits, int n_expert, int K,
                              int norm_topk, int sh_id, int32_t *sel, float *w, const void *xq, float *H, int64_t ldh,
                              void *stream);
void cuda_mm_set_route_glu(int on);

/* MoE down for T * K slots: Y[s * ldy + r] = down_e row r . h_s, with h_s = H + s * ldh and
 * e = ids[s] (ids NULL: expert 0). When the down type has a quantized path each h_s is first
 * quantized into xq_scratch (T * K rows of xq_stride >= cuda_mm_act_bytes(down) bytes), as the
 * CPU does; otherwise xq_scratch is unused (may be NULL) and the float path runs.
 * The weighted sum of the K outputs is not done here. */
void cuda_mm_moe_down(const cuda_mat *down, int64_t T, int K, const int32_t *ids, const float *H, int64_t ldh,
                      void *xq_scratch, size_t xq_stride, float *Y, int64_t ldy, void *stream);

/* The MoE of a prefill chunk with its slots grouped by expert, so that each expert's weights are
 * read once per tile of up to 32 slots (tensor-core kernels, mm_mma.cuh; Q4_K / Q5_K with rows of
 * at most 16 superblocks, gate+up at most 8). cuda_mm_moe_group fills grp (device memory of
 * cuda_mm_moe_group_bytes(slots, n_expert) bytes) from the device ids of `slots` slots, for an
 * expert stack of n_expert (<= CUDA_MM_GROUP_MAX_EXPERT: more, and nothing is written and the _grp calls below must
 * not be given grp). The _grp calls take the same arguments as cuda_mm_moe_gate_up /
 * cuda_mm_moe_down plus grp (made from these ids and the stack's n_expert), write the same bits,
 * and fall back to those calls where the kernels do not apply (grp NULL, another type). */
#define CUDA_MM_GROUP_MAX_EXPERT 1023 /* experts of a stack that can be grouped (+1 run of bad ids) */
size_t cuda_mm_moe_group_bytes(int64_t slots, int n_expert);
/* 1 when a grouping would be used by cuda_mm_moe_gate_up_grp or cuda_mm_moe_down_grp for these
 * matrices (their types and shapes take the tensor-core kernels), 0 when both would fall back
 * (then cuda_mm_moe_group need not run) */
int cuda_mm_moe_group_useful(const cuda_mat *gate, const cuda_mat *up, const cuda_mat *down);
void cuda_mm_moe_group(const int32_t *ids, int64_t slots, int n_expert, void *grp, void *stream);
void cuda_mm_moe_gate_up_grp(const cuda_mat *gate, const cuda_mat *up, int64_t T, int K, const int32_t *ids,
                             const void *grp, const float *X, int64_t ldx, const void *xq, size_t xq_stride, float *H,
                             int64_t ldh, void *stream);
void cuda_mm_moe_down_grp(const cuda_mat *down, int64_t T, int K, const int32_t *ids, const void *grp, const float *H,
                          int64_t ldh, void *xq_scratch, size_t xq_stride, float *Y, int64_t ldy, void *stream);
/* Q4_K / Q5_K calls of 16 or more activation rows: 1 = the tensor-core kernels where they apply
 * (the default), 0 = k_k4 (the same bits; FLOE_CUDA_MMA=0 sets 0 at the first launch). */
void cuda_mm_set_mma(int on);
/* Which tensor-core kernel: 2 = k_k4mma2 (16 slots a warp pass, only the n-tiles holding slots,
 * the weights loaded at their use after an L2 prefetch, 8-warp blocks; the default), 1 = k_k4mma2
 * with the weights a superblock ahead in registers (4-warp blocks), 0 = k_k4mma. The same bits
 * (test_cuda_mm runs all three); FLOE_CUDA_MMA2=0/1/2 sets it at the first launch. */
void cuda_mm_set_mma2(int impl);

/* Tests and benchmarks: which implementation the 16-lane types use (both give the same bits):
 * AUTO (the default) picks by shape, WARP forces a warp per row (mm_q16.cu), LANES 4 lanes per
 * thread (mm_q4l.cu). Not thread-safe; set it before launching. */
enum { CUDA_MM_Q16_AUTO = 0, CUDA_MM_Q16_WARP = 1, CUDA_MM_Q16_LANES = 2 };
void cuda_mm_set_q16_impl(int impl);
/* Q4_K / Q5_K one-activation-row calls (decode, the MoE modes): 1 = a warp per weight row
 * (k_k4w, the default), 0 = 8 threads per row (k_k4). Both give the same bits (test_cuda_mm runs
 * both); FLOE_CUDA_K4W=0 sets 0 at the first launch. */
void cuda_mm_set_k4w(int on);
/* k_k4w: a row's rounds (4 superblocks each) in batches of nr (2 or 4) with all their loads issued
 * before the first round's arithmetic, and k_k4wn (2..15 rows) with the next round's weight words
 * loaded while a round computes (nr >= 2), instead of one round's loads at a time (1, the default
 * until measured on the H200). The same operations in the same order, so the same bits
 * (test_cuda_mm runs each); FLOE_CUDA_K4W_PIPE=2 / 4 sets it at the first launch. */
void cuda_mm_set_k4w_pipe(int nr);
/* The one-row Q4_K / Q5_K dot: level 1 = 4 lanes a superblock in k_k4w (a round covers 8
 * superblocks; two shuffle levels instead of three, half of the 8-lane form's redundant
 * per-superblock scale and float work; 35B decode +4.5 % on the H200), 2 = in k_k4s too (rows of
 * one or two superblocks: the MoE down; the default, a further +2.1 %), 3 = in the few-row kernel
 * too (k_k4vn: 2..15 activation rows, a speculative verify; opt-in until measured), 0 = 8 lanes. The same bits (test_cuda_mm
 * runs each); FLOE_CUDA_K4V=0 / 1 / 2 / 3 sets it at the first launch. k_k4w's rounds in batches
 * (cuda_mm_set_k4w_pipe 2 / 4) take the 8 lanes. */
void cuda_mm_set_k4v(int level);
/* Q4_K / Q5_K with 2..15 quantized activation rows (a speculative verify, a small batch): 1 = the
 * tensor-core kernel k_k4mn (16 weight rows x 8 activation rows an mma; the default), 0 = the
 * dp4a kernels (k_k4wn / k_k4vn). cuda_mm_set_one_mma(1): k_k4mn for one activation row too
 * (opt-in). The same bits (test_cuda_mm runs each); FLOE_CUDA_FEW_MMA=0 / FLOE_CUDA_ONE_MMA=1 set
 * them at the first launch. */
void cuda_mm_set_few_mma(int on);
void cuda_mm_set_one_mma(int on);
/* k_k4w's one-row MM_PLAIN calls whose warps have two rows or more (the output head, the GDN
 * input q|k|v|z|b|a): 1 = two rows a warp at once, their loads in flight together (k_k4w2, with
 * the dot cuda_mm_set_k4v picks; the default: +2-4 % 35B decode on the H200 with the 4-lane dot,
 * where with the 8-lane dot it was 1-2 % slower), 0 = one at a time. The same bits (test_cuda_mm
 * runs both); FLOE_CUDA_K4W_PAIR=0 sets 0 at the first launch. */
void cuda_mm_set_k4w_pair(int on);
/* With k_k4w: rows of one or two superblocks with 2 or 4 rows a warp (k_k4s, the default), 0 =
 * k_k4w for them too. The same bits (test_cuda_mm runs both); FLOE_CUDA_K4S=0 sets 0 at the
 * first launch. */
void cuda_mm_set_k4s(int on);
/* With k_k4s: the MoE down projection (cuda_mm_moe_down, quantized) quantizes its input rows in
 * its own launch, a block its slot's row in shared memory (1), instead of a k_act launch before
 * it (0, the default: one launch fewer a layer measured no faster on the H200, 0.6 % slower). The
 * same bytes, so the same bits (test_cuda_mm runs both); FLOE_CUDA_DOWN_QX=1 sets 1 at the first
 * launch. */
void cuda_mm_set_down_qx(int on);
/* F32 / F16 / BF16 matmuls of several activation rows: 1 = k_plain_tile (activation chunks staged
 * in shared memory for 16 weight rows, the default), 0 = k_plain. The same bits (test_cuda_mm runs
 * both); FLOE_CUDA_PLAIN_TILE=0 sets 0 at the first launch. */
void cuda_mm_set_plain_tile(int on);
/* 2..8 rows of an F32 / F16 / BF16 matrix: a block row per activation row (k_plain1n, the default)
 * or the weights loaded once for all rows (k_plainn); the same bits */
void cuda_mm_set_plain1n(int on);
/* k_k4w's weight prefetch into L2 before it waits for the previous kernel (the default, on = 1;
 * FLOE_CUDA_PF=0 sets 0 at the first launch; the same bits either way) and, for tests, the most
 * blocks one of its launches may have (0: as many as fit on the GPU at once), so that its warps
 * loop over several rows. */
void cuda_mm_set_pf(int on, int max_blocks);
/* Matmuls of a few activation rows (2..15: a speculative verify, a small batch) with the one-row
 * kernels' shape, a warp per weight row loaded once for every activation row (k_k4wn for Q4_K /
 * Q5_K up to 15 rows, k_plainn for F32 / F16 / BF16 up to 8): 1 = on (the default), 0 = the
 * several-row kernels (k_k4 / k_plain_tile). The same bits (test_cuda_mm runs both);
 * FLOE_CUDA_FEW=0 sets 0 at the first launch. */
void cuda_mm_set_few(int on);
/* Tests: activation rows a warp takes in k_q16's launches of 2..4 rows (1, 2 or 4; 2 the default,
 * FLOE_CUDA_Q16_FEW_NB at the first call): the same bits */
void cuda_mm_set_q16_few_nb(int nb);
/* Activation quantization of A32 / A256 rows (cuda_mm_act_quantize, the fused norms) and the MoE
 * combine's sum: 1 = a warp per 256 values in registers and the combine's loads batched (the
 * default), 0 = the first forms. The same bytes (test_cuda_mm runs both); FLOE_CUDA_ACT2=0 sets
 * 0 at the first launch. */
void cuda_mm_set_act2(int on);

#ifdef __cplusplus
}
#endif
#endif
