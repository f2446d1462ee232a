#!/usr/bin/env bash
# Link test of the library layout:
#   1. a decode-only program linked against dcr::format alone applies a golden delta bit-exactly;
#   2. neither its dynamic dependencies (readelf -d, ldd) nor dcr::format's link interface name
#      libcurl, libssl or libcrypto;
#   3. dcr-node defines none of the testing library's symbols (nm), while the full `dcr` CLI,
#      which links the fixtures, does (so the check can fail);
#   4. dcr-node defines none of the faults library's symbols (tools/faults: the fault points a
#      test plan asks for), while dcr-node-faults, the test build of the node, does;
#   5. dcr-node defines none of the symbols of the other fault tools (TOOL_LIB...: the fault
#      runners and proxies of tools/faults), while the full `dcr` CLI, which runs them, does.
#   link_test.sh DECODE_ONLY FORMAT_LINK_INTERFACE_FILE DCR_NODE DCR LIBDCR_TESTING WORK_DIR
#                LIBDCR_FAULTS DCR_NODE_FAULTS [TOOL_LIB...]
set -euo pipefail
decode="$1" iface_file="$2" node="$3" dcr="$4" testing_lib="$5" work="$6"
faults_lib="$7" node_faults="$8"
shift 8
tool_libs=("$@")
root="$(cd "$(dirname "$0")/../.." && pwd)"
forbidden='curl|ssl|crypto'
status=0
fail() { echo "link_test: FAIL: $*" >&2; status=1; }

mkdir -p "$work"
echo "== decode-only program: $decode"
"$decode" "$root/tests/golden/base.safetensors" "$root/tests/golden/v4_delta.dcr" \
  "$root/tests/golden/target.safetensors" "$work/v4_out.safetensors" || fail "decode-only apply"

needed=$(readelf -d "$decode" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $(echo $needed)"
if echo "$needed" | grep -Eq "$forbidden"; then fail "decode-only NEEDED lists $forbidden"; fi
closure=$(ldd "$decode" | awk '{print $1}')
echo "ldd: $(echo $closure)"
if echo "$closure" | grep -Eq "lib($forbidden)"; then fail "decode-only loads lib($forbidden)"; fi

iface=$(cat "$iface_file")
echo "dcr::format link interface: $iface"
if echo "$iface" | grep -Eiq "$forbidden"; then fail "dcr::format's link interface names $forbidden"; fi

echo "== dcr-node: $node"
# Strong text symbols the testing library defines (one definition rule: product code cannot
# define the same ones).
nm --defined-only -g "$testing_lib" 2>/dev/null | awk '$2 == "T" {print $3}' | sort -u > "$work/testing.syms"
count=$(wc -l < "$work/testing.syms")
[ "$count" -gt 0 ] || fail "no symbols read from $testing_lib"
nm --defined-only "$node" | awk '{print $3}' | sort -u > "$work/node.syms"
nm --defined-only "$dcr" | awk '{print $3}' | sort -u > "$work/dcr.syms"
in_node=$(comm -12 "$work/testing.syms" "$work/node.syms" | wc -l)
in_dcr=$(comm -12 "$work/testing.syms" "$work/dcr.syms" | wc -l)
echo "testing-library symbols: $count; defined in dcr-node: $in_node; in dcr: $in_dcr"
if [ "$in_node" -ne 0 ]; then
  comm -12 "$work/testing.syms" "$work/node.syms" | head -5 | c++filt >&2
  fail "dcr-node contains testing-library code"
fi
[ "$in_dcr" -gt 0 ] || fail "dcr shows no testing-library symbols: the check would not see them"
echo "== fault points: $faults_lib"
nm --defined-only -g "$faults_lib" 2>/dev/null | awk '$2 == "T" {print $3}' | sort -u > "$work/faults.syms"
count=$(wc -l < "$work/faults.syms")
[ "$count" -gt 0 ] || fail "no symbols read from $faults_lib"
nm --defined-only "$node_faults" | awk '{print $3}' | sort -u > "$work/node_faults.syms"
in_node=$(comm -12 "$work/faults.syms" "$work/node.syms" | wc -l)
in_faults=$(comm -12 "$work/faults.syms" "$work/node_faults.syms" | wc -l)
echo "faults-library symbols: $count; defined in dcr-node: $in_node; in dcr-node-faults: $in_faults"
if [ "$in_node" -ne 0 ]; then
  comm -12 "$work/faults.syms" "$work/node.syms" | head -5 | c++filt >&2
  fail "dcr-node contains fault-injection code"
fi
[ "$in_faults" -gt 0 ] || fail "dcr-node-faults shows no faults-library symbols: the check would not see them"
for lib in "${tool_libs[@]}"; do
  name=$(basename "$lib")
  echo "== fault tool: $lib"
  nm --defined-only -g "$lib" 2>/dev/null | awk '$2 == "T" {print $3}' | sort -u > "$work/$name.syms"
  count=$(wc -l < "$work/$name.syms")
  [ "$count" -gt 0 ] || fail "no symbols read from $lib"
  in_node=$(comm -12 "$work/$name.syms" "$work/node.syms" | wc -l)
  in_dcr=$(comm -12 "$work/$name.syms" "$work/dcr.syms" | wc -l)
  echo "$name symbols: $count; defined in dcr-node: $in_node; in dcr: $in_dcr"
  if [ "$in_node" -ne 0 ]; then
    comm -12 "$work/$name.syms" "$work/node.syms" | head -5 | c++filt >&2
    fail "dcr-node contains $name code"
  fi
  [ "$in_dcr" -gt 0 ] || fail "dcr shows no $name symbols: the check would not see them"
done
node_needed=$(readelf -d "$node" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "dcr-node NEEDED: $(echo $node_needed)"
[ "$status" -eq 0 ] && echo "link_test: OK"
exit $status
