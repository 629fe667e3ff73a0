/* AVX-512 (F/BW/VL/DQ/VNNI/VBMI + GFNI) kernels: the quantized-activation path (the float path and
 * the activation quantization are in kernels_act_avx512.c).
 *
 * The quantized path follows the models of kernels_internal.h exactly: Q4_K/Q5_K the superblock
 * model (k4_rows below), every other type the 16-lane model: one zmm of int32 lanes per step, (float)lanes * scales added into one zmm accumulator per output, the fixed
 * reduction red16(). Integer units: vpdpbusd (u8 x s8, 4 products per dword) where no per-lane
 * integer scale is needed; vpmaddubsw + vpdpwssd (pairs, then pairs times an int16 scale) where the
 * sub-block scales are integers (K-quants, IQ4_XS). Signed x signed (Q8_0, IQ4_NL, MXFP4, Q4_0,
 * IQ4_XS) uses |w| and x negated where w < 0 (vpabsb, vpmovb2m, masked vpsubb).
 *
 * ---- Floors (written before optimising; machine: 2-core Xeon model 207, AVX-512, ~2.3-3 GHz) ----
 * Memory: ~28 GB/s one thread, ~50 GB/s two (task brief; bench/membw.c measures it). The 80 % goal
 * is ~22 GB/s one thread.
 *   Q4_K: 144 B per 256 weights -> 6.4 ns per superblock at 22 GB/s = ~15-19 cycles at 2.3-3 GHz.
 *     Work per superblock (nb=1): 2 loads + 4 and/shift (nibbles), 4 vpmaddubsw + 4 vpdpwssd,
 *     scale unpack (~25 scalar ops + 4 vpermd), mins (vpmaddwd + 6-op hsum), 3 float ops, 2 f16
 *     converts: ~60 instructions; at ~3-4 IPC that is 15-20 cycles, so Q4_K nb=1 is predicted to sit
 *     right at the bandwidth floor with one thread (compute ~ memory) and be memory-bound with two.
 *   Q8_0: 34 B per 32 weights -> 1.5 ns per block = ~4 cycles. Per pair of blocks ~14 ops
 *     (2 loads + insert, abs, movb2m, masked sub, dpbusd, 2 f16 scales, set/insert, cvt, mul, add)
 *     = ~4-5 cycles per block: predicted at or slightly under the floor with one thread.
 *   IQ4_XS: 136 B per 256 -> ~6 ns; work ~ Q4_K plus the table lookup and sign handling (~70 ops):
 *     predicted compute-bound with one thread (~75-85 %), memory-bound with two.
 *   MLX 4-bit g64: 64 B codes + 8 B scale/bias per 128 -> 3.3 ns per chunk = ~8-10 cycles;
 *     ~17 ops per chunk + bias pass: predicted ~at the floor with one thread.
 * nb > 1: the decode (nibbles, scales) is shared by the rows of a group (up to 8 rows), so the
 *   per-row cost falls to the per-row part (~25 ops per Q4_K superblock), i.e. 2-3x per row.
 *
 * ---- Measured (bench/results.tsv) and why ----
 * The predictions above were optimistic by ~2x: the first kernel took ~27-30 cycles per Q4_K
 * superblock at nb=1. What was fixed on the way: a store-forwarding stall in the scalar scale
 * unpack (IQ4_XS 2.7x, Q4_K 10%), scale products from memory broadcasts, software prefetch 4 KiB
 * ahead (out of cache +50%), K-quants via vpdpbusd + vpackssdw + vpdpwssd ("packed lanes").
 *
 * ---- Port model, measured on the dev machine (Xeon model 207, 3.07 GHz, bench loop of 12
 * independent chains, cycles calibrated with an imul chain; 2026-11-29) ----
 *   2 per cycle (ports 0 and 5), zmm: vpdpbusd, vpdpwssd, vpmaddubsw, vpmaddwd, vcvtdq2ps, vpandd,
 *     vfmadd/vmulps/vaddps (ymm vpdpbusd: also 2 per cycle, no gain from 256-bit);
 *   1 per cycle: vpsrlw zmm (port 0), vpermb, vpshufb, vpackssdw, vgf2p8affineqb (port 5).
 * So, unlike Ice Lake, the multiplies are not port-0 bound: the floor is simply (vector uops) / 2
 * per cycle, with shifts and shuffles each capped at 1 per cycle. The work was therefore to cut
 * uops and per-row overhead, not to move work between ports.
 *
 * ---- Rework (2026-11-29) and its effect, in cache, 1 thread, cpu us per call 512x2048 / 2048x512 ----
 *   baseline                                   q4_K 44.5/42.0  q8_0 70/72  iq4_xs 45.9/40.5  mlx4 53.5/56.8
 *   + vectorised activation quantizer          (act_q8 was ~40% of a 2048-col q4_K call: fmaxf and
 *     nearbyintf through the PLT) kern_act_q8_avx512, bit-equal to the scalar one (tested)
 *   + weight rows in pairs for nb <= 2         (two independent chains, shared activation loads;
 *     each (row, activation row) keeps its own sequence, so results are unchanged)
 *   + Q4_K/Q5_K: both rows' 6-bit scales unpacked in one ymm, d/dmin of both rows in one
 *     vcvtph2ps, both rows' mins in one zmm (one vpmaddwd/cvt/mul/add per two rows)
 *   + high nibbles with one vgf2p8affineqb      -> q4_K 22.7/27.6  q8_0 43.6/47.3  iq4_xs 31.1/35.0
 *                                                  mlx4 34.5/43.2  (1.3-1.95x)
 * Q4_K now costs ~17 cycles per superblock (about 32 vector uops / 2 ports): at the floor of this
 * kernel's form. + red2 (both rows of a pair reduced side by side): q4_K 2048x512 27.6 -> 26.9,
 * iq4_xs 35.0 -> 33.8.
 *
 * ---- nb = 1 bandwidth goal (issue 2), 2026-11-29: >= 80 % of membw out of cache, 1 and 2 threads ----
 * Floors, written before the changes (membw quiet: 16.2 GB/s 1 thread, 31.1 two; 80 % = 13.0 and
 * 24.9 GB/s; 3.07 GHz; "uops" = zmm uops on ports 0/5 at 2 per cycle):
 *   Q8_0   34 B / 32 values: memory 2.6 ns = 8.0 cycles per block-row at 13 GB/s; compute measured
 *          4.2 cycles (44.5 us in L2 for 512x2048). Memory-bound by 2x, so the 2048x4096 miss
 *          (75 %) could not be compute: it was the prefetch. Rows of 4352 B > KPF put row r's
 *          prefetches into row r+1 where its partner stream reads; row r+1 was never fetched
 *          ahead. pf_at() skips the partner row. Predicted ~85 %; measured 1 thread 70-74 ->
 *          84-93 % (loaded machine, alternating with the base build), 2 threads 34-68 -> 83-87 %.
 *   MLX4 g64: 72 B per step-row (128 values: 64 code bytes + 2 groups x (bf16 scale + bias)):
 *          memory 5.5 ns = 17 cycles at 13 GB/s; 2 threads: 17.7 cycles per core. The old kernel
 *          took ~13 cycles per step-row in L2 (34.6 us, 512x2048) + 2.8 us of scalar activation
 *          quantization, serial before the threads start (12 % of a 2-thread call): tight at 1
 *          thread, over budget at 2. Its loop kept the accumulators on the stack (the `full`
 *          select) and redid per step what is per group: load, convert and expand the scales,
 *          multiply by dlane. New mlx_pair: per 16-group window each row forms S16 = scale*d
 *          (the same products) and the bias terms once; a step is and, gf2p8affine, 2 vpdpbusd,
 *          vpermps, cvt, mul, add = 8 uops (4 cycles) per row; red4 reduces both rows' acc and
 *          bias together. Predicted ~5-6 cycles per step-row; measured in L2, 1 thread:
 *          512x2048 34.6 -> 20.6 us (~7 cycles per step-row incl. the quantizer), 2048x512 41.3 ->
 *          32.0 us (4 steps per row: the per-row window setup + reduction, ~40 cycles per row, is
 *          now the larger part). kern_act_mlx_avx512: 2.84 -> 0.87 us at 2048 values.
 *          Out of cache, 1 thread (loaded): 512x2048 74 -> 86 %, 2048x512 75.5 -> 81 %,
 *          2048x4096 78 -> 86 %.
 *   IQ4_XS 136 B / 256: memory 10.5 ns = 32 cycles per superblock-row (1 thread), 33.6 per core
 *          (2 threads); compute 21.5 cycles in L2 (28.7 us, 512x2048) + 0.9 us activation
 *          quantization serial: 2 threads need ~65-75 % of each core's time as compute, so the
 *          2-thread misses (75-80 %) are overlap, not a hard floor. Not changed beyond pf_at.
 *   Q4_K   met before (80-89 %); unchanged beyond pf_at.
 * 2-thread figures above could not be re-measured on the dev machine (load 2-3 all session).
 *
 * ---- 2 threads and IQ4_XS pairs, 2026-11-29 (second pass) ----
 * Floors written first: IQ4_XS nb=1 pair, counted from the compiled loop: 146 instructions per
 * pair-superblock, ~83 zmm uops on ports 0/5 (incl. 8 register copies: x copied before each masked
 * vpsubb, zeroed accumulators copied before vpdpwssd) = 41.5 cycles per pair = 20.8 per
 * superblock-row: that IS the measured 21.5, so the kernel is port-0/5 bound and only fewer uops
 * help; memory floor 32 (1 thread) / 33.6 per core (2 threads). kern_matmul_q_mt: the serial
 * activation quantization (0.9 us IQ4_XS, 0.87 us MLX4 at 2048 values) is ~4-5 % of a 2-thread
 * expert call (~18-25 us); splitting it over the threads saves ~half of it minus a barrier
 * (~0.1-0.2 us): predicted +2 % on the 2-thread expert shapes, nothing on 1 thread.
 * Done: (1) kernels.c mt_quant_matmul: one parallel region, each thread quantizes its units of
 * the row (bit-identical, tested with 1-4 threads), spin barrier, then its rows. The row split was
 * already right: 512 rows -> 256 + 256, 16-row units (whole Y lines, row pairs never cut).
 * (2) IQ4_XS pairs: both rows' scales in one vpmovsxbw and d in one vcvtph2ps; |kvalue| / kvalue
 * by vpermb from 64-entry tables (low nibbles straight from the code bytes, high nibbles from
 * words >> 2: no and / gf2p8affine); for NB = 1 the sign goes onto the signed weights (vpabsb,
 * vpmovb2m of x once per step for both rows, one in-place masked vpsubb per row) instead of masks
 * from the weights plus copies of x; vpmaddwd starts the chain. 146 -> 124 instructions, ~83 ->
 * ~65 port-0/5 uops: predicted 20.8 -> ~16 cycles. Measured in L2 (cpu us per call, 1 thread,
 * A/B alternating x3, load 2.0-2.6): 512x2048 28.4 -> 26.9 us (21.3 -> 20.2 cycles), 2048x512
 * 29.8 -> 29.2: the uop model overestimates the gain ~4x here, so something else (scheduler /
 * latency of the 9-deep per-iteration chain, loads) also binds; no hardware counters in this VM.
 * Out of cache on the device machine (16-core Xeon, same family, pinned to 2 cores, membw 16.5 /
 * 32.3 GB/s at start; neighbours make it drift, 15.2 / 26.6 at the end of the second run; best of
 * 2 runs, base cafce70 -> this): 2 threads iq4_xs 512x2048 79.1 -> 79.4 %, 2048x512 81.8 -> 79.7,
 * 2048x4096 82.8 -> 86.2, 8192x2048 84.4 -> 86.8; mlx4 83.4 -> 83.3, 86.9 -> 85.4, 96.8 -> 97.5,
 * 95.3 -> 94.4; q4_K 79.7 -> 75.8, 74.9 -> 80.8; q8_0 84.5 -> 82.6, 85.1 -> 81.0 (expert shapes).
 * Run-to-run spread there is +-5-10 points, larger than any of these changes: the expert shapes
 * sit at ~75-87 % with 2 threads either way. Prefetch hint T1 (3 runs A/B vs T0): Q4_K better in both
 * sessions (2 threads 512x2048 median 69 -> 80 %), IQ4_XS and MLX4 equal or worse: not adopted.
 * Left: (1) 2-thread expert shapes are ~80 % and noisy; the next candidates are a per-type prefetch
 * hint (T1 for Q4_K), the pool's per-call mutex/condvar (src/base/pool.c), and IQ4_XS's remaining
 * ~20 cycles in L2 (find the real limit with counters); (2) MLX per-row window setup for short
 * rows; (3) FMA in the model.
 *
 * ---- 2-thread expert shapes, third pass (2026-11-29, dev machine, bench_matvec --shapes expert
 * --nb 1, A/B alternated with the base build 3f9e3df, load 0.9-1.5 = the bench itself) ----
 * Floor: 2 threads need 80 % of 32.2 GB/s = 12.9 GB/s per core, i.e. each core must stream at 78 %
 * of the 16.6 GB/s one core gets alone, under the higher loaded latency; compute in L2 is at most
 * ~50 % of the out-of-cache time for all four types, so the gap is lines in flight, not uops.
 * Prediction: the limit is the L1 fill buffers (prefetcht0 and demand misses share them);
 * prefetching far ahead into L2 only, plus a short T0 prefetch to move the lines into L1, should
 * lift every type by a few points with 2 threads.
 *   (1) per-type hint, prefetcht1 everywhere (one distance, 4 KiB; 3 rounds): Q8_0 +1, IQ4_XS
 *       +2.6 / -1.8, MLX4 +1 / 0 points with 2 threads: within noise, not adopted alone.
 *   (2) dynamic tail in kern_matmul_q_mt (last 25 % / 50 % of the rows in >= 16 KiB chunks from an
 *       atomic counter): 2 threads -7 / -15 points on every type (3 rounds). Each chunk restarts
 *       the prefetch stream (its first KPF bytes are demand misses) and the prefetches past a
 *       chunk's end fetch the other core's next chunk into the wrong L2. Reverted: contiguous
 *       halves are right for these kernels.
 *   (3) two levels, far T1 + near T0 (pf_row): experiment build (near target = far target - KPF +
 *       KPF_NEAR, runtime hint switches), 3 rounds each: far 4 KiB T1 +
 *       near 1 KiB T0 vs one T0: 2 threads Q4_K +3.5 / +2.2, Q8_0 +2.5 / +2.3, IQ4_XS +4.7 / +4.4,
 *       MLX4 +2.6 / +2.3; far 8 KiB >= 4 KiB, near 1 KiB > 0.5 and 2 KiB; far T0 + near T0 gains
 *       nothing (so it is the L2 target that matters). Final code, 6 rounds against the base:
 *       2 threads Q4_K 79.0 -> 81.9 / 78.0 -> 78.4, IQ4_XS 70.7 -> 73.8 / 71.3 -> 72.0, MLX4
 *       74.8 -> 78.2 / 74.1 -> 77.7 (512x2048 / 2048x512, means; the machine drifted 5 points
 *       down during these rounds: base Q8_0 1 thread 82 -> 76 %); 1 thread +1-4 for the three.
 *       Q8_0 with the two levels measured -1.5 to -3 in the clean build (and +2 in the experiment
 *       build): not a clear win, so A32 keeps one T0 at 4 KiB.
 *       All shapes, 4 more rounds (bench --bw2 32.22, so % = GB/s / 32.22): 2 threads Q4_K
 *       78.7/77.7/85.2/85.0 -> 83.0/80.8/90.2/88.2, IQ4_XS 72.4/73.2/77.3/75.9 -> 76.1/73.8/81.0/78.9,
 *       MLX4 74.0/74.1/82.5/84.5 -> 78.8/77.1/87.1/87.5 (512x2048, 2048x512, 8192x2048, 2048x4096),
 *       every round better; Q8_0 (same code) equal.
 *   (4) after the commit, 3 rounds each: Q8_0 two levels with far 4 / 8 KiB, near 0.5 / 1 KiB:
 *       2 threads within +-0.5 of one T0 (76.6 / 77.1): Q8_0 is not limited by the L1 fill buffers;
 *       far 16 KiB or near 1.5 KiB for the others: equal or worse than 8 / 1 KiB.
 * kernels.sh at the end (load 0.94, membw 16.19 / 31.19), 1 / 2 threads % (512x2048, 2048x512):
 *   Q4_K 93.5/84.4, 89.7/83.3; Q8_0 83.3/79.2, 83.5/80.4; IQ4_XS 83.0/78.8, 82.3/77.1; MLX4 88.7/81.2,
 *   83.5/80.6; the attn shapes 82-96 % both. Left: 2 threads IQ4_XS (both expert shapes) and Q8_0
 *   512x2048 below 80 %; Q8_0 needs something other than prefetch (split 34-byte block loads?).
 *
 * ---- 2-thread expert shapes, fourth pass (2026-11-29, branch bw, dev machine; A/B rounds by
 * bench/ab_rounds.sh, which reruns a timing that other processes shared; base 1ba7ace) ----
 * Where the time goes (rdtsc trace build, not committed; medians, IQ4_XS 512x2048, 2 threads,
 * call = 23.1 us): caller enters its part 0.19 us after the call, the worker 0.32; each quantizes
 * half the row (0.5-0.6 us), barrier left at ~1.05 us; kernel 21.3 (thread 0) / 21.8 (thread 1)
 * us; call returns 0.25 us after the last thread. Fixed cost ~1.5 us = ~6 points; the kernel
 * phase alone streams at ~81 % of membw. Q8_0 with 4x the rows keeps the same GB/s (fixed cost
 * negligible there: ~2 %); IQ4_XS gains ~2 GB/s at 4x the rows.
 *   (1) start-of-range prefetch (T1, each thread's first KPF bytes per stream) issued in
 *       mt_quant_matmul before quantizing: the 256 prefetches stall the quantizer (fill
 *       buffers full), enter moves 0.19 -> 0.9 us, the kernel phase shrinks by about as much:
 *       0 net (6 rounds, 0.5-2 KiB per stream too). Issued after the barrier arrival instead:
 *       the barrier spin waits behind the prefetches, same result. Reverted.
 *   (2) IQ4_XS in cache takes ~40 cycles per pair-superblock; the loop had ~230 instructions
 *       (prefetch address arithmetic of pf_row/pf_at with spilled operands: ~40 scalar ops and
 *       vmovq xmm<->gpr moves on ports 0/5; scales by 2 pdep + ~20 scalar ops + 3 GPR->xmm moves).
 *       Splitting the vpmaddwd/vpdpwssd chain (20 -> 11 cycles latency): in cache equal or
 *       worse, not kept. iq4xs_pairs (nb = 1 pairs): pf_ptr prefetch pointers, scales of both
 *       rows by 2 vpmultishiftqb + ternlog/and/sub on one xmm, d by one vcvtph2ps of the same
 *       xmm: ~100 instructions per pair-superblock. In cache: equal (512x2048), -3 % (2048x512:
 *       2 superblocks per row, more per-pair setup); out of cache (4 rounds each, every round
 *       better): 1 thread 86.5 -> 91.0 / 82.9 -> 87.4 %, 2 threads 79.0 -> 82.4 / 76.8 -> 78.7 %
 *       (512x2048 / 2048x512). So out of cache the instruction count matters even where the
 *       in-cache time does not move: fewer uops in the window leave room for the misses.
 *       a256_rows' SW branch (IQ4_XS, NB = 1, RR = 2) was no longer reached and has been removed.
 *   (3) Q8_0 with the same pf_ptr prefetch in a32_rows: in cache equal, out of cache -0.6..+0.8
 *       (1 thread), -1.3 / -1.9 (2 threads): not kept.
 * Left: Q8_0 2 threads (~80-82 %) and IQ4_XS 2048x512 2 threads (~79 %); the ~1 us before the
 * kernels start (pool wake ~0.15 us, quantization 0.5 us per half row: the A256/A32 quantizers
 * are scalar per block, a vectorized one would save ~0.3-0.4 us = 1.5 points) and the 0.25 us
 * completion signal are the next candidates.
 *
 * ---- Q8_0 nb = 1, fifth pass (2026-11-30, branch q8; base 3a06ef9) ----
 * Floor written first: a32_rows' pair-step (2 rows x 68 B) compiled to ~30 port-0/5 uops (sign
 * trick: abs, movb2m, masked sub + copy per row; d: 2 GPR loads, 2 GPR->xmm broadcasts, insert,
 * 16-value vcvtph2ps, 16-lane multiply per row); q8_pairs (below) needs ~20: w ^ 0x80 with one
 * shared C = -128*sum4(x) per step, the 4 d's of a step by one vpermt2w + one 4-value cvt and
 * multiply, one vpermps per row. Predicted in L2 (--total 1200K, 1 thread) 45 -> ~30 us.
 * Measured 45.5 -> 33.2 us (512x2048), 48 -> 36.6 (2048x512); out of cache (6 alternated rounds,
 * % of membw): 2 threads 80.3 -> 82.1 [-5.5 +2.8 -0.4 +4.1 +5.0 +4.6] (512x2048), 79.5 -> 84.5
 * [+7.8 +1.0 +5.1 +6.8 +4.4 +5.1] (2048x512); 1 thread +2.4 / +4.6.
 * Tried on top, not kept: (1) 2 steps per iteration (one 8-value cvt/multiply for both rows'
 * 4 d's): in L2 equal (32.5 us); out of cache with 2 prefetch lines per 136 B per row, 1 line
 * (65-73 % with 2 threads: half the lines not prefetched), 3 lines: all below the 1-step kernel
 * by 1.5-3 points (4 rounds). (2) negcorr = -128*sum4(x) stored in the A32 activation (int32 per
 * lane, computed in act_quantize_range) and loaded, instead of vpsubb + vpdpbusd per step: in L2
 * slower (35.5 vs 33.4 us, 1-step loop), not measured further. (3) Line-aligned weight loads
 * (wrong results, timing only): in L2 equal, so split loads are not the in-cache limit.
 *
 * ---- Q4_K/Q5_K row pairs, 2026-11-30 (decode of the 35B-A3B shape; bench/results.tsv) ----
 * Timing-only builds that removed or added parts of k4_sb (in cache, 256x2048, 1 thread, 12.9 us):
 * no scale decode -15 %, float scales constant -9 %, no per-superblock fold -8 %, 8 dead vpdpbusd
 * per superblock pair +14 %, aligned weight loads 0: the loop is bound by its port-0/5 vector uops
 * (~54 per superblock pair). In the model decode the +14 % cost +2.3 % of a token, so the kernel's
 * compute shows through the memory stream even at ~65 % of it. Cut: the float scales of 4
 * superblocks made at once (k4_scv4, -4.5 % in cache, -1.0 / -1.6 % a token) and both rows in one
 * vpdpwssd chain with one transposed fold per group (k4_tree; -10 % more in cache, -1.3 / -2.1 % a
 * token); the output matrix now streams at 95-97 % of a pure read of its rows (92.5-95 % before).
 * Not kept: two superblocks' scales decoded in one zmm (+5 % in cache: both wait for one decode),
 * the decode by vpmultishiftqb in 5 uops instead of 7 (no change: the saved uops were port-0 ones).
 */
#pragma GCC target("gfni")
#include <immintrin.h>
#include <stdlib.h>

#include "kernels/cpu/kernels_avx512_util.h"
#include "kernels/cpu/kernels_internal.h"

#define NBG 8 /* activation rows sharing one weight decode */
/* Software prefetch of the weights (FLOE_KPF, FLOE_KPF_NEAR, FLOE_KPF_ONE override; 0 = off).
 * K-quants, IQ4_XS and MLX: two levels, far = KPF bytes ahead into L2 (prefetcht1), near =
 * KPF_NEAR bytes ahead into L1 (prefetcht0). One prefetcht0 distance (4 KiB) left the 2-thread
 * small-matrix calls at 74-80 % of the bandwidth; prefetcht1 alone helped Q4_K only (it leaves the
 * L1 fill buffers to the demand loads, which then wait on L2). Far T1 keeps more lines in flight
 * (the L2 queue is deeper than the L1 fill buffers), near T0 has each line in L1 before its use.
 * Measured 2026-11-29 (dev machine, alternated A/B, see the header): 2 threads +1-6 points for
 * Q4_K, IQ4_XS, MLX4 on the expert shapes; far 8 KiB >= 4 KiB, near 1 KiB > 0.5 or 2 KiB.
 * A32 types (Q8_0): the same two levels measured -1.5 to -3 points with 2 threads, so they keep
 * one prefetcht0 KPF_ONE bytes ahead. History: one T0 distance, Q4_K 512x2048 out of cache
 * 5.7 GB/s without, 8.1-9.8 at 4 KiB (device machine, 1 thread): the hardware streamer alone does
 * not keep enough lines in flight.
 * 2026-11-30, in the decode of the 35B-A3B shape (per-token A/B in one process, 384 tokens, where
 * bench_matvec's expert shapes had found 8 / 1 KiB best and show no difference): far 12-16 KiB with
 * near 1.5-1.75 KiB: -1.6 to -2.6 % per token in 8 runs (the output matrix ~-3 %, the GDN
 * projections ~-2-5 %); far 12 KiB with near 1 or 1.25 KiB, or 10-11 KiB with 1.5-2 KiB: 0 to
 * -0.9 %; near 3 KiB: +14 % (the output matrix 9.9 -> 11.6 ms); no prefetch at all: the output
 * matrix 9.9 -> 19.2 ms (a pure read of the same rows needs no prefetch: the kernel consumes
 * too slowly for the streamer alone). */
int kern_kpf = 12288, kern_kpf_near = 1536; /* KPF, KPF_NEAR (kernels_avx512_util.h): the float path shares them */
static int KPF_ONE = 4096;
__attribute__((constructor)) static void kpf_from_env(void) {
  const char *e = getenv("FLOE_KPF");
  if (e) KPF = atoi(e);
  e = getenv("FLOE_KPF_NEAR");
  if (e) KPF_NEAR = atoi(e);
  e = getenv("FLOE_KPF_ONE");
  if (e) KPF_ONE = atoi(e);
}

/* Prefetch address for byte y of a row of rb bytes, dist bytes ahead. Rows are read in pairs
 * (r, r+1), two streams in lock-step. Plain "row + y + dist" breaks when rb > dist - rb/2: row r's
 * prefetches land in row r+1 right where the other stream is reading (useless), and row r+1 is
 * never fetched ahead (Q8_0 2048x4096, rb = 4352 > 4096: 75 % of bandwidth). Skipping the partner
 * row (+ rb once the target leaves the own row) keeps every stream dist bytes ahead in rows r+2, r+3. */
static inline const char *pf_at(const uint8_t *row, int64_t y, size_t rb, int RR, int64_t dist) {
  const int64_t t = y + dist;
  return (const char *)row + t + (RR == 2 && t >= (int64_t)rb ? (int64_t)rb : 0);
}

/* prefetch for byte y of a row, `lines` cache lines: two levels (far T1 + near T0), or one T0 */
static inline __attribute__((always_inline)) void pf_row(const uint8_t *row, int64_t y, size_t rb, int RR, int lines, int two) {
  if (!two) {
    if (!KPF_ONE) return;
    const char *p = pf_at(row, y, rb, RR, KPF_ONE);
    for (int i = 0; i < lines; i++) _mm_prefetch(p + 64 * i, _MM_HINT_T0);
    return;
  }
  if (KPF) {
    const char *far = pf_at(row, y, rb, RR, KPF);
    for (int i = 0; i < lines; i++) _mm_prefetch(far + 64 * i, _MM_HINT_T1);
  }
  if (KPF_NEAR) {
    const char *near = pf_at(row, y, rb, RR, KPF_NEAR);
    for (int i = 0; i < lines; i++) _mm_prefetch(near + 64 * i, _MM_HINT_T0);
  }
}

static inline float red16(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(e);
}

static inline __m512 lanes_add(__m512 acc, __m512i L, __m512 S) {
  return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(L), S));
}

static inline float f16s(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

static inline float red8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

/* red16(a0) - red8(m.lo256) and red16(a1) - red8(m.hi256), the model's reductions of two rows in
 * the same order (see kernels_internal.h), done side by side in one register chain: each step of
 * red16 and red8 is "quarter + quarter" or "lane + lane" on the same positions. */
static inline void red2(__m512 a0, __m512 a1, __m512 m, float *y0, float *y1) {
  /* a[i] = v[i] + v[i+8]: [a(row0) | a(row1)] */
  const __m512 A = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
  /* b[i] = a[i] + a[i+4] (red16) and a'[i] = m[i] + m[i+4] (red8): [b0 | b1 | a'0 | a'1] */
  const __m512 B = _mm512_add_ps(_mm512_shuffle_f32x4(A, m, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(A, m, _MM_SHUFFLE(3, 1, 3, 1)));
  /* c[i] = b[i] + b[i+2], then c[0] + c[1], in every quarter */
  const __m512 C = _mm512_add_ps(B, _mm512_permute_ps(B, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 D = _mm512_add_ps(C, _mm512_permute_ps(C, _MM_SHUFFLE(1, 1, 1, 1)));
  const __m256 Y = _mm256_sub_ps(_mm512_castps512_ps256(D), _mm512_extractf32x8_ps(D, 1));
  *y0 = _mm256_cvtss_f32(Y);
  *y1 = _mm_cvtss_f32(_mm256_extractf128_ps(Y, 1));
}


/* pf_at() as a pointer moved along with the step: step k's target is row + k*step + dist, plus rb
 * from step kc on (the first whose target leaves the own row; kc = -1: from the start), so a row
 * pair's loop pays one add per level and stream and one compare per level per step, instead of
 * the per-prefetch compare/select and the spilled operands of pf_at in a256_rows. Used by
 * iq4xs_pairs; tried for Q8_0's a32_rows too (2026-11-29): no gain (see the header). */
typedef struct { const char *p; int64_t kc; } pf_ptr;
static inline pf_ptr pf_ptr_init(const uint8_t *row, size_t rb_, int64_t step, int64_t dist) {
  const int64_t rb = (int64_t)rb_;
  pf_ptr q;
  q.kc = dist >= rb ? -1 : (rb - dist + step - 1) / step;
  q.p = (const char *)row + dist + (q.kc < 0 ? rb : 0);
  return q;
}

/* ================= quantized path: A32 types (Q8_0, Q4_0, IQ4_NL, MXFP4) ================= */

/* 32 signed weights of one block, and its scale */
static inline __m256i a32_dec(const int T, const uint8_t *b, float *d) {
  if (T == FLOE_TYPE_Q8_0) {
    *d = f16s(b);
    return _mm256_loadu_si256((const __m256i *)(b + 2));
  }
  const uint8_t *qs = b + (T == FLOE_TYPE_MXFP4 ? 1 : 2);
  __m128i q = _mm_loadu_si128((const __m128i *)qs);
  __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
  if (T == FLOE_TYPE_Q4_0) {
    *d = f16s(b);
    return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
  }
  if (T == FLOE_TYPE_IQ4_NL) {
    *d = f16s(b);
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)), nib);
  }
  *d = kq_e8m0_half(b[0]);
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_mxfp4)), nib);
}

/* The f16 scales of a step's two blocks (at b0 and b0 + bytes) in one conversion: lanes 0-7 = d0,
 * 8-15 = d1 (+0 when the step has one block) */
static inline __attribute__((always_inline)) __m512 a32_dw2(const uint8_t *b0, int bytes, int two) {
  uint16_t h0, h1 = 0;
  memcpy(&h0, b0, 2);
  if (two) memcpy(&h1, b0 + bytes, 2);
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)h0)), _mm_set1_epi16((short)h1), 1));
}

/* An A32 activation row's step k (blocks k, k+1): its 64 (or 32) quantized values and its scales
 * as laid out (each block's repeated 8x) */
static inline __attribute__((always_inline)) void a32_xstep(const uint8_t *x, const kact_layout *L, int64_t k, int two,
                                                            __m512i *x0, __m512 *dx) {
  const float *dexp = (const float *)(x + L->off_s) + 8 * k;
  *x0 = two ? _mm512_loadu_si512(x + 32 * k) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, x + 32 * k);
  *dx = two ? _mm512_loadu_ps(dexp) : _mm512_maskz_loadu_ps(0x00FF, dexp);
}

static inline __attribute__((always_inline)) void a32_rows(const int T, const int NB, const int RR,
                                                           const floe_mat *W, const kact_layout *L, int64_t r,
                                                           const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  const int bytes = T == FLOE_TYPE_Q8_0 ? 34 : T == FLOE_TYPE_MXFP4 ? 17 : 18;
  __m512 acc[2][NBG];
  for (int rr = 0; rr < RR; rr++)
    for (int b = 0; b < NB; b++) acc[rr][b] = _mm512_setzero_ps();
  const int64_t nblk = L->nblk;
  for (int64_t k = 0; k < nblk; k += 2) {
    const int two = k + 1 < nblk;
    __m512i AW[2];
    __mmask64 NEG[2];
    __m512 DW[2];
#pragma GCC unroll 2
    for (int rr = 0; rr < RR; rr++) {
      const uint8_t *row = kw_row(W, r + rr);
      pf_row(row, k * bytes, W->row_bytes, RR, 2, 0);
      float d0, d1 = 0;
      __m256i w0 = a32_dec(T, row + k * bytes, &d0);
      __m256i w1 = two ? a32_dec(T, row + (k + 1) * bytes, &d1) : _mm256_setzero_si256();
      __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
      /* shared by the activation rows: |w|, the sign mask, the weight scales of both halves */
      AW[rr] = _mm512_abs_epi8(w);
      NEG[rr] = _mm512_movepi8_mask(w);
      if (T == FLOE_TYPE_MXFP4) {
        DW[rr] = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
      } else {
        (void)d0, (void)d1;
        DW[rr] = a32_dw2(row + k * bytes, bytes, two);
      }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
      __m512i x0;
      __m512 dx;
      a32_xstep(xq + b * xs, L, k, two, &x0, &dx);
#pragma GCC unroll 2
      for (int rr = 0; rr < RR; rr++) {
        const __m512i xv = _mm512_mask_sub_epi8(x0, NEG[rr], _mm512_setzero_si512(), x0);
        __m512i Lv = _mm512_dpbusd_epi32(_mm512_setzero_si512(), AW[rr], xv);
        /* S = dw*dx, dx already repeated 8x in the activation (one load, one multiply) */
        __m512 S = _mm512_mul_ps(DW[rr], dx);
        __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(Lv), S);
        acc[rr][b] = two ? _mm512_add_ps(acc[rr][b], p) : _mm512_mask_add_ps(acc[rr][b], 0x00FF, acc[rr][b], p);
      }
    }
  }
  for (int rr = 0; rr < RR; rr++)
    for (int b = 0; b < NB; b++) Y[b * ldy + r + rr] = red16(acc[rr][b]) + 0.0f;
}
#define a32_row(T, NB, W, L, r, xq, xs, Y, ldy) a32_rows(T, NB, 1, W, L, r, xq, xs, Y, ldy)

/* Q8_0, one activation row, weight rows in pairs (nb = 1; a32_rows does the rest). Same integers,
 * products and order as a32_rows (the 16-lane model), with fewer port-0/5 uops per 68-byte step:
 *   signs: vpdpbusd(C, w ^ 0x80, x) = sum((w + 128) x) - 128 sum(x) = sum(w x) exactly, with
 *     C = -128 * sum4(x) per lane computed once per step for both rows (vpdpbusd of 0x80 and -x),
 *     instead of |w|, the sign mask and a masked negation of x per row;
 *   scales: the four f16 d's of a step (2 rows x 2 blocks) by one vpermt2w from two plain 64-byte
 *     loads of the block pairs, one vcvtph2ps of 4 values, one multiply by [dx0 dx1 dx0 dx1]
 *     (the same products dw * dx), then one vpermps per row to spread S over the lanes, instead
 *     of two GPR loads, two GPR->xmm broadcasts, an insert, a 16-value vcvtph2ps and a 16-lane
 *     multiply per row.
 * An odd last block is added after the loop, lanes 8-15 untouched as in the model. */
static void q8_pairs(const floe_mat *W, const kact_layout *L, int64_t r0, int64_t r1, const uint8_t *xq, float *Y) {
  const int64_t nblk = L->nblk, nst = nblk / 2;
  const size_t rb = W->row_bytes;
  const float *dx = (const float *)(xq + L->off_d);
  const __m512i k80 = _mm512_set1_epi8((char)0x80);
  /* words d0, d1 of row A (words 0, 17 of its 64-byte load), then of row B (table 2: +32) */
  const __m512i didx = _mm512_castsi128_si512(_mm_setr_epi16(0, 17, 32, 49, 0, 0, 0, 0));
  const __m512i eA = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i eB = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  for (int64_t r = r0; r + 1 < r1; r += 2) {
    const uint8_t *rowA = kw_row(W, r), *rowB = rowA + rb;
    __m512 accA = _mm512_setzero_ps(), accB = _mm512_setzero_ps();
    for (int64_t k = 0; k < nst; k++) {
      const uint8_t *bA = rowA + 68 * k, *bB = rowB + 68 * k;
      pf_row(rowA, 68 * k, rb, 2, 2, 0);
      pf_row(rowB, 68 * k, rb, 2, 2, 0);
      const __m512i x = _mm512_loadu_si512(xq + 64 * k);
      const __m512i C = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, _mm512_sub_epi8(_mm512_setzero_si512(), x));
      const __m512i wA = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bA + 2))),
                                            _mm256_loadu_si256((const __m256i *)(bA + 36)), 1);
      const __m512i wB = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bB + 2))),
                                            _mm256_loadu_si256((const __m256i *)(bB + 36)), 1);
      const __m512i LA = _mm512_dpbusd_epi32(C, _mm512_xor_si512(wA, k80), x);
      const __m512i LB = _mm512_dpbusd_epi32(C, _mm512_xor_si512(wB, k80), x);
      const __m512i h = _mm512_permutex2var_epi16(_mm512_loadu_si512(bA), didx, _mm512_loadu_si512(bB));
      const __m128 dx2 = _mm_castpd_ps(_mm_loaddup_pd((const double *)(dx + 2 * k)));
      const __m512 S4 = _mm512_castps128_ps512(_mm_mul_ps(_mm_cvtph_ps(_mm512_castsi512_si128(h)), dx2));
      accA = lanes_add(accA, LA, _mm512_permutexvar_ps(eA, S4));
      accB = lanes_add(accB, LB, _mm512_permutexvar_ps(eB, S4));
    }
    if (nblk & 1) {
      const int64_t k = nblk - 1;
      const __m512i x = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xq + 32 * k);
      const __m512i C = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, _mm512_sub_epi8(_mm512_setzero_si512(), x));
      const __m512i wA = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rowA + 34 * k + 2)));
      const __m512i wB = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rowB + 34 * k + 2)));
      const __m512i LA = _mm512_dpbusd_epi32(C, _mm512_xor_si512(wA, k80), x);
      const __m512i LB = _mm512_dpbusd_epi32(C, _mm512_xor_si512(wB, k80), x);
      const __m512 pA = _mm512_mul_ps(_mm512_cvtepi32_ps(LA), _mm512_set1_ps(f16s(rowA + 34 * k) * dx[k]));
      const __m512 pB = _mm512_mul_ps(_mm512_cvtepi32_ps(LB), _mm512_set1_ps(f16s(rowB + 34 * k) * dx[k]));
      accA = _mm512_mask_add_ps(accA, 0x00FF, accA, pA);
      accB = _mm512_mask_add_ps(accB, 0x00FF, accB, pB);
    }
    Y[r] = red16(accA) + 0.0f;
    Y[r + 1] = red16(accB) + 0.0f;
  }
}

/* Q8_0, several activation rows (nb >= 2: a verify's rows, a batch), weight rows in pairs. The
 * sign trick of q8_pairs (w ^ 0x80, with C = -128 * sum4(x) formed once per activation row and step
 * for both weight rows) instead of a32_rows' |w|, sign mask and masked negation of x per (weight
 * row, activation row); the scale vectors as a32_rows makes them. Every output is a32_rows' chain:
 * the same integers, S = dw * dx, the conversion, the multiply and the add per step, an odd last
 * block in lanes 0-7, red16: the same bits. NB: activation rows at once (a compile-time constant,
 * <= NBG, so the 2 x NB accumulators stay in registers). */
static inline __attribute__((always_inline)) void q8_multi(const int NB, const floe_mat *W, const kact_layout *L,
                                                           int64_t r, const uint8_t *xq, size_t xs, float *Y,
                                                           int64_t ldy) {
  const int64_t nblk = L->nblk;
  const __m512i k80 = _mm512_set1_epi8((char)0x80);
  const uint8_t *row[2] = { kw_row(W, r), kw_row(W, r + 1) };
  __m512 acc[2][NBG];
  for (int rr = 0; rr < 2; rr++)
    for (int b = 0; b < NB; b++) acc[rr][b] = _mm512_setzero_ps();
  for (int64_t k = 0; k < nblk; k += 2) {
    const int two = k + 1 < nblk;
    __m512i WX[2];
    __m512 DW[2];
#pragma GCC unroll 2
    for (int rr = 0; rr < 2; rr++) {
      const uint8_t *b0 = row[rr] + k * 34;
      pf_row(row[rr], k * 34, W->row_bytes, 2, 2, 0);
      const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
      const __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)(b0 + 36)) : _mm256_setzero_si256();
      WX[rr] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1), k80);
      DW[rr] = a32_dw2(b0, 34, two);
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
      __m512i x0;
      __m512 dx;
      a32_xstep(xq + b * xs, L, k, two, &x0, &dx);
      const __m512i C = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, _mm512_sub_epi8(_mm512_setzero_si512(), x0));
#pragma GCC unroll 2
      for (int rr = 0; rr < 2; rr++) {
        const __m512i Lv = _mm512_dpbusd_epi32(C, WX[rr], x0);
        const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(Lv), _mm512_mul_ps(DW[rr], dx));
        acc[rr][b] = two ? _mm512_add_ps(acc[rr][b], p) : _mm512_mask_add_ps(acc[rr][b], 0x00FF, acc[rr][b], p);
      }
    }
  }
  for (int rr = 0; rr < 2; rr++)
    for (int b = 0; b < NB; b++) Y[b * ldy + r + rr] = red16(acc[rr][b]) + 0.0f;
}

/* ================= quantized path: A256 types (Q4_K, Q5_K, Q6_K, IQ4_XS) ================= */

/* Scale words of the Q4_K/Q5_K row-pair chain (k4_sb) as vpermb byte indices into the decoded
 * scales of both rows (bytes 0-7 row A, 16-23 row B; odd bytes zeroed by the mask): for
 * P_s = vpackssdw(D_s A, D_s B), word 8c + p is row A's (p < 4) or row B's (p >= 4) scale of the
 * sub-block of D_s lanes 4c..4c+3 (s = 0..3: sub-blocks 0|2, 1|3, 4|6, 5|7, the second for c >= 2). */
static const uint8_t kidx_k4z[4][64] __attribute__((aligned(64))) = {
  {0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 16, 0, 16, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 16, 0, 16, 0, 16, 0, 2, 0, 2, 0, 2, 0, 2, 0, 18, 0, 18, 0, 18, 0, 18, 0, 2, 0, 2, 0, 2, 0, 2, 0, 18, 0, 18, 0, 18, 0, 18, 0},
  {1, 0, 1, 0, 1, 0, 1, 0, 17, 0, 17, 0, 17, 0, 17, 0, 1, 0, 1, 0, 1, 0, 1, 0, 17, 0, 17, 0, 17, 0, 17, 0, 3, 0, 3, 0, 3, 0, 3, 0, 19, 0, 19, 0, 19, 0, 19, 0, 3, 0, 3, 0, 3, 0, 3, 0, 19, 0, 19, 0, 19, 0, 19, 0},
  {4, 0, 4, 0, 4, 0, 4, 0, 20, 0, 20, 0, 20, 0, 20, 0, 4, 0, 4, 0, 4, 0, 4, 0, 20, 0, 20, 0, 20, 0, 20, 0, 6, 0, 6, 0, 6, 0, 6, 0, 22, 0, 22, 0, 22, 0, 22, 0, 6, 0, 6, 0, 6, 0, 6, 0, 22, 0, 22, 0, 22, 0, 22, 0},
  {5, 0, 5, 0, 5, 0, 5, 0, 21, 0, 21, 0, 21, 0, 21, 0, 5, 0, 5, 0, 5, 0, 5, 0, 21, 0, 21, 0, 21, 0, 21, 0, 7, 0, 7, 0, 7, 0, 7, 0, 23, 0, 23, 0, 23, 0, 23, 0, 7, 0, 7, 0, 7, 0, 7, 0, 23, 0, 23, 0, 23, 0, 23, 0},
};
/* Q4_K/Q5_K mins of both rows of a pair as int16 words for the bsum vpmaddwd: word 2j, 2j+1 =
 * m[j] (scale byte 8 + j); words 0-15 row 0 (bytes 8-15), words 16-31 row 1 (bytes 24-31) */
static const uint8_t kidx_min2[64] __attribute__((aligned(64))) = {
  8, 0, 8, 0, 9, 0, 9, 0, 10, 0, 10, 0, 11, 0, 11, 0, 12, 0, 12, 0, 13, 0, 13, 0, 14, 0, 14, 0, 15, 0, 15, 0,
  24, 0, 24, 0, 25, 0, 25, 0, 26, 0, 26, 0, 27, 0, 27, 0, 28, 0, 28, 0, 29, 0, 29, 0, 30, 0, 30, 0, 31, 0, 31, 0};
/* Q6_K: vpermw word indices of the steps-(0,1) and steps-(2,3) scale vectors of the packed lanes
 * (kernels_internal.h). */
static const uint16_t kidx_q6k[2][32] __attribute__((aligned(64))) = {
  {0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},
  {8, 8, 8, 8, 12, 12, 12, 12, 9, 9, 9, 9, 13, 13, 13, 13, 10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15},
};


/* IQ4_XS |kvalues_iq4nl| as 64-entry vpermb tables: by the code byte (low nibble = i & 15) and by
 * the code word >> 2 (high nibble = i >> 2) */
#define KABS16 127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113
static const uint8_t kabs_lo[64] __attribute__((aligned(64))) = {KABS16, KABS16, KABS16, KABS16};
static const uint8_t kabs_hi[64] __attribute__((aligned(64))) = {
  127, 127, 127, 127, 104, 104, 104, 104, 83, 83, 83, 83, 65, 65, 65, 65, 49, 49, 49, 49, 35, 35, 35, 35, 22, 22, 22, 22, 10, 10, 10, 10,
  1, 1, 1, 1, 13, 13, 13, 13, 25, 25, 25, 25, 38, 38, 38, 38, 53, 53, 53, 53, 69, 69, 69, 69, 89, 89, 89, 89, 113, 113, 113, 113};
#undef KABS16
#define KSIG16 -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
static const int8_t ksig_lo[64] __attribute__((aligned(64))) = {KSIG16, KSIG16, KSIG16, KSIG16};
static const int8_t ksig_hi[64] __attribute__((aligned(64))) = {
  -127, -127, -127, -127, -104, -104, -104, -104, -83, -83, -83, -83, -65, -65, -65, -65, -49, -49, -49, -49, -35, -35, -35, -35,
  -22, -22, -22, -22, -10, -10, -10, -10, 1, 1, 1, 1, 13, 13, 13, 13, 25, 25, 25, 25, 38, 38, 38, 38, 53, 53, 53, 53, 69, 69, 69, 69,
  89, 89, 89, 89, 113, 113, 113, 113};
#undef KSIG16

/* Q6_K (16-lane model) and IQ4_XS with several activation rows or a lone last row; Q4_K/Q5_K
 * take k4_rows (superblock model), IQ4_XS row pairs with one activation row iq4xs_pairs. */
static inline __attribute__((always_inline)) void a256_rows(const int T, const int NB, const int RR,
                                                            const floe_mat *W, const kact_layout *L, int64_t r,
                                                            const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  const int bytes = T == FLOE_TYPE_Q6_K ? 210 : 136;
  const __m512i m4 = _mm512_set1_epi8(15);
  __m512 acc[2][NBG];
  __m256 macc[2][NBG];
  for (int rr = 0; rr < RR; rr++)
    for (int b = 0; b < NB; b++) {
      acc[rr][b] = _mm512_setzero_ps();
      macc[rr][b] = _mm256_setzero_ps();
    }
  for (int64_t k = 0; k < L->nblk; k++) {
    /* decode of each weight row's superblock (RR rows, shared by the NB activation rows) */
    __m512i Wd[2][4], SVd[2][4], AUX[2];
    __m512 DV[2];
    __mmask64 NEG[2][4];
    __m128 DDM2 = _mm_setzero_ps();
    __m512i L16 = _mm512_setzero_si512();
    if (T == FLOE_TYPE_IQ4_XS) {
      /* both rows' 8 scales (ls - 32) as int16 words (0-7 row A, 8-15 row B) in one vpmovsxbw, and
       * [dA, dB] in one conversion (S4 below); row B = row A when RR = 1 */
      const uint8_t *bA = kw_row(W, r) + k * bytes, *bB = kw_row(W, r + RR - 1) + k * bytes;
      L16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_set_epi64x((long long)kq_scales_iq4xs_u64(bB), (long long)kq_scales_iq4xs_u64(bA))));
      uint16_t hA, hB;
      memcpy(&hA, bA, 2);
      memcpy(&hB, bB, 2);
      DDM2 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)hB << 16 | hA)));
    }
#pragma GCC unroll 2
    for (int rr = 0; rr < RR; rr++) {
    const uint8_t *bk = kw_row(W, r + rr) + k * bytes;
    pf_row(kw_row(W, r + rr), k * bytes, W->row_bytes, RR, 3, 1);
    __m512i w[4], sv[4], q[2];
    __m256i aux = _mm256_setzero_si256(); /* scales (Q6_K) as int16, for bsum */
    float d;
    if (T == FLOE_TYPE_Q6_K) {
      d = f16s(bk + 208);
      __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(bk + 192)));
      aux = sc16;
      __m512i sz = _mm512_castsi256_si512(sc16);
      sv[0] = _mm512_permutexvar_epi16(_mm512_load_si512(kidx_q6k[0]), sz);
      sv[1] = _mm512_permutexvar_epi16(_mm512_load_si512(kidx_q6k[1]), sz);
      const uint8_t *ql = bk, *qhp = bk + 128;
      const __m512i m30 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
      for (int n = 0; n < 2; n++) {
        __m512i l = _mm512_loadu_si512(ql + 64 * n);
        __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qhp + 32 * n)));
        __m512i hl = _mm512_and_si512(_mm512_sllv_epi16(h, _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1)), m30);
        __m512i hh = _mm512_and_si512(_mm512_srlv_epi16(h, _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1)), m30);
        w[2 * n] = _mm512_or_si512(_mm512_and_si512(l, m4), hl);
        w[2 * n + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), hh);
      }
    } else { /* IQ4_XS */
      d = 0;
      /* this row's scale words of L16: steps 0-1 sub-blocks 0-3, steps 2-3 sub-blocks 4-7 */
      const __m512i wi = _mm512_add_epi16(_mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                                                             15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3),
                                          _mm512_set1_epi16((short)(8 * rr)));
      sv[0] = sv[1] = _mm512_permutexvar_epi16(wi, L16);
      sv[2] = sv[3] = _mm512_permutexvar_epi16(_mm512_add_epi16(wi, _mm512_set1_epi16(4)), L16);
      /* |kvalue| by vpermb, which reads index bits 0-5 only: low nibbles straight from the code
       * bytes (table kabs[i & 15]), high nibbles from the words >> 2 (bits 2-7 of each byte land
       * in bits 0-5; table kabs[i >> 2]): no and, no gf2p8affine */
      const uint8_t *qs = bk + 8;
      const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
      const __m512i tlo = _mm512_load_si512(kabs_lo), thi = _mm512_load_si512(kabs_hi);
      w[0] = _mm512_permutexvar_epi8(q0, tlo);
      w[1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q0, 2), thi);
      w[2] = _mm512_permutexvar_epi8(q1, tlo);
      w[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q1, 2), thi);
      q[0] = q0, q[1] = q1;
    }
    __mmask64 neg[4];
    if (T == FLOE_TYPE_IQ4_XS) {
      /* kvalue < 0 <=> code < 8 (bit 3 clear). Low nibbles: vptestnmb; high nibbles: the code
       * byte's bit 7 is the nibble's bit 3, one vpmovb2m (port 0), but it marks the *positive*
       * weights: steps 1 and 3 negate x where w > 0, i.e. sum -w*x exactly, and their chain is
       * subtracted (Lv = La - Lb below) */
      neg[0] = _mm512_testn_epi8_mask(q[0], _mm512_set1_epi8(8));
      neg[1] = _mm512_movepi8_mask(q[0]);
      neg[2] = _mm512_testn_epi8_mask(q[1], _mm512_set1_epi8(8));
      neg[3] = _mm512_movepi8_mask(q[1]);
    }
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) Wd[rr][s] = w[s];
    SVd[rr][0] = sv[0], SVd[rr][1] = sv[1];
    if (T == FLOE_TYPE_IQ4_XS) {
      SVd[rr][2] = sv[2], SVd[rr][3] = sv[3];
      for (int s = 0; s < 4; s++) NEG[rr][s] = neg[s];
    }
    AUX[rr] = _mm512_castsi256_si512(aux);
    DV[rr] = _mm512_set1_ps(d);
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
    /* IQ4_XS: [dA*dx, dB*dx] */
    const __m128 S4 = _mm_mul_ps(DDM2, _mm_set1_ps(((const float *)(xq + b * xs + L->off_d))[k]));
#pragma GCC unroll 2
    for (int rr = 0; rr < RR; rr++) {
      const __m512i *w = Wd[rr], *sv = SVd[rr];
      const __mmask64 *neg = NEG[rr];
      const __m256i aux = _mm512_castsi512_si256(AUX[rr]);
      const __m512 dv = DV[rr];
      const uint8_t *xb = xq + b * xs;
      const int8_t *x = (const int8_t *)xb + 256 * k;
      const float dx = ((const float *)(xb + L->off_d))[k];
      __m512i Lv;
      if (T == FLOE_TYPE_IQ4_XS) {
        /* |kvalue| * x 4-sums exceed int16: pairs (vpmaddubsw) times the scale, two chains: steps 0, 2 (La) and 1, 3 (Lb, negated) */
        __m512i La, Lb;
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
          __m512i xv = _mm512_loadu_si512(x + 64 * s);
          xv = _mm512_mask_sub_epi8(xv, neg[s], _mm512_setzero_si512(), xv);
          const __m512i p = _mm512_maddubs_epi16(w[s], xv);
          if (s == 0) La = _mm512_madd_epi16(p, sv[s]);
          else if (s == 1) Lb = _mm512_madd_epi16(p, sv[s]);
          else if (s % 2 == 0) La = _mm512_dpwssd_epi32(La, p, sv[s]);
          else Lb = _mm512_dpwssd_epi32(Lb, p, sv[s]);
        }
        Lv = _mm512_sub_epi32(La, Lb); /* Lb holds -(steps 1, 3), see neg[] */
      } else {
        /* Q6_K: unscaled 4-sums per step (vpdpbusd, < 2^15), two steps packed to int16
         * (vpackssdw, exact), then one vpdpwssd per two steps applies the scales: 6 port-0
         * uops instead of 8 */
        __m512i D[4];
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) D[s] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[s], _mm512_loadu_si512(x + 64 * s));
        Lv = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(D[0], D[1]), sv[0]),
                                 _mm512_packs_epi32(D[2], D[3]), sv[1]);
      }
      /* S = d*dx as a vector multiply with dx broadcast from memory (no scalar->vector moves) */
      __m512 Sv;
      if (T == FLOE_TYPE_IQ4_XS) Sv = rr ? _mm512_permutexvar_ps(_mm512_set1_epi32(1), _mm512_castps128_ps512(S4)) : _mm512_broadcastss_ps(S4);
      else Sv = _mm512_mul_ps(dv, _mm512_set1_ps(dx));
      acc[rr][b] = lanes_add(acc[rr][b], Lv, Sv);
      if (T == FLOE_TYPE_Q6_K) {
        __m256i bs = _mm256_loadu_si256((const __m256i *)((const int16_t *)(xb + L->off_s) + 16 * k));
        __m256i M = _mm256_slli_epi32(_mm256_madd_epi16(aux, bs), 5);
        macc[rr][b] = _mm256_add_ps(macc[rr][b], _mm256_mul_ps(_mm256_cvtepi32_ps(M), _mm512_castps512_ps256(Sv)));
      }
    }
    }
  }
  if (RR == 2)
    for (int b = 0; b < NB; b++) {
      const __m512 m = _mm512_insertf32x8(_mm512_castps256_ps512(macc[0][b]), macc[1][b], 1);
      red2(acc[0][b], acc[1][b], m, &Y[b * ldy + r], &Y[b * ldy + r + 1]);
    }
  else
    for (int b = 0; b < NB; b++) Y[b * ldy + r] = red16(acc[0][b]) - red8(macc[0][b]);
}

#define a256_row(T, NB, W, L, r, xq, xs, Y, ldy) a256_rows(T, NB, 1, W, L, r, xq, xs, Y, ldy)

/* ================= quantized path: Q4_K / Q5_K, the superblock model ================= */

/* One activation row xb against RR = 2 weight rows (r, r+1) or RR = 1 (kernels_internal.h, the
 * superblock model). Per superblock k and row, the exact integers S1 = sum over sub-blocks j of
 * sc[j] * (codes . activation bytes) and S2 = sum over j of m[j] * bsum[j]; per 4 superblocks, for
 * both rows at once, t = (float)S1 * (d*dx) - (float)S2 * (dmin*dx), one add into the slot
 * accumulators (slot k % 16 = lane k % 4 of acc4[(k / 4) % 4], row A lanes 0-3, row B lanes 4-7).
 * Those float operations and their order are the model's; S1 and S2 are exact sums of int32
 * lanes, so the order of the integer adds does not change a bit.
 * Per superblock (k4_sb):
 *   - each row's codes as u8 lanes, 4 vpdpbusd with the activation bytes: D_s, lanes 0-7 one
 *     sub-block, 8-15 another (s = 0..3: sub-blocks 0|2, 1|3, 4|6, 5|7);
 *   - both rows side by side: P_s = vpackssdw(D_s row A, D_s row B) (|lane| <= 4*15*127 fits
 *     int16; 128-bit chunk c = [A lanes 4c..4c+3, B lanes 4c..4c+3]) and one chain of 4 vpdpwssd
 *     with the scale words (kidx_k4z: each word the 6-bit scale of its row and sub-block): Lr,
 *     whose chunks are [A, A, B, B] partial sums of S1;
 *   - both rows' mins in one vpmaddwd with the bsums: M, lanes 0-7 row A, 8-15 row B (S2).
 * Per 4 superblocks (k4_tree) the 8 vectors Lr_i, M_i fold into one: three levels of two shuffles
 * and an add, then a permute into the quarters [S1 A, S1 B, S2 A, S2 B] (lane i = superblock i);
 * k4_scv4 makes the matching [dd A, dd B, dm A, dm B] and k4_t the t of both rows.
 * Before (2026-11-30) each row had its own Lr, folded per superblock with the other row's and M
 * (6 shuffle/add steps) and per group once more (9): ~12 more shuffle-port uops per group. */
static inline __attribute__((always_inline)) void k4_sb(const int T, const int RR, const floe_mat *W, const uint8_t *bA,
                                                         const uint8_t *bB, const int8_t *x, const int16_t *bs,
                                                         const uint8_t *rowA, int64_t yoff, int pl, __m256i *rawo,
                                                         __m512i *Lro, __m512i *Mo) {
  const __m512i m4 = _mm512_set1_epi8(15);
  /* bytes 0-15 of both superblocks: [d, dmin] f16, then the 12 scale bytes (128-bit lane rr = row rr) */
  const __m256i raw = _mm256_loadu2_m128i((const __m128i *)bB, (const __m128i *)bA);
  *rawo = raw; /* the caller makes the float scales of 4 superblocks at once (k4_scv4) */
  /* 6-bit scales and mins of both rows in one ymm (128-bit lane rr = row rr; bytes 0-7 sc, 8-15 m) */
  const __m512i scz = _mm512_castsi256_si512(kq4_scm2(raw));
  __m512i q[2][2], qh[2];
#pragma GCC unroll 2
  for (int rr = 0; rr < RR; rr++) {
    const uint8_t *bk = rr ? bB : bA;
    pf_row(rowA + rr * W->row_bytes, yoff, W->row_bytes, RR, pl, 1);
    const uint8_t *qs = bk + (T == FLOE_TYPE_Q4_K ? 16 : 48);
    q[rr][0] = _mm512_loadu_si512(qs);
    q[rr][1] = _mm512_loadu_si512(qs + 64);
    if (T == FLOE_TYPE_Q5_K) qh[rr] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bk + 16)));
  }
  __m512i Lr = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int s = 0; s < 4; s++) {
    const __m512i xs = _mm512_loadu_si512(x + 64 * s);
    __m512i D[2];
    D[1] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int rr = 0; rr < RR; rr++) {
      __m512i w = s & 1 ? hi_nib(q[rr][s / 2]) : _mm512_and_si512(q[rr][s / 2], m4);
      if (T == FLOE_TYPE_Q5_K) {
        const int lo = 4 * (s / 2) + s % 2, hi = lo + 2;
        const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << lo)), _mm256_set1_epi8((char)(1 << hi)), 1);
        w = _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(qh[rr], bits), w, _mm512_set1_epi8(16));
      }
      D[rr] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xs);
    }
    const __m512i z = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kidx_k4z[s]), scz);
    Lr = _mm512_dpwssd_epi32(Lr, _mm512_packs_epi32(D[0], D[1]), z);
  }
  *Lro = Lr;
  const __m512i AUX2 = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kidx_min2), scz);
  *Mo = _mm512_madd_epi16(AUX2, _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)bs)));
}

/* ---- several activation rows: the weight decode once per row pair ----
 * With nb >= 3 activation rows (the decode rows of several requests, continuous batching) k4_sb
 * would decode each superblock again for every activation row: nibbles, the Q5_K fifth bit, the
 * scale words and the mins' words are about half of its vector uops. k4_multi (below) decodes a
 * row pair's superblocks once into a k4_dec buffer (L1: 896 B a superblock, K4_DEC_MAX of them)
 * and runs each activation row over it (k4_sb_use: only the vpdpbusd / vpackssdw / vpdpwssd chain
 * and the mins' vpmaddwd per row). The vectors are those k4_sb builds and the operations on them
 * the same, in the same order, so every output is bit-identical to k4_rows with one row. */
typedef struct k4_dec {
  __m512i w[4][2]; /* code bytes of step s for rows A, B (the fifth bit added for Q5_K) */
  __m512i z[4];    /* scale words of step s (kidx_k4z) */
  __m512i aux2;    /* mins' words (kidx_min2) */
  __m256i raw;     /* bytes 0-15 of both superblocks (d, dmin: k4_scv4) */
  __m256i pad;
} k4_dec;

static inline __attribute__((always_inline)) void k4_dec_sb(const int T, const int RR, const floe_mat *W,
                                                            const uint8_t *bA, const uint8_t *bB, const uint8_t *rowA,
                                                            int64_t yoff, int pl, k4_dec *o) {
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m256i raw = _mm256_loadu2_m128i((const __m128i *)bB, (const __m128i *)bA);
  o->raw = raw;
  const __m512i scz = _mm512_castsi256_si512(kq4_scm2(raw));
#pragma GCC unroll 2
  for (int rr = 0; rr < RR; rr++) {
    const uint8_t *bk = rr ? bB : bA;
    pf_row(rowA + rr * W->row_bytes, yoff, W->row_bytes, RR, pl, 1);
    const uint8_t *qs = bk + (T == FLOE_TYPE_Q4_K ? 16 : 48);
    const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
    __m512i qh = _mm512_setzero_si512();
    if (T == FLOE_TYPE_Q5_K) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bk + 16)));
#pragma GCC unroll 4
    for (int st = 0; st < 4; st++) {
      const __m512i q = st / 2 ? q1 : q0;
      __m512i w = st & 1 ? hi_nib(q) : _mm512_and_si512(q, m4);
      if (T == FLOE_TYPE_Q5_K) {
        const int lo = 4 * (st / 2) + st % 2, hi = lo + 2;
        const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << lo)), _mm256_set1_epi8((char)(1 << hi)), 1);
        w = _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(qh, bits), w, _mm512_set1_epi8(16));
      }
      o->w[st][rr] = w;
    }
  }
#pragma GCC unroll 4
  for (int st = 0; st < 4; st++)
    o->z[st] = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kidx_k4z[st]), scz);
  o->aux2 = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kidx_min2), scz);
}

/* k4_sb of one activation row on a decoded superblock (RR: as decoded). */
static inline __attribute__((always_inline)) void k4_sb_use(const int RR, const k4_dec *d, const int8_t *x,
                                                            const int16_t *bs, __m256i *rawo, __m512i *Lro,
                                                            __m512i *Mo) {
  *rawo = d->raw;
  __m512i Lr = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int s = 0; s < 4; s++) {
    const __m512i xs = _mm512_loadu_si512(x + 64 * s);
    const __m512i D0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), d->w[s][0], xs);
    const __m512i D1 = RR == 2 ? _mm512_dpbusd_epi32(_mm512_setzero_si512(), d->w[s][1], xs) : _mm512_setzero_si512();
    Lr = _mm512_dpwssd_epi32(Lr, _mm512_packs_epi32(D0, D1), d->z[s]);
  }
  *Lro = Lr;
  *Mo = _mm512_madd_epi16(d->aux2, _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)bs)));
}

/* Lr_i, M_i of 4 superblocks (k4_sb) to the exact [S1 A, S1 B, S2 A, S2 B] quarters, lane i =
 * superblock i:
 *   X01 = chunks [Lr0 c0+c2, Lr0 c1+c3, Lr1 c0+c2, Lr1 c1+c3] (each [A A B B]), X23 likewise;
 *   Y01 = qwords of M0 and M1 interleaved, lo + hi: chunks 0-1 [A0 A0 A1 A1], 2-3 [B0 B0 B1 B1];
 *   X = [X01 c0+c1, X01 c2+c3, X23 c0+c1, X23 c2+c3]: chunk i = superblock i, [A A B B];
 *   Y = the same on Y01, Y23: [A0 A0 A1 A1], [B0 B0 B1 B1], [A2 A2 A3 A3], [B2 B2 B3 B3];
 *   Z = even + odd dwords of X and Y: chunk c = [S1 A c, S1 B c, two S2], then kk4_zidx. */
static const int32_t kk4_zidx[16] __attribute__((aligned(64))) = {0, 4, 8, 12, 1, 5, 9, 13, 2, 3, 10, 11, 6, 7, 14, 15};

static inline __attribute__((always_inline)) __m512i k4_tree(const __m512i *Lr, const __m512i *M) {
  const __m512i X01 = _mm512_add_epi32(_mm512_shuffle_i64x2(Lr[0], Lr[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_i64x2(Lr[0], Lr[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512i X23 = _mm512_add_epi32(_mm512_shuffle_i64x2(Lr[2], Lr[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_i64x2(Lr[2], Lr[3], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512i Y01 = _mm512_add_epi32(_mm512_unpacklo_epi64(M[0], M[1]), _mm512_unpackhi_epi64(M[0], M[1]));
  const __m512i Y23 = _mm512_add_epi32(_mm512_unpacklo_epi64(M[2], M[3]), _mm512_unpackhi_epi64(M[2], M[3]));
  const __m512i X = _mm512_add_epi32(_mm512_shuffle_i64x2(X01, X23, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i64x2(X01, X23, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i Y = _mm512_add_epi32(_mm512_shuffle_i64x2(Y01, Y23, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i64x2(Y01, Y23, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 fx = _mm512_castsi512_ps(X), fy = _mm512_castsi512_ps(Y);
  const __m512i Z = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fx, fy, _MM_SHUFFLE(2, 0, 2, 0))),
                                     _mm512_castps_si512(_mm512_shuffle_ps(fx, fy, _MM_SHUFFLE(3, 1, 3, 1))));
  return _mm512_permutexvar_epi32(_mm512_load_si512(kk4_zidx), Z);
}

/* The scale vector of 4 superblocks from their raw k4_sb loads (slot i = raw[i]): lane i of the
 * quarters [dA, dB, dminA, dminB] (f16 -> f32) times dx4[i] (one rounding each): dwords 0
 * ([d, dmin]) of the 4 slots gathered by two unpacks (row A in the low 128-bit lane, B in the
 * high), one vcvtph2ps, one vpermps into the quarter order, one multiply. Before (2026-11-30) each
 * superblock made its lanes alone (scalar loads, insert, cvtph, multiply, masked permute). */
static const int32_t kk4_fidx[16] __attribute__((aligned(64))) = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};

static inline __attribute__((always_inline)) __m512 k4_scv4(const __m256i *raw, __m128 dx4) {
  const __m256i u = _mm256_unpacklo_epi64(_mm256_unpacklo_epi32(raw[0], raw[1]), _mm256_unpacklo_epi32(raw[2], raw[3]));
  const __m512 f = _mm512_cvtph_ps(u);
  return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_load_si512(kk4_fidx), f), _mm512_broadcast_f32x4(dx4));
}

/* t = (float)S1 * (d*dx) - (float)S2 * (dmin*dx) of a group: [row A slots 0-3 | row B slots 0-3]. */
static inline __attribute__((always_inline)) __m256 k4_t(__m512i Z, __m512 scv) {
  const __m512 Pr = _mm512_mul_ps(_mm512_cvtepi32_ps(Z), scv);
  return _mm256_sub_ps(_mm512_castps512_ps256(Pr), _mm512_extractf32x8_ps(Pr, 1));
}

/* Superblocks g .. g+NI-1 (NI <= 4, a compile-time constant: no per-superblock bounds test) to
 * their exact sums and scale vector; missing slots are zero (t = 0 * 0 - 0 * 0 = +0). Prefetch
 * lines per row and superblock: Q4_K 2, 2, 2, 3 (four superblocks are 576 B = 9 lines; with rows
 * of a multiple of 4 superblocks the group starts on a line and each line is prefetched once; 3
 * each had prefetched 3 of the 9 twice), Q5_K 3 (704 B = 11 lines). */
static inline __attribute__((always_inline)) void k4_grp_int(const int T, const int RR, const int NI, const floe_mat *W,
                                                             const kact_layout *L, const uint8_t *xb, const uint8_t *rowA,
                                                             const uint8_t *rowB, const k4_dec *dec, int64_t g,
                                                             __m512i *Zo, __m512 *scvo) {
  const int bytes = T == FLOE_TYPE_Q4_K ? 144 : 176;
  const int8_t *xq = (const int8_t *)xb;
  const float *dxv = (const float *)(xb + L->off_d);
  const int16_t *bsv = (const int16_t *)(xb + L->off_s);
  __m512i Lr[4], M[4];
  __m256i raw[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    const int64_t k = g + i;
    if (i < NI && dec) { /* decoded by k4_multi (dec: a compile-time NULL or not in every caller) */
      k4_sb_use(RR, &dec[k], xq + 256 * k, bsv + 16 * k, &raw[i], &Lr[i], &M[i]);
    } else if (i < NI) {
      k4_sb(T, RR, W, rowA + k * bytes, rowB + k * bytes, xq + 256 * k, bsv + 16 * k, rowA, k * bytes,
            T == FLOE_TYPE_Q4_K && i < 3 ? 2 : 3, &raw[i], &Lr[i], &M[i]);
    } else {
      raw[i] = _mm256_setzero_si256();
      Lr[i] = M[i] = _mm512_setzero_si512();
    }
  }
  *Zo = k4_tree(Lr, M);
  *scvo = k4_scv4(raw, NI == 4 ? _mm_loadu_ps(dxv + g) : _mm_maskz_loadu_ps((__mmask8)((1u << NI) - 1), dxv + g));
}

static inline __attribute__((always_inline)) void k4_grp(const int T, const int RR, const int NI, const floe_mat *W,
                                                         const kact_layout *L, const uint8_t *xb, const uint8_t *rowA,
                                                         const uint8_t *rowB, const k4_dec *dec, int64_t g, __m256 *acc4) {
  __m512i Z;
  __m512 scv;
  k4_grp_int(T, RR, NI, W, L, xb, rowA, rowB, dec, g, &Z, &scv);
  acc4[(g >> 2) & 3] = _mm256_add_ps(acc4[(g >> 2) & 3], k4_t(Z, scv));
}

/* Whole groups are software-pipelined: the float tail of group g (k4_t and its add into acc4: a
 * ~20-cycle chain after the ~30-cycle integer chain of each superblock) is issued after the integer
 * work of group g + 1. The operations and the order of the adds into acc4 are those of one k4_grp
 * after another; only the program order changes. Why: with ~130 uops per superblock pair and long
 * chains, the scheduler filled with uops waiting on the tail and the loop ran at ~35 cycles per
 * pair, ~60 % of its port bound (llvm-mca: register dependencies 28 %). Measured 2026-11-30
 * (per-token A/B in the decode of the 35B-A3B shape, 2 runs): -1.1 / -1.4 % a token, the output
 * matrix -1.6 %. */
static inline __attribute__((always_inline)) void k4_rows(const int T, const int RR, const floe_mat *W, const kact_layout *L,
                                                          int64_t r, const k4_dec *dec, const uint8_t *xb, float *y0,
                                                          float *y1) {
  const int64_t nsb = L->nblk;
  const uint8_t *rowA = kw_row(W, r), *rowB = kw_row(W, r + RR - 1);
  __m256 acc4[4];
  for (int j = 0; j < 4; j++) acc4[j] = _mm256_setzero_ps();
  int64_t g = 0;
  if (nsb >= 4) { /* with one whole group this is k4_grp: its integer work, then its tail */
    __m512i Zp, Zn;
    __m512 sp, sn;
    k4_grp_int(T, RR, 4, W, L, xb, rowA, rowB, dec, 0, &Zp, &sp);
    for (g = 4; g + 4 <= nsb; g += 4) {
      k4_grp_int(T, RR, 4, W, L, xb, rowA, rowB, dec, g, &Zn, &sn);
      acc4[((g - 4) >> 2) & 3] = _mm256_add_ps(acc4[((g - 4) >> 2) & 3], k4_t(Zp, sp));
      Zp = Zn;
      sp = sn;
    }
    acc4[((g - 4) >> 2) & 3] = _mm256_add_ps(acc4[((g - 4) >> 2) & 3], k4_t(Zp, sp));
  }
  switch (nsb - g) {
    case 1: k4_grp(T, RR, 1, W, L, xb, rowA, rowB, dec, g, acc4); break;
    case 2: k4_grp(T, RR, 2, W, L, xb, rowA, rowB, dec, g, acc4); break;
    case 3: k4_grp(T, RR, 3, W, L, xb, rowA, rowB, dec, g, acc4); break;
    default: break;
  }
  /* reduce16 of both rows: a = slots 0-7 + 8-15, b = a[0-3] + a[4-7], c[i] = b[i] + b[i+2], c0 + c1 */
  const __m256 b = _mm256_add_ps(_mm256_add_ps(acc4[0], acc4[2]), _mm256_add_ps(acc4[1], acc4[3]));
  const __m256 c = _mm256_add_ps(b, _mm256_permute_ps(b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 e = _mm256_add_ps(c, _mm256_permute_ps(c, _MM_SHUFFLE(1, 1, 1, 1)));
  *y0 = _mm256_cvtss_f32(e);
  if (RR == 2) *y1 = _mm_cvtss_f32(_mm256_extractf128_ps(e, 1));
}

/* Rows of two superblocks (2048x512 expert down matrices): four rows per call, superblocks 0-1
 * of rows (r, r+1) and of rows (r+2, r+3) filling the four slots of one k4_grp-style group, so the
 * tree is not half padding. The values are k4_rows': a row's t of superblocks 0 and 1 land in
 * slots 0 and 1, every other slot stays +0, so its reduce16 is (0 + t0) + (0 + t1). */
static inline __attribute__((always_inline)) void k4_two(const int T, const floe_mat *W, const kact_layout *L, int64_t r,
                                                         const uint8_t *xb, float *y) {
  const int bytes = T == FLOE_TYPE_Q4_K ? 144 : 176;
  const int8_t *xq = (const int8_t *)xb;
  const float *dxv = (const float *)(xb + L->off_d);
  const int16_t *bsv = (const int16_t *)(xb + L->off_s);
  const uint8_t *p0 = kw_row(W, r), *p1 = kw_row(W, r + 2);
  const size_t rb = W->row_bytes;
  __m512i Lr[4], M[4];
  __m256i raw[4];
  k4_sb(T, 2, W, p0, p0 + rb, xq, bsv, p0, 0, 3, &raw[0], &Lr[0], &M[0]);
  k4_sb(T, 2, W, p0 + bytes, p0 + rb + bytes, xq + 256, bsv + 16, p0, bytes, 3, &raw[1], &Lr[1], &M[1]);
  k4_sb(T, 2, W, p1, p1 + rb, xq, bsv, p1, 0, 3, &raw[2], &Lr[2], &M[2]);
  k4_sb(T, 2, W, p1 + bytes, p1 + rb + bytes, xq + 256, bsv + 16, p1, bytes, 3, &raw[3], &Lr[3], &M[3]);
  const __m512 scv = k4_scv4(raw, _mm_castpd_ps(_mm_loaddup_pd((const double *)dxv))); /* slots' dx: dx0, dx1, dx0, dx1 */
  /* t = [r: sb0 sb1, r+2: sb0 sb1 | r+1: sb0 sb1, r+3: sb0 sb1]; u = 0 + t, y = u[2i] + u[2i+1] */
  const __m256 u = _mm256_add_ps(_mm256_setzero_ps(), k4_t(k4_tree(Lr, M), scv));
  const __m256 v = _mm256_add_ps(u, _mm256_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
  y[0] = _mm256_cvtss_f32(v);
  y[2] = _mm_cvtss_f32(_mm_movehl_ps(_mm256_castps256_ps128(v), _mm256_castps256_ps128(v)));
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  y[1] = _mm_cvtss_f32(hi);
  y[3] = _mm_cvtss_f32(_mm_movehl_ps(hi, hi));
}

/* Two activation rows a, b over the decoded superblocks g .. g+NI-1: k4_grp_int of each (the same
 * vectors and operations), the decoded weights and scale words loaded once for both. */
static inline __attribute__((always_inline)) void k4_grp_dec2(const int NI, const kact_layout *L, const k4_dec *dec,
                                                              const uint8_t *xa, const uint8_t *xb, int64_t g,
                                                              __m512i *Zo, __m512 *scvo) {
  const uint8_t *xr[2] = { xa, xb };
  __m512i Lr[2][4], M[2][4];
  __m256i raw[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    const int64_t k = g + i;
    if (i < NI) {
      const k4_dec *d = &dec[k];
      raw[i] = d->raw;
      __m512i La = _mm512_setzero_si512(), Lb = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int s = 0; s < 4; s++) {
        const __m512i w0 = d->w[s][0], w1 = d->w[s][1], z = d->z[s];
        const __m512i xsa = _mm512_loadu_si512(xa + 256 * k + 64 * s), xsb = _mm512_loadu_si512(xb + 256 * k + 64 * s);
        La = _mm512_dpwssd_epi32(La, _mm512_packs_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, xsa),
                                                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), w1, xsa)), z);
        Lb = _mm512_dpwssd_epi32(Lb, _mm512_packs_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, xsb),
                                                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), w1, xsb)), z);
      }
      Lr[0][i] = La;
      Lr[1][i] = Lb;
#pragma GCC unroll 2
      for (int a = 0; a < 2; a++)
        M[a][i] = _mm512_madd_epi16(d->aux2, _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                                 (const __m256i *)((const int16_t *)(xr[a] + L->off_s) + 16 * k))));
    } else {
      raw[i] = _mm256_setzero_si256();
      Lr[0][i] = M[0][i] = Lr[1][i] = M[1][i] = _mm512_setzero_si512();
    }
  }
#pragma GCC unroll 2
  for (int a = 0; a < 2; a++) {
    const float *dxv = (const float *)(xr[a] + L->off_d);
    Zo[a] = k4_tree(Lr[a], M[a]);
    scvo[a] = k4_scv4(raw, NI == 4 ? _mm_loadu_ps(dxv + g) : _mm_maskz_loadu_ps((__mmask8)((1u << NI) - 1), dxv + g));
  }
}

/* k4_rows (RR = 2) of activation rows a and b over a decoded row pair: each row's adds into its
 * acc4 in k4_rows' order, so the same bits. */
static inline __attribute__((always_inline)) void k4_rows_dec2(const kact_layout *L, const k4_dec *dec, const uint8_t *xa,
                                                               const uint8_t *xb, float *ya, float *yb) {
  const int64_t nsb = L->nblk;
  __m256 acc4[2][4];
  for (int a = 0; a < 2; a++)
    for (int j = 0; j < 4; j++) acc4[a][j] = _mm256_setzero_ps();
  __m512i Z[2];
  __m512 sc[2];
  int64_t g = 0;
  for (; g + 4 <= nsb; g += 4) {
    k4_grp_dec2(4, L, dec, xa, xb, g, Z, sc);
    for (int a = 0; a < 2; a++) acc4[a][(g >> 2) & 3] = _mm256_add_ps(acc4[a][(g >> 2) & 3], k4_t(Z[a], sc[a]));
  }
  switch (nsb - g) {
    case 1: k4_grp_dec2(1, L, dec, xa, xb, g, Z, sc); break;
    case 2: k4_grp_dec2(2, L, dec, xa, xb, g, Z, sc); break;
    case 3: k4_grp_dec2(3, L, dec, xa, xb, g, Z, sc); break;
    default: break;
  }
  if (nsb - g)
    for (int a = 0; a < 2; a++) acc4[a][(g >> 2) & 3] = _mm256_add_ps(acc4[a][(g >> 2) & 3], k4_t(Z[a], sc[a]));
  float *y[2] = { ya, yb };
  for (int a = 0; a < 2; a++) { /* k4_rows' reduce16 of both weight rows */
    const __m256 b = _mm256_add_ps(_mm256_add_ps(acc4[a][0], acc4[a][2]), _mm256_add_ps(acc4[a][1], acc4[a][3]));
    const __m256 c = _mm256_add_ps(b, _mm256_permute_ps(b, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 e = _mm256_add_ps(c, _mm256_permute_ps(c, _MM_SHUFFLE(1, 1, 1, 1)));
    y[a][0] = _mm256_cvtss_f32(e);
    y[a][1] = _mm_cvtss_f32(_mm256_extractf128_ps(e, 1));
  }
}

/* Row pairs [r0, r1) (r1 - r0 even) for nb >= 3 activation rows, each pair decoded once (see
 * k4_dec); nblk <= K4_DEC_MAX. */
static inline __attribute__((always_inline)) void k4_multi(const int T, const floe_mat *W, const kact_layout *L, int nb,
                                                           const uint8_t *xq, size_t xs, float *Y, int64_t ldy,
                                                           int64_t r0, int64_t r1) {
  const int bytes = T == FLOE_TYPE_Q4_K ? 144 : 176;
  const int64_t nsb = L->nblk;
  k4_dec dec[K4_DEC_MAX];
  for (; r0 + 1 < r1; r0 += 2) {
    const uint8_t *rowA = kw_row(W, r0), *rowB = kw_row(W, r0 + 1);
    for (int64_t k = 0; k < nsb; k++) /* k4_grp_int's prefetch lines: 2, 2, 2, 3 (Q4_K), 3 (Q5_K) */
      k4_dec_sb(T, 2, W, rowA + k * bytes, rowB + k * bytes, rowA, k * bytes,
                T == FLOE_TYPE_Q4_K && (k & 3) < 3 ? 2 : 3, &dec[k]);
    int b = 0;
    for (; b + 1 < nb; b += 2)
      k4_rows_dec2(L, dec, xq + (size_t)b * xs, xq + (size_t)(b + 1) * xs, &Y[b * ldy + r0], &Y[(b + 1) * ldy + r0]);
    if (b < nb) k4_rows(T, 2, W, L, r0, dec, xq + (size_t)b * xs, &Y[b * ldy + r0], &Y[b * ldy + r0 + 1]);
  }
}

#define DEF_RUN_K4(name, T)                                                                        \
  static void name(const floe_mat *W, const kact_layout *L, int nb, const uint8_t *xq, size_t xs, \
                   float *Y, int64_t ldy, int64_t r0, int64_t r1) {                                 \
    if (nb == 1 && L->nblk == 2)                                                                   \
      for (; r0 + 3 < r1; r0 += 4) k4_two(T, W, L, r0, xq, &Y[r0]);                               \
    if (k4_dec_fits(W, nb)) {                                                                      \
      const int64_t re = r0 + ((r1 - r0) & ~(int64_t)1);                                         \
      k4_multi(T, W, L, nb, xq, xs, Y, ldy, r0, re);                                               \
      r0 = re;                                                                                     \
    }                                                                                              \
    for (; r0 + 1 < r1; r0 += 2)                                                                   \
      for (int b = 0; b < nb; b++) k4_rows(T, 2, W, L, r0, NULL, xq + (size_t)b * xs, &Y[b * ldy + r0], &Y[b * ldy + r0 + 1]); \
    if (r0 < r1)                                                                                   \
      for (int b = 0; b < nb; b++) k4_rows(T, 1, W, L, r0, NULL, xq + (size_t)b * xs, &Y[b * ldy + r0], NULL); \
  }


/* IQ4_XS, one activation row, rows [r0, r1) in pairs (an odd last row is left to a256_rows): the
 * SW form a256_rows used for row pairs before (x's sign on the signed weights, one vpmaddwd + 3
 * vpdpwssd chain) with the per-superblock scalar work cut:
 *   scales: both rows' first 8 bytes (d, scales_h, scales_l) in one xmm; ls = (scales_l nibble j)
 *     | (scales_h bits 2j, 2j+1) << 4 by two vpmultishiftqb (byte j of a qword from bit 32 + 4j and
 *     from bit 12 + 2j), one vpternlog, and, sub 32 (kq_scales_iq4xs_u64 did it with 2 pdep and ~10
 *     scalar ops per row, then 3 GPR->xmm moves);
 *   d: one vcvtph2ps of the same xmm (lane 0 = dA, lane 4 = dB);
 *   prefetch: pf_ptr (see above) instead of pf_row's address arithmetic.
 * The integer lanes, S = d*dx and the accumulation order are those of the 16-lane model
 * (a256_rows computes the same for nb > 1): bit-identical. */
static void iq4xs_pairs(const floe_mat *W, const kact_layout *L, int64_t r0, int64_t r1, const uint8_t *xq, float *Y) {
  const int64_t B = 136, rb = (int64_t)W->row_bytes, nsb = L->nblk;
  const pf_ptr fa0 = pf_ptr_init(kw_row(W, r0), W->row_bytes, B, KPF), na0 = pf_ptr_init(kw_row(W, r0), W->row_bytes, B, KPF_NEAR);
  const __m128i ctl_lo = _mm_set1_epi64x(0x3C3834302C282420ll), ctl_hi = _mm_set1_epi64x(0x1A18161412100E0Cll);
  const __m128i c0f = _mm_set1_epi8(0x0F), c3f = _mm_set1_epi8(0x3F), c32 = _mm_set1_epi8(32);
  const __m512i wi = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                                        15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
  const __m512i wiA2 = _mm512_add_epi16(wi, _mm512_set1_epi16(4)), wiB = _mm512_add_epi16(wi, _mm512_set1_epi16(8)),
                wiB2 = _mm512_add_epi16(wi, _mm512_set1_epi16(12));
  const __m512i tlo = _mm512_load_si512(ksig_lo), thi = _mm512_load_si512(ksig_hi);
  const float *dxs = (const float *)(xq + L->off_d);
  __m512 accb[16];
  int nacc = 0;
  int64_t rbase = r0;
  for (int64_t r = r0; r + 1 < r1; r += 2) {
  const uint8_t *rowA = kw_row(W, r);
  const int64_t dr = (r - r0) * rb;
  pf_ptr fa = {fa0.p + dr, fa0.kc}, na = {na0.p + dr, na0.kc};
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int64_t k = 0; k < nsb; k++) {
    if (k == fa.kc) fa.p += rb;
    if (k == na.kc) na.p += rb;
#pragma GCC unroll 3
    for (int i = 0; i < 3; i++) {
      _mm_prefetch(fa.p + 64 * i, _MM_HINT_T1);
      _mm_prefetch(fa.p + rb + 64 * i, _MM_HINT_T1);
      _mm_prefetch(na.p + 64 * i, _MM_HINT_T0);
      _mm_prefetch(na.p + rb + 64 * i, _MM_HINT_T0);
    }
    fa.p += B, na.p += B;
    const uint8_t *bA = rowA + k * B, *bB = bA + rb;
    int64_t hb;
    memcpy(&hb, bB, 8);
    const __m128i h = _mm_insert_epi64(_mm_loadl_epi64((const __m128i *)bA), hb, 1);
    const __m128i lo = _mm_multishift_epi64_epi8(ctl_lo, h), hi = _mm_multishift_epi64_epi8(ctl_hi, h);
    /* (lo & 0x0F) | (hi & 0xF0), then the 6 bits, minus 32 */
    const __m128i ls = _mm_sub_epi8(_mm_and_si128(_mm_ternarylogic_epi64(lo, hi, c0f, 0xE4), c3f), c32);
    const __m512i L16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(ls));
    const __m256 S8 = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(dxs[k]));
    const __m512 SvA = _mm512_broadcastss_ps(_mm256_castps256_ps128(S8));
    const __m512 SvB = _mm512_permutexvar_ps(_mm512_set1_epi32(4), _mm512_castps256_ps512(S8));
    const __m512i svA0 = _mm512_permutexvar_epi16(wi, L16), svA2 = _mm512_permutexvar_epi16(wiA2, L16);
    const __m512i svB0 = _mm512_permutexvar_epi16(wiB, L16), svB2 = _mm512_permutexvar_epi16(wiB2, L16);
    __m512i wA[4], wB[4];
    {
      const __m512i q0 = _mm512_loadu_si512(bA + 8), q1 = _mm512_loadu_si512(bA + 72);
      wA[0] = _mm512_permutexvar_epi8(q0, tlo), wA[1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q0, 2), thi);
      wA[2] = _mm512_permutexvar_epi8(q1, tlo), wA[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q1, 2), thi);
    }
    {
      const __m512i q0 = _mm512_loadu_si512(bB + 8), q1 = _mm512_loadu_si512(bB + 72);
      wB[0] = _mm512_permutexvar_epi8(q0, tlo), wB[1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q0, 2), thi);
      wB[2] = _mm512_permutexvar_epi8(q1, tlo), wB[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q1, 2), thi);
    }
    const int8_t *x = (const int8_t *)xq + 256 * k;
    __m512i PA[4], PB[4];
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
      const __m512i xv = _mm512_loadu_si512(x + 64 * s), ax = _mm512_abs_epi8(xv);
      const __mmask64 m = _mm512_movepi8_mask(xv);
      PA[s] = _mm512_maddubs_epi16(ax, _mm512_mask_sub_epi8(wA[s], m, _mm512_setzero_si512(), wA[s]));
      PB[s] = _mm512_maddubs_epi16(ax, _mm512_mask_sub_epi8(wB[s], m, _mm512_setzero_si512(), wB[s]));
    }
    const __m512i LA = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_madd_epi16(PA[0], svA0), PA[1], svA0), PA[2], svA2), PA[3], svA2);
    const __m512i LB = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_madd_epi16(PB[0], svB0), PB[1], svB0), PB[2], svB2), PB[3], svB2);
    acc0 = lanes_add(acc0, LA, SvA);
    acc1 = lanes_add(acc1, LB, SvB);
  }
  /* reduce16 of 8 pairs at once (tred16); a last incomplete batch pair by pair */
  accb[nacc++] = acc0;
  accb[nacc++] = acc1;
  if (nacc == 16) {
    float t[16];
    _mm512_storeu_ps(t, tred16(accb));
    for (int L = 0; L < 16; L++) Y[rbase + 4 * (L % 4) + L / 4] = t[L];
    nacc = 0;
    rbase = r + 2;
  }
  }
  for (int i = 0; i < nacc; i += 2) red2(accb[i], accb[i + 1], _mm512_setzero_ps(), &Y[rbase + i], &Y[rbase + i + 1]);
}

/* ================= quantized path: MLX 4-bit / 8-bit ================= */

/* n (<= 16) scale or bias values of sb_type as floats, the rest 0 */
static inline __m512 sb_load(uint32_t sbt, const uint8_t *p, int n) {
  __mmask16 m = (__mmask16)((1u << n) - 1);
  if (sbt == FLOE_TYPE_F32) return _mm512_maskz_loadu_ps(m, p);
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  if (sbt == FLOE_TYPE_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* y0 = red16(a0) + red16(b0), y1 = red16(a1) + red16(b1) (the MLX model's two reductions of
 * two rows) side by side: the same adds on the same lane positions as four red16, ~14 uops instead
 * of ~30. */
static inline void red4(__m512 a0, __m512 b0, __m512 a1, __m512 b1, float *y0, float *y1) {
  /* a[i] = v[i] + v[i+8]: [a(a0) | a(a1)], [a(b0) | a(b1)] */
  const __m512 A = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 Bv = _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(b0, b1, _MM_SHUFFLE(3, 2, 3, 2)));
  /* b[i] = a[i] + a[i+4]: [a0 | a1 | b0 | b1] */
  const __m512 B = _mm512_add_ps(_mm512_shuffle_f32x4(A, Bv, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(A, Bv, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 C = _mm512_add_ps(B, _mm512_permute_ps(B, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 D = _mm512_add_ps(C, _mm512_permute_ps(C, _MM_SHUFFLE(1, 1, 1, 1)));
  const __m256 Y = _mm256_add_ps(_mm512_castps512_ps256(D), _mm512_extractf32x8_ps(D, 1));
  *y0 = _mm256_cvtss_f32(Y);
  *y1 = _mm_cvtss_f32(_mm256_extractf128_ps(Y, 1));
}

/* One step (chunk) of mlx_pair for both rows; full = 0: the row's last, partial chunk. */
static inline __attribute__((always_inline)) void mlx_step(const int BITS, const int NB, const int full, const floe_mat *W,
                                                           const kact_layout *L, const uint8_t *const rowp[2], int64_t c,
                                                           __m512i cw, int lg, __m512 S16[2][2], const uint8_t *xq, size_t xs,
                                                           __m512 acc[2][2]) {
  const int ST = BITS == 4 ? 128 : 64, LW = ST / 16;
  const int64_t rem = W->cols - c;
  const __m512i gidx = _mm512_srli_epi32(cw, (unsigned)lg);
  __m512i LO[2], HI[2];
#pragma GCC unroll 2
  for (int rr = 0; rr < 2; rr++) {
    const uint8_t *cb = rowp[rr] + c * BITS / 8;
    pf_row(rowp[rr], c * BITS / 8, W->row_bytes, 2, 1, 1);
    const __m512i q = full ? _mm512_loadu_si512(cb) : _mm512_maskz_loadu_epi8((__mmask64)((1ull << (rem * BITS / 8)) - 1), cb);
    LO[rr] = BITS == 4 ? _mm512_and_si512(q, _mm512_set1_epi8(15)) : q;
    HI[rr] = BITS == 4 ? hi_nib(q) : q;
  }
  const __mmask16 lm = full ? 0xFFFF : (__mmask16)((1u << (rem / LW)) - 1);
  const uint64_t st = (uint64_t)c / (uint64_t)ST;
#pragma GCC unroll 2
  for (int b = 0; b < NB; b++) {
    const uint8_t *xb = xq + b * xs;
    const int8_t *x = (const int8_t *)xb + c;
    const __m512i nc = _mm512_loadu_si512((const int32_t *)(xb + L->off_c) + st * 16);
    const __m512i x0 = _mm512_loadu_si512(x);
#pragma GCC unroll 2
    for (int rr = 0; rr < 2; rr++) {
      __m512i Lv = _mm512_dpbusd_epi32(nc, LO[rr], x0);
      if (BITS == 4) Lv = _mm512_dpbusd_epi32(Lv, HI[rr], _mm512_loadu_si512(x + 64));
      const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(Lv), _mm512_permutexvar_ps(gidx, S16[rr][b]));
      acc[rr][b] = full ? _mm512_add_ps(acc[rr][b], p) : _mm512_mask_add_ps(acc[rr][b], lm, acc[rr][b], p);
    }
  }
}

/* MLX row pairs (nb <= 2), the scale type a compile-time constant. Per window of 16 groups (16g
 * values, a whole number of steps) each row loads its 16 scales once and forms S16[g] =
 * scale_g * d_g (the same product the model's S[i] = scale * dlane takes, lane by lane) and its
 * bias terms; a step then only permutes S16 to its lanes (one vpermps), instead of loading,
 * converting and expanding the scales and multiplying by dlane per step and row. Per step and row:
 * and, gf2p8affine, 2 vpdpbusd, vpermps, cvt, mul, add = 8 uops, ~4 cycles per 64 code bytes. */
static inline __attribute__((always_inline)) void mlx_pair(const int BITS, const int NB, const uint32_t SBT,
                                                           const floe_mat *W, const kact_layout *L, int64_t r,
                                                           const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  const int g = W->mlx.group, lg = __builtin_ctz((unsigned)g);
  const size_t sbe = SBT == FLOE_TYPE_F32 ? 4 : 2;
  const int64_t ng = L->nblk;
  const int ST = BITS == 4 ? 128 : 64, LW = ST / 16;
  const __m512i lanev = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(LW));
  __m512 acc[2][2], bacc[2][2];
  const uint8_t *rowp[2], *sclp[2], *biap[2];
  for (int rr = 0; rr < 2; rr++) {
    rowp[rr] = kw_row(W, r + rr);
    sclp[rr] = (const uint8_t *)W->scales + (size_t)(r + rr) * W->sb_row_bytes;
    biap[rr] = (const uint8_t *)W->biases + (size_t)(r + rr) * W->sb_row_bytes;
    for (int b = 0; b < NB; b++) acc[rr][b] = bacc[rr][b] = _mm512_setzero_ps();
  }
  for (int64_t w0 = 0; w0 < ng; w0 += 16) {
    const int cnt = ng - w0 < 16 ? (int)(ng - w0) : 16;
    const __mmask16 gm = (__mmask16)((1u << cnt) - 1);
    __m512 S16[2][2];
#pragma GCC unroll 2
    for (int rr = 0; rr < 2; rr++) {
      const __m512 sw = sb_load(SBT, sclp[rr] + (size_t)w0 * sbe, cnt);
      /* bias_g + o*scale_g, as the model: bacc[g mod 16] += (bias + o*scale) * s_g, groups in order */
      const __m512 bv = _mm512_add_ps(sb_load(SBT, biap[rr] + (size_t)w0 * sbe, cnt), _mm512_mul_ps(_mm512_set1_ps((float)(1 << (BITS - 1))), sw));
#pragma GCC unroll 2
      for (int b = 0; b < NB; b++) {
        const uint8_t *xb = xq + b * xs;
        S16[rr][b] = _mm512_mul_ps(sw, _mm512_maskz_loadu_ps(gm, (const float *)(xb + L->off_d) + w0));
        const __m512 p = _mm512_mul_ps(bv, _mm512_maskz_loadu_ps(gm, (const float *)(xb + L->off_s) + w0));
        bacc[rr][b] = _mm512_mask_add_ps(bacc[rr][b], gm, bacc[rr][b], p);
      }
    }
    const int64_t c1 = (w0 + cnt) << lg; /* end of the window's values (<= n) */
    __m512i cw = lanev;                  /* value offset of each lane within the window */
    int64_t c = w0 << lg;
    /* whole steps, then at most one partial step (the row's last) with masked lanes */
    for (; c + ST <= c1; c += ST, cw = _mm512_add_epi32(cw, _mm512_set1_epi32(ST)))
      mlx_step(BITS, NB, 1, W, L, rowp, c, cw, lg, S16, xq, xs, acc);
    if (c < c1) mlx_step(BITS, NB, 0, W, L, rowp, c, cw, lg, S16, xq, xs, acc);
  }
  for (int b = 0; b < NB; b++) red4(acc[0][b], bacc[0][b], acc[1][b], bacc[1][b], &Y[b * ldy + r], &Y[b * ldy + r + 1]);
}

static inline __attribute__((always_inline)) void mlx_rows(const int BITS, const int NB, const int RR,
                                                           const floe_mat *W, const kact_layout *L, int64_t r,
                                                           const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  if (RR == 2) {
    switch (W->mlx.sb_type) {
      case FLOE_TYPE_F32: mlx_pair(BITS, NB, FLOE_TYPE_F32, W, L, r, xq, xs, Y, ldy); return;
      case FLOE_TYPE_F16: mlx_pair(BITS, NB, FLOE_TYPE_F16, W, L, r, xq, xs, Y, ldy); return;
      default: mlx_pair(BITS, NB, FLOE_TYPE_BF16, W, L, r, xq, xs, Y, ldy); return;
    }
  }
  const quant_mlx_fmt *f = &W->mlx;
  const int g = f->group;
  const uint32_t sbt = f->sb_type;
  const size_t sbe = sbt == FLOE_TYPE_F32 ? 4 : 2;
  const int64_t n = W->cols;
  const int ST = BITS == 4 ? 128 : 64, LW = ST / 16;
  const int ngs = ST / g > 0 ? ST / g : 1; /* groups per step */
  const int lg = __builtin_ctz((unsigned)g);
  /* lane -> group within the step */
  __m512i gidx = _mm512_srli_epi32(_mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                       _mm512_set1_epi32(LW)),
                                   __builtin_ctz((unsigned)g));
  const __m512i m4 = _mm512_set1_epi8(15);
  __m512 acc[2][NBG];
  for (int rr = 0; rr < RR; rr++)
    for (int b = 0; b < NB; b++) acc[rr][b] = _mm512_setzero_ps();
  const uint8_t *rowp[2], *sclp[2];
  for (int rr = 0; rr < RR; rr++) {
    rowp[rr] = kw_row(W, r + rr);
    sclp[rr] = (const uint8_t *)W->scales + (size_t)(r + rr) * W->sb_row_bytes;
  }
  for (int64_t c = 0; c < n; c += ST) {
    const int64_t rem = n - c;
    const int full = rem >= ST;
    const int nlanes = full ? 16 : (int)(rem / LW);
    /* g is a power of two (quant_mlx_fmt_valid): shifts, not a 64-bit division per chunk */
    const int64_t g0 = c >> lg;
    const int ng = full ? ngs : (int)((rem + g - 1) >> lg);
    __m512i LO[2], HI[2];
    __m512 SWL[2];
#pragma GCC unroll 2
    for (int rr = 0; rr < RR; rr++) {
    const uint8_t *scl = sclp[rr];
    const uint8_t *cb = rowp[rr] + c * BITS / 8;
    pf_row(rowp[rr], c * BITS / 8, W->row_bytes, RR, 1, 1);
    __m512i lo, hi = _mm512_setzero_si512();
    if (BITS == 4) {
      __m512i q = full ? _mm512_loadu_si512(cb) : _mm512_maskz_loadu_epi8((__mmask64)((1ull << (rem / 2)) - 1), cb);
      lo = _mm512_and_si512(q, m4);
      hi = hi_nib(q);
    } else {
      lo = full ? _mm512_loadu_si512(cb) : _mm512_maskz_loadu_epi8((__mmask64)((1ull << rem) - 1), cb);
    }
    /* weight scales expanded to the lanes once; each row multiplies by its dlane vector */
    SWL[rr] = _mm512_permutexvar_ps(gidx, sb_load(sbt, scl + (size_t)g0 * sbe, ng));
    LO[rr] = lo, HI[rr] = hi;
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 2
    for (int rr = 0; rr < RR; rr++) {
      const __m512i lo = LO[rr], hi = HI[rr];
      const __m512 swl = SWL[rr];
      const uint8_t *xb = xq + b * xs;
      const int8_t *x = (const int8_t *)xb + c;
      const int32_t *nc = (const int32_t *)(xb + L->off_c) + c / ST * 16;
      __m512i Lv = _mm512_dpbusd_epi32(_mm512_loadu_si512(nc), lo, _mm512_loadu_si512(x));
      if (BITS == 4) Lv = _mm512_dpbusd_epi32(Lv, hi, _mm512_loadu_si512(x + 64));
      __m512 S = _mm512_mul_ps(swl, _mm512_loadu_ps((const float *)(xb + L->off_e) + c / ST * 16));
      __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(Lv), S);
      acc[rr][b] = full ? _mm512_add_ps(acc[rr][b], p) : _mm512_mask_add_ps(acc[rr][b], (__mmask16)((1u << nlanes) - 1), acc[rr][b], p);
    }
  }
  (void)ngs;
  for (int rr = 0; rr < RR; rr++)
  for (int b = 0; b < NB; b++) {
    const uint8_t *scl = (const uint8_t *)W->scales + (size_t)(r + rr) * W->sb_row_bytes;
    const uint8_t *bia = (const uint8_t *)W->biases + (size_t)(r + rr) * W->sb_row_bytes;
    const uint8_t *xb = xq + b * xs;
    const float *sx = (const float *)(xb + L->off_s);
    __m512 bacc = _mm512_setzero_ps();
    for (int64_t k = 0; k < L->nblk; k += 16) {
      int cnt = L->nblk - k < 16 ? (int)(L->nblk - k) : 16;
      __mmask16 m = (__mmask16)((1u << cnt) - 1);
      __m512 bv = _mm512_add_ps(sb_load(sbt, bia + (size_t)k * sbe, cnt),
                                _mm512_mul_ps(_mm512_set1_ps((float)(1 << (BITS - 1))), sb_load(sbt, scl + (size_t)k * sbe, cnt)));
      __m512 p = _mm512_mul_ps(bv, _mm512_maskz_loadu_ps(m, sx + k));
      bacc = _mm512_mask_add_ps(bacc, m, bacc, p);
    }
    Y[b * ldy + r + rr] = red16(acc[rr][b]) + red16(bacc);
  }
}

#define mlx_row(T, NB, W, L, r, xq, xs, Y, ldy) mlx_rows(T, NB, 1, W, L, r, xq, xs, Y, ldy)

/* ================= dispatch over types and row groups ================= */

/* Small batches (nb <= 2) take weight rows in pairs: two independent dependency chains
 * interleaved, shared activation loads (each (row, activation row) pair keeps its own sequence, so
 * results are unchanged). */
/* For each weight row, the activation rows in groups of up to NBG sharing one decode; NB is a
 * compile-time constant in each instantiation so the accumulators stay in registers. */
#define DEF_RUN(name, rowfn, T)                                                                    \
  static void name(const floe_mat *W, const kact_layout *L, int nb, const uint8_t *xq, size_t xs, \
                   float *Y, int64_t ldy, int64_t r0, int64_t r1) {                                 \
    if (nb <= 2)                                                                                   \
      for (; r0 + 1 < r1; r0 += 2) {                                                               \
        if (nb == 1) rowfn##s(T, 1, 2, W, L, r0, xq, xs, Y, ldy);                                  \
        else rowfn##s(T, 2, 2, W, L, r0, xq, xs, Y, ldy);                                           \
      }                                                                                             \
    for (int64_t r = r0; r < r1; r++)                                                              \
      for (int b0 = 0; b0 < nb; b0 += NBG) {                                                       \
        const uint8_t *x = xq + (size_t)b0 * xs;                                                    \
        float *y = Y + b0 * ldy;                                                                    \
        switch (nb - b0) {                                                                          \
          case 1: rowfn(T, 1, W, L, r, x, xs, y, ldy); break;                                       \
          case 2: rowfn(T, 2, W, L, r, x, xs, y, ldy); break;                                       \
          case 3: rowfn(T, 3, W, L, r, x, xs, y, ldy); break;                                       \
          case 4: rowfn(T, 4, W, L, r, x, xs, y, ldy); break;                                       \
          case 5: rowfn(T, 5, W, L, r, x, xs, y, ldy); break;                                       \
          case 6: rowfn(T, 6, W, L, r, x, xs, y, ldy); break;                                       \
          case 7: rowfn(T, 7, W, L, r, x, xs, y, ldy); break;                                       \
          default: rowfn(T, 8, W, L, r, x, xs, y, ldy); break;                                      \
        }                                                                                           \
      }                                                                                             \
  }

/* One activation row: row pairs by pairs_fn, the rest (nb > 1, an odd last row) by rows_fn. */
#define DEF_RUN_PAIRS(name, pairs_fn, rows_fn)                                                    \
  static void name(const floe_mat *W, const kact_layout *L, int nb, const uint8_t *xq, size_t xs, \
                   float *Y, int64_t ldy, int64_t r0, int64_t r1) {                                 \
    if (nb == 1) {                                                                                  \
      pairs_fn(W, L, r0, r1, xq, Y);                                                                \
      r0 += (r1 - r0) & ~(int64_t)1;                                                                \
    }                                                                                               \
    rows_fn(W, L, nb, xq, xs, Y, ldy, r0, r1);                                                      \
  }

/* Q8_0 with nb >= 2 activation rows: weight row pairs by q8_multi, NBG activation rows at a time;
 * an odd last weight row (and nb = 1's, after q8_pairs: run_q8_0) by a32_rows' dispatch. */
DEF_RUN(run_q8_0_a32, a32_row, FLOE_TYPE_Q8_0)
static void run_q8_0_rows(const floe_mat *W, const kact_layout *L, int nb, const uint8_t *xq, size_t xs, float *Y,
                          int64_t ldy, int64_t r0, int64_t r1) {
  if (nb >= 2)
    for (; r0 + 1 < r1; r0 += 2)
      for (int b0 = 0; b0 < nb; b0 += NBG) {
        const uint8_t *x = xq + (size_t)b0 * xs;
        float *y = Y + b0 * ldy;
        switch (nb - b0) {
          case 1: a32_rows(FLOE_TYPE_Q8_0, 1, 2, W, L, r0, x, xs, y, ldy); break;
          case 2: q8_multi(2, W, L, r0, x, xs, y, ldy); break;
          case 3: q8_multi(3, W, L, r0, x, xs, y, ldy); break;
          case 4: q8_multi(4, W, L, r0, x, xs, y, ldy); break;
          case 5: q8_multi(5, W, L, r0, x, xs, y, ldy); break;
          case 6: q8_multi(6, W, L, r0, x, xs, y, ldy); break;
          case 7: q8_multi(7, W, L, r0, x, xs, y, ldy); break;
          default: q8_multi(8, W, L, r0, x, xs, y, ldy); break;
        }
      }
  run_q8_0_a32(W, L, nb, xq, xs, Y, ldy, r0, r1);
}

DEF_RUN_PAIRS(run_q8_0, q8_pairs, run_q8_0_rows)
DEF_RUN(run_q4_0, a32_row, FLOE_TYPE_Q4_0)
DEF_RUN(run_iq4_nl, a32_row, FLOE_TYPE_IQ4_NL)
DEF_RUN(run_mxfp4, a32_row, FLOE_TYPE_MXFP4)
DEF_RUN_K4(run_q4_k, FLOE_TYPE_Q4_K)
DEF_RUN_K4(run_q5_k, FLOE_TYPE_Q5_K)
DEF_RUN(run_q6_k, a256_row, FLOE_TYPE_Q6_K)
DEF_RUN(run_iq4_xs_rows, a256_row, FLOE_TYPE_IQ4_XS)
DEF_RUN_PAIRS(run_iq4_xs, iq4xs_pairs, run_iq4_xs_rows)
DEF_RUN(run_mlx4, mlx_row, 4)
DEF_RUN(run_mlx8, mlx_row, 8)

KERN_DEF_MM_Q(kern_mm_q_avx512)

