# Sourced by the tests that run real nodes on emulated hosts: each host a network namespace with
# a veth into a router namespace's bridge, all on one /24. Needs root and iproute2.
#
#   netns_require                  exits 77 (skip) without root, iproute2 or ip netns
#   netns_hosts PREFIX NET N       router PREFIX-r (bridge br0) and hosts PREFIX-h0 .. h<N-1>,
#                                  host i at NET.(10 + i) on veth PREFIX-v<i> (bridge port
#                                  PREFIX-p<i>); returns non-zero when a step fails
#   netns_addr NET I               prints host I's address
#   netns_delete PREFIX N          removes the router and hosts (idempotent)

netns_require() {
  if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (ip netns)"; exit 77; fi
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "SKIP: iproute2 (ip, tc) missing"; exit 77
  fi
  local probe="dcrprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then echo "SKIP: ip netns unavailable here"; exit 77; fi
  ip netns del "$probe"
}

netns_addr() { echo "$1.$((10 + $2))"; }

netns_hosts() {
  local p=$1 net=$2 n=$3 i
  ip netns add "$p-r" || return 1
  ip -n "$p-r" link add br0 type bridge || return 1
  ip -n "$p-r" link set br0 up
  ip -n "$p-r" link set lo up
  for ((i = 0; i < n; i++)); do
    ip netns add "$p-h$i" || return 1
    ip link add "$p-v$i" type veth peer name "$p-p$i" || return 1
    ip link set "$p-v$i" netns "$p-h$i" || return 1
    ip link set "$p-p$i" netns "$p-r" || return 1
    ip -n "$p-r" link set "$p-p$i" master br0 up || return 1
    ip -n "$p-h$i" link set lo up
    ip -n "$p-h$i" addr add "$(netns_addr "$net" "$i")/24" dev "$p-v$i" || return 1
    ip -n "$p-h$i" link set "$p-v$i" up || return 1
  done
}

netns_delete() {
  local p=$1 n=$2 i
  for ((i = 0; i < n; i++)); do ip netns del "$p-h$i" 2>/dev/null; done
  ip netns del "$p-r" 2>/dev/null
  return 0
}
