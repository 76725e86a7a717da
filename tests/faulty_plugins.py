"""A real third-party distribution, rl-plugin-faulty 0.3.0, with one entry point per way a
plugin can be broken, written straight into a directory as pip would install it (modules and
a ``.dist-info`` with ``METADATA`` and ``entry_points.txt``): put the directory on ``sys.path``
(or a subprocess's ``PYTHONPATH``) and :mod:`importlib.metadata` finds it installed.

Entry points (plugin name -> what is wrong with it):

- ``faultyimport``: its module raises ``ModuleNotFoundError`` when imported;
- ``faultysig``: ``plasmid_rewards(register, bogus)``: an argument the hookspec does not declare;
- ``faultyhook``: ``plasmid_reward`` (a misspelled hook);
- ``faultyraise``: its ``plasmid_rewards`` raises;
- ``faultylazy``: reward ``faulty-ghost`` points to a module that does not exist, reward
  ``faulty-noattr`` to a missing attribute of an imported module, and ``faulty-lazy-ok`` works;
- ``faultyexact``: registers reward ``exact`` (plasmid-match's name) and ``faulty-extra``.

Every working reward is :class:`AlwaysOne`-like: 1.0 for every sample.
"""

from __future__ import annotations

from pathlib import Path

DISTRIBUTION, VERSION = "rl-plugin-faulty", "0.3.0"
ALL = ("faultyimport", "faultysig", "faultyhook", "faultyraise", "faultylazy", "faultyexact")

_ONE = '''
class AlwaysOne:
    """1.0 for every sample."""

    def __init__(self, config=None):
        self.config = config

    async def __call__(self, sample):
        return 1.0
'''

MODULES = {
    "faulty_import": "import a_module_that_does_not_exist_faulty  # noqa: F401\n",
    "faulty_sig": "from plasmid import hookimpl\n\n\n@hookimpl\ndef plasmid_rewards(register, bogus):\n"
                  "    register('faulty-sig', 'faulty_sig:AlwaysOne')\n" + _ONE,
    "faulty_hook": "from plasmid import hookimpl\n\n\n@hookimpl\ndef plasmid_reward(register):\n"
                   "    register('faulty-hook', 'faulty_hook:AlwaysOne')\n" + _ONE,
    "faulty_raise": "from plasmid import hookimpl\n\n\n@hookimpl\ndef plasmid_filters(register):\n"
                    "    register('faulty-filter', 'faulty_raise:AlwaysOne')\n\n\n"
                    "@hookimpl\ndef plasmid_rewards(register):\n    raise RuntimeError('faulty registration')\n"
                    + _ONE,
    "faulty_lazy": "from plasmid import hookimpl\n\n\n@hookimpl\ndef plasmid_rewards(register):\n"
                   "    register('faulty-ghost', 'faulty_no_such_module.sub:Reward')\n"
                   "    register('faulty-noattr', 'faulty_lazy:NoSuchReward')\n"
                   "    register('faulty-lazy-ok', 'faulty_lazy:AlwaysOne')\n" + _ONE,
    "faulty_exact": "from plasmid import hookimpl\n\n\n@hookimpl\ndef plasmid_rewards(register):\n"
                    "    register('exact', 'faulty_exact:AlwaysOne')\n"
                    "    register('faulty-extra', 'faulty_exact:AlwaysOne')\n" + _ONE,
}

ENTRY_POINTS = {name: f"faulty_{name.removeprefix('faulty')}" for name in ALL}


def install_faulty(target: Path) -> Path:
    """Install rl-plugin-faulty into ``target`` (created); returns ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for module, source in MODULES.items():
        (target / f"{module}.py").write_text(source)
    info = target / f"{DISTRIBUTION.replace('-', '_')}-{VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {VERSION}\n"
                                   f"Requires-Dist: plasmid<0.2,>=0.1\n")
    (info / "entry_points.txt").write_text(
        "[plasmid]\n" + "".join(f"{name} = {module}\n" for name, module in ENTRY_POINTS.items()))
    (info / "top_level.txt").write_text("".join(f"{module}\n" for module in MODULES))
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("pip\n")
    return target
