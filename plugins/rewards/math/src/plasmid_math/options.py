"""The options of plasmid-math, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.options import Options, option

#: What a bare ``--math-think-tag`` (no value) grades after.
DEFAULT_THINK_TAG = "</think>"


class MathOptions(Options, group="math", description="the 'math' and 'math-format' rewards"):
    math_format_penalty: float = option(1.0, "math-format: subtracted when the response has no \\boxed{} or "
                                             "'the answer is'")
    math_tolerance: float = option(1e-6, "relative tolerance where a float was written (1e-3) or sympy evaluated an "
                                         "irrational value; integers, fractions and decimals compare exactly", min=0)
    math_symbolic_timeout: float = option(5.0, "seconds sympy may spend on one response (all its checks together) "
                                                "before they count as 'not equal'", gt=0)
    math_symbolic_workers: int = option(1, "sympy worker processes", min=1)
    math_think_tag: str | None = option(None, f"grade only the text after the last TAG (TAG alone: "
                                              f"{DEFAULT_THINK_TAG}); no TAG, no answer", metavar="TAG",
                                        const=DEFAULT_THINK_TAG, default_text="the whole response")
