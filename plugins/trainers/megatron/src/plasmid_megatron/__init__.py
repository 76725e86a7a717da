"""plasmid-megatron: megatron-core as a plasmid trainer (``--trainer megatron``).

Builds a megatron-core ``GPTModel`` from a Hugging Face model directory (:mod:`.model_spec`,
:mod:`.model`), converts weights both ways with tensor-parallel shards (:mod:`.converter`), lays out
tensor, pipeline and data parallelism (:mod:`.parallel`), batches samples into micro-batches
(:mod:`.batching`), computes log-probs vocabulary-parallel (:mod:`.vocab_parallel`), checkpoints
(:mod:`.checkpoint`), and passes megatron's own settings through as ``--megatron-<field>`` options
(:mod:`.native_options`). :mod:`.trainer` ties them together.
"""
