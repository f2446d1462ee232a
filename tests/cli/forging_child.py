#!/usr/bin/env python3
"""A hostile relay-tree child for the commit-report test: it takes the sender's stream as rank 1
(plain TCP), drains it to the trailer (acking each blob), then sends one report frame holding its own record, the
same record again, and a forged committed record for rank --forge (a rank outside its subtree),
and holds the connection until the sender closes it."""
import argparse, socket, struct

MAGIC = 0x46524344
HDR = "<IBBHIIQQQQQQ"


def read_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError("closed")
        buf += chunk
    return buf


def record(rank, run, version, lo=0, hi=0):
    # Format 2 (core/src/node/commit_reports.h): the additive hash, the format marker and
    # number, no commitment root (zeros), no message; no tail (unsigned).
    body = struct.pack("<IIQQQQII", rank, 0, run, version, lo, hi, 0xFFFFFFFF, 2)
    body += bytes(32) + struct.pack("<I", 0)
    return struct.pack("<I", len(body)) + body + struct.pack("<I", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--forge", type=int, required=True)
    a = ap.parse_args()
    host, port = a.listen.rsplit(":", 1)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(4)
    conn, _ = srv.accept()
    hello = struct.unpack(HDR, read_exact(conn, 64))
    protocol, run, version = hello[3], hello[6], hello[7]
    while True:  # pieces until the trailer (blob kind 2) is whole; each whole blob acked
        h = struct.unpack(HDR, read_exact(conn, 64))
        if h[1] == 2:  # a piece (one stream: in order)
            read_exact(conn, h[11])
            if h[10] + h[11] == h[9]:
                conn.sendall(struct.pack(HDR, MAGIC, 3, 0, protocol, 1, 0, run, version, h[8],
                                         0, 0, 0))
                if h[2] == 2:
                    break
    payload = record(1, run, version) * 2 + record(a.forge, run, version, 0x1234, 0x5678)
    payload = struct.pack("<I", 3) + payload
    conn.sendall(struct.pack(HDR, MAGIC, 4, 0, protocol, 1, 0, run, version, 3, 0, 0,
                             len(payload)) + payload)
    conn.settimeout(20)
    try:
        while conn.recv(65536):
            pass
    except (OSError, socket.timeout):
        pass


if __name__ == "__main__":
    main()
