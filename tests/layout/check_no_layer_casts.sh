#!/usr/bin/env bash
# Fails when a node source (core/src/node, tests beside the code included) finds a receiver layer
# with dynamic_cast, naming each place: the node reaches its layers through the typed pointers of
# its receiver stack (core/src/node/receiver_stack.h), built in one place.
#   check_no_layer_casts.sh [SOURCE_DIR] [DIR_OR_FILE...]   (relative to SOURCE_DIR; default
#   core/src/node)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
shift || true
cd "$root"
[ "$#" -gt 0 ] || set -- core/src/node
files=$(find "$@" -type f \( -name '*.cc' -o -name '*.h' \) | sort)
[ -n "$files" ] || { echo "check_no_layer_casts: no sources found under $*" >&2; exit 1; }
count=$(echo "$files" | wc -l)
hits=$(echo "$files" | xargs grep -Hn 'dynamic_cast' || true)
if [ -n "$hits" ]; then
  echo "$hits" | sed 's/^/check_no_layer_casts: dynamic_cast at /' >&2
  echo "check_no_layer_casts: $count files, $(echo "$hits" | wc -l) dynamic_cast(s): use the" \
    "receiver stack's typed layers (receiver_stack.h)" >&2
  exit 1
fi
echo "check_no_layer_casts: $count files, no dynamic_cast: OK"
