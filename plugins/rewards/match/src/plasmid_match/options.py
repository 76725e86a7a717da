"""The options of plasmid-match, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.errors import UsageError
from plasmid.options import Options, option


class MatchOptions(Options, group="match", description="the match rewards"):
    choice_letters: str = option("ABCDE", "the option letters of the 'choice' reward, in order (index 0 is the "
                                          "first)")

    def check(self) -> None:
        if not self.choice_letters.isalpha():
            raise UsageError(f"--choice-letters {self.choice_letters!r}: give the option letters in order, "
                             f"such as ABCDE")

    @property
    def letters(self) -> str:
        """``--choice-letters`` in upper case, each letter once, in order."""
        return "".join(dict.fromkeys(self.choice_letters.upper()))
