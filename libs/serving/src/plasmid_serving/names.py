"""How an engine over HTTP servers names itself in messages and errors."""

from __future__ import annotations

from dataclasses import dataclass

from plasmid.errors import ProviderError


@dataclass(frozen=True)
class EngineNames:
    """Set once per engine class (:attr:`plasmid_serving.engine.HttpEngine.names`).

    :ivar label: how messages name its servers (``"SGLang"``: "SGLang server 0 (...)").
    :ivar provider: the engine's name (``"sglang"``), also the prefix of its options.
    :ivar plugin: the distribution that provides it (``"plasmid-sglang"``).
    """

    label: str
    provider: str
    plugin: str

    def error(self, message: str) -> ProviderError:
        """A :class:`ProviderError` of this engine with ``message``."""
        return ProviderError(message, provider=self.provider, plugin=self.plugin)

    def report(self, message: str) -> None:
        """One line on stderr, prefixed with the plugin's name (restarts, restores)."""
        import sys

        print(f"{self.plugin}: {message}", file=sys.stderr, flush=True)
