#!/bin/sh
# mpirun's launch agent for the namespace hosts (plm_rsh_agent): called as `rsh.sh HOST CMD...`
# in place of ssh, it runs CMD (the orted start-up line) in the host's network namespace, with
# its own UTS namespace whose host name is the namespace's name, so that every process reports
# the host it is on. HOST is an address 10.231.0.K; ZS_CLUSTER_NS is the namespaces' prefix.
host=$1; shift
# ssh-style options that OpenMPI may put before the host
while case $host in -*) true;; *) false;; esac; do host=$1; shift; done
k=${host##*.}
ns=${ZS_CLUSTER_NS:?}-h$((k - 1))
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$ns" "$*"
