#!/usr/bin/env bash
# Stops the Swift S3 server started by scripts/start-s3-server.sh (by recorded PID only).
set -uo pipefail
DIR=${DCR_S3_DIR:-/tmp/dcr-swift}
[ -f "$DIR/pids" ] || { echo "stop-s3-server: nothing recorded in $DIR/pids"; exit 0; }
while read -r pid; do
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
done < "$DIR/pids"
sleep 0.5
while read -r pid; do
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
done < "$DIR/pids"
rm -f "$DIR/pids"
echo "stop-s3-server: stopped"
