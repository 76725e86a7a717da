"""Hook implementations of plasmid-math."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_math.options import MathOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(MathOptions)


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("math", "plasmid_math.rewards:MathReward")
    register("math-format", "plasmid_math.rewards:MathFormatReward")
