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

A second distribution, rl-plugin-hookfaults 0.1.0 (:func:`install_hook_faults`), holds plugins
whose *hooks* fail at run time rather than at load time:

- ``badaddoption``: declares ``--badaddoption-level``, then raises in ``plasmid_addoption``;
- ``baddefaults``: sets ``--seed`` to 7, then raises in ``plasmid_defaults``;
- ``badconfigure``: raises in ``plasmid_configure``;
- ``badmetrics``: raises in ``plasmid_metrics``; its ``plasmid_step_end`` writes
  ``<run dir>/badmetrics_step_end`` (so a test sees whether it was switched off);
- ``badstepend``, ``badsynced``, ``badrunstart``: raise in ``plasmid_step_end``,
  ``plasmid_weights_synced``, ``plasmid_run_start``;
- ``typometric``: implements ``plasmid_metric`` (meant: ``plasmid_metrics``);
- ``typoaddoption``: implements ``plasmid_add_option`` (meant: ``plasmid_addoption``).

The three bootstrap ones each register a reward (``bad-addoption``, ``bad-defaults``,
``bad-configure``: 1.0 for every sample) so a test can see their providers dropped.
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


HOOK_DISTRIBUTION, HOOK_VERSION = "rl-plugin-hookfaults", "0.1.0"
#: the plugins of rl-plugin-hookfaults that fail in a bootstrap hook / an observer hook
BOOTSTRAP_FAULTS = ("badaddoption", "baddefaults", "badconfigure")
OBSERVER_FAULTS = ("badmetrics", "badstepend", "badsynced", "badrunstart")
HOOK_FAULTS = (*BOOTSTRAP_FAULTS, *OBSERVER_FAULTS, "typometric", "typoaddoption")

_HOOK = "from plasmid import hookimpl\n\n\n"

HOOK_MODULES = {
    "bad_addoption": _HOOK + "@hookimpl\ndef plasmid_addoption(parser):\n"
                     "    parser.getgroup('badaddoption').addoption('--badaddoption-level', type=int, default=1)\n"
                     "    raise RuntimeError('faulty addoption')\n\n\n"
                     "@hookimpl\ndef plasmid_rewards(register):\n    register('bad-addoption', AlwaysOne)\n" + _ONE,
    "bad_defaults": _HOOK + "@hookimpl\ndef plasmid_defaults(config):\n    config.option.seed = 7\n"
                    "    raise KeyError('faulty defaults')\n\n\n"
                    "@hookimpl\ndef plasmid_rewards(register):\n    register('bad-defaults', AlwaysOne)\n" + _ONE,
    "bad_configure": _HOOK + "@hookimpl\ndef plasmid_configure(config):\n"
                     "    raise ValueError('faulty configure')\n\n\n"
                     "@hookimpl\ndef plasmid_rewards(register):\n    register('bad-configure', AlwaysOne)\n" + _ONE,
    "bad_metrics": "import pathlib\n\n" + _HOOK + "@hookimpl\ndef plasmid_metrics(step, metrics):\n"
                   "    raise RuntimeError('faulty metrics')\n\n\n"
                   "@hookimpl\ndef plasmid_step_end(step, run_dir):\n"
                   "    (pathlib.Path(run_dir) / 'badmetrics_step_end').write_text(str(step))\n",
    "bad_stepend": _HOOK + "@hookimpl\ndef plasmid_step_end(step):\n    raise RuntimeError('faulty step_end')\n",
    "bad_synced": _HOOK + "@hookimpl\ndef plasmid_weights_synced(report):\n"
                  "    raise RuntimeError('faulty weights_synced')\n",
    "bad_runstart": _HOOK + "@hookimpl\ndef plasmid_run_start(run_dir):\n    raise OSError('faulty run_start')\n",
    "typo_metric": _HOOK + "@hookimpl\ndef plasmid_metric(step, metrics):\n    pass\n",
    "typo_addoption": _HOOK + "@hookimpl\ndef plasmid_add_option(parser):\n    pass\n",
}

HOOK_ENTRY_POINTS = {name: name.replace("bad", "bad_", 1).replace("typo", "typo_", 1) for name in HOOK_FAULTS}


def install_faulty(target: Path) -> Path:
    """Install rl-plugin-faulty into ``target`` (created); returns ``target``."""
    return _install(target, DISTRIBUTION, VERSION, MODULES, ENTRY_POINTS)


def install_hook_faults(target: Path) -> Path:
    """Install rl-plugin-hookfaults into ``target`` (created); returns ``target``."""
    return _install(target, HOOK_DISTRIBUTION, HOOK_VERSION, HOOK_MODULES, HOOK_ENTRY_POINTS)


def _install(target: Path, distribution: str, version: str, modules: dict[str, str],
             entry_points: dict[str, str]) -> Path:
    """Write ``modules`` and a ``.dist-info`` of ``distribution`` (requiring plasmid 0.1) whose
    entry points of group ``plasmid`` are ``entry_points`` into ``target``, as pip would."""
    target.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (target / f"{module}.py").write_text(source)
    info = target / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
                                   f"Requires-Dist: plasmid<0.2,>=0.1\n")
    (info / "entry_points.txt").write_text(
        "[plasmid]\n" + "".join(f"{name} = {module}\n" for name, module in entry_points.items()))
    (info / "top_level.txt").write_text("".join(f"{module}\n" for module in modules))
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("pip\n")
    return target
