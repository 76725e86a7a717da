"""The generate-function and observer contract suites hold for the kernel's own providers (the
scaffolds' tests run them too, and a broken scaffold fails them: tests/test_scaffold_families.py)."""

from __future__ import annotations

import plasmid
from plasmid.testing.contracts.generate import GenerateContract
from plasmid.testing.contracts.observer import ObserverContract


class KernelOnly:
    """No hooks: the kernel's own plugin (plasmid.builtin, always loaded) registers single-turn."""


class TestSingleTurnGenerateContract(GenerateContract):
    plugin = KernelOnly()
    provider = "single-turn"


class NoisyObserver:
    """An observer plugin that keeps nothing and checks the hook order it is called in."""

    started = 0

    @plasmid.hookimpl
    def plasmid_run_start(self, config, run_dir):
        type(self).started += 1

    @plasmid.hookimpl
    def plasmid_metrics(self, step, metrics):
        assert isinstance(step, int) and isinstance(metrics, dict)

    @plasmid.hookimpl
    def plasmid_run_end(self, run_dir, metrics, error):
        assert error is None or isinstance(error, str)


class TestAnObserverContract(ObserverContract):
    plugin = NoisyObserver()


def test_the_observer_contract_calls_run_start(tmp_path):
    before = NoisyObserver.started
    TestAnObserverContract().whole_run(tmp_path / "run")
    assert NoisyObserver.started == before + 1
