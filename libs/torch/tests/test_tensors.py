"""plasmid_torch.tensors: how syncs carry tensors whose dtype numpy lacks (bfloat16), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plasmid_torch.tensors import (
    BFLOAT16,
    as_numpy,
    bucketed,
    from_raw,
    raw_array,
    raw_array_of_dtype,
    raw_dtype,
    to_transport,
)


def bf16_values() -> torch.Tensor:
    # includes values float16 cannot hold (1e30) and ones bfloat16 rounds (1/3)
    return torch.tensor([[0.0, -1.5, 1e30], [1 / 3, -0.0, 7.0]]).to(torch.bfloat16)


def test_bfloat16_round_trips_through_its_raw_bits():
    tensor = bf16_values()
    array, name = raw_array(tensor)
    assert name == BFLOAT16 and array.dtype == np.uint16 and array.shape == (2, 3)
    assert raw_dtype(name) == np.uint16
    back = from_raw(array.copy(), name)
    assert back.dtype == torch.bfloat16
    assert torch.equal(back.view(torch.uint16), tensor.view(torch.uint16))


def test_numpy_dtypes_keep_their_array_and_name():
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    array, name = raw_array(tensor)
    assert name == "<f4" and raw_dtype(name) == np.float32
    assert from_raw(array, name) is array
    np.testing.assert_array_equal(array, tensor.numpy())


def test_float32_report_of_bfloat16_weights_gives_the_same_bits():
    tensor = bf16_values()
    served = tensor.float().numpy()  # how torchgen's get_weights reports bf16 weights
    assert np.array_equal(raw_array_of_dtype(served, BFLOAT16)[0], raw_array(tensor)[0])


def test_transport_keeps_bfloat16_a_tensor_and_the_rest_numpy():
    assert isinstance(to_transport(torch.ones(2)), np.ndarray)
    moved = to_transport(bf16_values())
    assert isinstance(moved, torch.Tensor) and moved.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="bfloat16"):
        as_numpy(bf16_values())


def test_bucketed_keeps_order_bounds_buckets_and_reads_lazily():
    read = []

    def stream():
        for index, size in enumerate([3, 3, 5, 1, 9]):
            read.append(index)
            yield f"t{index}", np.zeros(size, dtype=np.uint8)

    buckets = bucketed(stream(), 6)
    first = next(buckets)
    assert [name for name, _ in first] == ["t0", "t1"] and read == [0, 1, 2], "one tensor past the bucket, no more"
    rest = [[name for name, _ in bucket] for bucket in buckets]
    assert rest == [["t2", "t3"], ["t4"]], "a tensor larger than a bucket is a bucket of its own"


def test_bucketed_refuses_a_bucket_size_that_is_not_positive():
    with pytest.raises(ValueError, match=r"bucket_bytes must be > 0, got 0 \(--update-weight-buffer-size\)"):
        next(bucketed(iter([("t", np.zeros(1))]), 0))
