"""The serving-runtime API (dcr.runtime, dcr_c.h) in a Python process started with the copy
interposers preloaded, as a Python serving runtime records its loader; and its refusal without."""

import os
import subprocess
import sys

import pytest

import dcr.runtime as rt
from conftest import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))


def test_runtime_api_in_a_preloaded_process():
    preload = os.environ.get("DCR_PRELOAD", os.path.join(ROOT, "build", "libdcr_preload.so"))
    if not os.path.exists(preload):
        pytest.skip("no %s (CTest sets DCR_PRELOAD)" % preload)
    env = dict(os.environ, LD_PRELOAD=preload)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(HERE, "preloaded_runtime.py")],
                       env=env, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert p.returncode == 0, p.stdout + p.stderr
    assert " passed" in p.stdout and "skipped" not in p.stdout, p.stdout


def test_recording_without_the_interposers_is_refused(tmp_path):
    import torch
    from conftest import write_safetensors
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("interposers preloaded")
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"w": torch.zeros(4)})
    with pytest.raises(dcr.FailedPreconditionError, match="interpose"):
        rt.Recorder(path)


def test_copy_hook_round_trip():
    import ctypes
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("interposers preloaded: the observer would see every memcpy")
    seen = []
    assert not rt.CopyHook.active()
    with rt.CopyHook(lambda dst, src, n, kind: seen.append((n, kind))):
        assert rt.CopyHook.active()
        with pytest.raises(dcr.FailedPreconditionError):
            with rt.CopyHook(lambda *a: None):
                pass
        a, b = ctypes.create_string_buffer(8), ctypes.create_string_buffer(8)
        rt.CopyHook.note(ctypes.addressof(a), ctypes.addressof(b), 8, rt.COPY_HOST)
    assert not rt.CopyHook.active()
    assert (8, rt.COPY_HOST) in seen


import dcr  # noqa: E402
