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
