"""plasmid-tools: the ``calculator`` and ``retrieve`` tools of multi-turn rollouts (``--tools NAME``)."""
