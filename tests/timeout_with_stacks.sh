#!/usr/bin/env bash
# Usage: tests/timeout_with_stacks.sh SECONDS COMMAND [ARG...]
#
# timeout(1) for MPI jobs that may hang: runs COMMAND, and if it is still running after SECONDS,
# first prints on stderr where every thread of every process under it waits (gdb backtraces:
# mpirun, its daemon, each rank and each spawned replacement), then kills them all and exits 124.
# Otherwise exits with COMMAND's status. A hang in a real-failure test or a soak then leaves the
# ranks' stacks in the log instead of only "timed out".
set -u
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 SECONDS COMMAND [ARG...]" >&2
  exit 2
fi
limit=$1
shift

# Every process below $1 (children first found by their PPid in /proc).
descendants() {
  local parent=$1 pid ppid
  for status in /proc/[0-9]*/status; do
    pid=${status#/proc/}
    pid=${pid%/status}
    ppid=$(awk '/^PPid:/ {print $2}' "$status" 2>/dev/null) || continue
    if [ "$ppid" = "$parent" ]; then
      echo "$pid"
      descendants "$pid"
    fi
  done
}

print_stacks() {
  local pids=("$@") pid
  echo "timeout_with_stacks: still running after ${limit} s; the stacks of its ${#pids[@]} process(es):"
  for pid in "${pids[@]}"; do
    [ -r "/proc/$pid/comm" ] || continue
    echo "== pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null)): $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
    if command -v gdb > /dev/null; then
      timeout 60 gdb -nx -batch -p "$pid" -ex "thread apply all bt 30" 2>&1 |
        grep -E '^(Thread|#)' || echo "(gdb could not read it)"
    else
      echo "(no gdb: kernel stack only)"
      cat "/proc/$pid/stack" 2>/dev/null
    fi
  done
}

marker=$(mktemp)
rm -f "$marker"
"$@" &
child=$!
# Ctrl-C and TERM reach the command (a background job of a script would ignore SIGINT).
trap 'kill -TERM $child 2> /dev/null' INT TERM
(
  trap 'kill $nap 2> /dev/null; exit 0' TERM
  sleep "$limit" &
  nap=$!
  wait $nap
  kill -0 "$child" 2> /dev/null || exit 0
  touch "$marker"
  mapfile -t pids < <(echo "$child"; descendants "$child")
  print_stacks "${pids[@]}" >&2
  kill -KILL "${pids[@]}" 2> /dev/null
) &
watchdog=$!
wait "$child"
rc=$?
while kill -0 "$child" 2> /dev/null; do  # the wait was cut short by a forwarded signal
  wait "$child"
  rc=$?
done
kill "$watchdog" 2> /dev/null
wait "$watchdog" 2> /dev/null
if [ -e "$marker" ]; then
  rm -f "$marker"
  exit 124
fi
exit "$rc"
