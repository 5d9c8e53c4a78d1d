#!/usr/bin/env bash
# jobs/gpu/check.sh LOGDIR — the one device check of the CUDA backend, on a machine with one GPU.
#
# Uses gpu-bundle/ (`make gpu-bundle` on the build machine; it travels with the working tree) when
# it is there, else builds here (CUDA architectures 90 unless CUDA_ARCHS says otherwise). Prints
# the machine's facts first (GPU, glibc against what the bundle needs, where cudart, cuBLAS and
# NCCL were found), then runs the GPU kernel tests (tests/test_cuda.cpp: CUDA against the CPU
# kernels), times single-GPU training steps at gpt2 and gpt2-medium in fp32 and in bf16
# (--precision bf16), runs two ranks sharing the GPU through the MPI path (TP 2, and PP 2 with
# 1F1B), benchmarks the NTP
# gradient sync on the CPU at 4->3 and 8->7 with a core per rank (bench_resilience), and prints a
# table last. Everything goes under LOGDIR: check.log (the whole console), each run's output and
# HDF5 file, the test XML and the benchmarks' JSON. Exits non-zero when a build, a test or a run
# failed. Budget: CHECK_BUDGET seconds (420) in all; a step that would start past it is skipped
# and marked so in the table. See jobs/gpu/README.md.
#
# Environment: BUNDLE (default gpu-bundle), BUILD (build folder without a bundle, default build),
# CUDA_ARCHS (default 90), JOBS (build parallelism, default nproc), PEAK_FP32_GFLOPS /
# PEAK_TF32_GFLOPS / PEAK_BF16_GFLOPS (per-GPU dense peaks for MFU; defaults by the GPU's name:
# H100/H200 SXM 67 / 494.7 / 989.4 TFLOP/s, PCIe and NVL parts their own), SHARED_BACKEND (backend
# of the 2-rank run, default cuda), RUN_TIMEOUT (s per run, 150), CHECK_BUDGET (s, 420).
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 LOGDIR" >&2
  exit 2
fi
LOGDIR=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "$0: cannot create $1" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
exec > >(tee -a "$LOGDIR/check.log") 2>&1

BUNDLE=${BUNDLE:-gpu-bundle}
BUILD=${BUILD:-build}
CUDA_ARCHS=${CUDA_ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
SHARED_BACKEND=${SHARED_BACKEND:-cuda}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
CHECK_BUDGET=${CHECK_BUDGET:-420}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T0=$(date +%s)
FAILED=0
ROWS=()     # "name|ranks|ms/step|tokens/s|MFU|note"
BENCHES=()  # "pair|ranks|exposed ntp/uniform|serial ntp/uniform|exposed ms ntp/uniform|note"

say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( CHECK_BUDGET - ($(date +%s) - T0) )); }
limit() { local l; l=$(left); [ "$l" -lt 1 ] && l=1; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }  # min(ARG, time left)

say "jobs/gpu/check.sh in $ROOT, log in $LOGDIR, budget ${CHECK_BUDGET}s"
git -C "$ROOT" log -1 --format='revision %h %s' 2>/dev/null || true

# ---- the machine ------------------------------------------------------------------------------
say "machine"
echo "host $(hostname), $(uname -srm), $(nproc) CPUs: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1);" \
     "$(lscpu 2>/dev/null | awk -F: '/^Thread\(s\) per core|^Core\(s\) per socket|^Socket\(s\)/ { gsub(/^ +/, "", $2); printf "%s %s; ", $1, $2 }')" \
     "memory $(free -g 2>/dev/null | awk '/^Mem:/ { print $2 }') GiB"
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>/dev/null \
  || echo "nvidia-smi: not available"
nvidia-smi >"$LOGDIR/nvidia-smi.txt" 2>&1 || true
GLIBC_HERE=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
echo "glibc here: ${GLIBC_HERE:-unknown} ($(ldd --version 2>/dev/null | head -1))"

case "$GPU_NAME" in  # dense (no sparsity) peaks, NVIDIA's datasheets
  *PCIe*) P32=51200; PTF=378000; PBF=756000 ;;
  *NVL*)  P32=60000; PTF=417500; PBF=835500 ;;
  *)      P32=67000; PTF=494700; PBF=989400 ;;
esac
PEAK_FP32=${PEAK_FP32_GFLOPS:-$P32}
PEAK_TF32=${PEAK_TF32_GFLOPS:-$PTF}
PEAK_BF16=${PEAK_BF16_GFLOPS:-$PBF}
echo "MFU peaks (GFLOP/s, ${GPU_NAME:-no GPU name}): fp32 $PEAK_FP32, tf32 $PEAK_TF32, bf16 $PEAK_BF16"

# ---- the binaries: the bundle, or a build here --------------------------------------------------
if [ -x "$BUNDLE/bin/ntpbench" ]; then
  BUNDLE=$(cd "$BUNDLE" && pwd)
  say "using the bundle $BUNDLE"
  sed -n '1,/^$/p' "$BUNDLE/MANIFEST.txt"
  NEED=$(sed -n 's/^glibc_needed: GLIBC_//p' "$BUNDLE/MANIFEST.txt")
  if [ -n "$GLIBC_HERE" ] && [ -n "$NEED" ] && [ "$(printf '%s\n%s\n' "$NEED" "$GLIBC_HERE" | sort -V | head -1)" != "$NEED" ]; then
    echo "NOTE: glibc here ($GLIBC_HERE) is older than the bundle's newest need ($NEED): env.sh says what it does about it"
  fi
  . "$BUNDLE/env.sh"
  [ -z "$NTPBENCH_BUNDLE_MISSING" ] || echo "NOTE: not found: $NTPBENCH_BUNDLE_MISSING (the CUDA runs will fail)"
  NTPBENCH=$BUNDLE/bin/ntpbench
  TEST_CUDA=$BUNDLE/bin/test_cuda
  BENCH_RES=$BUNDLE/bin/bench_resilience
  MPIRUN=$BUNDLE/bin/mpirun
else
  say "no bundle at $BUNDLE: configure + build ($BUILD, CUDA architectures $CUDA_ARCHS, -j$JOBS)"
  command -v mpicxx mpirun h5cc nvcc || true
  ldconfig -p | grep -E 'libhdf5|libopenblas|libyaml-cpp|libfmt|libbenchmark' | head || true
  nvcc --version | tail -2 || true
  BENCH_FLAG=ON
  if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DNTPBENCH_BENCH=ON >"$LOGDIR/configure.log" 2>&1; then
    BENCH_FLAG=OFF  # Google Benchmark missing: build without bench_resilience
    if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DNTPBENCH_BENCH=OFF >"$LOGDIR/configure.log" 2>&1; then
      tail -30 "$LOGDIR/configure.log"; say "FAIL: configure"; exit 1
    fi
  fi
  grep "CUDA backend" "$LOGDIR/configure.log"
  targets=(ntpbench test_cuda)
  [ "$BENCH_FLAG" = ON ] && targets+=(bench_resilience)
  if ! cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >"$LOGDIR/build.log" 2>&1; then
    tail -40 "$LOGDIR/build.log"; say "FAIL: build"; exit 1
  fi
  NTPBENCH=$BUILD/ntpbench
  TEST_CUDA=$BUILD/tests/test_cuda
  BENCH_RES=$BUILD/bench/bench_resilience
  MPIRUN=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
  MPIRUN=${MPIRUN:-mpirun}
  say "built"
fi
echo "libraries ntpbench loads:"
ldd "$NTPBENCH" | grep -E 'libcuda|libcudart|libcublas|libnccl|libmpi|libstdc|not found' | sed 's/ (0x.*//'
"$MPIRUN" --version 2>/dev/null | head -1
MPI_ENV=()  # what the ranks need from env.sh, passed on explicitly
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI_ENV+=(-x LD_LIBRARY_PATH)
[ -n "${LD_PRELOAD:-}" ] && MPI_ENV+=(-x LD_PRELOAD)

# ---- GPU tests ------------------------------------------------------------------------------
TESTS_PASSED=0 TESTS_FAILED=0 TESTS_SKIPPED=0 TEST_RC=-
say "GPU kernel tests ($TEST_CUDA)"
timeout "$(limit 240)" "$TEST_CUDA" --gtest_output="xml:$LOGDIR/test_cuda.xml" >"$LOGDIR/test_cuda.log" 2>&1
TEST_RC=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? from .* ran|Failure|seed=|rel_err|Which is" "$LOGDIR/test_cuda.log" | head -40
TESTS_PASSED=$(grep -c "^\[       OK \]" "$LOGDIR/test_cuda.log")
TESTS_FAILED=$(grep -c "^\[  FAILED  \] Cuda[A-Za-z0-9]*\..*(" "$LOGDIR/test_cuda.log")
TESTS_SKIPPED=$(grep -c "^\[  SKIPPED \] Cuda[A-Za-z0-9]*\..*(" "$LOGDIR/test_cuda.log")
if [ "$TEST_RC" -ne 0 ] || [ "$TESTS_SKIPPED" -ne 0 ] || [ "$TESTS_PASSED" -eq 0 ]; then
  FAILED=1
  say "FAIL: GPU tests (rc $TEST_RC; a skip here means the GPU was not usable)"
fi

# ---- the NTP sync on the CPU, one core per rank -------------------------------------------------
# bench NAME RANKS FILTER: bench_resilience's ntp_sync pair under mpirun, one logical CPU per rank
# (bound) where the machine has enough, OMP_NUM_THREADS=1; the figures from its JSON.
bench() {
  local name=$1 ranks=$2 filter=$3 json="$LOGDIR/bench-$1.json" note="" bind
  if [ ! -x "$BENCH_RES" ]; then BENCHES+=("$name|$ranks|-|-|-|not built"); return; fi
  if [ "$(left)" -lt 30 ]; then BENCHES+=("$name|$ranks|-|-|-|SKIPPED: budget"); return; fi
  # A physical core per rank where there are enough (so no two ranks share one core's SMT
  # siblings), else a logical CPU per rank, else oversubscribed.
  local cores
  cores=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)
  if [ "${cores:-0}" -ge "$ranks" ] && [ "$(nproc)" -ge "$ranks" ]; then
    bind=(--map-by core --bind-to core)
  elif [ "$(nproc)" -ge "$ranks" ]; then
    bind=(--map-by hwthread:HWTCPUS --bind-to hwthread); note="a logical CPU per rank ($cores cores); "
  else
    bind=(--oversubscribe --bind-to none); note="oversubscribed: $(nproc) CPUs; "
  fi
  local cmd=("$MPIRUN" "${bind[@]}" -np "$ranks" "${MPI_ENV[@]}" -x OMP_NUM_THREADS=1 "$BENCH_RES"
             "--benchmark_filter=$filter" --benchmark_color=false --benchmark_out_format=json "--benchmark_out=$json")
  say "bench $name: ${cmd[*]}"
  OMP_NUM_THREADS=1 timeout "$(limit 90)" "${cmd[@]}" >"$LOGDIR/bench-$name.out" 2>&1
  local rc=$?
  grep -a -E "^ntp_sync|Error|error" "$LOGDIR/bench-$name.out" | tail -5
  local figs
  figs=$(python3 - "$json" <<'EOF' 2>/dev/null
import json, sys
b = [x for x in json.load(open(sys.argv[1]))["benchmarks"] if x["name"].startswith("ntp_sync/")][0]
if "error_message" in b:
    print("-|-|-|" + b["error_message"]); raise SystemExit
ok = "meets" if b["exposed_ntp/uniform"] <= 1.10 else "misses"
print(f'{b["exposed_ntp/uniform"]:.3f}|{b["ntp/uniform"]:.3f}|{b["exposed_ntp_ms"]:.2f}/{b["exposed_uniform_ms"]:.2f}|'
      f'{ok} the 1.10x target; wrong={b["wrong"]:.0f}')
EOF
)
  if [ $rc -ne 0 ] || [ -z "$figs" ]; then
    FAILED=1
    figs="-|-|-|FAIL rc=$rc"
  fi
  BENCHES+=("$name|$ranks|$figs; $note$(awk -F': ' '/openblas_corename/ { print "BLAS " $2 }' "$LOGDIR/bench-$name.out" | head -1)")
}
bench 4to3 7 '^ntp_sync/small/4->3/'
bench 8to7 15 '^ntp_sync/small/8->7/'

# ---- timed runs -----------------------------------------------------------------------------
# run NAME RANKS PEAK [ENV=VAL ...] -- NTPBENCH-FLAGS...  (RANKS > 1 launches with mpirun)
run() {
  local name=$1 ranks=$2 peak=$3
  shift 3
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if [ "$(left)" -lt 30 ]; then ROWS+=("$name|$ranks|-|-|-|SKIPPED: budget"); FAILED=1; return; fi
  local out="$LOGDIR/$name.out" h5="$LOGDIR/$name.h5"
  local cmd=("$NTPBENCH" "$@" --peak-gflops "$peak" --no-final-checkpoint --overwrite --out "$h5")
  if [ "$ranks" -gt 1 ]; then cmd=("$MPIRUN" --oversubscribe -np "$ranks" "${MPI_ENV[@]}" "${cmd[@]}"); fi
  local tmo
  tmo=$(limit "$RUN_TIMEOUT")
  say "run $name: ${envs[*]} ${cmd[*]}"
  env "${envs[@]}" timeout "$tmo" "${cmd[@]}" >"$out" 2>&1
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
    [ $rc -eq 124 ] && note="FAIL timeout ${tmo}s"
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
# sync slots MPI communicators that stage device buffers through host memory (src/comm/comm_staged),
# since NCCL refuses two ranks on one GPU. SHARED_BACKEND=cpu runs the same shape on the CPU.
if [ "$SHARED_BACKEND" = cuda ]; then
  NOTE="2 ranks share GPU 0 via MPI + host staging; " run shared-tp2-cuda 2 "$PEAK_FP32" -- \
    --preset gpt2 --backend cuda --allow-gpu-sharing --tp 2 --seq 1024 --micro-batch 4 --steps 5
  # Two pipeline stages on device memory: 1F1B's stage-to-stage sendrecv of activations and their
  # gradients, and the tied embedding's gradient all-reduce between the first and last stage.
  NOTE="PP 2 (1F1B, 4 micro-batches), 2 ranks share GPU 0; " run shared-pp2-cuda 2 "$PEAK_FP32" -- \
    --preset gpt2 --backend cuda --allow-gpu-sharing --pp 2 --micro-batches 4 --seq 1024 --micro-batch 2 --steps 5
else
  NOTE="CPU backend; " run shared-tp2-cpu 2 0 OMP_NUM_THREADS=$(( $(nproc) / 2 )) -- \
    --preset small --backend cpu --tp 2 --micro-batch 4 --steps 5 --threads $(( $(nproc) / 2 ))
fi

# ---- table ----------------------------------------------------------------------------------
say "done in $(( $(date +%s) - T0 ))s; everything in $LOGDIR (console: check.log)"
echo
echo "GPU: ${GPU_NAME:-none}; glibc ${GLIBC_HERE:-?}; binaries: $( [ -n "${NTPBENCH_BUNDLE:-}" ] && echo "bundle" || echo "built here")"
echo "GPU tests: $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skipped (rc $TEST_RC)"
for l in "${LOSSES[@]}"; do echo "$l"; done
printf '%-18s %5s %9s %10s %7s  %s\n' run ranks ms/step tokens/s MFU note
for r in "${ROWS[@]}"; do
  IFS='|' read -r name ranks ms tok mfu note <<<"$r"
  printf '%-18s %5s %9s %10s %7s  %s\n' "$name" "$ranks" "$ms" "$tok" "$mfu" "$note"
done
echo "NTP sync on the CPU (bench_resilience ntp_sync/small, 1 thread per rank; target: exposed ntp/uniform <= 1.10):"
printf '%-18s %5s %9s %9s %15s  %s\n' pair ranks exposed serial "exposed ms" note
for r in "${BENCHES[@]}"; do
  IFS='|' read -r name ranks ex se ms note <<<"$r"
  printf '%-18s %5s %9s %9s %15s  %s\n' "$name" "$ranks" "$ex" "$se" "$ms" "$note"
done
exit $FAILED
