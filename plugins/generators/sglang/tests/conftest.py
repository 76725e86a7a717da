"""Shared fixtures of the plasmid-sglang tests: a tiny model and real SGLang servers.

Where plasmid-sglang is not installed (the ``embedded`` env collects every plugin's tests) the
directory is skipped; tests that need servers are skipped where SGLang is not installed.

Servers are expensive on a CPU machine (tens of seconds to start), so one session holds two
engines of one server each on the same tiny Llama model, started in parallel; tests that change
their weights put the checkpoint back (``sglang_test_support.reset``) when they end. On a
machine without a GPU the servers run the CPU stand-in for ``sgl_kernel`` (test support only,
see ``cpu_kernel_standin/sgl_kernel/__init__.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

if importlib.util.find_spec("plasmid_sglang") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny Llama (SGLang's Llama implements ``/get_weights_by_name``; its Qwen2 does not):
    vocabulary 16, tied embeddings, 4096 positions (the contract's abort test generates long)."""
    from plasmid_torch.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("sglang-model") / "llama", arch="llama", seed=0,
                            max_positions=4096)


@pytest.fixture(scope="session")
def engines(tiny_llama, tmp_path_factory):
    """Two ``sglang`` engines with one server each on ``tiny_llama``; closed at the end."""
    from sglang_test_support import engine_options, sglang_installed

    if not sglang_installed():
        pytest.skip("SGLang is not installed (the sglang tox env installs it)")
    import plasmid_sglang.plugin

    from plasmid.testing import build, make_config

    config = make_config(plasmid_sglang.plugin, run_dir=tmp_path_factory.mktemp("sglang-run"), model=str(tiny_llama),
                         **engine_options())
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda _: build("engine", "sglang", plasmid_sglang.plugin, config=config), range(2)))
    yield built
    for engine in built:
        engine.close()
