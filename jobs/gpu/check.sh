#!/usr/bin/env bash
# jobs/gpu/check.sh LOGDIR — the one device check of the CUDA backend, on a machine with one GPU.
#
# Builds (CUDA architectures 90 unless CUDA_ARCHS says otherwise), runs the GPU kernel tests
# (tests/test_cuda.cpp: CUDA against the CPU kernels), times single-GPU training steps at gpt2 and
# gpt2-medium in fp32 and in bf16 (--precision bf16), runs two ranks sharing the machine through
# the MPI path, and prints a table last.
# The full log goes to LOGDIR/check.log, each run's output and HDF5 file beside it. Exits non-zero
# when a build, a test or a run failed. Budget: about 8 minutes on an H200. See jobs/gpu/README.md.
#
# Environment: BUILD (build directory, default build), CUDA_ARCHS (default 90), JOBS (build
# parallelism, default nproc), PEAK_FP32_GFLOPS / PEAK_TF32_GFLOPS / PEAK_BF16_GFLOPS (per-GPU
# dense peaks for MFU; defaults are the H100/H200 SXM figures: 67 TFLOP/s fp32 on CUDA cores,
# 494.7 TFLOP/s TF32, 989.4 TFLOP/s BF16),
# SHARED_BACKEND (backend of the 2-rank run, default cuda: see below), RUN_TIMEOUT (s per run, 150).
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 LOGDIR" >&2
  exit 2
fi
LOGDIR=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "$0: cannot create $1" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
exec > >(tee -a "$LOGDIR/check.log") 2>&1

BUILD=${BUILD:-build}
CUDA_ARCHS=${CUDA_ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
PEAK_FP32=${PEAK_FP32_GFLOPS:-67000}
PEAK_TF32=${PEAK_TF32_GFLOPS:-494700}
PEAK_BF16=${PEAK_BF16_GFLOPS:-989400}
SHARED_BACKEND=${SHARED_BACKEND:-cuda}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T0=$(date +%s)
FAILED=0
ROWS=()  # "name|ranks|ms/step|tokens/s|MFU|note"

say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

say "jobs/gpu/check.sh in $ROOT, log in $LOGDIR"
git -C "$ROOT" log -1 --format='revision %h %s' 2>/dev/null || true
nvidia-smi || echo "nvidia-smi: not available"
nvcc --version | tail -2 || true

# ---- build ----------------------------------------------------------------------------------
say "configure + build ($BUILD, CUDA architectures $CUDA_ARCHS, -j$JOBS)"
if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DNTPBENCH_BENCH=OFF >"$LOGDIR/configure.log" 2>&1; then
  tail -30 "$LOGDIR/configure.log"; say "FAIL: configure"; exit 1
fi
grep "CUDA backend" "$LOGDIR/configure.log"
if ! cmake --build "$BUILD" -j "$JOBS" --target ntpbench test_cuda >"$LOGDIR/build.log" 2>&1; then
  tail -40 "$LOGDIR/build.log"; say "FAIL: build"; exit 1
fi
say "built"

# ---- GPU tests ------------------------------------------------------------------------------
say "GPU kernel tests ($BUILD/tests/test_cuda)"
timeout 300 "$BUILD/tests/test_cuda" --gtest_output="xml:$LOGDIR/test_cuda.xml" >"$LOGDIR/test_cuda.log" 2>&1
TEST_RC=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? from .* ran|Failure|seed=|rel_err|Which is" "$LOGDIR/test_cuda.log" | head -40
TESTS_PASSED=$(grep -c "^\[       OK \]" "$LOGDIR/test_cuda.log")
TESTS_FAILED=$(grep -c "^\[  FAILED  \] Cuda[A-Za-z0-9]*\..*(" "$LOGDIR/test_cuda.log")
TESTS_SKIPPED=$(grep -c "^\[  SKIPPED \] Cuda[A-Za-z0-9]*\..*(" "$LOGDIR/test_cuda.log")
if [ "$TEST_RC" -ne 0 ] || [ "$TESTS_SKIPPED" -ne 0 ] || [ "$TESTS_PASSED" -eq 0 ]; then
  FAILED=1
  say "FAIL: GPU tests (rc $TEST_RC; a skip here means the GPU was not usable)"
fi

# ---- timed runs -----------------------------------------------------------------------------
# run NAME RANKS PEAK [ENV=VAL ...] -- NTPBENCH-FLAGS...  (RANKS > 1 launches with mpirun)
run() {
  local name=$1 ranks=$2 peak=$3
  shift 3
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local out="$LOGDIR/$name.out" h5="$LOGDIR/$name.h5"
  local cmd=("$BUILD/ntpbench" "$@" --peak-gflops "$peak" --no-final-checkpoint --overwrite --out "$h5")
  if [ "$ranks" -gt 1 ]; then cmd=(mpirun --oversubscribe -np "$ranks" "${cmd[@]}"); fi
  say "run $name: ${envs[*]} ${cmd[*]}"
  env "${envs[@]}" timeout "$RUN_TIMEOUT" "${cmd[@]}" >"$out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then grep -E "^(ntpbench:|step|done:)" "$out" | tail -14; else tail -15 "$out"; fi
  # Mean over steps 2.. (step 1 pays for cuBLAS heuristics and first-touch allocations).
  local stats
  stats=$(awk -F'|' '/^step/ { split($1, s, /[ \/]+/); if (s[2] + 0 < 2) next;
                         ms += $4 + 0; tok += $5 + 0; gsub(/[^0-9.]/, "", $6); mfu += $6; n++ }
                   END { if (n) printf "%.1f|%.0f|%.1f%%", ms / n, tok / n, mfu / n; else print "-|-|-" }' "$out")
  local note="ok"
  if [ $rc -ne 0 ]; then
    note="FAIL rc=$rc"
    [ $rc -eq 124 ] && note="FAIL timeout ${RUN_TIMEOUT}s"
    FAILED=1
  fi
  ROWS+=("$name|$ranks|$stats|${NOTE:-}$note")
}

STEPS=10
GPT2=(--backend cuda --seq 1024 --micro-batch 4 --steps "$STEPS")
BF16_NOTE="bf16 GEMMs (fp32 master weights + AdamW), MFU vs BF16 peak; "
run gpt2-fp32 1 "$PEAK_FP32" -- --preset gpt2 "${GPT2[@]}"
NOTE="TF32 GEMMs, MFU vs TF32 peak; " run gpt2-tf32 1 "$PEAK_TF32" NTPBENCH_TF32=1 -- --preset gpt2 "${GPT2[@]}"
NOTE="$BF16_NOTE" run gpt2-bf16 1 "$PEAK_BF16" -- --preset gpt2 "${GPT2[@]}" --precision bf16
run gpt2-medium-fp32 1 "$PEAK_FP32" -- --preset gpt2-medium "${GPT2[@]}"
NOTE="$BF16_NOTE" run gpt2-medium-bf16 1 "$PEAK_BF16" -- --preset gpt2-medium "${GPT2[@]}" --precision bf16

# bf16 against fp32 end to end: both runs start from the same weights on the same data, so step
# 1's loss (its forward pass, before any update) differs only by the GEMMs' rounding and must
# agree within 2e-2 relative, as the kernel tests do. The last step's losses are for reference.
LOSSES=()
loss_at() {  # loss_at FILE STEP: the loss FILE's line for STEP printed, or "-"
  [ -r "$1" ] || { echo -; return; }
  awk -F'|' -v want="$2" '/^step/ { split($1, s, /[ \/]+/); if (s[2] + 0 == want) { split($2, l, " "); v = l[2] } }
                          END { print (v == "" ? "-" : v) }' "$1"
}
compare_losses() {  # compare_losses FP32-RUN BF16-RUN
  local a b verdict last_a last_b
  a=$(loss_at "$LOGDIR/$1.out" 1)
  b=$(loss_at "$LOGDIR/$2.out" 1)
  verdict=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a == "-" || b == "-" || a + 0 == 0) { print "FAIL: no loss"; exit }
                                            d = (b - a) / a; if (d < 0) d = -d
                                            printf "%.1e relative, %s", d, d <= 2e-2 ? "ok" : "FAIL" }')
  [[ $verdict == *FAIL* ]] && FAILED=1
  last_a=$(loss_at "$LOGDIR/$1.out" "$STEPS")
  last_b=$(loss_at "$LOGDIR/$2.out" "$STEPS")
  LOSSES+=("$2 vs $1: step 1 loss $b vs $a ($verdict); step $STEPS loss $last_b vs $last_a")
}
compare_losses gpt2-fp32 gpt2-bf16
compare_losses gpt2-medium-fp32 gpt2-medium-bf16

# Two ranks sharing the GPU through the MPI path: --allow-gpu-sharing makes the TP group and the
# sync slots MPI communicators that stage device buffers through host memory (src/comm_staged),
# since NCCL refuses two ranks on one GPU. SHARED_BACKEND=cpu runs the same shape on the CPU.
if [ "$SHARED_BACKEND" = cuda ]; then
  NOTE="2 ranks share GPU 0 via MPI + host staging; " run shared-tp2-cuda 2 "$PEAK_FP32" -- \
    --preset gpt2 --backend cuda --allow-gpu-sharing --tp 2 --seq 1024 --micro-batch 4 --steps 5
else
  NOTE="CPU backend; " run shared-tp2-cpu 2 0 OMP_NUM_THREADS=$(( $(nproc) / 2 )) -- \
    --preset small --backend cpu --tp 2 --micro-batch 4 --steps 5 --threads $(( $(nproc) / 2 ))
fi

# ---- table ----------------------------------------------------------------------------------
say "done in $(( $(date +%s) - T0 ))s; full log $LOGDIR/check.log"
echo
echo "GPU tests: $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skipped (rc $TEST_RC)"
for l in "${LOSSES[@]}"; do echo "$l"; done
printf '%-18s %5s %9s %10s %7s  %s\n' run ranks ms/step tokens/s MFU note
for r in "${ROWS[@]}"; do
  IFS='|' read -r name ranks ms tok mfu note <<<"$r"
  printf '%-18s %5s %9s %10s %7s  %s\n' "$name" "$ranks" "$ms" "$tok" "$mfu" "$note"
done
exit $FAILED
