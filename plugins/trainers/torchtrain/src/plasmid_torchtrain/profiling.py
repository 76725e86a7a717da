"""``--profile-step N``: a PyTorch profiler trace of one step, as chrome trace JSON.

Observer hooks of plasmid-torchtrain (see :mod:`plasmid_torchtrain.plugin`): the profiler starts
when step ``N - 1`` ends (at run start for ``N = 0``) and stops when step ``N`` ends, so the trace
covers step ``N`` whole: rollout, train step, weight sync, evaluation, checkpoint. It is written to
``<run dir>/profile/step_<N>.trace.json`` (open it in ``chrome://tracing`` or
https://ui.perfetto.dev). A run that ends before step ``N`` finishes stops the profiler and writes
nothing; a resumed run that starts at step ``N > 0`` writes none (``plasmid train`` then warns).

The profiler records the tensor work of the process's compute thread
(:func:`plasmid_torch.compute.compute_executor`, where the engine, trainer and reference model of
the local runtime run their ops: torch's profiler sees the ops of the thread that started it), and
CUDA kernels when CUDA is available. Providers in other processes (a Ray runtime's trainer
workers) are not in it. torch is imported only when a trace is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plasmid.config import Config
from plasmid.kernel_options import ProfileOptions

#: run directory -> [the step to trace, the profiler while it runs]
_RUNS: dict[str, list[Any]] = {}


def trace_path(run_dir: str | Path, step: int) -> Path:
    """Where the trace of ``step`` is written."""
    return Path(run_dir) / "profile" / f"step_{step}.trace.json"


def _on_compute_thread(function: Any) -> Any:
    from plasmid_torch.compute import compute_executor

    return compute_executor().submit(function).result()


def _start(run_dir: str) -> None:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities, record_shapes=True)
    _on_compute_thread(profiler.start)
    _RUNS[run_dir][1] = profiler


def _stop(run_dir: str, *, write: bool) -> None:
    step, profiler = _RUNS[run_dir]
    if profiler is None:
        return
    _RUNS[run_dir][1] = None
    _on_compute_thread(profiler.stop)
    if write:
        path = trace_path(run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))


def run_start(config: Config, run_dir: str) -> None:
    """Arm the trace of ``--profile-step`` (started now when it is the run's first step)."""
    step = ProfileOptions.of(config).profile_step
    if step is None:
        return
    _RUNS[run_dir] = [step, None]
    if step == 0:
        _start(run_dir)


def step_end(step: int, run_dir: str) -> None:
    """Stop and write the trace after its step; start it after the step before."""
    armed = _RUNS.get(run_dir)
    if armed is None:
        return
    if step == armed[0]:
        _stop(run_dir, write=True)
        del _RUNS[run_dir]
    elif step + 1 == armed[0] and armed[1] is None:
        _start(run_dir)


def run_end(run_dir: str) -> None:
    """Stop a trace still running (the run ended before its step finished), writing nothing."""
    if run_dir in _RUNS:
        _stop(run_dir, write=False)
        del _RUNS[run_dir]


__all__ = ["run_end", "run_start", "step_end", "trace_path"]
