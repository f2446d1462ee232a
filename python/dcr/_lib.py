"""ctypes declarations of libdcr's C API (dcr/dcr_c.h, dcr/codec_c.h), one to one.

The library is looked up, in this order: the path in the environment variable ``DCR_LIBRARY``
(when set, only there); ``libdcr.so`` beside this package (where the CMake install rules put it); the build tree of a
source checkout (``<repository>/build/libdcr.so``); the system loader path (``libdcr.so``). The
first that loads is used; its ``dcr_c_abi_version()`` must equal :data:`ABI_VERSION`.

ctypes releases the GIL for the duration of every foreign call, so other Python threads run while
the library works.
"""

import ctypes
import os
import threading

from . import errors

#: The C ABI this package is written against (DCR_C_ABI_VERSION of dcr/dcr_c.h).
ABI_VERSION = 1

c_int, c_int32, c_uint64, c_size_t = ctypes.c_int, ctypes.c_int32, ctypes.c_uint64, ctypes.c_size_t
c_char_p, c_void_p = ctypes.c_char_p, ctypes.c_void_p
POINTER = ctypes.POINTER


class Tensor(ctypes.Structure):
    """dcr_tensor (dcr/publisher_c.h)."""
    _fields_ = [("name", c_char_p), ("dtype", c_char_p), ("shape", POINTER(ctypes.c_int64)),
                ("ndim", c_size_t), ("data", c_void_p), ("nbytes", c_uint64)]


class CodecOptions(ctypes.Structure):
    """dcr_codec_options (dcr/codec_c.h)."""
    _fields_ = [("threads", c_int32), ("chunk_elems", c_uint64),
                ("small_tensor_elems", c_uint64), ("zstd_level", c_int32),
                ("value_policy", c_int32), ("base_version", c_uint64),
                ("target_version", c_uint64), ("context_coding", c_int32),
                ("context_classes", c_int32), ("full", c_int32),
                ("known_base_hash", c_uint64 * 2)]


class ApplyResult(ctypes.Structure):
    """dcr_apply_result (dcr/codec_c.h)."""
    _fields_ = [("chunks", c_uint64), ("changes", c_uint64), ("base_version", c_uint64),
                ("target_version", c_uint64), ("target_hash", c_uint64 * 2)]


class Placement(ctypes.Structure):
    """dcr_placement (dcr/codec_c.h)."""
    _fields_ = [("tensor", ctypes.c_uint32), ("dst", c_void_p), ("dst_elements", c_uint64),
                ("count", c_uint64), ("src", POINTER(ctypes.c_int64)),
                ("dst_index", POINTER(ctypes.c_int64))]


class Device(ctypes.Structure):
    """dcr_device (dcr/codec_c.h)."""
    _fields_ = [("kind", c_int32), ("ordinal", c_int32)]


#: DCR_DEVICE_* of dcr/codec_c.h by name.
DEVICE_KINDS = {"cpu": 0, "host": 1, "cuda": 2}


class DeltaPart(ctypes.Structure):
    """dcr_delta_part (dcr/codec_c.h)."""
    _fields_ = [("offset", c_uint64), ("size", c_uint64)]


COPY_OBSERVER = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_void_p, c_size_t, c_int)
RELOAD_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_uint64)

# name: (restype, argtypes)
_SIGNATURES = {
    # dcr_c.h
    "dcr_c_abi_version": (c_int, []),
    "dcr_last_error": (c_char_p, []),
    "dcr_copy_hook_install": (c_int, [COPY_OBSERVER, c_void_p]),
    "dcr_copy_hook_remove": (None, []),
    "dcr_copy_hook_active": (c_int, []),
    "dcr_copy_hook_note": (None, [c_void_p, c_void_p, c_size_t, c_int]),
    "dcr_recorder_begin": (c_int, [c_char_p, POINTER(c_void_p)]),
    "dcr_recorder_tensor_data": (c_void_p, [c_void_p, c_char_p, POINTER(c_uint64)]),
    "dcr_recorder_add_source": (c_int, [c_void_p, c_void_p, c_uint64]),
    "dcr_recorder_add_buffer": (c_int, [c_void_p, c_char_p, c_void_p, c_uint64]),
    "dcr_recorder_set_tensor": (c_int, [c_void_p, c_char_p]),
    "dcr_recorder_end": (c_int, [c_void_p, RELOAD_FN, c_void_p, POINTER(c_void_p)]),
    "dcr_receiver_begin": (c_int, [c_void_p, c_void_p, c_size_t]),
    "dcr_receiver_apply_chunk": (c_int, [c_void_p, c_void_p, c_size_t]),
    "dcr_receiver_finish": (c_int, [c_void_p, c_void_p, c_size_t]),
    "dcr_receiver_verify": (c_int, [c_void_p, c_char_p]),
    "dcr_receiver_version": (c_int, [c_void_p, POINTER(c_uint64), POINTER(c_uint64),
                                     POINTER(c_int)]),
    "dcr_receiver_stats": (None, [c_void_p, POINTER(c_uint64), POINTER(c_uint64),
                                  POINTER(c_uint64)]),
    "dcr_receiver_free": (None, [c_void_p]),
    # publisher_c.h
    "dcr_publisher_open": (c_int, [c_char_p, c_char_p, POINTER(c_void_p)]),
    "dcr_publisher_open_scenario": (c_int, [c_char_p, c_int, c_char_p, c_char_p, c_char_p,
                                            POINTER(c_void_p)]),
    "dcr_publisher_publish_file": (c_int, [c_void_p, c_uint64, c_char_p]),
    "dcr_publisher_publish_tensors": (c_int, [c_void_p, c_uint64, POINTER(Tensor), c_size_t,
                                              POINTER(c_char_p), c_size_t]),
    "dcr_publisher_last_delta": (c_int, [c_void_p, POINTER(c_uint64), POINTER(c_int)]),
    "dcr_publisher_last": (c_int, [c_void_p, POINTER(c_uint64), POINTER(c_int)]),
    "dcr_publisher_next_version": (c_int, [c_void_p, POINTER(c_uint64)]),
    "dcr_publisher_baseline": (c_int, [c_void_p, POINTER(c_uint64)]),
    "dcr_publisher_attach_shards": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_uint64,
                                            c_void_p, c_size_t]),
    "dcr_publisher_publish_shards": (c_int, [c_void_p, c_uint64, c_void_p, c_size_t]),
    # publisher_c.h, per-rank shards (dcr.train declares the structs and the exporter type;
    # pointers to them go as void*)
    "dcr_shard_read": (c_void_p, [c_void_p, c_int, c_int, c_uint64, c_uint64]),
    "dcr_train_layout_open": (c_int, [c_char_p, c_char_p, POINTER(c_void_p)]),
    "dcr_train_layout_open_spec": (c_int, [c_char_p, c_char_p, POINTER(c_void_p)]),
    "dcr_train_layout_error": (c_char_p, [c_void_p]),
    "dcr_train_layout_close": (None, [c_void_p]),
    "dcr_train_layout_ranks": (c_int, [c_void_p]),
    "dcr_train_layout_buffers": (c_size_t, [c_void_p, c_int]),
    "dcr_train_layout_params": (c_size_t, [c_void_p, c_int]),
    "dcr_train_layout_buffer": (c_int, [c_void_p, c_int, c_size_t, c_void_p]),
    "dcr_train_layout_param": (c_int, [c_void_p, c_int, c_size_t, c_void_p]),
    "dcr_train_layout_find_param": (ctypes.c_long, [c_void_p, c_int, c_char_p]),
    "dcr_train_layout_tensors": (c_size_t, [c_void_p]),
    "dcr_train_layout_tensor": (c_int, [c_void_p, c_size_t, POINTER(Tensor)]),
    "dcr_train_layout_export": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_size_t,
                                        c_char_p]),
    "dcr_publisher_error": (c_char_p, [c_void_p]),
    "dcr_publisher_close": (c_int, [c_void_p]),
    # codec_c.h
    "dcr_codec_options_init": (None, [POINTER(CodecOptions)]),
    "dcr_encode_delta": (c_int, [POINTER(Tensor), c_size_t, POINTER(Tensor), c_size_t,
                                 POINTER(CodecOptions), POINTER(c_void_p), POINTER(c_size_t)]),
    "dcr_bytes_free": (None, [c_void_p]),
    "dcr_apply_delta": (c_int, [POINTER(Tensor), c_size_t, c_void_p, c_size_t,
                                POINTER(CodecOptions), POINTER(ApplyResult)]),
    "dcr_delta_parts": (c_int, [c_void_p, c_size_t, POINTER(DeltaPart), c_size_t,
                                POINTER(c_size_t)]),
    "dcr_tensors_hash": (c_int, [POINTER(Tensor), c_size_t, c_int32, POINTER(c_uint64)]),
    "dcr_placement_map_create": (c_int, [POINTER(Tensor), c_size_t, POINTER(Placement), c_size_t,
                                         POINTER(c_void_p)]),
    "dcr_placement_map_free": (None, [c_void_p]),
    "dcr_placement_map_elements": (c_uint64, [c_void_p]),
    "dcr_apply_delta_placed": (c_int, [POINTER(Tensor), c_size_t, c_void_p, c_size_t, c_void_p,
                                       POINTER(CodecOptions), POINTER(ApplyResult),
                                       POINTER(ctypes.c_uint8), POINTER(c_uint64)]),
    "dcr_placement_map_write": (c_int, [c_void_p, POINTER(Tensor), c_size_t,
                                        POINTER(ctypes.c_uint8), c_int32, POINTER(c_uint64)]),
    "dcr_encode_delta_device": (c_int, [POINTER(Device), POINTER(Tensor), c_size_t,
                                        POINTER(Tensor), c_size_t, POINTER(CodecOptions),
                                        POINTER(c_void_p), POINTER(c_size_t)]),
    "dcr_apply_delta_device": (c_int, [POINTER(Device), POINTER(Tensor), c_size_t, c_void_p,
                                       c_size_t, POINTER(CodecOptions), POINTER(ApplyResult)]),
    "dcr_tensors_hash_device": (c_int, [POINTER(Device), POINTER(Tensor), c_size_t, c_int32,
                                        POINTER(c_uint64)]),
    "dcr_placement_map_create_device": (c_int, [POINTER(Device), POINTER(Tensor), c_size_t,
                                                POINTER(Placement), c_size_t, POINTER(c_void_p)]),
}

_lock = threading.Lock()
_lib = None
_path = None


def candidates():
    """The paths tried, in order (see the module comment)."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    env = os.environ.get("DCR_LIBRARY")
    if env:
        return [env]
    out.append(os.path.join(here, "libdcr.so"))
    out.append(os.path.join(os.path.dirname(os.path.dirname(here)), "build", "libdcr.so"))
    out.append("libdcr.so")
    return out


def _declare(lib):
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib():
    """The loaded library (loaded on first use). Raises :class:`dcr.LibraryError` when no
    candidate loads, naming what was tried, or when its C ABI differs."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidates():
            if os.sep in path and not os.path.isfile(path):
                tried.append(path + ": no such file")
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s: %s" % (path, e))
                continue
            try:
                _declare(handle)
            except AttributeError as e:
                raise errors.LibraryError("%s lacks an entry point of the dcr C API: %s"
                                          % (path, e)) from None
            abi = handle.dcr_c_abi_version()
            if abi != ABI_VERSION:
                raise errors.LibraryError(
                    "%s has C ABI %d but this dcr package needs ABI %d: install the package "
                    "and the library of the same build" % (path, abi, ABI_VERSION))
            _lib, _path = handle, path
            return _lib
        raise errors.LibraryError("libdcr.so not found (set DCR_LIBRARY to its path); tried: "
                                  + "; ".join(tried))


def path():
    """The path libdcr was loaded from (loading it if needed)."""
    lib()
    return _path


def check(rc):
    """Raises the exception of dcr status ``rc`` with this thread's dcr_last_error()."""
    if rc != 0:
        msg = lib().dcr_last_error()
        raise errors.error_for_code(rc, msg.decode("utf-8", "replace") if msg else "")
