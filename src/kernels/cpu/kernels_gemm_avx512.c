/* AVX-512 VNNI batched kernel for Q4_K / Q5_K with several activation rows (prefill, batched
 * experts, verify rows): the superblock model of kernels_internal.h with the WEIGHT ROWS IN THE
 * LANES, so row b of any call is bit-identical to kern_matmul with nb = 1 on that row and to the
 * scalar reference.
 *
 * Layout. Rows are taken 16 at a time (a block; a short last block repeats its last row). Per
 * superblock the block's 128 code bytes per row are transposed (two 16x16 dword transposes) so
 * that vector c' holds code dword c' of the 16 rows: its low nibbles (and, Q5_K, the fifth bit from
 * the transposed qh) are the 4 weights of activation quad qlo(c') of every row, its high nibbles
 * those of quad qhi(c'). The scales are transposed too: int32 sc of activation group t per row,
 * (m[2p], m[2p+1]) word pairs per row, d and dmin per row as floats.
 * Per activation row b (passes of 8, 4, 2, 1 rows, all in registers) and superblock:
 *   P = sum over 4 (Q4_K) or 8 (Q5_K) quads of a group of vpdpbusd(codes u8, x quad s8 broadcast
 *       from xq) -- no activation repacking at all;
 *   S1 = sum of P * sc: Q4_K one vpdpwssd with the scale as the word pair (sc, 0) (16 products
 *       < 2^15), Q5_K vpmulld + vpaddd; S2 = 4 vpdpwssd of the (m, m) pairs with the broadcast
 *       (BS[2p], BS[2p+1]) of row b (BS[j] = bsum[2j] + bsum[2j+1]);
 *   t = cvt(S1) * (d * dx) - cvt(S2) * (dmin * dx), slot k % 16 += t (the first touch adds t to a
 *       zero register); y = reduce16 of the slots as 15 vector adds, one masked store of 16 outputs.
 * kern_matmul_batch hands over every activation row of a matrix at once, so each block of 16 rows
 * is transposed once (K <= 4096) for all of them.
 * Count per output and superblock (Q4_K, 8-row pass; tok_q4_8 has 512 vpdpbusd, 160 vpdpwssd, 64
 * unpack and ~60 float / move uops per 128 outputs): 4 vpdpbusd + ~2.8 other ALU uops = 3.4
 * cycles at 2 vector uops per cycle, plus the transposes (~470 cycles per 16 rows and superblock,
 * measured: 2.2 cycles per output at nb = 16, 0.1 at nb = 256).
 * Floors (1 thread, 3.07 GHz): VNNI peak 2 vpdpbusd zmm per cycle = 128 MACs, so one output and
 * superblock (256 MACs) is 2 cycles (1.66 vpdpbusd per cycle measured with 12 independent chains,
 * 1.39 with a broadcast load per vpdpbusd).
 * Measured (bench_gemm, in cache, cycles per output and superblock, 512x2048 / 2048x512):
 *   16-lane-model kernel (before the superblock model): nb 8: 8.3 / 10.4, nb 16: 7.7 / 9.6.
 *   this kernel: nb 3: 14.3 / 13.5, nb 8: 7.5 / 7.2, nb 16: 5.8 / 6.0, nb 64: 4.4 / 5.1,
 *   nb 256: 4.4 / 4.9 (45 % of the VNNI peak at 256). GCC register allocation matters: with all
 *   passes inlined into gemm_t it spilled ~1 vector per vpdpbusd (nb 256: 4.96); passes of at most
 *   4 or 6 rows: 6.0 / 5.5 at nb 256 (the unpacking and code loads are shared by fewer rows).
 * Rows in the lanes (floe_mat.k4_lanes, kernels.h): a matrix packed at load holds each block's code
 * (and qh) vectors as the transposes above make them, so prep_lanes only decodes the 16 rows' scales
 * from their stored bytes 0-15 and the kernel runs from one activation row up (lanes_few: at most
 * NTMAX rows, each superblock's scales decoded just before its rows run; the blocks are read in
 * address order, prefetched FLOE_KPF_LANES bytes ahead). bench_gemm in cache, 512x2048 / 2048x512,
 * us per call: nb 1 10.9 / 12.2 (the one-row kernel 15.1 / 11.5), nb 4 19.6 / 22.9 (42.8 / 68.8);
 * bench_matvec out of cache, 2 threads, GB/s: nb 1 37-43 / 42-45 (file layout 42 / 47-49), nb 4
 * 27-29 / 29-30 (19 / 14), the 248320x2048 head 52-57 / 38-42 at nb 1 / 4 (50 / 22).
 */
#pragma GCC target("gfni,tune=sapphirerapids")
#include <immintrin.h>
#include <stdlib.h>

#include "kernels/cpu/kernels_avx512_util.h"
#include "kernels/cpu/kernels_internal.h"

#ifndef NTMAX
#define NTMAX 8
#endif
#define GKC 16 /* superblocks transposed per chunk (16 x 3.4 KiB): K <= 4096 is transposed once per 16 rows */

/* FLOE_GEMM=0 turns the kernel off (A/B measurements against the one-row kernel). FLOE_KPF_LANES:
 * how far ahead (bytes) a lanes matrix is prefetched into L2 (KPF_NEAR into L1 as elsewhere; 0 =
 * off). bench_gemm, 1 thread, 2048x2048 x 64 matrices, nb 1: 8 KiB 105 us, 12 KiB 96, 24 KiB 83,
 * 36 KiB 90, 48 KiB 87 (the one-row kernel 77-86) on a machine shared with a CI run. */
static int g_gemm_on = 1, g_kpf_lanes = 24576;
__attribute__((constructor)) static void gemm_from_env(void) {
  const char *e = getenv("FLOE_GEMM");
  if (e && e[0] == '0') g_gemm_on = 0;
  if ((e = getenv("FLOE_KPF_LANES"))) g_kpf_lanes = atoi(e);
}

int kern_gemm_avx512_supports(const floe_mat *W) {
  return g_gemm_on && (W->type == FLOE_TYPE_Q4_K || W->type == FLOE_TYPE_Q5_K) && W->cols % 256 == 0;
}

/* A zero register made by a zeroing idiom (no execution port). Without it GCC hoists one zero and
 * copies it (vmovdqa32, a port 0/5 uop) before every vpdpbusd chain. */
static inline __m512i zero_idiom(void) {
  __m512i z;
  __asm__ volatile("vpxord %0, %0, %0" : "=v"(z));
  return z;
}

/* In: r[i] = 16 dwords of row i. Out: o[j] lane i = r[i] dword j. */
static inline __attribute__((always_inline)) void tr16(const __m512i *r, __m512i *o) {
  __m512i t[16], u[16], v[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  /* u[4i+e], 128-bit lane L: rows 4i..4i+3, dword 4L+e */
  for (int i = 0; i < 4; i++) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; e++) {
    v[e] = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88);       /* rows 0-7: dwords e, 8+e */
    v[4 + e] = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xDD);   /* rows 0-7: dwords 4+e, 12+e */
    v[8 + e] = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88);
    v[12 + e] = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xDD);
  }
  for (int e = 0; e < 4; e++) {
    o[e] = _mm512_shuffle_i32x4(v[e], v[8 + e], 0x88);
    o[8 + e] = _mm512_shuffle_i32x4(v[e], v[8 + e], 0xDD);
    o[4 + e] = _mm512_shuffle_i32x4(v[4 + e], v[12 + e], 0x88);
    o[12 + e] = _mm512_shuffle_i32x4(v[4 + e], v[12 + e], 0xDD);
  }
}

/* One superblock of a 16-row block, transposed (lane i = row i). */
typedef struct k4_blk {
  const __m512i *np, *qhp; /* the code and qh vectors below, or in a lanes matrix's bytes (unaligned) */
  __m512i n[32];  /* code dword c' */
  __m512i qh[8];  /* Q5_K: qh dword m */
  __m512i sc[8];  /* int32 scale of activation group t (natural sub-block kperm_q4k[t]) */
  __m512i mp[4];  /* words (m[2p], m[2p+1]) */
  __m512 d, dm;
} k4_blk;

/* vpermt2b indices: output byte 16c + i = byte 16 (i % 8) + 4q + c of the 128-byte table */
#define KCOL(q) \
  {16 * 0 + 4 * q, 16 * 1 + 4 * q, 16 * 2 + 4 * q, 16 * 3 + 4 * q, 16 * 4 + 4 * q, 16 * 5 + 4 * q, 16 * 6 + 4 * q, 16 * 7 + 4 * q, \
   16 * 0 + 4 * q, 16 * 1 + 4 * q, 16 * 2 + 4 * q, 16 * 3 + 4 * q, 16 * 4 + 4 * q, 16 * 5 + 4 * q, 16 * 6 + 4 * q, 16 * 7 + 4 * q, \
   16 * 0 + 4 * q + 1, 16 * 1 + 4 * q + 1, 16 * 2 + 4 * q + 1, 16 * 3 + 4 * q + 1, 16 * 4 + 4 * q + 1, 16 * 5 + 4 * q + 1, \
   16 * 6 + 4 * q + 1, 16 * 7 + 4 * q + 1, 16 * 0 + 4 * q + 1, 16 * 1 + 4 * q + 1, 16 * 2 + 4 * q + 1, 16 * 3 + 4 * q + 1, \
   16 * 4 + 4 * q + 1, 16 * 5 + 4 * q + 1, 16 * 6 + 4 * q + 1, 16 * 7 + 4 * q + 1, 16 * 0 + 4 * q + 2, 16 * 1 + 4 * q + 2, \
   16 * 2 + 4 * q + 2, 16 * 3 + 4 * q + 2, 16 * 4 + 4 * q + 2, 16 * 5 + 4 * q + 2, 16 * 6 + 4 * q + 2, 16 * 7 + 4 * q + 2, \
   16 * 0 + 4 * q + 2, 16 * 1 + 4 * q + 2, 16 * 2 + 4 * q + 2, 16 * 3 + 4 * q + 2, 16 * 4 + 4 * q + 2, 16 * 5 + 4 * q + 2, \
   16 * 6 + 4 * q + 2, 16 * 7 + 4 * q + 2, 16 * 0 + 4 * q + 3, 16 * 1 + 4 * q + 3, 16 * 2 + 4 * q + 3, 16 * 3 + 4 * q + 3, \
   16 * 4 + 4 * q + 3, 16 * 5 + 4 * q + 3, 16 * 6 + 4 * q + 3, 16 * 7 + 4 * q + 3, 16 * 0 + 4 * q + 3, 16 * 1 + 4 * q + 3, \
   16 * 2 + 4 * q + 3, 16 * 3 + 4 * q + 3, 16 * 4 + 4 * q + 3, 16 * 5 + 4 * q + 3, 16 * 6 + 4 * q + 3, 16 * 7 + 4 * q + 3}
static const uint8_t kcol[4][64] __attribute__((aligned(64))) = {KCOL(0), KCOL(1), KCOL(2), KCOL(3)};
#undef KCOL

static inline __attribute__((always_inline)) void prep_scales(const __m512i *Z, const __m512i *R, k4_blk *B);

static inline __attribute__((always_inline)) void prep_blk(const int T, const uint8_t *const *rows, int64_t k, k4_blk *B) {
  const int bytes = T == FLOE_TYPE_Q4_K ? 144 : 176;
  const int qo = T == FLOE_TYPE_Q4_K ? 16 : 48;
  B->np = B->n;
  B->qhp = B->qh;
  __m512i r[16];
  for (int z = 0; z < 2; z++) {
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rows[i] + k * bytes + qo + 64 * z);
    tr16(r, B->n + 16 * z);
  }
  if (T == FLOE_TYPE_Q5_K) {
    __m512i o[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rows[i] + k * bytes + 16)));
    tr16(r, o);
    for (int m = 0; m < 8; m++) B->qh[m] = o[m];
  }
  /* bytes 0-15 of each row's superblock ([d, dmin] f16, 12 scale bytes), two rows per ymm; the
   * scales and mins by kq4_scm2: 128-bit lane rr = row rr, bytes 0-7 sc, 8-15 m. Z[q] = rows
   * 4q..4q+3. */
  __m512i Z[4], R[4];
  for (int i = 0; i < 16; i += 2) {
    const uint8_t *bA = rows[i] + k * bytes, *bB = rows[i + 1] + k * bytes;
    const __m256i raw = _mm256_loadu2_m128i((const __m128i *)bB, (const __m128i *)bA);
    const __m256i scm = kq4_scm2(raw);
    if (i % 4 == 0) {
      Z[i / 4] = _mm512_castsi256_si512(scm);
      R[i / 4] = _mm512_castsi256_si512(raw);
    } else {
      Z[i / 4] = _mm512_inserti64x4(Z[i / 4], scm, 1);
      R[i / 4] = _mm512_inserti64x4(R[i / 4], raw, 1);
    }
  }
  prep_scales(Z, R, B);
}

/* The 512-bit kq4_scm2: 128-bit lane rr of raw = bytes 0-15 of a row's superblock; the same lane of
 * the result: bytes 0-7 sc, 8-15 m. */
static inline __m512i kq4_scm4(__m512i raw) {
  const __m512i P = _mm512_shuffle_epi8(raw, _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)));
  const __m512i H = _mm512_shuffle_epi8(raw, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11)));
  const __m512i lowA = _mm512_and_si512(P, _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)));
  const __m512i lowB = _mm512_and_si512(_mm512_srli_epi16(P, 4), _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
  return _mm512_ternarylogic_epi32(lowA, lowB, _mm512_and_si512(_mm512_srli_epi16(H, 2), _mm512_set1_epi8(0x30)), 0xFE);
}

/* Offsets in a lanes block (kern_k4_lanes_pack): code vectors, Q5_K qh vectors, the 16 rows' bytes 0-15 */
#define LN_QH 2048
#define LN_HDR(T) ((T) == FLOE_TYPE_Q4_K ? 2048 : 2560)

/* One superblock of a lanes block: the code (and qh) vectors are read where they lie; the scales
 * from the 16 stored row headers, 4 rows a vector as prep_blk builds them. */
static inline __attribute__((always_inline)) void prep_lanes(const int T, const uint8_t *p, k4_blk *B) {
  B->np = (const __m512i *)p;
  B->qhp = (const __m512i *)(p + LN_QH);
  __m512i Z[4], R[4];
  for (int q = 0; q < 4; q++) {
    R[q] = _mm512_loadu_si512(p + LN_HDR(T) + 64 * q);
    Z[q] = kq4_scm4(R[q]);
  }
  prep_scales(Z, R, B);
}

/* Z[q], R[q]: rows 4q..4q+3 a 128-bit lane each, their sc | m bytes and their raw bytes 0-15 */
static inline __attribute__((always_inline)) void prep_scales(const __m512i *Z, const __m512i *R, k4_blk *B) {
  /* columns: C bytes 16c + i = row i's byte 4q + c */
  __m128i col[16];
  for (int q = 0; q < 4; q++) {
    const __m512i idx = _mm512_load_si512(kcol[q]);
    const __m512i C = _mm512_mask_blend_epi8(0xFF00FF00FF00FF00ull, _mm512_permutex2var_epi8(Z[0], idx, Z[1]),
                                             _mm512_permutex2var_epi8(Z[2], idx, Z[3]));
    col[4 * q] = _mm512_castsi512_si128(C);
    col[4 * q + 1] = _mm512_extracti32x4_epi32(C, 1);
    col[4 * q + 2] = _mm512_extracti32x4_epi32(C, 2);
    col[4 * q + 3] = _mm512_extracti32x4_epi32(C, 3);
  }
  for (int t = 0; t < 8; t++) B->sc[t] = _mm512_cvtepu8_epi32(col[kperm_q4k[t]]);
  for (int p = 0; p < 4; p++)
    B->mp[p] = _mm512_or_si512(_mm512_cvtepu8_epi32(col[8 + 2 * p]), _mm512_slli_epi32(_mm512_cvtepu8_epi32(col[9 + 2 * p]), 16));
  /* [d, dmin] = dword 0 of each row's 16 bytes: dwords 0, 4, 8, 12 of R[q] */
  const __m512i i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i g = _mm512_inserti64x4(_mm512_permutex2var_epi32(R[0], i01, R[1]),
                                       _mm512_castsi512_si256(_mm512_permutex2var_epi32(R[2], i01, R[3])), 1);
  B->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
  B->dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
}

/* Activation rows b0 .. b0+NT-1 against one transposed superblock k: slot k % 16 of each row's
 * accumulators acc[b][16] (16 lanes = 16 weight rows). */
static inline __attribute__((always_inline)) void tok_sb(const int T, const int NT, const k4_blk *B, const uint8_t *xq, size_t xs,
                                                         const kact_layout *L, const uint32_t *bsp, int64_t k, int b0,
                                                         __m512 (*acc)[16]) {
  const __m512i m4 = _mm512_set1_epi8(15);
  __m512i S1[8];
  const int32_t *x[8];
#pragma GCC unroll 8
  for (int b = 0; b < NT; b++) {
    S1[b] = _mm512_setzero_si512();
    x[b] = (const int32_t *)(xq + (size_t)(b0 + b) * xs + 256 * k);
  }
  /* Q4_K: a sum of 16 products (4 quads) is below 2^15 (16 * 15 * 127), so the scale is applied by
   * vpdpwssd with the int32 scale as the word pair (sc, 0) every 4 quads: 1 uop per 4 quads and
   * row instead of vpmulld (2 uops) + vpaddd per 8. Q5_K (16 * 31 * 127 > 2^15): vpmulld per 8. */
  const int H = T == FLOE_TYPE_Q4_K ? 4 : 8;
#pragma GCC unroll 4
  for (int u = 0; u < 4; u++) {
    const int tlo = u < 2 ? u : u + 2;
#pragma GCC unroll 2
    for (int h0 = 0; h0 < 8; h0 += H) {
      __m512i PL[8], PH[8];
#pragma GCC unroll 8
      for (int b = 0; b < NT; b++) {
        PL[b] = zero_idiom();
        PH[b] = zero_idiom();
      }
#pragma GCC unroll 8
      for (int j = h0; j < h0 + H; j++) {
        const int c = 8 * u + j;
        const int qlo = c < 16 ? c : c + 16, qhi = qlo + 16;
        const __m512i N = _mm512_loadu_si512(B->np + c);
        __m512i lo = _mm512_and_si512(N, m4), hi = hi_nib(N);
        if (T == FLOE_TYPE_Q5_K) {
          /* fifth bit: qh dword j (elements 4j..4j+3 of the sub-blocks), bit 2(c/8) for the low
           * nibbles, 2(c/8)+1 for the high ones, moved to bit 4 of each byte (0x10 mask) */
          const __m512i hq = _mm512_loadu_si512(B->qhp + j);
          const int bl = 2 * (c / 8), bh = bl + 1;
          const __m512i hl = bl <= 4 ? _mm512_slli_epi32(hq, 4 - bl) : _mm512_srli_epi32(hq, bl - 4);
          const __m512i hh = bh <= 4 ? _mm512_slli_epi32(hq, 4 - bh) : _mm512_srli_epi32(hq, bh - 4);
          lo = _mm512_ternarylogic_epi32(lo, hl, _mm512_set1_epi8(0x10), 0xF8); /* lo | (hl & 0x10) */
          hi = _mm512_ternarylogic_epi32(hi, hh, _mm512_set1_epi8(0x10), 0xF8);
        }
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) {
          PL[b] = _mm512_dpbusd_epi32(PL[b], lo, _mm512_set1_epi32(x[b][qlo]));
          PH[b] = _mm512_dpbusd_epi32(PH[b], hi, _mm512_set1_epi32(x[b][qhi]));
        }
      }
#pragma GCC unroll 8
      for (int b = 0; b < NT; b++) {
        if (T == FLOE_TYPE_Q4_K)
          S1[b] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(S1[b], PL[b], B->sc[tlo]), PH[b], B->sc[tlo + 2]);
        else
          S1[b] = _mm512_add_epi32(S1[b], _mm512_add_epi32(_mm512_mullo_epi32(PL[b], B->sc[tlo]), _mm512_mullo_epi32(PH[b], B->sc[tlo + 2])));
      }
    }
  }
#pragma GCC unroll 8
  for (int b = 0; b < NT; b++) {
    const uint32_t *bp = bsp + 4 * (size_t)(b0 + b);
    __m512i S2 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), B->mp[0], _mm512_set1_epi32((int)bp[0]));
    S2 = _mm512_dpwssd_epi32(S2, B->mp[1], _mm512_set1_epi32((int)bp[1]));
    S2 = _mm512_dpwssd_epi32(S2, B->mp[2], _mm512_set1_epi32((int)bp[2]));
    S2 = _mm512_dpwssd_epi32(S2, B->mp[3], _mm512_set1_epi32((int)bp[3]));
    const __m512 dx = _mm512_set1_ps(((const float *)(xq + (size_t)(b0 + b) * xs + L->off_d))[k]);
    const __m512 t = _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(S1[b]), _mm512_mul_ps(B->d, dx)),
                                   _mm512_mul_ps(_mm512_cvtepi32_ps(S2), _mm512_mul_ps(B->dm, dx)));
    /* slot k % 16 = slot + t, the slot starting at +0: the first superblock of a slot adds t to a
     * zero register instead of a zeroed slot in memory */
    acc[b0 + b][k % 16] = _mm512_add_ps(k < 16 ? _mm512_setzero_ps() : acc[b0 + b][k % 16], t);
  }
}

/* One out-of-line function per (type, rows per pass): register allocation inside one big
 * function (all variants inlined into gemm_t) spilled ~1 vector per vpdpbusd. */
#define DEF_TOK(name, T, NT)                                                                                      \
  static __attribute__((noinline)) void name(const k4_blk *B, const uint8_t *xq, size_t xs, const kact_layout *L, \
                                             const uint32_t *bsp, int64_t k, int b0, __m512 (*acc)[16]) {        \
    tok_sb(T, NT, B, xq, xs, L, bsp, k, b0, acc);                                                                  \
  }
DEF_TOK(tok_q4_8, FLOE_TYPE_Q4_K, NTMAX)
DEF_TOK(tok_q4_4, FLOE_TYPE_Q4_K, 4)
DEF_TOK(tok_q4_2, FLOE_TYPE_Q4_K, 2)
DEF_TOK(tok_q4_1, FLOE_TYPE_Q4_K, 1)
DEF_TOK(tok_q5_8, FLOE_TYPE_Q5_K, NTMAX)
DEF_TOK(tok_q5_4, FLOE_TYPE_Q5_K, 4)
DEF_TOK(tok_q5_2, FLOE_TYPE_Q5_K, 2)
DEF_TOK(tok_q5_1, FLOE_TYPE_Q5_K, 1)
#undef DEF_TOK

/* bsp[b][p] of activation rows b < ng, superblock k: (BS[2p], BS[2p+1]) as words */
static inline __attribute__((always_inline)) void bs_pairs(const uint8_t *xg, size_t xs, const kact_layout *L, int64_t k, int ng,
                                                           uint32_t *bsp) {
  for (int b = 0; b < ng; b++) {
    const __m256i bs = _mm256_loadu_si256((const __m256i *)((const int16_t *)(xg + (size_t)b * xs + L->off_s) + 16 * k));
    const __m256i pr = _mm256_madd_epi16(bs, _mm256_set1_epi16(1)); /* BS[0..3] | BS[4..7], int32 */
    const __m256i pk = _mm256_packs_epi32(pr, pr);                  /* words BS[0..3] BS[0..3] | BS[4..7] .. */
    _mm_storeu_si128((__m128i *)(bsp + 4 * (size_t)b), _mm256_castsi256_si128(_mm256_permute4x64_epi64(pk, _MM_SHUFFLE(3, 1, 2, 0))));
  }
}

/* One pass of nt (NTMAX, 4, 2 or 1) activation rows from b0 over superblock k */
static inline __attribute__((always_inline)) void tok_pass(const int T, int nt, const k4_blk *B, const uint8_t *xq, size_t xs,
                                                           const kact_layout *L, const uint32_t *bsp, int64_t k, int b0,
                                                           __m512 (*acc)[16]) {
  if (T == FLOE_TYPE_Q4_K) (nt == NTMAX ? tok_q4_8 : nt == 4 ? tok_q4_4 : nt == 2 ? tok_q4_2 : tok_q4_1)(B, xq, xs, L, bsp, k, b0, acc);
  else (nt == NTMAX ? tok_q5_8 : nt == 4 ? tok_q5_4 : nt == 2 ? tok_q5_2 : tok_q5_1)(B, xq, xs, L, bsp, k, b0, acc);
}

/* reduce16 of each row's slots (slots never touched, nsb < 16, are +0), 16 outputs a vector: rows
 * rb + lanes of keep of Y's rows 0..ng-1 */
static inline __attribute__((always_inline)) void store_slots(__m512 (*acc)[16], int ng, int64_t nsb, float *Y, int64_t ldy,
                                                              int64_t rb, __mmask16 keep) {
  for (int b = 0; b < ng; b++) {
    __m512 a[8], c[4];
    for (int i = 0; i < 8; i++)
      a[i] = _mm512_add_ps(i < nsb ? acc[b][i] : _mm512_setzero_ps(), i + 8 < nsb ? acc[b][i + 8] : _mm512_setzero_ps());
    for (int i = 0; i < 4; i++) c[i] = _mm512_add_ps(a[i], a[i + 4]);
    const __m512 e0 = _mm512_add_ps(c[0], c[2]), e1 = _mm512_add_ps(c[1], c[3]);
    _mm512_mask_storeu_ps(Y + b * ldy + rb, keep, _mm512_add_ps(e0, e1));
  }
}

/* The stream ahead of a lanes block's superblock at p (lsb bytes): g_kpf_lanes bytes ahead into
 * L2, KPF_NEAR into L1 */
static inline __attribute__((always_inline)) void pf_lanes(const char *p, size_t lsb) {
  for (size_t o = 0; g_kpf_lanes && o < lsb; o += 64) _mm_prefetch(p + g_kpf_lanes + o, _MM_HINT_T1);
  for (size_t o = 0; KPF_NEAR && o < lsb; o += 64) _mm_prefetch(p + KPF_NEAR + o, _MM_HINT_T0);
}

/* Lanes blocks [rb0, rb1) (16-row aligned) with at most NTMAX activation rows: one pass, each
 * superblock's scales decoded just before its rows run, so one block's bytes are read in order. */
static inline __attribute__((always_inline)) void lanes_few(const int T, const floe_mat *W, int ng, const uint8_t *xq, size_t xs,
                                                            float *Y, int64_t ldy, int64_t r0, int64_t r1, int64_t rb0,
                                                            int64_t rb1) {
  const kact_layout L = kact_layout_of(W);
  const int64_t nsb = L.nblk;
  const size_t lsb = (size_t)16 * (T == FLOE_TYPE_Q4_K ? 144 : 176);
  k4_blk B;
  uint32_t bsp[16 * 4] __attribute__((aligned(64)));
  __m512 acc[NTMAX][16];
  for (int64_t rb = rb0; rb < rb1; rb += 16) {
    const uint8_t *lb = kw_row(W, rb);
    for (int64_t k = 0; k < nsb; k++) {
      const char *p = (const char *)lb + (size_t)k * lsb;
      pf_lanes(p, lsb);
      prep_lanes(T, (const uint8_t *)p, &B);
      bs_pairs(xq, xs, &L, k, ng, bsp);
      for (int b0 = 0; b0 < ng;) {
        const int nt = ng - b0 >= NTMAX ? NTMAX : ng - b0 >= 4 ? 4 : ng - b0 >= 2 ? 2 : 1;
        tok_pass(T, nt, &B, xq, xs, &L, bsp, k, b0, acc);
        b0 += nt;
      }
    }
    const int nr = (int)(r1 - rb < 16 ? r1 - rb : 16), lo = (int)(r0 > rb ? r0 - rb : 0);
    store_slots(acc, ng, nsb, Y, ldy, rb, (__mmask16)(((1u << nr) - 1) & ~((1u << lo) - 1)));
  }
}

static inline __attribute__((always_inline)) void gemm_t(const int T, const floe_mat *W, int64_t nb, const uint8_t *xq, size_t xs,
                                                         float *Y, int64_t ldy, int64_t r0, int64_t r1) {
  const kact_layout L = kact_layout_of(W);
  const int64_t nsb = L.nblk;
  k4_blk blk[GKC];
  uint32_t bsp[GKC * 16 * 4] __attribute__((aligned(64))); /* [k][b][p]: (BS[2p], BS[2p+1]) */
  __m512 acc[16][16];
  const int once = nsb <= GKC; /* all superblocks of a block transposed once for every activation row */
  /* a lanes matrix: blocks of 16 rows from row 0 up to R16 (the rows asked for stored, the others
   * masked), then the rows past R16 in the file's layout */
  const int64_t R16 = W->k4_lanes ? W->rows & ~(int64_t)15 : 0;
  const size_t lsb = (size_t)16 * (T == FLOE_TYPE_Q4_K ? 144 : 176); /* a lanes block's bytes per superblock */
  if (R16 > r0 && nb <= NTMAX) { /* a few rows: lanes_few, then any rows past R16 below */
    const int64_t rb1 = r1 < R16 ? (r1 + 15) & ~(int64_t)15 : R16;
    lanes_few(T, W, (int)nb, xq, xs, Y, ldy, r0, r1, r0 & ~(int64_t)15, rb1);
    r0 = rb1;
  }
  for (int64_t rb = r0 < R16 ? r0 & ~(int64_t)15 : r0; rb < r1; rb += 16) {
    const int lanes = rb < R16;
    const int nr = (int)(r1 - rb < 16 ? r1 - rb : 16), lo = (int)(r0 > rb ? r0 - rb : 0);
    const uint8_t *rows[16], *lb = lanes ? kw_row(W, rb) : NULL;
    if (!lanes)
      for (int i = 0; i < 16; i++) rows[i] = kw_row(W, rb + (i < nr ? i : nr - 1));
#define PREP(kk, k) (lanes ? prep_lanes(T, lb + (size_t)(k) * lsb, &blk[kk]) : prep_blk(T, rows, k, &blk[kk]))
    if (once)
      for (int kk = 0; kk < nsb; kk++) PREP(kk, kk);
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
      const int ng = (int)(nb - g0 < 16 ? nb - g0 : 16);
      const uint8_t *xg = xq + (size_t)g0 * xs;
      for (int64_t k0 = 0; k0 < nsb; k0 += GKC) {
        const int nk = (int)(nsb - k0 < GKC ? nsb - k0 : GKC);
        for (int kk = 0; kk < nk; kk++) {
          if (!once) PREP(kk, k0 + kk);
          bs_pairs(xg, xs, &L, k0 + kk, ng, bsp + (size_t)kk * 64);
        }
        /* passes of 8, 4, 2, 1 activation rows (4 instantiations of tok_sb) */
        for (int b0 = 0; b0 < ng;) {
          const int nt = ng - b0 >= NTMAX ? NTMAX : ng - b0 >= 4 ? 4 : ng - b0 >= 2 ? 2 : 1;
          for (int kk = 0; kk < nk; kk++) {
            const k4_blk *B = &blk[once ? k0 + kk : kk];
            const uint32_t *bp = bsp + (size_t)kk * 64;
            if (lanes && g0 == 0 && b0 == 0) pf_lanes((const char *)lb + (size_t)(k0 + kk) * lsb, lsb);
            tok_pass(T, nt, B, xg, xs, &L, bp, k0 + kk, b0, acc);
          }
          b0 += nt;
        }
      }
      store_slots(acc, ng, nsb, Y + g0 * ldy, ldy, rb, (__mmask16)(((1u << nr) - 1) & ~((1u << lo) - 1)));
    }
#undef PREP
  }
}

void kern_gemm_q_avx512(const floe_mat *W, int64_t nb, const void *xq, size_t xq_stride, float *Y, int64_t ldy, int64_t r0,
                        int64_t r1) {
  FLOE_ASSERT(nb >= 1 && (W->k4_lanes || kern_gemm_avx512_supports(W)));
  if (W->type == FLOE_TYPE_Q4_K) gemm_t(FLOE_TYPE_Q4_K, W, nb, xq, xq_stride, Y, ldy, r0, r1);
  else gemm_t(FLOE_TYPE_Q5_K, W, nb, xq, xq_stride, Y, ldy, r0, r1);
}
