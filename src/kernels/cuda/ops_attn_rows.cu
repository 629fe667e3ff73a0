/* The prefill rows kernel (k_attn_rows) with its launch, in a file of its own so that it compiles
 * beside ops_attn.cu and ops_attn_tc.cu (ops_attn.cuh has what they share). */
#include <stdlib.h>

#include "kernels/cuda/ops_attn.cuh"

/* ---- prefill: a block per (part c, kv head / head batch, group of R rows) ----
 * k_attn_rows computes what k_attn computes for each of its rows, with the same operations in the
 * same order, but streams each K/V tile once for the block's QR = R x HBH query rows (row, head)
 * instead of once per row. Why the bits are those of decode:
 *   - a row's parts depend only on its np (CH = roundup128(ceil(np / n_split)), part c starts at
 *     c * CH), and tiles start at part starts, TP dividing 128: every row of every block sees the
 *     one tile grid of TP positions aligned in absolute positions. The block's rows with the same
 *     CH (consecutive rows; CH grows with np) share p0 = c * CH and differ only in where their part
 *     ends (p0 + CH or np), so a tile is, for a row, whole, cut at np, or past its part; rows of
 *     another CH (a group straddling a CH step) run afterwards as a second subgroup.
 *   - scores: one thread per (position, query row) runs the 16 lane chains of k_attn's half-warp
 *     (chain l: fmaf over j of q[l + 16 j] k[l + 16 j]) one after another and folds them with
 *     ops_fold16's tree (8, 4, 2, 1), then times the scale;
 *   - softmax: a warp per query row, k_attn's code, over the row's positions of the tile;
 *   - V sums: thread (dg, pg) keeps k_attn's accumulators o[DPT] (position group pg, dims
 *     d0..d0+DPT-1) for each of the QR rows in registers: o *= alpha, then fmaf in position order
 *     over the row's positions pg, pg + NPG, ...; the group sums and the part's (o, m, l) as k_attn;
 *   - the last block of a (row group, kv head batch) combines each row's parts as k_attn does.
 * Parts go to the scratch at ((t * n_head + head) * n_split + c) * (HD + 4) floats.
 * Floors of a 512-row chunk at depth D, Qwen3.5-35B-A3B shape (16 q / 2 kv heads, head_dim 256,
 * bf16 cache): 512 D + 131328 (row, position) pairs, 16 x (256 + 256) fmaf each: D = 0 1.08 G fmaf
 * (32 us at the FP32 rate, 33.5 T fmaf/s), 32K 138 G (4.1 ms), 128K 551 G (16.4 ms). K/V bytes
 * (2 KiB a position): k_attn reads them once per row, 34.6 GB at 32K (8.0 ms at 4.3 TB/s) and
 * 138 GB at 128K (32 ms); here once per block of 2 rows, and blocks of one part run together
 * (row groups vary fastest in the grid), so most of those reads hit L2. The fmaf chains cannot
 * use the tensor cores (their order is decode's), so the FP32 rate is the floor at every depth. */


template <int HD, bool BF>
static __global__ void __launch_bounds__(ATT_THREADS, 1)
    k_attn_rows(const float *q, const void *kc, const void *vc, const int32_t *pos0, float *out, float *part,
                int *cnt, int nh, int nkv, int hd, int64_t n_ctx, int gated, int n_split, float scale, int n_tok,
                int R, int HBH) {
  PDL_ENTER();
  constexpr int QR = ATR_QR, QB = ATR_QB;
  constexpr int ES = BF ? 2 : 4;
  constexpr int TP = att_tp(HD, ES);
  constexpr int RB = atr_rb(HD, ES);
  constexpr int TB = TP * RB;
  constexpr int LPT = HD / 16;
  constexpr int DPT = HD >= 64 ? 4 : 2;
  constexpr int ND = HD / DPT, NPG = ATT_THREADS / ND;
  constexpr int NG = ATT_THREADS / TP, QPT = QR / NG; /* score groups of threads; query rows a thread scores */
  constexpr int NPP = TP / NPG; /* positions of a tile per V-sum thread */
  static_assert(NPP % 4 == 0, "a V-sum thread's exps load as float4");
  static_assert(QR % NG == 0 && QPT >= 1, "query rows split evenly over the score groups");
  static_assert((size_t)(NPG - 1) * QR * HD * 4 <= atr_union(HD, ES), "group sums fit the stages");
  extern __shared__ __align__(16) unsigned char att_sm[];
  float *qs = (float *)(att_sm + atr_union(HD, ES)); /* [QR][HD], zero past hd and past the block's rows */
  float *sc = qs + QR * HD; /* [QR][TP]: scores, then exps, position p at PERM(p): a V-sum thread's contiguous */
#define PERM(p) (((p) % NPG) * NPP + (p) / NPG)
  __shared__ float s_alpha[QR], s_m[QR], s_l[QR];
  __shared__ int s_np[QR]; /* the query row's positions in the current tile (0: none) */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = nh / nkv, nhb = G / HBH;
  /* row groups vary fastest in launch order: the blocks running at once read the same part's K/V;
   * the last rows (the longest) first, so that the short ones fill the tail */
  const int grp = gridDim.x - 1 - blockIdx.x, y = blockIdx.y, c = blockIdx.z;
  const int kh = y / nhb, head0 = kh * G + (y % nhb) * HBH;
  const int t0 = grp * R, nr = n_tok - t0 < R ? n_tok - t0 : R, nq = nr * HBH; /* query row i = r * HBH + h */
  const int64_t base = *pos0;
  const int qs_row = hd * (gated ? 2 : 1);
  const size_t PF = (size_t)HD + 4;
  const bool exact = hd == HD;
  const unsigned char *K = (const unsigned char *)kc + (size_t)kh * n_ctx * hd * ES;
  const unsigned char *V = (const unsigned char *)vc + (size_t)kh * n_ctx * hd * ES;
  const int64_t np0 = base + t0 + 1; /* np of the block's row 0 */
  for (int e = tid; e < QR * HD; e += ATT_THREADS) {
    const int i = e / HD, d = e % HD;
    float v = 0.0f;
    if (i < nq && d < hd) v = q[((int64_t)(t0 + i / HBH) * nh + head0 + i % HBH) * qs_row + d];
    qs[e] = v;
  }
  const int dg = tid % ND, pg = tid / ND, d0 = DPT * dg;
  for (int r0 = 0; r0 < nr;) { /* subgroups of rows with one part size */
    const AtrSub u = atr_sub(np0, r0, nr, c, n_split);
    const int r1 = u.r1, i0 = r0 * HBH, i1 = r1 * HBH; /* its query rows */
    if (!u.has) {
      r0 = r1;
      continue;
    }
    const int64_t p0 = u.p0, pend = u.pend;
    const int ntiles = (int)((pend - p0 + TP - 1) / TP);
    auto issue = [&](int it, int st) { /* k_attn's tile load, up to pend */
      const int64_t tp0 = p0 + (int64_t)it * TP;
      unsigned char *ks = att_sm + (size_t)st * 2 * TB;
      att_load_tile<HD, BF, RB>(ks, ks + TB, K, V, tp0, (int)(pend - tp0 < TP ? pend - tp0 : TP), hd, exact);
    };
#pragma unroll
    for (int s = 0; s < ATT_STAGES - 1; s++) {
      if (s < ntiles) issue(s, s);
      ops_cp_commit();
    }
    float o[QR][DPT];
#pragma unroll
    for (int i = 0; i < QR; i++)
#pragma unroll
      for (int u = 0; u < DPT; u++) o[i][u] = 0.0f;
    if (tid < QR) {
      s_m[tid] = -INFINITY;
      s_l[tid] = 0.0f;
    }
    for (int it = 0; it < ntiles; it++) {
      ops_cp_wait<ATT_STAGES - 2>();
      __syncthreads(); /* tile it landed; everyone is done with tile it - 1 (and s_np) */
      if (it + ATT_STAGES - 1 < ntiles) issue(it + ATT_STAGES - 1, (it + ATT_STAGES - 1) % ATT_STAGES);
      ops_cp_commit();
      const int64_t tp0 = p0 + (int64_t)it * TP;
      const int ntp = (int)(pend - tp0 < TP ? pend - tp0 : TP);
      const unsigned char *ks = att_sm + (size_t)(it % ATT_STAGES) * 2 * TB, *vs = ks + TB;
      if (tid < QR) s_np[tid] = atr_tile_n(u, tid, i0, i1, HBH, np0, tp0, TP);
      /* scores: thread (position p, group g) scores query rows g, g + NG, ... QB at a time */
      {
        const int p = tid % TP, g = tid / TP;
        const unsigned char *kr = ks + p * RB;
#pragma unroll
        for (int kb = 0; kb < QPT; kb += QB) {
          { /* a pass with none of the subgroup's rows is skipped (whole warps: g is uniform in a warp for TP >= 32) */
            const int ia = g + NG * kb, ib = g + NG * (kb + QB - 1 < QPT - 1 ? kb + QB - 1 : QPT - 1);
            if (ib < i0 || ia >= i1) continue;
          }
          float acc[QB][16];
#pragma unroll
          for (int b = 0; b < QB; b++)
#pragma unroll
            for (int l = 0; l < 16; l++) acc[b][l] = 0.0f;
#pragma unroll
          for (int j = 0; j < LPT; j++) {
            float kv[16];
            if (BF) {
              const uint4 a = *(const uint4 *)(kr + j * 32), b2 = *(const uint4 *)(kr + j * 32 + 16);
              const uint32_t w[8] = { a.x, a.y, a.z, a.w, b2.x, b2.y, b2.z, b2.w };
#pragma unroll
              for (int m = 0; m < 8; m++) {
                kv[2 * m] = __uint_as_float(w[m] << 16);
                kv[2 * m + 1] = __uint_as_float(w[m] & 0xffff0000u);
              }
            } else {
#pragma unroll
              for (int m = 0; m < 4; m++) {
                const float4 f = *(const float4 *)(kr + j * 64 + m * 16);
                kv[4 * m] = f.x, kv[4 * m + 1] = f.y, kv[4 * m + 2] = f.z, kv[4 * m + 3] = f.w;
              }
            }
#pragma unroll
            for (int b = 0; b < QB; b++) {
              if (kb + b >= QPT) break;
              const float *qq = qs + (g + NG * (kb + b)) * HD + 16 * j;
#pragma unroll
              for (int m = 0; m < 4; m++) {
                const float4 f = *(const float4 *)(qq + 4 * m);
                acc[b][4 * m] = fmaf(f.x, kv[4 * m], acc[b][4 * m]);
                acc[b][4 * m + 1] = fmaf(f.y, kv[4 * m + 1], acc[b][4 * m + 1]);
                acc[b][4 * m + 2] = fmaf(f.z, kv[4 * m + 2], acc[b][4 * m + 2]);
                acc[b][4 * m + 3] = fmaf(f.w, kv[4 * m + 3], acc[b][4 * m + 3]);
              }
            }
          }
#pragma unroll
          for (int b = 0; b < QB; b++) {
            if (kb + b >= QPT) break;
            float f8[8], f4[4];
#pragma unroll
            for (int l = 0; l < 8; l++) f8[l] = __fadd_rn(acc[b][l], acc[b][l + 8]);
#pragma unroll
            for (int l = 0; l < 4; l++) f4[l] = __fadd_rn(f8[l], f8[l + 4]);
            const float f2a = __fadd_rn(f4[0], f4[2]), f2b = __fadd_rn(f4[1], f4[3]);
            sc[(g + NG * (kb + b)) * TP + PERM(p)] = __fmul_rn(__fadd_rn(f2a, f2b), scale);
          }
        }
      }
      __syncthreads();
      /* online softmax per query row (k_attn's code over the row's positions of the tile) */
      for (int i = warp; i < QR; i += ATT_THREADS / 32) {
        const int npos = s_np[i];
        if (npos <= 0) continue;
        float *si = sc + i * TP;
        float mt = -INFINITY;
        for (int p = lane; p < npos; p += 32) mt = fmaxf(mt, si[PERM(p)]);
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, s));
        const float mo = s_m[i], mn = fmaxf(mo, mt);
        float lt = 0.0f;
        for (int p = lane; p < npos; p += 32) {
          const float e = floe_vexpf(__fsub_rn(si[PERM(p)], mn));
          si[PERM(p)] = e;
          lt = __fadd_rn(lt, e);
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) lt = __fadd_rn(lt, __shfl_xor_sync(0xffffffffu, lt, s));
        __syncwarp();
        if (lane == 0) {
          const float al = floe_vexpf(__fsub_rn(mo, mn));
          s_alpha[i] = al;
          s_m[i] = mn;
          s_l[i] = __fadd_rn(__fmul_rn(s_l[i], al), lt);
        }
      }
      __syncthreads();
      /* V sums: every active row's o *= alpha, then fmaf over its positions pg, pg + NPG, ... */
      unsigned act = 0;
      bool full = true;
#pragma unroll
      for (int i = 0; i < QR; i++) {
        const int n = s_np[i];
        if (n > 0) {
          act |= 1u << i;
          full &= n == ntp;
          const float al = s_alpha[i];
#pragma unroll
          for (int u = 0; u < DPT; u++) o[i][u] = __fmul_rn(o[i][u], al);
        }
      }
      auto vload = [&](int p, float *vv) { att_vrow<BF, DPT>(vs + p * RB, d0, vv); };
      if (full && ntp == TP && act == (QR >= 32 ? 0xffffffffu : (1u << QR) - 1u)) {
        /* every row over the whole tile: 4 positions at a time, their exps one float4 load */
#pragma unroll 1
        for (int k4 = 0; k4 < NPP; k4 += 4) {
          float vv[4][DPT];
#pragma unroll
          for (int m = 0; m < 4; m++) vload(pg + NPG * (k4 + m), vv[m]);
#pragma unroll
          for (int i = 0; i < QR; i++) {
            const float4 e = *(const float4 *)(sc + i * TP + pg * NPP + k4);
            const float ee[4] = { e.x, e.y, e.z, e.w };
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
              for (int u = 0; u < DPT; u++) o[i][u] = fmaf(ee[m], vv[m][u], o[i][u]);
          }
        }
      } else {
        for (int p = pg; p < ntp; p += NPG) {
          float vv[DPT];
          vload(p, vv);
#pragma unroll
          for (int i = 0; i < QR; i++) {
            if (!((act >> i) & 1u) || p >= s_np[i]) continue;
            const float e = sc[i * TP + PERM(p)];
#pragma unroll
            for (int u = 0; u < DPT; u++) o[i][u] = fmaf(e, vv[u], o[i][u]);
          }
        }
      }
    }
    ops_cp_wait<0>();
    __syncthreads(); /* every tile consumed: the stages are free for the group sums */
    float *red = (float *)att_sm; /* [NPG - 1][QR][HD] */
    if (NPG > 1) {
      if (pg > 0)
#pragma unroll
        for (int i = 0; i < QR; i++)
#pragma unroll
          for (int u = 0; u < DPT; u++) red[((size_t)(pg - 1) * QR + i) * HD + d0 + u] = o[i][u];
      __syncthreads();
      if (pg == 0)
        for (int g = 1; g < NPG; g++)
#pragma unroll
          for (int i = 0; i < QR; i++)
#pragma unroll
            for (int u = 0; u < DPT; u++) o[i][u] = __fadd_rn(o[i][u], red[((size_t)(g - 1) * QR + i) * HD + d0 + u]);
    }
#pragma unroll
    for (int i = 0; i < QR; i++) {
      if (!atr_has_part(u, i, i0, i1, HBH, np0)) continue;
      float *mp = atr_parts(part, t0, i, HBH, nh, head0, n_split, HD) + c * PF;
      if (pg == 0)
#pragma unroll
        for (int u = 0; u < DPT; u++) mp[d0 + u] = o[i][u];
      if (tid == 0) {
        mp[HD] = s_m[i];
        mp[HD + 1] = s_l[i];
      }
    }
    __syncthreads(); /* the stages, s_m and s_l are the next subgroup's */
    r0 = r1;
  }
  ActOut qn;
  qn.kind = -1; /* k_attn_rows leaves the quantization to the caller */
  atr_finish<HD>(att_sm, part, cnt, q, out, nq, HBH, t0, head0, base, n_split, nh, hd, gated, qn);
#undef PERM
}

/* ---- the rows kernel's launch ---- */
template <int HD, bool BF>
static int launch_attn_rows(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                            const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  static int done = 0;
  const size_t sm = atr_smem(HD, BF ? 2 : 4);
  if (!done) {
    if (cudaFuncSetAttribute(k_attn_rows<HD, BF>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    done = 1;
  }
  if (!q) return 0; /* the check's call: attribute only */
  const int hbh = atr_hbh(sh), R = ATR_QR / hbh, G = sh->n_head / sh->n_head_kv;
  dim3 grid((unsigned)((n_tok + R - 1) / R), (unsigned)(sh->n_head_kv * (G / hbh)), (unsigned)sh->n_split);
  const float scale = (float)(1.0 / sqrt((double)sh->head_dim));
  pdl_launch(k_attn_rows<HD, BF>, dim3(grid), dim3(ATT_THREADS), sm, OPS_STREAM(stream), q, kc, vc, pos0, out, part,
             cnt, sh->n_head, sh->n_head_kv, sh->head_dim, sh->n_ctx, sh->gated, sh->n_split, scale, (int)n_tok, R,
             hbh);
  return 0;
}
template <bool BF>
static int attn_rows_dispatch(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                              const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  switch (attn_hd(sh->head_dim)) {
  case 16: return launch_attn_rows<16, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 32: return launch_attn_rows<32, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 64: return launch_attn_rows<64, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  case 128: return launch_attn_rows<128, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  default: return launch_attn_rows<256, BF>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
  }
}

int attn_rows_launch(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc, const int32_t *pos0,
                     int64_t n_tok, float *out, float *part, int *cnt, void *stream) {
  return sh->kv_bf16 ? attn_rows_dispatch<true>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream)
                     : attn_rows_dispatch<false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, stream);
}
