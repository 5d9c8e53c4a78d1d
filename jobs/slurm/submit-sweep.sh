#!/usr/bin/env bash
# Submit a sweep: a job array with one task per line of SWEEPFILE (jobs/slurm/sweep.sbatch), then a
# report job that runs after every task has ended (--dependency=afterany:<arrayid>).
#
#   jobs/slurm/submit-sweep.sh SWEEPFILE [sbatch options for the array, e.g. --ntasks-per-node=4 -p gpu]
#
# Run it from the repository root. Everything lands in results/<name>-<arrayid>/ (name: sweep-<file
# stem>, or NTPBENCH_JOB_NAME): task-N.h5, task-N.out, env-task-N.txt, report.txt, report.csv.
# NTPBENCH_RESULTS changes the results root. Partition/account for both jobs: SBATCH_PARTITION,
# SBATCH_ACCOUNT (sbatch reads them). Prints the array id, the report job id and the directory; the
# last line is machine-readable: `ARRAY=<id> REPORT=<id> DIR=<path>`.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SWEEP=${1:?usage: submit-sweep.sh SWEEPFILE [sbatch options...]}
shift
[ -f "$SWEEP" ] || { echo "submit-sweep.sh: error: no sweep file $SWEEP" >&2; exit 2; }
n=$(grep -cvE '^[[:space:]]*(#|$)' "$SWEEP" || true)
[ "$n" -gt 0 ] || { echo "submit-sweep.sh: error: $SWEEP has no task lines" >&2; exit 2; }
stem=$(basename "$SWEEP"); stem=${stem%.*}
NAME=${NTPBENCH_JOB_NAME:-sweep-$stem}
RESULTS=${NTPBENCH_RESULTS:-$PWD/results}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)

# Held until its directory exists: the tasks' log files are opened there when they start.
arr=$(sbatch --parsable --hold --array="1-$n" --job-name="$NAME" --output="$RESULTS/$NAME-%A/task-%a.out" \
  "$@" "$HERE/sweep.sbatch" "$SWEEP")
arr=${arr%%;*}
DIR=$RESULTS/$NAME-$arr
mkdir -p "$DIR"
if ! rep=$(sbatch --parsable --dependency="afterany:$arr" --job-name="$NAME-report" --output="$DIR/report.txt" \
  "$HERE/report.sbatch" "$DIR" "$n"); then
  echo "submit-sweep.sh: error: could not submit the report job; cancelling array $arr" >&2
  scancel "$arr" || true
  exit 1
fi
rep=${rep%%;*}
scontrol release "$arr"
echo "submit-sweep.sh: array job $arr ($n tasks of $SWEEP), report job $rep after it; results in $DIR"
echo "ARRAY=$arr REPORT=$rep DIR=$DIR"
