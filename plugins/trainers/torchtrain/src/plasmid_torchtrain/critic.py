"""The critic: the policy's architecture with a scalar value head, and its values of response tokens.

Built when the loss ``needs_critic`` (PPO): a fresh copy of ``--model``'s transformer body
(its ``base_model``, without the LM head), initialised from the same weights, followed by a
``Linear(hidden_size, 1)`` head that starts at zero (every value 0 before training). It is a
separate model with its own optimizer; it is never synced to the engines.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from plasmid_torch.device import Placement
from plasmid_torch.hf import load_causal_lm
from plasmid_torchtrain.batching import PaddedBatch, response_outputs

#: The critic's weights inside a torchtrain checkpoint directory.
CRITIC_FILE = "critic.safetensors"


class ValueModel(torch.nn.Module):
    """``backbone`` (a Hugging Face base model) and a value head: ``[B, L]`` ids -> ``[B, L]`` values."""

    def __init__(self, backbone: Any, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.values_of(self.backbone(input_ids=input_ids, attention_mask=attention_mask)).squeeze(-1)

    def values_of(self, output: Any) -> torch.Tensor:
        """The value head over a ``backbone`` output's last hidden states: ``[B, L, 1]`` (float32 input)."""
        return self.value_head(output.last_hidden_state.float())


def load_value_model(model_dir: str | Path, place: Placement | None = None) -> ValueModel:
    """A critic for the causal LM in ``model_dir`` (eval mode: no dropout): float32 on the CPU, or
    where ``place`` says (the backbone in its parameter dtype; the value head stays float32)."""
    language_model = (place.load_causal_lm(str(model_dir)) if place is not None
                      else load_causal_lm(str(model_dir), "float32"))
    config = language_model.config
    hidden_size = getattr(config, "hidden_size", None) or config.get_text_config().hidden_size
    critic = ValueModel(language_model.base_model, int(hidden_size))
    if place is not None and place.device.type != "cpu":
        critic.value_head.to(place.device)
    return critic.eval().requires_grad_(True)


def response_values(critic: ValueModel, batch: PaddedBatch, place: Placement | None = None, *,
                    share_prompts: bool = False, pack: bool = False) -> torch.Tensor:
    """The critic's value of the state before each response token: ``[B, T]`` float32 on the CPU,
    0 beyond each response. Runs under the caller's grad mode; with ``place`` the forward pass runs
    on its device under its autocast; ``share_prompts`` lets samples with one prompt share its
    pass and ``pack`` packs the samples into one row, as for the policy (both:
    :func:`plasmid_torchtrain.batching.response_outputs`).

    Response token ``t`` is predicted at position ``prompt_length - 1 + t`` (as in
    :func:`plasmid_torchtrain.batching.response_logprobs`); its value is read there.
    """
    with contextlib.nullcontext() if place is None else place.autocast():
        picked, _ = response_outputs(critic.backbone, batch, critic.values_of, place=place,
                                     share_prompts=share_prompts, pack=pack)
    values = picked.squeeze(-1).float().cpu()
    return torch.where(batch.in_response, values, torch.zeros((), dtype=values.dtype))


def save_critic(critic: ValueModel, directory: Path) -> None:
    from safetensors.torch import save_file

    save_file({name: tensor.detach().contiguous() for name, tensor in critic.state_dict().items()},
              str(directory / CRITIC_FILE))


def load_critic_weights(critic: ValueModel, checkpoint_dir: str | Path) -> None:
    """Copy the critic weights saved in ``checkpoint_dir`` into ``critic``."""
    from safetensors.torch import load_file

    file = Path(checkpoint_dir) / CRITIC_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: the checkpoint {checkpoint_dir} has no critic (it was written "
                                f"with a loss that needs none); resume with the same --loss")
    critic.load_state_dict(load_file(str(file)))
