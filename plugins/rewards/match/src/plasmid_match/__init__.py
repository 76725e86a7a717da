"""plasmid-match: rewards that compare a response with its label.

- ``exact`` (the default): 1.0 when the response, stripped of surrounding whitespace, equals the
  label, else 0.0.
- ``normalized``: 1.0 when both are equal after SQuAD-style normalisation (case-folded,
  punctuation and the articles a/an/the removed, whitespace collapsed), else 0.0.
- ``f1``: the token F1 of the normalised response against the normalised label, in [0, 1].
- ``choice``: 1.0 when the multiple-choice letter the response picks ("Answer: (B)", "**D**",
  ...; see :mod:`plasmid_match.choice`) is the label's letter (``--choice-letters``, default ABCDE).

For the first three, the label is a string or a list of acceptable strings (the best score wins); numbers are
compared as their text (``7`` as ``"7"``).
"""
