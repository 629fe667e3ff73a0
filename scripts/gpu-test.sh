#!/usr/bin/env bash
# Run THERE (the GPU machine): builds floe with the CUDA backend and runs the GPU steps.
#
#   D=/path/to/.debs bash scripts/gpu-test.sh [SECTION ...]
#
# Sections, run in the order given (default: build test bench-mm):
#   build     unpack the .debs (scripts/gpu-deps.sh made them) into $DEPS, configure with
#             -DFLOE_CUDA=ON -DFLOE_CUDA_ARCHS=$ARCHS, build everything with -j$JOBS (BUILD_TARGETS:
#             only those targets)
#   test      ctest -L cuda --output-on-failure (the CUDA tests; each compares with the CPU)
#   test-all  the whole ctest suite (CPU tests too)
#   bench-mm  bench_cuda_mm (copy bandwidth, then GB/s and us per launch of each mm kernel)
#   synth35   floe synth: the Qwen3.5-35B-A3B shape, Q4_K, all 40 layers, at $SYNTH (~18 GiB)
#   test-synth  test_cuda_model with FLOE_TEST_SYNTH=$SYNTH (decode vs prefill greedy tokens)
#   depth35   35B decode at DEPTHS_LONG (default 32768), with each run's wall time (the depth is
#             prefilled first: wall - load_s - n_gen / decode_tok_s ~ the prefill)
#   attn35    prefill attention: bench_cuda_ops' attention lines (a 512-row chunk at depth 0 / 32K /
#             128K with the row-group kernel and with k_attn), the 35B prefill at 512 with each
#             (FLOE_CUDA_ATTN_ROWS=0 / default), decode at depth 0
#   bench80   floe synth + bench of the Qwen3-Next-80B-A3B shape, Q4_K (removes the 35B file first)
#   verify35  bench_verify --device cuda on $SYNTH: defaults, FLOE_CUDA_FEW=0, the MoE grouped from 2 rows
#   multi35   bench_multi --device cuda (1/2/4/8 sessions) on the 8-layer 35B cut, FLOE_CUDA_MULTI=0 / 1
#   tier      test_cuda_tier on tiny synth models and $SYNTH (tiered experts == resident, bit for bit)
#   tier35    the 35B shape with --gpu-mem $TIER_MEM: decode, cost model vs copies only vs CPU only;
#             then streamed from the file too (--mem-budget with --gpu-mem, $TIER_STREAM)
#   tier80    the 80B shape (removes the 35B file) with --gpu-mem $TIER80_MEM
#   stream80  the 80B streamed (--mem-budget + --gpu-mem): read-ahead by the router vs the previous token
#   gridsync  bench/bench_cuda_grid.cu: grid barriers and phased reads in one cooperative launch
#   attnpipe  one decode attention launch at several KV, the pipelined tile loop vs three phases a tile
#   vram35    vram_used_bytes and the tier cost model's rates, resident and with --gpu-mem
#   tiergraph tiered decode as recorded graph segments vs eager steps (FLOE_CUDA_TIER_GRAPH=0), alternated
#   tier397   the Qwen3.5-397B-A17B shape cut to L397 layers (default 12, ~44 GB: the disk holds
#             no more beside the build; removes the 35B and 80B files) with --gpu-mem $TIER397_MEM
#   abp35     prefill of the 35B shape (ABPN tokens, default 4096) per setting of ABP35, ABR rounds
#   build-base  build floe_cli from the source snapshot .ab-base (scripts/ab-base.sh REV made it
#             here; carry .ab-base) into $BUILD_BASE, with the same dependencies
#   abb35     this tree against the base build: 35B decode (-p 0 -n 128) and prefill (ABPN tokens),
#             ABR rounds alternated, the base first in odd rounds
#   dm        the default model's decode, plain and --mtp 3, per setting of DM_AB
#   firstrun  a process's first prefill 512 / decode 128 (kernel loading, graph recording), FR_AB settings
#   ncuv      ncu --set full on the 4-row verify's k_gdn_stepn / k_attn_tc and the decode's k_gdn_step1
#             (NCUV_MODEL: the model, default the 4-layer 35B cut; NCUV_KERNELS: the verify's kernels)
#   ncuvsrc   the same with source counters: each SASS line's stall samples into $OUT
#   splitk    35B decode of SK_N tokens at each context of SK_CTX (the attention's split-K parts)
#   ncuk4w    ncu sections (speed of light, warp states, occupancy, memory) of a GDN layer's decode matmuls
#   ncu35     ncu --set full on one launch of each hot decode kernel (NCU_KERNELS), 4-layer shape
#   kernels35p  per-kernel ncu times of a KP_N-token prefill (default 512), 4-layer shape
#   kernels80l  kernels35l for the 80B-A3B shape cut to 4 layers
#   nsys35    nsys trace of the 4-layer cut's decode graph (each node's start / end: the in-graph step)
#   trace35   the in-graph cost of each kernel of the decode step (launch trace), 4-layer cut and 35B
#   traceab   the trace's step and inter-step gap (35B and its 4-layer cut) per setting of TRACE_AB
#   tracev    the same for a speculative step (bench_verify --only KIND, TV_KINDS default "v4 f3"):
#             the 4-layer cut (labelled), the 35B ($SYNTH) and the default model
#   kernelsdm  per-launch ncu times of the default model: 2 decode steps, then a VROWS-row chunk
#   attns     one 128K decode attention launch at each split of ATTN_SPLITS (bench_cuda_ops)
#   kernels35v  the same for a chunk of VROWS (4) tokens: the few-row path of a verify / small batch
#   ncu35p    ncu --set full (speed of light, occupancy, warp stalls) on one launch of each prefill
#             kernel in NCU_KP (regexes of MANGLED names; default: the MoE gate+up and down of
#             k_k4mma2, Q4_K) in a 512-token chunk of the 4-layer shape
#   mma35     the tensor-core prefill kernels' A/B (FLOE_CUDA_MMA2 in $MMA2, default "2 0 1"):
#             35B prefill 4096 and 512 with each, then ncu's time of each k_k4mma* launch of one
#             512-token chunk of the 4-layer cut with each
#   bench35   floe bench --device cuda on $SYNTH: decode at depth 0 and $DEPTHS, prefill 512 / 4096,
#             A/B lines for decode (AB) and prefill (ABP), the per-phase profile
#   bench-mm-warp, bench-mm-lanes   bench_cuda_mm with one implementation of the 16-lane
#             types forced (FLOE_CUDA_MM_Q16=warp / lanes; the default picks by shape)
# To add a step: write a function sec_NAME (its output goes to $LOG/NAME.log, its exit status
# decides ok / FAIL) and name it on the command line. Logs go to $OUT when set (the device
# tool brings $OUT back), else build-gpu/logs. A summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
D=${D:-$ROOT/.debs}
DEPS=${DEPS:-/tmp/deps}
BUILD=${BUILD:-$ROOT/build-gpu}
ARCHS=${ARCHS:-90-real}
JOBS=${JOBS:-16}
LOG=${OUT:-$BUILD/logs}
mkdir -p "$LOG"
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin

sec_build() {
  if [ ! -d "$DEPS/usr/include/cjson" ]; then
    ls "$D"/*.deb >/dev/null || { echo "no .deb files in $D (run scripts/gpu-deps.sh here first)"; return 1; }
    for d in "$D"/*.deb; do dpkg -x "$d" "$DEPS" || return 1; done
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
  nvcc --version | tail -1
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFLOE_CUDA=ON -DFLOE_CUDA_ARCHS="$ARCHS" \
    -DCMAKE_PREFIX_PATH="$DEPS/usr" || return 1
  cmake --build "$BUILD" -j"$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
}
sec_test() { ctest --test-dir "$BUILD" -L cuda --output-on-failure --timeout 900; }
sec_test-all() { ctest --test-dir "$BUILD" -j"$JOBS" --output-on-failure; }
sec_bench-mm() { "$BUILD/bin/bench_cuda_mm" "${BENCH_REPS:-25}"; }
SYNTH=${SYNTH:-/tmp/floe-q35-q4k.gguf}
# cut4: the 35B-A3B shape cut to 4 layers (3 GatedDeltaNet + 1 attention) at /tmp/floe-q35-4l.gguf
# (the sections' $small), made when missing
cut4() {
  [ -f /tmp/floe-q35-4l.gguf ] ||
    "$BUILD/bin/floe" synth --preset qwen35moe-35b-a3b --layers 4 --type q4_K -o /tmp/floe-q35-4l.gguf >/dev/null
}
sec_synth35() {
  [ -f "$SYNTH" ] || timeout 600 "$BUILD/bin/floe" synth --preset qwen35moe-35b-a3b --type q4_K -o "$SYNTH" || return 1
  ls -l "$SYNTH"
}
# test-synth: the 35B synth's decode vs prefill, and tiny synth models of the three architectures
# in Q4_K / Q5_K (rows of one superblock, the shared expert as a routed slot) GPU vs CPU, with the
# default kernels and with the other choices (FLOE_CUDA_K4W=0 FLOE_CUDA_GDN2=0 FLOE_CUDA_ROUTE_FUSED=1 ... FLOE_CUDA_CONV_PAR=0
# FLOE_CUDA_ACT2=0 FLOE_CUDA_ROUTE_WARP=0 FLOE_CUDA_ATTN_SPREAD=0 FLOE_CUDA_PF=0 FLOE_CUDA_PLAIN_TILE=0 FLOE_CUDA_K4S=0 FLOE_CUDA_ATTN_ROWS=0
# FLOE_CUDA_GDN_FUSED=0 FLOE_CUDA_GDN_COLS=0; the last two are moot beside FLOE_CUDA_GDN2=0, which takes the
# one-thread recurrence anyway: test_cuda_ops runs them)
# tiny_models: writes the tiny synth models (three architectures x Q4_K / Q5_K) once, prints their paths
tiny_models() {
  local p t f
  for p in tiny-qwen35moe tiny-qwen3next tiny-qwen3moe; do
    for t in q4_K q5_K; do
      f=/tmp/floe-$p-$t.gguf
      [ -f "$f" ] || "$BUILD/bin/floe" synth --preset "$p" --type "$t" -o "$f" >/dev/null || return 1
      echo "$f"
    done
  done
}
sec_test-synth() {
  local tiny rc=0
  tiny=$(tiny_models | tr '\n' ' ') || return 1
  FLOE_TEST_SYNTH=$SYNTH FLOE_TEST_SYNTH_CPU="$tiny" FLOE_FIXTURES=$ROOT/tests/fixtures timeout 600 \
    "$BUILD/bin/test_cuda_model" || rc=1
  echo "== the other kernel choices: FLOE_CUDA_K4W=0 FLOE_CUDA_GDN2=0 FLOE_CUDA_ROUTE_FUSED=1 FLOE_CUDA_ACT2=0 FLOE_CUDA_ROUTE_WARP=0 FLOE_CUDA_ATTN_SPREAD=0 FLOE_CUDA_MMA=0 FLOE_CUDA_CONV_PAR=0 FLOE_CUDA_PF=0 FLOE_CUDA_PLAIN_TILE=0 FLOE_CUDA_K4S=0 FLOE_CUDA_GDN_FUSED=0 FLOE_CUDA_GDN_COLS=0 FLOE_CUDA_ATTN_ROWS=0 FLOE_CUDA_DOWN_QX=1 FLOE_CUDA_ATTN_HB=2 FLOE_CUDA_JOIN_GDN=0 FLOE_CUDA_GDN_DEC_COLS=1 FLOE_CUDA_FEW_MMA=0 FLOE_CUDA_PICK_DIRECT=0 FLOE_CUDA_SPEC_DIRECT=0"
  FLOE_CUDA_K4W=0 FLOE_CUDA_GDN2=0 FLOE_CUDA_ROUTE_FUSED=1 FLOE_CUDA_ACT2=0 FLOE_CUDA_ROUTE_WARP=0 \
    FLOE_CUDA_ATTN_SPREAD=0 FLOE_CUDA_MMA=0 FLOE_CUDA_CONV_PAR=0 FLOE_CUDA_PF=0 FLOE_CUDA_PLAIN_TILE=0 \
    FLOE_CUDA_K4S=0 FLOE_CUDA_GDN_FUSED=0 FLOE_CUDA_GDN_COLS=0 FLOE_CUDA_ATTN_ROWS=0 FLOE_CUDA_DOWN_QX=1 \
    FLOE_CUDA_ATTN_HB=2 FLOE_CUDA_JOIN_GDN=0 FLOE_CUDA_GDN_DEC_COLS=1 FLOE_CUDA_FEW_MMA=0 FLOE_CUDA_PICK_DIRECT=0 FLOE_CUDA_SPEC_DIRECT=0 FLOE_CUDA_PLAIN1N=0 FLOE_CUDA_GDN_STEPN_NT=0 FLOE_TEST_SYNTH=$SYNTH FLOE_TEST_SYNTH_CPU="$tiny" \
    FLOE_FIXTURES=$ROOT/tests/fixtures timeout 600 "$BUILD/bin/test_cuda_model" || rc=1
  return $rc
}
# kernels35: every kernel of a few decode steps of the 35B-A3B shape cut to 4 layers, timed by ncu
# (no graph, so each launch is its own kernel; the per-kernel summary is the step's breakdown)
sec_kernels35() {
  local small=/tmp/floe-q35-4l.gguf
  cut4 || return 1
  FLOE_CUDA_NO_GRAPH=1 timeout 400 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$BUILD/bin/floe" bench -m "$small" --device cuda -p 0 -n 4 -r 1 -c 64
}
# kernels35p: the same for one 512-token prefill chunk (the prefill kernels' breakdown)
sec_kernels35p() {
  local small=/tmp/floe-q35-4l.gguf
  cut4 || return 1
  timeout 400 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$BUILD/bin/floe" bench -m "$small" --device cuda -p "${KP_N:-512}" -n 0 -r 1 -c "$((2 * ${KP_N:-512}))"
}
# kernels35v: the same for a chunk of VROWS (default 4) tokens: the few-row path a speculative
# verify or a small batch takes (compare each kernel with kernels35's one-row step)
sec_kernels35v() {
  local small=/tmp/floe-q35-4l.gguf
  cut4 || return 1
  FLOE_CUDA_NO_GRAPH=1 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$BUILD/bin/floe" bench -m "$small" --device cuda -p "${VROWS:-4}" -n 0 -r 1 -c 64
}
sec_ncu35p() {
  local small=/tmp/floe-q35-4l.gguf k
  cut4 || return 1
  for k in ${NCU_KP:-k_k4mma2ILi12ELi1 k_k4mma2ILi12ELi2}; do
    timeout 200 ncu --set full --kernel-name-base mangled -k "regex:$k" -c 1 \
      "$BUILD/bin/floe" bench -m "$small" --device cuda -p 512 -n 0 -r 1 -c 1024 2>&1 | grep -v "^==PROF==" || return 1
  done
}
# ncu35: ncu's full report (speed of light, memory, occupancy, warp stalls) for one launch of each
# hot decode kernel of the 35B-A3B shape cut to 4 layers (NCU_KERNELS: a regex of kernel names)
sec_ncu35() {
  local small=/tmp/floe-q35-4l.gguf
  cut4 || return 1
  local k
  for k in ${NCU_KERNELS:-k_k4 k_plain1 k_gdn_recur k_act k_moe_route k_moe_combine}; do
    FLOE_CUDA_NO_GRAPH=1 timeout 120 ncu --set full -k "regex:^$k\b|::$k" --launch-skip 8 -c 2 \
      "$BUILD/bin/floe" bench -m "$small" --device cuda -p 0 -n 3 -r 1 -c 64 2>&1 | grep -v "^==PROF==" || return 1
  done
}
# ncuv: ncu --set full on the verify's kernels (NCUV_KERNELS: name regexes, default the kept-chunk
# GatedDeltaNet step, its one-row decode form and the tensor-core attention) in one 4-row verify
# of the 4-layer 35B cut (bench_verify --only v4, no graph; a one-row decode for k_gdn_step1),
# the lines that say where a launch's time goes (duration, throughput, occupancy, warp states)
ncuv_prog() { # K: "SKIP PROGRAM ARGS..." for ncu: k_gdn_step1 in a one-row decode, else a 4-row verify, of
  # NCUV_MODEL (default the 4-layer 35B cut; e.g. $ROOT/models/default.gguf for dk 64)
  local m=${NCUV_MODEL:-/tmp/floe-q35-4l.gguf}
  if [ "$1" = k_gdn_step1 ]; then echo "4 $BUILD/bin/floe bench -m $m --device cuda -p 0 -n 3 -r 1 -c 64"
  else echo "2 $BUILD/bin/bench_verify -m $m --device cuda -r 1 --only v4"; fi
}
sec_ncuv() {
  local k
  cut4 || return 1
  for k in ${NCUV_KERNELS:-k_gdn_stepn k_attn_tc} k_gdn_step1; do
    set -- $(ncuv_prog "$k")
    local skip=$1
    shift
    echo "== $k$([ "$k" = k_gdn_step1 ] && echo ', one-row decode' || echo ', 4-row verify')"
    FLOE_CUDA_NO_GRAPH=1 timeout 150 ncu --set full -k "regex:$k" --launch-skip "$skip" -c 1 "$@" 2>&1 |
      grep -v "^==PROF==" |
      grep -E "^  [a-zA-Z_]+.*\(|Duration|Throughput|Registers Per|Shared Memory Config|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Block Limit|Grid Size|Block Size|One or More|stall|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Executed Ipc" |
      cut -c1-160 | head -70
  done
}
# ncuvsrc: where the verify's kernels stall, line by line: ncu --set full with source counters on
# one launch of each of NCUV_KERNELS in a 4-row verify of the 4-layer 35B cut (and k_gdn_step1 in
# a one-row decode); into $OUT: NAME_details.txt (every section, stall reasons included) and
# NAME_sass.csv (the SASS with each line's warp-stall samples)
sec_ncuvsrc() {
  local k out=${OUT:-/tmp}
  cut4 || return 1
  for k in ${NCUV_KERNELS:-k_gdn_stepn k_attn_tc} k_gdn_step1; do
    set -- $(ncuv_prog "$k")
    local skip=$1
    shift
    rm -f /tmp/ncuv.ncu-rep
    FLOE_CUDA_NO_GRAPH=1 timeout 150 ncu --set full --import-source yes -k "regex:$k" --launch-skip "$skip" -c 1 \
      -o /tmp/ncuv -f "$@" >/dev/null 2>&1 || return 1
    ncu -i /tmp/ncuv.ncu-rep --page details --print-details all >"$out/${k}_details.txt" 2>&1
    ncu -i /tmp/ncuv.ncu-rep --page source --csv --print-source sass >"$out/${k}_sass.csv" 2>&1
    echo "== $k: $(wc -l <"$out/${k}_sass.csv") SASS lines"
    grep -iE "stall|Duration" "$out/${k}_details.txt" | head -30 | cut -c1-150
  done
}
# dm: the default model's decode with and without MTP (floe bench --mtp 3: both in one run) for
# each setting of DM_AB (VAR=VALUE words, several joined by commas; "-" the defaults), DM_R rounds
# alternated
sec_dm() {
  local r v rc=0
  for r in $(seq 1 "${DM_R:-2}"); do
    for v in ${DM_AB:--}; do
      printf 'round %s %-28s ' "$r" "$v"
      env $([ "$v" = - ] || echo "${v//,/ }") timeout 120 "$BUILD/bin/floe" bench -m "$ROOT/models/default.gguf" \
        --device cuda -p 0 -n 256 -r 3 --mtp 3 --json 2>/dev/null | grep '"mtp"' |
        grep -oE '"(decode_tok_s|decode_tok_s_mtp0|speedup|tokens_per_step)":[0-9.]*' | tr '\n' ' ' || rc=1
      echo
    done
  done
  return $rc
}
# ncuk4w: ncu's speed of light, warp states, occupancy and memory sections on the decode matmuls of
# one GatedDeltaNet layer of the 4-layer cut (no graph): qkv|z (grid 1320), ssm_out (512), the MoE
# gate+up (128 x 9); NCUK_SKIP launches of k_k4w skipped first (13: one decode step)
sec_ncuk4w() {
  local small=/tmp/floe-q35-4l.gguf
  cut4 || return 1
  FLOE_CUDA_NO_GRAPH=1 timeout 200 ncu --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section SchedulerStats -k regex:k_k4w --launch-skip "${NCUK_SKIP:-13}" -c 3 \
    "$BUILD/bin/floe" bench -m "$small" --device cuda -p 0 -n 3 -r 1 -c 64 2>&1 | grep -v "^==PROF==" |
    grep -E "^ +[A-Za-z].* {2,}[a-zA-Z%/]* +[0-9.,]+$|k_k4w|Section:" | cut -c1-110
}
sec_mma35() {
  local v rc=0 small=/tmp/floe-q35-4l.gguf
  for v in ${MMA2:-2 0 1}; do
    echo "== prefill 4096, FLOE_CUDA_MMA2=$v"
    FLOE_CUDA_MMA2=$v timeout 120 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 4096 -n 0 -r 2 --json || rc=1
  done
  for v in ${MMA2:-2 0 1}; do
    echo "== prefill 512, FLOE_CUDA_MMA2=$v"
    FLOE_CUDA_MMA2=$v timeout 120 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 512 -n 0 -r 3 --json || rc=1
  done
  cut4 || return 1
  for v in $(echo ${MMA2:-2 0 1} | tr ' ' '\n' | sort -u); do
    echo "== ncu k_k4mma*, FLOE_CUDA_MMA2=$v"
    FLOE_CUDA_MMA2=$v timeout 120 ncu --clock-control none -k regex:k_k4mma --metrics gpu__time_duration.sum \
      --print-summary per-kernel "$BUILD/bin/floe" bench -m "$small" --device cuda -p 512 -n 0 -r 1 -c 1024 2>&1 |
      grep -E "k_k4mma|gpu__time_duration|^==" || rc=1
  done
  return $rc
}
# bench35: the 35B-A3B decode / prefill figures (DEPTHS: extra decode depths, default 8192)
sec_bench35() {
  local rc=0
  timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 512 -n 128 -r 3 --json || rc=1
  for d in ${DEPTHS:-8192}; do
    timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n 128 -d "$d" -r 2 --json || rc=1
  done
  timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 4096 -n 0 -r 2 --json || rc=1
  # A/B of kernel choices, same binary (AB: a list of VAR=0/1 settings; measured earlier: FLOE_CUDA_NO_PDL=1,
  # FLOE_CUDA_PLAIN1=0)
  local v
  for v in ${AB:-FLOE_CUDA_K4W=0 FLOE_CUDA_GDN2=0 FLOE_CUDA_ROUTE_FUSED=1}; do
    echo "== A/B: $v"
    env "$v" timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n 128 -r 2 --json || rc=1
  done
  # A/B of prefill kernel choices (ABP: a list of VAR=0/1 settings, e.g. FLOE_CUDA_MMA=0)
  for v in ${ABP:-}; do
    echo "== A/B prefill: $v"
    env "$v" timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 512 -n 0 -r 2 --json || rc=1
  done
  # where the time goes, per phase, in prefill and decode: every block synchronized and timed (no
  # graph); then no graph alone
  FLOE_CUDA_PROFILE=1 timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 512 -n 32 -r 1 --json || rc=1
  FLOE_CUDA_NO_GRAPH=1 timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n 64 -r 1 --json || rc=1
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader || true
  return $rc
}
# bench80: the Qwen3-Next-80B-A3B shape, Q4_K, resident (~46 GB): decode (the 35B file is removed
# first: the GPU machine's disk holds one of the two)
SYNTH80=${SYNTH80:-/tmp/floe-q3n80-q4k.gguf}
sec_bench80() {
  rm -f "$SYNTH"
  [ -f "$SYNTH80" ] || timeout 600 "$BUILD/bin/floe" synth --preset qwen3next-80b-a3b --type q4_K -o "$SYNTH80" || return 1
  timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH80" --device cuda -p 512 -n 128 -r 2 --json
}
# run_traced T CMD...: CMD with a limit of T seconds. A test with the watchdog (FLOE_TEST_WATCHDOG,
# set to T - 8) prints its main thread's stack itself, named here from the ELF symbol tables
# (scripts/elf_sym.py); past T, the thread states and cuda-gdb's stacks, then KILL
run_traced() {
  local t=$1 pid i rc tmp
  shift
  tmp=$(mktemp)
  FLOE_TEST_WATCHDOG=$((t > 16 ? t - 8 : t)) "$@" >"$tmp" 2>&1 &
  pid=$!
  for ((i = 0; i < t; i++)); do
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if kill -0 $pid 2>/dev/null; then
    echo "== still running after $t s: thread states and stacks"
    for d in /proc/$pid/task/*; do echo "$(basename $d) $(cut -d' ' -f3 $d/stat) $(cat $d/wchan 2>/dev/null)"; done
    # (cuda-gdb outlived a plain timeout once: KILL)
    timeout -s KILL 20 /usr/local/cuda/bin/cuda-gdb -p $pid -batch -ex "thread apply all bt 12" 2>&1 |
      grep -E "^#|^Thread" | head -120
    kill -9 $pid
  fi
  wait $pid
  rc=$?
  cat "$tmp"
  if grep -q '^bt: ' "$tmp"; then
    echo "== the watchdog's stack, named"
    python3 "$ROOT/scripts/elf_sym.py" <"$tmp"
  fi
  rm -f "$tmp"
  return $rc
}
# tier: test_cuda_tier (experts tiered VRAM <- host, --gpu-mem: bit for bit the resident run) on
# the tiny synth models of test-synth and the 35B synth ($SYNTH, after synth35)
sec_tier() {
  local tiny f v
  tiny=$(tiny_models | tr '\n' ' ') || return 1
  local rc=0
  for f in ${TIER_TINY:-$tiny}; do # one process a model: a hang shows which
    (export FLOE_TEST_SYNTH_CPU="$f" FLOE_FIXTURES=$ROOT/tests/fixtures FLOE_TIER_DEBUG=${FLOE_TIER_DEBUG:-6}
     run_traced ${TIER_TIMEOUT:-120} "$BUILD/bin/test_cuda_tier") && continue
    [ $rc = 1 ] && continue # the first failure only
    rc=1
    for v in FLOE_TIER_PIN=0 FLOE_CUDA_MMA=0 FLOE_CUDA_NO_PDL=1; do # which part fails
      echo "== again with $v"
      (export "$v" FLOE_TEST_SYNTH_CPU="$f" FLOE_FIXTURES=$ROOT/tests/fixtures
       run_traced ${TIER_TIMEOUT:-120} "$BUILD/bin/test_cuda_tier")
    done
  done
  [ -f "$SYNTH" ] && { (export FLOE_TEST_SYNTH=$SYNTH FLOE_FIXTURES=$ROOT/tests/fixtures
    run_traced ${TIER_TIMEOUT35:-300} "$BUILD/bin/test_cuda_tier") || rc=1; }
  return $rc
}
# tier35: the 35B shape with --gpu-mem (TIER_MEM, default "8G 4G"): decode with the cost model's
# choice, then misses only copied (FLOE_TIER_CPU=0) and only on the CPU where it can (=1)
sec_tier35() {
  local g v rc=0
  for g in ${TIER_MEM:-8G 4G}; do
    for v in FLOE_TIER_CPU=-1 FLOE_TIER_CPU=0 FLOE_TIER_CPU=1 FLOE_TIER_PF=0; do
      echo "== --gpu-mem $g, $v"
      (export "$v"; run_traced ${TIER_BENCH_TIMEOUT:-300} "$BUILD/bin/floe" bench -m "$SYNTH" --gpu-mem "$g" -p 512 \
        -n 64 -r 1 --json) || rc=1
    done
  done
  # the experts streamed from the file too (TIER_STREAM: RAM:VRAM budgets; --direct: past the page cache)
  for g in ${TIER_STREAM:-6G:4G}; do
    echo "== --mem-budget ${g%%:*} --gpu-mem ${g##*:} --direct"
    run_traced ${TIER_BENCH_TIMEOUT:-300} "$BUILD/bin/floe" bench -m "$SYNTH" --mem-budget "${g%%:*}" --gpu-mem "${g##*:}" \
      --direct -p 0 -n 64 -r 1 --json || rc=1
  done
  return $rc
}
# tiergraph: tiered one-token steps as recorded graph segments (the default) against eager steps
# (FLOE_CUDA_TIER_GRAPH=0), TG_R rounds alternated, on TG_MODEL (default $SYNTH; "80": the 80B shape,
# synthesized first, the 35B file removed) with --gpu-mem TG_MEM (default 8G), -p 0 -n TG_N (128),
# each with the cost model and with every miss on the CPU (FLOE_TIER_CPU=1: the split segments)
sec_tiergraph() {
  local r v c m=${TG_MODEL:-$SYNTH} rc=0
  if [ "$m" = 80 ]; then
    rm -f "$SYNTH"
    m=$SYNTH80
    [ -f "$m" ] || timeout 600 "$BUILD/bin/floe" synth --preset qwen3next-80b-a3b --type q4_K -o "$m" || return 1
  fi
  for c in ${TG_CPU:--1 1}; do
    for r in $(seq 1 "${TG_R:-2}"); do
      for v in 1 0; do
        echo "== round $r: --gpu-mem ${TG_MEM:-8G}, FLOE_TIER_CPU=$c, FLOE_CUDA_TIER_GRAPH=$v"
        FLOE_TIER_CPU=$c FLOE_CUDA_TIER_GRAPH=$v timeout 300 "$BUILD/bin/floe" bench -m "$m" --gpu-mem "${TG_MEM:-8G}" \
          -p 0 -n "${TG_N:-128}" -r 1 --json || rc=1
      done
    done
  done
  return $rc
}
# tier80: the Qwen3-Next-80B-A3B shape, Q4_K (~46 GB, the 35B file removed first) with --gpu-mem
# (TIER80_MEM, default "16G 8G"), the cost model's choice and FLOE_TIER_CPU=0 at the first size
sec_tier80() {
  local g rc=0 first=1
  rm -f "$SYNTH"
  [ -f "$SYNTH80" ] || timeout 600 "$BUILD/bin/floe" synth --preset qwen3next-80b-a3b --type q4_K -o "$SYNTH80" || return 1
  for g in ${TIER80_MEM:-16G 8G}; do
    echo "== --gpu-mem $g"
    timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH80" --gpu-mem "$g" -p 512 -n 64 -r 1 --json || rc=1
    if [ $first = 1 ]; then
      echo "== --gpu-mem $g, FLOE_TIER_CPU=0"
      FLOE_TIER_CPU=0 timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH80" --gpu-mem "$g" -p 0 -n 64 -r 1 --json || rc=1
      echo "== --gpu-mem $g, FLOE_TIER_PF=0"
      FLOE_TIER_PF=0 timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH80" --gpu-mem "$g" -p 0 -n 64 -r 1 --json || rc=1
      first=0
    fi
  done
  for g in ${TIER80_STREAM:-16G:8G}; do # streamed from the file too (RAM:VRAM budgets)
    echo "== --mem-budget ${g%%:*} --gpu-mem ${g##*:} --direct"
    timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH80" --mem-budget "${g%%:*}" --gpu-mem "${g##*:}" --direct -p 0 -n 64 \
      -r 1 --json || rc=1
  done
  return $rc
}
# stream80: the 80B shape streamed from the file (--mem-budget / --gpu-mem as in TIER80_STREAM,
# --direct), the expert cache's read-ahead by the router's prediction (FLOE_TIER_READAHEAD=1)
# against the default (the previous token's), STREAM_R rounds alternated
sec_stream80() {
  local r p g=${TIER80_STREAM:-16G:8G} rc=0
  rm -f "$SYNTH"
  [ -f "$SYNTH80" ] || timeout 600 "$BUILD/bin/floe" synth --preset qwen3next-80b-a3b --type q4_K -o "$SYNTH80" || return 1
  for r in $(seq 1 "${STREAM_R:-1}"); do
    for p in 1 0; do
      echo "== round $r: --mem-budget ${g%%:*} --gpu-mem ${g##*:} --direct, FLOE_TIER_READAHEAD=$p"
      FLOE_TIER_READAHEAD=$p timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH80" --mem-budget "${g%%:*}" \
        --gpu-mem "${g##*:}" --direct -p 0 -n "${STREAM_N:-48}" -r 1 --json || rc=1
    done
  done
  return $rc
}
# tier397: the 397B-A17B shape cut to L397 layers, Q4_K, with --gpu-mem (TIER397_MEM, default 32G):
# decode, the per-tier hits and the CPU's share in the JSON's "tier"
SYNTH397=${SYNTH397:-/tmp/floe-q397-q4k.gguf}
sec_tier397() {
  local g rc=0
  rm -f "$SYNTH" "$SYNTH80"
  [ -f "$SYNTH397" ] || timeout 500 "$BUILD/bin/floe" synth --preset qwen35moe-397b-a17b --type q4_K \
    --layers "${L397:-12}" --set n_mtp=0 -o "$SYNTH397" || return 1
  for g in ${TIER397_MEM:-32G}; do
    echo "== --gpu-mem $g"
    timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH397" --gpu-mem "$g" -p 0 -n 64 -r 1 --json || rc=1
  done
  return $rc
}
# verify35: the cost of a speculative verify of 2..5 rows against a decode step on the 35B shape
# (bench_verify --device cuda), with the defaults (the few-row matmuls, the MoE per slot below 16
# rows), the several-row matmuls (FLOE_CUDA_FEW=0) and the MoE grouped by expert from 2 rows
# (FLOE_CUDA_MOE_GROUP_MIN=2); the same bits each
sec_verify35() {
  local v rc=0
  for v in ${VERIFY_AB:-FLOE_CUDA_FEW=1 FLOE_CUDA_FEW=0 FLOE_CUDA_MOE_GROUP_MIN=2}; do
    echo "== $v"
    env "$v" timeout 120 "$BUILD/bin/bench_verify" -m "$SYNTH" --device cuda -r 9 || rc=1
  done
  return $rc
}
# multi35: several sessions decoding together on the GPU (bench_multi --device cuda, 1/2/4/8 streams)
# on the 35B-A3B shape cut to 8 layers (the server benchmark's shape), one after another
# (FLOE_CUDA_MULTI=0), in one pass (=1; "segs" in the output: sessions a pass held), and in one
# pass recorded as a graph (FLOE_CUDA_MULTI_GRAPH=1)
sec_multi35() {
  local small=/tmp/floe-q35-8l.gguf v rc=0
  [ -f "$small" ] || "$BUILD/bin/floe" synth --preset qwen35moe-35b-a3b --layers 8 --type q4_K -o "$small" >/dev/null || return 1
  for v in 0 1 g; do
    echo "== FLOE_CUDA_MULTI=${v/g/1}$([ $v = g ] && echo ' FLOE_CUDA_MULTI_GRAPH=1')"
    FLOE_CUDA_MULTI=${v/g/1} FLOE_CUDA_MULTI_GRAPH=$([ $v = g ] && echo 1 || echo 0) timeout 120 \
      "$BUILD/bin/bench_multi" -m "$small" --device cuda -t 4 -r 6 -s 4 --streams 1,2,4,8 || rc=1
  done
  return $rc
}
# depth35: decode of the 35B shape at long contexts (DEPTHS_LONG, default 32768; the context is
# prefilled first, so 128K costs minutes at today's prefill rate)
sec_depth35() {
  local d rc=0 a
  for d in ${DEPTHS_LONG:-32768}; do
    a=$(date +%s)
    timeout 500 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n 128 -d "$d" -r 1 --json || rc=1
    echo "depth $d: wall $(($(date +%s) - a)) s"
  done
  return $rc
}
sec_attn35() {
  local v rc=0
  timeout 120 "$BUILD/bin/bench_cuda_ops" | grep -E "^device|attn|chunk" || rc=1
  for v in FLOE_CUDA_ATTN_ROWS=8 FLOE_CUDA_ATTN_ROWS=0; do
    echo "== prefill 512, $v"
    env "$v" timeout 120 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 512 -n 0 -r 3 --json || rc=1
  done
  echo "== decode at depth 0"
  timeout 120 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n 128 -r 1 --json || rc=1
  return $rc
}
# ab_rounds SETTINGS KEY BENCH-ARGS...: floe bench on $SYNTH with each setting (VAR=VALUE words,
# several joined by commas; "-" the defaults), ABR rounds (default 2) alternated in order, the
# value of KEY from each run's JSON on one line; ABREPS repetitions a run (default 1: the first
# steps record the CUDA graphs; with 3 the median is of steps that replay them)
ab_rounds() {
  local set=$1 key=$2 r v rc=0
  shift 2
  for r in $(seq 1 "${ABR:-2}"); do
    for v in $set; do
      printf 'round %s %-28s ' "$r" "$v"
      env $([ "$v" = - ] || echo "${v//,/ }") timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda "$@" -r "${ABREPS:-1}" \
        --json 2>/dev/null | grep -o "\"$key\":[0-9.]*" | head -1 || rc=1
    done
  done
  return $rc
}
# build-base / abb35: a whole other revision against this one in the same call (a change that
# cannot be switched off by an environment variable, e.g. a new summation order)
BUILD_BASE=${BUILD_BASE:-$ROOT/build-gpu-base}
sec_build-base() {
  [ -f "$ROOT/.ab-base/CMakeLists.txt" ] || { echo "no .ab-base (run scripts/ab-base.sh REV here, carry .ab-base)"; return 1; }
  cat "$ROOT/.ab-base/REV" 2>/dev/null
  cmake -S "$ROOT/.ab-base" -B "$BUILD_BASE" -DCMAKE_BUILD_TYPE=Release -DFLOE_CUDA=ON -DFLOE_CUDA_ARCHS="$ARCHS" \
    -DCMAKE_PREFIX_PATH="$DEPS/usr" >/dev/null || return 1
  cmake --build "$BUILD_BASE" -j"$JOBS" --target floe_cli
}
sec_abb35() {
  local r b rc=0
  for r in $(seq 1 "${ABR:-2}"); do
    for b in $([ $((r % 2)) = 1 ] && echo "$BUILD_BASE $BUILD" || echo "$BUILD $BUILD_BASE"); do
      printf 'round %s %-5s decode ' "$r" "$([ "$b" = "$BUILD" ] && echo this || echo base)"
      timeout 300 "$b/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n 128 -r 1 --json 2>/dev/null |
        grep -o '"decode_tok_s":[0-9.]*' | head -1 || rc=1
      printf 'round %s %-5s prefill ' "$r" "$([ "$b" = "$BUILD" ] && echo this || echo base)"
      timeout 300 "$b/bin/floe" bench -m "$SYNTH" --device cuda -p "${ABPN:-4096}" -n 0 -r 1 --json 2>/dev/null |
        grep -o '"prefill_tok_s":[0-9.]*' | head -1 || rc=1
    done
  done
  return $rc
}
# firstrun: a process's first prefill and decode (floe bench -r 1: the runs that load the kernels and
# record the CUDA graphs) on $SYNTH and the default model, per setting of FR_AB (default: the
# defaults and CUDA_MODULE_LOADING=EAGER), FR_R rounds alternated: load_s, ttft_ms, prefill and
# decode tok/s; then one -r 3 run (the warm repetitions' medians) for reference
sec_firstrun() {
  local m r v rc=0
  for m in "$SYNTH" "$ROOT/models/default.gguf"; do
    [ -f "$m" ] || continue
    echo "== $(basename "$m")"
    for r in $(seq 1 "${FR_R:-2}"); do
      for v in ${FR_AB:-- CUDA_MODULE_LOADING=EAGER}; do
        printf 'round %s %-28s ' "$r" "$v"
        env $([ "$v" = - ] || echo "${v//,/ }") timeout 300 "$BUILD/bin/floe" bench -m "$m" --device cuda -p 512 -n 128 \
          -r 1 --json 2>/dev/null | grep -oE '"(load_s|ttft_ms|prefill_tok_s|decode_tok_s)":[0-9.]*' | tr '\n' ' ' || rc=1
        echo
      done
    done
    printf 'warm (-r 3)                          '
    timeout 300 "$BUILD/bin/floe" bench -m "$m" --device cuda -p 512 -n 128 -r 3 --json 2>/dev/null |
      grep -oE '"(load_s|ttft_ms|prefill_tok_s|decode_tok_s)":[0-9.]*' | tr '\n' ' ' || rc=1
    echo
  done
  return $rc
}
# splitk: 35B decode of SK_N tokens (default 512) in sessions of each context in SK_CTX (default
# "512 4096 32768"): a context over 1023 positions splits each row's attention into parts
# (n_ctx / 512), so from position 129 a row pays the split-K scratch's round trip; SK_R rounds
sec_splitk() {
  local r c rc=0
  for r in $(seq 1 "${SK_R:-2}"); do
    for c in ${SK_CTX:-512 4096 32768}; do
      printf 'round %s -n %s -c %-6s ' "$r" "${SK_N:-512}" "$c"
      timeout 300 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n "${SK_N:-512}" -c "$c" -r 2 --json \
        2>/dev/null | grep -o '"decode_tok_s":[0-9.]*' | head -1 || rc=1
    done
  done
  return $rc
}
# ab35: decode of the 35B shape at depth ABD (default 0) with each setting of AB35: decode_tok_s
sec_ab35() { ab_rounds "${AB35:--}" decode_tok_s -p 0 -n 128 -d "${ABD:-0}"; }
# abp35: prefill of the 35B shape, ABPN tokens (default 4096), with each setting of ABP35: prefill_tok_s
sec_abp35() { ab_rounds "${ABP35:--}" prefill_tok_s -p "${ABPN:-4096}" -n 0; }
# kernels_l PRESET FILE: every launch of 2 decode steps of PRESET cut to 4 layers (ncu, no graph),
# one row each (name|grid|ns), for a per-launch breakdown of the step
kernels_l() {
  [ -f "$2" ] || "$BUILD/bin/floe" synth --preset "$1" --layers 4 --type q4_K -o "$2" >/dev/null || return 1
  FLOE_CUDA_NO_GRAPH=1 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$BUILD/bin/floe" bench -m "$2" --device cuda -p 0 -n 2 -r 1 -c 64 2>/dev/null | grep -E '^"[0-9]' |
    awk -F'","' '{print substr($5, 1, 60) "|" $9 "|" $NF}' | tr -d '"' | tail -${KL_TAIL:-120}
}
# kernels35l / kernels80l: the 35B-A3B / Qwen3-Next-80B-A3B shapes (3 GDN layers + 1 attention)
sec_kernels35l() { kernels_l qwen35moe-35b-a3b /tmp/floe-q35-4l.gguf; }
sec_kernels80l() { kernels_l qwen3next-80b-a3b /tmp/floe-q3n80-4l.gguf; }
# nsys35: the decode step of the 4-layer 35B cut as the graph runs it (programmatic dependent launch
# on): nsys traces each graph node; the last NS_TAIL kernels' start / end (ns) as CSV, so that each
# kernel's end minus the previous kernel's end (what it adds to the step) can be read off
sec_nsys35() {
  local small=/tmp/floe-q35-4l.gguf n
  n=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  [ -n "$n" ] || { echo "no nsys on this machine"; return 1; }
  cut4 || return 1
  timeout 200 "$n" profile --cuda-graph-trace=node --trace=cuda -o /tmp/nsys35 --force-overwrite true \
    "$BUILD/bin/floe" bench -m "$small" --device cuda -p 0 -n 16 -r 1 -c 64 >/dev/null 2>&1 || return 1
  timeout 200 "$n" stats --report cuda_gpu_trace --format csv -o /tmp/nsys35 /tmp/nsys35.nsys-rep >/dev/null 2>&1
  local f
  f=$(ls /tmp/nsys35*cuda_gpu_trace*.csv 2>/dev/null | head -1)
  [ -n "$f" ] || { echo "no trace csv"; return 1; }
  head -1 "$f"
  tail -n "${NS_TAIL:-140}" "$f"
}
# trace_build TARGET...: a measurement build of its own in $BUILD-trace (-DFLOE_CUDA_TRACE=ON: the
# default build's kernels have no trace code), with the targets given
trace_build() {
  cmake -S "$ROOT" -B "$BUILD-trace" -DCMAKE_BUILD_TYPE=Release -DFLOE_CUDA=ON -DFLOE_CUDA_ARCHS="$ARCHS" \
    -DFLOE_CUDA_TRACE=ON -DCMAKE_PREFIX_PATH="$DEPS/usr" >/dev/null &&
    cmake --build "$BUILD-trace" -j"$JOBS" --target "$@" >/dev/null
}
# trace35: the in-graph cost of each kernel of a decode step (FLOE_CUDA_TRACE, scripts/trace_step.py):
# the 4-layer cut labelled by kernels35l's names, then the whole 35B ($SYNTH when present) by launch
# shape; TRACE_ENV: settings for both runs (e.g. FLOE_CUDA_NO_PDL=1)
sec_trace35() {
  local small=/tmp/floe-q35-4l.gguf rc=0 TB=$BUILD-trace
  trace_build floe_cli test_cuda_ops || return 1
  "$TB/bin/test_cuda_ops" | grep -E "launch trace|trace|passed" | tail -4
  sec_kernels35l >/tmp/names4.txt 2>&1 || rc=1
  rm -f /tmp/trace4.txt /tmp/trace40.txt
  env ${TRACE_ENV:-} FLOE_CUDA_TRACE=/tmp/trace4.txt timeout 120 "$TB/bin/floe" bench -m "$small" --device cuda -p 0 \
    -n 64 -r 1 -c 128 >/dev/null 2>&1 || rc=1
  echo "== 4-layer cut"
  python3 scripts/trace_step.py /tmp/trace4.txt /tmp/names4.txt || rc=1
  if [ -f "$SYNTH" ]; then
    env ${TRACE_ENV:-} FLOE_CUDA_TRACE=/tmp/trace40.txt timeout 200 "$TB/bin/floe" bench -m "$SYNTH" --device cuda \
      -p 0 -n 64 -r 1 -c 128 >/dev/null 2>&1 || rc=1
    echo "== 35B, 40 layers"
    python3 scripts/trace_step.py /tmp/trace40.txt /tmp/names4.txt | sed -n '1p;/^by launch/,$p' || rc=1
  fi
  return $rc
}
# traceab: the launch trace of the 35B decode ($SYNTH, made when missing) and of the 4-layer cut for
# each setting of TRACE_AB (VAR=VALUE words joined by commas; "-" the defaults): the step's body and
# the gap between steps (trace_step.py's first line), then the costs by launch shape
sec_traceab() {
  local small=/tmp/floe-q35-4l.gguf rc=0 TB=$BUILD-trace v m
  trace_build floe_cli || return 1
  [ -f "$SYNTH" ] || sec_synth35 >/dev/null || return 1
  cut4 || return 1
  for m in "$small" "$SYNTH"; do
    for v in ${TRACE_AB:--}; do
      rm -f /tmp/tab.txt
      env $([ "$v" = - ] || echo "${v//,/ }") FLOE_CUDA_TRACE=/tmp/tab.txt timeout 200 "$TB/bin/floe" bench -m "$m" \
        --device cuda -p 0 -n 64 -r 1 -c 128 >/dev/null 2>&1 || rc=1
      echo "== $(basename "$m") $v"
      python3 scripts/trace_step.py /tmp/tab.txt | sed -n "1p;/^by launch/,\$p" | head -${TRACE_LINES:-14} || rc=1
    done
  done
  return $rc
}
# tracev: the in-graph cost of each kernel of one kind of bench_verify step (--only KIND: a verify of
# n rows "vN", the one-pass greedy step with k drafts "fK", "draft", "plain") for each of TV_KINDS,
# on the 4-layer 35B cut and the default model (both labelled by an ncu run of one such step
# without the graph) and the 35B ($SYNTH, when present)
sec_tracev() {
  local small=/tmp/floe-q35-4l.gguf rc=0 TB=$BUILD-trace k m P
  trace_build floe_cli bench_verify || return 1
  cut4 || return 1
  for k in ${TV_KINDS:-v4 f3}; do
    for m in "$small" "$SYNTH" "$ROOT/models/default.gguf"; do
      [ -f "$m" ] || continue
      rm -f /tmp/tv.txt
      env ${TRACE_ENV:-} FLOE_CUDA_TRACE=/tmp/tv.txt timeout 200 "$TB/bin/bench_verify" -m "$m" --device cuda -r 48 \
        --only "$k" || rc=1
      echo "== $k $(basename "$m")"
      if [ "$m" != "$SYNTH" ]; then
        P=$(python3 scripts/trace_step.py /tmp/tv.txt | sed -n 's/^[0-9]* launches, \([0-9]*\) a step.*/\1/p')
        FLOE_CUDA_NO_GRAPH=1 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
          --print-units base "$BUILD/bin/bench_verify" -m "$m" --device cuda -r 1 --only "$k" 2>/dev/null |
          grep -E '^"[0-9]' | awk -F'","' '{print substr($5, 1, 60) "|" $9 "|" $NF}' | tr -d '"' |
          tail -n "${P:-100}" >/tmp/namesv.txt
        python3 scripts/trace_step.py /tmp/tv.txt /tmp/namesv.txt || rc=1
      else
        python3 scripts/trace_step.py /tmp/tv.txt | sed -n '1p;/^by launch/,$p' || rc=1
      fi
    done
  done
  return $rc
}
# kernelsdm: every launch of 2 one-row decode steps, then of one VROWS-row (default 4) chunk, of the
# default model (ncu, no graph; name|grid|us a row): where a speculative verify's rows cost more
# than a decode step
sec_kernelsdm() {
  local m=$ROOT/models/default.gguf
  echo "== decode, 1 row"
  FLOE_CUDA_NO_GRAPH=1 timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$BUILD/bin/floe" bench -m "$m" --device cuda -p 0 -n 2 -r 1 -c 64 2>/dev/null | grep -E '^"[0-9]' |
    awk -F'","' '{print substr($5, 1, 60) "|" $9 "|" $NF}' | tr -d '"' | tail -${KL_TAIL:-150}
  echo "== chunk, ${VROWS:-4} rows"
  FLOE_CUDA_NO_GRAPH=1 timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$BUILD/bin/floe" bench -m "$m" --device cuda -p "${VROWS:-4}" -n 0 -r 1 -c 64 2>/dev/null | grep -E '^"[0-9]' |
    awk -F'","' '{print substr($5, 1, 60) "|" $9 "|" $NF}' | tr -d '"' | tail -${KL_TAIL:-150}
}
# attns: one decode attention launch at KV ATTN_KV (default 131072), 8 heads a block, at each
# split of ATTN_SPLITS (default "128 66"), ATTN_R rounds alternated
sec_attns() {
  local r sp
  for r in $(seq 1 "${ATTN_R:-2}"); do
    for sp in ${ATTN_SPLITS:-128 66}; do
      timeout 60 "$BUILD/bin/bench_cuda_ops" attn "${ATTN_KV:-131072}" "$sp" 8 | grep "^attn" || return 1
    done
  done
}
# attnk: one decode attention launch on random K/V (bench_cuda_ops attn) at KV 8K / 32K / 128K,
# split 128, with k_attn at most 8 / 4 heads a block and with the row-group kernel (rows)
sec_attnk() {
  local kv hb
  for kv in 8192 32768 131072; do
    for hb in 8 4 0; do timeout 60 "$BUILD/bin/bench_cuda_ops" attn "$kv" 128 "$hb" | grep "^attn" || return 1; done
  done
}
# ncuattn: ncu (speed of light, memory, occupancy, scheduler, warp stalls) on one decode attention
# launch at KV NCU_KV (default 131072), split 128, with at most 8 and 4 heads a block
sec_ncuattn() {
  local hb rc=0
  for hb in ${NCU_HB:-8 4}; do
    echo "== hb $hb"
    timeout 120 ncu --clock-control none -k regex:k_attn --launch-skip 5 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats \
      --section LaunchStats "$BUILD/bin/bench_cuda_ops" attn "${NCU_KV:-131072}" 128 "$hb" || rc=1
  done
  return $rc
}
# attnpipe: one decode attention launch (bench_cuda_ops attn KV 66 8) at each KV of PIPE_KV with the
# pipelined tile loop and without (FLOE_CUDA_ATTN_PIPE=1 / 0), PIPE_R rounds alternated
sec_attnpipe() {
  local kv p r rc=0
  for kv in ${PIPE_KV:-1 1024 8192 32768 131072}; do
    for r in $(seq 1 "${PIPE_R:-2}"); do
      for p in 1 0; do
        FLOE_CUDA_ATTN_PIPE=$p timeout 30 "$BUILD/bin/bench_cuda_ops" attn "$kv" 66 8 | grep attn | sed "s/^/pipe $p: /" || rc=1
      done
    done
  done
  return $rc
}
# vram35: the device memory floe holds (vram_used_bytes) and the tier cost model's measured rates,
# resident and with --gpu-mem TIER_MEM (default 8G), a short decode of $SYNTH each
sec_vram35() {
  local rc=0 k='"vram_used_bytes":[0-9]*\|"model_gpu_gbps":[0-9.]*\|"model_pcie_gbps":[0-9.]*\|"decode_tok_s":[0-9.]*'
  echo "== resident"
  timeout 120 "$BUILD/bin/floe" bench -m "$SYNTH" --device cuda -p 0 -n 32 -r 1 --json | grep -o "$k" || rc=1
  echo "== --gpu-mem ${TIER_MEM:-8G}"
  timeout 120 "$BUILD/bin/floe" bench -m "$SYNTH" --gpu-mem "${TIER_MEM:-8G}" -p 0 -n 32 -r 1 --json | grep -o "$k" || rc=1
  return $rc
}
# gridsync: the floor of a persistent decode kernel (bench/bench_cuda_grid.cu): grid barriers and
# 1.87 GB read in P phases of one cooperative launch, against gpu-floor.md's P graph kernels
sec_gridsync() {
  mkdir -p "$BUILD/bin"
  nvcc -O3 -arch=sm_90 "$ROOT/bench/bench_cuda_grid.cu" -o "$BUILD/bin/bench_cuda_grid" || return 1
  timeout 120 "$BUILD/bin/bench_cuda_grid"
}
# attnd: the decode attention lines of bench_cuda_ops (one launch at KV 1 / 8K / 32K / 128K, several splits)
sec_attnd() { timeout 120 "$BUILD/bin/bench_cuda_ops" | grep -E "^device|attn (decode|split)"; }
sec_bench-mm-warp() { FLOE_CUDA_MM_Q16=warp "$BUILD/bin/bench_cuda_mm" "${BENCH_REPS:-25}"; }
sec_bench-mm-lanes() { FLOE_CUDA_MM_Q16=lanes "$BUILD/bin/bench_cuda_mm" "${BENCH_REPS:-25}"; }

sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(build test bench-mm)
summary=()
fail=0
for s in "${sections[@]}"; do
  if ! declare -F "sec_$s" >/dev/null; then
    summary+=("$s: unknown section")
    fail=1
    continue
  fi
  t0=$(date +%s)
  echo "=== $s (log: $LOG/$s.log)"
  "sec_$s" >"$LOG/$s.log" 2>&1
  rc=$?
  t1=$(date +%s)
  case "$s" in bench*) ;; *) tail -n 15 "$LOG/$s.log" ;; esac
  if [ $rc -eq 0 ]; then
    summary+=("$s: ok ($((t1 - t0)) s)")
  else
    summary+=("$s: FAIL rc=$rc ($((t1 - t0)) s)")
    fail=1
    [ "$s" = build ] && break # nothing else can run
  fi
done
[ -f "$LOG/bench-mm.log" ] && { echo "=== bench-mm"; cat "$LOG/bench-mm.log"; }
[ -f "$LOG/bench35.log" ] && { echo "=== bench35"; grep -E '^\{' "$LOG/bench35.log" | cut -c1-600; }
[ -f "$LOG/mma35.log" ] && { echo "=== mma35"; grep -E '^\{|^==|k_k4mma|Average|gpu__time' "$LOG/mma35.log" | cut -c1-300; }
[ -f "$LOG/verify35.log" ] && { echo "=== verify35"; grep -E '^==|verify_cost' "$LOG/verify35.log" |
  sed -E 's/.*("plain_ms":[^,]*).*("verify2_ratio":[^,]*).*("verify3_ratio":[^,]*).*("verify4_ratio":[^,]*).*("verify5_ratio":[^,]*).*("fused_predicted_speedup":[^]]*]).*/\1 \2 \3 \4 \5 \6/'; }
for b in attn35 depth35 multi35; do
  [ -f "$LOG/$b.log" ] && { echo "=== $b"; grep -E '^\{|attn|chunk|wall|==' "$LOG/$b.log" | cut -c1-420; }
done
if [ -f "$LOG/test.log" ]; then
  echo "=== test checks"
  grep -E "^FAIL|passed, [0-9]+ failed|tests passed|tests failed|\*\*\*" "$LOG/test.log" | tail -n 30
fi
for b in bench-mm bench-mm-warp bench-mm-lanes; do
  [ -f "$LOG/$b.log" ] && { echo "=== $b"; cat "$LOG/$b.log"; }
done
for t in test test-all; do
  if [ -f "$LOG/$t.log" ]; then
    echo "=== $t checks"
    grep -E "^FAIL|passed, [0-9]+ failed|tests passed|tests failed|\*\*\*" "$LOG/$t.log" | tail -n 20
  fi
done
echo "=== summary"
for l in "${summary[@]}"; do echo "$l"; done
exit $fail
