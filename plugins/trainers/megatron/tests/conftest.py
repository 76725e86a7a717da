"""The megatron plugin's tests run on CPU with megatron-core patched (``megatron_cpu_shim``).

The shim changes global torch behaviour, so these tests get a pytest process of their own (the
``megatron`` tox env runs only this directory). Where plasmid-megatron or megatron-core is not
installed (the ``embedded`` env collects every plugin's tests) the directory is skipped.
"""

import importlib.util
import sys
from pathlib import Path


def _megatron_installed() -> bool:
    if importlib.util.find_spec("plasmid_megatron") is None:
        return False
    from plasmid_megatron.native_options import megatron_source_root

    return megatron_source_root() is not None


if _megatron_installed():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import megatron_cpu_shim

    megatron_cpu_shim.install()
else:
    collect_ignore_glob = ["test_*.py"]


if _megatron_installed():
    import pytest

    @pytest.fixture(autouse=True)
    def _one_thread():
        """One math thread per test process: multi-process tests start several at once on 2 cores."""
        import torch

        torch.set_num_threads(1)

    @pytest.fixture(scope="session")
    def model_dir(tmp_path_factory):
        """The tiny Qwen2 (tied embeddings, QKV bias, 4 heads over 2 key/value heads) most tests
        train; read-only. Modules that need other models define their own ``model_dir``."""
        from plasmid_torch.tiny import build_tiny_model

        return build_tiny_model(tmp_path_factory.mktemp("megatron") / "tiny", num_kv_heads=2)
