"""Errors the kernel reports to users: each says what was wrong, where, and how to fix it."""

from __future__ import annotations


class PlasmidError(Exception):
    """Base of every error the CLI prints without a traceback (exit code 2)."""


class UsageError(PlasmidError):
    """Invalid options or combination of options."""


class PluginError(PlasmidError):
    """A plugin could not be found, imported, validated or combined with the others."""


class ProviderError(PlasmidError):
    """A provider (reward, engine, ...) failed while running; names the plugin that provided it."""

    def __init__(self, message: str, *, provider: str = "", plugin: str = "") -> None:
        super().__init__(message)
        self.provider = provider
        self.plugin = plugin


class CheckpointError(PlasmidError):
    """A checkpoint could not be written; the previous complete one is left as it was."""


class RunStopped(PlasmidError):
    """The loop stopped a run that cannot learn (``--max-bad-steps``, ``--max-empty-steps``),
    after writing a checkpoint."""


class DataExhausted(PlasmidError):
    """A finite data source cannot give the groups asked for: every epoch is used up.

    Raised by ``DataSource.get_groups`` without consuming anything, so a checkpoint taken
    afterwards is exact. The loop ends the run normally when it sees it. (Not a
    ``StopIteration``: inside coroutines that becomes a ``RuntimeError``, PEP 479.)
    """
