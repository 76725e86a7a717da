"""Small helpers shared by the syncs: tensor sizes and conversions, process-local state, and
the check that a sync needing separate processes got them.

Functions that a sync runs inside a provider's process (through :func:`plasmid.remote.run_on`)
keep what must outlive one call (an export iterator, a process group, a base copy of the
weights) in :data:`PROCESS_STATE`, keyed by the sync's id: a module global of the process they
run in, never an attribute added to the provider.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
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


def bucketed(named: Iterable[tuple[str, Any]], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """``(name, tensor)`` pairs in consecutive buckets of at most ``bucket_bytes`` bytes (a tensor
    larger than that is a bucket of its own), lazily: the stream is read one tensor past the bucket
    being yielded, never further. Tensors are torch tensors or numpy arrays (:func:`tensor_bytes`).

    :raises ValueError: ``bucket_bytes`` is not positive (``--update-weight-buffer-size``).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes} (--update-weight-buffer-size)")
    pending: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named:
        if pending and size + tensor_bytes(tensor) > bucket_bytes:
            yield pending
            pending, size = [], 0
        pending.append((name, tensor))
        size += tensor_bytes(tensor)
    if pending:
        yield pending


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
        raise TypeError(f"tensor of dtype {tensor.dtype} has no numpy equivalent; use to_transport or "
                        f"raw_array, which carry bfloat16") from exc


#: The dtype name under which bfloat16 tensors (numpy has no bfloat16) travel as raw bits.
BFLOAT16 = "bfloat16"


def to_transport(value: Any) -> Any:
    """What a sync puts in Ray's object store for a tensor: a numpy array (zero-copy there) where
    numpy has the dtype, else the CPU ``torch.Tensor`` itself (bfloat16: Ray pickles it)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value
    tensor = value.detach().cpu()
    try:
        return tensor.numpy()
    except TypeError:
        return tensor


def raw_array(value: Any) -> tuple[Any, str]:
    """``(array, dtype name)``: a contiguous numpy array of ``value``'s elements and the name that
    :func:`from_raw` needs to rebuild it. For dtypes numpy has, the array itself and numpy's dtype
    string (``'<f4'``); for bfloat16, its 16-bit patterns as ``uint16`` and :data:`BFLOAT16`. Bit
    exact either way: what byte-level syncs (``delta``'s XOR, checksums) work on."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value), value.dtype.str
    tensor = value.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy(), BFLOAT16
    array = as_numpy(tensor)
    return np.ascontiguousarray(array), array.dtype.str


def raw_array_of_dtype(value: Any, name: str) -> tuple[Any, str]:
    """:func:`raw_array` of ``value`` as dtype ``name``: an engine that serves bfloat16 weights may
    report them upcast to float32 (exact), so for :data:`BFLOAT16` a float tensor or array is cast
    back first (exact for values that came from bfloat16; callers check with a checksum). Other
    dtypes are taken as they are."""
    import torch

    if name == BFLOAT16 and not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16):
        value = as_torch(value).to(torch.bfloat16)
    return raw_array(value)


def raw_dtype(name: str) -> Any:
    """The numpy dtype of :func:`raw_array`'s array for dtype ``name``."""
    import numpy as np

    return np.dtype(np.uint16) if name == BFLOAT16 else np.dtype(name)


def from_raw(array: Any, name: str) -> Any:
    """Inverse of :func:`raw_array`: the numpy array for numpy dtypes, a bfloat16
    ``torch.Tensor`` (sharing ``array``'s memory) for :data:`BFLOAT16`."""
    if name != BFLOAT16:
        return array
    import numpy as np
    import torch

    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(np.ascontiguousarray(array)).view(torch.bfloat16)


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
