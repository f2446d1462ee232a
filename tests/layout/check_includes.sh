#!/usr/bin/env bash
# Fails when product code includes a fixture or harness header (dcr/testing/...), or when a
# fixture header sits in the product include root.
#   check_includes.sh [SOURCE_DIR]
# Product code: core/include, core/src, core/cuda and the dcr-node sources (core/cli/node), except
# the tests beside the code (*_test.cc), which may use fixtures.
# The CMake structure already keeps the testing include root away from product targets; this
# check names the offending line.
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
cd "$root"
pattern='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](dcr/testing/|testing/|.*/testing/include/)'
product=(core/include core/src core/cuda core/cli/node)
status=0
if hits=$(grep -rnE --exclude="*_test.cc" "$pattern" "${product[@]}"); then
  echo "check_includes: product code includes fixture headers:" >&2
  echo "$hits" >&2
  status=1
fi
if [ -e core/include/dcr/testing ]; then
  echo "check_includes: core/include/dcr/testing exists; fixture headers belong in core/testing/include" >&2
  status=1
fi
# The pattern must see the fixtures' own includes (so a typo here cannot pass everything).
if ! grep -rqE "$pattern" core/testing/src; then
  echo "check_includes: the include pattern matches nothing in core/testing/src" >&2
  status=1
fi
if [ "$status" -eq 0 ]; then
  echo "check_includes: no product file under ${product[*]} includes dcr/testing/"
fi
exit $status
