"""plasmid-remote: the ``remote`` reward, a reward model or verifier behind HTTP (``--rm-url``)."""
