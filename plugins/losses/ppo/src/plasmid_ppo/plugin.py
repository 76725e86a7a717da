"""Hook implementations of plasmid-ppo (torch is imported only when the loss is chosen)."""

from __future__ import annotations

from plasmid import hookimpl


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("ppo", "PPO's critic (--loss ppo); see also --gamma, --lambd, --critic-lr, "
                                   "--critic-warmup-steps")
    group.addoption("--value-clip", type=float, default=0.2,
                    help="keep new values within this distance of the old ones in the value loss (0: off)")


@hookimpl
def plasmid_losses(register):
    register("ppo", "plasmid_ppo.loss:PPOLoss")
