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
        "import contextlib, io\nfrom plasmid.app.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['plugins'])"
    )
    assert not loaded & set(HEAVY), f"'plasmid plugins' pulled in {sorted(loaded & set(HEAVY))}"


def test_building_a_config_imports_no_heavy_framework():
    loaded = _modules_after("from plasmid.testing import make_config\nmake_config(temperature=0.5)")
    assert not loaded & set(HEAVY)



def test_every_kernel_module_imports_no_heavy_framework():
    """Every module of the plasmid package, imported in one fresh process: torch and the other
    heavy frameworks live in libraries and plugins (plasmid-torch, ...), never in the kernel."""
    probe = (
        "import pkgutil, sys\n"
        "import plasmid\n"
        "names = [m.name for m in pkgutil.walk_packages(plasmid.__path__, 'plasmid.')]\n"
        "for name in names:\n"
        "    __import__(name)\n"
        "print(len(names))\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, f"importing every kernel module failed:\n{out.stderr}"
    count, modules = out.stdout.strip().splitlines()[-2:]
    assert int(count) > 20, f"only {count} kernel modules found"
    heavy = set(modules.split()) & set(HEAVY)
    assert not heavy, f"importing every kernel module pulled in {sorted(heavy)}"
