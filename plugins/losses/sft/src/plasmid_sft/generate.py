"""``--generate sft``: the single-turn generation, with each prompt's label attached as its demonstration."""

from __future__ import annotations

from plasmid.builtin import SingleTurn
from plasmid.config import Config
from plasmid.protocols import RolloutView
from plasmid.types import Sample, SamplingParams, Status
from plasmid_sft.options import SFTOptions

#: ``Sample.metadata`` key of a sample's demonstration: the token ids of its label (and stop token).
SFT_TARGET_KEY = "sft_target_ids"


class SFTGenerate:
    """Generate as :class:`plasmid.builtin.SingleTurn` does, then attach the demonstration.

    The response is the policy's own (rewards, rollout and eval metrics measure the policy; an
    evaluation, which runs the same function, is never shown the label). A finished sample gets
    ``metadata[SFT_TARGET_KEY]``: the ids of its ``label`` (a string; encoded without special
    tokens), followed by the first stop token of the sampling parameters when
    ``--sft-append-stop`` is on and the ids with it fit within ``--max-new-tokens``.
    :class:`plasmid_sft.loss.SFTLoss` trains on it. A sample whose label is not a non-empty
    string is a ``ValueError`` naming it.
    """

    def __init__(self, config: Config) -> None:
        self.inner = SingleTurn(config)
        self.append_stop = SFTOptions.of(config).sft_append_stop

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample:
        label = sample.label
        if not isinstance(label, str) or not label:
            raise ValueError(f"--generate sft: sample {sample.index} (group {sample.group_index}) has label "
                             f"{label!r}; supervised fine-tuning needs each prompt's answer as a non-empty string "
                             f"(the data source's label)")
        finished = await self.inner(ctx, sample, params)
        if finished.status in (Status.COMPLETED, Status.TRUNCATED):
            finished.metadata[SFT_TARGET_KEY] = demonstration_ids(ctx, label, params, append_stop=self.append_stop)
        return finished


def demonstration_ids(ctx: RolloutView, label: str, params: SamplingParams, *, append_stop: bool) -> list[int]:
    """The token ids of ``label`` (no special tokens), and the first of ``params.stop_token_ids``
    when ``append_stop`` and they then fit within ``params.max_new_tokens``."""
    ids = [int(token) for token in ctx.tokenizer.encode(label, add_special_tokens=False)]
    if append_stop and params.stop_token_ids and len(ids) < params.max_new_tokens:
        ids.append(int(params.stop_token_ids[0]))
    return ids
