/* AVX-512 VNNI batched kernel for Q4_K / Q5_K with several activation rows (prefill, batched
 * experts, verify rows): the superblock model of kernels_internal.h with the WEIGHT ROWS IN THE
 * LANES, so row b of any call is bit-identical to kern_matmul with nb = 1 on that row and to the
 * scalar reference.
 *
 * Layout. Rows are taken 16 at a time (a block; a short last block repeats its last row). Per
 * superblock the block's 128 code bytes per row are transposed (two 16x16 dword transposes) so
 * that vector c' holds code dword c' of the 16 rows: its low nibbles (and, Q5_K, the fifth bit from
 * the transposed qh) are the 4 weights of activation quad qlo(c') of every row, its high nibbles
 * those of quad qhi(c'). The scales are transposed too: word pairs (sc[2u], sc[2u+1]) and
 * (m[2p], m[2p+1]) per row, d and dmin per row as floats.
 * Per activation row b (passes of 8, 4, 2, 1 rows, all in registers) and superblock:
 *   PL, PH = sums over 4 (Q4_K) or 8 (Q5_K) quads of vpdpbusd(codes u8, x quad s8 broadcast from
 *       xq) for the low and the high nibbles of the same code vectors -- no activation repacking;
 *   S1 = sum of P * sc: Q4_K the word pair (PL, PH) (16 products each, |sum| < 2^15: the low
 *       words are the exact sums) in one vpdpwssd with (sc[2u], sc[2u+1]), Q5_K vpmulld + vpaddd;
 *       S2 = 4 vpdpwssd of the (m, m) pairs with the broadcast (BS[2p], BS[2p+1]) of row b
 *       (BS[j] = bsum[2j] + bsum[2j+1]);
 *   t = cvt(S1) * (d * dx) - cvt(S2) * (dmin * dx), slot k % 16 += t (the first touch adds t to a
 *       zero register); y = reduce16 of the slots as 15 vector adds, one masked store of 16 outputs.
 * kern_matmul_batch hands over every activation row of a matrix at once, so each block of 16 rows
 * is transposed once (K <= 4096) for all of them.
 * Count per activation row and 16-row block superblock (Q4_K): 64 vpdpbusd + 8 vpdpwssd (S1) + 4
 * (S2) + 4 vmulps, all on the 2 multiply pipes (measured on AMD Zen 5): 40 cycles, the floor of
 * each further row; shared by the rows of a pass: 32 code loads and 64 unpacks (vpandd /
 * gf2p8affineqb), the scales (lanes: ~20 uops; file layout: the transposes, ~470 cycles per 16
 * rows and superblock, measured 2.2 cycles per output at nb = 16, 0.1 at nb = 256).
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
 * (and qh) vectors as the transposes above make them and the 16 rows' bytes 0-15 by planes, so
 * prep_lanes decodes the 16 rows' scales at once (~15 cycles) and the kernel runs from one
 * activation row up (lanes_few: at most NTMAX rows, each superblock's scales decoded just before
 * its rows run; the blocks are read in address order, prefetched FLOE_KPF_LANES bytes ahead into
 * L1). Cycles per 16-row block and superblock, in L2, no prefetch (AMD EPYC Zen 5): nb 1 ~95,
 * nb 4 ~220 (4 x 40 + the shared part). bench_matvec, the 248320x2048 head, 2 threads, out of
 * cache: nb 1 3.9 ms (73 GB/s), nb 4 5.9 ms.
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
#define LF_NSB 64 /* lanes_few forms the bsum pairs once for rows of up to this many superblocks (16384) */

/* FLOE_GEMM=0 turns the kernel off (A/B measurements against the one-row kernel). FLOE_KPF_LANES:
 * how far ahead (bytes) a lanes matrix is prefetched into L1, one prefetch per line (0 = off).
 * The 248320x2048 head, 2 threads, ms at nb 1 / 4: 6-8 KiB 4.3 / 6.4, 12-16 KiB 4.6-4.9 / 6.5-6.6;
 * the former 24 KiB into L2 plus KPF_NEAR into L1 (two prefetches per line) 5.2 / 7.2. */
static int g_gemm_on = 1, g_kpf_lanes = 8192, g_bs_once = 1;
__attribute__((constructor)) static void gemm_from_env(void) {
  const char *e = getenv("FLOE_GEMM");
  if (e && e[0] == '0') g_gemm_on = 0;
  if ((e = getenv("FLOE_KPF_LANES"))) g_kpf_lanes = atoi(e);
  if ((e = getenv("FLOE_KBS_ONCE")) && e[0] == '0') g_bs_once = 0; /* lanes_few: bsum pairs per block */
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
  __m512i scp[4]; /* words (sc[2u], sc[2u+1]): activation groups u', u' + 2 (u' = u < 2 ? u : u + 2) */
  __m512i sc[8];  /* Q5_K: int32 sc[2u] (at 2u) and sc[2u+1] (at 2u + 1) */
  __m512i mp[4];  /* words (m[2p], m[2p+1]) */
  __m512 d, dm;
} k4_blk;

static inline __attribute__((always_inline)) void prep_scales(const int T, const __m512i *Z, const __m512i *R, k4_blk *B);

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
  prep_scales(T, Z, R, B);
}

/* Offsets in a lanes block (kern_k4_lanes_pack): code vectors, Q5_K qh vectors, the 16 rows' bytes 0-15 */
#define LN_QH 2048
#define LN_HDR(T) ((T) == FLOE_TYPE_Q4_K ? 2048 : 2560)

/* vpermb indices of a lanes header's scale word pairs, from a vector of 4 planes (16 rows each):
 * dword lane i = plane 2h (byte 0) and plane 2h + 1 (byte 2) of row i; bytes 1 and 3 zeroed */
#define KQ(h, i) 32 * (h) + (i), 0, 32 * (h) + 16 + (i), 0
#define KQ16(h) KQ(h, 0), KQ(h, 1), KQ(h, 2), KQ(h, 3), KQ(h, 4), KQ(h, 5), KQ(h, 6), KQ(h, 7), KQ(h, 8), KQ(h, 9), \
                KQ(h, 10), KQ(h, 11), KQ(h, 12), KQ(h, 13), KQ(h, 14), KQ(h, 15)
static const uint8_t kplane[2][64] __attribute__((aligned(64))) = {{KQ16(0)}, {KQ16(1)}};
#undef KQ16
#undef KQ

static inline __attribute__((always_inline)) void prep_q5_scales(const int T, k4_blk *B) {
  if (T == FLOE_TYPE_Q5_K)
    for (int u = 0; u < 4; u++) {
      B->sc[2 * u] = _mm512_and_si512(B->scp[u], _mm512_set1_epi32(0xFFFF));
      B->sc[2 * u + 1] = _mm512_srli_epi32(B->scp[u], 16);
    }
}

/* One superblock of a lanes block: the code (and qh) vectors are read where they lie; the 16 rows'
 * scales decoded from the header's planes (kernels.h) at once, ggml get_scale_min_k4 on 16 rows
 * per byte plane: planes q[0..3] (A), q[4..7] (Q), q[8..11] (C); sc[0..3] = A & 63, m[0..3] =
 * Q & 63, sc[4..7] = (C & 15) | (A >> 6) << 4, m[4..7] = (C >> 4) | (Q >> 6) << 4. */
static inline __attribute__((always_inline)) void prep_lanes(const int T, const uint8_t *p, k4_blk *B) {
  B->np = (const __m512i *)p;
  B->qhp = (const __m512i *)(p + LN_QH);
  const uint8_t *h = p + LN_HDR(T);
  const __m512i DM = _mm512_loadu_si512(h), A = _mm512_loadu_si512(h + 64), Q = _mm512_loadu_si512(h + 128),
                C = _mm512_loadu_si512(h + 192);
  const __m512i c63 = _mm512_set1_epi8(63), c15 = _mm512_set1_epi8(15), c30 = _mm512_set1_epi8(0x30);
  const __m512i sc03 = _mm512_and_si512(A, c63), m03 = _mm512_and_si512(Q, c63);
  const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(C, c15), _mm512_and_si512(_mm512_srli_epi16(A, 2), c30));
  const __m512i m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(C, 4), c15), _mm512_and_si512(_mm512_srli_epi16(Q, 2), c30));
  const __m512i i0 = _mm512_load_si512(kplane[0]), i1 = _mm512_load_si512(kplane[1]);
  const __mmask64 w = 0x5555555555555555ull;
  B->scp[0] = _mm512_maskz_permutexvar_epi8(w, i0, sc03);
  B->scp[1] = _mm512_maskz_permutexvar_epi8(w, i1, sc03);
  B->scp[2] = _mm512_maskz_permutexvar_epi8(w, i0, sc47);
  B->scp[3] = _mm512_maskz_permutexvar_epi8(w, i1, sc47);
  B->mp[0] = _mm512_maskz_permutexvar_epi8(w, i0, m03);
  B->mp[1] = _mm512_maskz_permutexvar_epi8(w, i1, m03);
  B->mp[2] = _mm512_maskz_permutexvar_epi8(w, i0, m47);
  B->mp[3] = _mm512_maskz_permutexvar_epi8(w, i1, m47);
  prep_q5_scales(T, B);
  B->d = _mm512_cvtph_ps(_mm512_castsi512_si256(DM));
  B->dm = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(DM, 1));
}

/* vpermt2b indices of the scale word pairs: dword lane i = byte 2v of row i % 8 (byte 0), byte
 * 2v + 1 (byte 2) of a 128-byte table holding 8 rows' sc | m bytes, 16 a row (add 2v for pair v);
 * bytes 1 and 3 are zeroed by the mask */
#define KP(i) 16 * (i), 0, 16 * (i) + 1, 0
static const uint8_t kpair[64] __attribute__((aligned(64))) = {KP(0), KP(1), KP(2), KP(3), KP(4), KP(5), KP(6), KP(7),
                                                               KP(0), KP(1), KP(2), KP(3), KP(4), KP(5), KP(6), KP(7)};
#undef KP

/* Z[q], R[q]: rows 4q..4q+3 a 128-bit lane each, their sc | m bytes and their raw bytes 0-15.
 * Pair v (scales v < 4, mins v >= 4): lanes 0-7 from rows 0-7 (Z[0], Z[1]), lanes 8-15 from rows
 * 8-15 (Z[2], Z[3]), two zero-masked byte permutes and an or. */
static inline __attribute__((always_inline)) void prep_scales(const int T, const __m512i *Z, const __m512i *R, k4_blk *B) {
  const __m512i idx0 = _mm512_load_si512(kpair);
  for (int v = 0; v < 8; v++) {
    const __m512i idx = _mm512_add_epi8(idx0, _mm512_set1_epi8((char)(2 * v)));
    const __m512i P = _mm512_or_si512(_mm512_maskz_permutex2var_epi8(0x0000000055555555ull, Z[0], idx, Z[1]),
                                      _mm512_maskz_permutex2var_epi8(0x5555555500000000ull, Z[2], idx, Z[3]));
    if (v < 4) B->scp[v] = P;
    else B->mp[v - 4] = P;
  }
  prep_q5_scales(T, B);
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
  /* Steps of 4 quads (Q4_K: a sum of 16 products is below 2^15, 16 * 15 * 127) or 8 (Q5_K: 16 *
   * 31 * 127 > 2^15); a step's low-nibble quads are activation group u' = u < 2 ? u : u + 2, its
   * high-nibble ones group u' + 2, with the scales sc[2u] and sc[2u+1]. Per step and row two
   * chains of vpdpbusd (PL low nibbles, PH high), then the scales: Q4_K one vpdpwssd of the word
   * pair (PL, PH) with (sc[2u], sc[2u+1]) (1 uop per 4 quads and row), Q5_K vpmulld + vpaddd per 8. */
  const int H = T == FLOE_TYPE_Q4_K ? 4 : 8;
#pragma GCC unroll 4
  for (int u = 0; u < 4; u++) {
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
        if (T == FLOE_TYPE_Q4_K) /* the word pair (PL, PH): the low word of PL, the low word of PH moved up */
          S1[b] = _mm512_dpwssd_epi32(S1[b], _mm512_mask_blend_epi16(0xAAAAAAAAu, PL[b], _mm512_slli_epi32(PH[b], 16)), B->scp[u]);
        else
          S1[b] = _mm512_add_epi32(S1[b], _mm512_add_epi32(_mm512_mullo_epi32(PL[b], B->sc[2 * u]), _mm512_mullo_epi32(PH[b], B->sc[2 * u + 1])));
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
 * L1, one prefetch per line */
static inline __attribute__((always_inline)) void pf_lanes(const char *p, size_t lsb) {
  for (size_t o = 0; g_kpf_lanes && o < lsb; o += 64) _mm_prefetch(p + g_kpf_lanes + o, _MM_HINT_T0);
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
  /* the activation rows' bsum pairs of every superblock, formed once for all 16-row blocks (they
   * do not depend on the weights); rows wider than LF_NSB superblocks form them per block */
  uint32_t bsa[LF_NSB * NTMAX * 4] __attribute__((aligned(64)));
  const int once = g_bs_once && nsb <= LF_NSB;
  if (once)
    for (int64_t k = 0; k < nsb; k++) bs_pairs(xq, xs, &L, k, ng, bsa + (size_t)k * ng * 4);
  __m512 acc[NTMAX][16];
  for (int64_t rb = rb0; rb < rb1; rb += 16) {
    const uint8_t *lb = kw_row(W, rb);
    for (int64_t k = 0; k < nsb; k++) {
      const char *p = (const char *)lb + (size_t)k * lsb;
      pf_lanes(p, lsb);
      prep_lanes(T, (const uint8_t *)p, &B);
      uint32_t *bsp = bsa + (once ? (size_t)k * ng * 4 : 0);
      if (!once) bs_pairs(xq, xs, &L, k, ng, bsp);
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
