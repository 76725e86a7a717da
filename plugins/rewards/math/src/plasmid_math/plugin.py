"""Hook implementations of plasmid-math."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("math", "the 'math' and 'math-format' rewards")
    group.addoption("--math-think-tag", nargs="?", const="</think>", default=None, metavar="TAG",
                    help="grade only the text after the last TAG (default TAG: </think>); no TAG, no answer")
    group.addoption("--math-format-penalty", type=float, default=1.0,
                    help="math-format: subtracted when the response has no \\boxed{} or 'the answer is'")
    group.addoption("--math-tolerance", type=float, default=1e-6, help="relative tolerance of numeric comparison")
    group.addoption("--math-symbolic-timeout", type=float, default=5.0,
                    help="seconds one sympy check may take before it counts as 'not equal'")
    group.addoption("--math-symbolic-workers", type=int, default=1, help="sympy worker processes")


@hookimpl
def plasmid_configure(config):
    option = config.option
    if getattr(option, "math_symbolic_timeout", 1.0) <= 0 or getattr(option, "math_symbolic_workers", 1) < 1:
        raise UsageError("--math-symbolic-timeout must be > 0 and --math-symbolic-workers >= 1")
    if getattr(option, "math_tolerance", 0.0) < 0:
        raise UsageError("--math-tolerance must be >= 0")


@hookimpl
def plasmid_rewards(register):
    register("math", "plasmid_math.rewards:MathReward")
    register("math-format", "plasmid_math.rewards:MathFormatReward")
