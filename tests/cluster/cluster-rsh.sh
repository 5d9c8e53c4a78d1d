#!/usr/bin/env bash
# Open MPI's remote-shell agent for a cluster made by cluster-up.sh, in place of ssh:
#
#   mpirun --mca plm_rsh_agent tests/cluster/cluster-rsh.sh --hostfile $CLUSTER_DIR/hostfile ...
#
# Open MPI calls it as ssh would be called, `AGENT [options] HOST COMMAND...`, where COMMAND is a
# shell command line (it starts prted). It runs that line on HOST through cluster-exec.sh. The
# cluster is found from CLUSTER_DIR (set by sourcing DIR/env.sh), which mpirun passes on.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${CLUSTER_DIR:?cluster-rsh: CLUSTER_DIR is unset (source DIR/env.sh of the cluster)}"
while [ $# -gt 0 ] && [ "${1:0:1}" = - ]; do shift; done   # ssh options (-x, -T, ...) mean nothing here
HOST=${1:?cluster-rsh: no host}
shift
exec "$HERE/cluster-exec.sh" "$CLUSTER_DIR" "$HOST" sh -c "$*"
