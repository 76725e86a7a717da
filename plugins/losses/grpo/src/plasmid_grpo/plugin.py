"""Hook implementations of plasmid-grpo (torch is imported only when a loss is chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_grpo.options import GRPOOptions
from plasmid_torch.loss_options import PolicyGradientOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(GRPOOptions)
    parser.add_options(PolicyGradientOptions)


@hookimpl
def plasmid_losses(register):
    register("grpo", "plasmid_grpo.loss:GRPOLoss", default=True)
    register("dr-grpo", "plasmid_grpo.variants:DrGRPOLoss")
    register("dapo", "plasmid_grpo.variants:DAPOLoss")
    register("gspo", "plasmid_grpo.variants:GSPOLoss")
    register("cispo", "plasmid_grpo.variants:CISPOLoss")
    register("rloo", "plasmid_grpo.variants:RLOOLoss")
