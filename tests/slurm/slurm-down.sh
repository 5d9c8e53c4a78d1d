#!/usr/bin/env bash
# Stop the single-node Slurm that tests/slurm/slurm-up.sh started in DIR.
#
#   tests/slurm/slurm-down.sh DIR [--clean]
#
# Cancels the cluster's jobs (so their slurmstepd processes end), then stops the daemons listed in
# DIR/pids — and only those: each PID is signalled only while /proc/PID/comm still names the daemon
# that was started (no pkill, no killall). TERM first, KILL after 10 s. --clean removes DIR after.
# Safe to run twice and on a half-started cluster.
set -uo pipefail
DIR=${1:?usage: slurm-down.sh DIR [--clean]}
CLEAN=${2:-}
export PATH="$PATH:/usr/sbin:/sbin"
[ -d "$DIR" ] || { echo "slurm-down: no such directory $DIR" >&2; exit 0; }
PIDS="$DIR/pids"

alive() {  # PID NAME: is PID still the daemon we started?
  local comm
  comm=$(cat "/proc/$1/comm" 2>/dev/null) || return 1
  [ "$comm" = "$2" ] || [ "${2:0:15}" = "$comm" ]
}

if [ -f "$DIR/slurm.conf" ] && [ -f "$PIDS" ] && awk '$2=="slurmctld"' "$PIDS" | grep -q .; then
  export SLURM_CONF="$DIR/slurm.conf"
  read -r ctld _ < <(awk '$2=="slurmctld"' "$PIDS")
  if alive "$ctld" slurmctld; then
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null
      for _ in $(seq 40); do
        [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
        sleep 0.25
      done
    fi
  fi
fi

stop() {  # NAME...: TERM every listed daemon of these names, wait for them all, KILL stragglers
  local pid name line targets=()
  while read -r pid name; do
    for want in "$@"; do
      [ "$name" = "$want" ] && alive "$pid" "$name" && { kill -TERM "$pid" 2>/dev/null; targets+=("$pid $name"); }
    done
  done < "$PIDS"
  for _ in $(seq 40); do
    local any=0
    for line in "${targets[@]}"; do read -r pid name <<< "$line"; alive "$pid" "$name" && any=1; done
    [ "$any" = 0 ] && return
    sleep 0.25
  done
  for line in "${targets[@]}"; do
    read -r pid name <<< "$line"
    if alive "$pid" "$name"; then
      echo "slurm-down: $name ($pid) ignored TERM for 10 s; sending KILL" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
  done
}
if [ -f "$PIDS" ]; then
  stop slurmd slurmctld   # together (each takes ~2 s to save state and exit)
  stop munged             # last: the Slurm daemons authenticate through it until they are gone
  # Reap the background children when the caller is the shell that started them (slurm-up's trap).
  wait 2>/dev/null
fi
if [ -f "$DIR/munge.dir" ]; then
  md=$(cat "$DIR/munge.dir")
  case "$md" in
    /tmp/ntpbench-munge.*) cp "$md/munged.log" "$DIR/log/munged.log" 2>/dev/null; rm -rf "$md" ;;
  esac
fi
echo "slurm-down: stopped the daemons of $DIR" >&2
if [ "$CLEAN" = --clean ]; then rm -rf "$DIR"; fi
exit 0
