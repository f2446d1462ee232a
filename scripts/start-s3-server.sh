#!/usr/bin/env bash
# Starts an S3 server for dcr's S3 tests: OpenStack Swift 2.30 (Debian packages) with s3api and
# tempauth on 127.0.0.1:8080. It verifies SigV4 signatures (a wrong secret gets 403).
# Everything (config, rings, data, logs, pids) lives in $DCR_S3_DIR (default /tmp/dcr-swift), so
# /etc/swift is never touched. Needs root (Swift runs as `user = root` on a root-owned devices
# dir) and the packages from `DCR_WITH_S3_SERVER=1 scripts/install-deps.sh`.
#
# In front of it, stunnel4 terminates TLS on 127.0.0.1:8443 with a certificate (SAN IP:127.0.0.1)
# signed by a test CA made here ($DCR_S3_DIR/tls/ca.crt), so that the S3 tests run over https with
# libcurl verifying the server against that CA.
# On success it prints the environment the S3 tests read:
#   export DCR_S3_ENDPOINT=https://127.0.0.1:8443 DCR_S3_CA_FILE=$DCR_S3_DIR/tls/ca.crt
#   export DCR_S3_ACCESS_KEY=test:tester DCR_S3_SECRET_KEY=testing DCR_S3_REGION=us-east-1
# and writes the same lines to $DCR_S3_DIR/env. Stop with scripts/stop-s3-server.sh.
set -euo pipefail
DIR=${DCR_S3_DIR:-/tmp/dcr-swift}
PORT=${DCR_S3_PORT:-8080}
TLS_PORT=${DCR_S3_TLS_PORT:-8443}
MEMCACHED_PORT=${DCR_S3_MEMCACHED_PORT:-11311}
for b in swift-proxy-server swift-account-server swift-container-server swift-object-server \
         swift-ring-builder memcached stunnel4 openssl; do
  command -v "$b" >/dev/null || { echo "start-s3-server: $b missing (DCR_WITH_S3_SERVER=1 scripts/install-deps.sh)" >&2; exit 1; }
done
if [ -f "$DIR/pids" ]; then
  "$(dirname "$0")/stop-s3-server.sh" >/dev/null 2>&1 || true
fi
rm -rf "$DIR"
mkdir -p "$DIR/conf" "$DIR/srv/d1" "$DIR/logs" "$DIR/cache"
C=$DIR/conf

cat > "$C/swift.conf" <<CONF
[swift-hash]
swift_hash_path_suffix = dcr-test-suffix
swift_hash_path_prefix = dcr-test-prefix
[storage-policy:0]
name = Policy-0
default = yes
CONF

common() {  # $1 = port
  cat <<CONF
[DEFAULT]
bind_ip = 127.0.0.1
bind_port = $1
user = root
devices = $DIR/srv
mount_check = false
swift_dir = $C
workers = 1
log_level = WARNING
CONF
}

{ common 6212; cat <<CONF
[pipeline:main]
pipeline = account-server
[app:account-server]
use = egg:swift#account
CONF
} > "$C/account-server.conf"
{ common 6211; cat <<CONF
[pipeline:main]
pipeline = container-server
[app:container-server]
use = egg:swift#container
CONF
} > "$C/container-server.conf"
{ common 6210; cat <<CONF
[pipeline:main]
pipeline = object-server
[app:object-server]
use = egg:swift#object
CONF
} > "$C/object-server.conf"
{ common "$PORT"; cat <<CONF
[pipeline:main]
pipeline = catch_errors gatekeeper proxy-logging cache listing_formats s3api tempauth copy slo dlo proxy-logging proxy-server
[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:proxy-logging]
use = egg:swift#proxy_logging
[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:$MEMCACHED_PORT
[filter:listing_formats]
use = egg:swift#listing_formats
[filter:s3api]
use = egg:swift#s3api
location = us-east-1
[filter:tempauth]
use = egg:swift#tempauth
user_test_tester = testing .admin
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
[filter:dlo]
use = egg:swift#dlo
CONF
} > "$C/proxy-server.conf"

cd "$C"
for ring in account:6212 container:6211 object:6210; do
  name=${ring%%:*}; port=${ring##*:}
  swift-ring-builder "$name.builder" create 8 1 1 >/dev/null
  swift-ring-builder "$name.builder" add "r1z1-127.0.0.1:$port/d1" 100 >/dev/null
  swift-ring-builder "$name.builder" rebalance >/dev/null
done

: > "$DIR/pids"
memcached -u root -l 127.0.0.1 -p "$MEMCACHED_PORT" -P "$DIR/memcached.pid" -d
sleep 0.2
cat "$DIR/memcached.pid" >> "$DIR/pids"
for s in account container object proxy; do
  # Debian's swift needs /usr/bin/python3 (the scripts' shebang).
  nohup "swift-$s-server" "$C/$s-server.conf" -v > "$DIR/logs/$s.log" 2>&1 &
  echo $! >> "$DIR/pids"
done

# The TLS terminator: a test CA, a server certificate for 127.0.0.1, stunnel forwarding to Swift.
T=$DIR/tls
mkdir -p "$T"
chmod 700 "$T"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj "/CN=dcr test CA" \
  -keyout "$T/ca.key" -out "$T/ca.crt" >/dev/null 2>&1
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$T/server.key" -out "$T/server.csr" >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$T/ext.cnf"
openssl x509 -req -in "$T/server.csr" -CA "$T/ca.crt" -CAkey "$T/ca.key" -CAcreateserial -days 7 \
  -extfile "$T/ext.cnf" -out "$T/server.crt" >/dev/null 2>&1
chmod 600 "$T/ca.key" "$T/server.key"
cat > "$C/stunnel.conf" <<CONF
pid = $DIR/stunnel.pid
foreground = no
output = $DIR/logs/stunnel.log
[s3]
accept = 127.0.0.1:$TLS_PORT
connect = 127.0.0.1:$PORT
cert = $T/server.crt
key = $T/server.key
sslVersionMin = TLSv1.2
CONF
stunnel4 "$C/stunnel.conf"
for i in $(seq 1 50); do [ -s "$DIR/stunnel.pid" ] && break; sleep 0.1; done
cat "$DIR/stunnel.pid" >> "$DIR/pids"

# Ready when the proxy answers through the terminator at all (an unsigned request gets 4xx).
for i in $(seq 1 300); do
  code=$(curl -s -m 2 --cacert "$T/ca.crt" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$TLS_PORT/" || true)
  if [ "${code:0:1}" = "4" ] || [ "${code:0:1}" = "2" ]; then
    ENV="export DCR_S3_ENDPOINT=https://127.0.0.1:$TLS_PORT DCR_S3_CA_FILE=$T/ca.crt DCR_S3_ACCESS_KEY=test:tester DCR_S3_SECRET_KEY=testing DCR_S3_REGION=us-east-1"
    echo "$ENV" > "$DIR/env"
    echo "$ENV"
    exit 0
  fi
  sleep 0.2
done
echo "start-s3-server: not ready after 60 s; logs in $DIR/logs" >&2
tail -n 20 "$DIR"/logs/*.log >&2 || true
exit 1
