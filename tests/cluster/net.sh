#!/bin/sh
# Test hosts on one machine (tests/e2e-cluster.sh): network namespaces PREFIX-h0 … PREFIX-h(N-1),
# each with one interface eth0 (10.231.0.(i+1)/24) plugged by a veth pair into a bridge in a
# switch namespace PREFIX-sw. Nothing is added to the root namespace, so the test's traffic
# stays between the hosts' own addresses.
#   sh tests/cluster/net.sh up PREFIX N     make the hosts (removes leftovers of PREFIX first)
#   sh tests/cluster/net.sh down PREFIX     remove them
#   sh tests/cluster/net.sh cut PREFIX I    unplug host I: its switch port goes down (a cable cut)
#   sh tests/cluster/net.sh mend PREFIX I   plug it back, and wait (up to 15 s) until host I and
#                                           host 0 reach each other over TCP again
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
mend)
    ip -n "$sw" link set "p$3" up
    # the port's carrier comes back up to a second later (linkwatch), and a daemon launched
    # before host I reaches host 0 fails to start (mpirun: "unable to reliably start one or
    # more daemons"). A connection from host I to a closed port of host 0 is refused (curl
    # exit 7) once both directions work, and times out while they do not.
    if [ "$3" != 0 ] && command -v curl >/dev/null; then
        k=0
        while [ "$k" -lt 15 ]; do
            rc=0; ip netns exec "$P-h$3" curl -s -m 1 http://10.231.0.1:9/ >/dev/null 2>&1 || rc=$?
            [ "$rc" = 7 ] && break
            k=$((k + 1))
        done
    else
        sleep 2
    fi
    ;;
*) echo "usage: net.sh up|down|cut|mend PREFIX [N|I]" >&2; exit 2 ;;
esac
