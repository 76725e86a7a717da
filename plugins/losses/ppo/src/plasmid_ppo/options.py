"""plasmid-ppo's own options (the shared ones are plasmid-torch's
:class:`plasmid_torch.loss_options.PolicyGradientOptions` and
:class:`~plasmid_torch.loss_options.ReturnOptions`)."""

from __future__ import annotations

from plasmid.options import Options, option


class PPOOptions(Options, group="ppo", description="PPO's GAE and critic (--loss ppo); see also --gamma, "
                                                   "--critic-lr, --critic-warmup-steps"):
    value_clip: float = option(0.2, "keep new values within this distance of the old ones in the value loss "
                               "(0: off)", min=0)
    lambd: float = option(1.0, "GAE lambda", min=0, max=1)
