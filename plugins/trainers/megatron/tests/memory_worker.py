"""TEST SUPPORT: one rank of a multi-process megatron trainer that measures its peak host memory
(RSS) during a checkpoint save and during a weight export, driven by test_megatron_export_memory.py.
Usage: ``python memory_worker.py '<json settings>'`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` set.

Every rank builds the trainer (``options`` over Adam defaults) and makes one train step (so Adam's
moments exist). Then, per phase: collect garbage and trim the allocator's free memory, take the
resident set size (``VmRSS``) as the baseline, reset the kernel's peak counter
(``/proc/self/clear_refs`` ``5``), run the phase, read the peak (``VmHWM``). Phases: ``save``
(``trainer.save``), ``sync`` (``export_weights`` of ``bucket`` bytes, each bucket dropped once
counted, as a weight sync hands it on). Each rank writes ``<out>/rank_<r>.json``: per phase the
baseline, the peak and the growth (bytes) and the largest bucket it saw; ``own``: the bytes of its
parameters, gradient buffers and optimizer state.
"""

import gc
import json
import os
import sys
from pathlib import Path

VOCAB = 16


def status(field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def release_free_memory() -> None:
    """Collect garbage and give the allocator's free memory back to the system (glibc's
    ``malloc_trim``), so that the baseline RSS is what the process holds, not what it once held."""
    import ctypes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def own_bytes(trainer) -> int:
    """Parameters, megatron's gradient buffers and the optimizer's state tensors of this rank."""
    import torch
    from plasmid_megatron.model import unwrapped
    from plasmid_megatron.sharded_state import _inner_optimizers

    seen: set[int] = set()
    total = 0

    def add(tensor):
        nonlocal total
        if isinstance(tensor, torch.Tensor) and tensor.numel() and tensor.untyped_storage().data_ptr() not in seen:
            seen.add(tensor.untyped_storage().data_ptr())
            total += tensor.untyped_storage().nbytes()

    for param in unwrapped(trainer.model).parameters():
        add(param)
        add(getattr(param, "main_grad", None))
    for inner in _inner_optimizers(trainer.optimizer):
        for group in inner.param_groups:
            for param in group["params"]:
                add(param)
        for state in inner.state.values():
            for value in state.values():
                add(value)
    return total


def main(settings: dict) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import megatron_cpu_shim

    megatron_cpu_shim.install()
    import plasmid_grpo.plugin
    import plasmid_megatron.plugin
    import torch

    from plasmid import testing
    from plasmid_torch.testing.contracts.trainer import make_rollout_batch

    torch.set_num_threads(1)
    out = Path(settings["out"])
    rank = int(os.environ.get("RANK", "0"))
    options = {"trainer": "megatron", "model": settings["model"], "lr": 1e-3, "megatron_optimizer": "adam",
               "micro_batch_size": 4, "run_dir": out / "run", "update_weight_buffer_size": settings["bucket"],
               **settings.get("options", {})}
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))
    testing.run(trainer.train_step(make_rollout_batch(VOCAB, groups=1, seed=5)))

    def measured(phase):
        release_free_memory()
        baseline = status("VmRSS")
        reset_peak()
        largest = phase()
        peak = status("VmHWM")
        return {"baseline": baseline, "peak": peak, "growth": peak - baseline, "largest_bucket": largest}

    def save():
        testing.run(trainer.save(str(out / "ckpt")))
        return None

    def sync():
        largest = 0
        for bucket in trainer.export_weights(settings["bucket"]):
            largest = max(largest, sum(tensor.numel() * tensor.element_size() for _, tensor in bucket))
            del bucket
        return largest

    result = {"own": own_bytes(trainer), "save": measured(save), "sync": measured(sync)}
    (out / f"rank_{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    __import__("multiprocess").leave_world()
