"""The options of plasmid-math, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.config import Config, OptionGroup
from plasmid.options import Options, option

#: What a bare ``--math-think-tag`` (no value) grades after.
DEFAULT_THINK_TAG = "</think>"


class MathOptions(Options, group="math", description="the 'math' and 'math-format' rewards"):
    math_format_penalty: float = option(1.0, "math-format: subtracted when the response has no \\boxed{} or "
                                             "'the answer is'")
    math_tolerance: float = option(1e-6, "relative tolerance of numeric comparison", min=0)
    math_symbolic_timeout: float = option(5.0, "seconds one sympy check may take before it counts as 'not equal'",
                                          gt=0)
    math_symbolic_workers: int = option(1, "sympy worker processes", min=1)


# TRANSITIONAL (issue 12): ``--math-think-tag`` takes an optional value (alone it means
# ``</think>``: ``plasmid score ... --math-think-tag --label 4``), which plasmid.options cannot
# declare yet (no ``nargs="?"``/``const``). It stays an argparse option, read in one place, until
# the kernel can; then it becomes ``math_think_tag: str | None`` of MathOptions.
def add_think_tag_option(group: OptionGroup) -> None:
    group.addoption("--math-think-tag", nargs="?", const=DEFAULT_THINK_TAG, default=None, metavar="TAG",
                    help=f"grade only the text after the last TAG (TAG alone: {DEFAULT_THINK_TAG}); no TAG, no "
                         f"answer (default: the whole response)")


def think_tag(config: Config) -> str | None:
    """The value of ``--math-think-tag``: the tag after whose last occurrence the answer is read,
    or None to grade the whole response."""
    return config.option.math_think_tag
