#!/usr/bin/env bash
# jobs/gpu/check.sh [OUT] — the device check of the CUDA backend, on a machine with one GPU.
#
# In order of value: the machine's facts; the GPU kernel tests (test_cuda: CUDA against the CPU
# kernels); single-GPU training steps at gpt2 and gpt2-medium in fp32 and bf16 (then TF32); two
# ranks sharing the GPU through the MPI path (TP 2, PP 2 with 1F1B); the NTP gradient sync on the
# CPU (bench_resilience ntp_sync 4->3 and 8->7, a core per rank). Then the table.
#
# It returns what ran whatever hangs: every launch runs in its own session under `timeout -k`,
# capped by the time left of CHECK_BUDGET, and whatever is left of the session is killed after
# it; a watchdog ends the wait at the deadline and the table is still printed. After each step
# the table so far (summary.txt) and an archive of the run files (runs.tgz) are rewritten in OUT,
# so a command cut short still leaves what finished.
#
# OUT (the argument, else CHECK_OUT) receives these files, no more (nvidia-smi.txt where it is found):
#   check.log      the console, written line by line
#   summary.txt    the table (rewritten after each step; its last line says whether it is final)
#   runs.tgz       runs/: NAME.out and NAME.h5 per run, test_cuda.log/.xml, bench-NAME.out/.json
#   nvidia-smi.txt
# Exit status: 0 when every step ran and passed, 1 otherwise, 2 for bad usage.
#
# Environment:
#   CHECK_OUT      the output folder, when no argument is given
#   CHECK_WORK     the work folder holding runs/, emptied first (default: a new folder under TMPDIR,
#                  removed at exit)
#   CHECK_BUDGET   seconds for the whole check (400: keep it 60 s or more below an outer limit)
#   TEST_TIMEOUT   seconds for test_cuda (90)
#   RUN_TIMEOUT    seconds per training run (90); after a run times out, the rest of its group is skipped
#   BENCH_TIMEOUT  seconds per CPU benchmark (60)
#   PROBE_TIMEOUT  seconds per machine probe: nvidia-smi, ldd, mpirun --version (10)
#   KILL_AFTER     seconds from TERM to KILL for a launch past its limit (5)
#   CHECK_GRACE    seconds past the deadline after which a check stuck outside any launch (say, in
#                  the bundle's env.sh) is killed, summary.txt noting it (20)
#   BUNDLE         the bundle (default gpu-bundle, `make gpu-bundle`), used when bin/ntpbench is there
#   BUILD          without a bundle: the build folder (default build), its binaries used as they
#                  are, or built here first (CMake; CUDA_ARCHS, default 90; JOBS) when an MPI
#                  compiler (mpicxx) is found
#   CHECK_PYTHON   the Python reading the benchmarks' JSON (default: python3, else the image's own)
#   PEAK_FP32_GFLOPS, PEAK_TF32_GFLOPS, PEAK_BF16_GFLOPS   per-GPU dense peaks for MFU (defaults by
#                  the GPU's name: H100/H200 SXM 67 / 494.7 / 989.4 TFLOP/s; PCIe and NVL their own)
#   SHARED_BACKEND backend of the 2-rank runs (cuda, or cpu)
#   NCCL_DEBUG     exported for the CUDA runs (WARN unless set)
# See jobs/gpu/README.md.
set -uo pipefail
set +m  # no job control: each launch's setsid then makes the launch's own pid its session id

OUT=${1:-${CHECK_OUT:-}}
if [ $# -gt 1 ] || [ -z "$OUT" ]; then
  echo "usage: $0 OUT (or CHECK_OUT=OUT $0): the folder that receives check.log, summary.txt, runs.tgz" >&2
  exit 2
fi
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd) || { echo "$0: cannot create the output folder $OUT" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
ENV_BEFORE=$(env | grep -E '^(OMPI|OPAL|PMIX|PRTE|NCCL)_' | sort)  # before this script sets any

BUNDLE=${BUNDLE:-gpu-bundle}
BUILD=${BUILD:-build}
CUDA_ARCHS=${CUDA_ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
SHARED_BACKEND=${SHARED_BACKEND:-cuda}
CHECK_BUDGET=${CHECK_BUDGET:-400}
TEST_TIMEOUT=${TEST_TIMEOUT:-90}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-60}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-10}
KILL_AFTER=${KILL_AFTER:-5}
RESERVE=$(( KILL_AFTER + 5 ))  # kept back from every step: its last kill, the archive, the table
MIN_STEP=10                    # a step with less than this left is skipped
GRACE=${CHECK_GRACE:-20}       # past the deadline, the watchdog stops a check stuck outside a launch
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

MADE_WORK=0
if [ -n "${CHECK_WORK:-}" ]; then WORK=$CHECK_WORK
else WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") && MADE_WORK=1 || { echo "$0: cannot make a work folder" >&2; exit 2; }
fi
RUNS=$WORK/runs
rm -rf "$RUNS" && mkdir -p "$RUNS" || { echo "$0: cannot create $RUNS" >&2; exit 2; }
LOG=$OUT/check.log
rm -f "$OUT/check.log" "$OUT/summary.txt" "$OUT/runs.tgz" "$OUT/nvidia-smi.txt"
exec 3>>"$LOG"

T0=$SECONDS
FAILED=0
DEADLINE=0   # 1 once the deadline (or a TERM/INT/HUP) has come: what is left is skipped
CHILD=       # the session of the launch in progress
NO_BIN=      # why there are no binaries to run, if so
BIN_FROM=none
NTPBENCH='' TEST_CUDA='' BENCH_RES='' MPIRUN='' PYTHON='' GPU_NAME='' COMPUTE_MODE='' GLIBC_HERE=''
MPI_ENV=()   # what the ranks need from env.sh, passed on explicitly
TESTS="not reached"
LOSSES=()
declare -A ROW        # run name -> "ranks|ms/step|tokens/s|MFU|note"; bench name -> "ranks|exposed|serial|ms|note"
declare -A GROUP_SKIP # group -> why the rest of it is skipped
RUN_ORDER=() BENCH_ORDER=()

# ---- console and log ----------------------------------------------------------------------------
log() { printf '%s\n' "$*"; printf '%s\n' "$*" >&3; }  # one line to the console and to check.log
show() { local l; while IFS= read -r l || [ -n "$l" ]; do log "$l"; done; }  # stdin, line by line
say() { log "== [$(( SECONDS - T0 ))s] $*"; }
left() { echo $(( CHECK_BUDGET - (SECONDS - T0) )); }

# time_for SECS: SECS, or less near the deadline (RESERVE kept back); status 1 when that is under
# MIN_STEP (or under SECS, for a step wanting less)
time_for() {
  local l=$(( $(left) - RESERVE ))
  [ "$DEADLINE" = 1 ] && l=0
  [ "$l" -lt "$1" ] || l=$1
  echo "$l"
  [ "$l" -ge "$(( $1 < MIN_STEP ? $1 : MIN_STEP ))" ]
}

# ---- launches -----------------------------------------------------------------------------------
SETSID=()
command -v setsid >/dev/null 2>&1 && SETSID=(setsid)
end_session() {  # end_session ID: KILL what is left of launch ID (its session, else its group)
  kill -KILL -- "-$1" 2>/dev/null
  [ ${#SETSID[@]} -gt 0 ] && pkill -KILL -s "$1" 2>/dev/null
  return 0
}

# launch SECS OUTFILE CMD...: CMD in its own session under `timeout -k`, stdout and stderr to
# OUTFILE; returns CMD's status, 124 when it ran out of time or the deadline stopped it.
launch() {
  local secs=$1 out=$2 start=$SECONDS rc i
  shift 2
  "${SETSID[@]}" timeout -k "$KILL_AFTER" "$secs" "$@" >"$out" 2>&1 </dev/null &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  if [ "$DEADLINE" = 1 ] && [ "$rc" -gt 128 ]; then
    # The wait was cut short by the deadline (on_deadline killed the session): give it a moment.
    for (( i = 0; i < KILL_AFTER && rc > 128; i++ )); do kill -0 "$CHILD" 2>/dev/null || break; sleep 1; done
    rc=124
  fi
  end_session "$CHILD"
  CHILD=
  # timeout: 124 after TERM; 128+9 when it had to KILL (or the command was killed otherwise)
  if [ "$rc" -eq 137 ] && [ $(( SECONDS - start )) -ge "$secs" ]; then rc=124; fi
  return "$rc"
}

# probe CMD...: a short look at the machine, its output shown (bounded by PROBE_TIMEOUT)
probe() {
  launch "$PROBE_TIMEOUT" "$WORK/probe.out" "$@"
  local rc=$?
  show <"$WORK/probe.out"
  [ $rc -ne 124 ] || log "(no answer within ${PROBE_TIMEOUT}s: $*)"
  return $rc
}

on_deadline() { DEADLINE=1; [ -z "$CHILD" ] || end_session "$CHILD"; }
trap on_deadline TERM INT HUP

# The watchdog (in the background): TERM at the deadline, which ends the wait for any launch; if
# the check is still not done GRACE seconds later (stuck outside a launch), it notes so and stops it.
watchdog() {
  local sp=
  trap '[ -z "$sp" ] || kill "$sp" 2>/dev/null; exit 0' TERM
  sleep "$CHECK_BUDGET" & sp=$!; wait "$sp"
  kill -TERM "$MAIN" 2>/dev/null || exit 0
  sleep "$GRACE" & sp=$!; wait "$sp"
  kill -0 "$MAIN" 2>/dev/null || exit 0
  local note="check.sh: stopped, stuck ${GRACE}s past its ${CHECK_BUDGET}s budget outside any launch; the table above is as of the last finished step"
  echo "$note" >>"$OUT/summary.txt"; echo "$note" >>"$LOG"; echo "$note"
  kill -STOP "$MAIN"  # then what it waits for (not this watchdog), then itself
  local c
  for c in $(pgrep -P "$MAIN"); do [ "$c" = "$BASHPID" ] || kill -KILL "$c"; done
  kill -KILL "$MAIN"
}
MAIN=$$
watchdog </dev/null &
WATCHDOG=$!
finish() {
  kill -TERM "$WATCHDOG" 2>/dev/null
  [ -z "$CHILD" ] || end_session "$CHILD"
  [ "$MADE_WORK" = 0 ] || rm -rf "$WORK"
}
trap finish EXIT

# ---- the table, and what is saved after each step -------------------------------------------------
row_line() { local a b c d e; IFS='|' read -r a b c d e <<<"$2"; printf "$1" "$3" "$a" "$b" "$c" "$d" "$e"; }
RUN_FMT='%-18s %5s %9s %10s %7s  %s\n'
BENCH_FMT='%-18s %5s %9s %9s %15s  %s\n'
render_table() {  # render_table STATUS-LINE
  local n
  echo "GPU: ${GPU_NAME:-none} (compute mode ${COMPUTE_MODE:-unknown}); glibc ${GLIBC_HERE:-?}; binaries: $BIN_FROM"
  echo "GPU tests: $TESTS"
  for n in ${LOSSES[@]+"${LOSSES[@]}"}; do echo "$n"; done
  printf "$RUN_FMT" run ranks ms/step tokens/s MFU note
  for n in ${RUN_ORDER[@]+"${RUN_ORDER[@]}"}; do row_line "$RUN_FMT" "${ROW[$n]}" "$n"; done
  echo "NTP sync on the CPU (bench_resilience ntp_sync/small, 1 thread per rank; target: exposed ntp/uniform <= 1.10):"
  printf "$BENCH_FMT" pair ranks exposed serial "exposed ms" note
  for n in ${BENCH_ORDER[@]+"${BENCH_ORDER[@]}"}; do row_line "$BENCH_FMT" "${ROW[$n]}" "$n"; done
  echo "$1"
}
write_summary() {  # write_summary STATUS-LINE: summary.txt replaced whole
  render_table "$1" >"$WORK/summary.new" && mv -f "$WORK/summary.new" "$OUT/summary.txt"
}
archive() {  # runs.tgz replaced by a fresh archive of runs/ (the old one kept if tar fails)
  local secs=30
  [ "$DEADLINE" = 0 ] || secs=5
  launch "$secs" "$WORK/tar.out" tar czf "$WORK/runs.tgz.new" -C "$WORK" runs \
    && mv -f "$WORK/runs.tgz.new" "$OUT/runs.tgz" || log "(runs.tgz not refreshed: $(head -c 300 "$WORK/tar.out"))"
}
in_progress() { echo "check.sh: in progress, $(( SECONDS - T0 ))s of ${CHECK_BUDGET}s (this file is rewritten after each step)"; }
step_done() { write_summary "$(in_progress)"; archive; }

# start_row NAME SKIP-REASON-OR-EMPTY: with a reason, the row is SKIPPED (status 1); else it is
# marked running in summary.txt (so a check cut short shows where)
start_row() {
  local name=$1 why=$2 ranks=${ROW[$1]%%|*}
  if [ -n "$why" ]; then ROW[$name]="$ranks|-|-|-|SKIPPED: $why"; FAILED=1; return 1; fi
  ROW[$name]="$ranks|-|-|-|running since $(( SECONDS - T0 ))s: no result (the check was cut short)"
  write_summary "$(in_progress)"
}
# skip_reason GROUP SECS: why a step of GROUP wanting SECS cannot start, or nothing
skip_reason() {
  if [ -n "$NO_BIN" ]; then echo "$NO_BIN"
  elif [ -n "${GROUP_SKIP[$1]:-}" ]; then echo "${GROUP_SKIP[$1]}"
  elif [ "$DEADLINE" = 1 ]; then echo "the check was stopped (deadline or signal)"
  elif ! time_for "$2" >/dev/null; then echo "budget: $(left)s left of ${CHECK_BUDGET}s"
  fi
}
# timed_out NAME GROUP SECS: TIMEOUT_NOTE for NAME, which ran out of time; the rest of GROUP will be skipped
timed_out() {
  GROUP_SKIP[$2]="after $1 timed out"
  if [ "$DEADLINE" = 1 ]; then TIMEOUT_NOTE="FAIL stopped at the check's deadline"; else TIMEOUT_NOTE="FAIL timeout after ${3}s (killed)"; fi
  FAILED=1
}

# ---- the machine ----------------------------------------------------------------------------------
machine_facts() {
  say "machine"
  log "host $(hostname), $(uname -srm), $(nproc) CPUs: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1);" \
      "$(lscpu 2>/dev/null | awk -F: '/^Thread\(s\) per core|^Core\(s\) per socket|^Socket\(s\)/ { gsub(/^ +/, "", $2); printf "%s %s; ", $1, $2 }')" \
      "memory $(free -g 2>/dev/null | awk '/^Mem:/ { print $2 }') GiB"
  if command -v nvidia-smi >/dev/null 2>&1; then
    probe nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit,compute_mode --format=csv
    GPU_NAME=$(awk -F', ' 'NR == 2 { print $2 }' "$WORK/probe.out")
    COMPUTE_MODE=$(awk -F', ' 'NR == 2 { print $NF }' "$WORK/probe.out")
    launch "$PROBE_TIMEOUT" "$OUT/nvidia-smi.txt" nvidia-smi
  else
    log "nvidia-smi: not available"
  fi
  case "${COMPUTE_MODE:-}" in
    Exclusive_Process|Exclusive_Thread)
      log "NOTE: the GPU's compute mode is $COMPUTE_MODE: one process per GPU, so the 2-rank runs sharing it cannot work"
      [ "$SHARED_BACKEND" != cuda ] || GROUP_SKIP[shared]="GPU compute mode $COMPUTE_MODE: two ranks cannot share it" ;;
    Prohibited) log "NOTE: the GPU's compute mode is Prohibited: no process may use it" ;;
  esac
  GLIBC_HERE=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
  log "glibc here: ${GLIBC_HERE:-unknown} ($(ldd --version 2>/dev/null | head -1))"
  log "network interfaces:"
  if command -v ip >/dev/null 2>&1; then probe ip -brief addr; else log "  $(ls /sys/class/net 2>/dev/null | tr '\n' ' ')"; fi
  if [ -n "$ENV_BEFORE" ]; then log "OMPI_/OPAL_/PMIX_/PRTE_/NCCL_ variables set before the check:"; show <<<"$ENV_BEFORE"
  else log "OMPI_/OPAL_/PMIX_/PRTE_/NCCL_ variables set before the check: none"; fi
  log "NCCL_DEBUG=$NCCL_DEBUG for the CUDA runs"
  find_python
  mfu_peaks
}

# The Python that reads the benchmarks' JSON: CHECK_PYTHON, python3, else the image's own (where
# gpu-bundle/env.sh also looks); none leaves the bench figures as "-".
find_python() {
  local p
  PYTHON=
  for p in ${CHECK_PYTHON:-} python3 /opt/torch/.venv/bin/python3 /opt/*/.venv/bin/python3 python; do
    command -v "$p" >/dev/null 2>&1 || continue
    if timeout -k 2 10 "$p" -c 'import json' >/dev/null 2>&1; then PYTHON=$(command -v "$p"); break; fi
  done
  log "python: ${PYTHON:-none found (the benchmark figures will be -)}"
}

mfu_peaks() {
  local p32 ptf pbf
  case "${GPU_NAME:-}" in  # dense (no sparsity) peaks, NVIDIA's datasheets
    *PCIe*) p32=51200; ptf=378000; pbf=756000 ;;
    *NVL*)  p32=60000; ptf=417500; pbf=835500 ;;
    *)      p32=67000; ptf=494700; pbf=989400 ;;
  esac
  PEAK_FP32=${PEAK_FP32_GFLOPS:-$p32}
  PEAK_TF32=${PEAK_TF32_GFLOPS:-$ptf}
  PEAK_BF16=${PEAK_BF16_GFLOPS:-$pbf}
  log "MFU peaks (GFLOP/s, ${GPU_NAME:-no GPU name}): fp32 $PEAK_FP32, tf32 $PEAK_TF32, bf16 $PEAK_BF16"
}

# ---- the binaries: the bundle, a build folder, or a build here ------------------------------------
use_bundle() {
  BUNDLE=$(cd "$BUNDLE" && pwd)
  say "using the bundle $BUNDLE"
  # A copy may have lost the executable bits: set them rather than trust them.
  chmod +x "$BUNDLE"/bin/* 2>/dev/null || log "NOTE: cannot chmod +x $BUNDLE/bin/*"
  if [ -f "$BUNDLE/MANIFEST.txt" ]; then sed -n '1,/^$/p' "$BUNDLE/MANIFEST.txt" | show; else log "NOTE: no MANIFEST.txt"; fi
  local need
  need=$(sed -n 's/^glibc_needed: GLIBC_//p' "$BUNDLE/MANIFEST.txt" 2>/dev/null)
  if [ -n "$GLIBC_HERE" ] && [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$GLIBC_HERE" | sort -V | head -1)" != "$need" ]; then
    log "NOTE: glibc here ($GLIBC_HERE) is older than the bundle's newest need ($need): env.sh says what it does about it"
  fi
  if [ -f "$BUNDLE/env.sh" ]; then
    # shellcheck source=/dev/null
    . "$BUNDLE/env.sh" >"$WORK/env.out" 2>&1
    show <"$WORK/env.out"
  else
    log "NOTE: no env.sh in the bundle: the CUDA libraries are left to the loader"
  fi
  [ -z "${NTPBENCH_BUNDLE_MISSING:-}" ] || log "NOTE: not found: $NTPBENCH_BUNDLE_MISSING (the CUDA runs will fail)"
  NTPBENCH=$BUNDLE/bin/ntpbench TEST_CUDA=$BUNDLE/bin/test_cuda BENCH_RES=$BUNDLE/bin/bench_resilience MPIRUN=$BUNDLE/bin/mpirun
  BIN_FROM="bundle $BUNDLE"
}

use_build() {  # the binaries of BUILD as they are
  NTPBENCH=$BUILD/ntpbench TEST_CUDA=$BUILD/tests/test_cuda BENCH_RES=$BUILD/bench/bench_resilience
  MPIRUN=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
  MPIRUN=${MPIRUN:-mpirun}
  BIN_FROM="build folder $BUILD"
}

no_build() { NO_BIN="no binaries: $1"; log "check.sh: nothing to run: $1; every step is SKIPPED"; }
build_here() {  # configure and build BUILD here, within the budget; sets NO_BIN when it cannot
  local secs bench=ON
  say "no bundle at $BUNDLE: configure + build $BUILD (CUDA architectures $CUDA_ARCHS, -j$JOBS)"
  secs=$(time_for 3600) || { no_build "no time left to build"; return; }
  # Google Benchmark missing: configure again without bench_resilience.
  if ! launch "$secs" "$RUNS/configure.log" cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DNTPBENCH_BENCH=ON; then
    bench=OFF
    secs=$(time_for 3600) || { no_build "no time left to build"; return; }
    launch "$secs" "$RUNS/configure.log" cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DNTPBENCH_BENCH=OFF \
      || { tail -30 "$RUNS/configure.log" | show; no_build "configure failed (configure.log in runs.tgz)"; return; }
  fi
  grep "CUDA backend" "$RUNS/configure.log" | show
  local targets=(ntpbench test_cuda)
  [ "$bench" = ON ] && targets+=(bench_resilience)
  secs=$(time_for 3600) || { no_build "no time left to build"; return; }
  launch "$secs" "$RUNS/build.log" cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" \
    || { tail -40 "$RUNS/build.log" | show; no_build "build failed (build.log in runs.tgz)"; return; }
  say "built"
  use_build
}

find_binaries() {
  if [ -f "$BUNDLE/bin/ntpbench" ]; then use_bundle
  elif [ -f "$BUILD/ntpbench" ]; then say "no bundle at $BUNDLE: the binaries in $BUILD as they are"; use_build
  elif command -v mpicxx >/dev/null 2>&1 && command -v cmake >/dev/null 2>&1; then build_here
  else
    NO_BIN="no binaries (no bundle, no mpicxx)"
    log "check.sh: nothing to run: no bundle at $BUNDLE (\`make gpu-bundle\` builds it; bring gpu-bundle/ along)," \
        "no binaries in $BUILD, and no MPI compiler (mpicxx) to build them here; every step is SKIPPED"
  fi
  [ -z "$NO_BIN" ] || return
  log "libraries ntpbench loads:"
  launch "$PROBE_TIMEOUT" "$WORK/probe.out" ldd "$NTPBENCH"
  grep -E 'libcuda|libcudart|libcublas|libnccl|libmpi|libstdc|not found|not a dynamic' "$WORK/probe.out" | sed 's/ (0x.*//' | show
  launch "$PROBE_TIMEOUT" "$WORK/probe.out" "$MPIRUN" --version
  log "$MPIRUN --version: $(head -1 "$WORK/probe.out")"
  MPI_ENV=(-x NCCL_DEBUG)
  [ -z "${LD_LIBRARY_PATH:-}" ] || MPI_ENV+=(-x LD_LIBRARY_PATH)
  [ -z "${LD_PRELOAD:-}" ] || MPI_ENV+=(-x LD_PRELOAD)
}

# ---- GPU tests ------------------------------------------------------------------------------------
gpu_tests() {
  local secs rc start=$SECONDS log_=$RUNS/test_cuda.log passed failed skipped why
  why=$(skip_reason tests "$TEST_TIMEOUT")
  [ -n "$why" ] || [ -f "$TEST_CUDA" ] || why="test_cuda not built ($TEST_CUDA)"
  if [ -n "$why" ]; then TESTS="SKIPPED: $why"; FAILED=1; return; fi
  secs=$(time_for "$TEST_TIMEOUT")
  say "GPU kernel tests ($TEST_CUDA, at most ${secs}s)"
  TESTS="running since $(( SECONDS - T0 ))s: no result (the check was cut short)"
  write_summary "$(in_progress)"
  launch "$secs" "$log_" "$TEST_CUDA" --gtest_output="xml:$RUNS/test_cuda.xml"
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? from .* ran|Failure|seed=|rel_err|Which is" "$log_" | head -40 | show
  passed=$(grep -c "^\[       OK \]" "$log_")
  failed=$(grep -c "^\[  FAILED  \] Cuda[A-Za-z0-9]*\..*(" "$log_")
  skipped=$(grep -c "^\[  SKIPPED \] Cuda[A-Za-z0-9]*\..*(" "$log_")
  TESTS="$passed passed, $failed failed, $skipped skipped (rc $rc, $(( SECONDS - start ))s)"
  [ "$rc" -ne 124 ] || TESTS="FAIL timeout after ${secs}s (killed): $passed passed, $failed failed so far"
  if [ "$rc" -ne 0 ] || [ "$skipped" -ne 0 ] || [ "$passed" -eq 0 ]; then
    FAILED=1
    say "FAIL: GPU tests (rc $rc; a skip here means the GPU was not usable)"
  fi
  step_done
}

# ---- timed runs -----------------------------------------------------------------------------------
PLAN=0  # 1: run and bench only add their row to the table, as "not reached"

# run GROUP NAME RANKS PEAK [ENV=VAL ...] -- NTPBENCH-FLAGS...  (RANKS > 1 launches with mpirun)
run() {
  local group=$1 name=$2 ranks=$3 peak=$4
  shift 4
  if [ "$PLAN" = 1 ]; then RUN_ORDER+=("$name"); ROW[$name]="$ranks|-|-|-|not reached"; return; fi
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  start_row "$name" "$(skip_reason "$group" "$RUN_TIMEOUT")" || return
  local out="$RUNS/$name.out" h5="$RUNS/$name.h5" secs start=$SECONDS rc
  local cmd=("$NTPBENCH" "$@" --peak-gflops "$peak" --no-final-checkpoint --overwrite --out "$h5")
  [ "$ranks" -le 1 ] || cmd=("$MPIRUN" --oversubscribe -np "$ranks" "${MPI_ENV[@]}" "${cmd[@]}")
  secs=$(time_for "$RUN_TIMEOUT")
  say "run $name (at most ${secs}s): ${envs[*]} ${cmd[*]}"
  launch "$secs" "$out" env ${envs[@]+"${envs[@]}"} "${cmd[@]}"
  rc=$?
  if [ $rc -eq 0 ]; then grep -a -E "^(ntpbench:|step|done:)" "$out" | tail -14 | show; else tail -15 "$out" | tr -d '\000' | show; fi
  # Mean over steps 2.. (step 1 pays for cuBLAS heuristics and first-touch allocations).
  local stats note="ok"
  stats=$(awk -F'|' '/^step/ { split($1, s, /[ \/]+/); if (s[2] + 0 < 2) next;
                         ms += $4 + 0; tok += $5 + 0; gsub(/[^0-9.]/, "", $6); mfu += $6; n++ }
                   END { if (n) printf "%.1f|%.0f|%.1f%%", ms / n, tok / n, mfu / n; else print "-|-|-" }' "$out")
  if [ $rc -eq 124 ]; then timed_out "$name" "$group" "$secs"; note=$TIMEOUT_NOTE
  elif [ $rc -ne 0 ]; then note="FAIL rc=$rc"; FAILED=1
  elif [ "$stats" = "-|-|-" ]; then note="FAIL: exit status 0 but no step timed"; FAILED=1  # mpirun has exited 0 after an MPI_Abort
  fi
  ROW[$name]="$ranks|$stats|${NOTE:-}$note ($(( SECONDS - start ))s)"
  step_done
}

# bench NAME RANKS FILTER: bench_resilience's ntp_sync pair under mpirun, one logical CPU per rank
# (bound) where the machine has enough, OMP_NUM_THREADS=1; the figures from its JSON.
bench() {
  local name=$1 ranks=$2 filter=$3 json="$RUNS/bench-$1.json" note="" bind
  if [ "$PLAN" = 1 ]; then BENCH_ORDER+=("$name"); ROW[$name]="$ranks|-|-|-|not reached"; return; fi
  local why
  why=$(skip_reason bench "$BENCH_TIMEOUT")
  [ -n "$why" ] || [ -f "$BENCH_RES" ] || why="bench_resilience not built"
  start_row "$name" "$why" || return
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
  local secs start=$SECONDS rc figs
  secs=$(time_for "$BENCH_TIMEOUT")
  say "bench $name (at most ${secs}s): ${cmd[*]}"
  OMP_NUM_THREADS=1 launch "$secs" "$RUNS/bench-$name.out" "${cmd[@]}"
  rc=$?
  grep -a -E "^ntp_sync|Error|error" "$RUNS/bench-$name.out" | tail -5 | show
  figs=$(bench_figures "$json")
  if [ $rc -eq 124 ]; then timed_out "$name" bench "$secs"; figs="-|-|-|$TIMEOUT_NOTE"
  elif [ $rc -ne 0 ] || [ -z "$figs" ]; then figs="-|-|-|FAIL rc=$rc"; FAILED=1
  fi
  ROW[$name]="$ranks|$figs; $note$(awk -F': ' '/openblas_corename/ { print "BLAS " $2 }' "$RUNS/bench-$name.out" | head -1) ($(( SECONDS - start ))s)"
  step_done
}

bench_figures() {  # bench_figures JSON: "exposed|serial|exposed ms|verdict", or nothing
  [ -s "$1" ] || return 0
  if [ -z "$PYTHON" ]; then echo "-|-|-|no Python here to read the JSON (in runs.tgz)"; return; fi
  timeout -k 2 20 "$PYTHON" - "$1" <<'EOF' 2>/dev/null
import json, sys
b = [x for x in json.load(open(sys.argv[1]))["benchmarks"] if x["name"].startswith("ntp_sync/")][0]
if "error_message" in b:
    print("-|-|-|" + b["error_message"]); raise SystemExit
ok = "meets" if b["exposed_ntp/uniform"] <= 1.10 else "misses"
print(f'{b["exposed_ntp/uniform"]:.3f}|{b["ntp/uniform"]:.3f}|{b["exposed_ntp_ms"]:.2f}/{b["exposed_uniform_ms"]:.2f}|'
      f'{ok} the 1.10x target; wrong={b["wrong"]:.0f}')
EOF
}

# bf16 against fp32 end to end: both runs start from the same weights on the same data, so step
# 1's loss (its forward pass, before any update) differs only by the GEMMs' rounding and must
# agree within 2e-2 relative, as the kernel tests do. The last step's losses are for reference.
loss_at() {  # loss_at FILE STEP: the loss FILE's line for STEP printed, or "-"
  [ -r "$1" ] || { echo -; return; }
  awk -F'|' -v want="$2" '/^step/ { split($1, s, /[ \/]+/); if (s[2] + 0 == want) { split($2, l, " "); v = l[2] } }
                          END { print (v == "" ? "-" : v) }' "$1"
}
compare_losses() {  # compare_losses FP32-RUN BF16-RUN
  local a b verdict
  a=$(loss_at "$RUNS/$1.out" 1)
  b=$(loss_at "$RUNS/$2.out" 1)
  verdict=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a == "-" || b == "-" || a + 0 == 0) { print "FAIL: no loss"; exit }
                                            d = (b - a) / a; if (d < 0) d = -d
                                            printf "%.1e relative, %s", d, d <= 2e-2 ? "ok" : "FAIL" }')
  [[ $verdict == *FAIL* ]] && FAILED=1
  LOSSES+=("$2 vs $1: step 1 loss $b vs $a ($verdict); step $STEPS loss $(loss_at "$RUNS/$2.out" "$STEPS") vs $(loss_at "$RUNS/$1.out" "$STEPS")")
}

STEPS=10
GPT2=(--backend cuda --seq 1024 --micro-batch 4 --steps "$STEPS")
BF16_NOTE="bf16 GEMMs (fp32 master weights + AdamW), MFU vs BF16 peak; "
single_gpu_runs() {
  run single gpt2-fp32 1 "$PEAK_FP32" -- --preset gpt2 "${GPT2[@]}"
  NOTE="$BF16_NOTE" run single gpt2-bf16 1 "$PEAK_BF16" -- --preset gpt2 "${GPT2[@]}" --precision bf16
  run single gpt2-medium-fp32 1 "$PEAK_FP32" -- --preset gpt2-medium "${GPT2[@]}"
  NOTE="$BF16_NOTE" run single gpt2-medium-bf16 1 "$PEAK_BF16" -- --preset gpt2-medium "${GPT2[@]}" --precision bf16
  NOTE="TF32 GEMMs, MFU vs TF32 peak; " run single gpt2-tf32 1 "$PEAK_TF32" NTPBENCH_TF32=1 -- --preset gpt2 "${GPT2[@]}"
}

# Two ranks sharing the GPU through the MPI path: --allow-gpu-sharing makes the TP group and the
# sync slots MPI communicators that stage device buffers through host memory (src/comm/comm_staged),
# since NCCL refuses two ranks on one GPU. SHARED_BACKEND=cpu runs the same shape on the CPU.
shared_gpu_runs() {
  if [ "$SHARED_BACKEND" = cuda ]; then
    NOTE="2 ranks share GPU 0 via MPI + host staging; " run shared shared-tp2-cuda 2 "$PEAK_FP32" -- \
      --preset gpt2 --backend cuda --allow-gpu-sharing --tp 2 --seq 1024 --micro-batch 4 --steps 5
    # Two pipeline stages on device memory: 1F1B's stage-to-stage sendrecv of activations and their
    # gradients, and the tied embedding's gradient all-reduce between the first and last stage.
    NOTE="PP 2 (1F1B, 4 micro-batches), 2 ranks share GPU 0; " run shared shared-pp2-cuda 2 "$PEAK_FP32" -- \
      --preset gpt2 --backend cuda --allow-gpu-sharing --pp 2 --micro-batches 4 --seq 1024 --micro-batch 2 --steps 5
  else
    NOTE="CPU backend; " run shared shared-tp2-cpu 2 0 OMP_NUM_THREADS=$(( $(nproc) / 2 )) -- \
      --preset small --backend cpu --tp 2 --micro-batch 4 --steps 5 --threads $(( $(nproc) / 2 ))
  fi
}

cpu_benches() {
  bench 4to3 7 '^ntp_sync/small/4->3/'
  bench 8to7 15 '^ntp_sync/small/8->7/'
}

# ---- the check ------------------------------------------------------------------------------------
say "jobs/gpu/check.sh in $ROOT: output in $OUT, budget ${CHECK_BUDGET}s (test ${TEST_TIMEOUT}s, run ${RUN_TIMEOUT}s, bench ${BENCH_TIMEOUT}s)"
git -C "$ROOT" log -1 --format='revision %h %s' 2>/dev/null | show
PEAK_FP32=0 PEAK_TF32=0 PEAK_BF16=0
PLAN=1; single_gpu_runs; shared_gpu_runs; cpu_benches; PLAN=0
write_summary "$(in_progress)"

machine_facts
find_binaries
step_done
gpu_tests
single_gpu_runs
compare_losses gpt2-fp32 gpt2-bf16
compare_losses gpt2-medium-fp32 gpt2-medium-bf16
shared_gpu_runs
cpu_benches

END="check.sh: $([ "$FAILED" = 0 ] && echo PASS || echo FAIL) in $(( SECONDS - T0 ))s of ${CHECK_BUDGET}s$([ "$DEADLINE" = 0 ] || echo ", stopped at the deadline")"
[ "$DEADLINE" = 0 ] || archive  # the deadline may have cut the last step's archive short
say "done; output in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
log ""
write_summary "$END"
show <"$OUT/summary.txt"
exit "$FAILED"
