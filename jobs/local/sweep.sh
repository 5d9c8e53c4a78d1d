#!/usr/bin/env bash
# Run a sweep file serially on this machine (jobs/local/run.sh per line), then print the report.
#
#   jobs/local/sweep.sh SWEEPFILE [-n RANKS] [-o DIR]
#   jobs/local/sweep.sh jobs/sweeps/policies.txt
#
# Sweep file: the same format jobs/slurm/sweep.sbatch reads: one ntpbench command line per task
# (flags split on whitespace, no quoting); blank lines and # comments skipped; paths relative to
# the current directory (run from the repository root). Task N writes DIR/task-N.h5 (DIR default
# results/sweep-<file stem>-<date>-<time>/) and its log DIR/task-N.out. Every rank count is RANKS
# (-n, else $RANKS, else 8). A failing task is reported and the sweep goes on; the exit status is
# non-zero when any task or the report failed. The report (`python3 -m analysis report`, the
# repository's .venv python when present) is printed and saved as DIR/report.txt and report.csv.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SWEEP=""
OUTDIR=""
RANKS=${RANKS:-8}
while [ $# -gt 0 ]; do
  case "$1" in
    -n | -np) RANKS=${2:?}; shift 2 ;;
    -o | --out-dir) OUTDIR=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) [ -z "$SWEEP" ] || { echo "sweep.sh: error: unexpected argument $1" >&2; exit 2; }; SWEEP=$1; shift ;;
  esac
done
[ -n "$SWEEP" ] && [ -f "$SWEEP" ] || { echo "usage: sweep.sh SWEEPFILE [-n RANKS] [-o DIR]" >&2; exit 2; }
stem=$(basename "$SWEEP"); stem=${stem%.*}
OUTDIR=${OUTDIR:-$ROOT/results/sweep-$stem-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUTDIR"
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY=$ROOT/.venv/bin/python

mapfile -t lines < <(grep -vE '^[[:space:]]*(#|$)' "$SWEEP")
n=${#lines[@]}
[ "$n" -gt 0 ] || { echo "sweep.sh: error: $SWEEP has no task lines" >&2; exit 2; }
failed=0
files=()
for ((i = 1; i <= n; i++)); do
  line=${lines[i - 1]}
  read -r -a flags <<< "$line"
  out="$OUTDIR/task-$i.h5"
  echo "sweep.sh: task $i/$n: $line"
  start=$SECONDS
  extra=(--out "$out" --overwrite)
  case " $line " in *" --out "* | *" --out="*) echo "sweep.sh: error: task $i sets --out; sweep lines must not (each task writes DIR/task-N.h5)" >&2; exit 2 ;; esac
  case " $line " in *" --overwrite "*) extra=(--out "$out") ;; esac
  if "$ROOT/jobs/local/run.sh" -n "$RANKS" "${extra[@]}" "${flags[@]}" > "$OUTDIR/task-$i.out" 2>&1; then
    echo "sweep.sh: task $i/$n done in $((SECONDS - start)) s: $(grep -E '^done' "$OUTDIR/task-$i.out" | tail -n 1)"
  else
    echo "sweep.sh: task $i/$n FAILED (exit $?); last lines of $OUTDIR/task-$i.out:" >&2
    tail -n 8 "$OUTDIR/task-$i.out" >&2
    failed=$((failed + 1))
  fi
  [ -f "$out" ] && files+=("$out")
done

echo "sweep.sh: $((n - failed))/$n tasks succeeded; results in $OUTDIR"
rc=0
if [ ${#files[@]} -gt 0 ]; then
  (cd "$ROOT" && "$PY" -m analysis report "${files[@]}" --csv "$OUTDIR/report.csv") 2>&1 | tee "$OUTDIR/report.txt"
  rc=${PIPESTATUS[0]}
else
  echo "sweep.sh: no results files to report" >&2; rc=1
fi
[ "$failed" = 0 ] && [ "$rc" = 0 ]
