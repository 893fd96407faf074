#!/bin/sh
# Open MPI's plm_rsh_agent for scripts/netns_hosts.sh, standing in for ssh: "$0 [ssh options] HOST COMMAND..." runs
# COMMAND inside the namespace of HOST (10.213.0.k is host k-1 of the set named by $ATTN_NETNS).
while [ $# -gt 0 ]; do
  case "$1" in -*) shift ;; *) break ;; esac
done
host=$1
shift
exec ip netns exec "${ATTN_NETNS:?set by scripts/netns_hosts.sh}_h$((${host##*.} - 1))" sh -c "$*"
