#!/usr/bin/env bash
# Runs a command on one node of a cluster made by cluster-up.sh: inside the node's network
# namespace, its UTS namespace (hostname = the node's name) and a private mount namespace in which
# DIR/hosts is bind-mounted over /etc/hosts (the machine's file is untouched). Not `ip netns exec`:
# it remounts /sys, which hides /sys/fs/cgroup from slurmd. Everything is exec'd in place, so the
# command keeps this script's PID.
#
#   tests/cluster/cluster-exec.sh DIR node2 hostname        # -> node2
set -euo pipefail
DIR=${1:?usage: cluster-exec.sh DIR NODE CMD...}
NODE=${2:?usage: cluster-exec.sh DIR NODE CMD...}
shift 2
[ $# -gt 0 ] || { echo "cluster-exec: no command" >&2; exit 2; }
[ -e "$DIR/uts/$NODE" ] && [ -e "/run/netns/$NODE" ] || { echo "cluster-exec: no node '$NODE' in cluster $DIR" >&2; exit 2; }
export PATH="$PATH:/usr/sbin:/sbin"
# shellcheck disable=SC2016
exec nsenter --net="/run/netns/$NODE" --uts="$DIR/uts/$NODE" -- unshare --mount --propagation slave -- \
  sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$DIR/hosts" "$@"
