"""Hook implementations of plasmid-ppo (torch is imported only when the loss is chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_ppo.options import PPOOptions
from plasmid_torch.loss_options import PolicyGradientOptions, ReturnOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(PPOOptions)
    parser.add_options(PolicyGradientOptions)
    parser.add_options(ReturnOptions)


@hookimpl
def plasmid_losses(register):
    register("ppo", "plasmid_ppo.loss:PPOLoss")
