"""The provider families, in one table: the registry, the provider-choice flags, ``plasmid
plugins`` and the contract index are all derived from :data:`FAMILIES`.

A family is a kind of provider (a reward, a trainer, ...) with its registration hook, the flag
that chooses it, how many of it a run uses, the protocol its providers satisfy and the contract
suite in :mod:`plasmid.testing` that checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: ``one``: exactly one is used (the flag's choice, the only candidate, or the default);
#: ``weighted``: one or more, each with a weight (``--reward NAME[:WEIGHT]``);
#: ``ordered``: zero or more, in the order given (``--filter``).
Cardinality = Literal["one", "weighted", "ordered"]


@dataclass(frozen=True)
class Family:
    """One provider family.

    :ivar name: the family's name in the registry and in messages (``weight_sync``).
    :ivar hook: its registration hook in :mod:`plasmid.hookspecs`.
    :ivar option: the option holding the choice (``weight_sync``; the flag is ``--weight-sync``).
    :ivar cardinality: how many providers of it a run uses (:data:`Cardinality`).
    :ivar protocol: the protocol its providers satisfy, in :mod:`plasmid.protocols`.
    :ivar contract: ``"module:Class"`` of the family's contract suite (re-exported by
        :mod:`plasmid.testing`; the families whose providers need torch have theirs in the
        ``plasmid-torch`` library), or ``""``.
    :ivar help: the choice flag's help text.
    :ivar factory_args: what the factory is called with after ``config``.
    :ivar missing_hint: said when no provider of the family is loaded.
    """

    name: str
    hook: str
    option: str
    cardinality: Cardinality
    protocol: str
    contract: str
    help: str
    factory_args: tuple[str, ...] = ()
    missing_hint: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.option.replace("_", "-")

    @property
    def contract_name(self) -> str:
        """The contract suite's class name (``TrainerContract``), or ``""``."""
        return self.contract.partition(":")[2]


TORCH_CONTRACTS = "plasmid_torch.testing.contracts"
KERNEL_CONTRACTS = "plasmid.testing.contracts"

FAMILIES: tuple[Family, ...] = (
    Family("datasource", "plasmid_datasources", "datasource", "one", "DataSource",
           f"{KERNEL_CONTRACTS}.datasource:DataSourceContract", "prompt source"),
    Family("tokenizer", "plasmid_tokenizers", "tokenizer", "one", "Tokenizer", "",
           "how text becomes token ids and back (default: the model's Hugging Face tokenizer)",
           missing_hint="the model's own Hugging Face tokenizer is plugin 'hf' (pip install plasmid-hf); "
                        "with an explicit --plugins list, add hf to it"),
    Family("engine", "plasmid_generators", "engine", "one", "RolloutEngine",
           f"{TORCH_CONTRACTS}.generator:GeneratorContract", "rollout engine"),
    Family("generate", "plasmid_generate_fns", "generate", "one", "GenerateFn",
           f"{KERNEL_CONTRACTS}.generate:GenerateContract", "generate function (default: single-turn)"),
    Family("rollout", "plasmid_rollouts", "rollout", "one", "RolloutDriver", "", "rollout driver"),
    Family("reward", "plasmid_rewards", "reward", "weighted", "RewardFn",
           f"{KERNEL_CONTRACTS}.reward:RewardContract",
           "reward function, repeatable; components are summed with their weights"),
    Family("filter", "plasmid_filters", "filter", "ordered", "Filter", f"{KERNEL_CONTRACTS}.filter:FilterContract",
           "group filter, repeatable, in order"),
    Family("tool", "plasmid_tools", "tools", "ordered", "Tool", f"{KERNEL_CONTRACTS}.tool:ToolContract",
           "tool the policy may call in multi-turn rollouts, repeatable"),
    Family("loss", "plasmid_losses", "loss", "one", "Loss", f"{TORCH_CONTRACTS}.loss:LossContract", "RL algorithm"),
    Family("trainer", "plasmid_trainers", "trainer", "one", "Trainer", f"{TORCH_CONTRACTS}.trainer:TrainerContract",
           "training backend", factory_args=("loss",)),
    Family("weight_sync", "plasmid_weight_syncs", "weight_sync", "one", "WeightSync",
           f"{TORCH_CONTRACTS}.weightsync:WeightSyncContract", "weight transport from trainer to engines"),
    Family("runtime", "plasmid_runtimes", "runtime", "one", "Runtime", "",
           "where providers run (default: local, this process)"),
)

BY_NAME: dict[str, Family] = {family.name: family for family in FAMILIES}


def family(name: str) -> Family:
    """The family called ``name``; ``KeyError`` naming the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no provider family {name!r}; families: {', '.join(BY_NAME)}") from None


#: What :mod:`plasmid.testing` re-exports lazily besides the contract suites: name -> ``"module:attr"``.
TESTING_EXTRAS = {"build_tiny_model": "plasmid_torch.tiny:build_tiny_model",
                  "tiny_config": "plasmid_torch.tiny:tiny_config"}


def contract_index() -> dict[str, str]:
    """Contract suite class name -> ``"module:Class"``, for every family that has one."""
    return {f.contract_name: f.contract for f in FAMILIES if f.contract}


def single_families() -> tuple[Family, ...]:
    """The families of which a run uses exactly one."""
    return tuple(f for f in FAMILIES if f.cardinality == "one")
