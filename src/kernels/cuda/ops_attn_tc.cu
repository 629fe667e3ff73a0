/* The tensor-core attention (k_attn_tc) with its launch and switches, in a file of its own so that
 * it compiles beside ops_attn.cu and ops_attn_rows.cu (ops_attn.cuh has what they share). */
#include <stdlib.h>

#include "kernels/cuda/ops_attn.cuh"

/* ---- the tensor-core order (the default for bfloat16 caches; cuda_attn_set_mma / FLOE_CUDA_ATTN_MMA=0) ----
 * k_attn_tc runs every launch of a bf16 cache in this mode (decode, a verify's few rows, prefill
 * chunks) with one code path per query row, so a row's bits do not depend on the launch it is in
 * (row-exact). They are not k_attn's bits (which are the CPU's score order): the products go
 * through mma.sync m16n8k16 (bf16 x bf16 -> f32). The operands are exact: a float q is the sum of
 * three bfloat16 terms (each the rounded rest of the ones before: 8 + 8 + 8 bits cover its 24),
 * likewise a softmax weight e; K and V are bfloat16 already. So every product is exact and the only
 * rounding is the accumulation's (f32, in the mma's fixed order), as k_attn's V sums differ from
 * the CPU's by rounding.
 * A block: (group of R rows, kv head / head batch, part c) with QR = 16 MT query rows (row, head),
 * MT m16 tiles (2 in launches of >= 16 rows by default); parts and tiles as k_attn (parts of CH = roundup128(ceil(np / n_split)) positions,
 * tiles of ATC_TP positions from the part's start, rows of another CH in a second subgroup).
 *   - scores: warp w keeps the A fragments of its k-chunks (16 dims each) of the three q terms in
 *     registers for the whole launch and multiplies them with the tile's K (ldmatrix; three mma a
 *     chunk, the smallest term first): a partial score per warp, summed in warp order by the
 *     softmax warps, times the scale;
 *   - softmax per query row: k_attn's online softmax over the row's positions of the tile, the
 *     weights stored as their three bfloat16 terms (zero past the row's positions, and V rows past
 *     the tile's positions are zeroed: 0 x a stale NaN is not 0);
 *   - V sums: warp w owns n8 tiles of dims: o *= alpha, then per 16 positions the three weight
 *     terms (the smallest first) times V (ldmatrix.trans) accumulate into o.
 * Floors (4096-token prefill of the 35B-A3B shape, one attention layer): 2 x 68.7 G multiply-adds
 * of (row, position, dim), x3 for the terms: ~0.4 T flops, ~0.6 ms at the mma.sync rate; a block's
 * K/V tiles come from L2 once per 16 MT query rows (~4.3 GB of L2 reads a layer at MT 2). */
#define ATC_TP 64 /* positions per tile (the online softmax's step: part of the bits) */
#define ATC_QR 16 /* query rows per block */
#define ATC_ST 2  /* cp.async pipeline depth (tiles) */
#define ATC_PS (ATC_TP + 8) /* weight terms' row stride, bf16 elements (conflict-free ldmatrix) */
#define ATC_SS (ATC_TP + 4) /* partial scores' row stride, floats */

static __host__ __device__ constexpr int atc_rb(int hd) { return (hd + 8) * 2; } /* staged K/V row, bytes */
static __host__ __device__ constexpr int atc_nkw(int hd) { return hd / 16 < 8 ? hd / 16 : 8; } /* warps with k-chunks */
static __host__ __device__ constexpr int atc_kcw(int hd) { return hd / 16 < 8 ? 1 : hd / 128; } /* k-chunks a warp */
/* the stages, reused by the combine (atr_finish: 2 x QR x ATT_MAX_SPLIT floats) */
static __host__ __device__ constexpr size_t atc_stage_bytes(int hd, int mt) {
  return atr_max((size_t)ATC_ST * 2 * ATC_TP * atc_rb(hd), (size_t)2 * ATC_QR * mt * ATT_MAX_SPLIT * 4);
}
/* MT m16 tiles of query rows a block */
static __host__ __device__ constexpr size_t atc_smem(int hd, int mt) {
  return atc_stage_bytes(hd, mt) + (size_t)atc_nkw(hd) * ATC_QR * mt * ATC_SS * 4 + (size_t)3 * ATC_QR * mt * ATC_PS * 2;
}

/* x = t[0] + t[1] + t[2] exactly, in bfloat16 (t[k] the rounded rest of x after the terms before) */
static __device__ __forceinline__ void atc_split3(float x, uint32_t *t) {
  const uint32_t a = ops_f32_to_bf16(x);
  const float r1 = __fsub_rn(x, ops_bf16_to_f32((uint16_t)a));
  const uint32_t b = ops_f32_to_bf16(r1);
  t[0] = a, t[1] = b, t[2] = ops_f32_to_bf16(__fsub_rn(r1, ops_bf16_to_f32((uint16_t)b)));
}
static __device__ __forceinline__ void atc_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void atc_ldsm4(uint32_t *r, const void *p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
static __device__ __forceinline__ void atc_ldsm2(uint32_t *r, const void *p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
}
static __device__ __forceinline__ void atc_ldsm2t(uint32_t *r, const void *p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s)
               : "memory");
}

template <int HD, int MT, bool PIPE>
static __global__ void __launch_bounds__(ATT_THREADS, 1)
    k_attn_tc(const float *q, const void *kc, const void *vc, const int32_t *pos0, float *out, float *part, int *cnt,
              int nh, int nkv, int hd, int64_t n_ctx, int gated, int n_split, float scale, int n_tok, int R, int HBH,
              ActOut qo, int onep_ok) {
  PDL_ENTER();
  constexpr int TP = ATC_TP, QR = ATC_QR * MT, RB = atc_rb(HD), TB = TP * RB;
  constexpr int NKW = atc_nkw(HD), KCW = atc_kcw(HD);
  constexpr int NT = HD / 8, NVW = NT < 8 ? NT : 8, NTW = NT < 8 ? 1 : NT / 8; /* V sums: warps, n8 tiles a warp */
  static_assert(QR <= 32 && TP % 32 == 0 && NKW * KCW == HD / 16, "atr_finish's rows; whole k-chunks");
  static_assert((size_t)QR * HD * 4 <= atc_stage_bytes(HD, MT), "the staged outputs fit the stages");
  extern __shared__ __align__(16) unsigned char att_sm[];
  float *red = (float *)(att_sm + atc_stage_bytes(HD, MT));      /* [NKW][QR][ATC_SS]: partial scores */
  uint16_t *es = (uint16_t *)(red + (size_t)NKW * QR * ATC_SS); /* [3][QR][ATC_PS]: the weights' terms */
  __shared__ float s_alpha[QR], s_m[QR], s_l[QR];
  __shared__ int s_np[2][QR]; /* the query row's positions in tile it (s_np[it & 1]; 0: none) */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int G = nh / nkv, nhb = G / HBH;
  const int grp = gridDim.x - 1 - blockIdx.x, y = blockIdx.y, c = blockIdx.z; /* the longest rows first */
  const int kh = y / nhb, head0 = kh * G + (y % nhb) * HBH;
  const int t0 = grp * R, nr = n_tok - t0 < R ? n_tok - t0 : R, nq = nr * HBH; /* query row i = r * HBH + h */
  const int64_t base = *pos0;
  const int qs_row = hd * (gated ? 2 : 1);
  const size_t PF = (size_t)HD + 4;
  const bool exact = hd == HD;
  const unsigned char *K = (const unsigned char *)kc + (size_t)kh * n_ctx * hd * 2;
  const unsigned char *V = (const unsigned char *)vc + (size_t)kh * n_ctx * hd * 2;
  const int64_t np0 = base + t0 + 1; /* np of the block's row 0 */
  /* onep: every row of the block's group has one part (np <= its part size: always with one split),
   * so part 0's block writes the outputs with atr_finish's arithmetic for one part, and no block
   * touches the counter or the scratch (the same bits, without the scratch's round trip) */
  bool onep = onep_ok != 0;
  for (int r = 0; r < nr && onep; r++) onep = np0 + r <= atr_ch(np0 + r, n_split);
  if (onep && c > 0) return;
  /* qs: a one-part block quantizes its rows from shared memory (head_dim == HD: a row's heads are
   * contiguous there; MT 1, the decode launches: at MT 2 the staging's registers spill); else from
   * out after a barrier (atr_quant) */
  const bool qs = MT == 1 && onep && qo.kind >= 0 && hd == HD;
  /* the q terms' A fragments of this warp's k-chunks: register r of m-tile m, chunk k holds rows
   * 16 m + g + 8 (r & 1), dims 16 kc + 8 (r >> 1) + 2 tq and + 1 (low half first). Loaded after the
   * first tiles' copies are issued, so that their latencies overlap. */
  uint32_t qa[MT][KCW][3][4];
  bool q_loaded = false;
  auto load_q = [&]() {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
    for (int k = 0; k < KCW; k++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int i = 16 * m + g + 8 * (r & 1), d = 16 * (warp * KCW + k) + 8 * (r >> 1) + 2 * tq;
        float x0 = 0.0f, x1 = 0.0f;
        if (warp < NKW && i < nq) {
          const float *qr = q + ((int64_t)(t0 + i / HBH) * nh + head0 + i % HBH) * qs_row;
          x0 = d < hd ? qr[d] : 0.0f;
          x1 = d + 1 < hd ? qr[d + 1] : 0.0f;
        }
        uint32_t a[3], b[3];
        atc_split3(x0, a);
        atc_split3(x1, b);
#pragma unroll
        for (int s = 0; s < 3; s++) qa[m][k][s][r] = a[s] | b[s] << 16;
      }
  };
  for (int r0 = 0; r0 < nr;) { /* subgroups of rows with one part size */
    const AtrSub u = atr_sub(np0, r0, nr, c, n_split);
    const int r1 = u.r1, i0 = r0 * HBH, i1 = r1 * HBH; /* its query rows */
    if (!u.has) {
      r0 = r1;
      continue;
    }
    const int64_t p0 = u.p0, pend = u.pend;
    const int ntiles = (int)((pend - p0 + TP - 1) / TP);
    /* k_attn's tile load: K (kv & 1) and V (kv & 2) of tile it up to pend into stage it % ATC_ST,
     * the V rows past the tile's positions zeroed */
    auto issue = [&](int it, int kv) {
      const int64_t tp0 = p0 + (int64_t)it * TP;
      const int n = (int)(pend - tp0 < TP ? pend - tp0 : TP);
      unsigned char *ks = att_sm + (size_t)(it % ATC_ST) * 2 * TB;
      if (kv & 1) att_load_rows<HD, true, RB>(ks, K, tp0, n, hd, exact);
      if (kv & 2) {
        att_load_rows<HD, true, RB>(ks + TB, V, tp0, n, hd, exact);
        for (int e = tid; e < (TP - n) * (RB / 16); e += ATT_THREADS)
          *(uint4 *)(ks + TB + (size_t)n * RB + (size_t)e * 16) = make_uint4(0u, 0u, 0u, 0u);
      }
    };
    /* s_np of tile it, and this warp's partial scores of every position of it into red */
    auto scores = [&](int it) {
      const int64_t tp0 = p0 + (int64_t)it * TP;
      const unsigned char *ks = att_sm + (size_t)(it % ATC_ST) * 2 * TB;
      if (tid < QR) s_np[it & 1][tid] = atr_tile_n(u, tid, i0, i1, HBH, np0, tp0, TP);
      if (warp >= NKW) return;
      /* the accumulators of all n8 tiles at once, so that consecutive mma are independent (each
       * still sums its k-chunks in order, the smallest term first) */
      float *rw = red + (size_t)warp * QR * ATC_SS;
      float d[MT][TP / 8][4];
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int nt = 0; nt < TP / 8; nt++) d[m][nt][0] = d[m][nt][1] = d[m][nt][2] = d[m][nt][3] = 0.0f;
#pragma unroll
      for (int k = 0; k < KCW; k++) {
        uint32_t b[TP / 8][2]; /* positions 8 nt + (lane & 7), dims 16 kc + 8 ((lane >> 3) & 1) */
#pragma unroll
        for (int nt = 0; nt < TP / 8; nt++)
          atc_ldsm2(b[nt], ks + (size_t)(8 * nt + (lane & 7)) * RB + (16 * (warp * KCW + k) + 8 * ((lane >> 3) & 1)) * 2);
#pragma unroll
        for (int s = 2; s >= 0; s--)
#pragma unroll
          for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < TP / 8; nt++) atc_mma(d[m][nt], qa[m][k][s], b[nt][0], b[nt][1]);
      }
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int nt = 0; nt < TP / 8; nt++) {
          *(float2 *)(rw + (16 * m + g) * ATC_SS + 8 * nt + 2 * tq) = make_float2(d[m][nt][0], d[m][nt][1]);
          *(float2 *)(rw + (16 * m + g + 8) * ATC_SS + 8 * nt + 2 * tq) = make_float2(d[m][nt][2], d[m][nt][3]);
        }
    };
    /* the online softmax per query row over its positions of tile it; the weights' terms into es */
    auto softmax = [&](int it) {
      for (int i = warp; i < QR; i += ATT_THREADS / 32) {
        const int npos = s_np[it & 1][i];
        uint16_t *e0 = es + i * ATC_PS;
        if (npos <= 0) {
          for (int p = lane; p < TP; p += 32) e0[p] = e0[QR * ATC_PS + p] = e0[2 * QR * ATC_PS + p] = 0;
          continue;
        }
        float sv[TP / 32];
        float mt = -INFINITY;
#pragma unroll
        for (int u = 0; u < TP / 32; u++) {
          const int p = lane + 32 * u;
          float v = 0.0f;
          if (p < npos) {
            v = red[i * ATC_SS + p];
#pragma unroll
            for (int w = 1; w < NKW; w++) v = __fadd_rn(v, red[((size_t)w * QR + i) * ATC_SS + p]);
            v = __fmul_rn(v, scale);
            mt = fmaxf(mt, v);
          }
          sv[u] = v;
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, s));
        const float mo = s_m[i], mn = fmaxf(mo, mt);
        float lt = 0.0f;
#pragma unroll
        for (int u = 0; u < TP / 32; u++) {
          const int p = lane + 32 * u;
          uint32_t t[3] = { 0u, 0u, 0u };
          if (p < npos) {
            const float e = floe_vexpf(__fsub_rn(sv[u], mn));
            lt = __fadd_rn(lt, e);
            atc_split3(e, t);
          }
          e0[p] = (uint16_t)t[0], e0[QR * ATC_PS + p] = (uint16_t)t[1], e0[2 * QR * ATC_PS + p] = (uint16_t)t[2];
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) lt = __fadd_rn(lt, __shfl_xor_sync(0xffffffffu, lt, s));
        if (lane == 0) {
          const float al = floe_vexpf(__fsub_rn(mo, mn));
          s_alpha[i] = al;
          s_m[i] = mn;
          s_l[i] = __fadd_rn(__fmul_rn(s_l[i], al), lt);
        }
      }
    };
    float o[MT][NTW][4];
    /* o = o * alpha + e V over tile it, rows 16 m + g and + 8 */
    auto vsum = [&](int it) {
      if (warp >= NVW) return;
      const unsigned char *vs = att_sm + (size_t)(it % ATC_ST) * 2 * TB + TB;
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int i = 16 * m + g + 8 * h;
          if (s_np[it & 1][i] > 0) {
            const float al = s_alpha[i];
#pragma unroll
            for (int j = 0; j < NTW; j++)
              o[m][j][2 * h] = __fmul_rn(o[m][j][2 * h], al), o[m][j][2 * h + 1] = __fmul_rn(o[m][j][2 * h + 1], al);
          }
        }
#pragma unroll
      for (int kc = 0; kc < TP / 16; kc++) {
        uint32_t a[MT][3][4]; /* rows 16 m + (lane & 15), positions 16 kc + 8 (lane >> 4) */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
          for (int s = 0; s < 3; s++)
            atc_ldsm4(a[m][s], es + ((size_t)s * QR + 16 * m + (lane & 15)) * ATC_PS + 16 * kc + 8 * (lane >> 4));
        uint32_t b[NTW][2]; /* positions 16 kc + (lane & 15), dims of n8 tile warp * NTW + j; transposed */
#pragma unroll
        for (int j = 0; j < NTW; j++) atc_ldsm2t(b[j], vs + (size_t)(16 * kc + (lane & 15)) * RB + 16 * (warp * NTW + j));
#pragma unroll
        for (int s = 2; s >= 0; s--) /* each accumulator: the smallest term first, as before */
#pragma unroll
          for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NTW; j++) atc_mma(o[m][j], a[m][s], b[j][0], b[j][1]);
      }
    };
    if constexpr (PIPE) { /* tile 0; then K(it + 1) and V(it + 1) load while tile it is computed (below) */
      issue(0, 3);
      ops_cp_commit();
    } else {
#pragma unroll
      for (int s = 0; s < ATC_ST - 1; s++) {
        if (s < ntiles) issue(s, 3);
        ops_cp_commit();
      }
    }
    if (!q_loaded) {
      load_q();
      q_loaded = true;
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int j = 0; j < NTW; j++) o[m][j][0] = o[m][j][1] = o[m][j][2] = o[m][j][3] = 0.0f;
    if (tid < QR) {
      s_m[tid] = -INFINITY;
      s_l[tid] = 0.0f;
    }
    if constexpr (PIPE) {
      /* phase it: the V sums of tile it - 1 and the scores of tile it (independent), a barrier, the
       * softmax of it: two barriers a tile instead of three. K(it + 1) goes into the stage half that
       * held K(it - 1) (its scores were done in phase it - 1), V(it + 1) after this phase's V sums
       * into the half that held V(it - 1); each load has a phase and a softmax to land in. */
      for (int it = 0; it <= ntiles; it++) {
        if (it == 0) ops_cp_wait<0>();
        else ops_cp_wait<1>(); /* every group but the newest: V(it), needed in phase it + 1 */
        __syncthreads(); /* K(it) and V(it - 1) landed; softmax(it - 1) done */
        if (it + 1 < ntiles) issue(it + 1, 1);
        ops_cp_commit();
        if (it > 0) vsum(it - 1);
        if (it == ntiles) break;
        scores(it);
        __syncthreads(); /* the V sums of it - 1 are done: V(it + 1) may take their stage half */
        if (it + 1 < ntiles) issue(it + 1, 2);
        ops_cp_commit();
        softmax(it);
      }
    } else {
      for (int it = 0; it < ntiles; it++) {
        ops_cp_wait<ATC_ST - 2>();
        __syncthreads(); /* tile it landed; everyone is done with tile it - 1 (its stage, s_np, es) */
        if (it + ATC_ST - 1 < ntiles) issue(it + ATC_ST - 1, 3);
        ops_cp_commit();
        scores(it);
        __syncthreads();
        softmax(it);
        __syncthreads();
        vsum(it);
      }
    }
    ops_cp_wait<0>();
    __syncthreads(); /* every tile consumed */
    if (onep) { /* atr_finish's combine of one part: M = max(-inf, m), its factor exp(m - M), L = 0 + f l, out = (0 + f o) / L */
      float *so = (float *)att_sm; /* qs: the outputs staged for the quantization (the tiles' stages are free) */
      if (warp < NVW)
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
          for (int h = 0; h < 2; h++) {
            const int i = 16 * m + g + 8 * h;
            if (!atr_has_part(u, i, i0, i1, HBH, np0)) continue;
            const float mi = s_m[i], M = fmaxf(-INFINITY, mi);
            const float fc = floe_vexpf(__fsub_rn(mi, M)), L = __fadd_rn(0.0f, __fmul_rn(fc, s_l[i]));
            const int64_t t = t0 + i / HBH;
            const int head = head0 + i % HBH;
#pragma unroll
            for (int j = 0; j < NTW; j++)
#pragma unroll
              for (int e = 0; e < 2; e++) {
                const int d = 8 * (warp * NTW + j) + 2 * tq + e;
                if (d >= hd) continue;
                float r = __fadd_rn(0.0f, __fmul_rn(fc, o[m][j][2 * h + e])) / L;
                if (gated) r = __fmul_rn(r, floe_sigmoidf(q[(t * nh + head) * qs_row + hd + d]));
                out[(t * nh + head) * hd + d] = r;
                if (qs) so[(size_t)i * HD + d] = r;
              }
          }
      if (qs) { /* the subgroup's rows quantized from shared memory: query row i = r * HBH + h */
        __syncthreads();
        atr_quant(qo, so, (size_t)HBH * HD, r0, r1, t0, head0, HBH, hd);
      }
      __syncthreads(); /* s_m and s_l are the next subgroup's (and the stages its tiles') */
      r0 = r1;
      continue;
    }
    if (warp < NVW)
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int i = 16 * m + g + 8 * h;
          if (!atr_has_part(u, i, i0, i1, HBH, np0)) continue;
          float *mp = atr_parts(part, t0, i, HBH, nh, head0, n_split, HD) + c * PF;
#pragma unroll
          for (int j = 0; j < NTW; j++)
            *(float2 *)(mp + 8 * (warp * NTW + j) + 2 * tq) = make_float2(o[m][j][2 * h], o[m][j][2 * h + 1]);
        }
    if (tid < QR && atr_has_part(u, tid, i0, i1, HBH, np0)) {
      float *mp = atr_parts(part, t0, tid, HBH, nh, head0, n_split, HD) + c * PF;
      mp[HD] = s_m[tid];
      mp[HD + 1] = s_l[tid];
    }
    __syncthreads(); /* s_m and s_l are the next subgroup's */
    r0 = r1;
  }
  if (onep) {
    if (qo.kind >= 0 && !qs) {
      __syncthreads(); /* every output of the block written */
      atr_quant_out(qo, out, nr, t0, head0, HBH, nh, hd);
    }
    return;
  }
  atr_finish<HD>(att_sm, part, cnt, q, out, nq, HBH, t0, head0, base, n_split, nh, hd, gated, qo);
}

/* query rows a block of k_attn_tc in launches of many rows: 1 = one m16 tile (16), 2 = two (32:
 * each K/V tile read from L2 once for twice the rows; the default: 4096-token prefill 9512-9819 ->
 * 10063-10107 tok/s); decode and launches of fewer than 16 rows keep one. The same bits per row.
 * FLOE_CUDA_ATTN_MT=1 at setup or the first call. */
static int g_attn_mt = -1;
static int attn_tc_mt(void) {
  if (g_attn_mt < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_MT");
    g_attn_mt = e && e[0] == '1' ? 1 : 2;
  }
  return g_attn_mt;
}
extern "C" void cuda_attn_set_mt(int mt) { g_attn_mt = mt == 2 ? 2 : 1; }

/* k_attn_tc's launches of one m16 tile (decode, a verify's rows): 1 = the pipelined tile loop (the
 * V sums of a tile beside the next tile's scores, two barriers a tile; the default), 0 = three
 * phases a tile. The same operations on every value: the same bits (test_cuda_ops compares them).
 * Launches of 32-row blocks keep the three phases (both accumulator sets at once would not fit the
 * registers). FLOE_CUDA_ATTN_PIPE=0 at setup or the first call. */
static int g_attn_pipe = -1;
static bool attn_tc_pipe(void) {
  if (g_attn_pipe < 0) {
    const char *e = getenv("FLOE_CUDA_ATTN_PIPE");
    g_attn_pipe = !(e && e[0] == '0');
  }
  return g_attn_pipe == 1;
}
extern "C" void cuda_attn_set_pipe(int on) { g_attn_pipe = on ? 1 : 0; }

/* k_attn_tc's rows of one part written by their block without the scratch (the same bits): 1 (the
 * default), 0: every part through the scratch and the counter; FLOE_CUDA_ATTN_ONEPART=0 at the
 * first call */
static int g_attn_onep = -1;
static int attn_onep(void) {
  if (g_attn_onep < 0) g_attn_onep = mm_env_int("FLOE_CUDA_ATTN_ONEPART", 1) != 0;
  return g_attn_onep;
}
extern "C" void cuda_attn_set_onep(int on) { g_attn_onep = on ? 1 : 0; }

/* k_attn_tc's launches of 2..15 rows (a verify's): 1 (the default) = a block per token (its HBH
 * heads, the decode step's block exactly: twice the blocks of the 35B-A3B shape's 4-row verify,
 * which packs two tokens' 16 query rows into each of its 4 blocks and took 27 us in the graph
 * against 15 for one row, session 26); 0 = ATC_QR / HBH tokens a block. Each query row's
 * operations do not depend on the rows beside it in its block: the same bits. Session 27, the
 * 35B-A3B shape's bench_verify alternated: verify4 2.006 / 1.996 -> 1.961 / 1.951 plain steps.
 * FLOE_CUDA_ATTN_R1=0 at the first call. */
static int g_attn_r1 = -1;
static int attn_r1(void) {
  if (g_attn_r1 < 0) g_attn_r1 = mm_env_int("FLOE_CUDA_ATTN_R1", 1) != 0;
  return g_attn_r1;
}
extern "C" void cuda_attn_set_r1(int on) { g_attn_r1 = on ? 1 : 0; }

template <int HD, int MT, bool PIPE>
static int launch_attn_tc(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                          const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, const ActOut &qo,
                          void *stream) {
  static int done = 0;
  const size_t sm = atc_smem(HD, MT);
  if (!done) {
    if (cudaFuncSetAttribute(k_attn_tc<HD, MT, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    done = 1;
  }
  if (!q) return 0; /* the check's call: attribute only */
  const int hbh = atr_hbh(sh), G = sh->n_head / sh->n_head_kv;
  const int R = MT == 1 && n_tok >= 2 && n_tok < 16 && attn_r1() ? 1 : ATC_QR * MT / hbh;
  dim3 grid((unsigned)((n_tok + R - 1) / R), (unsigned)(sh->n_head_kv * (G / hbh)), (unsigned)sh->n_split);
  const float scale = (float)(1.0 / sqrt((double)sh->head_dim));
  pdl_launch(k_attn_tc<HD, MT, PIPE>, dim3(grid), dim3(ATT_THREADS), sm, OPS_STREAM(stream), q, kc, vc, pos0, out, part, cnt,
             sh->n_head, sh->n_head_kv, sh->head_dim, sh->n_ctx, sh->gated, sh->n_split, scale, (int)n_tok, R, hbh, qo,
             attn_onep());
  return 0;
}
template <int HD>
static int launch_attn_tc_mt(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                             const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, const ActOut &qo,
                             void *stream) {
  if (!q) /* the check's call: all three */
    return launch_attn_tc<HD, 1, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream) |
           launch_attn_tc<HD, 1, true>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream) |
           launch_attn_tc<HD, 2, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  if (attn_tc_mt() == 2 && n_tok >= 16)
    return launch_attn_tc<HD, 2, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  if (attn_tc_pipe()) return launch_attn_tc<HD, 1, true>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  return launch_attn_tc<HD, 1, false>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
}
int attn_tc_dispatch(const cuda_attn_shape *sh, const float *q, const void *kc, const void *vc,
                            const int32_t *pos0, int64_t n_tok, float *out, float *part, int *cnt, const ActOut &qo,
                            void *stream) {
  switch (attn_hd(sh->head_dim)) {
  case 16: return launch_attn_tc_mt<16>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  case 32: return launch_attn_tc_mt<32>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  case 64: return launch_attn_tc_mt<64>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  case 128: return launch_attn_tc_mt<128>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  default: return launch_attn_tc_mt<256>(sh, q, kc, vc, pos0, n_tok, out, part, cnt, qo, stream);
  }
}

/* the switches read at setup (attn_set_smem), not at a launch inside a graph's capture */
void attn_tc_env(void) {
  (void)attn_onep();
  (void)attn_r1();
  (void)attn_tc_mt();
  (void)attn_tc_pipe();
}
