"""plasmid-sft: supervised fine-tuning through the RL trainer (``--loss sft``).

A step trains the policy on next-token cross-entropy over the tokens of each prompt's label
(the data set's answer), through the same trainer, optimizer, schedule and checkpoints as the
RL losses: for warm starts, and as a baseline. Two pieces:

- ``--generate sft`` (:class:`plasmid_sft.generate.SFTGenerate`; the default with ``--loss sft``):
  samples a response as the single-turn generate function does (so rollout and eval metrics are
  the policy's own, and evaluation never sees the label), and attaches the label's tokens,
  ended by the stop token when it fits within ``--max-new-tokens``, as the demonstration
  (``metadata["sft_target_ids"]``);
- ``--loss sft`` (:class:`plasmid_sft.loss.SFTLoss`): before the step the recipe hands it the
  samples (:meth:`~plasmid_sft.loss.SFTLoss.training_samples`), whose responses it replaces by
  their demonstrations; the loss is the token mean of ``-log p`` over them;
- ``--loss sft-mix`` (:class:`plasmid_sft.mixed.SFTMixLoss`): SFT steps mixed with RL steps in one
  run, every ``--sft-mix-every``-th step an SFT step, the others steps of ``--sft-mix-loss``.

A warm start needs nothing more: an RL run's ``--model`` is an SFT run's checkpointed model
(``<run dir>/checkpoints/step_N/trainer/model``, a Hugging Face directory).
"""
