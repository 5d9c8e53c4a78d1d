# shellcheck shell=bash
# Sourced by the test clusters' start scripts (tests/slurm/slurm-up.sh, tests/cluster/cluster-up.sh):
# what both do alike. The caller defines log MESSAGE, and sets DIR (config, state, logs) and WAIT
# (seconds a daemon may take).

SLURM_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# record PID NAME: a daemon started, in start order (DIR/pids, read by the down scripts).
record() { echo "$1 $2" >> "$DIR/pids"; }

# undo_on_failure DOWN_SCRIPT WHAT: unless the script has set ok=1 by the time it exits, the exit
# shows the tail of every log in DIR/log and runs DOWN_SCRIPT DIR, which undoes WHAT was done so far.
undo_on_failure() {
  ok=0
  UNDO_SCRIPT=$1 UNDO_WHAT=$2
  trap undo_unless_ok EXIT
  trap 'exit 130' INT TERM
}
undo_unless_ok() {
  [ "$ok" = 1 ] && return
  log "start failed; $UNDO_WHAT (logs kept in $DIR/log)"
  for f in "$DIR"/log/*; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
  "$UNDO_SCRIPT" "$DIR" >&2 || true
}

# A private munged as the munge user, on a socket of its own: sets MUNGE_DIR and SOCK. Its socket,
# PID and seed live in a short directory under /tmp (recorded in DIR/munge.dir; the down scripts
# remove it): the munge user must reach it (DIR may sit below a private directory, e.g. pytest's),
# and a socket path is limited to 108 bytes. Creates /etc/munge/munge.key when it is absent.
start_munged() {
  MUNGE_DIR=$(mktemp -d /tmp/ntpbench-munge.XXXXXX)
  echo "$MUNGE_DIR" > "$DIR/munge.dir"
  local key=/etc/munge/munge.key
  if [ ! -s "$key" ]; then
    log "creating $key"
    install -d -o munge -g munge -m 0700 /etc/munge
    if command -v mungekey >/dev/null 2>&1; then
      mungekey --create --keyfile="$key" --force
    else
      dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
    fi
  fi
  chown munge:munge "$key" && chmod 0400 "$key"
  chown munge:munge "$MUNGE_DIR" && chmod 0755 "$MUNGE_DIR"
  SOCK=$MUNGE_DIR/munge.socket
  setpriv --reuid=munge --regid=munge --init-groups \
    munged --foreground --force --socket="$SOCK" --key-file="$key" --pid-file="$MUNGE_DIR/munged.pid" \
    --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" > "$DIR/log/munged.stdout" 2>&1 &
  record $! munged
  for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
  munge -n -S "$SOCK" | unmunge -S "$SOCK" >/dev/null || { log "munged did not come up"; exit 1; }
}

# write_slurm_conf NAME=VALUE...: DIR/slurm.conf from slurm.conf.in, each @NAME@ replaced by VALUE
# (@DIR@, @MUNGE_SOCKET@ and @CPUS@ from DIR, SOCK and CPUS unless given), and an empty
# DIR/plugstack.conf. Sets and exports SLURM_CONF. Fails on a placeholder left unfilled.
write_slurm_conf() {
  local text kv
  text=$(< "$SLURM_LIB_DIR/slurm.conf.in")
  for kv in "$@" "DIR=$DIR" "MUNGE_SOCKET=$SOCK" "CPUS=$CPUS"; do
    text=${text//"@${kv%%=*}@"/"${kv#*=}"}   # quoted: a value's & or * stays literal
  done
  if [[ $text =~ @[A-Z_]+@ ]]; then log "slurm.conf.in: ${BASH_REMATCH[0]} has no value"; exit 1; fi
  : > "$DIR/plugstack.conf"
  printf '%s\n' "$text" > "$DIR/slurm.conf"
  export SLURM_CONF=$DIR/slurm.conf
}

# slurmctld in the foreground of a background job, until it answers a ping (at most WAIT s).
start_slurmctld() {
  slurmctld -D -i -f "$SLURM_CONF" > "$DIR/log/slurmctld.stdout" 2>&1 &
  record $! slurmctld
  local up=0
  for _ in $(seq $((WAIT * 4))); do
    scontrol ping 2>/dev/null | grep -q 'is UP' && { up=1; break; }
    kill -0 "$(awk '$2=="slurmctld"{print $1}' "$DIR/pids")" 2>/dev/null || break
    sleep 0.25
  done
  [ "$up" = 1 ] || { log "slurmctld did not answer within ${WAIT}s"; exit 1; }
}
