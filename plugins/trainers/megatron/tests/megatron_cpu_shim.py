"""TEST SUPPORT ONLY: let megatron-core 0.16 run on a CPU-only torch with gloo. Never imported by the product.

megatron-core assumes CUDA in a few places that the CPU tests reach; :func:`install` patches them
for the whole process (it changes global torch behaviour, so only test processes call it):

1. megatron's RNG tracker saves and restores CUDA generator states: it gets the CPU generator's;
2. ``torch.cuda.current_device()`` / ``synchronize()`` are called unconditionally: they answer the CPU;
3. ``device="cuda"`` literals (schedules, optimizers, grad clipping), ``Tensor.cuda()`` and
   ``Tensor.type() == "torch.cuda.FloatTensor"`` checks: a ``TorchFunctionMode`` maps them to the CPU.
   Torch function modes are per thread, so the mode is entered in the installing thread and in
   every thread started afterwards (the trainer computes on its own worker thread). The same mode
   drops ``pin_memory=True`` (no pinned-memory allocator without an accelerator; megatron's
   context-parallel rotary embedding asks for it).
4. CUDA streams and events (``torch.cuda.Stream``, ``current_stream``, ``stream``): megatron's
   ``alltoall`` MoE token dispatcher (expert parallelism) creates a side stream when it is built
   and copies its split sizes to the host on it. On the CPU every copy is synchronous, so a
   stream that does nothing (and is its own event) stands in for them. Its host copy
   (``maybe_move_tensor_to_cpu``) turns split sizes into numpy arrays only when they were on the
   GPU, and ``all_to_all_single`` takes no tensor as split sizes: on the CPU they are converted too.

Facts from the feasibility notes (shared/reference/megatron_cpu_shim.py), rewritten for the tests.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

_installed = False


class HostStream:
    """Stands in for ``torch.cuda.Stream`` and its events: CPU work is already in order."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return self

    def synchronize(self):
        pass

    def query(self):
        return True


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)   # a bare ordinal means cuda:N


class CudaToCpu(TorchFunctionMode):
    """Runs CUDA-placed tensor creation and moves on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]) and not isinstance(args[1], int):
            args = (args[0], "cpu", *args[2:])
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if name.startswith("torch.cuda") else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


def install() -> None:
    """Apply every patch (idempotent)."""
    global _installed
    if _installed:
        return
    import megatron.core.tensor_parallel.random as megatron_random

    def get_rng_state(device="cuda", clone=False, graph_safe=False):
        state = torch.get_rng_state()
        return state.clone() if clone else state

    def set_rng_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    def add(self, name, seed):
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)
        self._is_initialized = True

    megatron_random._get_cuda_rng_state = get_rng_state
    megatron_random._set_cuda_rng_state = set_rng_state
    megatron_random.CudaRNGStatesTracker.add = add
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *args, **kwargs: None
    default_stream = HostStream()
    torch.cuda.Stream = HostStream
    torch.cuda.current_stream = lambda device=None: default_stream
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher

    def host_copy(tensor, as_numpy=False, record_stream=False):
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = host_copy

    CudaToCpu().__enter__()           # this thread, for the rest of the process
    original_run = threading.Thread.run

    def run(self):
        with CudaToCpu():
            original_run(self)

    threading.Thread.run = run
    _installed = True
