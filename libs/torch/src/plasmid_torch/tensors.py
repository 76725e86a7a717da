"""Small helpers shared by the syncs: tensor sizes and conversions, process-local state, and
the check that a sync needing separate processes got them.

Functions that a sync runs inside a provider's process (through :func:`plasmid.remote.run_on`)
keep what must outlive one call (an export iterator, a process group, a base copy of the
weights) in :data:`PROCESS_STATE`, keyed by the sync's id: a module global of the process they
run in, never an attribute added to the provider.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from plasmid.errors import UsageError
from plasmid.remote import is_remote

#: Identifies this process (a restarted actor gets a new one).
PROCESS_ID = uuid.uuid4().hex
#: State kept between calls of one sync inside this process: ``sync key -> anything``.
PROCESS_STATE: dict[str, Any] = {}


def tensor_bytes(tensor: Any) -> int:
    """Bytes of a ``torch.Tensor``'s or ``numpy.ndarray``'s data."""
    if hasattr(tensor, "element_size"):
        return int(tensor.numel() * tensor.element_size())
    return int(tensor.nbytes)


def as_torch(value: Any) -> Any:
    """A CPU ``torch.Tensor`` view of a tensor or numpy array (read-only arrays are copied)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    array = np.asarray(value)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def as_numpy(value: Any) -> Any:
    """A numpy array of a tensor (bfloat16, which numpy lacks, raises a clear error)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value
    tensor = value.detach().cpu()
    try:
        return tensor.numpy()
    except TypeError as exc:
        raise TypeError(f"tensor of dtype {tensor.dtype} has no numpy equivalent; this sync moves float16/"
                        f"float32/float64/int tensors") from exc


def process_token(target: Any) -> str:
    """Who ``target`` is, process included: changes when its actor is restarted."""
    return f"{PROCESS_ID}:{id(target)}"


def require_separate_processes(sync: str, trainer: Any, engines: Sequence[Any]) -> None:
    """Raise when ``sync`` (which moves weights between processes) got local providers."""
    local = [what for what, target in [("the trainer", trainer), *((f"engine {i}", e) for i, e in
                                                                     enumerate(engines))] if not is_remote(target)]
    if local:
        raise UsageError(f"--weight-sync {sync} moves weights between processes, but {', '.join(local)} "
                         f"run in this process; use it with --runtime ray, or choose inprocess, disk or delta")


class GroupCycle:
    """The process group a weight sync keeps between the trainer and its engines: named
    ``<key>-<n>`` and formed again (``n + 1``) whenever the processes behind them change, an
    engine restarted or a server replaced (``members``: one token per side, as from
    :func:`process_token`). Used by ``broadcast`` and by plasmid-sglang's ``sglang-distributed``."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.members: list[str] | None = None
        self.name = ""
        self.formed = 0

    async def ensure(self, members: list[str], form: Any) -> str:
        """The current group's name; first ``await form(new name)`` when ``members`` differ from
        those it was formed for (the first call always forms it)."""
        if members != self.members:
            name = f"{self.key}-{self.formed + 1}"
            await form(name)
            self.formed += 1
            self.name, self.members = name, list(members)
        return self.name


def node_address() -> str:
    """This node's address as Ray knows it (other nodes of the cluster reach it there), else
    ``127.0.0.1``: where a weight-sync group's rendezvous is served."""
    try:
        import ray
    except ImportError:
        return "127.0.0.1"
    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def group_backend(choice: str) -> str:
    """The ``torch.distributed`` backend of a weight-sync group: ``choice``, or for ``auto``
    ``nccl`` when this process sees a GPU, else ``gloo``."""
    if choice != "auto":
        return choice
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"
