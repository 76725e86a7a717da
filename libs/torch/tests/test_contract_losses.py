"""The trainer contract's own test losses (ContractLoss, ContractCriticLoss) satisfy the loss
contract, so that a trainer passing the trainer contract is trained with a well-behaved loss."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.protocols import CriticLoss, Loss
from plasmid_torch.testing.contracts.loss import LossContract
from plasmid_torch.testing.contracts.trainer import ContractCriticLoss, ContractLoss


class ContractLossesPlugin:
    """Registers the contract's losses as providers, as a loss plugin would."""

    @hookimpl
    def plasmid_losses(self, register):
        register("contract", "plasmid_torch.testing.contracts.trainer:ContractLoss")
        register("contract-critic", "plasmid_torch.testing.contracts.trainer:ContractCriticLoss")


def test_they_satisfy_the_loss_protocols():
    assert isinstance(ContractLoss(), Loss) and not ContractLoss().needs_ref
    assert ContractLoss(kl_coef=0.1).needs_ref
    assert isinstance(ContractCriticLoss(), CriticLoss) and ContractCriticLoss().needs_critic


class TestContractLoss(LossContract):
    plugin = ContractLossesPlugin()
    provider = "contract"


class TestContractCriticLoss(LossContract):
    plugin = ContractLossesPlugin()
    provider = "contract-critic"
