#!/usr/bin/env bash
# dist_multihost: the two launches of docs/distributed.md across two hosts simulated on one machine. Two network
# namespaces joined by a veth pair (10.77.0.1 and 10.77.0.2, addresses that exist only inside these namespaces),
# two ranks in each, every socket on those addresses:
#   1. torchrun-style: RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, rank 0 in host A; rendezvous_probe exchanges a
#      random blob (what carries NCCL's id) with every rank; all four must receive the same 128 bytes;
#   2. the same with a rank that never comes: rank 0 fails with a typed DistributedError within the timeout;
#   3. mpirun with a host list (-H 10.77.0.1:2,10.77.0.2:2): mpirun's rsh agent is a script that enters the
#      host's namespace (and a UTS namespace with its own host name) instead of ssh; TCP only, on the veth's
#      subnet; test_dist_zero's ZeRO cases on 4 ranks, and the bytes counted on the veth show the traffic crossed.
# Without root or network namespaces (ip netns add refused) it falls back to two loopback addresses, 127.0.0.2
# and 127.0.0.3, one per "host": the rendezvous only (mpirun needs the namespaces' separate host names), and says
# so (DYNGRAD_MULTIHOST_LOOPBACK=1 forces that mode).
# Usage: multihost_netns.sh RENDEZVOUS_PROBE TEST_DIST_ZERO MPIRUN
set -uo pipefail
probe=$1 zero_test=$2 mpirun=$3
timeout_s=${DYNGRAD_DIST_TIMEOUT:-60}
work=$(mktemp -d /tmp/dyngrad_multihost.XXXXXX)
tag=dg$$
A=${tag}a B=${tag}b
port=$((20000 + $$ % 20000))
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cleanup() {
    ip netns del "$A" 2>/dev/null
    ip netns del "$B" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

mode=netns
if [ -n "${DYNGRAD_MULTIHOST_LOOPBACK:-}" ]; then  # forces the fallback (to test it where namespaces work)
    echo "DYNGRAD_MULTIHOST_LOOPBACK set" >"$work/netns.err"
    false
fi && { ip netns add "$A" && ip netns add "$B"; } 2>"$work/netns.err"
if [ $? != 0 ]; then
    mode=loopback
    echo "network namespaces refused ($(cat "$work/netns.err")): falling back to 127.0.0.2 / 127.0.0.3"
fi

if [ $mode = netns ]; then
    ip link add "${tag}va" type veth peer name "${tag}vb" &&
        ip link set "${tag}va" netns "$A" && ip link set "${tag}vb" netns "$B" &&
        ip -n "$A" addr add 10.77.0.1/24 dev "${tag}va" && ip -n "$B" addr add 10.77.0.2/24 dev "${tag}vb" &&
        ip -n "$A" link set "${tag}va" up && ip -n "$B" link set "${tag}vb" up &&
        ip -n "$A" link set lo up && ip -n "$B" link set lo up || { echo "cannot set up the veth pair"; exit 1; }
    host_a=10.77.0.1 host_b=10.77.0.2
    # Runs a command "on" host a or b.
    on() { local ns=$A; [ "$1" = b ] && ns=$B; shift; ip netns exec "$ns" "$@"; }
else
    host_a=127.0.0.2 host_b=127.0.0.3
    on() { shift; "$@"; }
fi

# ---- 1. torchrun-style rendezvous, 2 ranks per host ----
launch() {  # host rank world -> output in $work/rdv.<rank>
    local host=$1 rank=$2 world=$3
    on "$host" env RANK="$rank" WORLD_SIZE="$world" LOCAL_RANK=$((rank % 2)) MASTER_ADDR=$host_a \
        MASTER_PORT=$port DYNGRAD_DIST_TIMEOUT="$timeout_s" "$probe" >"$work/rdv.$rank" 2>&1 &
}
launch a 0 4; launch a 1 4; launch b 2 4; launch b 3 4
wait
cat "$work"/rdv.*
blobs=$(grep -ho 'blob [0-9a-f]* (128 bytes)' "$work"/rdv.* | sort | uniq -c)
echo "$blobs" | grep -q '^ *4 blob' || fail "rendezvous: the four ranks did not all receive rank 0's 128 bytes"

# ---- 2. a rank that never comes: a typed error within the timeout ----
port=$((port + 1))
start=$(date +%s)
on a env RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=$host_a MASTER_PORT=$port DYNGRAD_DIST_TIMEOUT=3 "$probe" \
    >"$work/missing.0" 2>&1 &
on b env RANK=2 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=$host_a MASTER_PORT=$port DYNGRAD_DIST_TIMEOUT=3 "$probe" \
    >"$work/missing.2" 2>&1 &
wait
elapsed=$(($(date +%s) - start))
cat "$work/missing.0"
grep -q 'rank 0/3 DistributedError.*rank.*1' "$work/missing.0" || fail "missing rank: rank 0 did not fail typed naming rank 1"
[ "$elapsed" -le 15 ] || fail "missing rank: took ${elapsed}s with a 3 s timeout"

# ---- 3. mpirun across the two hosts ----
if [ $mode = netns ]; then
    cat >"$work/rsh" <<AGENT
#!/bin/sh
# mpirun's rsh agent for the simulated hosts: "rsh [options] HOST COMMAND..." runs COMMAND in HOST's namespaces.
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in
  $host_a) ns=$A ;;
  $host_b) ns=$B ;;
  *) echo "rsh agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts sh -c "hostname sim-\$ns; \$*"
AGENT
    chmod +x "$work/rsh"
    before=$(ip -n "$A" -s link show "${tag}va" | awk 'NR==4 {print $1}')
    on a unshare --uts sh -c "hostname sim-$A; exec $mpirun -np 4 -H $host_a:2,$host_b:2 \
        --mca plm_rsh_agent $work/rsh --mca btl tcp,self,vader --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca oob_tcp_if_include 10.77.0.0/24 $zero_test '[zero]'" >"$work/mpi.log" 2>&1
    rc=$?
    after=$(ip -n "$A" -s link show "${tag}va" | awk 'NR==4 {print $1}')
    grep -E '^\| 4 \||passed|failed' "$work/mpi.log"
    [ $rc = 0 ] || { tail -40 "$work/mpi.log"; fail "mpirun across the two hosts: exit $rc"; }
    echo "bytes received on host A's veth during the MPI run: $((after - before))"
    [ $((after - before)) -gt 10000 ] || fail "mpirun: no traffic crossed the veth pair"
else
    echo "mpirun across hosts: skipped (needs the namespaces; loopback mode)"
fi

[ $failures = 0 ] && echo "dist_multihost ($mode): passed" || echo "dist_multihost ($mode): $failures failure(s)"
[ $failures = 0 ]
