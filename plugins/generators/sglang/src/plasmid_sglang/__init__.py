"""plasmid-sglang: SGLang servers as the rollout engine (``--engine sglang``).

Each engine launches one or more SGLang servers (``python -m plasmid_sglang.launch``, a thin
front of ``sglang.launch_server``) bound to 127.0.0.1, or attaches to running ones
(``--sglang-external-addrs``), and talks to them over HTTP: ``/generate`` with token ids and
log-probs, ``/abort_request``, ``/flush_cache``, weight updates, memory release. Every field of
the installed SGLang's ``ServerArgs`` is an option ``--sglang-<field>``.

Modules: :mod:`.native` (the ``--sglang-*`` options, read from SGLang's source), :mod:`.launch`
(runs inside the server process), :mod:`.server` (launching, health, stopping), :mod:`.requests`
(request and response formats), :mod:`.weights` (checkpoint tensor table, serialisation),
:mod:`.engine` (what is SGLang's in the engine: the rest, with the pool, the health monitor and
the weight journal, is :class:`plasmid_serving.engine.HttpEngine`), :mod:`.router`, :mod:`.routing`,
:mod:`.syncs` (the weight syncs ``sglang-tensor``, ``sglang-distributed`` and ``sglang-disk``).

Importing this package imports neither torch nor sglang.
"""

__version__ = "0.1.0"
