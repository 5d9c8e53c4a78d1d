#!/usr/bin/env bash
# A Slurm cluster of N nodes on this one machine, for the multi-node tests.
#
#   tests/cluster/cluster-up.sh [N] [DIR]   # N nodes (default 3); DIR: config, state, logs (default mktemp -d)
#   source DIR/env.sh                       # SLURM_CONF, CLUSTER_DIR: sbatch/squeue/sinfo talk to it
#   tests/cluster/cluster-exec.sh DIR node2 CMD...   # run CMD on node2 (its network, hostname, /etc/hosts)
#   tests/cluster/cluster-down.sh DIR       # removes every namespace, link, bridge and daemon made here
#
# Node K (node1..nodeN) is a network namespace named nodeK, joined by a veth pair to a bridge this
# script creates in the root namespace; addresses live only on those links: 10.77.0.K/24 in the
# node, 10.77.0.254/24 on the bridge (CLUSTER_NET changes the 10.77.0 prefix). Each node also has a
# UTS namespace of its own, held by a bind mount in DIR/uts/nodeK, whose hostname is nodeK: the
# processes of a node (slurmd, the job steps it starts, MPI ranks) see `hostname` = nodeK, so
# Open MPI and ntpbench's /ranks tell the nodes apart as they would on real hardware.
#
# Names: Slurm reaches every node by address (NodeAddr=10.77.0.K) and Open MPI exchanges addresses,
# so nothing needs the names resolved in the root namespace. Inside a node, DIR/hosts (the machine's
# /etc/hosts plus one line per node) is bind-mounted over /etc/hosts in that node's private mount
# namespace (cluster-exec.sh makes one per command it runs on a node, as `unshare --mount`): the
# machine's /etc/hosts is never written, and nothing is created under /etc.
#
# One slurmctld (root namespace, listening on the bridge address too), one slurmd per node started
# inside its namespaces with -N nodeK, a private munged shared by all. The machine's cores are split
# between the nodes where there are enough (node K's slurmd, and so its jobs, pinned with taskset to
# its share); Slurm sees CLUSTER_CPUS CPUs per node (default: the node's share of cores, at least 8
# so jobs/slurm/ntpbench.sbatch's default of 8 ranks per node fits; SlurmdParameters=config_overrides
# lets a node offer more CPUs than it has, as on an oversubscribed test machine). Every process started
# is recorded in DIR/pids, every link, namespace and mount in DIR/objects; cluster-down.sh stops and
# removes exactly those. A failed start removes what it made (trap).
#
# Exit status: 0 up (every node idle; the last lines of stdout are CLUSTER_DIR=... and SLURM_CONF=...);
# 77 cannot run here (not root, no `ip netns`, Slurm absent and not installable, a node1.. namespace
# or the subnet already in use); anything else: it did not start (logs stay in DIR/log).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
N=${1:-3}
NET=${CLUSTER_NET:-10.77.0}
WAIT=${CLUSTER_WAIT:-60}
export PATH="$PATH:/usr/sbin:/sbin"
log() { echo "cluster-up: $*" >&2; }
# shellcheck source=SCRIPTDIR/../slurm/slurm-lib.sh
. "$HERE/../slurm/slurm-lib.sh"
[[ "$N" =~ ^[1-9][0-9]?$ ]] && ((N <= 200)) || { log "node count '$N' must be 1..200"; exit 2; }

# --- what this needs -------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || { log "must run as root (network namespaces, bridges, slurmd)"; exit 77; }
for b in ip unshare nsenter; do command -v "$b" >/dev/null || { log "'$b' is missing"; exit 77; }; done
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || { log "Slurm is not installed and there is no apt-get"; exit 77; }
  log "installing slurm-wlm munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >&2 ||
    { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >&2; } ||
    { log "apt-get install slurm-wlm munge failed"; exit 77; }
fi
id munge >/dev/null 2>&1 || { log "no munge user (the munge package creates it)"; exit 77; }
for k in $(seq "$N"); do
  [ -e "/run/netns/node$k" ] && { log "a network namespace node$k exists already (another cluster? cluster-down.sh it)"; exit 77; }
done
if ip -4 addr show | grep -q "inet $NET\."; then
  log "addresses in $NET.0/24 exist already on this machine (set CLUSTER_NET to another /24 prefix)"
  exit 77
fi

# --- directory, bookkeeping and cleanup on failure -------------------------------------------------
DIR=${2:-$(mktemp -d /tmp/ntpbench-cluster.XXXXXX)}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
mkdir -p "$DIR/state" "$DIR/log" "$DIR/uts"
for k in $(seq "$N"); do mkdir -p "$DIR/spool/slurmd-node$k"; done
: > "$DIR/pids"      # PID NAME (read by tests/slurm/slurm-down.sh)
: > "$DIR/objects"   # KIND NAME: netns, link, mount; removed in reverse order by cluster-down.sh
undo_on_failure "$HERE/cluster-down.sh" "removing what was made"
made() { echo "$1 $2" >> "$DIR/objects"; }

# --- network: bridge, one namespace and veth per node ----------------------------------------------
ID=$(printf '%04x' $((RANDOM % 65536)))
BR=ntpbr$ID
ip link add "$BR" type bridge && made link "$BR"
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
for k in $(seq "$N"); do
  ip netns add "node$k" && made netns "node$k"
  ip link add "ntpv$ID-$k" type veth peer name "eth0" netns "node$k" && made link "ntpv$ID-$k"
  ip link set "ntpv$ID-$k" master "$BR" up
  ip -n "node$k" addr add "$NET.$k/24" dev eth0
  ip -n "node$k" link set eth0 up
  ip -n "node$k" link set lo up
  touch "$DIR/uts/node$k"
  unshare --uts="$DIR/uts/node$k" hostname "node$k" && made mount "$DIR/uts/node$k"
done
{ cat /etc/hosts; for k in $(seq "$N"); do echo "$NET.$k node$k"; done; } > "$DIR/hosts"
for k in $(seq "$N"); do echo "node$k slots=${CLUSTER_CPUS:-4}"; done > "$DIR/hostfile.tmp"
# Reachability without ping (not installed everywhere): a refused TCP connection answers from the node.
reach() { ip netns exec "$1" python3 -c 'import socket, sys
try: socket.create_connection((sys.argv[1], 9), timeout=2)
except ConnectionRefusedError: pass' "$2" 2>/dev/null; }
for k in $(seq 2 "$N"); do
  reach node1 "$NET.$k" || { log "node1 cannot reach node$k ($NET.$k)"; exit 1; }
done
reach node1 "$NET.254" || { log "node1 cannot reach the bridge ($NET.254)"; exit 1; }

# --- munge -----------------------------------------------------------------------------------------
start_munged

# --- slurm.conf ------------------------------------------------------------------------------------
SHARE=$(( $(nproc) / N ))   # cores per node (0: fewer cores than nodes, so none are pinned)
CPUS=${CLUSTER_CPUS:-$(( SHARE > 8 ? SHARE : 8 ))}
[[ "$CPUS" =~ ^[1-9][0-9]*$ ]] || { log "CLUSTER_CPUS '$CPUS' is not a positive integer"; exit 2; }
sed "s/slots=.*/slots=$CPUS/" "$DIR/hostfile.tmp" > "$DIR/hostfile" && rm "$DIR/hostfile.tmp"
CTLD_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])')
SLURMD_PORT=6818   # each slurmd listens in its own namespace: no clash with anything else
write_slurm_conf "HEADER=Private $N-node test cluster written by tests/cluster/cluster-up.sh; remove it with cluster-down.sh." \
  "CLUSTER_NAME=ntpbench-cluster$ID" "CONTROLLER=localhost($NET.254)" "CTLD_PORT=$CTLD_PORT" "SLURMD_PORT=$SLURMD_PORT" \
  MPI_DEFAULT=none "SLURMD_PID_FILE=$DIR/spool/slurmd-%n.pid" "SLURMD_LOG_FILE=$DIR/log/slurmd-%n.log" \
  "NODES=node[1-$N]" "NODE_ADDRS=$NET.[1-$N]"
cat > "$DIR/env.sh" <<EOF
export SLURM_CONF=$DIR/slurm.conf CLUSTER_DIR=$DIR
EOF

# --- daemons ---------------------------------------------------------------------------------------
start_slurmctld
for k in $(seq "$N"); do
  # taskset and cluster-exec.sh exec slurmd in place (no fork), so $! is slurmd's PID.
  pin=()
  ((SHARE > 0)) && pin=(taskset -c "$(( (k - 1) * SHARE ))-$(( k * SHARE - 1 ))")
  "${pin[@]}" "$HERE/cluster-exec.sh" "$DIR" "node$k" slurmd -D -N "node$k" -f "$SLURM_CONF" > "$DIR/log/slurmd-node$k.stdout" 2>&1 &
  record $! slurmd
done
state=""
for _ in $(seq $((WAIT * 4))); do
  state=$(sinfo -h -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true)
  [ "$state" = "idle " ] && break
  while read -r pid name; do
    [ "$name" = slurmd ] && ! kill -0 "$pid" 2>/dev/null && { log "a slurmd ($pid) exited"; exit 1; }
  done < "$DIR/pids"
  sleep 0.25
done
[ "$state" = "idle " ] || { log "nodes are '${state:-absent}', not all idle, after ${WAIT}s"; exit 1; }

ok=1
log "up: $N nodes ($NET.1..$N on bridge $BR), $CPUS CPUs each$( ((SHARE > 0)) && echo ", pinned to $SHARE core(s) each"); slurmctld port $CTLD_PORT"
echo "CLUSTER_DIR=$DIR"
echo "SLURM_CONF=$DIR/slurm.conf"
