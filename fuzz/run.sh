#!/usr/bin/env bash
# `make fuzz`: each libFuzzer target of BUILD (fuzz/CMakeLists.txt) first runs every input of its
# seed corpus (fuzz/corpus/<target>/) and of its regressions (fuzz/regressions/<target>/: inputs
# that once crashed it), then fuzzes for SECONDS. New inputs it finds go to BUILD/corpus/<target>/
# (kept between runs, never into the tree); a crash, a leak, a timeout or an out-of-memory writes
# the input to BUILD/artifacts/<target>/ and fails the run, except a read fault inside HDF5's own
# decoders (fuzz/hdf5_fault.sh), which is reported and fuzzing goes on.
#   usage: fuzz/run.sh BUILD SECONDS
set -uo pipefail
build=$(cd "$1" && pwd)
seconds=$2
here=$(cd "$(dirname "$0")" && pwd)
# allocator_may_return_null=1 and -malloc_limit_mb: HDF5 sizes its metadata cache entries from the
# file, so a damaged size asks malloc for terabytes; as in a plain build, malloc then fails and
# HDF5 returns an error (ASan would abort, libFuzzer call it out of memory). Our own allocations
# are C++ `new`, which throws: that escapes the target and fails the run. -rss_limit_mb (2 GiB)
# still catches memory really used. max_allocation_size_mb: ASan grants up to 1 TiB, so a damaged
# local heap's size (21 GiB, regressions/checkpoint/oom-local-heap-21gib.h5) was granted, and HDF5
# touched 2.6 GiB of it over 22 s; a 1 GiB cap fails it as a plain build short of memory would
# (no allocation of ours or HDF5's for a fuzzed checkpoint comes near it).
export ASAN_OPTIONS="suppressions=$here/asan.supp:allocator_may_return_null=1:max_allocation_size_mb=1024"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export OMP_NUM_THREADS=1
export TMPDIR=$build/tmp  # where the targets write each input to load it (fuzz/temp_file.hpp)
mkdir -p "$TMPDIR"
failed=()
hdf5_faults=()
# fuzz TARGET SECONDS ROUND LOG: one libFuzzer run of TARGET over its corpus for SECONDS.
fuzz() {
  local target=$1 secs=$2 round=$3 log=$4 seed=${FUZZ_SEED:-}
  [ -n "$seed" ] && seed=$((seed + round))
  local inputs=("$here/corpus/$target")
  [ -d "$here/regressions/$target" ] && inputs+=("$here/regressions/$target")
  # -timeout: an input takes well under 1 s, but on a loaded machine one waited 52 s in open() for
  # its temporary file; a loop that never ends still fails the run after 120 s.
  # FUZZ_SEED (CI sets it): the same mutation sequence each run; a restart after one of HDF5's own
  # faults (below) takes the next seed.
  "$build/fuzz_$target" ${seed:+-seed="$seed"} -max_total_time="$secs" -timeout=120 -malloc_limit_mb=1000000 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$target/" "$build/corpus/$target" "${inputs[@]}" > "$log" 2>&1
}
for target in schedule config checkpoint; do
  mkdir -p "$build/corpus/$target" "$build/artifacts/$target"
  echo "== fuzz_$target: $seconds s"
  # A fault inside HDF5's own decoders on a damaged checkpoint (fuzz/hdf5_fault.sh says which) is
  # not ours to fix: it is counted, its input kept, and fuzzing goes on for the time left, from the
  # corpus grown so far. At most 20 such restarts; any other failure ends the target's run.
  end=$((SECONDS + seconds)) round=0
  while :; do
    log="$build/fuzz_$target.log"
    [ "$round" -gt 0 ] && log="$build/fuzz_$target.$round.log"
    left=$((end - SECONDS))
    [ "$left" -ge 1 ] || left=1
    if fuzz "$target" "$left" "$round" "$log"; then
      grep -E '^(#[0-9]+[[:space:]]+DONE|stat::(number_of_executed_units|average_exec_per_sec|new_units_added))' "$log"
      break
    fi
    if [ "$target" = checkpoint ] && [ "$round" -lt 20 ] && "$here/hdf5_fault.sh" "$log"; then
      input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
      echo "   HDF5's own read fault (not ours; docs/checks.md): $(grep -m1 'SUMMARY: AddressSanitizer' "$log" | cut -c1-120)"
      echo "   input: $input (log: $log); fuzzing on"
      hdf5_faults+=("$input")
      round=$((round + 1))
      [ $((end - SECONDS)) -ge 1 ] && continue
      break
    fi
    grep -v '^#' "$log" | tail -n 60
    echo "fuzz_$target FAILED: the input is in $build/artifacts/$target/ (log: $log)"
    failed+=("$target")
    break
  done
done
[ ${#hdf5_faults[@]} = 0 ] || echo "fuzz: ${#hdf5_faults[@]} fault(s) inside HDF5's own decoders (not ours): ${hdf5_faults[*]}"
[ ${#failed[@]} = 0 ] || { echo "fuzz: FAILED: ${failed[*]}"; exit 1; }
echo "fuzz: no crashes of ours in ${seconds} s per target"
