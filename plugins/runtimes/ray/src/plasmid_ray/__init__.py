"""plasmid-ray: the ``ray`` runtime (``--runtime ray``).

The same run as ``--runtime local``, with the rollout engines and the data-parallel trainer
workers in Ray actors placed in one placement group (:mod:`.placement`). The driver process keeps
the loop, the rollout driver, the data source, the rewards and the filters, and talks to the
actors through proxies that implement the provider protocols (:mod:`.engines`, :mod:`.trainer`),
so every plugin works unchanged. Modules: :mod:`.cluster` (attach or start Ray), :mod:`.actors`
(what runs inside an actor), :mod:`.balance` (least-in-flight engine choice), :mod:`.runtime`
(``RayRuntime``, tying them together).
"""
