"""plasmid-code: a reward that runs the response's Python code against the label's tests in a sandbox."""
