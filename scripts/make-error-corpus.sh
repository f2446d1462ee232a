#!/usr/bin/env bash
# Regenerates tests/golden-errors/ (the malformed-input corpus) from the golden files.
# Usage: scripts/make-error-corpus.sh [path/to/dcr]   (run from the source root after the golden files)
# old_version_v1.dcr is kept, not generated: the golden delta of format version 1, which this
# build must refuse by its version.
set -euo pipefail
dcr="${1:-build/dcr}"
g=tests/golden
e=tests/golden-errors
mkdir -p "$e"
"$dcr" diff -q "$g/target.safetensors" "$g/base.safetensors" -o "$e/wrong_base.dcr"
python3 - "$g" "$e" <<'PY'
import json, struct, sys
g, e = sys.argv[1], sys.argv[2]
d = open(f"{g}/v4_delta.dcr", "rb").read()
def w(name, data): open(f"{e}/{name}", "wb").write(bytes(data))
w("empty.dcr", b"")
w("truncated_magic.dcr", d[:5])
w("truncated_header.dcr", d[:40])
w("truncated_middle.dcr", d[: len(d) // 2])
w("truncated_tail.dcr", d[:-3])
w("bad_magic.dcr", b"XCRDELTA" + d[8:])
bad = bytearray(d); bad[8:12] = struct.pack("<I", 99); w("wrong_version.dcr", bad)
bad = bytearray(d); bad[30] ^= 0x10; w("header_bitflip.dcr", bad)
# The first chunk record follows the header: find its magic.
c = d.index(b"DCRC")
bad = bytearray(d); bad[c + 20] ^= 0x01; w("chunk_header_bitflip.dcr", bad)
hsize = struct.unpack_from("<I", d, c + 4)[0]
bad = bytearray(d); bad[c + hsize + 2] ^= 0x40; w("chunk_payload_bitflip.dcr", bad)
t = d.rindex(b"DCRTABLE")
bad = bytearray(d); bad[t + 8:t + 16] = struct.pack("<Q", (1 << 62)); w("huge_chunk_count.dcr", bad)
bad = bytearray(d); bad[-24:-16] = struct.pack("<Q", len(d) + 1000); w("bad_trailer_offset.dcr", bad)
bad = bytearray(d); bad[t + 20] ^= 0x02; w("trailer_bitflip.dcr", bad)
# Version 5 header sections (the delta to a sharded target): counts and sizes are checked before
# anything is allocated; a bit flip in a shard's header fails the checksum.
v5 = open(f"{g}/v5_sharded.dcr", "rb").read()
bad = bytearray(v5); bad[48:52] = struct.pack("<I", 0xFFFFFFFF); w("v5_absurd_sections.dcr", bad)
bad = bytearray(v5); bad[56:60] = struct.pack("<I", 0xFFFFFFF0); w("v5_section_over_cap.dcr", bad)
bad = bytearray(v5); bad[v5.index(b'"dtype"')] ^= 0x01; w("v5_shard_header_bitflip.dcr", bad)
w("v5_truncated_sections.dcr", v5[:200])
# Malformed safetensors.
def st(name, header, data=b"", raw_len=None):
    h = header.encode() if isinstance(header, str) else header
    n = len(h) if raw_len is None else raw_len
    w(name, struct.pack("<Q", n) + h + data)
st("st_bad_json.safetensors", '{"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]')
st("st_overlap.safetensors", json.dumps({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
                                         "b": {"dtype": "BF16", "shape": [4], "data_offsets": [4, 12]}}), b"\0" * 12)
st("st_out_of_range.safetensors", json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}), b"\0" * 8)
st("st_shape_mismatch.safetensors", json.dumps({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}), b"\0" * 16)
st("st_absurd_header.safetensors", b"{}", raw_len=1 << 40)
st("st_shape_overflow.safetensors", json.dumps({"a": {"dtype": "U8", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 0]}}))
w("st_tiny.safetensors", b"\x01\x02")
st("st_duplicate_name.safetensors", '{"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}, '
                                    '"a": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 8]}}', b"\0" * 8)
st("st_duplicate_field.safetensors", '{"a": {"dtype": "F32", "dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}',
   b"\0" * 4)
st("st_gap.safetensors", json.dumps({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                                     "b": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]}}), b"\0" * 12)
st("st_trailing_bytes.safetensors", json.dumps({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}),
   b"\0" * 12)
st("st_unknown_dtype_huge_shape.safetensors",
   json.dumps({"a": {"dtype": "X9", "shape": [1 << 40, 1 << 20], "data_offsets": [0, 4]}}), b"\0" * 4)
# Other files given where a checkpoint is expected: a delta, a sharded checkpoint's index, JSON.
w("st_is_delta.safetensors", d)
w("st_is_index.safetensors", json.dumps({"metadata": {"total_size": 16}, "weight_map": {
    "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}, indent=2).encode())
w("st_is_json.safetensors", b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}\n')
PY
# Context-coded chunks (format version 6 bodies), against tests/golden/float_base.safetensors (kind
# ctxdelta). Checksums are resealed, so the body's own checks answer: the positions hash (the
# body's first 8 bytes), the value mode byte (a context chunk has relative values), the last byte of
# the extra bits; and a delta encoded against another base whose header names this base (its
# chunks do not decode against this base).
python3 - "$g" "$e" <<'PY'
import ctypes, struct, sys
g, e = sys.argv[1], sys.argv[2]
x = ctypes.CDLL("libxxhash.so.0")
x.XXH3_64bits.restype = ctypes.c_uint64
x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
def h64(b): return x.XXH3_64bits(bytes(b), len(b))
def w(name, data): open(f"{e}/{name}", "wb").write(bytes(data))
d = bytearray(open(f"{g}/v6_context.dcr", "rb").read())
c = d.index(b"DCRC")
while d[c + 16] != 3: c = d.index(b"DCRC", c + 4)  # the first context-coded chunk
hsize = struct.unpack_from("<I", d, c + 4)[0]
body_size = struct.unpack_from("<Q", d, c + 117)[0]  # its one stream's stored_size
def reseal(b):
    body = b[c + hsize:c + hsize + body_size]
    struct.pack_into("<Q", b, c + hsize - 16, h64(body))
    struct.pack_into("<Q", b, c + hsize - 8, h64(b[c:c + hsize - 8]))
    return b
bad = bytearray(d); bad[c + hsize + 2] ^= 0x55; w("ctx_positions_hash.dcr", reseal(bad))
bad = bytearray(d); bad[c + 17] = 2; w("ctx_absolute.dcr", reseal(bad))
bad = bytearray(d); bad[c + hsize + body_size - 1] ^= 0x80; w("ctx_extra_bits.dcr", reseal(bad))
b = bytearray(open(f"{g}/float_base.safetensors", "rb").read())
t = bytearray(open(f"{g}/float_target.safetensors", "rb").read())
n = struct.unpack_from("<Q", b, 0)[0]
# Every 7th BF16 element that does not change gets another exponent in both.
for off in range(8 + n, len(b) - 1, 14):
    if b[off:off + 2] == t[off:off + 2]:
        b[off + 1] ^= 0x01
        t[off + 1] ^= 0x01
w(".wrong_base.safetensors", b)
w(".wrong_target.safetensors", t)
PY
"$dcr" diff -q --wan-context --chunk-elems 4096 --small-elems 1000 --base-version 1 --target-version 2 \
  "$e/.wrong_base.safetensors" "$e/.wrong_target.safetensors" -o "$e/.wrong_base.dcr"
python3 - "$g" "$e" <<'PY'
import ctypes, struct, sys
g, e = sys.argv[1], sys.argv[2]
x = ctypes.CDLL("libxxhash.so.0")
x.XXH3_64bits.restype = ctypes.c_uint64
x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
right = open(f"{g}/v6_context.dcr", "rb").read()
d = bytearray(open(f"{e}/.wrong_base.dcr", "rb").read())
d[24:40] = right[24:40]  # base_hash: the golden float base's
hend = min(d.find(m) % len(d) for m in (b"DCRC", b"DCRX"))  # the header ends where the first chunk starts
struct.pack_into("<Q", d, hend - 8, x.XXH3_64bits(bytes(d[:hend - 8]), hend - 8))
open(f"{e}/ctx_wrong_base.dcr", "wb").write(d)
PY
rm -f "$e/.wrong_base.safetensors" "$e/.wrong_target.safetensors" "$e/.wrong_base.dcr"
# Version-7 bodies (position mode 4), against the same base: the first geometric model's form
# byte made unknown, and its ratio made 0; checksums resealed as above.
python3 - "$g" "$e" <<'PY'
import ctypes, struct, sys
g, e = sys.argv[1], sys.argv[2]
x = ctypes.CDLL("libxxhash.so.0")
x.XXH3_64bits.restype = ctypes.c_uint64
x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
def h64(b): return x.XXH3_64bits(bytes(b), len(b))
def w(name, data): open(f"{e}/{name}", "wb").write(bytes(data))
def varint(b, p):
    v, s = 0, 0
    while True:
        c = b[p]; p += 1; v |= (c & 0x7F) << s; s += 7
        if not c & 0x80: return v, p
d = bytearray(open(f"{g}/v7_context.dcr", "rb").read())
c = d.index(b"DCRC")
hsize = body_size = geo = None
while geo is None:
    while d[c + 16] != 4: c = d.index(b"DCRC", c + 4)  # the next context-coded chunk
    hsize = struct.unpack_from("<I", d, c + 4)[0]
    body_size = struct.unpack_from("<Q", d, c + 117)[0]
    b0 = c + hsize
    k = d[b0 + 8]; p = b0 + 9 + k - 1
    kc = []
    for _ in range(k):
        v, p = varint(d, p); kc.append(v)
    for n in kc:
        if n == 0: continue
        for role in range(2):
            s, p = varint(d, p)
            if s == 0:
                if d[p] == 0 and geo is None: geo = p
                p += 4 if d[p] == 0 else 1
                continue
            sym = 0
            while sym < s:
                f, p = varint(d, p)
                if f: sym += 1
                else:
                    z, p = varint(d, p); sym += z + 1
    if geo is None: c += 4
def reseal(b):
    body = b[c + hsize:c + hsize + body_size]
    struct.pack_into("<Q", b, c + hsize - 16, h64(body))
    struct.pack_into("<Q", b, c + hsize - 8, h64(b[c:c + hsize - 8]))
    return b
bad = bytearray(d); bad[geo] = 7; w("ctx7_unknown_model_form.dcr", reseal(bad))
bad = bytearray(d); bad[geo + 2] = 0; bad[geo + 3] = 0; w("ctx7_geometric_ratio_zero.dcr", reseal(bad))
PY
# Version-8 parts (compact header sections, records and trailer), against the same base: a compact
# record's modes byte saying position mode 1, the first zstd section's frame magic broken, and a
# compact trailer's chunk count absurd; checksums resealed as above.
python3 - "$g" "$e" <<'PY'
import ctypes, struct, sys
g, e = sys.argv[1], sys.argv[2]
x = ctypes.CDLL("libxxhash.so.0")
x.XXH3_64bits.restype = ctypes.c_uint64
x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
def h64(b): return x.XXH3_64bits(bytes(b), len(b))
def w(name, data): open(f"{e}/{name}", "wb").write(bytes(data))
def varint(b, p):
    v, s = 0, 0
    while True:
        c = b[p]; p += 1; v |= (c & 0x7F) << s; s += 7
        if not c & 0x80: return v, p
d = bytearray(open(f"{g}/v8_context.dcr", "rb").read())
c = d.index(b"DCRX")  # the first compact context record
hsize, p = varint(d, c + 4)
_, modes = varint(d, p)
bad = bytearray(d); bad[modes] = (bad[modes] & 0xF0) | 1
struct.pack_into("<Q", bad, c + hsize - 8, h64(bad[c:c + hsize - 8])); w("ctx8_position_mode.dcr", bad)
hend = min(d.find(m) % len(d) for m in (b"DCRC", b"DCRX"))
assert struct.unpack_from("<I", d, 52)[0] == 0x80000003  # the first section is a zstd one
bad = bytearray(d); bad[60 + 4] ^= 0xFF
struct.pack_into("<Q", bad, hend - 8, h64(bad[:hend - 8])); w("ctx8_zstd_section.dcr", bad)
t = struct.unpack_from("<Q", d, len(d) - 24)[0]
assert d[t:t + 8] == b"DCRTABLC"
bad = bytearray(d); bad[t + 8:t + 17] = b"\xff" * 8 + b"\x3f"; w("ctx8_trailer_count.dcr", bad)
PY
# Records whose checksums are right but whose segments do not fit their tensors, checked before
# anything is decoded (tests/adversary/craft.py): a zstd stream that expands to 1 GiB over the
# 33-element tensor 3, a context-coded record over 2^33 elements of a 40000-element tensor,
# segment counts whose product wraps in 64 bits.
python3 tests/adversary/craft.py zstd_bomb "$g/v5_delta.dcr" "$e/bounds_zstd_bomb.dcr" 3 >/dev/null
python3 tests/adversary/craft.py context_wide "$g/v8_context.dcr" "$e/bounds_context_wide.dcr" 0 \
  >/dev/null
python3 tests/adversary/craft.py segments_wrap "$g/v5_delta.dcr" "$e/bounds_segments_wrap.dcr" 3 \
  >/dev/null
cat > "$e/MANIFEST" <<'M'
# file kind expected-status message-substring   (read by tests/golden/golden_test.cc)
empty.dcr delta DATA_LOSS truncated delta
truncated_magic.dcr delta DATA_LOSS truncated delta
truncated_header.dcr delta DATA_LOSS truncated delta header
truncated_middle.dcr delta DATA_LOSS trailer
truncated_tail.dcr delta DATA_LOSS trailer
bad_magic.dcr delta DATA_LOSS not a dcr delta
wrong_version.dcr delta FAILED_PRECONDITION unsupported delta format version 99
header_bitflip.dcr delta DATA_LOSS delta header checksum mismatch
chunk_header_bitflip.dcr delta DATA_LOSS chunk header checksum mismatch
chunk_payload_bitflip.dcr delta DATA_LOSS payload checksum mismatch
huge_chunk_count.dcr delta DATA_LOSS chunk count is absurd
bad_trailer_offset.dcr delta DATA_LOSS bad trailer offset
trailer_bitflip.dcr delta DATA_LOSS trailer
v5_absurd_sections.dcr delta DATA_LOSS 4294967295 sections is absurd
v5_section_over_cap.dcr delta DATA_LOSS exceed the cap
v5_shard_header_bitflip.dcr delta DATA_LOSS delta header checksum mismatch
v5_truncated_sections.dcr delta DATA_LOSS truncated delta header
old_version_v1.dcr delta FAILED_PRECONDITION unsupported delta format version 1
wrong_base.dcr delta FAILED_PRECONDITION but the delta was built for
ctx_positions_hash.dcr ctxdelta FAILED_PRECONDITION context-coded positions differ from the encoder's
ctx_absolute.dcr ctxdelta DATA_LOSS context-coded chunk with absolute values
ctx_extra_bits.dcr ctxdelta DATA_LOSS context body: trailing raw bits
ctx_wrong_base.dcr ctxdelta FAILED_PRECONDITION context-coded
ctx7_unknown_model_form.dcr ctxdelta DATA_LOSS unknown model form
ctx7_geometric_ratio_zero.dcr ctxdelta DATA_LOSS bad geometric model
ctx8_position_mode.dcr ctxdelta DATA_LOSS compact chunk header with position mode 1
ctx8_zstd_section.dcr ctxdelta DATA_LOSS compressed section is not a zstd frame
ctx8_trailer_count.dcr ctxdelta DATA_LOSS chunk count is absurd
bounds_zstd_bomb.dcr delta DATA_LOSS segment 0 (tensor 3 of 33 elements) lies outside its tensor's elements
bounds_context_wide.dcr ctxdelta DATA_LOSS segment 0 (tensor 0 of 40000 elements) lies outside its tensor's elements
bounds_segments_wrap.dcr delta DATA_LOSS segment too large
st_bad_json.safetensors checkpoint DATA_LOSS malformed safetensors JSON header
st_overlap.safetensors checkpoint DATA_LOSS overlap
st_out_of_range.safetensors checkpoint DATA_LOSS outside the data section
st_shape_mismatch.safetensors checkpoint DATA_LOSS shape needs 3 elements
st_absurd_header.safetensors checkpoint DATA_LOSS exceeds the 100 MiB limit
st_shape_overflow.safetensors checkpoint DATA_LOSS shape overflows
st_tiny.safetensors checkpoint DATA_LOSS fewer than 8 bytes
st_duplicate_name.safetensors checkpoint DATA_LOSS safetensors header names 'a' twice
st_duplicate_field.safetensors checkpoint DATA_LOSS safetensors header names 'dtype' twice
st_gap.safetensors checkpoint DATA_LOSS tensor 'b': gap of 4 bytes
st_trailing_bytes.safetensors checkpoint DATA_LOSS 8 bytes after the last tensor 'a'
st_unknown_dtype_huge_shape.safetensors checkpoint DATA_LOSS tensor 'a': unknown dtype 'X9'
st_is_delta.safetensors checkpoint INVALID_ARGUMENT a dcr delta file (magic DCRDELTA), not a safetensors checkpoint
st_is_index.safetensors checkpoint INVALID_ARGUMENT the index of a sharded checkpoint (a weight_map
st_is_json.safetensors checkpoint INVALID_ARGUMENT JSON text, not a safetensors checkpoint
layout_unknown_tensor.json layout INVALID_ARGUMENT tensors[8] (model.missing): unknown tensor
layout_overlap.json layout INVALID_ARGUMENT tensors[8] (model.embed_tokens.weight): overlapping coverage: already placed by tensors[0]
layout_missing_tensor.json layout INVALID_ARGUMENT missing coverage: tensor 'model.norm.weight' has no entry
layout_bad_dims.json layout INVALID_ARGUMENT tensors[0] (model.embed_tokens.weight): rows split of dimension 0 (64) over 3 ranks leaves a remainder
layout_idle_rank.json layout INVALID_ARGUMENT missing coverage: rank 1 holds no tensor
layout_rank_range.json layout INVALID_ARGUMENT tensors[1] (model.layers.0.mlp.down_proj.weight): rank 5 is outside 0..1
layout_split_1d.json layout INVALID_ARGUMENT tensors[2] (model.layers.0.input_layernorm.weight): columns split of shape [96]: the tensor has no dimension 1
layout_not_json.json layout INVALID_ARGUMENT not a JSON object
M
echo "corpus: $(ls "$e" | wc -l) files in $e"
