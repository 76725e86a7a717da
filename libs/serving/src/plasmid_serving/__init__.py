"""plasmid-serving: the library of plasmid's engine plugins that drive inference servers over HTTP.

Not a plugin (no entry point): plasmid-sglang and plasmid-vllm build on it, each supplying only
what differs (the launch command, request and answer shapes, endpoints, weight-update paths).

Modules: :mod:`.engine` (:class:`~plasmid_serving.engine.HttpEngine`, the rollout-engine
protocol implemented once), :mod:`.pool` (the servers and the choice of one), :mod:`.health`
(the monitor that restarts dead servers), :mod:`.journal` (what a restarted server replays),
:mod:`.server_process` (a launched server's lifecycle), :mod:`.http` (the HTTP calls),
:mod:`.options` (the settings every such engine declares and reads), :mod:`.hooks` (what their
plugins' hooks do alike), :mod:`.names`, :mod:`.logprobs`, and
:mod:`.native_options` (a framework's settings read from its source as options). Beside them, what
torch-free plugins share with the torch library: :mod:`.parsers` (tool-call and reasoning parsers)
and :mod:`.turns` (a sample's per-turn rewards as JSON: the metadata key and its checker).

Importing it imports neither torch nor aiohttp (that comes with the first asynchronous call).
"""

__version__ = "0.1.0"
