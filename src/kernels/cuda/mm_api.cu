/* cuda_mm.h: the host side. Builds the kernel argument block (KArgs) from a cuda_mat, with the
 * activation layout computed by the CPU's own kact_layout_of (so the byte layouts cannot drift
 * apart), and dispatches each call to the quantized kernels (mm_q16.cu, mm_k4.cu), the float
 * path (mm_float.cu) or the activation quantizer (mm_act.cu). */
#include "kernels/cuda/mm_common.cuh"

static floe_mat host_layout(const cuda_mat *W) {
  floe_mat m;
  memset(&m, 0, sizeof m);
  m.type = W->type;
  m.rows = W->rows;
  m.cols = W->cols;
  m.row_bytes = W->row_bytes;
  m.mlx = W->mlx;
  m.sb_row_bytes = W->sb_row_bytes;
  return m;
}

KArgs mm_kargs(const cuda_mat *W) {
  KArgs a;
  memset(&a, 0, sizeof a);
  a.data = (const uint8_t *)W->data;
  a.row_bytes = W->row_bytes;
  a.sc = (const uint8_t *)W->scales;
  a.bi = (const uint8_t *)W->biases;
  a.sb_row_bytes = W->sb_row_bytes;
  a.rows = W->rows;
  a.cols = W->cols;
  a.type = (int)W->type;
  a.bits = W->mlx.bits;
  a.group = W->mlx.group;
  a.sb_type = (int)W->mlx.sb_type;
  a.n_expert = W->n_expert > 0 ? W->n_expert : 1;
  a.estride = W->expert_stride;
  a.sb_estride = W->sb_expert_stride;
  const floe_mat m = host_layout(W);
  const kact_layout L = kact_layout_of(&m);
  a.nblk = W->type == FLOE_TYPE_MLX && W->mlx.group > 0 ? W->cols / W->mlx.group : L.nblk;
  a.nq = L.nq;
  a.off_d = L.off_d;
  a.off_s = L.off_s;
  a.off_c = L.off_c;
  a.off_e = L.off_e;
  if (W->type == FLOE_TYPE_MXFP4) memcpy(a.kv, kvalues_mxfp4, 16);
  else memcpy(a.kv, kvalues_iq4nl, 16);
  return a;
}

int cuda_mm_type_supported(uint32_t type, int64_t cols, const quant_mlx_fmt *mlx, char *err, size_t errlen) {
  if (cols <= 0) return floe_err(err, errlen, FLOE_E_INVALID, "CUDA matmul: %lld columns", (long long)cols);
  if (type == FLOE_TYPE_MLX) {
    if (!mlx || !quant_mlx_fmt_valid(mlx))
      return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA matmul: invalid MLX format");
    if (cols % mlx->group)
      return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA matmul: MLX row of %lld values is not whole groups of %d",
                      (long long)cols, mlx->group);
    return 0;
  }
  const floe_type_traits *tt = floe_type_info(type);
  if (!tt) return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA matmul: unknown tensor type %u", type);
  switch (type) {
    case FLOE_TYPE_F32: case FLOE_TYPE_F16: case FLOE_TYPE_BF16: case FLOE_TYPE_Q4_0: case FLOE_TYPE_Q4_1:
    case FLOE_TYPE_Q5_0: case FLOE_TYPE_Q5_1: case FLOE_TYPE_Q8_0: case FLOE_TYPE_MXFP4: case FLOE_TYPE_IQ4_NL:
    case FLOE_TYPE_Q2_K: case FLOE_TYPE_Q3_K: case FLOE_TYPE_Q4_K: case FLOE_TYPE_Q5_K: case FLOE_TYPE_Q6_K:
    case FLOE_TYPE_IQ4_XS: case FLOE_TYPE_IQ2_XXS: case FLOE_TYPE_IQ2_XS: case FLOE_TYPE_IQ2_S:
    case FLOE_TYPE_IQ3_XXS: case FLOE_TYPE_IQ3_S: case FLOE_TYPE_IQ1_S: case FLOE_TYPE_IQ1_M:
      break;
    default:
      return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA matmul: tensor type %s has no CUDA kernel", tt->name);
  }
  if (cols % tt->blck)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA matmul: %s row of %lld values is not whole blocks of %d",
                    tt->name, (long long)cols, tt->blck);
  return 0;
}

size_t cuda_mm_act_bytes(const cuda_mat *W) {
  const floe_mat m = host_layout(W);
  return kern_act_bytes(&m);
}

void cuda_mm_act_quantize(const cuda_mat *W, int64_t nb, const float *X, int64_t ldx, void *xq, size_t xq_stride,
                          void *stream) {
  if (nb <= 0 || !cuda_mm_act_bytes(W)) return;
  mm_act_launch(mm_kargs(W), nb, X, ldx, (uint8_t *)xq, xq_stride, (cudaStream_t)stream);
}

/* 16-lane types: two implementations of the same order, bit-identical (the test runs both).
 * Measured on the H200 (bench_cuda_mm): 4 lanes per thread (mm_q4l.cu) wins when there are many
 * output rows (248320-row output head: Q6_K 1.76 vs 1.44 TB/s, Q8_0 1.42 vs 1.11; the MoE down,
 * 8 x 2048 rows), a warp per row (mm_q16.cu) when there are few (8192 rows and below, the MoE
 * gate+up, 8 x 512 rows), where 4 threads per row leave the GPU short of threads. */
static int g_q16_impl = CUDA_MM_Q16_AUTO;

void cuda_mm_set_q16_impl(int impl) { g_q16_impl = impl; }

/* The quantized kernels, or false when the type has none. row_slots: output rows x slots. */
static bool q_launch(const KArgs &a, const KArgs &a2, int mode, int64_t nb, int K, const int32_t *ids,
                     const uint8_t *xq, size_t xs, float *Y, int64_t ldy, cudaStream_t st) {
  if (mm_k4_launch(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st)) return true;
  int impl = g_q16_impl;
  if (impl == CUDA_MM_Q16_AUTO) {
    const int64_t row_slots = a.rows * (mode == MM_PLAIN ? 1 : nb);
    impl = row_slots >= 16384 ? CUDA_MM_Q16_LANES : CUDA_MM_Q16_WARP;
  }
  return impl == CUDA_MM_Q16_WARP ? mm_q16_launch(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st)
                                  : mm_q4l_launch(a, a2, mode, nb, K, ids, xq, xs, Y, ldy, st);
}

/* Activation rows from which a matmul takes the tensor-core kernels where they apply (below it,
 * k_k4's 16-row tiles read each weight once anyway) */
#define MMA_MIN_NB 16

void cuda_mm_matmul(const cuda_mat *W, int64_t nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                    float *Y, int64_t ldy, void *stream) {
  if (nb <= 0 || W->rows <= 0) return;
  const KArgs a = mm_kargs(W);
  const cudaStream_t st = (cudaStream_t)stream;
  if (xq && cuda_mm_act_bytes(W) &&
      ((nb >= MMA_MIN_NB && mm_mma_launch(a, nb, (const uint8_t *)xq, xq_stride, Y, ldy, st)) ||
       q_launch(a, a, MM_PLAIN, nb, 1, nullptr, (const uint8_t *)xq, xq_stride, Y, ldy, st)))
    return;
  mm_float_launch(a, a, MM_PLAIN, nb, 1, nullptr, X, ldx, Y, ldy, st);
}

/* The heads whose launches gather their rows' argmax keys (cuda_mm_matmul_amax): the k_q16 types
 * where one warp a weight row is the kernel cuda_mm_matmul takes (fewer than 16384 rows, or the warp
 * form chosen), for a few activation rows */
int cuda_mm_amax_ok(const cuda_mat *W, int64_t nb) {
  if (nb < 1 || nb >= MMA_MIN_NB || !cuda_mm_act_bytes(W)) return 0;
  const KArgs a = mm_kargs(W);
  if (g_q16_impl == CUDA_MM_Q16_LANES || (g_q16_impl == CUDA_MM_Q16_AUTO && a.rows >= 16384)) return 0;
  return mm_q16_has_type(a);
}

int cuda_mm_matmul_amax(const cuda_mat *W, int64_t nb, const void *xq, size_t xq_stride, float *Y, int64_t ldy,
                        unsigned long long *keys, void *stream) {
  if (!xq || !keys || !cuda_mm_amax_ok(W, nb)) return 0;
  return mm_q16_amax_launch(mm_kargs(W), nb, (const uint8_t *)xq, xq_stride, Y, ldy, keys, (cudaStream_t)stream);
}

/* W's rows [r0, r1) as a matrix of their own (not an expert stack) */
static cuda_mat rows_view(const cuda_mat *W, int64_t r0, int64_t r1) {
  cuda_mat v = *W;
  v.data = (const uint8_t *)W->data + (size_t)r0 * W->row_bytes;
  if (W->scales) v.scales = (const uint8_t *)W->scales + (size_t)r0 * W->sb_row_bytes;
  if (W->biases) v.biases = (const uint8_t *)W->biases + (size_t)r0 * W->sb_row_bytes;
  v.rows = r1 - r0;
  return v;
}

void cuda_mm_matmul_parts(const cuda_mat *W, int64_t nb, const float *X, int64_t ldx, const void *xq, size_t xq_stride,
                          float *Y, int64_t ldy, int64_t s1, float *Y2, int64_t ldy2, int64_t s2, float *Y3,
                          int64_t ldy3, int64_t s3, float *Y4, int64_t ldy4, void *stream) {
  if (nb <= 0 || W->rows <= 0) return;
  if (s2 < s1) s2 = s1;
  if (s2 > W->rows) s2 = W->rows;
  if (s3 < s2) s3 = s2;
  if (s3 > W->rows) s3 = W->rows;
  const KArgs a = mm_kargs(W);
  const cudaStream_t st = (cudaStream_t)stream;
  const MMOut o = {{Y, Y2, Y3, Y4}, {ldy, ldy2, ldy3, ldy4}, s1, s2, s3};
  if (xq && cuda_mm_act_bytes(W) ? mm_k4_few_launch(a, nb, (const uint8_t *)xq, xq_stride, o, st) ||
                                       mm_q16_few_launch(a, nb, (const uint8_t *)xq, xq_stride, o, st)
                                 : mm_float_few_launch(a, nb, X, ldx, o, st))
    return;
  const int64_t b[5] = {0, s1, s2, s3, W->rows};
  float *const y[4] = {Y, Y2, Y3, Y4};
  const int64_t ld[4] = {ldy, ldy2, ldy3, ldy4};
  for (int p = 0; p < 4; p++) {
    if (b[p + 1] <= b[p]) continue;
    const cuda_mat v = rows_view(W, b[p], b[p + 1]);
    cuda_mm_matmul(&v, nb, X, ldx, xq, xq_stride, y[p], ld[p], stream);
  }
}

int cuda_mm_router_route(const cuda_mat *W, const float *x, float *logits, int NE, int K, int norm_topk, int sh_id,
                         int32_t *sel, float *w, unsigned *ctr, void *stream) {
  return router_route_launch(mm_kargs(W), x, logits, NE, K, norm_topk, sh_id, sel, w, ctr, (cudaStream_t)stream);
}

void cuda_mm_dequant_rows(const cuda_mat *W, const int32_t *rows, int64_t n, float *out, int64_t ldo, void *stream) {
  mm_dequant_launch(mm_kargs(W), rows, n, out, ldo, (cudaStream_t)stream);
}

/* The grid's y dimension (one slot per row of blocks) is at most 65535: longer calls go in parts
 * of whole tokens. */
#define MM_MAX_SLOTS 65535

void cuda_mm_moe_gate_up(const cuda_mat *gate, const cuda_mat *up, int64_t T, int K, const int32_t *ids,
                         const float *X, int64_t ldx, const void *xq, size_t xq_stride, float *H, int64_t ldh,
                         void *stream) {
  if (T <= 0 || K <= 0 || gate->rows <= 0) return;
  const KArgs a = mm_kargs(gate), a2 = mm_kargs(up);
  const cudaStream_t st = (cudaStream_t)stream;
  const bool q = xq && cuda_mm_act_bytes(gate);
  const int64_t tpc = MM_MAX_SLOTS / K; /* tokens per call */
  for (int64_t t0 = 0; t0 < T; t0 += tpc) {
    const int64_t nt = T - t0 < tpc ? T - t0 : tpc, s0 = t0 * K;
    const int32_t *id = ids ? ids + s0 : nullptr;
    float *h = H + s0 * ldh;
    if (q && q_launch(a, a2, MM_GLU, nt * K, K, id, (const uint8_t *)xq + (size_t)t0 * xq_stride, xq_stride, h, ldh, st))
      continue;
    mm_float_launch(a, a2, MM_GLU, nt * K, K, id, X ? X + t0 * ldx : nullptr, ldx, h, ldh, st);
  }
}

int cuda_mm_moe_gate_up_route(const cuda_mat *gate, const cuda_mat *up, const float *logits, int n_expert, int K,
                              int norm_topk, int sh_id, int32_t *sel, float *w, const void *xq, float *H, int64_t ldh,
                              void *stream) {
  if (!xq || !cuda_mm_act_bytes(gate) || gate->rows <= 0 || (sh_id >= 0 && sh_id >= gate->n_expert))
    return FLOE_E_UNSUPPORTED;
  const KRoute rt = { logits, n_expert, K, norm_topk, sh_id, sel, w };
  return mm_k4_glu_route_launch(mm_kargs(gate), mm_kargs(up), rt, (const uint8_t *)xq, H, ldh, (cudaStream_t)stream)
             ? 0
             : FLOE_E_UNSUPPORTED;
}

void cuda_mm_moe_down(const cuda_mat *down, int64_t T, int K, const int32_t *ids, const float *H, int64_t ldh,
                      void *xq_scratch, size_t xq_stride, float *Y, int64_t ldy, void *stream) {
  if (T <= 0 || K <= 0 || down->rows <= 0) return;
  const KArgs a = mm_kargs(down);
  const cudaStream_t st = (cudaStream_t)stream;
  const int64_t slots = T * K;
  const bool q = xq_scratch && cuda_mm_act_bytes(down);
  if (q && mm_k4_down_qx_launch(a, slots, ids, H, ldh, xq_stride, Y, ldy, st)) return;
  if (q) mm_act_launch(a, slots, H, ldh, (uint8_t *)xq_scratch, xq_stride, st);
  for (int64_t s0 = 0; s0 < slots; s0 += MM_MAX_SLOTS) {
    const int64_t ns = slots - s0 < MM_MAX_SLOTS ? slots - s0 : MM_MAX_SLOTS;
    const int32_t *id = ids ? ids + s0 : nullptr;
    if (q && q_launch(a, a, MM_DOWN, ns, 1, id, (const uint8_t *)xq_scratch + (size_t)s0 * xq_stride, xq_stride,
                      Y + s0 * ldy, ldy, st))
      continue;
    mm_float_launch(a, a, MM_DOWN, ns, 1, id, H + s0 * ldh, ldh, Y + s0 * ldy, ldy, st);
  }
}

int cuda_mm_moe_group_useful(const cuda_mat *gate, const cuda_mat *up, const cuda_mat *down) {
  const KArgs g = mm_kargs(gate), u = mm_kargs(up), d = mm_kargs(down);
  return (mm_mma_fits(g, MM_GLU) && u.type == g.type) || mm_mma_fits(d, MM_DOWN) ? 1 : 0;
}

void cuda_mm_moe_gate_up_grp(const cuda_mat *gate, const cuda_mat *up, int64_t T, int K, const int32_t *ids,
                             const void *grp, const float *X, int64_t ldx, const void *xq, size_t xq_stride, float *H,
                             int64_t ldh, void *stream) {
  if (T <= 0 || K <= 0 || gate->rows <= 0) return;
  if (xq && cuda_mm_act_bytes(gate) &&
      mm_mma_moe_launch(mm_kargs(gate), mm_kargs(up), MM_GLU, T * K, K, grp, (const uint8_t *)xq, xq_stride, H, ldh,
                        (cudaStream_t)stream))
    return;
  cuda_mm_moe_gate_up(gate, up, T, K, ids, X, ldx, xq, xq_stride, H, ldh, stream);
}

void cuda_mm_moe_down_grp(const cuda_mat *down, int64_t T, int K, const int32_t *ids, const void *grp, const float *H,
                          int64_t ldh, void *xq_scratch, size_t xq_stride, float *Y, int64_t ldy, void *stream) {
  if (T <= 0 || K <= 0 || down->rows <= 0) return;
  const KArgs a = mm_kargs(down);
  const cudaStream_t st = (cudaStream_t)stream;
  if (grp && xq_scratch && cuda_mm_act_bytes(down) && mm_mma_fits(a, MM_DOWN)) {
    mm_act_launch(a, T * K, H, ldh, (uint8_t *)xq_scratch, xq_stride, st);
    mm_mma_moe_launch(a, a, MM_DOWN, T * K, K, grp, (const uint8_t *)xq_scratch, xq_stride, Y, ldy, st);
    return;
  }
  cuda_mm_moe_down(down, T, K, ids, H, ldh, xq_scratch, xq_stride, Y, ldy, stream);
}
