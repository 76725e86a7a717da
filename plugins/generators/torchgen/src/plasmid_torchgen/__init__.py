"""plasmid-torchgen: the embedded rollout engine (``--engine torchgen``, the default).

Serves any local Hugging Face causal LM in float32 on the CPU with plain PyTorch: concurrent
``generate`` calls are batched continuously (a request joins the running batch at the next
decoding step), sampling is per row (temperature, top-k, top-p, seeds), and the trainer's
weights are copied in place. Importing this package imports no torch; the engine module does.
"""

__version__ = "0.1.0"
