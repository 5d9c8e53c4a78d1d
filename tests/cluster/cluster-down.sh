#!/usr/bin/env bash
# Removes a cluster made by cluster-up.sh: cancels its jobs and stops its daemons by the PIDs it
# recorded (tests/slurm/slurm-down.sh), ends any process still inside its node namespaces (job
# steps, MPI daemons and ranks those daemons started), then unmounts the nodes' UTS namespaces and
# deletes the namespaces, veth links and the bridge listed in DIR/objects. Idempotent: a second
# run, or a run after a half-finished start, removes what is left and succeeds.
#
#   tests/cluster/cluster-down.sh DIR [--clean]     # --clean also removes DIR
set -uo pipefail
DIR=${1:?usage: cluster-down.sh DIR [--clean]}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$PATH:/usr/sbin:/sbin"
[ -d "$DIR" ] || { echo "cluster-down: no such directory $DIR" >&2; exit 0; }
[ -f "$DIR/pids" ] && "$HERE/../slurm/slurm-down.sh" "$DIR"
OBJ=$DIR/objects
[ -f "$OBJ" ] || exit 0

# Processes left in a node's namespace belong to this cluster (its namespaces were made by us).
ns_pids() { awk '$1=="netns"{print $2}' "$OBJ" | while read -r ns; do ip netns pids "$ns" 2>/dev/null; done; }
pids=$(ns_pids)
if [ -n "$pids" ]; then
  echo "cluster-down: ending $(echo $pids | wc -w) leftover process(es) in the node namespaces" >&2
  kill -TERM $pids 2>/dev/null
  for _ in $(seq 20); do [ -z "$(ns_pids)" ] && break; sleep 0.25; done
  pids=$(ns_pids); [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  for _ in $(seq 20); do [ -z "$(ns_pids)" ] && break; sleep 0.25; done
fi

tac "$OBJ" | while read -r kind name; do
  case "$kind" in
    mount) mountpoint -q "$name" 2>/dev/null && umount "$name" ;;
    netns) [ -e "/run/netns/$name" ] && ip netns delete "$name" ;;
    link) ip link show "$name" >/dev/null 2>&1 && ip link delete "$name" ;;
  esac
done
left=$(tac "$OBJ" | while read -r kind name; do
  case "$kind" in
    mount) mountpoint -q "$name" 2>/dev/null && echo "mount $name" ;;
    netns) [ -e "/run/netns/$name" ] && echo "netns $name" ;;
    link) ip link show "$name" >/dev/null 2>&1 && echo "link $name" ;;
  esac
done)
[ -z "$left" ] || { echo "cluster-down: could not remove: $left" >&2; exit 1; }
echo "cluster-down: removed the namespaces, links and bridge of $DIR" >&2
[ "${2:-}" = --clean ] && rm -rf "$DIR"
exit 0
