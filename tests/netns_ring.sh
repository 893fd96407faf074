#!/bin/sh
# ctest ring.netns_np4: ring attention across 4 hosts that are Linux network namespaces joined by veth links to a
# bridge (scripts/netns_hosts.sh: made by this test, removed when it ends; addresses 10.213.0.1-4 exist only inside
# them), Open MPI over TCP between them, links shaped to 10 Gbit/s (and 50 us where the kernel has sch_netem).
# test_ring's checks on 4 ranks over those links, then attn ring-bench's report (tests/ring_bench_check.py).
# Exit 77, which CTest reports as skipped, where namespaces cannot be made (no root, no CAP_NET_ADMIN, no iproute2).
# usage: netns_ring.sh SCRIPTS_DIR TEST_RING ATTN RING_BENCH_CHECK PYTHON
set -u
scripts=$1 test_ring=$2 attn=$3 check=$4 python=$5
"$scripts/netns_hosts.sh" check || exit 77
name="attn$$"
trap '"$scripts/netns_hosts.sh" down "$name"' EXIT
trap 'exit 1' INT TERM
"$scripts/netns_hosts.sh" up "$name" 4 10gbit 50us || exit 1
"$scripts/netns_hosts.sh" mpirun "$name" 4 "$test_ring" || exit 1
"$python" "$check" --seq 8192 --ranks 4 -- "$scripts/netns_hosts.sh" mpirun "$name" 4 "$attn" ring-bench --seq 8192 --reps 1 --png ""
