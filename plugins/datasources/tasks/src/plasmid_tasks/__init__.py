"""plasmid-tasks: built-in synthetic tasks with exact-match labels, and the quickstart recipe.

``--datasource tasks --task mod10|reverse|digitsum|addition``; with no ``--model`` the recipe
builds a tiny model in the run directory (:mod:`plasmid_tasks.recipe`). The tasks are described
in :mod:`plasmid_tasks.tasks`, their train/eval split in :mod:`plasmid_tasks.split`.
"""
