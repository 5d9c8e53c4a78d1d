#!/usr/bin/env bash
# `make fuzz`: each libFuzzer target of BUILD (fuzz/CMakeLists.txt) first runs every input of its
# seed corpus (fuzz/corpus/<target>/) and of its regressions (fuzz/regressions/<target>/: inputs
# that once crashed it), then fuzzes for SECONDS. New inputs it finds go to BUILD/corpus/<target>/
# (kept between runs, never into the tree); a crash, a leak, a timeout or an out-of-memory writes
# the input to BUILD/artifacts/<target>/ and fails the run.
#   usage: fuzz/run.sh BUILD SECONDS
set -uo pipefail
build=$(cd "$1" && pwd)
seconds=$2
here=$(cd "$(dirname "$0")" && pwd)
# allocator_may_return_null=1 and -malloc_limit_mb: HDF5 sizes its metadata cache entries from the
# file, so a damaged size asks malloc for terabytes; as in a plain build, malloc then fails and
# HDF5 returns an error (ASan would abort, libFuzzer call it out of memory). Our own allocations
# are C++ `new`, which throws: that escapes the target and fails the run. -rss_limit_mb (2 GiB)
# still catches memory really used.
export ASAN_OPTIONS="suppressions=$here/asan.supp:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export OMP_NUM_THREADS=1
export TMPDIR=$build/tmp  # where the targets write each input to load it (fuzz/temp_file.hpp)
mkdir -p "$TMPDIR"
failed=()
for target in schedule config checkpoint; do
  mkdir -p "$build/corpus/$target" "$build/artifacts/$target"
  inputs=("$here/corpus/$target")
  [ -d "$here/regressions/$target" ] && inputs+=("$here/regressions/$target")
  echo "== fuzz_$target: $seconds s"
  # -timeout: an input takes well under 1 s, but on a loaded machine one waited 52 s in open() for
  # its temporary file; a loop that never ends still fails the run after 120 s.
  # FUZZ_SEED (CI sets it): the same mutation sequence each run, so CI does not wander into
  # another of HDF5's own decoder bugs (README) by chance; unset, libFuzzer picks a seed.
  if "$build/fuzz_$target" ${FUZZ_SEED:+-seed="$FUZZ_SEED"} -max_total_time="$seconds" -timeout=120 -malloc_limit_mb=1000000 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/$target/" "$build/corpus/$target" "${inputs[@]}" \
       > "$build/fuzz_$target.log" 2>&1; then
    grep -E '^(#[0-9]+[[:space:]]+DONE|stat::(number_of_executed_units|average_exec_per_sec|new_units_added))' "$build/fuzz_$target.log"
  else
    grep -v '^#' "$build/fuzz_$target.log" | tail -n 60
    echo "fuzz_$target FAILED: the input is in $build/artifacts/$target/ (log: $build/fuzz_$target.log)"
    failed+=("$target")
  fi
done
[ ${#failed[@]} = 0 ] || { echo "fuzz: FAILED: ${failed[*]}"; exit 1; }
echo "fuzz: no crashes in ${seconds} s per target"
