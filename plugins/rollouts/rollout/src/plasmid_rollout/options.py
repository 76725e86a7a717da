"""The options of the ``rollout`` driver, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.options import Options, option


class RolloutDriverOptions(Options, group="rollout driver", description="the default rollout driver (--rollout "
                                                                        "rollout)"):
    rollout_max_launch_factor: int = option(4, "at most this many times the first wave of groups is started in one "
                                               "step (bounds the work when filters drop most groups)", min=1)
    reward_range_bound: float = option(
        1e3, "a sample reward whose magnitude exceeds this counts in rollout/reward_out_of_range_fraction (a "
             "warning: such a reward swamps its group's normalisation, zeroing the others' advantages)", gt=0)
