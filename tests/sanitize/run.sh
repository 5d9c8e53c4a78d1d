#!/usr/bin/env bash
# `make test-sanitize`: runs the AddressSanitizer + UndefinedBehaviorSanitizer build (BUILD, made by
# the Makefile with -DNTPBENCH_SANITIZE=ON) through the CTest suite, then a 4-rank job in which a
# rank really dies (SIGKILL) and is revived as a spawned process of the same sanitized binary, then
# --replay of that job on one rank. Fails on any sanitizer report, from any process, including
# ones whose exit status the launcher does not pass on (a spawned rank, a survivor): ASan and LSan
# write each report to a file under BUILD/sanitize-logs/, UBSan prints it, and a file there or a
# report in any output fails the run. UBSan is built with -fno-sanitize-recover=all: a report aborts.
#   usage: tests/sanitize/run.sh BUILD MPIRUN...
set -uo pipefail
build=$(cd "$1" && pwd); shift
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
logs=$build/sanitize-logs
work=$build/sanitize-run
rm -rf "$logs" "$work" && mkdir -p "$logs" "$work"

# fast_unwind_on_malloc=0: whole stacks through Open MPI (built without frame pointers), which the
# suppressions in lsan.supp match on. Leak detection stays on everywhere (ASan's default).
export ASAN_OPTIONS="log_path=$logs/asan:fast_unwind_on_malloc=0:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# PMIx's shared-memory store maps its segment at a fixed address inside ASan's shadow memory, so a
# spawned process (a revived rank) fails MPI_Init; its hash store has no fixed address.
export PMIX_MCA_gds=hash
# The launcher settings real failures need: the venv's Open MPI has them (jobs/prte-mca-params.conf).
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

status=0
fail() { echo "test-sanitize: FAILED: $*" >&2; status=1; }

echo "== CTest under ASan + UBSan"
if (cd "$build" && ctest -V > "$work/ctest.log" 2>&1); then grep -A2 "tests passed" "$work/ctest.log"
else tail -n 150 "$work/ctest.log"; fail "ctest (whole output: $work/ctest.log)"; fi

echo "== 4 ranks (TP 2 x DP 2): rank 3 killed inside step 3's backward, revived at step 6"
printf 'events:\n  - {step: 3, kill: [3], at: backward}\n  - {step: 6, revive: [3]}\n' > "$work/schedule.yaml"
"${mpirun[@]}" -np 4 "$build/ntpbench" --preset tiny --tp 2 --micro-batch 4 --steps 8 --kill-mode signal \
  --policy ntp --schedule "$work/schedule.yaml" --out "$work/run.h5" > "$work/run.log" 2>&1 || fail "the job exited $?"
cat "$work/run.log"
grep -q 'rank(s) \[3\] died' "$work/run.log" || fail "rank 3 did not die"
grep -q 'revive \[3\]' "$work/run.log" || fail "rank 3 was not revived"
echo "== --replay on one rank"
"$build/ntpbench" --replay "$work/run.h5" --quiet > "$work/replay.log" 2>&1 || fail "--replay exited $?"
cat "$work/replay.log"
grep -q AGREES "$work/replay.log" || fail "--replay does not agree"

# UBSan (gcc's runtime) prints to stderr whatever log_path says: look in every output as well.
reports=$(find "$logs" -type f | sort)
marks='runtime error:|ERROR: (Address|Leak)Sanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer'
outputs=$(grep -l -E "$marks" "$work"/*.log)
for f in $reports; do echo "---- $f"; cat "$f"; done
for f in $outputs; do echo "---- $f"; grep -E -A12 "$marks" "$f"; done
[ -z "$reports$outputs" ] || fail "sanitizer reports in: $(echo $reports $outputs) (suppressions: $here/lsan.supp)"
[ $status = 0 ] && echo "test-sanitize: no sanitizer reports"
exit $status
