"""TEST SUPPORT ONLY: a plasmid plugin file whose import applies the megatron CPU shim.

``plasmid train --trainer megatron --plugins ./plugins/trainers/megatron/tests/cpu_shim_plugin.py``
in a test subprocess: plugins load before any provider is built, so megatron sees the patches.
It registers nothing.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import megatron_cpu_shim

megatron_cpu_shim.install()
