"""The plugin lock loads exactly the driver's set in another process, and refuses drift."""

from __future__ import annotations

import json
import subprocess
import sys

from plasmid.startup import load_plugins

LOAD_LOCK = """
import json, sys
from plasmid.plugins import PluginManager
from plasmid.errors import PluginError
manager = PluginManager()
try:
    manager.load_lock(json.loads(sys.argv[1]))
except PluginError as exc:
    print("ERROR", exc)
    raise SystemExit(0)
print(json.dumps(sorted(n for n, i in manager.infos.items() if i.status == "loaded")))
"""


def _load_in_subprocess(lock):
    proc = subprocess.run([sys.executable, "-c", LOAD_LOCK, json.dumps(lock)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_lock_loads_exactly_that_set_elsewhere():
    lock = load_plugins("grpo,match").lock()
    assert [entry["name"] for entry in lock] == ["plasmid", "grpo", "match"]
    assert json.loads(_load_in_subprocess(lock)) == ["grpo", "match"]


def test_version_drift_is_refused_naming_the_package():
    lock = load_plugins("grpo").lock()
    lock[1]["version"] = "0.0.9"
    out = _load_in_subprocess(lock)
    assert out.startswith("ERROR") and "plasmid-grpo 0.0.9" in out and "pip install plasmid-grpo==0.0.9" in out


def test_missing_plugin_is_refused_naming_the_package():
    lock = [*load_plugins("").lock(), {"name": "ghost", "distribution": "rl-ghost", "version": "1.0", "target": "g"}]
    out = _load_in_subprocess(lock)
    assert out.startswith("ERROR") and "rl-ghost" in out


def test_kernel_version_drift_is_refused():
    lock = load_plugins("").lock()
    lock[0]["version"] = "0.9.0"
    assert "plasmid 0.9.0" in _load_in_subprocess(lock)
