#!/usr/bin/env python3
"""Hostile delta files for the bounds tests: a real delta with one chunk record replaced.

    craft.py KIND DELTA OUT [TENSOR]

DELTA is a delta `dcr diff` wrote (its header is kept, so the layout a decoder checks against is
the real one); OUT gets the same header, the crafted record in place of the first chunk record,
the other records and a full trailer (core/FORMAT.md 2.3) that lists them. TENSOR (default 0) is
the inventory index (tensors sorted by name) the record names. Kinds:

  zstd_bomb     a plain record (dense, absolute, 1-byte elements) over 2^30 elements of TENSOR
                whose one value stream is a zstd frame of RLE blocks: 32 KiB that expand to 1 GiB.
  context_wide  a compact context-coded record (core/FORMAT.md 2.2.1) over 2^33 BF16 elements of
                tensor 0 (a decoder that gathers its base bits allocates 16 GiB), 108 bytes.
  segments_wrap a plain record whose one segment has counts 2^32 x 2^32 (their product wraps to 0
                in 64 bits) and another segment that covers the chunk's elements.

Checksums are right, so only the bounds can refuse the record. Stdlib and libxxhash only.
"""
import ctypes
import struct
import sys

_x = ctypes.CDLL("libxxhash.so.0")
_x.XXH3_64bits.restype = ctypes.c_uint64
_x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def h64(b):
    b = bytes(b)
    return _x.XXH3_64bits(b, len(b))


def leb(v):
    out = bytearray()
    while True:
        c = v & 0x7F
        v >>= 7
        if v:
            out.append(c | 0x80)
        else:
            out.append(c)
            return bytes(out)


def read_leb(b, p):
    v, s = 0, 0
    while True:
        c = b[p]
        p += 1
        v |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return v, p


def split(d):
    """(header bytes, [(chunk_id, record bytes)], target_hash) of a delta; records in file order."""
    t = struct.unpack_from("<Q", d, len(d) - 24)[0]
    entries = []
    if d[t:t + 8] == b"DCRTABLE":
        n = struct.unpack_from("<Q", d, t + 8)[0]
        p = t + 16
        for _ in range(n):
            entries.append(struct.unpack_from("<QQQ", d, p))
            p += 24
    elif d[t:t + 8] == b"DCRTABLC":
        n, p = read_leb(d, t + 8)
        prev_id = prev_end = 0
        for _ in range(n):
            zi, p = read_leb(d, p)
            zo, p = read_leb(d, p)
            size, p = read_leb(d, p)
            unz = lambda z: (z >> 1) ^ -(z & 1)
            cid = (prev_id + unz(zi)) % (1 << 64)
            off = (prev_end + unz(zo)) % (1 << 64)
            entries.append((cid, off, size))
            prev_id, prev_end = cid, off + size
    else:
        raise SystemExit("craft.py: no trailer found")
    target_hash = d[len(d) - 40:len(d) - 24]
    entries.sort(key=lambda e: e[1])
    header_end = entries[0][1]
    # Manifest records (signed deltas) sit between chunk records: the crafting keeps unsigned
    # deltas only, where every byte between the header and the trailer is a listed record.
    return d[:header_end], [(cid, d[off:off + size]) for cid, off, size in entries], target_hash


def join(header, records, target_hash):
    out = bytearray(header)
    table = []
    for cid, rec in records:
        table.append((cid, len(out), len(rec)))
        out += rec
    t = len(out)
    tr = bytearray(b"DCRTABLE" + struct.pack("<Q", len(table)))
    for e in table:
        tr += struct.pack("<QQQ", *e)
    tr += target_hash + struct.pack("<Q", t)
    tr += struct.pack("<Q", h64(tr))
    return bytes(out + tr + b"DCREND\0\0")


def plain_record(chunk_id, pm, vm, w, segments, num_elements, num_changes, streams, payload):
    """A full chunk header (FORMAT.md 2.2) + payload. segments: [(tensor, offset, [(count, stride)])],
    streams: [(codec, raw_size, stored_size)]."""
    h = bytearray(b"DCRC" + struct.pack("<I", 0))
    h += struct.pack("<QBBBBIQQ", chunk_id, pm, vm, w, 0, len(segments), num_elements, num_changes)
    h += bytes(64)  # four Hash128: checked only after a decode
    h += struct.pack("<I", len(streams))
    for codec, raw, stored in streams:
        h += struct.pack("<BQQ", codec, raw, stored)
    for tensor, offset, dims in segments:
        h += struct.pack("<IIQ", tensor, len(dims), offset)
        for count, stride in dims:
            h += struct.pack("<Qq", count, stride)
    h += struct.pack("<Q", h64(payload))
    struct.pack_into("<I", h, 4, len(h) + 8)
    h += struct.pack("<Q", h64(h))
    return bytes(h) + payload


def rle_zstd_frame(size):
    """A zstd frame of `size` zero bytes in RLE blocks of 128 KiB (4 bytes each), content size set."""
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    out += bytes([0xC0, 0x38])  # FCS in 8 bytes, not single segment; window 2^17
    out += struct.pack("<Q", size)
    left = size
    while left > 0:
        n = min(left, 1 << 17)
        left -= n
        hdr = (1 if left == 0 else 0) | (1 << 1) | (n << 3)
        out += struct.pack("<I", hdr)[:3] + b"\0"
    return bytes(out)


def compact_context_record(chunk_id, tensor, count, num_changes, body):
    """A compact context-coded record (FORMAT.md 2.2.1): BF16, ulp delta, one 1-D segment."""
    modes = 4 | (1 << 4) | (1 << 6)
    fields = leb(chunk_id) + bytes([modes]) + leb(1) + leb(count) + leb(num_changes)
    fields += bytes(64) + leb(len(body))
    fields += leb(tensor) + bytes([1]) + leb(0) + leb(count) + leb(2)  # zigzag(1) = 2
    fields += struct.pack("<Q", h64(body))
    # header_size counts itself: find the fixed point of its LEB length.
    size = 4 + 1 + len(fields) + 8
    while 4 + len(leb(size)) + len(fields) + 8 != size:
        size = 4 + len(leb(size)) + len(fields) + 8
    h = b"DCRX" + leb(size) + fields
    return h + struct.pack("<Q", h64(h)) + body


def main():
    kind, src, dst = sys.argv[1:4]
    tensor = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    header, records, target_hash = split(open(src, "rb").read())
    cid = records[0][0]
    if kind == "zstd_bomb":
        n = 1 << 30
        frame = rle_zstd_frame(n)
        rec = plain_record(cid, 2, 2, 1, [(tensor, 0, [(n, 1)])], n, n, [(1, n, len(frame))], frame)
    elif kind == "context_wide":
        rec = compact_context_record(cid, tensor, 1 << 33, 1, bytes(16))
    elif kind == "segments_wrap":
        frame = rle_zstd_frame(1 << 20)
        segs = [(tensor, 0, [(1 << 32, 0), (1 << 32, 0)]), (tensor, 0, [(1 << 20, 0)])]
        rec = plain_record(cid, 2, 2, 1, segs, 1 << 20, 1 << 20, [(1, 1 << 20, len(frame))], frame)
    else:
        raise SystemExit("craft.py: unknown kind " + kind)
    records[0] = (cid, rec)
    open(dst, "wb").write(join(header, records, target_hash))
    print(f"{kind}: record of {len(rec)} bytes")


if __name__ == "__main__":
    main()
