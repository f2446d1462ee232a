#!/usr/bin/env python3
"""A relay of the run that alters the bytes it forwards: it holds a real relay certificate of the
run (node-R.crt/.key from the run's `dcr keys`), listens on its rank's address and takes its
parent's connection, dials its child with the same certificate, and pumps frames both ways as a
relay does (every frame's from_rank rewritten to its own rank). On the way down it flips the last
payload byte of every piece of every chunk record (blob starting "DCRC"): the records a signed
manifest lists, altered in flight. With --full (the full-checkpoint stream) it alters every slice
instead (a chunk blob that does not start with the manifest mark, 8 bytes 0xff). Manifests,
header and trailer pass unchanged.

  altering_relay.py LISTEN_HOST:PORT CHILD_HOST:PORT --rank R --cert C --key K --ca CA
                    [--for SECONDS] [--full]

Prints "connected", "child connected", "altered N pieces" when the parent's stream ends, and
"closed" at the end.
"""
import argparse
import socket
import ssl
import struct
import threading
import time

HEADER = "<IBBHIIQQQQQQ"  # magic type kind protocol from_rank stream run version blob size off len
PIECE, ABORT, REPORT = 2, 5, 4
CHUNK_KIND = 1


def read_exact(conn, n):
    b = bytearray()
    while len(b) < n:
        got = conn.recv(n - len(b))
        if not got:
            raise EOFError
        b += got
    return bytes(b)


def pump(src, dst, rank, alter, counter, done, full=False):
    starts = {}  # blob -> first 4 payload bytes
    try:
        while True:
            h = list(struct.unpack(HEADER, read_exact(src, 64)))
            ftype, kind, blob, off, length = h[1], h[2], h[8], h[10], h[11]
            payload = read_exact(src, length) if ftype in (PIECE, ABORT, REPORT) else b""
            h[4] = rank
            if alter and ftype == PIECE and kind == CHUNK_KIND and length > 0:
                if off == 0:
                    starts[blob] = payload[:8] if full else payload[:4]
                altered = (starts.get(blob, b"")[:4] != b"\xff" * 4) if full else \
                    starts.get(blob) == b"DCRC"
                if altered:
                    payload = payload[:-1] + bytes([payload[-1] ^ 0x20])
                    counter[0] += 1
            if dst is not None:
                try:
                    dst.sendall(struct.pack(HEADER, *h) + payload)
                except (OSError, ssl.SSLError, socket.timeout):
                    dst = None  # the other side is gone: keep reading this one until it ends
    except (EOFError, OSError, ssl.SSLError, socket.timeout):
        pass
    finally:
        done.set()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("listen")
    ap.add_argument("child")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--for", dest="seconds", type=float, default=30)
    ap.add_argument("--full", action="store_true")
    a = ap.parse_args()
    host, port = a.listen.rsplit(":", 1)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(8)
    srv.settimeout(a.seconds)
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.minimum_version = ssl.TLSVersion.TLSv1_3
    sctx.load_cert_chain(a.cert, a.key)
    sctx.verify_mode = ssl.CERT_NONE  # whatever the parent presents
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.minimum_version = ssl.TLSVersion.TLSv1_3
    cctx.load_cert_chain(a.cert, a.key)
    cctx.load_verify_locations(a.ca)
    cctx.check_hostname = False
    altered = [0]
    try:
        raw, _ = srv.accept()
        up = sctx.wrap_socket(raw, server_side=True)
        up.settimeout(a.seconds)
        print("connected", flush=True)
        chost, cport = a.child.rsplit(":", 1)
        deadline = time.time() + a.seconds
        while True:
            try:
                craw = socket.create_connection((chost, int(cport)), timeout=a.seconds)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        down = cctx.wrap_socket(craw)
        down.settimeout(a.seconds)
        print("child connected", flush=True)
        down_done, up_done = threading.Event(), threading.Event()
        threading.Thread(target=pump, args=(up, down, a.rank, True, altered, down_done, a.full),
                         daemon=True).start()
        threading.Thread(target=pump, args=(down, up, a.rank, False, [0], up_done),
                         daemon=True).start()
        while not (down_done.is_set() or up_done.is_set()):
            time.sleep(0.05)
        print("altered %d pieces" % altered[0], flush=True)
        if down_done.is_set() and not up_done.is_set():
            # The parent's stream ended: end the child's gracefully (FIN after every forwarded
            # byte) and read it until it closes. Closing a socket with unread bytes sends a
            # reset, which can discard what the child has not yet read.
            try:
                socket.socket.shutdown(down, socket.SHUT_WR)  # the TCP half only
            except OSError:
                pass
            up_done.wait(a.seconds)
        for c in (up, down):
            try:
                c.close()
            except OSError:
                pass
    except (EOFError, OSError, ssl.SSLError, socket.timeout):
        pass
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
