#!/usr/bin/env bash
# Run ntpbench on this machine with mpirun and sensible defaults; prints the command it runs.
#
#   jobs/local/run.sh [-n RANKS] [--dry-run] [ntpbench flags...]
#   jobs/local/run.sh -n 8 --config jobs/configs/small.toml --schedule jobs/schedules/one-failure.yaml --policy ntp
#
# RANKS: -n/-np, else $RANKS, else 8 (TP 4 x DP 2, what jobs/schedules assume). Everything else goes to
# ntpbench. Defaults it adds, each only when you did not give that flag yourself:
#   - ranks > cores (nproc): mpirun --oversubscribe --bind-to none, and ntpbench --timing paced
#     --time-scale auto (real wall time means nothing when ranks share cores; docs/timing.md), on
#     the demo's emulated machine when you name none (no --machine, no custom rate, no
#     --emulate-shape): --machine dgx-a100 --emulate-shape gpt2-xl (llama-8b for a llama preset);
#   - ranks <= cores: --bind-to core --map-by core (one rank per core);
#   - ranks >= cores: one BLAS/OpenMP thread per rank (-x OMP_NUM_THREADS=1, ntpbench --threads 1);
#     fewer ranks than cores: cores/ranks threads each;
#   - --out results/local-<date>-<time>.h5;
#   - as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (Open MPI refuses root otherwise).
# Environment: NTPBENCH (binary; default <repo>/build/ntpbench), MPIRUN (default: the binary's own
# MPI's mpirun, with --with-ft ulfm where it has ULFM), MPIRUN_ARGS
# (extra mpirun options, split on spaces).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${NTPBENCH:-$ROOT/build/ntpbench}
RANKS=${RANKS:-8}
DRY=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n | -np | --np) RANKS=${2:?-n needs a rank count}; shift 2 ;;
    -n* ) RANKS=${1#-n}; shift ;;
    --dry-run) DRY=1; shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ "$RANKS" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: error: rank count '$RANKS' is not a positive integer" >&2; exit 2; }
[ -x "$BIN" ] || { echo "run.sh: error: no ntpbench at $BIN (run 'make build', or set NTPBENCH)" >&2; exit 2; }

# Is a flag given on the command line or in a --config TOML file?
has_flag() {
  local name=$1 a i cfg=""
  for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[i]}
    case "$a" in
      --"$name" | --"$name"=*) return 0 ;;
      --config) cfg=${args[i + 1]:-} ;;
      --config=*) cfg=${a#*=} ;;
    esac
  done
  [ -n "$cfg" ] && [ -f "$cfg" ] && grep -qE "^[[:space:]]*${name}[[:space:]]*=" "$cfg"
}

# The value of a flag given on the command line, else in the --config file, else $2.
flag_value() {
  local name=$1 a i cfg=""
  for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[i]}
    case "$a" in
      --"$name") echo "${args[i + 1]:-}"; return ;;
      --"$name"=*) echo "${a#*=}"; return ;;
      --config) cfg=${args[i + 1]:-} ;;
      --config=*) cfg=${a#*=} ;;
    esac
  done
  if [ -n "$cfg" ] && [ -f "$cfg" ] && grep -qE "^[[:space:]]*${name}[[:space:]]*=" "$cfg"; then
    sed -nE "s/^[[:space:]]*${name}[[:space:]]*=[[:space:]]*\"?([^\"#]*)\"?.*/\1/p" "$cfg" | head -1 | tr -d '[:space:]'
    return
  fi
  echo "$2"
}

CORES=$(nproc)
# The MPI the binary was built against: with ULFM (the default build) its own mpirun, with fault
# tolerance on, so a killed rank is survived (docs/real-failures.md).
MPI_PREFIX=$(dirname "$(dirname "$(ldd "$BIN" 2>/dev/null | awk '/libmpi\.so/ {print $3; exit}')")")
DEFAULT_MPIRUN=mpirun
if [ -x "$MPI_PREFIX/bin/ompi_info" ] && "$MPI_PREFIX/bin/ompi_info" 2>/dev/null | grep -q "FT MPI support: yes"; then
  DEFAULT_MPIRUN="$MPI_PREFIX/bin/mpirun --with-ft ulfm"
  # The launcher settings real failures need (jobs/prte-mca-params.conf says why).
  export PRTE_MCA_prte_allowed_exit_without_sync=1 PRTE_MCA_state_base_recoverable=1
fi
# shellcheck disable=SC2206  # MPIRUN may carry options
mpi=(${MPIRUN:-$DEFAULT_MPIRUN} -np "$RANKS")
extra=()
if ((RANKS > CORES)); then
  mpi+=(--oversubscribe --bind-to none)
  export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}   # no busy-polling on shared cores
  has_flag timing || extra+=(--timing paced)
  has_flag timing || has_flag time-scale || extra+=(--time-scale auto)   # rates slowed until real work fits
  note="$RANKS ranks > $CORES cores: oversubscribed, unbound$(has_flag timing || echo ', paced timing')"
  # The default custom machine (10 GFLOP/s, 5 us links) is no real machine: its microsecond
  # messages against the milliseconds they take among ranks sharing cores ask the time scale for
  # thousands, and the compute then crawls (a 40-step `small` run took hours). The demo's machine
  # and model shape have a real job's compute:communication ratio and calibrate near 128.
  named=0
  for f in machine emulate-shape device-gflops memory-gbps tp-gbps dp-gbps link-latency-us; do
    if has_flag "$f"; then named=1; fi
  done
  if ! has_flag timing && ((named == 0)); then
    preset=$(flag_value preset small)
    shape=gpt2-xl
    [[ "$preset" == llama* ]] && shape=llama-8b
    extra+=(--machine dgx-a100 --emulate-shape "$shape")
    note="$note on dgx-a100 charged as $shape (name --machine to choose)"
  fi
else
  mpi+=(--bind-to core --map-by core)
  note="$RANKS ranks <= $CORES cores: one core per rank"
fi
if ((RANKS >= CORES)); then THREADS=1; else THREADS=$((CORES / RANKS)); fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
mpi+=(-x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)
if ! has_flag threads; then extra+=(--threads "$THREADS"); fi
note="$note, $THREADS BLAS thread(s) per rank"
if ! has_flag out; then
  mkdir -p "$ROOT/results"
  extra+=(--out "$ROOT/results/local-$(date +%Y%m%d-%H%M%S).h5")
fi
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# shellcheck disable=SC2206
[ -n "${MPIRUN_ARGS:-}" ] && mpi+=(${MPIRUN_ARGS})

cmd=("${mpi[@]}" "$BIN" "${extra[@]}" "${args[@]}")
echo "run.sh: $note"
printf 'run.sh: +'; printf ' %q' "${cmd[@]}"; echo
[ "$DRY" = 1 ] && exit 0
exec "${cmd[@]}"
