#!/usr/bin/env python3
"""Hostile peers for the adversarial tests: connects to dcr node ports and misbehaves.

  hostile_peer.py MODE HOST:PORT[,HOST:PORT...] [--send FILE] [--cert C --key K] [--plain]
                  [--for SECONDS] [--stop FILE] [--rank R] [--claim BYTES]
                  [--run ID] [--version N]

MODE:
  race     until --for seconds pass or --stop FILE exists, connect to every address in turn as fast as
           it can; on each connection it gets, claim rank 0 and stream FILE as header pieces (TLS
           with C/K when given, none otherwise; plain TCP with --plain). Prints one line per
           connection it got ("refused: ..." or "sent", as tls_peer.py) and a last line
           "connections N".
  garbage  one plain TCP connection sending 64 KiB of random bytes; prints "refused: ..." when the
           node closed it, "kept" when the node still holds it open 8 s later.
  silent   one plain TCP connection that sends nothing; prints "closed after S s" when the node drops
           it, "kept" when it is still open after 20 s.
  huge     TLS (C/K) or --plain: a valid hello from --rank (default 0) then one piece frame claiming a blob of
           --claim bytes (default 2^62); prints "refused: ..." or "kept" as garbage.
  header   TLS (C/K) or --plain: a valid hello from --rank (default 0) then FILE (--send) as the whole
           header blob of the stream; prints "refused: ..." or "kept" as garbage.
Frames carry run id ID and version N (default 0 and 0). Exit 0 whatever the node did; 2 on usage errors. Uses only the standard library.
"""
import argparse
import os
import socket
import ssl
import struct
import time

MAGIC = 0x46524344


RUN = 0      # --run: the run id its frames carry
VERSION = 0  # --version: the version number its frames carry
PROTOCOL = 2  # dcr wire protocol of core/src/transport/net.h


def frame(ftype, from_rank, stream, blob, blob_size, offset, length, blob_kind=0):
    return struct.pack("<IBBHIIQQQQQQ", MAGIC, ftype, blob_kind, PROTOCOL, from_rank, stream, RUN,
                       VERSION, blob, blob_size, offset, length)


def wrap(raw, a):
    if a.plain:
        return raw
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if a.cert:
        ctx.load_cert_chain(a.cert, a.key)
    return ctx.wrap_socket(raw, server_hostname="dcr")


def held(conn, seconds):
    """True when the node keeps `conn` open for `seconds` (reads and discards what it sends)."""
    end = time.time() + seconds
    while time.time() < end:
        conn.settimeout(max(0.05, end - time.time()))
        try:
            if conn.recv(4096) == b"":
                return False
        except socket.timeout:
            return True
        except (ssl.SSLError, OSError):
            return False
    return True


def stream_file(conn, payload):
    conn.sendall(frame(1, 0, 0, 1, 0, 0, 0))
    piece = 64 << 10
    for off in range(0, len(payload), piece):
        chunk = payload[off:off + piece]
        conn.sendall(frame(2, 0, 0, 1, len(payload), off, len(chunk)) + chunk)


def race(addrs, a):
    payload = open(a.send, "rb").read()
    end = time.time() + a.seconds
    got = 0
    while time.time() < end and not (a.stop and os.path.exists(a.stop)):
        for host, port in addrs:
            try:
                raw = socket.create_connection((host, port), timeout=0.2)
            except OSError:
                continue
            got += 1
            conn = raw
            try:
                conn = wrap(raw, a)
                stream_file(conn, payload)
                print("sent" if held(conn, 1.0) else "refused: the node closed the connection",
                      flush=True)
            except (ssl.SSLError, OSError) as e:
                print("refused: %s" % e, flush=True)
            finally:
                conn.close()
        time.sleep(0.001)
    print("connections %d" % got)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["race", "garbage", "silent", "huge", "header"])
    ap.add_argument("addresses")
    ap.add_argument("--send")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--for", dest="seconds", type=float, default=30)
    ap.add_argument("--stop")
    ap.add_argument("--rank", type=int, default=0, help="huge: the rank its hello claims")
    ap.add_argument("--claim", type=int, default=1 << 62, help="huge: the blob size claimed")
    ap.add_argument("--run", type=lambda x: int(x, 0), default=0,
                    help="the run id its frames carry (e.g. 0x1f...)")
    ap.add_argument("--version", type=int, default=0, help="the version number its frames carry")
    a = ap.parse_args()
    global RUN, VERSION
    RUN, VERSION = a.run, a.version
    addrs = [(h, int(p)) for h, p in (x.rsplit(":", 1) for x in a.addresses.split(","))]
    if a.mode == "race":
        if not a.send:
            ap.error("race needs --send FILE")
        race(addrs, a)
        return 0
    host, port = addrs[0]
    raw = socket.create_connection((host, port), timeout=10)
    conn = raw
    try:
        if a.mode == "garbage":
            raw.sendall(os.urandom(64 << 10))
            print("kept" if held(raw, 8) else "refused: the node closed the connection")
        elif a.mode == "silent":
            t0 = time.time()
            print("kept" if held(raw, 20) else "closed after %.1f s" % (time.time() - t0))
        elif a.mode == "header":
            payload = open(a.send, "rb").read()
            conn = wrap(raw, a)
            conn.sendall(frame(1, a.rank, 0, 1, 0, 0, 0))
            conn.sendall(frame(2, a.rank, 0, 0, len(payload), 0, len(payload)) + payload)
            print("kept" if held(conn, 8) else "refused: the node closed the connection")
        else:
            conn = wrap(raw, a)
            conn.sendall(frame(1, a.rank, 0, 1, 0, 0, 0))
            conn.sendall(frame(2, a.rank, 0, 1, a.claim, 0, 4096) + bytes(4096))
            print("kept" if held(conn, 8) else "refused: the node closed the connection")
    except (ssl.SSLError, OSError) as e:
        print("refused: %s" % e)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
