"""Hook implementations of plasmid-reinforce-pp (torch is imported only when a loss is chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_torch.loss_options import PolicyGradientOptions, ReturnOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(PolicyGradientOptions)
    parser.add_options(ReturnOptions)


@hookimpl
def plasmid_losses(register):
    register("reinforce++", "plasmid_reinforce_pp.loss:ReinforcePlusPlusLoss")
    register("reinforce++-baseline", "plasmid_reinforce_pp.loss:ReinforcePlusPlusBaselineLoss")
