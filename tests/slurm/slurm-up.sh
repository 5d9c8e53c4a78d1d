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
# shellcheck source=SCRIPTDIR/slurm-lib.sh
. "$HERE/slurm-lib.sh"

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
undo_on_failure "$HERE/slurm-down.sh" "stopping what was started"

# --- munge -----------------------------------------------------------------------------------------
start_munged

# --- slurm.conf ------------------------------------------------------------------------------------
read -r CTLD_PORT SLURMD_PORT < <(python3 - <<'EOF'
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
EOF
)
write_slurm_conf "HEADER=Private single-node test cluster written by tests/slurm/slurm-up.sh; stop it with slurm-down.sh." \
  CLUSTER_NAME=ntpbench-test CONTROLLER=localhost "CTLD_PORT=$CTLD_PORT" "SLURMD_PORT=$SLURMD_PORT" MPI_DEFAULT=pmix \
  "SLURMD_PID_FILE=$DIR/slurmd.pid" "SLURMD_LOG_FILE=$DIR/log/slurmd.log" NODES=localhost NODE_ADDRS=127.0.0.1
cat > "$DIR/env.sh" <<EOF
export SLURM_CONF=$DIR/slurm.conf
EOF

# --- daemons ---------------------------------------------------------------------------------------
start_slurmctld

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
