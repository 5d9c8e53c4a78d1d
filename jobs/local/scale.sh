#!/usr/bin/env bash
# ntpbench against its number of ranks on this one host (make bench-scale; bench/README.md, "Many
# ranks"). For each rank count N: `--preset tiny --heads 64 --hidden 512` at TP N/4 x DP 4 under
# real kills (mpirun --with-ft ulfm), one rank of replica 0 killed at step 2 and revived (spawned) at
# step 4, then --replay of the run. Writes, per N, OUT/N.h5 (the run), OUT/N.json (what only this
# script sees: launch to exit, the host's memory in use sampled every 0.5 s, each ntpbench process's
# anonymous memory (RssAnon: its heap, stacks and private mappings, no mapped files) sampled with it,
# the exit statuses, the host's cores) and
# OUT/N.log; `python -m analysis scale OUT` makes the table.
#
#   jobs/local/scale.sh OUT [N ...]        (default N: 8 16 32 64 128 256)
#
# NTPBENCH: the binary (default build-cpu/ntpbench: a build without CUDA, whose processes do not map
# cuBLAS: docs/cluster.md, "Many ranks on one host"). MPIRUN: default the venv's mpirun.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:?usage: jobs/local/scale.sh OUT [N ...]}
shift
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(8 16 32 64 128 256)
BIN=${NTPBENCH:-$ROOT/build-cpu/ntpbench}
MPIRUN=${MPIRUN:-$ROOT/.venv/bin/mpirun}
[ -x "$BIN" ] || { echo "scale.sh: no binary at $BIN (make build BUILD=build-cpu CMAKE_FLAGS=-DNTPBENCH_CUDA=OFF)" >&2; exit 2; }
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export PRTE_MCA_prte_allowed_exit_without_sync=1 PRTE_MCA_state_base_recoverable=1

used_bytes() { awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{printf "%.0f\n", (t-a)*1024}' /proc/meminfo; }

# The largest RssAnon seen so far of each process of this binary (by its executable, so another
# job's ntpbench on the host is not counted), in bytes, keyed by PID.
BIN_REAL=$(readlink -f "$BIN")
declare -A anon
sample_anon() {
  local p a
  for p in $(pgrep -x ntpbench); do
    [ "$(readlink "/proc/$p/exe" 2> /dev/null)" = "$BIN_REAL" ] || continue
    a=$(awk '/^RssAnon:/{print $2 * 1024}' "/proc/$p/status" 2> /dev/null) || continue
    [ -n "$a" ] && [ "${anon[$p]:-0}" -lt "$a" ] && anon[$p]=$a
  done
  return 0
}
# The median over the processes of their largest sample (0: none seen).
median_anon() {
  [ ${#anon[@]} -gt 0 ] || { echo 0; return; }
  printf '%s\n' "${anon[@]}" | sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'
}

for n in "${COUNTS[@]}"; do
  if [ $((n % 4)) -ne 0 ] || [ $((64 % (n / 4))) -ne 0 ]; then
    echo "scale.sh: $n ranks: TP $((n / 4)) must divide the 64 heads (N = 4 x a power of two up to 256)" >&2
    exit 2
  fi
  tp=$((n / 4))
  sched="$OUT/$n.schedule.yaml"
  printf 'events:\n  - {step: 2, kill: [1]}\n  - {step: 4, revive: [1]}\n' > "$sched"
  rm -rf "$OUT/$n.h5" "$OUT/$n.ckpt"
  base=$(used_bytes)
  peak=$base
  anon=()
  start=$(date +%s.%N)
  "$MPIRUN" --with-ft ulfm --oversubscribe --bind-to none -np "$n" "$BIN" --preset tiny --heads 64 --hidden 512 \
    --tp "$tp" --steps 6 --threads 1 --quiet --kill-mode signal --policy ntp --schedule "$sched" \
    --out "$OUT/$n.h5" > "$OUT/$n.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    u=$(used_bytes)
    [ "$u" -gt "$peak" ] && peak=$u
    sample_anon
    sleep 0.5
  done
  rc=0
  wait "$pid" || rc=$?
  end=$(date +%s.%N)
  replay_rc=0
  "$BIN" --replay "$OUT/$n.h5" > "$OUT/$n.replay.log" 2>&1 || replay_rc=$?
  printf '{"ranks": %d, "tp": %d, "cores": %d, "launch_to_exit_seconds": %s, "host_used_bytes_before": %d, "host_used_bytes_peak": %d, "anon_bytes_median": %d, "anon_processes": %d, "mpirun_exit": %d, "replay_exit": %d}\n' \
    "$n" "$tp" "$(getconf _NPROCESSORS_ONLN)" "$(echo "$end - $start" | bc)" "$base" "$peak" "$(median_anon)" "${#anon[@]}" \
    "$rc" "$replay_rc" > "$OUT/$n.json"
  echo "scale.sh: $n ranks (TP $tp x DP 4): mpirun exit $rc, replay exit $replay_rc, $(cat "$OUT/$n.json")"
done
