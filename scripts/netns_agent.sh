#!/bin/sh
# Open MPI's plm_rsh_agent for scripts/netns_hosts.sh, standing in for ssh: "$0 [ssh options] HOST COMMAND..." runs
# COMMAND inside the namespace of HOST (10.213.0.k is host k-1 of the set named by $ATTN_NETNS), with a temporary
# directory of its own: the hosts share one hostname and one /tmp, and Open MPI's daemons would otherwise make and
# remove their session directories in the same place (a daemon failed to start in about 1 run in 15).
while [ $# -gt 0 ]; do
  case "$1" in -*) shift ;; *) break ;; esac
done
host=$1
shift
ns="${ATTN_NETNS:?set by scripts/netns_hosts.sh}_h$((${host##*.} - 1))"
mkdir -p "/tmp/$ns.tmp"
exec ip netns exec "$ns" env TMPDIR="/tmp/$ns.tmp" sh -c "$*"
