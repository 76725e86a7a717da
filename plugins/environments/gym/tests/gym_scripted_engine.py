"""TEST SUPPORT: a rollout engine that replays scripted replies, for the gym adapter's episode tests.

``ScriptedEngine(replies, weight_version)`` answers its ``k``-th ``generate`` call with ``replies[k]``
(token ids, returned whole: no stop-token or length cut, so a test controls every turn exactly) and
log-probs ``-0.01 * (k + 1) * (i + 1)`` for token ``i`` (distinct per turn and token, so a test can
tell which turn a log-prob came from). Every prompt it was sent is kept in :attr:`prompts`.
(plasmid.testing's ScriptedEngine applies stop tokens and lengths as an engine would; these tests
check the adapter's own handling of whole replies.)
"""

from __future__ import annotations

from plasmid.types import GenerationOutput, Status


class ScriptedEngine:
    """See the module docstring."""

    def __init__(self, replies: list[list[int]], weight_version: int = 2) -> None:
        self.replies = replies
        self.weight_version = weight_version
        #: the prompt ids of every call, in order
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids, params) -> GenerationOutput:
        k = len(self.prompts)
        self.prompts.append(list(prompt_ids))
        ids = self.replies[k]
        return GenerationOutput(ids, [-0.01 * (k + 1) * (i + 1) for i in range(len(ids))], Status.COMPLETED,
                                self.weight_version)

    async def abort_all(self) -> int:
        return 0
