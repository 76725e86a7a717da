"""plasmid-math: rewards that grade a response's final answer against the label's, as math."""
