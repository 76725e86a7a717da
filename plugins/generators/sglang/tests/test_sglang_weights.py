"""Updates are checked against the checkpoint before anything is sent (SGLang skips unknown names
silently and dies on a wrong shape), and buckets are packed the way SGLang's unpickler accepts."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from plasmid_sglang.weights import (
    TensorTable,
    as_torch,
    choose_transport,
    flattened_bucket,
    serialize,
    serialize_counted,
)
from sglang_test_support import sglang_installed

from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tied") / "m", arch="llama")


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("untied") / "m", arch="llama", tie_word_embeddings=False)


def test_the_table_lists_every_checkpoint_tensor_with_its_shape_and_dtype(tied):
    table = TensorTable(tied)
    from safetensors import safe_open

    with safe_open(str(tied / "model.safetensors"), framework="pt") as reader:
        expected = {name: tuple(reader.get_tensor(name).shape) for name in reader.keys()}
    assert {name: info.shape for name, info in table.tensors.items()} == expected
    assert {info.dtype for info in table.tensors.values()} == {"float32"}
    assert table.vocab_size == 16 and table.tied


def test_an_unknown_name_is_refused_naming_it_and_its_closest_neighbours(tied):
    with pytest.raises(ValueError, match=r"'model.layers.0.no_such_proj.weight' is not a tensor.*closest names: "
                                         r"model.layers.0."):
        TensorTable(tied).check([("model.norm.weight", (64,)), ("model.layers.0.no_such_proj.weight", (3,))])


def test_a_wrong_shape_is_refused_before_it_can_kill_a_server(tied):
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(3,\), but the served tensor is \(64,\)"):
        TensorTable(tied).check([("model.norm.weight", (3,))])


def test_a_tied_head_alone_is_sent_as_the_embedding_it_is(tied, untied):
    head = ("lm_head.weight", (16, 64))
    assert TensorTable(tied).check([head]) == ["model.embed_tokens.weight"]
    assert TensorTable(tied).check([head, ("model.embed_tokens.weight", (16, 64))]) == \
        ["lm_head.weight", "model.embed_tokens.weight"], "both present: SGLang skips the head, loads the embedding"
    assert TensorTable(untied).check([head]) == ["lm_head.weight"]


def test_numpy_arrays_and_tensors_become_contiguous_tensors():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    array.setflags(write=False)
    assert torch.equal(as_torch(array), torch.arange(6.0).reshape(2, 3))
    transposed = torch.arange(6.0).reshape(2, 3).t()
    assert as_torch(transposed).is_contiguous() and torch.equal(as_torch(transposed), transposed)


def test_transport_auto_is_pickle_for_cpu_tensors():
    assert choose_transport("auto", [torch.zeros(2)]) == "pickle"
    assert choose_transport("cuda-ipc", [torch.zeros(2)]) == "cuda-ipc"
    with pytest.raises(ValueError, match="cuda-ipc transport shares CUDA tensors"):
        serialize(flattened_bucket([("x", torch.zeros(2))]), "cuda-ipc")


@pytest.mark.skipif(not sglang_installed(), reason="SGLang is not installed")
def test_a_pickled_flattened_bucket_passes_sglangs_unpickler_and_rebuilds_bit_for_bit():
    from sglang.srt.utils.common import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    named = [("a", torch.randn(3, 4)), ("b", torch.arange(5, dtype=torch.int64)), ("c", torch.randn(2).half())]
    payload = serialize(flattened_bucket(named), "pickle")
    data = MultiprocessingSerializer.deserialize(base64.b64decode(payload))
    rebuilt = FlattenedTensorBucket(flattened_tensor=data["flattened_tensor"], metadata=data["metadata"])
    for (name, tensor), (got_name, got) in zip(named, rebuilt.reconstruct_tensors(), strict=True):
        assert got_name == name and got.dtype == tensor.dtype and torch.equal(got, tensor)
    json.dumps({"serialized_named_tensors": [payload]})  # travels as JSON text


def test_a_bucket_of_many_tensors_travels_as_one_tensor_and_the_pickler_counts_it():
    named = [(f"t{i}", torch.randn(3, i + 1)) for i in range(5)]
    payload, carried = serialize_counted(flattened_bucket(named), "pickle")
    assert carried == 1 and payload == serialize(flattened_bucket(named), "pickle")
    # the count is the pickler's, not an assumption: a per-tensor payload is counted per tensor
    _, per_tensor = serialize_counted({"flattened_tensor": torch.zeros(1), "metadata": [t for _, t in named]},
                                      "pickle")
    assert per_tensor == 6
    with pytest.raises(ValueError, match="unknown tensor transport 'shm'"):
        serialize_counted(flattened_bucket(named), "shm")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU (runs on a GPU machine)")
def test_a_cuda_bucket_travels_as_one_cuda_ipc_handle_and_rebuilds_bit_for_bit():
    import pickle

    named = [("a", torch.randn(64, 32, device="cuda")), ("b", torch.randn(7, device="cuda").bfloat16())]
    bucket = flattened_bucket(named)
    assert bucket["flattened_tensor"].is_cuda
    payload, handles = serialize_counted(bucket, "cuda-ipc")
    assert handles == 1
    data = pickle.loads(base64.b64decode(payload))  # same process: the handle opens the same storage
    assert data["flattened_tensor"].is_cuda and torch.equal(data["flattened_tensor"], bucket["flattened_tensor"])
