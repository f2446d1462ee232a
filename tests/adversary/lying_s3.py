#!/usr/bin/env python3
"""A lying S3 endpoint on loopback, for the bounds tests of S3Store (plain HTTP, no auth check).

    lying_s3.py MODE PORT_FILE

Listens on 127.0.0.1 (a free port, written to PORT_FILE) until killed. Modes:
  endless_body  every GET answers 200 with a chunked body that never ends
  huge_length   every GET answers 200 with Content-Length 10^13, then 64 KiB at a time
  header_bomb   every answer carries header after header, without end
  loop_list     a listing page of the same 1000 keys, truncated, with a new token each time
  endless_list  listing pages of 1000 new, increasing keys each, truncated, without end
  endless_get   a listing of one delta header object (r/v1/0000000000.hdr) whose GET never ends
Stdlib only.
"""
import http.server
import socketserver
import sys

MODE = sys.argv[1]
CHUNK = b"\0" * 65536


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def endless_chunked(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        line = b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n"
        try:
            while True:
                self.wfile.write(line)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def listing(self, keys, truncated, token):
        body = ['<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>']
        for k in keys:
            body.append("<Contents><Key>%s</Key><Size>100</Size></Contents>" % k)
        body.append("<IsTruncated>%s</IsTruncated>" % ("true" if truncated else "false"))
        if truncated:
            body.append("<NextContinuationToken>%s</NextContinuationToken>" % token)
        body.append("</ListBucketResult>")
        data = "".join(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self):
        if MODE == "header_bomb":
            return self.header_bomb()
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def header_bomb(self):
        self.send_response(200)
        self.flush_headers()  # the status line, then header lines without end
        try:
            for i in range(10 ** 9):
                self.wfile.write(b"X-Filler-%d: %s\r\n" % (i, b"y" * 200))
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def do_GET(self):
        listing = "list-type=2" in self.path
        token = 0
        if "continuation-token=" in self.path:
            token = int(self.path.split("continuation-token=")[1].split("&")[0].lstrip("t") or 0)
        if MODE == "endless_body":
            return self.endless_chunked()
        if MODE == "header_bomb":
            return self.header_bomb()
        if MODE == "huge_length":
            self.send_response(200)
            self.send_header("Content-Length", str(10 ** 13))
            self.end_headers()
            try:
                while True:
                    self.wfile.write(CHUNK)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True
            return
        if MODE == "loop_list" and listing:
            return self.listing(["r/v1/%010d.chk" % i for i in range(1000)], True,
                                "t%d" % (token + 1))
        if MODE == "endless_list" and listing:
            keys = ["r/v1/%010d.chk" % (token * 1000 + i) for i in range(1000)]
            return self.listing(keys, True, "t%d" % (token + 1))
        if MODE == "endless_get":
            if listing:
                keys = [] if "prefix=ow" in self.path else ["r/v1/0000000000.hdr"]
                return self.listing(keys, False, "")
            return self.endless_chunked()
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


srv = Server(("127.0.0.1", 0), Handler)
with open(sys.argv[2], "w") as f:
    f.write(str(srv.server_address[1]))
srv.serve_forever()
