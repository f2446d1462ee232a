"""dcr.Publisher through the shipped binaries: a Python trainer is the sender of a multi-host run
(dcr_publisher_open_scenario) whose two receivers are real dcr-node processes; it hands three
versions as state dicts with publish_async while it keeps computing, and every receiver commits
every version, verified byte for byte against the checkpoint files of the scenario."""

import json
import os
import random
import subprocess
import time

import pytest
import torch

import dcr
from conftest import mutate, raw, write_safetensors


def node_bin(dcr_bin):
    path = os.environ.get("DCR_NODE_BIN", os.path.join(os.path.dirname(dcr_bin), "dcr-node"))
    if not os.path.exists(path):
        pytest.skip("no dcr-node at %s" % path)
    return path


def test_python_trainer_publishes_to_dcr_node_receivers(tmp_path, gen, dcr_bin):
    node = node_bin(dcr_bin)
    versions = [{"a.weight": (torch.randn(256, 512, generator=gen) * 0.02).bfloat16(),
                 "b.bias": torch.randn(1000, generator=gen)}]
    for _ in range(3):
        versions.append({k: mutate(v, 0.03, gen) for k, v in versions[-1].items()})
    paths = []
    for i, v in enumerate(versions):
        p = tmp_path / ("step%d.safetensors" % i)
        write_safetensors(p, v)
        paths.append(str(p))
    port = 20000 + random.randrange(12000)
    receivers = 2
    hosts = ", ".join('"127.0.0.1:%d"' % (port + r) for r in range(receivers + 1))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: python-publisher\n"
        "model: {checkpoints: [%s]}\n"
        "transport:\n"
        "  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}\n"
        "  object_store: {kind: dir, path: %s}\n"
        "receivers: {count: %d}\n"
        "delta: {chunk_elems: 65536}\n"
        "network:\n  hosts: [%s]\n  tls: false\n"
        "timeout: 60s\n" % (", ".join(paths), tmp_path / "store", receivers, hosts))
    procs = []
    try:
        for r in range(1, receivers + 1):
            h = tmp_path / ("h%d" % r)
            h.mkdir()
            procs.append(subprocess.Popen([node, str(scenario), "--rank", str(r), "--state",
                                           str(h / "state")], cwd=h,
                                          stdout=open(h / "log", "w"), stderr=subprocess.STDOUT))
        (tmp_path / "h0").mkdir()
        with dcr.Publisher.open_scenario(scenario, tmp_path / "trainer",
                                         state_dir=tmp_path / "h0" / "state") as pub:
            for k in (1, 2, 3):
                assert pub.next_version() == k
                fut = pub.publish_async(k, versions[k])
                work = 0
                while not fut.done():  # the training loop goes on while the version streams
                    work += 1
                    time.sleep(0.001)
                fut.result()
                h, committed = pub.last()
                assert committed == receivers and h == dcr.tensors_hash(versions[k])
                assert work > 0
                written = (tmp_path / "trainer" / ("version-%d.safetensors" % k)).read_bytes()
                assert written == open(paths[k], "rb").read()
            with pytest.raises(dcr.FailedPreconditionError, match="no more versions"):
                pub.next_version()
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for k in (1, 2, 3):
        for r in range(1, receivers + 1):
            j = json.loads((tmp_path / ("h%d" % r) / "state" / ("node-%d-v%d.json" % (r, k)))
                           .read_text())
            assert j["ok"] and j["verified"], (r, k, j.get("error"), j.get("verify_message"))


def test_publisher_refusals(tmp_path):
    with pytest.raises(dcr.Error) as e:
        dcr.Publisher.open(tmp_path / "missing.json", tmp_path / "w")
    assert e.value.code in (2, 1) and e.value.message
    s = tmp_path / "s.yaml"
    s.write_text("name: x\nmodel: {checkpoints: [a.safetensors, b.safetensors]}\n"
                 "receivers: {count: 1}\nnetwork:\n  hosts: [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n")
    with pytest.raises(dcr.InvalidArgumentError, match="receiver"):
        dcr.Publisher.open_scenario(s, tmp_path / "w", rank=1)
