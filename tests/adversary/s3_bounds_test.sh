#!/usr/bin/env bash
# A lying S3 endpoint (tests/adversary/lying_s3.py, plain HTTP on loopback) against the real
# `dcr gc --store s3://...` (it lists the store and reads each version's header object): a body
# that never ends, a Content-Length of 10 TB, headers without end, a listing that loops and one
# that never ends, a header object whose GET never ends. Each is refused with a clear error naming
# the bound, within seconds, nothing deleted, and the process's peak RSS stays under $bound_kib.
# Needs no second user; label `adversary`; about 10 s.
#   s3_bounds_test.sh DCR
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
bound_kib=$((128 * 1024))
export DCR_S3_ACCESS_KEY=test DCR_S3_SECRET_KEY=test
srv=""
trap '[ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"' EXIT

against() {  # against MODE WANT-RC MESSAGE [SPEC-EXTRA]: dcr gc --dry-run against a lying server
  local mode=$1 want=$2 msg=$3 extra=${4:-}
  rm -f "$tmp/port"
  "$py" "$here/lying_s3.py" "$mode" "$tmp/port" & srv=$!
  wait_for "$tmp/port" 10 || { echo "FAIL $mode: server did not start"; fail=1; return; }
  local spec="s3://bkt?endpoint=http://127.0.0.1:$(cat "$tmp/port")&allow_http=1&read_deadline_s=5$extra"
  /usr/bin/time -f %M -o "$tmp/$mode.rss" timeout 60 "$dcr" gc --store "$spec" --dry-run \
    >"$tmp/$mode.out" 2>"$tmp/$mode.err"
  check "s3-$mode" "$want" $?
  has "s3-$mode-says" "$tmp/$mode.err" "$msg"
  local rss
  rss=$(tail -1 "$tmp/$mode.rss")
  if [ "$rss" -lt "$bound_kib" ]; then
    echo "ok   s3-$mode-rss ($rss KiB)"
  else
    echo "FAIL s3-$mode-rss: peak RSS $rss KiB, bound $bound_kib KiB"; fail=1
  fi
  kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null; srv=""
}

# DATA_LOSS is exit 13, RESOURCE_EXHAUSTED 19, DEADLINE_EXCEEDED 16.
against endless_body 13 "exceeds the 16777216 bytes this request takes"
against huge_length 13 "(Content-Length 10000000000000) exceeds"
against header_bomb 13 "headers exceed 65536 bytes"
against loop_list 13 "goes back from key"
against endless_list 19 "more than 20000 keys (max_list_keys)" "&max_list_keys=20000"
against endless_list 16 "not done after" "&list_deadline_s=1"
against endless_get 13 "exceeds the 1048576 bytes this request takes" "&max_get_bytes=1048576"
exit $fail
