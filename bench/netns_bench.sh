#!/bin/sh
# Ring and Ulysses attention from Python (bench/dist_bench.py, torch.distributed over gloo/TCP) on 4 hosts that are
# network namespaces joined by shaped veth links (scripts/netns_hosts.sh), once per link rate; and attn ring-bench
# (the C++ ring over Open MPI/TCP) on the same hosts. Needs root; the namespaces are removed at the end.
#   bench/netns_bench.sh [PYTHON] [RATE ...]      (default: python3, 10gbit 1gbit)
set -eu
cd "$(dirname "$0")/.."
py=${1:-python3}
[ $# -gt 0 ] && shift
rates=${*:-10gbit 1gbit}
scripts/netns_hosts.sh check
name="attnbench$$"
trap 'scripts/netns_hosts.sh down "$name"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
for rate in $rates; do
  scripts/netns_hosts.sh up "$name" 4 "$rate" 50us
  scripts/netns_hosts.sh mpirun "$name" 4 build/attn ring-bench --png "" | grep -E "^ring|planner|overlap"
  pids=""
  for i in 0 1 2 3; do
    ip netns exec "${name}_h$i" env RANK=$i WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=10.213.0.1 MASTER_PORT=29517 \
      GLOO_SOCKET_IFNAME=veth0 "$py" bench/dist_bench.py --label "links $rate" &
    pids="$pids $!"
  done
  for p in $pids; do wait "$p"; done
  scripts/netns_hosts.sh down "$name"
done
