"""Hook implementations of plasmid-math."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_math.options import MathOptions, add_think_tag_option


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(MathOptions)
    add_think_tag_option(parser.getgroup(MathOptions.group))


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("math", "plasmid_math.rewards:MathReward")
    register("math-format", "plasmid_math.rewards:MathFormatReward")
