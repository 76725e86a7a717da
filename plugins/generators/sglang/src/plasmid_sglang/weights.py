"""The served model's tensor names and shapes, checking updates against them, and the payloads
of ``/update_weights_from_tensor``.

**Why check here.** SGLang 0.5.23 loads whatever names it is sent: an unknown name is silently
skipped (the update "succeeds" and changes nothing) and a wrong shape kills the server. So every
update is checked against the checkpoint the server was started from (names, dtypes and shapes
read from the safetensors headers of ``--model``, without torch) before anything is sent, and an
error names the tensor. With tied embeddings the checkpoint has no ``lm_head.weight`` and SGLang
ignores that name; an update of ``lm_head.weight`` alone is sent as ``model.embed_tokens.weight``
(the same tensor).

**Payloads.** A bucket travels as one *flattened bucket* (SGLang's ``load_format
"flattened_bucket"``): the tensors' bytes concatenated into one ``uint8`` tensor, plus a list of
``types.SimpleNamespace(name, shape, dtype, start_idx, end_idx, numel)``. It is pickled and
base64-encoded into the JSON body:

- ``pickle`` (CPU tensors, any host): plain pickle, the bytes travel in the request. SGLang's
  default ``ForkingPickler`` would share CPU storage through file descriptors, which its
  unpickler refuses (it crashed a CPU server in 0.5.23);
- ``cuda-ipc`` (the server on the same GPU host): ``ForkingPickler`` of a CUDA tensor, i.e. a
  CUDA IPC handle; nothing but the handle travels. The sender keeps the tensor alive until the
  server answered.

Either way a bucket is **one** tensor on the wire (one CUDA IPC handle under ``cuda-ipc``, not
one per parameter); :func:`serialize_counted` counts the tensors it pickled, which the
``sglang-tensor`` sync reports as ``sync/handles``.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasmid_serving.images import vocab_size_of

#: safetensors dtype names -> torch dtype names.
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
TIED_HEAD, EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


@dataclass(frozen=True)
class TensorInfo:
    """A served tensor: its dtype name (``float32``) and shape."""

    dtype: str
    shape: tuple[int, ...]


class TensorTable:
    """Names, dtypes and shapes of the tensors of a Hugging Face checkpoint directory."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self.tensors: dict[str, TensorInfo] = read_safetensors_headers(self.model_dir)
        config = _read_json(self.model_dir / "config.json")
        self.tied = bool(config.get("tie_word_embeddings", False)) and TIED_HEAD not in self.tensors
        self.vocab_size = vocab_size_of(config)       # a vision-language model's is in its text_config

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def info(self, name: str) -> TensorInfo:
        """The tensor behind ``name`` (a tied ``lm_head.weight`` is the embedding).

        :raises ValueError: ``name`` is not a tensor of this model; the message names it.
        """
        served = EMBEDDING if self.tied and name == TIED_HEAD else name
        if served not in self.tensors:
            close = sorted(self.tensors, key=lambda known: -_common_prefix(known, name))[:3]
            raise ValueError(f"engine 'sglang': {name!r} is not a tensor of the model at {self.model_dir} "
                             f"(closest names: {', '.join(close)}); SGLang would silently skip it")
        return self.tensors[served]

    def check(self, named_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> list[str]:
        """The names to send for ``(name, shape)`` pairs: every name and shape checked (all of
        them, before anything is sent), a tied ``lm_head.weight`` renamed when the embedding is
        not in the same bucket.

        :raises ValueError: an unknown name or a shape that differs from the served tensor's.
        """
        pairs = list(named_shapes)
        names = {name for name, _ in pairs}
        for name, shape in pairs:
            expected = self.info(name).shape
            if tuple(shape) != expected:
                raise ValueError(f"engine 'sglang': {name} has shape {tuple(shape)}, but the served tensor is "
                                 f"{expected} (model {self.model_dir}); an SGLang server dies on such an update")
        return [EMBEDDING if self.tied and name == TIED_HEAD and EMBEDDING not in names else name
                for name, _ in pairs]


def read_safetensors_headers(model_dir: Path) -> dict[str, TensorInfo]:
    """``{name: TensorInfo}`` from every ``*.safetensors`` file of ``model_dir`` (headers only)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"engine 'sglang': no *.safetensors files in {model_dir}; plasmid checks weight "
                                f"updates against the checkpoint's tensors (save the model with safetensors)")
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                tensors[name] = TensorInfo(SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower()),
                                           tuple(int(d) for d in entry["shape"]))
    return tensors


def as_torch(value: Any) -> Any:
    """A contiguous ``torch.Tensor`` of a tensor or numpy array (CPU arrays are copied if read-only)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().contiguous()
    array = np.ascontiguousarray(value)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def flattened_bucket(named_tensors: list[tuple[str, Any]]) -> dict[str, Any]:
    """SGLang's flattened bucket of ``(name, torch tensor)`` pairs (on their device)."""
    import types

    import torch

    flat, metadata, offset = [], [], 0
    for name, tensor in named_tensors:
        data = tensor.contiguous().reshape(-1).view(torch.uint8)
        metadata.append(types.SimpleNamespace(name=name, shape=tensor.shape, dtype=tensor.dtype, start_idx=offset,
                                              end_idx=offset + data.numel(), numel=data.numel()))
        flat.append(data)
        offset += data.numel()
    return {"flattened_tensor": torch.cat(flat) if len(flat) > 1 else flat[0], "metadata": metadata}


def serialize(bucket: dict[str, Any], transport: str) -> str:
    """``bucket`` pickled for SGLang, base64 text (see the module docstring for ``transport``)."""
    return serialize_counted(bucket, transport)[0]


def serialize_counted(bucket: dict[str, Any], transport: str) -> tuple[str, int]:
    """``(base64 text, tensors pickled)`` of ``bucket`` (see :func:`serialize`). The count is
    taken by the pickler itself (every ``torch.Tensor`` it reduced): under ``cuda-ipc`` it is the
    number of CUDA IPC handles the payload carries, under ``pickle`` the in-band byte buffers.

    :raises ValueError: ``cuda-ipc`` for a bucket not on a GPU, or an unknown ``transport``.
    """
    import io
    import pickle

    import torch

    if transport not in ("pickle", "cuda-ipc"):
        raise ValueError(f"unknown tensor transport {transport!r}; choose pickle or cuda-ipc")
    if transport == "cuda-ipc" and not bucket["flattened_tensor"].is_cuda:
        raise ValueError("the cuda-ipc transport shares CUDA tensors; this bucket is on "
                         f"{bucket['flattened_tensor'].device} (use --sglang-tensor-transport pickle)")
    base: type[pickle.Pickler]
    if transport == "cuda-ipc":
        from multiprocessing.reduction import ForkingPickler

        from torch.multiprocessing.reductions import init_reductions

        init_reductions()
        base, payload = ForkingPickler, bucket
    else:
        base, payload = pickle.Pickler, {**bucket, "flattened_tensor": bucket["flattened_tensor"].cpu()}
    count = [0]

    class Counting(base):  # type: ignore[misc, valid-type]
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                count[0] += 1
            return NotImplemented

    buffer = io.BytesIO()
    Counting(buffer, pickle.HIGHEST_PROTOCOL).dump(payload)
    return base64.b64encode(buffer.getvalue()).decode(), count[0]


def choose_transport(choice: str, tensors: Iterable[Any]) -> str:
    """``auto`` is ``cuda-ipc`` when the tensors are on a GPU, else ``pickle``."""
    if choice != "auto":
        return choice
    return "cuda-ipc" if any(getattr(t, "is_cuda", False) for t in tensors) else "pickle"


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _common_prefix(a: str, b: str) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count
