"""plasmid-torchtrain: the embedded trainer (``--trainer torchtrain``).

Trains a Hugging Face causal LM in plain PyTorch (float32, CPU) with the run's loss plugin:
padding and log-probs (:mod:`.batching`), the optimizer's learning-rate schedule
(:mod:`.schedule`), weight export for syncs (:mod:`.weights`), checkpoints (:mod:`.checkpoint`),
and the trainer that ties them together (:mod:`.trainer`).
"""
