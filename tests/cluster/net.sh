#!/bin/sh
# Test hosts on one machine (tests/e2e-cluster.sh): network namespaces PREFIX-h0 … PREFIX-h(N-1),
# each with one interface eth0 (10.231.0.(i+1)/24) plugged by a veth pair into a bridge in a
# switch namespace PREFIX-sw. Nothing is added to the root namespace, so the test's traffic
# stays between the hosts' own addresses.
#   sh tests/cluster/net.sh up PREFIX N     make the hosts (removes leftovers of PREFIX first)
#   sh tests/cluster/net.sh down PREFIX     remove them
#   sh tests/cluster/net.sh cut PREFIX I    unplug host I: its switch port goes down (a cable cut)
#   sh tests/cluster/net.sh mend PREFIX I   plug it back
# Needs root and iproute2.
set -e
cmd=$1 P=$2
sw=$P-sw
down() {
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P-" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
}
case $cmd in
up)
    n=$3
    down
    ip netns add "$sw"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    ip -n "$sw" link set lo up
    i=0
    while [ "$i" -lt "$n" ]; do
        h=$P-h$i
        ip netns add "$h"
        ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$h"
        ip -n "$sw" link set "p$i" master br0
        ip -n "$sw" link set "p$i" up
        ip -n "$h" addr add "10.231.0.$((i + 1))/24" dev eth0
        ip -n "$h" link set eth0 up
        ip -n "$h" link set lo up
        # a connection with unacknowledged data (mpirun's to an unreachable daemon) gives up after
        # about 13 s of retransmissions (tcp_retries2 5) instead of about 15 min (the default 15)
        ip netns exec "$h" sysctl -qw net.ipv4.tcp_retries2=5
        i=$((i + 1))
    done
    ;;
down) down ;;
cut) ip -n "$sw" link set "p$3" down ;;
mend) ip -n "$sw" link set "p$3" up ;;
*) echo "usage: net.sh up|down|cut|mend PREFIX [N|I]" >&2; exit 2 ;;
esac
