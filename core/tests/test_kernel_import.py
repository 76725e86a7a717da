"""The kernel stays light: importing it, or listing plugins, pulls in no heavy framework."""

import subprocess
import sys

HEAVY = ("torch", "ray", "sglang", "megatron", "transformers")


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split()[-1000:])


def test_import_plasmid_imports_no_heavy_framework():
    loaded = _modules_after("import plasmid, plasmid.hookspecs, plasmid.plugins, plasmid.registry, plasmid.protocols")
    assert not loaded & set(HEAVY), f"import plasmid pulled in {sorted(loaded & set(HEAVY))}"


def test_plasmid_plugins_command_imports_no_heavy_framework():
    loaded = _modules_after(
        "import contextlib, io\nfrom plasmid.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['plugins'])"
    )
    assert not loaded & set(HEAVY), f"'plasmid plugins' pulled in {sorted(loaded & set(HEAVY))}"


def test_building_a_config_imports_no_heavy_framework():
    loaded = _modules_after("from plasmid.testing import make_config\nmake_config(lr=0.1)")
    assert not loaded & set(HEAVY)
