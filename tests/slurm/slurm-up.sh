#!/usr/bin/env bash
# Start a private single-node Slurm on localhost (munged, slurmctld, slurmd), for the tests.
#
#   tests/slurm/slurm-up.sh [DIR]      # DIR: where config, state, logs and PIDs go (default: mktemp -d)
#   export SLURM_CONF=DIR/slurm.conf   # (or: source DIR/env.sh) then sbatch/squeue/sinfo talk to it
#   tests/slurm/slurm-down.sh DIR      # stops exactly the daemons this script started
#
# Works as root on Debian 12 without systemd. Installs `slurm-wlm munge` with apt-get when slurmctld
# is missing. Nothing outside DIR is touched except creating /etc/munge/munge.key when it is absent.
# munged runs as the munge user on its own socket in DIR; slurmctld and slurmd get free TCP ports, so
# this cluster does not collide with a system Slurm or another instance of itself.
#
# The node offers SLURM_TEST_CPUS CPUs (default 8) whatever the machine has
# (SlurmdParameters=config_overrides), so 8-rank jobs fit on a 2-core box.
#
# Exit status: 0 up (the node is idle; last line of stdout is SLURM_CONF=...); 77 Slurm is not
# installed and cannot be installed here (not root, no apt-get, or apt-get failed); anything else: it
# was installed but did not start (the daemons started so far are stopped again, logs stay in DIR).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CPUS=${SLURM_TEST_CPUS:-8}
WAIT=${SLURM_TEST_WAIT:-60}

log() { echo "slurm-up: $*" >&2; }

# --- packages --------------------------------------------------------------------------------------
need_install=0
for b in slurmctld slurmd sbatch munged; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || need_install=1
done
if [ "$need_install" = 1 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "Slurm is not installed and this is not root on a Debian-like system: cannot install slurm-wlm munge"
    exit 77
  fi
  log "installing slurm-wlm munge"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq slurm-wlm munge >&2; then
    apt-get update -qq >&2 && apt-get install -y -qq slurm-wlm munge >&2 || { log "apt-get install slurm-wlm munge failed"; exit 77; }
  fi
fi
export PATH="$PATH:/usr/sbin:/sbin"
if [ "$(id -u)" != 0 ]; then
  log "must run as root (munged runs as the munge user, slurmd as root)"
  exit 77
fi
if ! id munge >/dev/null 2>&1; then
  log "no munge user (the munge package creates it)"
  exit 77
fi

# --- directory and cleanup on failure --------------------------------------------------------------
DIR=${1:-$(mktemp -d /tmp/ntpbench-slurm.XXXXXX)}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
: > "$DIR/pids"
# munged's socket, PID and seed live in a short directory of their own under /tmp: the munge user
# must reach it (DIR may sit below a private directory, e.g. pytest's), and a socket path is limited
# to 108 bytes. slurm-down.sh removes it.
MUNGE_DIR=$(mktemp -d /tmp/ntpbench-munge.XXXXXX)
echo "$MUNGE_DIR" > "$DIR/munge.dir"

ok=0
cleanup() {
  if [ "$ok" != 1 ]; then
    log "start failed; stopping what was started (logs kept in $DIR/log)"
    for f in "$DIR"/log/*; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
    "$HERE/slurm-down.sh" "$DIR" >&2 || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

record() { echo "$1 $2" >> "$DIR/pids"; }   # PID NAME, in start order

# --- munge -----------------------------------------------------------------------------------------
KEY=/etc/munge/munge.key
if [ ! -s "$KEY" ]; then
  log "creating $KEY"
  install -d -o munge -g munge -m 0700 /etc/munge
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile="$KEY" --force
  else
    dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none
  fi
fi
chown munge:munge "$KEY" && chmod 0400 "$KEY"
chown munge:munge "$MUNGE_DIR" && chmod 0755 "$MUNGE_DIR"
SOCK="$MUNGE_DIR/munge.socket"
setpriv --reuid=munge --regid=munge --init-groups \
  munged --foreground --force --socket="$SOCK" --key-file="$KEY" \
  --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
  > "$DIR/log/munged.stdout" 2>&1 &
record $! munged
for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
if ! munge -n -S "$SOCK" | unmunge -S "$SOCK" >/dev/null; then
  log "munged did not come up"
  exit 1
fi

# --- slurm.conf ------------------------------------------------------------------------------------
read -r CTLD_PORT SLURMD_PORT < <(python3 - <<'EOF'
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
EOF
)
: > "$DIR/plugstack.conf"
cat > "$DIR/slurm.conf" <<EOF
# Private single-node test cluster written by tests/slurm/slurm-up.sh; stop it with slurm-down.sh.
ClusterName=ntpbench-test
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/plugstack.conf
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
InactiveLimit=0
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$DIR/slurm.conf"
cat > "$DIR/env.sh" <<EOF
export SLURM_CONF=$DIR/slurm.conf
EOF

# --- daemons ---------------------------------------------------------------------------------------
slurmctld -D -i -f "$SLURM_CONF" > "$DIR/log/slurmctld.stdout" 2>&1 &
record $! slurmctld
up=0
for _ in $(seq $((WAIT * 4))); do
  if scontrol ping 2>/dev/null | grep -q 'is UP'; then up=1; break; fi
  kill -0 "$(awk '$2=="slurmctld"{print $1}' "$DIR/pids")" 2>/dev/null || break
  sleep 0.25
done
[ "$up" = 1 ] || { log "slurmctld did not answer within ${WAIT}s"; exit 1; }

slurmd -D -N localhost -f "$SLURM_CONF" > "$DIR/log/slurmd.stdout" 2>&1 &
record $! slurmd
state=""
for _ in $(seq $((WAIT * 4))); do
  state=$(sinfo -h -n localhost -o %T 2>/dev/null | head -n 1 || true)
  case "$state" in idle) break ;; esac
  kill -0 "$(awk '$2=="slurmd"{print $1}' "$DIR/pids")" 2>/dev/null || { log "slurmd exited"; exit 1; }
  sleep 0.25
done
if [ "$state" != idle ]; then
  log "node localhost is '${state:-absent}', not idle, after ${WAIT}s"
  exit 1
fi

ok=1
log "up: node localhost idle with $CPUS CPUs; ports $CTLD_PORT/$SLURMD_PORT; pmix: $(srun --mpi=list 2>&1 | grep -c pmix) plugin(s)"
echo "SLURM_DIR=$DIR"
echo "SLURM_CONF=$DIR/slurm.conf"
