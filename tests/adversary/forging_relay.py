#!/usr/bin/env python3
"""A relay of the run that forges commit reports: it holds a real relay certificate of the run
(node-R.crt/.key from the run's credentials), listens on its rank's address, takes its parent's
connection, and answers its hello with a commit report claiming that every rank in CLAIM
committed the run and version the hello names, records it made up itself (unsigned). It then
drains what the parent sends until the parent closes.

  forging_relay.py HOST:PORT --rank R --cert C --key K --claim 1,2 [--for SECONDS] [--plain]

--plain: the edge is plain TCP (network.tls enabled: false), the certificate unused.

Prints "connected", then "reported N" once the report is sent, and "closed" at the end.
"""
import argparse
import socket
import ssl
import struct
import sys

MAGIC = 0x46524344
PROTOCOL = 2
HEADER = "<IBBHIIQQQQQQ"  # magic type kind protocol from_rank stream run version blob size off len


def record(rank, run, version):
    # Format 2 (core/src/node/commit_reports.h): the additive hash, the format marker and
    # number, a made-up commitment root, no message; no tail (unsigned).
    body = struct.pack("<IIQQQQII", rank, 0, run, version, 0x1234, 0x5678, 0xFFFFFFFF, 2)
    body += bytes(range(1, 33)) + struct.pack("<I", 0)
    return struct.pack("<I", len(body)) + body + struct.pack("<I", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--claim", required=True)
    ap.add_argument("--for", dest="seconds", type=float, default=30)
    ap.add_argument("--plain", action="store_true")
    a = ap.parse_args()
    host, port = a.address.rsplit(":", 1)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(8)
    srv.settimeout(a.seconds)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(a.cert, a.key)
    ctx.verify_mode = ssl.CERT_NONE  # whatever the parent presents
    reported = False
    try:
        raw, _ = srv.accept()
        conn = raw if a.plain else ctx.wrap_socket(raw, server_side=True)
        conn.settimeout(a.seconds)
        print("connected", flush=True)
        while True:
            h = b""
            while len(h) < 64:
                got = conn.recv(64 - len(h))
                if not got:
                    raise EOFError
                h += got
            magic, ftype, kind, proto, frm, stream, run, version, blob, size, off, length = \
                struct.unpack(HEADER, h)
            left = length if ftype in (2, 5) else 0
            while left > 0:
                got = conn.recv(min(left, 1 << 16))
                if not got:
                    raise EOFError
                left -= len(got)
            if not reported and ftype == 1:
                claims = [int(x) for x in a.claim.split(",")]
                payload = struct.pack("<I", len(claims)) + b"".join(
                    record(r, run, version) for r in claims)
                conn.sendall(struct.pack(HEADER, MAGIC, 4, 0, PROTOCOL, a.rank, 0, run, version,
                                         len(claims), 0, 0, len(payload)) + payload)
                reported = True
                print("reported %d" % len(claims), flush=True)
    except (EOFError, OSError, ssl.SSLError, socket.timeout):
        pass
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
