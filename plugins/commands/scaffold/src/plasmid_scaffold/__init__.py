"""plasmid-scaffold: the ``plasmid new-plugin FAMILY NAME`` command (entry-point group
``plasmid.commands``) and its package templates, one per provider family
(:mod:`plasmid_scaffold.templates`)."""
