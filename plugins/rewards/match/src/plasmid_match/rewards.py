"""The match rewards: a response against each acceptable answer of its label; the best wins.

Each is a plasmid reward provider (``factory(config)`` returns it; ``await reward(sample)``
returns a float in [0, 1]). They keep no state, so concurrent calls are safe, and each call is
a few string operations that never await, so they declare ``inline = True``: the kernel scores
them on the rollout's thread, with no hop to a reward worker (see the ``plasmid_rewards`` hookspec).
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_match.choice import extract_choice
from plasmid_match.labels import MissingLabelError, acceptable_answers
from plasmid_match.normalize import answer_tokens, normalize_answer
from plasmid_match.options import MatchOptions


class MatchReward:
    """Base of the match rewards: ``score(response, answer)`` maximised over the label's answers."""

    name = "match"
    option_classes: ClassVar[tuple[type[Options], ...]] = ()
    #: pure, bounded, never awaits: scored on the caller's thread (plasmid_rewards hookspec)
    inline: ClassVar[bool] = True

    def __init__(self, config: Config) -> None:
        """Built once per run as ``reward(config)``; only ``choice`` reads an option."""

    def score(self, response: str, answer: str) -> float:
        raise NotImplementedError

    async def __call__(self, sample: Sample) -> float:
        answers = acceptable_answers(sample, self.name)
        return max(self.score(sample.response, answer) for answer in answers)


class ExactMatch(MatchReward):
    """1.0 when the response equals the answer once surrounding whitespace is stripped from both."""

    name = "exact"

    def score(self, response: str, answer: str) -> float:
        return 1.0 if response.strip() == answer.strip() else 0.0


class NormalizedMatch(MatchReward):
    """1.0 when the response equals the answer after :func:`normalize_answer`, else 0.0."""

    name = "normalized"

    def score(self, response: str, answer: str) -> float:
        return 1.0 if normalize_answer(response) == normalize_answer(answer) else 0.0


def token_f1(response: str, answer: str) -> float:
    """Harmonic mean of precision and recall of the normalised response's words against the
    answer's, counting repeated words as often as both contain them.

    When either side normalises to no words, the score is 1.0 if both do and 0.0 otherwise.
    """
    predicted, expected = answer_tokens(response), answer_tokens(answer)
    if not predicted or not expected:
        return 1.0 if predicted == expected else 0.0
    shared = sum((Counter(predicted) & Counter(expected)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(predicted)
    recall = shared / len(expected)
    return 2 * precision * recall / (precision + recall)


class TokenF1(MatchReward):
    """Token F1 (:func:`token_f1`) of the response against the answer, in [0, 1]."""

    name = "f1"

    def score(self, response: str, answer: str) -> float:
        return token_f1(response, answer)


class ChoiceReward(MatchReward):
    """1.0 when the option letter the response picks (:func:`~plasmid_match.choice.extract_choice`)
    is the label's letter, else 0.0 (also when it picks none).

    The label is a letter (``"B"``, ``"(b)"``, ``"B. Paris"``: read with the same rules), a
    0-based option index (``1`` is ``B``), or a list of acceptable ones.
    """

    name = "choice"
    option_classes = (MatchOptions,)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.letters = MatchOptions.of(config).letters

    def label_letters(self, sample: Sample) -> set[str]:
        label = sample.label
        answers = list(label) if isinstance(label, (list, tuple)) else [label]
        letters = set()
        for answer in answers:
            if isinstance(answer, int) and not isinstance(answer, bool):
                if not 0 <= answer < len(self.letters):
                    raise ValueError(f"reward 'choice' (plasmid-match): sample {sample.index} has option index "
                                     f"{answer}, outside --choice-letters {self.letters}")
                letters.add(self.letters[answer])
                continue
            [text] = acceptable_answers(Sample(label=answer, index=sample.index), self.name)
            short = text.strip()
            letter = extract_choice(short.upper() if len(short) <= 3 else text, self.letters)  # "b", "(b)"
            if letter is None:
                raise MissingLabelError(
                    f"reward 'choice' (plasmid-match): the label {text!r} of sample {sample.index} names no option "
                    f"letter of {self.letters}; labels are a letter (\"B\"), an index (1), or set --choice-letters")
            letters.add(letter)
        return letters

    async def __call__(self, sample: Sample) -> float:
        expected = self.label_letters(sample)
        picked = extract_choice(sample.response, self.letters)
        return 1.0 if picked in expected else 0.0
