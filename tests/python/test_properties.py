"""Property: for any tensor layout, dtype mix, change rate and grid, apply(base, encode(base,
target)) == target byte for byte, and a delta for another base leaves the tensors unchanged."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dcr
from conftest import mutate, random_tensor, raw_set

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int32]

shapes = st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=3)
tensor_specs = st.lists(st.tuples(shapes, st.sampled_from(DTYPES)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(specs=tensor_specs, rate=st.sampled_from([0.0, 0.01, 0.03, 0.3, 1.0]),
       chunk=st.sampled_from([64, 1000, 1 << 22]), small=st.sampled_from([16, 1 << 16]),
       policy=st.sampled_from(["auto", "xor", "ulp", "absolute"]), wan=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_round_trip_over_random_layouts(specs, rate, chunk, small, policy, wan, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    base = {"t%d.%s" % (i, str(dt)[6:]): random_tensor(tuple(shape), dt, g)
            for i, (shape, dt) in enumerate(specs)}
    target = {k: mutate(v, rate, g) for k, v in base.items()}
    delta = dcr.encode_delta(base, target, chunk_elems=chunk, small_tensor_elems=small,
                             value_policy=policy, wan_context=wan, threads=2)
    live = {k: v.clone() for k, v in base.items()}
    dcr.apply_delta(live, delta)
    assert raw_set(live) == raw_set(target)
    # Applying again: the tensors hold the target, not the base (unless nothing changed).
    again = raw_set(live)
    if raw_set(base) != raw_set(target):
        with pytest.raises(dcr.FailedPreconditionError):
            dcr.apply_delta(live, delta)
        assert raw_set(live) == again
