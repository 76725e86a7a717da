"""plasmid-math: rewards that grade a response's final answer against the label's, as math.

- ``math``: 1.0 when the final answer is equivalent to the label's, else 0.0;
- ``math-format``: the same, minus ``--math-format-penalty`` without an explicit final answer.

Extraction is in :mod:`plasmid_math.extract`, normalisation in :mod:`plasmid_math.normalize`,
the comparison (text, structure, numbers, sympy) in :mod:`plasmid_math.equivalence`. LaTeX is
converted by a small parser of our own (:mod:`plasmid_math.latex`, :mod:`plasmid_math.expression`)
rather than ``sympy.parsing.latex``, which needs a pinned ANTLR runtime (``antlr4-python3-runtime``
4.11, not installed here); our parser builds sympy objects directly and never calls ``eval``.

Answers are hostile input: every parse is bounded before it starts (:mod:`plasmid_math.bounds`),
and an answer out of bounds scores 0 rather than raising or stalling.
"""
