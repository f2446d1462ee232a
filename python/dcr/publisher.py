"""Trainer side: :class:`Publisher` over the publisher C API (dcr/publisher_c.h).

A training process opens the sender of a long-lived run (from a plan file of ``dcr run``, or from a
multi-host scenario and rank 0) and hands it each version in order: a state dict, a safetensors
file, or nothing else. :meth:`Publisher.publish` blocks until the version is out (every live
receiver committed it or was declared dead); :meth:`Publisher.publish_async` first snapshots the
tensors (one host copy, so the training loop may update its parameters at once) and publishes on a
background thread (the C call releases the GIL), returning a Future: the next step's batch runs
while the version streams.

Errors are :class:`dcr.Error` subclasses with the sender's message.

Thread safety: one publisher is driven from one thread (the background thread of publish_async
counts as the caller while a version is in flight; publish waits for it).
"""

import concurrent.futures
import ctypes

from . import _lib
from ._tensors import tensor_array
from .errors import InvalidArgumentError, error_for_code


class Publisher:
    def __init__(self, handle):
        self._h = handle
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                           thread_name_prefix="dcr-publish")
        self._pending = None

    # ---- opening ----

    @classmethod
    def open(cls, plan_path, work_dir):
        """The sender of the NodePlan JSON at ``plan_path`` (rank 0 of a ``dcr run``);
        ``work_dir`` holds the files of versions handed as tensors."""
        h = ctypes.c_void_p()
        rc = _lib.lib().dcr_publisher_open(str(plan_path).encode(), str(work_dir).encode(),
                                           ctypes.byref(h))
        return cls._opened(rc, h)

    @classmethod
    def open_scenario(cls, scenario_path, work_dir, base_path=None, state_dir=None, rank=0):
        """The sender of rank 0 of the multi-host run the scenario describes (no plan file).
        ``state_dir`` makes it resume a run that stopped (the next version is then the first
        not yet published)."""
        h = ctypes.c_void_p()
        enc = lambda s: None if s is None else str(s).encode()  # noqa: E731
        rc = _lib.lib().dcr_publisher_open_scenario(
            str(scenario_path).encode(), rank, enc(base_path), enc(state_dir),
            str(work_dir).encode(), ctypes.byref(h))
        return cls._opened(rc, h)

    @classmethod
    def _opened(cls, rc, h):
        if rc != 0:
            msg = ""
            if h.value:
                msg = (_lib.lib().dcr_publisher_error(h) or b"").decode("utf-8", "replace")
                _lib.lib().dcr_publisher_close(h)
            raise error_for_code(rc, msg)
        return cls(h)

    def _check(self, rc):
        if rc != 0:
            msg = (_lib.lib().dcr_publisher_error(self._h) or b"").decode("utf-8", "replace")
            raise error_for_code(rc, msg)

    def _handle(self):
        if not self._h:
            raise InvalidArgumentError("dcr: publisher is closed")
        return self._h

    # ---- versions ----

    def publish_file(self, version, path):
        """Hands ``version`` as the safetensors file (or shard directory) at ``path``, which must
        stay until the publisher is closed. Blocks until the version is out."""
        self.wait()
        self._check(_lib.lib().dcr_publisher_publish_file(self._handle(), version,
                                                          str(path).encode()))

    def publish(self, version, tensors, metadata=None, dtypes=None):
        """Hands ``version`` as ``tensors`` (name -> CPU tensor, in file order; ``metadata``
        the file's __metadata__). Blocks until the version is out."""
        self.wait()
        self._publish(version, tensor_array(tensors, dtypes), metadata)

    def publish_async(self, version, tensors, metadata=None, dtypes=None):
        """Snapshots ``tensors`` (a host copy of each) and publishes them on a background thread;
        returns a Future whose result() is None once the version is out (or raises the
        sender's error). A later publish waits for this one first."""
        self.wait()
        snap = {k: (v.detach().to("cpu", copy=True).contiguous() if hasattr(v, "detach")
                    else v.copy()) for k, v in tensors.items()}
        arr = tensor_array(snap, dtypes)
        self._pending = self._pool.submit(self._publish, version, arr, metadata, snap)
        return self._pending

    def _publish(self, version, arr, metadata, keep=None):
        meta = []
        for k, v in (metadata or {}).items():
            meta += [str(k).encode(), str(v).encode()]
        cmeta = (ctypes.c_char_p * max(len(meta), 1))(*meta)
        self._check(_lib.lib().dcr_publisher_publish_tensors(
            self._handle(), version, arr.array, arr.count, cmeta, len(meta)))

    # ---- per-rank shards (dcr.train) ----

    def attach_shards(self, layout, exporter, shards, base_version=0):
        """Gives the sender the :class:`dcr.train.TrainLayout`, the exporter (a callable, see
        dcr.train) and the shards of version ``base_version`` (0: the plan's base, whose content
        hash the shards' canonical export must have): the version the next
        :meth:`publish_shards` is diffed against. The exporter is kept for later versions;
        ``layout`` may be closed after the call."""
        from . import train
        self.wait()
        ex = train._Exporter(layout, exporter)
        arr, n, keep = train._shard_array(layout, shards)
        rc = _lib.lib().dcr_publisher_attach_shards(self._handle(), layout.handle, ex.c, None,
                                                    base_version, arr, n)
        del keep
        self._exporter = ex  # called again by every publish_shards
        self._layout = layout
        self._shard_check(rc, ex)

    def publish_shards(self, version, shards):
        """Hands ``version`` as its rank shards ({(rank, buffer): data}, one per buffer of every
        rank). Blocks until the version is out. REQUIRES: attach_shards."""
        from . import train
        self.wait()
        ex = getattr(self, "_exporter", None)
        layout = getattr(self, "_layout", None)
        if ex is None:
            arr, n = (train.Shard * 1)(), 0
            keep = None
        else:
            arr, n, keep = train._shard_array(layout, shards)
        rc = _lib.lib().dcr_publisher_publish_shards(self._handle(), version, arr, n)
        del keep
        self._shard_check(rc, ex)

    def _shard_check(self, rc, ex):
        if rc != 0:
            msg = (_lib.lib().dcr_publisher_error(self._h) or b"").decode("utf-8", "replace")
            err = error_for_code(rc, msg)
            if ex is not None:
                ex.raise_kept(err)
            raise err

    def baseline(self):
        """The lowest version whose checkpoint the sender may still build a delta from (the
        joint commit's baseline; over the object store the last version out); 0 before the
        first version is out. Checkpoints handed below it are no longer read."""
        v = ctypes.c_uint64()
        self._check(_lib.lib().dcr_publisher_baseline(self._handle(), ctypes.byref(v)))
        return v.value

    def wait(self):
        """Waits for the version publish_async is sending (raising its error, once)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def next_version(self):
        """The version the publisher takes next: 1, or after a restart on the same state
        directory the first one that state does not record as published. Raises
        FailedPreconditionError when the plan names no more versions or the sender ended."""
        v = ctypes.c_uint64()
        self._check(_lib.lib().dcr_publisher_next_version(self._handle(), ctypes.byref(v)))
        return v.value

    def last(self):
        """(content hash (lo, hi), receivers that committed) of the last version out."""
        h = (ctypes.c_uint64 * 2)()
        n = ctypes.c_int()
        self._check(_lib.lib().dcr_publisher_last(self._handle(), h, ctypes.byref(n)))
        return (h[0], h[1]), n.value

    def last_delta(self):
        """(base version, whether it was the trainer's shard delta) of the last version out."""
        b = ctypes.c_uint64()
        s = ctypes.c_int()
        self._check(_lib.lib().dcr_publisher_last_delta(self._handle(), ctypes.byref(b),
                                                        ctypes.byref(s)))
        return b.value, bool(s.value)

    def close(self):
        """Waits for a version in flight, ends the session (versions of the plan not handed are
        abandoned) and raises the sender's error if it had one."""
        if not self._h:
            return
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            h, self._h = self._h, None
            rc = _lib.lib().dcr_publisher_close(h)
        if rc != 0:
            raise error_for_code(rc, "dcr: the sender ended with an error (code %d)" % rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
