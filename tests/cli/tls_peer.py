#!/usr/bin/env python3
"""A peer that is not the node's real parent: connects to a dcr node's listening port, claims to be
its parent and streams the bytes of FILE as pieces (the frames of core/src/transport/net.h).

  tls_peer.py HOST:PORT --rank R --send FILE [--plain | --cert C --key K] [--ca CA]
              [--run ID] [--version N]

--plain: plain TCP (no TLS). Otherwise TLS 1.3 with the client certificate C/K if given (none
otherwise); the node's own certificate is checked against CA when given. Prints one line, the
outcome: "refused: ..." when the node closed the connection or failed the handshake before the
whole stream was taken, "sent" when every byte went out and the node kept the connection open
for 2 s afterwards (that is: the node did not drop it). Its frames carry run id ID and version N
(default 0 and 0); a node of another run or version drops its hello. Exit 0 either way; 2 on usage errors.
"""
import argparse
import socket
import ssl
import struct
import sys
import time

MAGIC = 0x46524344


RUN = 0      # --run: the run id its frames carry
VERSION = 0  # --version: the version number its frames carry
PROTOCOL = 2  # dcr wire protocol of core/src/transport/net.h


def frame(ftype, from_rank, stream, blob, blob_size, offset, length, blob_kind=0):
    return struct.pack("<IBBHIIQQQQQQ", MAGIC, ftype, blob_kind, PROTOCOL, from_rank, stream, RUN,
                       VERSION, blob, blob_size, offset, length)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--send", required=True)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--ca")
    ap.add_argument("--run", type=lambda x: int(x, 0), default=0,
                    help="the run id its frames carry (e.g. 0x1f...)")
    ap.add_argument("--version", type=int, default=0, help="the version number its frames carry")
    a = ap.parse_args()
    global RUN, VERSION
    RUN, VERSION = a.run, a.version
    host, port = a.address.rsplit(":", 1)
    payload = open(a.send, "rb").read()
    raw = socket.create_connection((host, int(port)), timeout=10)
    conn = raw
    try:
        if not a.plain:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.check_hostname = False
            if a.ca:
                ctx.load_verify_locations(a.ca)
            else:
                ctx.verify_mode = ssl.CERT_NONE
            if a.cert:
                ctx.load_cert_chain(a.cert, a.key)
            conn = ctx.wrap_socket(raw, server_hostname="dcr")
        # The hello of stream 0 of 1, then the file as header-kind pieces of blob 1.
        conn.sendall(frame(1, a.rank, 0, 1, 0, 0, 0))
        piece = 64 << 10
        for off in range(0, len(payload), piece):
            chunk = payload[off:off + piece]
            conn.sendall(frame(2, a.rank, 0, 1, len(payload), off, len(chunk), blob_kind=0) + chunk)
        conn.settimeout(2.0)
        try:
            got = conn.recv(1)
            if got == b"":
                print("refused: the node closed the connection")
                return 0
        except socket.timeout:
            print("sent")
            return 0
        print("sent")
    except (ssl.SSLError, OSError) as e:
        print("refused: %s" % e)
    finally:
        try:
            conn.close()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
