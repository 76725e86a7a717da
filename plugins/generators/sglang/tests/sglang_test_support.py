"""Helpers of the plasmid-sglang tests (imported by them; ``conftest.py`` puts this directory on ``sys.path``)."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: TEST SUPPORT ONLY: the CPU stand-in for ``sgl_kernel`` (see its docstring).
STANDIN = HERE / "cpu_kernel_standin"


def sglang_installed() -> bool:
    from plasmid_sglang.native import sglang_source_root

    return sglang_source_root() is not None


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def server_env() -> list[str]:
    """``--sglang-server-env`` entries for test servers: on a machine without a GPU, the CPU
    stand-in first on ``PYTHONPATH`` and one OpenMP thread (two threads on a busy two-core
    machine made decoding ten times slower)."""
    if gpu_available():
        return []
    return [f"PYTHONPATH={STANDIN}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS=1"]


def engine_options(**options):
    """Options (Python names) of a test engine: quick health checks, the CPU stand-in where needed,
    and on a GPU deterministic inference (SGLang honours sampling seeds only with it)."""
    defaults = {"sglang_server_env": server_env(), "sglang_health_interval": 1.0, "sglang_startup_timeout": 300.0}
    if gpu_available():
        defaults["sglang_enable_deterministic_inference"] = True
    return {**defaults, **options}


def reset(engine, model_dir) -> None:
    """Put ``model_dir``'s weights back on every server of ``engine``, at version 0, cache flushed.
    A weight-update session left open is closed first: a sync cut by its deadline while a server was
    frozen (the contract's stuck engine) has its ``/begin_weight_update`` answered once the server
    continues, and nobody ends it. A server that does not answer is being restarted by the health
    monitor (a distributed group's members stall with a frozen one), and a new server has no session."""
    from plasmid.testing import run
    from plasmid_serving.http import ServerUnreachable, request

    async def restore():
        await engine.abort_all()
        for server in engine.usable_servers():
            try:
                status, text = await request(server.url, "/end_weight_update", {}, timeout=60)
            except ServerUnreachable:
                continue
            assert status == 200 or "no weight-update session is open" in text, (status, text)
        await engine.load_weights_from_disk(str(model_dir), 0)
        await engine.flush_cache()

    run(restore())
