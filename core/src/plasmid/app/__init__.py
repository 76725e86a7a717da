"""The application: the ``plasmid`` command built on the kernel.

The kernel (every other module of :mod:`plasmid` but :mod:`plasmid.testing`) loads plugins,
parses options, resolves providers and runs the loop; it never imports this package. The
application adds what an operator uses: the CLI (:mod:`plasmid.app.cli`, ``plasmid train`` in
:mod:`plasmid.app.run`), ``--config`` files (:mod:`plasmid.app.configfile`) and the readable
``--help`` (:mod:`plasmid.app.helptext`), both handed to the kernel's option parser,
``plasmid config show``, ``plasmid plugins``, the options page (:mod:`plasmid.app.docs_options`),
the run directory and its log, and the commands ``eval``, ``rollout``, ``replay`` and ``score``,
which are entry points of group ``plasmid.commands`` like any package's command.
"""
