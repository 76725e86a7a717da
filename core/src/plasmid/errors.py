"""Errors the kernel reports to users: each says what was wrong, where, and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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


class ContextLengthError(PlasmidError, ValueError):
    """A generation request whose prompt and completion budget do not fit the model's context,
    refused before anything is generated, in vLLM's words (``This model's maximum context length
    is N tokens. However, you requested M tokens (P in the messages, K in the completion)``).

    Engines raise it instead of serving the request (torchgen checks itself; the SGLang and vLLM
    clients turn their servers' HTTP 400 into it, :meth:`from_server`); the agent gateway answers
    it with HTTP 400. A ``ValueError`` too, as every refused request of an engine is.

    :ivar context: the model's context (positions); ``prompt_tokens``, ``completion_tokens``: the
        request's prompt length and its ``max_new_tokens``.
    """

    def __init__(self, context: int, prompt_tokens: int, completion_tokens: int, *, where: str = "") -> None:
        self.context, self.prompt_tokens, self.completion_tokens = context, prompt_tokens, completion_tokens
        self.where = where
        self.openai_message = (
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, {completion_tokens} in "
            f"the completion). Please reduce the length of the messages or completion.")
        super().__init__(f"{where}: {self.openai_message}" if where else self.openai_message)

    def __reduce__(self) -> tuple[object, tuple[int, int, int, str]]:
        """Pickled with its lengths (a Ray actor's error crosses to the driver)."""
        return _context_length_error, (self.context, self.prompt_tokens, self.completion_tokens, self.where)

    @classmethod
    def from_server(cls, answer: str, prompt_tokens: int, completion_tokens: int, *, context: int | None = None,
                    where: str = "") -> ContextLengthError | None:
        """The error an inference server's refusal ``answer`` (the body of its HTTP 400) stands
        for, when it refused the request for its length, else ``None``. The context is the one
        the server names (vLLM: ``maximum context length is N``; SGLang: ``maximum context length
        of N``, ``context length (N tokens)``), else ``context``; without either, ``None``."""
        import re

        text = " ".join(answer.split())
        if not re.search(r"context[ _]length|context window|max_model_len", text, re.IGNORECASE):
            return None
        named = re.search(r"(?:context[ _]length|max_model_len)\D{0,12}?(\d+)", text, re.IGNORECASE)
        found = int(named.group(1)) if named else context
        return None if found is None else cls(found, prompt_tokens, completion_tokens, where=where)


def _context_length_error(context: int, prompt_tokens: int, completion_tokens: int, where: str) -> ContextLengthError:
    return ContextLengthError(context, prompt_tokens, completion_tokens, where=where)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming up to three candidates close to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
