"""Helpers of the plasmid-vllm tests (``conftest.py`` puts this directory on ``sys.path``)."""

from __future__ import annotations


def vllm_installed() -> bool:
    from plasmid_vllm.native import vllm_source_root

    return vllm_source_root() is not None


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_options(**options):
    """Options (Python names) of a test engine: one OpenMP thread for the server (the machine's
    two cores are shared), eager mode (no graph compilation at start-up), quick health checks, and
    the engine core and worker in the API server's process (each process start imports vLLM and
    torch: about a minute on a busy two-core machine)."""
    defaults = {"vllm_server_env": ["OMP_NUM_THREADS=1", "VLLM_CPU_OMP_THREADS_BIND=nobind",
                                    "VLLM_ENABLE_V1_MULTIPROCESSING=0"],
                "vllm_distributed_executor_backend": "uni",
                "vllm_health_interval": 1.0, "vllm_startup_timeout": 600.0, "vllm_enforce_eager": True}
    if gpu_available():  # what --weight-sync vllm-nccl needs on the server side
        defaults["vllm_weight_transfer_config"] = '{"backend": "nccl"}'
    return {**defaults, **options}


def reset(engine, model_dir) -> None:
    """Put ``model_dir``'s weights back on the engine's server, at version 0, cache flushed."""
    from plasmid.testing import run

    async def restore():
        await engine.abort_all()
        await engine.load_weights_from_disk(str(model_dir), 0)

    run(restore())
