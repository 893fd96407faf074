#!/bin/sh
# Hosts joined by real network links, on one machine: N Linux network namespaces (the hosts), each with a veth pair
# to a bridge in a switch namespace, addresses 10.213.0.1 .. 10.213.0.N (used only inside these namespaces: nothing
# is sent anywhere else), each host's link shaped with tc (tbf: the bandwidth; netem: the latency, where the kernel
# has sch_netem). Open MPI runs over TCP between them: mpirun starts in host 0's namespace and starts its daemons in
# the other hosts' namespaces through scripts/netns_agent.sh, which stands in for ssh.
#
#   scripts/netns_hosts.sh check                     exit 0 when namespaces can be made here, else 77 with why
#   scripts/netns_hosts.sh up NAME N [RATE] [DELAY]  N hosts, links of RATE (tc units, e.g. 10gbit; default none)
#                                                    and DELAY (e.g. 50us; default none); prints what it shaped
#   scripts/netns_hosts.sh mpirun NAME N ARGS...     mpirun -np N across the hosts (TCP only), ARGS the program
#   scripts/netns_hosts.sh down NAME                 removes every namespace of NAME (also what a failed up left)
#
# NAME prefixes the namespaces (NAME_h0 .. NAME_hN-1, NAME_sw), so that concurrent runs do not meet. Needs root
# (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ip and tc programs (iproute2).
set -eu
here=$(cd "$(dirname "$0")" && pwd)

cmd=${1:-}
case "$cmd" in
check)
  if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    echo "network namespaces: iproute2 (ip, tc) is not installed"; exit 77
  fi
  probe="attn_probe_$$"
  if ! ip netns add "$probe" 2>/tmp/attn_netns_err_$$; then
    echo "network namespaces: not permitted here ($(cat /tmp/attn_netns_err_$$))"; rm -f /tmp/attn_netns_err_$$; exit 77
  fi
  rm -f /tmp/attn_netns_err_$$
  # and what the hosts need inside one: running a program there, a veth pair, a tbf qdisc on it
  why=""
  ip netns exec "$probe" true 2>/dev/null || why="ip netns exec is not permitted"
  [ -z "$why" ] && { ip -n "$probe" link add pa type veth peer name pb 2>/dev/null || why="veth pairs cannot be made"; }
  [ -z "$why" ] && { tc -n "$probe" qdisc add dev pa root tbf rate 1gbit burst 1mb latency 50ms 2>/dev/null ||
                     why="tc cannot shape a link (no sch_tbf)"; }
  ip netns del "$probe"
  if [ -n "$why" ]; then echo "network namespaces: $why"; exit 77; fi
  ;;
up)
  name=$2 n=$3 rate=${4:-} delay=${5:-}
  ip netns add "${name}_sw"
  ip -n "${name}_sw" link add br0 type bridge
  ip -n "${name}_sw" link set br0 up
  netem=yes
  i=0
  while [ "$i" -lt "$n" ]; do
    h="${name}_h$i"
    ip netns add "$h"
    ip link add veth0 netns "$h" type veth peer name "port$i" netns "${name}_sw"
    ip -n "$h" addr add "10.213.0.$((i + 1))/24" dev veth0
    ip -n "$h" link set lo up
    ip -n "$h" link set veth0 up
    ip -n "${name}_sw" link set "port$i" master br0
    ip -n "${name}_sw" link set "port$i" up
    # egress of both ends: host -> switch and switch -> host
    for side in "$h veth0" "${name}_sw port$i"; do
      set -- $side
      if [ -n "$delay" ] && tc -n "$1" qdisc add dev "$2" root handle 1: netem delay "$delay" 2>/dev/null; then
        [ -n "$rate" ] && tc -n "$1" qdisc add dev "$2" parent 1: handle 2: tbf rate "$rate" burst 1mb latency 50ms
      else
        [ -n "$delay" ] && netem=no
        [ -n "$rate" ] && tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst 1mb latency 50ms
      fi
    done
    i=$((i + 1))
  done
  echo "netns hosts: $n hosts ${name}_h0..$((n - 1)) at 10.213.0.1..$n, links: rate ${rate:-unshaped}, delay ${delay:-none}$([ "$netem" = no ] && echo " NOT APPLIED (no sch_netem in this kernel: the veth's own latency)")"
  ;;
mpirun)
  name=$2 n=$3; shift 3
  hosts=$(i=1; while [ "$i" -le "$n" ]; do printf '10.213.0.%d,' "$i"; i=$((i + 1)); done)
  # Each host's daemon gets a temporary directory of its own (scripts/netns_agent.sh; host 0's here); rtc_hwloc_vmhole
  # none: the daemons do not share hwloc's topology through a shared-memory map at a fixed address (Open MPI 4.1's
  # orted crashed in hwloc_shmem_topology_write in about 1 start in 15 here).
  mkdir -p "/tmp/${name}_h0.tmp"
  exec ip netns exec "${name}_h0" env ATTN_NETNS="$name" TMPDIR="/tmp/${name}_h0.tmp" mpirun -np "$n" --host "${hosts%,}" \
    --mca plm_rsh_agent "$here/netns_agent.sh" -x ATTN_NETNS --mca rtc_hwloc_vmhole none --mca btl tcp,self \
    --mca btl_tcp_if_include 10.213.0.0/24 --mca oob_tcp_if_include 10.213.0.0/24 "$@"
  ;;
down)
  name=$2
  for ns in $(ip netns list | awk '{print $1}' | grep "^${name}_" || true); do ip netns del "$ns"; done
  rm -rf "/tmp/${name}"_h*.tmp
  ;;
*)
  echo "usage: $0 check | up NAME N [RATE] [DELAY] | mpirun NAME N ARGS... | down NAME" >&2; exit 2
  ;;
esac
