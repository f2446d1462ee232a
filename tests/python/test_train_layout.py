"""dcr.train and the publisher's shard entry points over the real libdcr.so: layouts of a preset
and of a JSON layout spec (rows / columns / whole) over a custom checkpoint, the exporter callback
and dcr_shard_read, a dense export compared byte for byte with the checkpoint's tensors, refusals,
and a Python trainer publishing per-rank shards (attach_shards, publish_shards, baseline) to two
real dcr-node receivers that verify every version byte for byte."""

import json
import os
import random
import subprocess

import pytest
import torch

import dcr
from dcr import train
from conftest import mutate, raw, read_safetensors, write_safetensors

SPEC = {"ranks": 2, "tensors": [
    {"tensor": "attn.qkv", "split": "rows", "ranks": [1, 0]},
    {"tensor": "attn.out", "split": "columns", "ranks": [0, 1]},
    {"tensor": "norm", "split": "whole", "ranks": [0, 1]},
    {"tensor": "embed", "split": "whole", "ranks": [1]},
]}


def custom_model(gen):
    return {
        "attn.qkv": (torch.randn(96, 64, generator=gen) * 0.02).bfloat16(),
        "attn.out": (torch.randn(64, 48, generator=gen) * 0.02).bfloat16(),
        "norm": torch.randn(64, generator=gen),
        "embed": (torch.randn(100, 64, generator=gen) * 0.02).bfloat16(),
    }


@pytest.fixture
def spec_layout(tmp_path, gen):
    model = custom_model(gen)
    ck = tmp_path / "base.safetensors"
    write_safetensors(ck, model)
    spec = tmp_path / "layout.json"
    spec.write_text(json.dumps(SPEC))
    with dcr.TrainLayout.open_spec(spec, ck) as layout:
        yield layout, model, ck, spec


def test_spec_layout_places_rows_columns_and_whole(spec_layout):
    layout, model, _, _ = spec_layout
    assert layout.ranks == 2
    assert [t.name for t in layout.tensors()] == sorted(model)
    qkv = {t.name: t for t in layout.tensors()}["attn.qkv"]
    assert qkv.dtype == "BF16" and qkv.shape == (96, 64) and qkv.nbytes == 96 * 64 * 2
    r0 = {p.name: p for p in layout.params(0)}
    r1 = {p.name: p for p in layout.params(1)}
    assert r0["attn.qkv"].shape == (48, 64) and r1["attn.qkv"].shape == (48, 64)
    assert r0["attn.out"].shape == (64, 24) and r1["attn.out"].shape == (64, 24)
    assert not r0["norm"].replica and r1["norm"].replica
    assert "embed" not in r0 and r1["embed"].shape == (100, 64) and not r1["embed"].replica
    bufs = layout.buffers(1)
    assert {b.name for b in bufs} == {"attn.qkv", "attn.out", "norm", "embed"}
    assert {b.name: b.nbytes for b in bufs}["norm"] == 64 * 4
    assert layout.find_param(0, "embed") == -1 and layout.find_param(1, "embed") >= 0


def test_spec_export_is_the_dense_checkpoint_byte_for_byte(tmp_path, spec_layout):
    layout, model, ck, spec = spec_layout
    shards = train.shards_of(layout, SPEC, raw_set(model))
    assert len(shards) == sum(len(layout.buffers(r)) for r in range(layout.ranks))
    # Rank 1 holds the first half of the rows of attn.qkv (ranks [1, 0]).
    b = layout.params(1)[layout.find_param(1, "attn.qkv")].buffer
    assert shards[(1, b)] == raw(model["attn.qkv"])[:48 * 64 * 2]
    out = tmp_path / "export.safetensors"
    layout.export(dcr.SpecExporter(layout, spec), shards, out)
    got = read_safetensors(out)
    want = read_safetensors(ck)
    assert set(got) == set(want)
    for name in want:
        assert got[name] == want[name], name  # dtype, shape and every byte


def test_shard_reader_reads_ranges_and_refuses_outside(tmp_path, spec_layout):
    layout, model, _, spec = spec_layout
    shards = train.shards_of(layout, SPEC, raw_set(model))
    seen = {}
    inner = dcr.SpecExporter(layout, spec)

    def exporter(reader, tensor, out):
        name = layout.tensors()[tensor].name
        if name == "norm":
            b = layout.params(0)[layout.find_param(0, "norm")].buffer
            seen["slice"] = bytes(reader.read(0, b, 8, 4))
            with pytest.raises(dcr.InvalidArgumentError, match="outside"):
                reader.read(0, b, 60, 8)
        inner(reader, tensor, out)

    layout.export(exporter, shards, tmp_path / "e.safetensors")
    assert seen["slice"] == raw(model["norm"])[32:48]


def test_exporter_error_and_bad_shards_are_refused(tmp_path, spec_layout):
    layout, model, _, spec = spec_layout
    shards = train.shards_of(layout, SPEC, raw_set(model))

    def broken(reader, tensor, out):
        raise RuntimeError("the framework's converter failed")

    with pytest.raises(dcr.Error) as e:
        layout.export(broken, shards, tmp_path / "x.safetensors")
    assert isinstance(e.value.__cause__, RuntimeError)
    assert not (tmp_path / "x.safetensors").exists()
    short = dict(shards)
    short.pop(next(iter(short)))
    with pytest.raises(dcr.InvalidArgumentError, match="missing|shard"):
        layout.export(dcr.SpecExporter(layout, spec), short, tmp_path / "y.safetensors")
    assert not (tmp_path / "y.safetensors").exists()


@pytest.mark.parametrize("spec,match", [
    ({"ranks": 2, "tensors": [{"tensor": "nope", "split": "rows", "ranks": [0, 1]}]},
     "unknown tensor"),
    ({"ranks": 2, "tensors": [{"tensor": "norm", "split": "diagonal", "ranks": [0, 1]}]},
     "unknown split"),
    ({"ranks": 2, "tensors": [{"tensor": "attn.qkv", "split": "rows", "ranks": [0, 5]}]},
     "outside"),
])
def test_malformed_spec_is_refused_naming_the_entry(tmp_path, gen, spec, match):
    ck = tmp_path / "base.safetensors"
    write_safetensors(ck, custom_model(gen))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(dcr.InvalidArgumentError, match=match) as e:
        dcr.TrainLayout.open_spec(path, ck)
    assert "layout spec" in str(e.value)


def test_preset_layout(tmp_path):
    with dcr.TrainLayout.open("tiny", "tp=2") as layout:
        assert layout.ranks == 2
        assert len(layout.tensors()) > 0
        p = layout.params(0)[0]
        assert layout.find_param(0, p.name) == 0
    with pytest.raises(dcr.NotFoundError, match="no-such-preset"):
        dcr.TrainLayout.open("no-such-preset", "tp=1")
    with pytest.raises(dcr.InvalidArgumentError, match="tq"):
        dcr.TrainLayout.open("tiny", "tq=2")


def raw_set(ts):
    return {k: raw(v) for k, v in ts.items()}


def node_bin(dcr_bin):
    path = os.environ.get("DCR_NODE_BIN", os.path.join(os.path.dirname(dcr_bin), "dcr-node"))
    if not os.path.exists(path):
        pytest.skip("no dcr-node at %s" % path)
    return path


def test_python_trainer_publishes_shards_to_dcr_node_receivers(tmp_path, gen, dcr_bin):
    node = node_bin(dcr_bin)
    versions = [custom_model(gen)]
    for _ in range(2):
        versions.append({k: mutate(v, 0.03, gen) for k, v in versions[-1].items()})
    paths = []
    for i, v in enumerate(versions):
        p = tmp_path / ("step%d.safetensors" % i)
        write_safetensors(p, v)
        paths.append(str(p))
    spec = tmp_path / "layout.json"
    spec.write_text(json.dumps(SPEC))
    port = 20000 + random.randrange(12000)
    receivers = 2
    hosts = ", ".join('"127.0.0.1:%d"' % (port + r) for r in range(receivers + 1))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: python-shards\n"
        "model: {checkpoints: [%s]}\n"
        "transport:\n"
        "  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}\n"
        "  object_store: {kind: dir, path: %s}\n"
        "receivers: {count: %d}\n"
        "delta: {chunk_elems: 4096}\n"
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
        with dcr.TrainLayout.open_spec(spec, paths[0]) as layout, \
                dcr.Publisher.open_scenario(scenario, tmp_path / "trainer",
                                            state_dir=tmp_path / "h0" / "state") as pub:
            exporter = dcr.SpecExporter(layout, spec)
            assert pub.baseline() == 0
            pub.attach_shards(layout, exporter, train.shards_of(layout, SPEC, raw_set(versions[0])))
            for k in (1, 2):
                assert pub.next_version() == k
                shards = train.shards_of(layout, SPEC, raw_set(versions[k]))
                # A shard set that misses a buffer is refused before anything is sent.
                bad = dict(shards)
                bad.pop(next(iter(bad)))
                with pytest.raises(dcr.InvalidArgumentError, match="missing"):
                    pub.publish_shards(k, bad)
                assert pub.next_version() == k
                pub.publish_shards(k, shards)
                h, committed = pub.last()
                assert committed == receivers and h == dcr.tensors_hash(versions[k])
                base, from_shards = pub.last_delta()
                assert base == k - 1 and from_shards, (base, from_shards)
                assert pub.baseline() == k
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for k in (1, 2):
        for r in range(1, receivers + 1):
            j = json.loads((tmp_path / ("h%d" % r) / "state" / ("node-%d-v%d.json" % (r, k)))
                           .read_text())
            assert j["ok"] and j["verified"], (r, k, j.get("error"), j.get("verify_message"))
