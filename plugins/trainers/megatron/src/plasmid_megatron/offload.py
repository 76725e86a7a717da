"""Freeing the trainer's device memory between steps (colocate mode), and getting it back.

In colocate mode the rollout engine and the trainer share the accelerators: while the engine
generates, the trainer's weights, gradients and optimizer state must not hold device memory.
:class:`MemoryStash` does it at the level of tensor *storages*: each distinct storage behind the
given tensors is copied to host memory (pinned, on CUDA) and resized to zero bytes; onload
resizes it back and copies the bytes in. Every tensor and view over a storage (megatron's DDP
keeps parameters and ``main_grad`` as views into contiguous buffers; the distributed optimizer
keeps views of those) stays the same Python object and becomes valid again, so nothing that holds
a reference has to be rebuilt. Gradient buffers are *discarded* instead of copied (a step starts
by zeroing them), and come back as zeros.

Device-agnostic: on the CPU the copy frees nothing, so the trainer only calls it on CUDA, but the
mechanism is the same and the tests exercise it there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


@dataclass
class _Stashed:
    storage: torch.UntypedStorage
    nbytes: int
    host: torch.Tensor | None          # uint8 copy of the bytes; None for a discarded storage


def _bytes_of(storage: torch.UntypedStorage, nbytes: int) -> torch.Tensor:
    """A ``[nbytes]`` uint8 tensor over the whole storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,), (1,))


def distinct_storages(tensors: Iterable[torch.Tensor], device: torch.device) -> list[torch.UntypedStorage]:
    """The storages behind those ``tensors`` that live on ``device``, each once, skipping empty
    ones (already freed)."""
    seen: set[int] = set()
    storages = []
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if tensor.device != device or storage.nbytes() == 0:
            continue
        key = storage.data_ptr()
        if key not in seen:
            seen.add(key)
            storages.append(storage)
    return storages


class MemoryStash:
    """Moves the storages of some tensors out of device memory and back.

    :param tensors: called at each :meth:`offload`, returns ``(kept, discarded)``: the tensors
        whose contents must survive (weights, optimizer moments, fp32 main weights), and those whose
        contents may be dropped (gradient buffers); a storage in both is kept.
    :param device: only storages on this device are moved (optimizer step counters and the like
        that already live on the host stay).
    Called by the trainer on its worker thread; not thread-safe.
    """

    def __init__(self, tensors: Callable[[], tuple[Iterable[torch.Tensor], Iterable[torch.Tensor]]], *,
                 device: torch.device) -> None:
        self.tensors, self.device = tensors, torch.device(device)
        self._stashed: list[_Stashed] = []

    @property
    def offloaded(self) -> bool:
        return bool(self._stashed)

    @property
    def offloaded_bytes(self) -> int:
        """Device bytes freed by the last :meth:`offload` (0 when on the device)."""
        return sum(item.nbytes for item in self._stashed)

    @torch.no_grad()
    def offload(self) -> int:
        """Free the storages (a no-op when already offloaded); the bytes freed."""
        if self._stashed:
            return 0
        kept_tensors, discarded_tensors = self.tensors()
        kept = distinct_storages(kept_tensors, self.device)
        kept_keys = {storage.data_ptr() for storage in kept}
        dropped = [s for s in distinct_storages(discarded_tensors, self.device) if s.data_ptr() not in kept_keys]
        pin = self.device.type == "cuda"
        for storage in kept:
            nbytes = storage.nbytes()
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            host.copy_(_bytes_of(storage, nbytes))
            self._stashed.append(_Stashed(storage, nbytes, host))
        for storage in dropped:
            self._stashed.append(_Stashed(storage, storage.nbytes(), None))
        if pin:
            torch.cuda.synchronize()
        for item in self._stashed:
            item.storage.resize_(0)
        return self.offloaded_bytes

    @torch.no_grad()
    def onload(self) -> None:
        """Reallocate every freed storage and restore its bytes (discarded ones as zeros)."""
        for item in self._stashed:
            item.storage.resize_(item.nbytes)
            data = _bytes_of(item.storage, item.nbytes)
            if item.host is None:
                data.zero_()
            else:
                data.copy_(item.host)
        self._stashed = []


def optimizer_tensors(optimizer: object) -> list[torch.Tensor]:
    """Every tensor a megatron optimizer (chained or not) keeps: its inner torch optimizers'
    parameters (fp32 main weights, or the model's own) and their state (Adam moments, steps)."""
    tensors: list[torch.Tensor] = []
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            tensors.extend(p for p in group["params"] if isinstance(p, torch.Tensor))
        for state in inner.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        for name in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups", "shard_fp32_groups"):
            for group in getattr(part, name, None) or []:
                tensors.extend(p for p in group if isinstance(p, torch.Tensor))
    return tensors


def grad_buffers(ddp_model: object) -> list[torch.Tensor]:
    """The gradient buffers of megatron's ``DistributedDataParallel`` (dense and expert)."""
    buffers = list(getattr(ddp_model, "buffers", [])) + list(getattr(ddp_model, "expert_parallel_buffers", []))
    return [buffer.grad_data for buffer in buffers if getattr(buffer, "grad_data", None) is not None]
