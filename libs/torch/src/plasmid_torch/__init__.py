"""plasmid-torch: the torch library that plasmid's plugins share (not a plugin: it registers nothing).

- :mod:`plasmid_torch.algorithms`: the RL math (advantages, KL estimators, clipped losses, ...);
- :mod:`plasmid_torch.policy_gradient`: :class:`~plasmid_torch.policy_gradient.PolicyGradientLoss`,
  the base of the policy-gradient losses (plasmid-grpo, plasmid-ppo, plasmid-reinforce-pp), and
  :mod:`plasmid_torch.loss_options`, the options they share;
- :mod:`plasmid_torch.train_step`: the one train-step recipe of the trainers (a trainer supplies
  its parts), :mod:`plasmid_torch.optimizer_update` the one optimizer update, and
  :mod:`plasmid_torch.trainer_options` the options every trainer reads;
- :mod:`plasmid_torch.training`: what every trainer checks and measures the same way (sample
  checks, batch tensors, metrics);
- :mod:`plasmid_torch.ops`: log-probs and entropy from logits, as trainers and engines compute them;
- :mod:`plasmid_torch.compute`: the process's compute thread;
- :mod:`plasmid_torch.hf` and :mod:`plasmid_torch.tiny`: Hugging Face loading and tiny test models;
- :mod:`plasmid_torch.tensors` and :mod:`plasmid_torch.disk_sync`: what the weight syncs share, and
  the disk weight sync;
- :mod:`plasmid_torch.testing.contracts`: the contract suites of the torch families (loss,
  trainer, generator, weight sync), re-exported by :mod:`plasmid.testing`.

``import plasmid_torch`` imports no torch; its modules import it where they need it.
"""

from __future__ import annotations

__version__ = "0.1.0"
